"""Judging a demo run: each kind of payment target's guarantee counted at its service's own
file (:func:`~ratchet.testing.check_exactly_once`), the order workflows counted at the
warehouse and their payment service (:mod:`~ratchet.demo.order_judging`), the ledger's
consistency (:func:`~ratchet.testing.check_ledger_consistent`), the chaos delivered, how
fast the killed workers' tasks came back; all in a :class:`Verdict`."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import State, StatusReport
from ..control import AuditEvent, LateEffectView, TaskInfo
from ..storedtext import StoredState
from ..testing import ExactlyOnceReport, ServiceRecords, check_exactly_once, check_ledger_consistent
from .books import BooksResult, judge_books
from .chaos import Chaos, Freeze
from .order_judging import OrderResult, judge_orders
from .payments import KINDS, PaymentClient
from .settings import GUARANTEES
from .state import RunState, holder_pid

__all__ = ["KindResult", "Reclaims", "Verdict", "fmt_states", "judge", "judge_kind", "reclaims"]


@dataclass(frozen=True, slots=True)
class Reclaims:
    """How fast the SIGKILLed workers' tasks came back (from the audit timelines).

    Times are seconds from the kill (ledger clock read right after the process died).

    Attributes:
        freed: per kill, until the first of its tasks was claimable again: its ``revoke``
            row, or (lease expiry) its ``takeover`` row.
        first_claim: per kill, until the first of its tasks was claimed again.
        claimed: per task of a killed worker, until it was claimed again (a revoked task
            goes back to the ready queue, so this includes waiting behind the backlog).
        revoked: tasks of killed workers whose leases were revoked (fast takeover).
        expired: tasks of killed workers taken over only after their lease expired.
    """

    freed: list[float]
    first_claim: list[float]
    claimed: list[float]
    revoked: int
    expired: int


@dataclass
class KindResult:
    """The verdict on one kind of payment target, from its service's own file and the ledger.

    Attributes:
        kind: the kind (:data:`~ratchet.demo.payments.KINDS`).
        task_ids: this run's tasks of that kind.
        states: their states.
        once: :func:`~ratchet.testing.check_exactly_once` against the kind's service.
        records: the service's own records.
        late: late effects the ledger recorded for these tasks, per key.
        detected: duplicated keys whose extra executions all have a late-effect record.
        undetected: duplicated keys with more executions than late effects explain.
        exactly: succeeded tasks whose key executed exactly once, or once plus one
            execution per recorded late effect where the kind allows that (lookup only).
        problems: what breaks the kind's guarantee (empty: it held).
    """

    kind: str
    task_ids: list[str]
    states: Counter[State | StoredState]
    once: ExactlyOnceReport
    records: ServiceRecords
    late: dict[str, list[LateEffectView]]
    detected: dict[str, int] = field(default_factory=dict)
    undetected: dict[str, int] = field(default_factory=dict)
    exactly: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def executions(self) -> int:
        return sum(self.records.executions.values())

    def rejected(self, key: str | None = None) -> int:
        """Requests the service refused for a stale fencing token (for ``key``, or all)."""
        return sum(1 for r in self.records.rejections if key is None or r.key == key)


# ---------------------------------------------------------------------------- the run


@dataclass
class Verdict:
    """What :func:`judge` found, for the report.

    Attributes:
        infos: this run's tasks by id; states: their states.
        status: the ledger's status report.
        late_all: late effects the ledger recorded for this run's tasks.
        service_stats: each service's counters (``{}`` when it did not answer).
        calls: charge calls the ledger recorded.
        retry_classes: retries per error class; released: releases to PENDING per reason.
        attempts: the attempt number of each task.
        results: the verdict per kind of target.
        orders: the verdict on the order workflows.
        reclaims: how fast the killed workers' tasks came back.
        invariants: ``(name, held, detail)`` of every check; broken: the names that failed.
        books: the sharded job (None without one).
    """

    infos: dict[str, TaskInfo]
    states: Counter[State | StoredState]
    status: StatusReport
    late_all: list[LateEffectView]
    service_stats: dict[str, dict[str, Any]]
    calls: int
    retry_classes: Counter[str]
    released: Counter[str]
    attempts: list[int]
    results: dict[str, KindResult]
    orders: OrderResult
    reclaims: Reclaims
    invariants: list[tuple[str, bool, str]]
    broken: list[str]
    books: BooksResult | None = None


def judge(st: RunState, chaos: Chaos) -> Verdict:
    """The verdict on the run: every invariant of the module doc checked against the ledger
    and each payment service's own file, with the counts the report shows."""
    infos = {i.task_id: i for i in st.control.get_many(st.task_ids)}
    status = st.control.status()
    late_all = st.late_effects()
    service_stats: dict[str, dict[str, Any]] = {}
    for kind, service in st.all_services().items():
        service_stats[kind] = {}
        with contextlib.suppress(Exception), PaymentClient(service.url, 5.0) as client:
            service_stats[kind] = client.stats()

    states: Counter[State | StoredState] = Counter(i.state for i in infos.values())
    key_of = {tid: f"charge:{i.params['order_id']}" for tid, i in infos.items()}

    # Per-task records from the ledger: effects, retries, releases.
    calls = 0
    retry_classes: Counter[str] = Counter()
    released: Counter[str] = Counter()
    attempts: list[int] = []
    timelines = {tid: st.control.history(tid) for tid in infos}
    events_of: dict[str, list[AuditEvent]] = {}
    for tid, info in infos.items():
        tl = timelines[tid]
        events_of[tid] = tl.events
        attempts.append(info.attempt)
        for ev in tl.events:
            if ev.kind == "transition" and ev.to_state == State.RETRY_WAIT.value:
                retry_classes[str(ev.detail.get("error_class", "?"))] += 1
            if ev.kind == "transition" and ev.to_state == State.PENDING.value:
                released[str(ev.detail.get("reason", "?"))] += 1
        for eff in tl.effects:
            calls += eff.calls

    # The verdict: per kind, ratchet.testing's checks against that service's own file.
    results = {k: judge_kind(st, chaos.freezes, k, infos, key_of, timelines, late_all)
               for k in KINDS}
    orders = judge_orders(st, infos, timelines)
    consistent = check_ledger_consistent(
        st.ledger_url, task_ids=list(infos), raise_on_violation=False,
        timelines=timelines,
    )  # fmt: skip
    found_reclaims = reclaims(chaos.kill_times, events_of)
    unfinished = {
        tid: i.state.value
        for tid, i in infos.items()
        if not i.terminal and not (i.state is State.UNKNOWN and st.kind_of[tid] == "neither")
    }
    stray = {k: n for r in results.values() for k, n in r.once.unexpected.items()}
    resub_ok = all(want == got and not created for want, got, created in st.resubmit_checks)
    why_unfinished = (
        f"stalled {st.settings.stall_s:.0f} s" if st.stalled
        else "hard deadline" if st.deadline_hit else ""
    )  # fmt: skip

    invariants: list[tuple[str, bool, str]] = [
        (
            "every task settled (UNKNOWN only where the target offers nothing)",
            not unfinished and not st.stalled and not st.deadline_hit
            and len(infos) == st.n_tasks,
            f"{len(unfinished)} unsettled "
            f"({fmt_states(Counter(State(v) for v in unfinished.values()))})"
            + (f", {why_unfinished}" if why_unfinished else "")
            if unfinished or why_unfinished
            else f"{len(infos)} of {st.n_tasks}",
        ),
    ]  # fmt: skip
    for kind, r in results.items():
        invariants.append((
            f"{kind}: {GUARANTEES[kind]}",
            not r.problems,
            "; ".join(r.problems) if r.problems
            else f"{r.exactly} of {r.states[State.SUCCEEDED]} succeeded exactly once"
            + (f", {len(r.detected)} duplicate(s) recorded as late effects"
               if r.detected else "")
            + (f", {r.states[State.UNKNOWN]} UNKNOWN" if r.states[State.UNKNOWN] else ""),
        ))  # fmt: skip
    if chaos.freezes:
        missing = [f.kind for f in chaos.freezes.values()
                   if f.state != "done" or f.settled_as is None]  # fmt: skip
        invariants.append((
            "a sender frozen mid-call per kind, resumed after its task was settled",
            not missing,
            f"not achieved for: {', '.join(missing)}" if missing
            else f"{len(chaos.freezes)} of {len(chaos.freezes)}",
        ))  # fmt: skip
    invariants += orders.invariants
    books = None
    if st.books_job is not None:
        s = st.settings
        books = judge_books(st.control, st.books_job, st.books_day, s.books_orders,
                            s.books_shards)
        invariants.append((
            "sharded job: every order counted once (Control.check, expected totals)",
            not books.problems,
            "; ".join(books.problems) if books.problems
            else f"{books.totals['items']} orders over {books.shards} shards: "
            f"{books.totals['succeeded']} ok, {books.totals['failed']} mismatched, "
            f"{books.totals['skipped']} refunded",
        ))  # fmt: skip
    invariants += [
        ("no charges for keys outside this run", not stray, f"{len(stray)} stray keys"),
        (
            "ledger consistent (every fencing generation audited)",
            consistent.ok,
            f"{consistent.tasks} tasks" if consistent.ok
            else "; ".join(consistent.violations[:2]),
        ),
        (
            "resubmitted keys returned the same task id",
            resub_ok,
            f"{sum(1 for w, g, c in st.resubmit_checks if w == g and not c)} of "
            f"{len(st.resubmit_checks)}",
        ),
        (
            f"at least {chaos.kills_asked} SIGKILLs",
            chaos.kills_done >= chaos.kills_asked,
            f"{chaos.kills_done} done",
        ),
    ]  # fmt: skip
    broken = [name for name, ok, _ in invariants if not ok]
    return Verdict(
        infos=infos, states=states, status=status, late_all=late_all,
        service_stats=service_stats, calls=calls, retry_classes=retry_classes,
        released=released, attempts=attempts, results=results, orders=orders,
        reclaims=found_reclaims,
        invariants=invariants, broken=broken, books=books,
    )  # fmt: skip


