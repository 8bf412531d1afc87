"""The capacity view of ``Control.status`` (DESIGN §9): per task type, the backlog, the
rates over the window, the drain estimate and *why* a type does not drain (a pause, a
full concurrency limit), as one record that every face shows unchanged (``ratchet
status`` and its ``--json``, ``GET /api/status``, the dashboard's overview).

Pure functions over what one ledger read returned (:class:`~ratchet.ledger.base.TypeCapacity`,
the per-state counts, the active pauses and the limits); nothing here reads the ledger.

The drain estimate is made over the whole window while tasks keep arriving. When none
arrived in the window's recent part (its last :data:`RECENT_FRACTION`), arrivals have
stopped: the estimate is then made over that recent part, with no arrivals, so a burst
that ended is not reported as a growing backlog for the rest of the window (a window
average would say so), and the row says since when nothing arrives.

The capacity figures by Little's law (:mod:`ratchet.littles`): the mean attempt duration
``W`` over the window, the slots of the live workers serving the type, the attempts in
flight the arrivals need (``L = λ·W``) against those slots, and, given a time to drain in,
the slots that would drain the backlog within it while tasks keep arriving.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .ledger.base import (
    RECENT_FRACTION,
    Limit,
    LimitScope,
    PauseRecord,
    SlotUsage,
    TypeCapacity,
    WorkerSlots,
)
from .littles import (
    SlotsServing,
    drain_work_s,
    in_flight,
    mean_attempt_s,
    slots_by_type,
    slots_for,
    slots_total,
)
from .states import State

__all__ = [
    "ALL_TYPES",
    "RECENT_FRACTION",
    "LimitReached",
    "TypeStatusView",
    "capacity_views",
    "rate_text",
    "span",
]

ALL_TYPES = "*"
"""The ``name`` of :attr:`StatusReport.totals` (the figures over every task type)."""

@dataclass(frozen=True, slots=True)
class LimitReached:
    """A concurrency limit that is full while the type has ready work: why it runs no more.

    Attributes:
        scope: ``type``, ``tenant`` or ``total`` (DESIGN §8).
        name: the task type or tenant (``""`` for the total).
        maximum: the limit, RUNNING tasks.
        running: the scope's RUNNING tasks now (at or above ``maximum``).
    """

    scope: str
    name: str
    maximum: int
    running: int


@dataclass(frozen=True, slots=True)
class TypeStatusView:
    """The capacity view of one task type (``ratchet status``; DESIGN §9), read from the
    ledger's rows and indexes, never from event counters.

    Attributes:
        name: the task type (:data:`ALL_TYPES` for :attr:`StatusReport.totals`).
        counts: ``{state: count}``, what the ledger holds (states with none left out);
            they add up to ``total``.
        total: its tasks in the ledger.
        backlog: ``PENDING`` / ``RETRY_WAIT`` tasks ready now (``run_at`` <= the ledger
            clock): waiting for a worker.
        scheduled: ``PENDING`` / ``RETRY_WAIT`` tasks with ``run_at`` later (submitted with
            a delay, or backing off before a retry); ``backlog + scheduled`` is their count.
        running: ``RUNNING`` tasks (a dead holder's included until its lease is taken
            over or revoked).
        waiting: ``WAITING`` tasks, parked by their own code (a durable sleep, an event,
            their children): no lease, no slot, neither backlog nor running; each is
            ready again when what it waits for comes.
        arrival_per_s: tasks created in the window / ``window_s``, tasks per second.
        completion_per_s: tasks that left the work in the window / ``window_s``, tasks per
            second: reached ``SUCCEEDED``, ``FAILED`` or ``CANCELLED``, or went ``UNKNOWN``
            (they wait for a person, not a worker; one resolved and finished within the
            window counts twice). Both are averages over the whole window, like
            Prometheus' ``rate()``.
        net_drain_per_s: completions minus arrivals per second over ``drain_window_s``
            (negative: the work grows); with arrivals stopped, the recent completion rate.
        drain_eta_s: ``backlog / net_drain_per_s`` seconds, only when the net rate is
            positive and the type is not paused; None otherwise (not draining).
        oldest_pending_age_s: seconds the oldest ready task has waited since its
            ``run_at`` (None: nothing is ready).
        unknown: ``UNKNOWN`` tasks (waiting for an operator: ``ratchet resolve``).
        oldest_unknown_age_s: seconds since the oldest of them entered ``UNKNOWN`` (its
            row's last change), None when there is none.
        quarantined: quarantined ``FAILED`` tasks (``ratchet quarantine list``).
        drain_window_s: the seconds the net rate and the ETA were measured over: the whole
            window, or its recent part (:data:`RECENT_FRACTION`) once arrivals stopped.
        arrivals_stopped: no task arrived in the window's recent part (the estimate then
            counts no arrivals).
        last_arrival_age_s: seconds since the newest arrival in the window (None: none
            arrived in it).
        paused: the active pause that covers the type (a pause of everything, or of this
            type): nothing of it is claimed; None when it is not paused.
        limited: the concurrency limits that are full while the type has ready work (its
            type cap, a cap of a tenant with ready tasks of it, the total): why it runs
            no more than it does. Empty when none is.
        held_back: of ``backlog``, the ready tasks of types that are paused or held by a
            full limit (a type's own row: all of its backlog or none); for the totals,
            the sum over the types, whose verdict then says so and makes no growth or
            drain claim for them. held_in: those types, sorted (``name (paused)`` /
            ``name (limited)``).
        drain: the one-line verdict every face shows: paused (by whom, since when),
            limited (N running, of the limit), then ``drains in ~X (at the last N s's
            rate)``, ``backlog growing by N/s (over the last N s)``, ``not draining
            (...)``, ``no backlog`` or ``nothing ready, N scheduled``, with ``arrivals
            stopped Ns ago`` when they did.

    Rates count rows the ledger still holds: a prune shorter than the window lowers them.
    """

    name: str
    counts: dict[str, int]
    total: int
    backlog: int
    scheduled: int
    running: int
    arrival_per_s: float
    completion_per_s: float
    net_drain_per_s: float
    drain_eta_s: float | None
    oldest_pending_age_s: float | None
    unknown: int
    oldest_unknown_age_s: float | None
    quarantined: int
    drain_window_s: float = 0.0
    arrivals_stopped: bool = False
    last_arrival_age_s: float | None = None
    paused: PauseRecord | None = None
    limited: list[LimitReached] = field(default_factory=list)
    held_back: int = 0
    held_in: list[str] = field(default_factory=list)
    drain: str = ""
    waiting: int = 0
    attempts: int = 0
    mean_attempt_s: float | None = None
    slots: int = 0
    workers: int = 0
    slots_unrecorded: int = 0
    in_flight: float | None = None
    over_capacity: bool = False
    drain_within_s: float | None = None
    slots_needed: int | None = None
    capacity: str = ""


def span(seconds: float | None) -> str:
    """A duration for people: ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{max(0.0, seconds):.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def rate_text(per_s: float) -> str:
    """A rate, tasks per second, to three significant digits: ``14.6/s``, ``0/s``."""
    return "0/s" if per_s == 0 else f"{per_s:.3g}/s"


def _clock(epoch_s: float) -> str:
    """``HH:MM:SS UTC`` of a ledger time."""
    hours, rest = divmod(int(epoch_s) % 86400, 3600)
    return f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d} UTC"


def _verdict(v: TypeStatusView, now: float) -> str:
    """The ``drain`` text of a view whose figures are set (see :class:`TypeStatusView`)."""
    parts: list[str] = []
    if v.paused is not None:
        p = v.paused
        what = "everything paused" if p.scope == "all" else "paused"
        parts.append(f"{what} by {p.paused_by} since {_clock(p.created_at)} "
                     f"({span(now - p.created_at)} ago)")
    for lim in v.limited:
        of = {"type": "its type limit", "total": "the total limit"}.get(
            lim.scope, f"tenant {lim.name}'s limit")
        parts.append(f"limited ({lim.running} running, of {of} {lim.maximum})")
    if v.arrivals_stopped and v.last_arrival_age_s is not None:
        parts.append(f"arrivals stopped {span(v.last_arrival_age_s)} ago")
    elif v.arrivals_stopped and v.backlog:
        parts.append(f"no arrivals in the last {v.drain_window_s / RECENT_FRACTION:g} s")
    basis = f"{v.drain_window_s:g} s"
    held = ""
    if v.name == ALL_TYPES and v.held_back and v.paused is None:
        held = (f"{v.held_back} ready wait in paused or limited types "
                f"({', '.join(v.held_in)})")
    if not v.backlog:  # nothing ready: nothing to drain, whatever the rates say
        parts.append(f"nothing ready, {v.scheduled} scheduled" if v.scheduled
                     else "no backlog")
    elif v.paused is not None:
        parts.append(f"{v.backlog} ready wait for the resume")
    elif held and v.held_back >= v.backlog:  # no worker may take any of it: no rate claim
        parts.append(held)
    elif v.drain_eta_s is not None:
        parts.append(f"drains in ~{span(v.drain_eta_s)} (at the last {basis}'s rate)")
    elif v.net_drain_per_s < 0:
        parts.append(f"backlog growing by {rate_text(-v.net_drain_per_s)} "
                     f"(over the last {basis})")
    elif v.net_drain_per_s == 0 and v.arrivals_stopped:
        parts.append(f"not draining (no completion in the last {basis})")
    else:
        parts.append(f"not draining (0/s over the last {basis})")
    if held and v.held_back < v.backlog:
        parts.append(f"of them {held}")
    return "; ".join(parts)


def _type_view(name: str, counts: Mapping[str, int], cap: TypeCapacity, now: float,
               window_s: float, paused: PauseRecord | None,
               limited: Sequence[LimitReached]) -> TypeStatusView:
    """One type's (or the totals') capacity figures: ``counts`` from the ledger's per-state
    counts, ``cap`` the same read's backlog split, ages and window counts."""
    waiting = counts.get(State.PENDING.value, 0) + counts.get(State.RETRY_WAIT.value, 0)
    # Both from one read; on PostgreSQL (read committed) each statement has its own
    # snapshot, so the split is clamped to the counts: backlog + scheduled == waiting.
    scheduled = min(cap.scheduled, waiting)
    backlog = waiting - scheduled
    arrival = cap.arrivals / window_s
    completion = (cap.completions + cap.unknown_entered) / window_s
    recent_s = window_s * RECENT_FRACTION
    stopped = cap.recent_arrivals == 0
    if stopped:  # nothing arrives now: the recent completions alone say how fast it drains
        basis = recent_s
        net = (cap.recent_completions + cap.recent_unknown_entered) / recent_s
    else:
        basis = window_s
        net = completion - arrival
    view = TypeStatusView(
        name=name,
        counts={k: v for k, v in counts.items() if v},
        total=sum(counts.values()),
        backlog=backlog,
        scheduled=scheduled,
        running=counts.get(State.RUNNING.value, 0),
        waiting=counts.get(State.WAITING.value, 0),
        arrival_per_s=arrival,
        completion_per_s=completion,
        net_drain_per_s=net,
        drain_eta_s=backlog / net if net > 0 and paused is None else None,
        oldest_pending_age_s=(max(0.0, now - cap.oldest_ready_at)
                              if cap.oldest_ready_at is not None and backlog else None),
        unknown=counts.get(State.UNKNOWN.value, 0),
        oldest_unknown_age_s=(max(0.0, now - cap.oldest_unknown_at)
                              if cap.oldest_unknown_at is not None else None),
        quarantined=cap.quarantined,
        drain_window_s=basis,
        arrivals_stopped=stopped,
        last_arrival_age_s=(max(0.0, now - cap.last_arrival_at)
                            if cap.last_arrival_at is not None else None),
        paused=paused,
        limited=list(limited) if backlog else [],
        held_back=backlog if paused is not None or (limited and backlog) else 0,
    )
    return _with_verdict(view, now)


def _with_verdict(view: TypeStatusView, now: float) -> TypeStatusView:
    """``view`` with its ``drain`` text (frozen records: a copy)."""
    return dataclasses.replace(view, drain=_verdict(view, now))


def _amount(x: float) -> str:
    """A number of slots for people: ``2.4``, ``0.0125``, ``1,250``."""
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def _capacity_verdict(v: TypeStatusView) -> str:
    """The ``capacity`` text of a view whose capacity figures are set."""
    parts: list[str] = []
    of = f"{v.slots} slot{'s' if v.slots != 1 else ''}"
    if v.slots_unrecorded:
        of = (f"{v.slots}+ slots ({v.slots_unrecorded} worker"
              f"{'s' if v.slots_unrecorded != 1 else ''} recorded none)")
    if not v.workers:
        parts.append("no live worker serves it" if v.name != ALL_TYPES
                     else "no live worker")
    if v.in_flight is None:
        parts.append("W unknown (no attempt ended in the window)")
    elif v.workers:
        parts.append(f"needs ~{_amount(v.in_flight)} of {of}")
    else:
        parts.append(f"needs ~{_amount(v.in_flight)} slots")
    if v.over_capacity:
        parts.append("cannot keep up: the backlog cannot converge at this arrival rate")
    if v.slots_needed is not None and v.drain_within_s is not None:
        parts.append(f"{v.slots_needed} slot{'s drain' if v.slots_needed != 1 else ' drains'}"
                     f" the backlog within {span(v.drain_within_s)}")
    return "; ".join(parts)


def _with_capacity(view: TypeStatusView, attempts: int, attempt_s: float,
                   serving: SlotsServing, within_s: float | None, *,
                   in_flight_s: float | None = None,
                   work_s: float | None = None) -> TypeStatusView:
    """``view`` with its capacity figures (Little's law, :mod:`ratchet.littles`) and their
    verdict. ``in_flight_s`` / ``work_s``: the totals' summed ``L`` and drain work (a
    type's own are computed from its figures)."""
    w = mean_attempt_s(attempts, attempt_s)
    if w is not None and in_flight_s is None:
        in_flight_s = in_flight(view.arrival_per_s, w)
    if w is not None and work_s is None and within_s is not None:
        work_s = drain_work_s(view.backlog, view.arrival_per_s, w, within_s)
    needed = (slots_for(work_s, within_s)
              if work_s is not None and within_s is not None else None)
    over = (view.arrival_per_s > 0 and not serving.unrecorded
            and ((in_flight_s is not None and in_flight_s >= serving.slots)
                 or not serving.workers))
    v = dataclasses.replace(
        view, attempts=attempts, mean_attempt_s=w, slots=serving.slots,
        workers=serving.workers, slots_unrecorded=serving.unrecorded,
        in_flight=in_flight_s, over_capacity=over, drain_within_s=within_s,
        slots_needed=needed)
    return dataclasses.replace(v, capacity=_capacity_verdict(v))


def _pause_of(name: str, pauses: Sequence[PauseRecord]) -> PauseRecord | None:
    """The active pause covering task type ``name`` (:data:`ALL_TYPES`: only a pause of
    everything), the earliest first."""
    covering = [p for p in pauses
                if p.scope == "all" or (p.scope == "type" and p.target == name
                                        and name != ALL_TYPES)]
    return min(covering, key=lambda p: p.created_at) if covering else None


def _full_limits(name: str, running: int, total_running: int, limits: Sequence[Limit],
                 usage: SlotUsage | None) -> list[LimitReached]:
    """The caps that are full for type ``name`` (:data:`ALL_TYPES`: the total only):
    its type cap, the total, and the cap of each tenant that has ready tasks of it."""
    full: list[LimitReached] = []
    for lim in limits:
        if lim.maximum is None:
            continue
        if lim.scope is LimitScope.TYPE and lim.name == name and running >= lim.maximum:
            full.append(LimitReached("type", name, lim.maximum, running))
        elif lim.scope is LimitScope.TOTAL and total_running >= lim.maximum:
            full.append(LimitReached("total", "", lim.maximum, total_running))
        elif lim.scope is LimitScope.TENANT and usage is not None and name != ALL_TYPES:
            if not any(n == name and t == lim.name for n, t in usage.ready):
                continue
            held = sum(k for (_, t), k in usage.running.items() if t == lim.name)
            if held >= lim.maximum:
                full.append(LimitReached("tenant", lim.name, lim.maximum, held))
    return full


def capacity_views(counts: Mapping[str, Mapping[str, int]], caps: Sequence[TypeCapacity],
                   now: float, window_s: float, *, pauses: Sequence[PauseRecord] = (),
                   limits: Sequence[Limit] = (), usage: SlotUsage | None = None,
                   workers: Sequence[WorkerSlots] = (),
                   drain_within_s: float | None = None,
                   ) -> tuple[list[TypeStatusView], TypeStatusView]:
    """The per-type views and the totals of one stats read.

    Args:
        counts: ``{type: {state: count}}`` (what the ledger holds).
        caps: the same read's :class:`TypeCapacity` per type.
        now: the read's ledger clock, epoch seconds. window_s: its rate window, seconds.
        pauses: the active pauses (a type or everything paused is said so, with no ETA).
        limits: the concurrency limits (a full one is named on the types it holds back).
        usage: RUNNING / ready tasks per (type, tenant), needed for tenant limits only.
        workers: the live workers with their slots and types (the slots serving each).
        drain_within_s: the time to drain each backlog in, seconds (> 0), for
            :attr:`TypeStatusView.slots_needed`; None: not asked.

    Returns:
        ``(views sorted by type, the totals named ALL_TYPES)``.

    Raises:
        ValueError: ``drain_within_s`` not a finite number above 0.
    """
    if drain_within_s is not None and not (math.isfinite(drain_within_s)
                                           and drain_within_s > 0):
        raise ValueError(f"drain_within_s must be a finite number above 0, "
                         f"got {drain_within_s!r}")
    by_name = {c.name: c for c in caps}
    names = sorted(set(counts) | set(by_name))
    total_running = sum(c.get(State.RUNNING.value, 0) for c in counts.values())
    views = []
    for n in names:
        running = counts.get(n, {}).get(State.RUNNING.value, 0)
        views.append(_type_view(n, counts.get(n, {}), by_name.get(n, TypeCapacity(n)), now,
                                window_s, _pause_of(n, pauses),
                                _full_limits(n, running, total_running, limits, usage)))
    summed: dict[str, int] = {}
    for n in names:
        for st, k in counts.get(n, {}).items():
            summed[st] = summed.get(st, 0) + k
    readies = [c.oldest_ready_at for c in caps if c.oldest_ready_at is not None]
    unknowns = [c.oldest_unknown_at for c in caps if c.oldest_unknown_at is not None]
    lasts = [c.last_arrival_at for c in caps if c.last_arrival_at is not None]
    all_cap = TypeCapacity(
        ALL_TYPES,
        scheduled=sum(v.scheduled for v in views),
        oldest_ready_at=min(readies) if readies else None,
        oldest_unknown_at=min(unknowns) if unknowns else None,
        unknown=sum(c.unknown for c in caps),
        quarantined=sum(c.quarantined for c in caps),
        arrivals=sum(c.arrivals for c in caps),
        completions=sum(c.completions for c in caps),
        unknown_entered=sum(c.unknown_entered for c in caps),
        recent_arrivals=sum(c.recent_arrivals for c in caps),
        recent_completions=sum(c.recent_completions for c in caps),
        recent_unknown_entered=sum(c.recent_unknown_entered for c in caps),
        last_arrival_at=max(lasts) if lasts else None)
    totals = _type_view(ALL_TYPES, summed, all_cap, now, window_s,
                        _pause_of(ALL_TYPES, pauses),
                        _full_limits(ALL_TYPES, total_running, total_running, limits, None))
    serving = slots_by_type(workers)
    measured = {v.name: by_name.get(v.name, TypeCapacity(v.name)) for v in views}
    views = [_with_capacity(v, measured[v.name].attempts, measured[v.name].attempt_s,
                            serving.get(v.name, SlotsServing()), drain_within_s)
             for v in views]
    known = [v for v in views if v.in_flight is not None]
    work = ([drain_work_s(v.backlog, v.arrival_per_s, v.mean_attempt_s or 0.0,
                          drain_within_s) for v in known]
            if drain_within_s is not None else [])
    totals = _with_capacity(
        totals, sum(c.attempts for c in caps), sum(c.attempt_s for c in caps),
        slots_total(workers), drain_within_s,
        in_flight_s=sum(v.in_flight or 0.0 for v in known) if known else None,
        work_s=sum(work) if known and drain_within_s is not None else None)
    held = [v for v in views if v.held_back]
    if held:
        # The held types' backlog drains only on a resume or a freed slot: the totals'
        # ETA counts the rest, and the verdict names them instead of a growth claim.
        held_back = sum(v.held_back for v in held)
        free = totals.backlog - held_back
        totals = _with_verdict(dataclasses.replace(
            totals, held_back=held_back,
            held_in=[f"{v.name} ({'paused' if v.paused is not None else 'limited'})"
                     for v in held],
            drain_eta_s=(free / totals.net_drain_per_s
                         if free > 0 and totals.drain_eta_s is not None else None)), now)
    return views, totals
