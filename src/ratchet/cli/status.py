"""``ratchet status``: counts by state, capacity and health per task type, once or
``--watch``."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table

from .. import (
    InvalidArguments,
    State,
)
from ..capacity import span as _span
from ..control import (
    MAX_WINDOW_S,
    Control,
    StatusReport,
    TypeStatusView,
)
from ..validation import parse_duration_s
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
)
from .outbox import outbox_views
from .queues import queue_views
from .render import (
    console,
    echo_json,
    echo_json_line,
    field,
    line,
    stdout_is_terminal,
    when,
)

__all__ = ["MAX_WATCH_S", "MIN_WATCH_S", "status"]

T = TypeVar("T")

MIN_WATCH_S = 0.1
MAX_WATCH_S = 3600.0
"""The bounds of ``status --watch SECONDS``, seconds."""


def _rate(rate: float) -> str:
    """A rate, tasks per second, to three significant digits."""
    return "0" if rate == 0 else f"{rate:.3g}"


def _per_s(rate: float) -> str:
    return f"{_rate(rate)}/s"


def _drain(v: TypeStatusView) -> tuple[str, str]:
    """The drain column of ``ratchet status`` (the record's own verdict,
    :attr:`TypeStatusView.drain`) and its style: yellow when paused, limited or not
    draining, green while it drains."""
    if v.paused is not None or v.limited or (v.backlog and v.drain_eta_s is None):
        return v.drain, "yellow"
    return v.drain, "green" if v.backlog else ""


def _attempt_time(seconds: float | None) -> str:
    """A mean attempt duration: ``85ms`` below a second, else as :func:`_span`."""
    if seconds is not None and seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return _span(seconds)


def _littles_table(s: StatusReport, rows: list[TypeStatusView]) -> Table:
    """The capacity by Little's law: W, the slots serving each type, L = λ·W against them
    and, with --drain-within, the slots that drain the backlog in that time."""
    title = f"capacity by Little's law (W over the last {s.window_s:g} s)"
    if s.drain_within_s is not None:
        title += f"; drain within {_span(s.drain_within_s)}"
    table = Table(title=title)
    columns = ["task", "attempts", "W", "workers", "slots", "L (in flight)"]
    if s.drain_within_s is not None:
        columns.append("slots needed")
    columns.append("capacity")
    for col in columns:
        table.add_column(col, overflow="fold",
                         justify="left" if col in ("task", "capacity") else "right")
    for v in rows:
        total = v is s.totals
        cells = [field("all types" if total else v.name, "bold" if total else ""),
                 field(v.attempts), field(_attempt_time(v.mean_attempt_s)), field(v.workers),
                 field(f"{v.slots}+" if v.slots_unrecorded else v.slots),
                 field("-" if v.in_flight is None else f"{v.in_flight:.3g}",
                       "bold red" if v.over_capacity else "")]
        if s.drain_within_s is not None:
            cells.append(field("-" if v.slots_needed is None else v.slots_needed))
        cells.append(field(v.capacity, "red" if v.over_capacity else ""))
        table.add_row(*cells)
    if not s.types:
        table.add_row("(no tasks)", "")
    return table


def _status_view(s: StatusReport) -> list[RenderableType]:
    """The text form of ``ratchet status``: what to print, in order."""
    parts: list[RenderableType] = []
    order = [st.value for st in State]
    present = [st for st in order if any(st in v.counts for v in s.types)]
    present += sorted({k for v in s.types for k in v.counts} - set(order))
    table = Table(title="tasks by type and state (what the ledger holds)")
    table.add_column("task", overflow="fold")
    for st in present:
        table.add_column(st, justify="right")
    table.add_column("total", justify="right")
    rows = list(s.types) + ([s.totals] if s.totals is not None and len(s.types) > 1 else [])
    for v in rows:
        style = "bold" if v is s.totals else ""
        table.add_row(field("all types" if v is s.totals else v.name, style),
                      *(field(v.counts.get(st, 0) or "-") for st in present),
                      field(v.total, style))
    if not s.types:
        table.add_row("(no tasks)", "")
    parts.append(table)
    cap = Table(title=f"capacity (rates over the last {s.window_s:g} s)")
    for col in ("task", "backlog", "scheduled", "running", "waiting", "in/s", "done/s",
                "net/s",
                "drain", "oldest pending", "unknown", "oldest unknown", "quarantined"):
        cap.add_column(col, overflow="fold",
                       justify="left" if col in ("task", "drain") else "right")
    for v in rows:
        drain, drain_style = _drain(v)
        cap.add_row(field("all types" if v is s.totals else v.name,
                          "bold" if v is s.totals else ""),
                    field(v.backlog), field(v.scheduled), field(v.running),
                    field(v.waiting),
                    field(_rate(v.arrival_per_s)), field(_rate(v.completion_per_s)),
                    field(("+" if v.net_drain_per_s > 0 else "") + _rate(v.net_drain_per_s)),
                    field(drain, drain_style), field(_span(v.oldest_pending_age_s)),
                    field(v.unknown, "bold yellow" if v.unknown else ""),
                    field(_span(v.oldest_unknown_age_s)),
                    field(v.quarantined, "yellow" if v.quarantined else ""))
    if not s.types:
        cap.add_row("(no tasks)", "")
    parts.append(cap)
    parts.append(_littles_table(s, rows))
    parts.extend(queue_views(s))
    parts.append(line("running: leased tasks, executing or prefetched by a worker (up to "
                      "--prefetch per worker); waiting: parked (a sleep, an event, their "
                      "children, a concurrency key's slot: key-waiting below), no lease; "
                      "done/s: finished or gone UNKNOWN; in/s and "
                      "done/s are averages over the window; net/s and the drain estimate "
                      "too, or over its last quarter once arrivals stopped (the drain column "
                      "says which); W: mean attempt duration, claim to end, of the attempts "
                      "that ended in the window; slots: the concurrency of the live workers "
                      "that registered the type (shared with the other types they serve); "
                      "L = in/s x W, the attempts in flight the arrivals need (at L >= slots "
                      "the backlog cannot converge)"))
    age = f"{s.oldest_pending_age_s:.1f} s" if s.oldest_pending_age_s is not None else "-"
    parts.append(line(f"oldest pending age: {age}"))
    parts.append(line(f"unknown (waiting for an operator): {s.unknown}"))
    for ver in s.versions:
        if ver.waiting:
            parts.append(line(("waiting: ", "bold yellow"), f"{ver.ready} task(s) of ",
                              (ver.name, "bold"), f" version {ver.version}: {ver.note} (they "
                              "run once a worker that has it starts)"))
    parts.extend(outbox_views(s.outbox))
    duplicates = s.late_effects - s.late_effects_accounted_for
    late_style = "bold yellow" if duplicates else ""
    parts.append(line("late effects (possible duplicates, see ratchet late-effects): ",
                      (str(duplicates), late_style),
                      f" (and {s.late_effects_accounted_for} accounted for)"
                      if s.late_effects_accounted_for else ""))
    parts.append(line(
        f"claims: {s.claims}  takeovers: {s.takeovers}  revocations of dead holders: "
        f"{s.revocations}  stale-generation rejections: {s.stale_rejections}  "
        f"lookup hits: {s.lookup_hits}  idempotency conflicts: {s.idempotency_conflicts}"
        f"  operator actions: {s.operator_actions}"
    ))
    for p in s.pauses:
        what = {"all": "everything", "type": f"type {p.target}",
                "task": f"task {p.target}"}[p.scope]
        parts.append(line(("PAUSED ", "bold yellow"), (what, "bold"),
                          f" (version {p.version}) by ", (p.paused_by, ""), " since ",
                          when(p.created_at), " UTC: ", (p.reason, ""),
                          f"; running, short of a safe boundary: {p.running}"))
    settings = ", ".join(f"{k}={v}" for k, v in s.backend_settings.items())
    parts.append(line("durability: ", (s.durability, "bold"), " (", (settings, ""),
                      f"); schema v{s.schema_version}; ledger ", (s.ledger, ""),
                      f"; ledger time {when(s.ledger_now)} UTC"))
    return parts


def _watch_frames(read: Callable[[], T], show: Callable[[T], None], every_s: float,
                  count: int | None) -> None:
    """Call ``show(read())`` every ``every_s`` seconds, ``count`` times (None: until
    Ctrl-C, which ends it with status 0)."""
    shown = 0
    try:
        while True:
            started = time.monotonic()
            show(read())
            shown += 1
            if count is not None and shown >= count:
                return
            time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return

def status(
    interval: Annotated[
        str | None,
        typer.Argument(metavar="SECONDS", show_default=False,
                       help="With --watch: seconds between redraws (default 2)."),
    ] = None,
    window: Annotated[
        str,
        typer.Option("--window", metavar="SECONDS",
                     help="Arrival and completion rates over the last SECONDS (90, 5m, 1h;"
                     " at most 24h)."),
    ] = "60",
    watch: Annotated[
        bool,
        typer.Option("--watch", help="Redraw every [SECONDS] (default 2) until Ctrl-C;"
                     " with --json: one JSON line per read."),
    ] = False,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, metavar="N", help="With --watch: stop after N reads."),
    ] = None,
    drain_within: Annotated[
        str | None,
        typer.Option("--drain-within", metavar="DURATION",
                     help="Per type, the slots that drain its backlog within DURATION (90s,"
                     " 10m, 2h; seconds if no unit) while tasks keep arriving."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per task type: counts by state, backlog, rates, drain ETA; and health.

    Capacity per type (and over all types): backlog (ready now), scheduled (delayed or
    backing off), running, waiting (parked in a sleep, for an event or for its children;
    no slot held), arrival and completion rates over --window, the net drain rate with
    "drains in ~X" while it is positive or "backlog growing by N/s", the oldest pending
    age, unknown (and the oldest unknown's age) and quarantined. Counts are what the
    ledger holds and add up to the total. Capacity by Little's law per type: the mean
    attempt duration W over --window, the slots of the live workers serving it, L =
    arrival rate x W against those slots (at L >= slots the backlog cannot converge),
    and with --drain-within the slots that drain the backlog in that time while tasks
    keep arriving. Also: late effects, claims, takeovers, revocations, stale-generation
    rejections, pauses, durability and schema version; the outbox: unsent messages, the
    oldest unsent age, failing messages, the relays holding partitions.
    --watch [SECONDS] redraws until Ctrl-C (--count N: N reads, then exit).
    """

    def run() -> None:
        window_s = parse_duration_s(window, "--window", maximum_s=MAX_WINDOW_S,
                                    above_zero=True)
        every_s = 2.0
        if interval is not None:
            if not watch:
                raise InvalidArguments(
                    f"a SECONDS argument ({interval!r}) goes with --watch only")
            every_s = parse_duration_s(interval, "--watch SECONDS", minimum_s=MIN_WATCH_S,
                                       maximum_s=MAX_WATCH_S)
        if count is not None and not watch:
            raise InvalidArguments("--count goes with --watch only")
        within_s = (None if drain_within is None else
                    parse_duration_s(drain_within, "--drain-within", above_zero=True))
        with Control(ledger) as control:
            if not watch:
                report = control.status(window_s, within_s)
                if as_json:
                    echo_json(report)
                else:
                    out = console()
                    for part in _status_view(report):
                        out.print(part)
                return
            read = functools.partial(control.status, window_s, within_s)
            if as_json:
                _watch_frames(read, echo_json_line, every_s, count)
                return
            if stdout_is_terminal():
                with Live(console=console(), auto_refresh=False,
                          redirect_stdout=False) as live:
                    _watch_frames(read, lambda r: live.update(
                        Group(*_status_view(r), line(
                            f"every {every_s:g} s; Ctrl-C to stop")), refresh=True),
                        every_s, count)
                return

            def show(r: StatusReport) -> None:
                out = console()
                out.print(line(f"== ratchet status at {when(r.ledger_now)} UTC"))
                for part in _status_view(r):
                    out.print(part)
                sys.stdout.flush()

            _watch_frames(read, show, every_s, count)

    guard(run)
