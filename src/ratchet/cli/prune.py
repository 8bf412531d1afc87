"""``ratchet prune``: retention, deleting finished tasks and their history."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from .. import (
    InvalidArguments,
)
from ..control import (
    Control,
)
from ..validation import parse_duration_s
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
)
from .render import (
    console,
    echo_json,
    line,
)

__all__ = ["prune"]


def prune(
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="AGE",
                     help="Delete tasks that finished more than AGE ago (90s, 5m, 1.5h, 30d)."),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option("--batch-size", min=1, max=10000, metavar="N",
                     help="Tasks per transaction (each batch is short; claims never wait)."),
    ] = 500,
    export: Annotated[
        str | None,
        typer.Option("--export", metavar="FILE",
                     help="Append each pruned task with its history to FILE as a JSON line,"
                     " flushed to disk before its batch is deleted."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who prunes, for the audit log (default: $USER / the login name)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished tasks older than --older-than, with their history.

    SUCCEEDED, FAILED and CANCELLED tasks, their steps, effects, late effects and audit
    rows, in small batches; tasks that are not finished are never touched. A pruned task's
    idempotency key no longer deduplicates: submitting it again creates a new task (the
    dedupe window is the retention age). Outbox messages sent (confirmed by the broker)
    before the same cutoff go too; unsent ones never, whatever their age. Audited, unless
    --dry-run.
    """

    def run() -> None:
        age = parse_duration_s(older_than, "--older-than", unit_required=True)
        with Control(ledger) as control:
            try:
                report = control.prune(age, dry_run=dry_run, batch_size=batch_size,
                                       export=export, by=operator)
            except OSError as exc:  # the export file: nothing was deleted
                raise InvalidArguments(
                    f"--export {export}: {exc.strerror or exc}; nothing was pruned") from exc
        if as_json:
            echo_json(report)
            return
        verb = "would delete" if report.dry_run else "deleted"
        console().print(line(
            f"{verb} {report.tasks} finished task(s) older than {older_than} (finished before ",
            (datetime.fromtimestamp(report.cutoff, UTC)
             .strftime("%Y-%m-%d %H:%M:%S"), ""),
            f" UTC): {report.steps} step(s), {report.effects} effect(s), "
            f"{report.late_effects} late effect(s), {report.audit} audit row(s), "
            f"{report.outbox} sent outbox message(s)",
            f"; {report.batches} batch(es) in {report.elapsed_s:.2f} s" if not report.dry_run
            else "",
            f"; {report.exported} exported to " if export is not None else "",
            (export or "", "")))

    guard(run)
