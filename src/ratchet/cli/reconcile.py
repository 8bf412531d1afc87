"""``ratchet reconcile``: ask the targets (``App.lookup``) whether they agree with the ledger."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..control import (
    Control,
)
from ..loading import load_app
from ..reconcile import MAX_LOOKUP_RETRIES, MAX_LOOKUP_TIMEOUT_S
from ..reconcile import reconcile as run_reconcile
from ..validation import parse_duration_s, parse_rate_per_s
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
)
from .render import (
    console,
    echo_json,
    field,
    line,
    show_value,
)

__all__ = ["reconcile"]


def reconcile(
    task_type: Annotated[str, typer.Argument(metavar="TYPE", help="The task type to check.")],
    app_spec: Annotated[
        str,
        typer.Option("--app", metavar="MODULE:APP",
                     help="The application whose lookups (App.lookup) ask the targets."),
    ],
    since: Annotated[
        str,
        typer.Option("--since", metavar="AGE",
                     help="Only tasks submitted within AGE (90s, 5m, 24h, 7d), or 'all'."),
    ] = "24h",
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100_000, metavar="N",
                          help="At most N effects, newest task first."),
    ] = 1000,
    apply: Annotated[
        bool, typer.Option("--apply",
                           help="Resolve the unambiguous findings (audited; needs --reason)."),
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT",
                                 help="Why (kept in the audit log); required with --apply."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who reconciles, for the audit log (default: $USER / login name)."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=64, metavar="N",
                          help="Lookups at once."),
    ] = 4,
    rate: Annotated[
        str, typer.Option("--rate", metavar="RATE",
                          help="Lookups started at most this often (20/s, 300/m), or 'none'."),
    ] = "20/s",
    lookup_timeout: Annotated[
        str, typer.Option("--lookup-timeout", metavar="SECONDS",
                          help="Time each lookup may take; slower counts as unknown."),
    ] = "10s",
    lookup_retries: Annotated[
        int, typer.Option("--lookup-retries", min=0, max=MAX_LOOKUP_RETRIES, metavar="N",
                          help="Tries again a lookup that raised (a 503, a refused "
                          "connection) up to N times, with jittered backoff."),
    ] = 2,
    no_record: Annotated[
        bool, typer.Option("--no-record",
                           help="Do not audit the run and its findings in the ledger."),
    ] = False,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the targets whether they agree with the ledger, for recent effects of TYPE.

    Each effect's lookup registered with App.lookup(TYPE, EFFECT) is asked for its key.
    Findings: absent (recorded done, the target has no such key), unrecorded (the target
    has it, the ledger records an open intent / not_done / given_up), not_executed (an
    UNKNOWN task's open intent the target confirms never executed), unknown (the lookup
    raised, tried --lookup-retries times more, or timed out), late (a stale holder's late
    call: a possible duplicate), no_lookup (effects of a name with no registered lookup).
    Nothing changes unless --apply: then an UNKNOWN task whose one open effect the target
    has is resolved done with the target's answer, and one the target confirms absent is
    resolved not-done (audited with --operator and --reason); the rest is left for a
    person. Every run is audited (kinds reconcile, reconcile_<outcome>) unless
    --no-record. Exit status: 0 no finding left, 1 findings left (disagreement or not
    checked), 2 an error.
    """
    outcome: dict[str, int] = {}

    def run() -> None:
        window = None if since.strip().lower() == "all" else parse_duration_s(since, "--since")
        per_s = None if rate.strip().lower() == "none" else parse_rate_per_s(rate, "--rate")
        timeout_s = parse_duration_s(lookup_timeout, "--lookup-timeout",
                                     maximum_s=MAX_LOOKUP_TIMEOUT_S, above_zero=True)
        app = load_app(app_spec)
        if ledger is not None:
            app.configure(ledger=ledger)
        with Control(app=app) as control:
            report = run_reconcile(
                control, app, task_type, newer_than_s=window, limit=limit, apply=apply,
                reason=reason, by=operator, concurrency=concurrency, rate_per_s=per_s,
                lookup_timeout_s=timeout_s, lookup_retries=lookup_retries,
                record=not no_record)
        outcome["open"] = report.open_findings
        if as_json:
            echo_json(report)
            return
        out = console()
        table = Table(title=f"reconcile {task_type}: findings")
        for column in ("outcome", "task", "state", "effect", "key", "ledger", "target",
                       "action", "note"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            action = f.action if f.action == "none" else (
                f"{f.action}: {'done' if f.applied else 'not applied'}" if report.apply
                else f"{f.action} (with --apply)")
            target = "-" if f.target is None else show_value(f.target)
            table.add_row(field(f.outcome), field(f.task_id or "-"), field(f.task_state or "-"),
                          field(f.effect), field(f.key or "-"), field(f.recorded or "-"),
                          target, field(action), field(f.note))
        if not report.findings:
            table.add_row("(none)", "", "", "", "", "", "", "", "")
        out.print(table)
        counts = "  ".join(f"{k}: {n}" for k, n in report.counts.items())
        out.print(line(
            f"{report.effects} effect(s) walked", " (more left past --limit)"
            if report.truncated else "", f", {report.lookups} lookup(s), {report.agreed} "
            f"agree, {report.in_flight} in flight (RUNNING, not asked); ", counts,
            f"; resolved: {report.resolved}; left: {report.open_findings}",
            "" if report.recorded else " (not recorded)"))

    guard(run)
    if outcome.get("open"):
        raise typer.Exit(1)
