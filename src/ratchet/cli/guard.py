"""How a Ratchet error ends a ``ratchet`` command: one line on stderr and an exit status.

:func:`exit_status` is the one place that maps an exception to the command's exit status;
every command runs its work through :func:`guard`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import typer

from .. import RatchetError
from ..errors import EXIT_ERROR, error_spec
from .render import err_console, line

__all__ = ["EXIT_ERROR", "exit_status", "guard", "print_error"]

T = TypeVar("T")

def exit_status(exc: RatchetError) -> int:
    """The exit status of a command stopped by ``exc``: the error table's
    (:func:`ratchet.errors.error_spec`, the same table the HTTP API and the dashboard
    answer from): :data:`~ratchet.errors.EXIT_LEDGER_CORRUPT` (5) for a corrupt ledger,
    :data:`~ratchet.errors.EXIT_ERROR` (2) for every other Ratchet error."""
    return error_spec(exc).exit_code


def print_error(exc: RatchetError) -> None:
    """A Ratchet error as the one line every command prints on stderr
    (``error: TypeName: message``; the message printed as text, never as markup)."""
    err_console().print(line(("error: ", "bold red"), (f"{type(exc).__name__}: {exc}", "")))


def guard(fn: Callable[[], T]) -> T:
    """Run ``fn`` and return what it returns.

    Raises:
        typer.Exit: ``fn`` raised a :class:`~ratchet.errors.RatchetError`: printed by
            :func:`print_error`, status :func:`exit_status`.
    """
    try:
        return fn()
    except RatchetError as exc:
        print_error(exc)
        raise typer.Exit(exit_status(exc)) from None
