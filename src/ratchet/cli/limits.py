"""``ratchet limits`` (``set``, ``clear``): cluster-wide concurrency limits (bulkheads)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .. import (
    InvalidArguments,
)
from ..control import (
    Control,
)
from .guard import guard
from .options import (
    Command,
    JsonOpt,
    LedgerOpt,
    OperatorOpt,
    ReasonOpt,
    require_reason,
)
from .render import (
    console,
    echo_json,
    field,
    line,
    when,
)

__all__ = ["limits_cli"]


limits_cli = typer.Typer(
    help="Cluster-wide concurrency limits (bulkheads). Without a command: every limit with "
         "its live use (running, ready, oldest ready age), the use per task type, and the "
         "latest limit changes. Limits live in the ledger: every worker's claim obeys them.",
    invoke_without_command=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

LimitTypeOpt = Annotated[
    str | None, typer.Option("--type", metavar="NAME", help="A task type.")]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", metavar="TENANT", help="A tenant (App.submit tenant=).")]


def _limit_scope(type_name: str | None, tenant: str | None, total: bool) -> tuple[str, str]:
    """``(scope, name)`` of exactly one of --type / --tenant / --total."""
    given = [(s, n) for s, n, on in (("type", type_name or "", type_name is not None),
                                     ("tenant", tenant or "", tenant is not None),
                                     ("total", "", total)) if on]
    if len(given) != 1:
        raise InvalidArguments("give exactly one of --type NAME, --tenant TENANT, --total")
    return given[0]


@limits_cli.callback()
def limits(
    ctx: typer.Context, ledger: LedgerOpt = None, as_json: JsonOpt = False
) -> None:
    """Show every concurrency limit with its live use (running, ready, oldest ready age),
    the use of every task type, and the latest limit changes.

    Limits live in the ledger and hold cluster-wide: every worker's claim obeys them.
    """
    if ctx.invoked_subcommand is not None:
        return

    def run() -> None:
        with Control(ledger) as control:
            report = control.limits()
        if as_json:
            echo_json(report)
            return
        out = console()
        table = Table(title="concurrency limits")
        for col in ("scope", "name", "reserved", "max", "running", "ready", "oldest ready",
                    "set by", "reason"):
            table.add_column(col, overflow="fold")
        for v in report.limits:
            age = f"{v.oldest_ready_age_s:.1f} s" if v.oldest_ready_age_s is not None else "-"
            table.add_row(field(v.scope), field(v.name or "-"), field(v.reserved),
                          field(v.maximum if v.maximum is not None else "-"),
                          field(v.running), field(v.ready), field(age),
                          field(f"{v.updated_by} v{v.version}"), field(v.reason))
        if not report.limits:
            table.add_row("(none: no limit applies)", "", "", "", "", "", "", "", "")
        out.print(table)
        usage = Table(title="use per task type")
        for col in ("task", "running", "ready", "oldest ready"):
            usage.add_column(col, overflow="fold")
        for u in report.usage:
            age = f"{u.oldest_ready_age_s:.1f} s" if u.oldest_ready_age_s is not None else "-"
            usage.add_row(field(u.name), field(u.running), field(u.ready), field(age))
        if not report.usage:
            usage.add_row("(nothing running or ready)", "", "", "")
        out.print(usage)
        out.print(line(f"running in all: {report.running}"))
        if report.changes:
            out.print(line("latest limit changes:"))
        for e in report.changes[:10]:
            d = e.detail
            what = e.task_id.removeprefix("limit:")
            values = ("cleared" if e.kind == "limit_cleared" else
                      f"reserved {d.get('reserved')}, max "
                      f"{'-' if d.get('maximum') is None else d.get('maximum')}")
            out.print(line(f"  {when(e.at)} {what} {values} by ", (str(d.get("operator")), ""),
                           ": ", (str(d.get("reason")), "")))

    guard(run)


@limits_cli.command("set", cls=Command)
def limits_set(
    reason: ReasonOpt = None,
    type_name: LimitTypeOpt = None,
    tenant: TenantOpt = None,
    total: Annotated[
        int | None,
        typer.Option("--total", metavar="SLOTS", help="The cluster's total of slots."),
    ] = None,
    reserved: Annotated[
        int, typer.Option("--reserved", metavar="N",
                          help="Slots of the total kept for it while it has ready work."),
    ] = 0,
    maximum: Annotated[
        int | None, typer.Option("--max", metavar="N", help="At most N running at once."),
    ] = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a limit of one task type, one tenant, or the total (replaces the old one).

    Examples: --total 200; --type payment --reserved 60; --type tracking --max 70;
    --tenant acme --max 20. Audited with --reason and --operator.
    """

    def run() -> None:
        scope, name = _limit_scope(type_name, tenant, total is not None)
        top = total if scope == "total" else maximum
        with Control(ledger) as control:
            lim = control.set_limit(scope, name, reserved=reserved, maximum=top,
                                    reason=require_reason(reason), by=operator)
        if as_json:
            echo_json(lim)
            return
        what = f"{lim.scope.value} {lim.name}".strip()
        console().print(line(f"{what}: reserved {lim.reserved}, max ",
                             (str(lim.maximum) if lim.maximum is not None else "-", "bold"),
                             f" (v{lim.version}, by {lim.updated_by})"))

    guard(run)


@limits_cli.command("clear", cls=Command)
def limits_clear(
    reason: ReasonOpt = None,
    type_name: LimitTypeOpt = None,
    tenant: TenantOpt = None,
    total: Annotated[bool, typer.Option("--total", help="The total of slots.")] = False,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a limit of one task type, one tenant, or the total (audited); --json prints
    the limit as it was."""

    def run() -> None:
        scope, name = _limit_scope(type_name, tenant, total)
        with Control(ledger) as control:
            old = control.clear_limit(scope, name, reason=require_reason(reason), by=operator)
        if as_json:
            echo_json(old)
            return
        console().print(line(f"{old.scope.value} {old.name}".strip() + " limit cleared"))

    guard(run)
