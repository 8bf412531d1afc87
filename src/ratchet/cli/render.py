"""Output of the ``ratchet`` command: stored data is always printed as text.

Every value that comes from the ledger or from the user (task names, keys, params, errors,
holder names, audit details) goes through :func:`plain` into a :class:`rich.text.Text`,
which Rich never parses as markup: a key ``[bold red]X[/bold red]`` prints as those
characters, ``[/]`` cannot crash the renderer, ``[link=...]`` is not a link. Characters a
terminal would act on (escape sequences, other control characters) and lone surrogates
are printed as ``\\x1b`` / ``\\udcff`` escapes; stored text that is not valid UTF-8 (a
damaged SQLite row) is printed with ``\\xff`` escapes and a note.

When the output is not a terminal (a pipe, a file, a test), lines are not wrapped at 80
columns: each record stays on one line for ``grep`` and scripts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from datetime import UTC, datetime
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from ..serde import Undecodable, printable
from ..storedtext import stored_note

__all__ = [
    "clip", "console", "echo_json", "echo_json_line", "err_console", "field", "line", "plain",
    "report_console", "show_value", "stdout_is_terminal", "when",
]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_UNWRAPPED_WIDTH = 100_000
"""Console width when the output is not a terminal: long enough never to wrap."""


_REPORT_WIDTH = 160
"""Console width of a piped report with panels and tables (the demo's): wide enough for
its lines, not so wide that a panel spans a 100,000-column page."""


def _is_tty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError):
        return False


def report_console() -> Console:
    """A stdout console for reports with panels and live progress (``ratchet demo``): the
    terminal's width on a terminal; piped, :data:`_REPORT_WIDTH` columns and text lines
    never wrapped."""
    if _is_tty(sys.stdout):
        return Console(highlight=False)
    return Console(highlight=False, width=_REPORT_WIDTH, soft_wrap=True)


def stdout_is_terminal() -> bool:
    """Whether ``sys.stdout`` is a terminal (tables may then shorten long cells)."""
    return _is_tty(sys.stdout)


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis on a terminal, so a table row
    stays readable; whole when the output is piped (``grep`` and scripts see everything)."""
    if len(text) <= limit or not stdout_is_terminal():
        return text
    return text[: max(1, limit - 1)] + "\u2026"


def _make(stderr: bool) -> Console:
    if _is_tty(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, width=_UNWRAPPED_WIDTH, soft_wrap=True)


def console() -> Console:
    """A console on the current ``sys.stdout`` (made per call, so tests' captured streams and
    a redirected stdout are honoured)."""
    return _make(stderr=False)


def err_console() -> Console:
    """A console on the current ``sys.stderr``."""
    return _make(stderr=True)


def plain(value: object) -> str:
    """``str(value)`` made safe to print: lone surrogates and control characters other than
    newline and tab written as Python escapes; stored text that is not valid UTF-8 (an
    :class:`~ratchet.storedtext.UndecodableText`, already escaped) and a state that is not
    a known one (a :class:`~ratchet.storedtext.StoredState`) with a note saying so."""
    text = _CONTROL.sub(lambda m: repr(m.group())[1:-1], printable(str(value)))
    note = stored_note(value)
    return text if note is None else f"{text} ({note})"


def field(value: object, style: str = "") -> Text:
    """One value as text (never markup), optionally styled."""
    return Text(plain(value), style=style)


def line(*parts: str | tuple[object, str]) -> Text:
    """A line of output from ``parts``: a ``str`` is a fixed label written by Ratchet;
    ``(value, style)`` is a value printed as text with that style (``""`` for none)."""
    out = Text()
    for part in parts:
        if isinstance(part, tuple):
            value, style = part
            out.append(plain(value), style=style)
        else:
            out.append(part)
    return out


def show_value(value: Any) -> Text:
    """A stored value for people: compact JSON, or the stored text with a note when it
    could not be decoded."""
    if isinstance(value, Undecodable):
        return line((value.text, ""), (f"  (not decodable: {value.error}; shown as stored)",
                                       "yellow"))
    try:
        encoded = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        encoded = repr(value)
    return field(encoded)


def _json_default(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)


def echo_json(record: Any) -> None:
    """Print ``record`` as indented JSON: a dataclass (or list of them) through
    :func:`dataclasses.asdict`, so the JSON has exactly the record's fields. ASCII only
    (``\\uXXXX`` escapes), so any stored text can be printed."""
    def to_data(item: Any) -> Any:
        is_record = dataclasses.is_dataclass(item) and not isinstance(item, type)
        return dataclasses.asdict(item) if is_record else item

    data = [to_data(r) for r in record] if isinstance(record, list) else to_data(record)
    typer.echo(json.dumps(data, indent=2, default=_json_default))


def echo_json_line(record: Any) -> None:
    """:func:`echo_json` on one line (JSON Lines: one record per line, ``--watch --json``)."""
    is_record = dataclasses.is_dataclass(record) and not isinstance(record, type)
    data = dataclasses.asdict(record) if is_record else record
    typer.echo(json.dumps(data, separators=(",", ":"), default=_json_default))


def when(epoch_s: float | None) -> str:
    """An instant as ``HH:MM:SS.mmm`` UTC (``epoch_s``: epoch seconds); ``-`` for None."""
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S.%f")[:-3]
