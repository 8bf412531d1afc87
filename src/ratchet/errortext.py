"""How a failure is recorded and shown: the exception's type and message, kept apart from
its traceback.

A failed attempt records two texts (DESIGN §9, "errors"): the *message*
(:func:`error_message`: ``HTTPStatusError: Server error '503 Service Unavailable' for url
...``), which ``ratchet tasks``, ``ratchet inspect``, the worker log and the dashboard
show, and the *traceback* (:func:`error_traceback`), shown on request (``ratchet inspect
--traceback``, the task page's expander). The last line of a traceback is not the error: an
exception whose message has several lines (httpx's ``raise_for_status()`` ends its message
with a "For more information check: ..." line) would be shown by that line alone.
"""

from __future__ import annotations

import traceback

from .serde import printable

__all__ = [
    "MESSAGE_MAX_CHARS",
    "TRACEBACK_MAX_CHARS",
    "bounded",
    "error_message",
    "error_summary",
    "error_traceback",
]

MESSAGE_MAX_CHARS = 2000
"""Bound of a recorded error message, characters (a longer one is cut, ending in "…")."""

TRACEBACK_MAX_CHARS = 8000
"""Bound of a recorded traceback, characters (its innermost end is kept)."""

_TRACEBACK_FRAMES = 8
"""Frames kept per exception of a recorded traceback (the innermost ones)."""

_TRACEBACK_HEAD = "Traceback (most recent call last):"


def bounded(text: str, limit: int = MESSAGE_MAX_CHARS) -> str:
    """``text`` (made printable) cut to at most ``limit`` characters, ending in "…" when
    cut."""
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_message(exc: BaseException) -> str:
    """The exception's type and message, ``"Type: message"`` (``"Type"`` when the message
    is empty), printable and at most :data:`MESSAGE_MAX_CHARS` characters. The message is
    ``str(exc)`` whole: lines after the first are kept (shown by ``inspect
    --traceback``)."""
    name = type(exc).__name__
    try:
        text = str(exc).strip()
    except Exception as failed:  # a broken __str__ must not hide the failure itself
        text = f"(its message could not be read: {type(failed).__name__})"
    return bounded(f"{name}: {text}" if text else name)


def error_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it (chained causes included, the innermost
    frames of each), printable, its last :data:`TRACEBACK_MAX_CHARS` characters."""
    text = "".join(traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES))
    return printable(text[-TRACEBACK_MAX_CHARS:])


def error_summary(text: str | None) -> str:
    """One line of a recorded error, for lists and logs: its first non-blank line (the
    type and the first line of the message). A traceback recorded whole in the message's
    place (rows written by a release that kept no message apart start with
    ``Traceback (most recent call last):``) gives its last non-blank line, the
    exception's line. ``""`` for None or blank text."""
    lines = [ln.strip() for ln in (text or "").split("\n") if ln.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0] == _TRACEBACK_HEAD else lines[0]
