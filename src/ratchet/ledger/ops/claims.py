"""Claims: expired leases taken over before fresh work, in no paused scope, under the
concurrency limits (DESIGN §3, §8)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ...serde import dumps
from .. import bulkheads
from ..base import (
    Claim,
    ClaimKind,
    ClaimScope,
    EffectRecord,
    Limit,
    StepRecord,
    claim_kinds,
)
from ..dialect import Tx
from ..rows import (
    CLAIM_EFFECTS,
    CLAIM_EFFECTS_TAKEN,
    CLAIM_EXPIRED,
    CLAIM_FIFO,
    CLAIM_FIFO_QUEUES,
    CLAIM_FLOW,
    CLAIM_GATE,
    CLAIM_LIMITED,
    CLAIM_READY,
    CLAIM_READY_QUEUES,
    CLAIM_STEPS,
    CLAIM_STEPS_TAKEN,
    CLAIM_TAKEOVER,
    KEY_REFILL_TAKE,
    LIMITS_ALL,
    LIMITS_LOCK,
    LIMITS_READY,
    LIMITS_RUNNING,
    PAUSES_ACTIVE,
    WAKE_DUE,
    AuditRow,
    effect_record,
    insert_audit,
)
from ..shapes import (
    ClaimRow,
    LeaseRow,
    LimitRow,
    PauseRow,
    QueuePairRow,
    RateLimitTypeRow,
    RefillRow,
    TaskEffectRow,
    TaskStepRow,
    WokenRow,
)
from .core import EngineCore
from .flowclaims import Entry, FlowClaims, entries_of, entry_params
from .limits import limit_record
from .retire import apply_requests, holder_gone
from .waits import wake_audit, wake_due_read

__all__ = ["WAKE_EVERY_S", "ClaimReads", "Claims"]

log = logging.getLogger("ratchet.ledger")

WAKE_EVERY_S = 0.05
"""Seconds between two claims of one engine that wake due parked tasks (``wake_due``)."""


class ClaimReads(NamedTuple):
    """What a claim reads first (:meth:`Claims.reads`), shaped. ``speculative``: the rows
    the speculative walk sent with the reads claimed (``claim_fifo``, checked), or None when
    none was sent; ``audited``: that walk wrote their audit rows itself."""

    expired: list[LeaseRow]
    pauses: list[PauseRow]
    limits: list[LimitRow]
    queues: list[QueuePairRow]
    rates: list[RateLimitTypeRow]
    prioritised: bool
    woken: list[WokenRow]
    refill: list[RefillRow]
    speculative: list[ClaimRow] | None = None
    walks: list[Entry] | None = None
    checked: bool = False
    audited: bool = False

    @classmethod
    def of(cls, rows: Sequence[Sequence[tuple[Any, ...]]],
           walks: list[Entry] | None = None) -> ClaimReads:
        """The rows of :meth:`Claims.reads` (in their order), as ``Tx.rows_many``
        returned them; ``walks``: the speculative walk's entries when it was sent (its
        rows are the last). The walk wrote its own audit rows unless the wake-up went
        with it (:meth:`Claims.reads`)."""
        spec: list[ClaimRow] | None = None
        checked = False
        if walks is not None:
            *rows, last = rows
            spec = CLAIM_FIFO.of(last)
            # One row with a NULL id: its check of the picture failed (it took nothing).
            checked = all(r.id is not None for r in spec)
            spec = [r for r in spec if r.id is not None]
        expired, _gate, pauses, limits, flow, *woken = rows
        shaped = CLAIM_FLOW.of(flow)
        return cls(CLAIM_EXPIRED.of(expired), PAUSES_ACTIVE.of(pauses), LIMITS_ALL.of(limits),
                   [QueuePairRow(str(r.name), str(r.queue)) for r in shaped
                    if r.kind == "queue"],
                   [RateLimitTypeRow(str(r.name), float(r.rate_per_s or 0), int(r.burst or 1),
                                     r.key_param) for r in shaped if r.kind == "rate"],
                   any(r.kind == "priority" for r in shaped),
                   WAKE_DUE.of(woken[0]) if woken else [],
                   KEY_REFILL_TAKE.of(woken[1]) if woken else [], spec, walks, checked,
                   walks is not None and not woken)


class Claims:
    """:meth:`Ledger.claim <ratchet.ledger.base.Ledger.claim>`, also run inside a commit's
    transaction (:meth:`claim_in`, ``commit_and_claim``)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self._next_wake = 0.0  # monotonic seconds: when a claim next runs the wake-up
        self.flow = FlowClaims()
        # Speculative claims (dialect.speculative_claims): per claimed kinds and scope, the
        # walks of the last claim whose picture was plain (no pause, limit, rate limit,
        # priority or expired lease), sent with the next claim's reads.
        self._plain: dict[tuple[tuple[ClaimKind, ...], ClaimScope], list[Entry]] = {}
        self._one_shot_reads: dict[tuple[Any, ...], list[tuple[str, Mapping[str, Any]]]] = {}

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int,
              scope: ClaimScope | None = None) -> list[Claim]:
        """See :meth:`Ledger.claim`. Expired leases are taken over before fresh work.

        An expired lease on a task's final attempt is not taken over: the holder died or
        hung on every attempt, so the task is retired (``FAILED``, or ``UNKNOWN`` when an
        effect intent is open: the call may have happened).
        """
        if limit <= 0 or not names:
            return []
        core = self.core
        if core.dialect.probe_before_claim:
            maybe, clock = core.dialect.probe()
            # Nothing claimable on the clock as it is, but it stepped back: rows written
            # ahead of it are re-anchored by the claim (ledger/clock.py).
            if not maybe and (clock is None or not core.clock_watch.observe(clock)):
                return []
        taken: list[Claim] = []
        walks = self._one_shot_walks(names, scope)
        if walks is not None:
            taken, done = self._claim_one_shot(holder, names, limit, scope, walks)
            if done or len(taken) >= limit:
                return taken
            limit -= len(taken)

        def body(tx: Tx, repaired: list[bool]) -> list[Claim]:
            reads, walks = self.reads(names, limit, scope, holder)
            pre = ClaimReads.of(tx.rows_many(reads), walks)
            return self.claim_in(tx, holder, names, limit, pre, repaired=repaired,
                                 scope=scope)

        if not taken:
            return core.run_repairing(body)
        try:
            return taken + core.run_repairing(body)
        except Exception as exc:
            # What the one round trip claimed is committed and held by nobody else: it is
            # returned (else it would sit RUNNING, unseen, until its leases expired); the
            # rest is claimed by a later claim.
            log.warning("claim: %d task(s) claimed; claiming the rest failed: %s",
                        len(taken), exc)
            return taken

    def _one_shot_walks(self, names: Sequence[ClaimKind], scope: ClaimScope | None,
                        ) -> list[Entry] | None:
        """The walks of a claim of ``names`` in one round trip (:meth:`_claim_one_shot`),
        or None when it cannot go so: the dialect speculates, the last claim of the same
        kinds was plain (its walks), the wake-up of parked tasks is not due (its writes
        need the claim's transaction) and no repair of the ledger clock is pending."""
        if (not self.core.dialect.speculative_claims or time.monotonic() >= self._next_wake
                or self.core.clock_watch.pending):
            return None
        return self._plain.get((tuple(names), scope or ClaimScope())) or None

    def _claim_one_shot(self, holder: str, names: Sequence[ClaimKind], limit: int,
                        scope: ClaimScope | None, walks: list[Entry],
                        ) -> tuple[list[Claim], bool]:
        """A claim as one transaction in one round trip: ``BEGIN``, the claim's reads, the
        speculative walk of ``walks`` (checked, writing its own audit rows), the steps and
        effects of what it took that ran before, and ``COMMIT`` in one string
        (:meth:`Tx.rows_last <ratchet.ledger.dialect.Tx.rows_last>`). Returns the claims it
        made and whether they are the whole claim: the walk's check passed, and the reads
        show what its plain picture assumed (no expired lease, pause, limit, priority or
        rate limit, and the (name, queue) pairs it walked are all there are), and the clock
        did not step back. Otherwise the caller claims the rest in a transaction of its
        own, decided from fresh reads (this picture is forgotten, so that one does not
        speculate)."""
        key = (tuple(names), scope or ClaimScope())
        sent = (key, tuple(walks), limit, holder)
        reads = self._one_shot_reads.get(sent)
        if reads is None:  # the same claim comes again and again: built once
            reads = [*self._picture(names, limit, scope),
                     self._walk(names, walks, limit, scope, holder, audited=True),
                     CLAIM_STEPS_TAKEN.sent({"holder": holder}),
                     CLAIM_EFFECTS_TAKEN.sent({"holder": holder})]
            if len(self._one_shot_reads) >= 64:
                self._one_shot_reads.clear()
            self._one_shot_reads[sent] = reads

        def body(tx: Tx) -> tuple[float, list[list[tuple[Any, ...]]]]:
            rows = tx.rows_last(reads)
            return tx.now, rows  # read with the statements: BEGIN went first in their string

        now, (*picture, steps, effects) = self.core.dialect.run(body)
        pre = ClaimReads.of(picture, walks)
        claims = self._claims(now, pre.speculative or [], {}, CLAIM_STEPS_TAKEN.of(steps),
                              CLAIM_EFFECTS_TAKEN.of(effects))
        plain, shaped = self._entries(names, pre, scope or ClaimScope())
        done = (pre.checked and not pre.expired and not pre.pauses and not pre.limits
                and not pre.prioritised and not shaped and plain == walks
                and not self.core.clock_watch.observe(now))
        if not done:
            self._plain.pop(key, None)
        return claims, done

    def reads(self, names: Sequence[ClaimKind], limit: int, scope: ClaimScope | None = None,
              holder: str | None = None,
              ) -> tuple[list[tuple[str, Mapping[str, Any]]], list[Entry] | None]:
        """The reads a claim starts with, to send with others (one round trip): the
        expired-lease scan of the claimed kinds (DESIGN §8 versions), the pause gate
        (PostgreSQL: a shared advisory lock, taken before any bulkheads limit lock), the
        active pauses (DESIGN §8 control), the concurrency limits (bulkheads, DESIGN §8)
        and the wake-up of parked tasks whose ``run_at`` has passed (DESIGN §3, waits;
        :func:`~ratchet.ledger.ops.waits.wake_due_read`), so that this claim can take
        them. The wake-up goes with at most one claim per :data:`WAKE_EVERY_S` of this
        engine (a deadline's lateness is at most that, or an idle worker's poll interval
        if longer): a claim that runs it pays one index probe more, the others nothing
        (wake-ups by an event or a last child are immediate and not rate-limited). Flow
        control (DESIGN §8) adds the (name, queue) pairs and the types' rate limits, two
        small tables.

        With ``holder`` on a dialect that speculates (``speculative_claims``), the walk of
        the last plain claim of the same kinds goes last, in the same round trip
        (``claim_fifo`` with ``checked``: it takes nothing unless the picture is still
        plain); the second value is its entries when it was added, else None
        (:meth:`ClaimReads.of` splits its rows off)."""
        reads = self._picture(names, limit, scope)
        clock = time.monotonic()
        waking = clock >= self._next_wake
        if waking:
            self._next_wake = clock + WAKE_EVERY_S
            reads.append(wake_due_read())
            # Concurrency keys whose admission found the key's lock taken (PostgreSQL):
            # filled again here, with the wake-up's cadence.
            reads.append(KEY_REFILL_TAKE.sent())
        walks = (self._plain.get((tuple(names), scope or ClaimScope()))
                 if holder is not None and self.core.dialect.speculative_claims else None)
        if not walks or holder is None:
            return reads, None
        # The walk writes its claims' audit rows in SQL, unless the wake-up goes first in
        # this transaction: a task it wakes could be claimed by the walk, and its wake-up
        # (audited by claim_in) must come first in its trail (ClaimReads.of agrees).
        reads.append(self._walk(names, walks, limit, scope, holder, audited=not waking))
        return reads, walks

    @staticmethod
    def _picture(names: Sequence[ClaimKind], limit: int, scope: ClaimScope | None,
                 ) -> list[tuple[str, Mapping[str, Any]]]:
        """The reads every claim starts with (see :meth:`reads`): the expired leases, the
        pause gate, the pauses, the limits and the flow-control tables."""
        served = None if scope is None or scope.queues is None else list(scope.queues)
        kinds = claim_kinds(names)
        return [CLAIM_EXPIRED.sent({**kinds, "limit": limit, "served": served}),
                CLAIM_GATE.sent(), PAUSES_ACTIVE.sent(), LIMITS_ALL.sent(),
                CLAIM_FLOW.sent({"names": kinds["names"]})]

    @staticmethod
    def _walk(names: Sequence[ClaimKind], walks: list[Entry], limit: int,
              scope: ClaimScope | None, holder: str, audited: bool,
              ) -> tuple[str, Mapping[str, Any]]:
        """The speculative walk of ``walks`` (``claim_fifo``, checked); ``audited``: it
        writes its claims' audit rows itself (a claim in one round trip)."""
        params = entry_params(walks, scope or ClaimScope(), 0.0, limit)
        del params["now"]  # the transaction's clock, read in the same round trip
        # Its expired-lease check covers every claimed kind, as claim_expired does (not
        # only the kinds that had a pair to walk last time).
        params.update(claim_kinds(names))
        return CLAIM_FIFO.sent({**params, "holder": holder, "checked": True,
                                "audited": audited})

    @staticmethod
    def _entries(names: Sequence[ClaimKind], pre: ClaimReads, scope: ClaimScope,
                 ) -> tuple[list[Entry], set[str]]:
        """The walks of a claim of ``names`` as ``pre`` read them: the plain entries (one
        statement claims them) and the names that are shaped (fair or rate-limited: claimed
        by :class:`~ratchet.ledger.ops.flowclaims.FlowClaims`)."""
        entries = entries_of(claim_kinds(names), pre.queues, scope.queues)
        rated = {r.name for r in pre.rates}
        shaped = {e.name for e in entries if e.name in scope.fair or e.name in rated}
        return [e for e in entries if e.name not in shaped], shaped

    def claim_in(
        self, tx: Tx, holder: str, names: Sequence[ClaimKind], limit: int,
        pre: ClaimReads | None = None, repaired: list[bool] | None = None,
        scope: ClaimScope | None = None,
    ) -> list[Claim]:
        """The claim, inside the caller's write transaction (see :meth:`claim`).
        ``pre``: the rows of :meth:`reads`, if the caller already read them.
        ``repaired``: receives ``True`` when this transaction re-anchored the ledger's rows
        after a backward step of its clock (:mod:`ratchet.ledger.clock`; the caller marks
        the repair done once the transaction committed).

        No attempt starts in a paused scope (DESIGN §8): the active pauses are read under
        the pause gate, a paused type's tasks are neither claimed (under a limit or not)
        nor taken over, and a pause of everything claims nothing. The pause gate is held
        before the limits' advisory locks (:func:`_claim_limited`), so a pause never
        waits on a claim that waits on a limit lock.

        ``scope``: the queues served and the fair types (flow control, DESIGN §8): ready
        work is walked per (name, queue) pair served; the types that are fair or
        rate-limited are claimed by :class:`~ratchet.ledger.ops.flowclaims.FlowClaims`,
        the others by one statement as before."""
        if limit <= 0 or not names:
            return []
        key = (tuple(names), scope or ClaimScope())
        scope = scope or ClaimScope()
        if pre is None:
            pre = ClaimReads.of(tx.rows_many(self.reads(names, limit, scope)[0]))
        (expired, pauses, limit_rows, queue_rows, rate_rows, prioritised, woken, refill,
         speculative, _walks, _checked, _audited) = pre
        now = tx.now  # after the first read: BEGIN, clock and scan in one round trip
        repairs = len(repaired) if repaired is not None else 0
        self.core.repair_clock(tx, now, repaired)
        repaired_now = repaired is not None and len(repaired) > repairs
        if woken:
            insert_audit(tx, wake_audit(woken, now))
        if refill:
            tx.batch("key_fill", [{"name": n, "key": k, "max": m} for n, k, m
                                  in sorted({(r.name, r.key, r.max) for r in refill})])
        # The speculative walk's rows are claimed already (RUNNING, this holder's): they are
        # returned whatever follows. Its check passed after the pause gate, so no pause
        # covered them then (one the reads saw may have been resumed since).
        taken: list[ClaimRow] = list(speculative or [])
        audited = len(taken) if pre.audited else 0  # taken's audit rows written in SQL
        paused_types: set[str] = set()
        if pauses:
            if any(p.scope == "all" for p in pauses):
                return self._claimed(tx, holder, now, taken, {}, [], audited)
            paused_types = {p.target for p in pauses if p.scope == "type"}
            names = [n for n in names
                     if (n if isinstance(n, str) else n[0]) not in paused_types]
            expired = [row for row in expired if row.name not in paused_types]
            if not names:
                return self._claimed(tx, holder, now, taken, {}, [], audited)
        kinds = claim_kinds(names)
        audit: list[AuditRow] = []
        if any(row.control_request is not None for row in expired):
            # An operator's request on a lease whose holder is gone: applied now unless an
            # effect intent is open (then the takeover's holder settles it by lookup first).
            applied = apply_requests(tx, expired, audit, "lease expired")
            expired = [row for row in expired if row.id not in applied]
        if expired:
            expired = holder_gone(tx, expired, audit, "lease expired on final attempt",
                                  "lease expired")
        # What follows claims only the room the speculative walk left.
        room = limit - len(taken)
        seen_expired = bool(expired)
        expired = expired[:max(0, room)]
        previous: dict[str, LeaseRow] = {row.id: row for row in expired}
        rows: list[ClaimRow] = []
        if expired:
            rows.extend(CLAIM_TAKEOVER.all(tx, {"holder": holder, "now": now,
                                                "ids": list(previous)}))
        entries = entries_of(kinds, queue_rows, scope.queues)
        rated = {r.name: r for r in rate_rows}
        plain, shaped = self._entries(names, pre, scope)
        # Plain: the speculative walk of the next claim may take the place of this one.
        simple = (not pauses and not limit_rows and not prioritised and not seen_expired
                  and not shaped and bool(plain))
        if simple:
            self._plain[key] = plain
        else:
            self._plain.pop(key, None)
        # The speculative walk covered the fresh claim when its own check of the picture
        # passed and it walked the pairs there are (not after a clock repair: rows it
        # re-anchored may be ready now). Decided on the walk's own verdict, never on the
        # reads alone: a check that disagreed with them would otherwise stop every claim.
        covered = (pre.checked and not expired and not repaired_now and pre.walks == plain)
        if room > len(expired) and not covered:
            limits = [limit_record(r) for r in limit_rows]
            if plain:
                rows.extend(self._claim_plain(tx, holder, now, plain, room - len(expired),
                                              limits, paused_types, scope, prioritised))
            want = room - len(expired) - len(rows)
            if shaped and want > 0:
                flow = [e for e in entries if e.name in shaped]
                allowance = None
                scopes = (bulkheads.lock_scopes(limits, sorted(shaped)) if limits else None)
                if scopes is not None:
                    allowance = _allowance(tx, now, sorted(shaped), want, limits, scopes,
                                           paused_types)
                rows.extend(self.flow.claim(tx, holder, now, flow, want, scope, rated,
                                            allowance))
        return self._claimed(tx, holder, now, taken + rows, previous, audit, audited)

    @staticmethod
    def _claimed(tx: Tx, holder: str, now: float, rows: list[ClaimRow],
                 previous: Mapping[str, LeaseRow], audit: list[AuditRow],
                 audited: int = 0) -> list[Claim]:
        """The claimed ``rows`` audited (``claim``, or ``takeover`` for the ids of
        ``previous``, the expired leases taken over) with ``audit``'s rows, and returned as
        :class:`Claim` objects with the steps and effects of the resumed ones. The first
        ``audited`` rows have their audit rows already (the speculative walk wrote them)."""
        for row in rows[audited:]:
            prev = previous.get(row.id)
            detail: dict[str, Any] = {"attempt": row.attempt, "lease_s": row.lease_s}
            if prev is not None:
                detail.update(previous_holder=prev.holder, previous_generation=prev.generation)
            audit.append((row.id, now, "takeover" if prev is not None else "claim",
                          row.from_state, "RUNNING", row.generation, holder, dumps(detail)))
        insert_audit(tx, audit)
        # Steps and effects can only exist after an earlier claim: generation > 1.
        # (Not attempt: a release hands its attempt back, the generation never goes back.)
        resumed = [row.id for row in rows if row.generation > 1]
        if not resumed:
            return Claims._claims(now, rows, previous, [], [])
        return Claims._claims(now, rows, previous, CLAIM_STEPS.all(tx, {"ids": resumed}),
                              CLAIM_EFFECTS.all(tx, {"ids": resumed}))

    @staticmethod
    def _claims(now: float, rows: list[ClaimRow], previous: Mapping[str, LeaseRow],
                step_rows: Sequence[TaskStepRow], effect_rows: Sequence[TaskEffectRow],
                ) -> list[Claim]:
        """``rows`` as :class:`Claim` objects, with the steps and effects of the resumed
        ones among ``step_rows`` / ``effect_rows`` (rows of other tasks are passed over)."""
        ids = {row.id for row in rows if row.generation > 1}
        steps: dict[str, dict[str, StepRecord]] = {}
        effects: dict[str, dict[str, EffectRecord]] = {}
        for s in step_rows:
            if s.task_id in ids:
                steps.setdefault(s.task_id, {})[s.name] = StepRecord(
                    s.name, s.result, s.generation, s.committed_at, s.seq)
        for e in effect_rows:
            if e.task_id in ids:
                effects.setdefault(e.task_id, {})[e.name] = effect_record(e)
        return [
            Claim(
                task_id=row.id, name=row.name, version=row.version, params_json=row.params,
                generation=row.generation, attempt=row.attempt, max_attempts=row.max_attempts,
                lease_s=row.lease_s, lease_until=row.lease_until, ledger_now=now,
                takeover=row.id in previous,
                previous_holder=previous[row.id].holder if row.id in previous else None,
                steps=steps.get(row.id, {}), effects=effects.get(row.id, {}),
                control_request=row.control_request, trace_context=row.trace_context,
            )
            for row in rows
        ]

    def _claim_plain(
        self, tx: Tx, holder: str, now: float, entries: list[Entry], want: int,
        limits: list[Limit], paused: set[str], scope: ClaimScope, prioritised: bool,
    ) -> list[ClaimRow]:
        """Fresh claims of types without fairness or a rate limit: one statement
        (``claim_ready``; ``claim_ready_queues`` where the dialect walks served queues
        rather than pairs; ``claim_fifo`` / ``claim_fifo_queues`` while no claimable task
        has a priority: one walk, as before priorities; ``claim_limited`` under
        bulkheads)."""
        params = entry_params(entries, scope, now, want)
        names = list(dict.fromkeys(e.name for e in entries))
        scopes = bulkheads.lock_scopes(limits, names) if limits else None
        if scopes is None:
            by_queue = scope.queues is not None and not self.core.dialect.walks_queue_pairs
            if prioritised:
                ready = CLAIM_READY_QUEUES if by_queue else CLAIM_READY
            else:
                ready = CLAIM_FIFO_QUEUES if by_queue else CLAIM_FIFO
            return [r for r in ready.all(tx, {**params, "holder": holder, "checked": False,
                                              "audited": False})
                    if r.id is not None]
        plan = _allowance(tx, now, names, want, limits, scopes, paused)
        return _claim_limited(tx, holder, params, entries, plan)


