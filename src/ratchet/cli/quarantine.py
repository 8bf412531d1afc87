"""``ratchet quarantine`` (``list``, ``replay``): poison tasks grouped by error fingerprint."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..control import (
    Control,
    default_operator,
)
from ..validation import parse_rate_per_s
from .guard import guard
from .options import (
    Command,
    JsonOpt,
    LedgerOpt,
)
from .render import (
    clip,
    console,
    echo_json,
    field,
    line,
    when,
)

__all__ = ["quarantine_cli"]


quarantine_cli = typer.Typer(
    name="quarantine", no_args_is_help=True, rich_markup_mode=None,
    help="Poison tasks: list them by error fingerprint, replay them at a rate.",
)


@quarantine_cli.command("list", cls=Command)
def quarantine_list(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10000, metavar="N", help="At most N groups.")
    ] = 100,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Quarantined tasks grouped by error fingerprint, newest group first.

    A task is quarantined after the same error (task type + exception class + message with
    numbers, ids and quoted values masked) RetryPolicy.quarantine_after times in a row, or
    after as many deliveries whose worker died; it is never redelivered automatically.
    """

    def run() -> None:
        with Control(ledger) as control:
            groups = control.quarantine_list(limit)
        if as_json:
            echo_json(groups)
            return
        table = Table(title="quarantine (by fingerprint)")
        for column in ("fingerprint", "type", "tasks", "first (UTC)", "last (UTC)", "class",
                       "example", "task ids"):
            table.add_column(column, overflow="fold")
        for g in groups:
            more = " ..." if g.count > len(g.task_ids) else ""
            table.add_row(field(g.fingerprint), field(g.task_type), field(g.count),
                          field(when(g.first_seen)), field(when(g.last_seen)),
                          field(g.error_class or "-"), field(clip(g.example_message, 160)),
                          field(" ".join(g.task_ids) + more))
        if not groups:
            table.add_row("(none)", "", "", "", "", "", "", "")
        console().print(table)

    guard(run)

@quarantine_cli.command("replay", cls=Command)
def quarantine_replay(
    fingerprint: Annotated[
        str, typer.Option("--fingerprint", metavar="F",
                          help="The fingerprint ratchet quarantine list shows.")
    ],
    rate: Annotated[
        str, typer.Option("--rate", metavar="RATE",
                          help="Admission rate: 5/s, 300/m, 1000/h (per second if no unit).")
    ] = "1/s",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be replayed; change nothing.")
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT",
                                 help="Why (kept in the audit log; required unless --dry-run).")
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who decided (default: $USER / the login name)."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100000, metavar="N", help="At most N tasks.")
    ] = 10000,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay the quarantined tasks of one fingerprint with fresh attempt counters.

    Each becomes PENDING (attempts, failure streak and crash count reset; steps, effects
    and history kept) at a run_at staggered by the rate, audited with --reason and
    --operator. --dry-run lists them and changes nothing.
    """

    def run() -> None:
        per_s = parse_rate_per_s(rate, "--rate")
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            report = control.quarantine_replay(fingerprint, per_s, dry_run=dry_run,
                                               reason=reason, by=who, limit=limit)
        if as_json:
            echo_json(report)
            return
        table = Table(title=("would replay (dry run: nothing changed)" if dry_run
                             else f"replayed by {who}"))
        for column in ("task", "type", "ready in", "failures", "crashes"):
            table.add_column(column, overflow="fold")
        for t in report.tasks:
            table.add_row(field(t.task_id), field(t.name),
                          field(f"{max(0.0, t.run_at - report.ledger_now):.1f}s"),
                          field(t.failures), field(t.crashes))
        if not report.tasks:
            table.add_row("(none)", "", "", "", "")
        console().print(table)
        verb = "would replay" if dry_run else "replayed"
        console().print(line(f"{verb} {len(report.tasks)} task(s) at {per_s:g}/s"))

    guard(run)
