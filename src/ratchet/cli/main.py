"""The ``ratchet`` command line (Typer + Rich), a face of :class:`ratchet.control.Control`:
the app, its commands in the order ``ratchet --help`` lists them, and the entry point.

Commands: ``worker``, ``submit``, ``status``, ``tasks``, ``workers``, ``inspect``,
``late-effects``, ``replay``, ``check``, ``reconcile``, ``resolve``, ``cancel``, ``retry``,
``compensate``, ``fork``, ``send-event``, ``pause``, ``resume``, ``limits`` (``set``,
``clear``), ``quarantine``
(``list``, ``replay``), ``definitions``, ``schedules``, ``prune``, ``serve``, ``relay``,
``migrate``, ``demo``, ``crash-matrix``; ``ratchet --version``. Every command takes
``--ledger URL`` (default ``RATCHET_LEDGER_URL`` or ``sqlite:///ratchet.db``;
``crash-matrix``: fresh SQLite files in a temporary directory). The commands
call only the public API (``Control``, ``App``, ``Worker``, :func:`ratchet.loading.load_app`),
never the ledger modules. Ratchet errors print one line saying what to fix (stored data and
user input printed as text, never as markup; passwords redacted) and exit with the status
:func:`ratchet.cli.guard.exit_status` gives (2; a corrupt ledger
:data:`~ratchet.errors.EXIT_LEDGER_CORRUPT`); ``ratchet check`` exits 1 when a task's
item counts do not add up (:data:`~ratchet.cli.batches.EXIT_DOES_NOT_ADD_UP`). ``--json``
(every command but ``worker`` and ``demo``; ``ratchet --version --json``) prints
``dataclasses.asdict`` of the records ``Control`` returns. Piped output is never wrapped
or cut (:mod:`ratchet.cli.render`).

One module per command group: :mod:`~ratchet.cli.worker_boot`, :mod:`~ratchet.cli.tasks`,
:mod:`~ratchet.cli.status`, :mod:`~ratchet.cli.batches`, :mod:`~ratchet.cli.workers`,
:mod:`~ratchet.cli.definitions`, :mod:`~ratchet.cli.schedules`,
:mod:`~ratchet.cli.reconcile`, :mod:`~ratchet.cli.actions`, :mod:`~ratchet.cli.events`,
:mod:`~ratchet.cli.pausing`, :mod:`~ratchet.cli.limits`, :mod:`~ratchet.cli.quarantine`,
:mod:`~ratchet.cli.prune`, :mod:`~ratchet.cli.serve`, :mod:`~ratchet.cli.relay`,
:mod:`~ratchet.cli.migrate`, :mod:`~ratchet.cli.replay`, :mod:`~ratchet.cli.demo`,
:mod:`~ratchet.cli.crashmatrix`;
shared options in :mod:`~ratchet.cli.options`, errors to exit status in
:mod:`~ratchet.cli.guard`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from ..loading import load_app
from . import (
    actions,
    batches,
    crashmatrix,
    definitions,
    demo,
    events,
    fork,
    migrate,
    pausing,
    prune,
    reconcile,
    relay,
    replay,
    schedules,
    serve,
    status,
    tasks,
    worker_boot,
    workers,
)
from .limits import limits_cli
from .options import Command
from .quarantine import quarantine_cli
from .render import echo_json

__all__ = ["cli", "load_app", "main"]

cli = typer.Typer(
    name="ratchet",
    help="Recoverable task execution: leases, fencing tokens, exactly-once effects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@cli.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='With --version: {"name": "ratchet", "version": "..."}.'),
    ] = False,
) -> None:
    """Recoverable task execution: leases, fencing tokens, exactly-once effects."""
    if version:
        if as_json:
            echo_json({"name": "ratchet", "version": __version__})
        else:
            typer.echo(f"ratchet {__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


for _name, _command in (
    ("worker", worker_boot.worker),
    ("submit", tasks.submit),
    ("status", status.status),
    ("tasks", tasks.tasks),
    ("workers", workers.workers),
    ("definitions", definitions.definitions),
    ("schedules", schedules.schedules),
    ("inspect", tasks.inspect),
    ("late-effects", tasks.late_effects),
    ("replay", replay.replay),
    ("check", batches.check),
    ("reconcile", reconcile.reconcile),
    ("resolve", actions.resolve),
    ("cancel", actions.cancel),
    ("retry", actions.retry),
    ("compensate", actions.compensate),
    ("fork", fork.fork),
    ("send-event", events.send_event),
    ("pause", pausing.pause),
    ("resume", pausing.resume),
    ("prune", prune.prune),
    ("serve", serve.serve),
    ("relay", relay.relay),
    ("migrate", migrate.migrate),
    ("demo", demo.demo),
    ("crash-matrix", crashmatrix.crash_matrix),
):
    cli.command(_name, cls=Command)(_command)
cli.add_typer(limits_cli, name="limits")
cli.add_typer(quarantine_cli)


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