def judge_kind(
    st: RunState,
    freezes: dict[str, Freeze],
    kind: str,
    infos: dict[str, TaskInfo],
    key_of: dict[str, str],
    timelines: dict[str, Any],
    late_all: list[LateEffectView],
) -> KindResult:
    """Check ``kind``'s guarantee against its service's own file (see the module doc)."""
    ids = [tid for tid in infos if st.kind_of[tid] == kind]
    records = st.services[kind].records()
    once = check_exactly_once(
        st.ledger_url, records, task_ids=ids, keys={t: key_of[t] for t in ids},
        effect="charge", result_id_field="charge_id", require_terminal=False,
        raise_on_violation=False, timelines=timelines,
    )  # fmt: skip
    mine = set(ids)
    late: dict[str, list[LateEffectView]] = {}
    for le in late_all:
        if le.task_id in mine:
            late.setdefault(le.key, []).append(le)
    states: Counter[State | StoredState] = Counter(infos[t].state for t in ids)
    r = KindResult(kind, ids, states, once, records, late)
    executions = records.executions
    for key, n in once.duplicated.items():
        explained = sum(1 for le in late.get(key, []) if le.outcome == "done") >= n - 1
        (r.detected if explained else r.undetected)[key] = n
    for tid in ids:
        info = infos[tid]
        n = executions.get(key_of[tid], 0)
        if info.state is State.SUCCEEDED and (
            n == 1 or (kind == "lookup" and key_of[tid] in r.detected)
        ):
            r.exactly += 1
    succeeded = states[State.SUCCEEDED]
    p = r.problems
    if kind == "lookup":
        if r.undetected:
            p.append(f"{len(r.undetected)} duplicated keys not recorded as late effects: "
                     + ", ".join(list(r.undetected)[:3]))  # fmt: skip
    elif once.duplicated:
        p.append(f"{len(once.duplicated)} keys executed more than once: "
                 + ", ".join(list(once.duplicated)[:3]))  # fmt: skip
    if r.exactly != succeeded or once.missing:
        p.append(f"{succeeded - r.exactly} succeeded tasks without exactly one charge"
                 + (f" (never charged: {', '.join(list(once.missing.values())[:3])})"
                    if once.missing else ""))  # fmt: skip
    mismatched = [
        t for t in once.mismatched if not (kind == "lookup" and key_of[t] in r.detected)
    ]
    if mismatched:
        p.append(f"{len(mismatched)} succeeded tasks whose recorded charge id is not the "
                 "service's")  # fmt: skip
    if kind != "neither" and states[State.UNKNOWN]:
        p.append(f"{states[State.UNKNOWN]} tasks UNKNOWN, though the target can settle "
                 "every outcome")  # fmt: skip
    fz = freezes.get(kind)
    if fz is not None and fz.state == "done" and fz.settled_as is not None:
        assert fz.key is not None
        n = executions.get(fz.key, 0)
        late_here = late.get(fz.key, [])
        if kind == "fenced" and r.rejected(fz.key) <= fz.before[1]:
            p.append("the frozen sender's late charge was not refused by the service")
        if kind == "lookup" and not (n == 2 and fz.key in r.detected):
            p.append(f"the frozen sender's late charge: {n} executions of {fz.key}, "
                     f"{len(late_here)} late effects (expected 2, recorded)")  # fmt: skip
        if kind == "neither" and not (
            n == 1 and late_here and fz.settled_as == State.UNKNOWN.value
        ):
            p.append(f"the frozen sender's late charge: {n} executions of {fz.key}, "
                     f"{len(late_here)} late effects, task {fz.settled_as} (expected 1, "
                     "recorded, UNKNOWN)")  # fmt: skip
    return r


