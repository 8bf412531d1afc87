"""``ratchet limits`` (``set``, ``clear``): cluster-wide concurrency limits (bulkheads) and
rate limits of task types."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from .. import (
    InvalidArguments,
)
from ..control import (
    Control,
    LimitsReport,
    RateLimitView,
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
    help="Cluster-wide concurrency limits (bulkheads) and rate limits. Without a command: "
         "every limit with its live use (running, ready, oldest ready age), the use per "
         "task type, every rate limit with the tasks it holds back, and the latest limit "
         "changes. Limits live in the ledger: every worker's claim obeys them.",
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
    the use of every task type, every rate limit (from the code or an operator) with the
    tasks it holds back now, and the latest limit changes.

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
        out.print(_rate_table(report))
        if report.changes:
            out.print(line("latest limit changes:"))
        for e in report.changes[:10]:
            d = e.detail
            what = e.task_id.removeprefix("limit:")
            out.print(line(f"  {when(e.at)} {what} {_change(e.kind, d)} by ",
                           (str(d.get("operator")), ""), ": ", (str(d.get("reason")), "")))

    guard(run)


def _rate_table(report: LimitsReport) -> Table:
    """The rate limits of ``ratchet limits``."""
    table = Table(title="rate limits")
    for col in ("scope", "name", "rate", "burst", "key", "source", "held back", "set by",
                "reason"):
        table.add_column(col, overflow="fold")
    for v in report.rate_limits:
        table.add_row(field(v.scope), field(v.name), field(v.rate, "bold"), field(v.burst),
                      field(v.key_param or "-"), field(v.source),
                      field(v.held, "yellow" if v.held else ""),
                      field(f"{v.updated_by or '-'} v{v.version}"), field(v.reason or "-"))
    if not report.rate_limits:
        table.add_row("(none: no rate limit applies)", "", "", "", "", "", "", "", "")
    return table


def _change(kind: str, d: dict[str, object]) -> str:
    """What one limit change did, in words."""
    if kind in ("limit_cleared", "rate_limit_cleared"):
        return "rate limit cleared" if kind == "rate_limit_cleared" else "cleared"
    if kind == "rate_limit_set":
        per_s = d.get("rate_per_s")
        rate = f"{per_s:.4g}/s" if isinstance(per_s, int | float) else "?"
        key = f", key {d['key_param']}" if d.get("key_param") else ""
        return f"rate {rate}, burst {d.get('burst')}{key}"
    return (f"reserved {d.get('reserved')}, max "
            f"{'-' if d.get('maximum') is None else d.get('maximum')}")


def _rate_args(type_name: str | None, tenant: str | None, total: object,
               others: bool) -> str:
    """The task type of a rate-limit command (``--type`` alone)."""
    if type_name is None or tenant is not None or total or others:
        raise InvalidArguments("a rate limit is set or cleared for one --type NAME only "
                               "(without --tenant, --total, --reserved or --max)")
    return type_name


def _echo_rate(view: RateLimitView, as_json: bool, what: str) -> None:
    if as_json:
        echo_json(view)
        return
    key = f", a bucket per {view.key_param}" if view.key_param else ""
    console().print(line(f"type {view.name}: rate ", (view.rate, "bold"),
                         f", burst {view.burst}{key} {what} (v{view.version}, by "
                         f"{view.updated_by})"))


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
    rate: Annotated[
        str | None,
        typer.Option("--rate", metavar="N/UNIT",
                     help="With --type: a rate limit (20/s, 100/m, 5/10s, 1000/h, 2/d) "
                          "that replaces the code's until cleared."),
    ] = None,
    burst: Annotated[
        int | None,
        typer.Option("--burst", metavar="N",
                     help="With --rate: the bucket's size (default: the rate per second, "
                          "rounded up)."),
    ] = None,
    key_param: Annotated[
        str | None,
        typer.Option("--key-param", metavar="PARAM",
                     help="With --rate: a bucket per value of this parameter."),
    ] = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a limit of one task type, one tenant, or the total (replaces the old one); or
    a rate limit of one task type.

    Examples: --total 200; --type payment --reserved 60; --type tracking --max 70;
    --tenant acme --max 20; --type payment --rate 20/s --burst 40 --key-param merchant.
    Audited with --reason and --operator.
    """

    def run() -> None:
        if rate is not None:
            name = _rate_args(type_name, tenant, total is not None,
                              bool(reserved) or maximum is not None)
            with Control(ledger) as control:
                view = control.set_rate_limit(name, rate, burst=burst, key_param=key_param,
                                              reason=require_reason(reason), by=operator)
            _echo_rate(view, as_json, "set")
            return
        if burst is not None or key_param is not None:
            raise InvalidArguments("--burst and --key-param go with --rate")
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
    rate: Annotated[
        bool, typer.Option("--rate", help="With --type: the operator's rate limit (the "
                                          "code's, if any, applies again)."),
    ] = False,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a limit of one task type, one tenant, or the total, or with --rate the
    operator's rate limit of one task type (audited); --json prints the limit as it
    was."""

    def run() -> None:
        if rate:
            name = _rate_args(type_name, tenant, total, False)
            with Control(ledger) as control:
                old_rate = control.clear_rate_limit(name, reason=require_reason(reason),
                                                    by=operator)
            _echo_rate(old_rate, as_json, "cleared")
            return
        scope, name = _limit_scope(type_name, tenant, total)
        with Control(ledger) as control:
            old = control.clear_limit(scope, name, reason=require_reason(reason), by=operator)
        if as_json:
            echo_json(old)
            return
        console().print(line(f"{old.scope.value} {old.name}".strip() + " limit cleared"))

    guard(run)