def _allowance(
    tx: Tx, now: float, names: list[str], want: int, limits: list[Limit], scopes: list[str],
    paused: set[str],
) -> bulkheads.Allowance:
    """What a claim of ``names`` may take under bulkheads (DESIGN §8): the limits'
    advisory locks first (PostgreSQL; SQLite's write lock serialises already), then the
    RUNNING counts and which reserved scopes have ready work (statements after the lock
    see every claim its previous holder committed), then
    :func:`ratchet.ledger.bulkheads.allowance`. One round trip.

    ``paused``: the paused task types (control, DESIGN §8). Their ``PENDING`` tasks
    are not ready work: a paused type's reservation is lent out, like an idle one's,
    and a tenant's ready work counts only tasks of types not paused."""
    ready_types, ready_tenants = bulkheads.reserved_groups(limits)
    ready_types = [n for n in ready_types if n not in paused]
    reads = [LIMITS_LOCK.sent({"scopes": scopes}), LIMITS_RUNNING.sent()]
    if ready_types or ready_tenants:
        reads.append(LIMITS_READY.sent({"names": ready_types, "tenants": ready_tenants,
                                        "paused": sorted(paused), "now": now}))
    _, running_rows, *ready = tx.rows_many(reads)
    ready_rows = LIMITS_READY.of(ready[0]) if ready else []
    return bulkheads.allowance(
        limits, names, want,
        {(r.name, r.tenant): int(r.n) for r in LIMITS_RUNNING.of(running_rows)},
        {r.name for r in ready_rows if r.scope == "type"},
        {r.name for r in ready_rows if r.scope == "tenant"})