def reclaims(kill_times: list[tuple[int, float]],
             events_of: dict[str, list[AuditEvent]]) -> Reclaims:
    """For each SIGKILL, the tasks the dead worker held and when each came back.

    A task counts for a kill when, by its audit rows, it was RUNNING under the killed
    pid at the ledger time read right after the process died. It was freed at its next
    ``revoke`` row (fast takeover) or else at its next ``takeover`` row (lease expiry),
    and claimed again at its next ``claim``/``takeover`` row.
    """
    freed: list[float] = []
    first_claim: list[float] = []
    claimed: list[float] = []
    revoked = expired = 0
    for pid, killed_at in kill_times:
        kill_freed: list[float] = []
        kill_claimed: list[float] = []
        for events in events_of.values():
            holder: str | None = None
            after: list[AuditEvent] = []
            for ev in events:
                if ev.at > killed_at:
                    after.append(ev)
                elif ev.kind in ("claim", "takeover"):
                    holder = ev.holder
                elif ev.kind == "revoke" or (
                    ev.to_state is not None and ev.to_state != State.RUNNING.value
                ):
                    holder = None
            if holder_pid(holder) != pid:
                continue
            revoked_after: float | None = None
            for ev in after:
                delay = max(0.0, ev.at - killed_at)
                if ev.kind == "revoke" and revoked_after is None:
                    revoked_after = delay
                elif ev.kind in ("claim", "takeover"):
                    kill_claimed.append(delay)
                    kill_freed.append(revoked_after if revoked_after is not None else delay)
                    revoked += int(revoked_after is not None)
                    expired += int(revoked_after is None)
                    break
        claimed.extend(kill_claimed)
        if kill_claimed:
            freed.append(min(kill_freed))
            first_claim.append(min(kill_claimed))
    return Reclaims(freed, first_claim, claimed, revoked, expired)


def fmt_states(states: Counter[State | StoredState]) -> str:
    """``"PENDING 3, RUNNING 2"``: counts per state (``-`` for none)."""
    return ", ".join(f"{s.value} {n}" for s, n in sorted(states.items())) or "-"
