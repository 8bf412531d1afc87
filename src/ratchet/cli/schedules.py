"""``ratchet schedules``: the periodic schedules schedulers registered, with their next
tick, last fired tick and missed ticks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from ..control import Control, ScheduleView
from ..loading import load_app
from .guard import guard
from .options import JsonOpt, LedgerOpt
from .render import console, echo_json, field

__all__ = ["schedules"]

AppOpt = Annotated[
    str | None,
    typer.Option("--app", metavar="MODULE:APP",
                 help="The application (myproj.tasks:app): mark the schedules its code"
                 " lacks (\"not in this code\")."),
]


def _utc(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _state(view: ScheduleView) -> tuple[str, str]:
    """The schedule's state column and its style."""
    if view.in_code is False:
        return "not in this code", "yellow"
    if view.stale:
        return f"stale: no scheduler has it since {_utc(view.seen_at)}", "yellow"
    return "active", ""


def schedules(ledger: LedgerOpt = None, app: AppOpt = None, as_json: JsonOpt = False) -> None:
    """Periodic schedules (@app.periodic) and how they fire.

    Name, task, spec, time zone, next tick (UTC; in the past when overdue), last fired tick,
    ticks fired, missed ticks (count, last, reason) and the state: "stale" when no running
    scheduler has said it has the schedule for 90 s (removed from the code, or no worker
    runs a scheduler), "not in this code" with --app when the app lacks it.
    """

    def run() -> None:
        if app is not None:
            loaded = load_app(app)
            loaded.configure(ledger=ledger)
            control = Control(app=loaded)
        else:
            control = Control(ledger)
        with control:
            found = control.schedules()
        if as_json:
            echo_json(found)
            return
        table = Table(title="schedules")
        for column in ("schedule", "task", "spec", "tz", "next tick", "last fired", "fired",
                       "missed", "last missed", "state"):
            table.add_column(column, overflow="fold")
        for s in found:
            state, style = _state(s)
            missed = ("" if not s.missed else
                      f"{_utc(s.last_missed_at)}: {s.last_missed_reason or ''}")
            table.add_row(field(s.name), field(s.task), field(s.spec), field(s.tz),
                          field(_utc(s.next_tick_at)), field(_utc(s.last_fired_at)),
                          field(s.fired), field(s.missed, "red" if s.missed else ""),
                          field(missed), field(state, style))
        if not found:
            table.add_row("(none registered)", "", "", "", "", "", "", "", "", "")
        console().print(table)

    guard(run)