def _claim_limited(
    tx: Tx, holder: str, params: dict[str, Any], entries: list[Entry],
    plan: bulkheads.Allowance,
) -> list[ClaimRow]:
    """Fresh claims under bulkheads (DESIGN §8) by ``claim_limited``, with the numbers of
    ``plan`` (:func:`_allowance`). One round trip more than an unlimited claim, and only
    when a limit applies.

    The allowance is per *name* (counts, caps and reservations cover every version and
    queue of a type); each entry carries its name's numbers and the SQL ranks a name's
    tasks across all its entries, so a claim of two versions of a capped type takes at
    most the cap's free slots in all."""
    if plan.limit <= 0:
        return []
    per_name = {n: (cap, own) for n, cap, own
                in zip(plan.names, plan.name_limits, plan.name_reserved, strict=True)}
    return CLAIM_LIMITED.all(tx, {
        **params, "limit": plan.limit, "holder": holder,
        "name_limits": [per_name[n][0] for n in params["names"]],
        "name_reserved": [per_name[n][1] for n in params["names"]],
        "ename_limits": [per_name[e.name][0] for e in entries],
        "ename_reserved": [per_name[e.name][1] for e in entries],
        "pool": plan.pool, "tenants": plan.tenants, "tenant_limits": plan.tenant_limits,
        "tenant_reserved": plan.tenant_reserved, "tenant_pool": plan.tenant_pool})
