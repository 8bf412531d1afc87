"""What every ``ratchet`` command shares: the command class, the common options and
arguments (``--ledger``, ``--json``, ``--reason``, ``--operator``, ``MODULE:APP``, ``TASK``)
and the checks of their values."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand

from .. import InvalidArguments, UndecodableData
from ..control import REASON_REQUIRED
from ..serde import loads
from .render import err_console, line

__all__ = [
    "MAX_WAIT_S", "AppArg", "Command", "JsonOpt", "LedgerOpt", "OperatorOpt", "ReasonOpt",
    "TaskArg", "json_arg", "require_reason",
]

MAX_WAIT_S = 7 * 86_400.0
"""The longest ``--ledger-wait-s`` / ``--shutdown-grace-s`` (and the other timeouts given
in seconds), seconds (a week)."""

ReasonOpt = Annotated[
    str | None,
    typer.Option("--reason", metavar="TEXT",
                 help="Why (kept in the audit log with --operator). Required."),
]
"""``--reason`` of every command that needs one. Not required at parse time: a missing
reason is refused by Control like a blank one (``error: InvalidArguments: reason
(--reason) must say why...``, status 2), so every command says the same, in one style."""
LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger",
        metavar="URL",
        help="Ledger URL (default: the app's own ledger where the command takes an app; "
             "else $RATCHET_LEDGER_URL or sqlite:///ratchet.db).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the record as JSON (every field) instead of text.")
]
AppArg = Annotated[
    str,
    typer.Argument(metavar="MODULE:APP", help="The application, e.g. myproj.tasks:app."),
]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="The task id.")]
OperatorOpt = Annotated[
    str | None,
    typer.Option("--operator", metavar="NAME",
                 help="Who decided (default: $USER / the login name)."),
]


class _Argument(TyperArgument):
    """A positional argument whose help shows its metavar only (``MODULE:APP``), not Typer's
    type label (``<str>``)."""

    def display_type_rich(self, ctx: object) -> str | None:
        return None


class Command(TyperCommand):
    """Every ``ratchet`` command (``cls=`` of its registration): arguments shown as
    :class:`_Argument`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = _Argument


def require_reason(reason: str | None) -> str:
    """``--reason`` of a command that needs one: a missing or blank one is the same
    ``InvalidArguments`` as Control's (one message, one style, for every command).

    Raises:
        InvalidArguments: ``reason`` is None or blank.
    """
    if reason is None or not reason.strip():
        raise InvalidArguments(REASON_REQUIRED)
    return reason


def json_arg(text: str, option: str) -> object:
    """Decode a JSON command-line value.

    Raises:
        InvalidArguments: ``text`` is not JSON (the message names ``option`` once:
            ``--params is not valid JSON (...)``).
    """
    try:
        return loads(text, option)
    except UndecodableData as exc:  # its message starts with ``option``
        raise InvalidArguments(str(exc)) from None


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level_of(value: str) -> str:
    """``--log-level`` upper-cased, one of :data:`LOG_LEVELS`.

    Raises:
        typer.Exit: (status 2) any other value, after a one-line error on stderr.
    """
    level = value.upper()
    if level not in LOG_LEVELS:
        err_console().print(line(("error: ", "bold red"),
                                 "--log-level must be DEBUG, INFO, WARNING or ERROR, not ",
                                 (repr(value), "")))
        raise typer.Exit(2)
    return level

