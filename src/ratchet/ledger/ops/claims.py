"""Claims: expired leases taken over before fresh work, in no paused scope, under the
concurrency limits (DESIGN §3, §8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ...serde import dumps
from .. import bulkheads
from ..base import MAX_VERSION, Claim, ClaimKind, EffectRecord, Limit, StepRecord, claim_kinds
from ..dialect import Tx
from ..rows import (
    CLAIM_EFFECTS,
    CLAIM_EXPIRED,
    CLAIM_GATE,
    CLAIM_LIMITED,
    CLAIM_READY,
    CLAIM_STEPS,
    CLAIM_TAKEOVER,
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
from ..shapes import ClaimRow, LeaseRow, LimitRow, PauseRow, WokenRow
from .core import EngineCore
from .limits import limit_record
from .retire import apply_requests, holder_gone
from .waits import wake_audit, wake_due_read

__all__ = ["ClaimReads", "Claims"]


class ClaimReads(NamedTuple):
    """What a claim reads first (:meth:`Claims.reads`), shaped."""

    expired: list[LeaseRow]
    pauses: list[PauseRow]
    limits: list[LimitRow]
    woken: list[WokenRow]

    @classmethod
    def of(cls, rows: Sequence[Sequence[tuple[Any, ...]]]) -> ClaimReads:
        """The rows of :meth:`Claims.reads` (in their order), as ``Tx.rows_many``
        returned them."""
        expired, _gate, pauses, limits, woken = rows
        return cls(CLAIM_EXPIRED.of(expired), PAUSES_ACTIVE.of(pauses), LIMITS_ALL.of(limits),
                   WAKE_DUE.of(woken))


class Claims:
    """:meth:`Ledger.claim <ratchet.ledger.base.Ledger.claim>`, also run inside a commit's
    transaction (:meth:`claim_in`, ``commit_and_claim``)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int) -> list[Claim]:
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
        return core.run_repairing(
            lambda tx, repaired: self.claim_in(tx, holder, names, limit, repaired=repaired))

    @staticmethod
    def reads(names: Sequence[ClaimKind], limit: int) -> list[tuple[str, Mapping[str, Any]]]:
        """The reads a claim starts with, to send with others (one round trip): the
        expired-lease scan of the claimed kinds (DESIGN §8 versions), the pause gate
        (PostgreSQL: a shared advisory lock, taken before any bulkheads limit lock), the
        active pauses (DESIGN §8 control), the concurrency limits (bulkheads, DESIGN §8)
        and the wake-up of parked tasks whose ``run_at`` has passed (DESIGN §3, waits;
        :func:`~ratchet.ledger.ops.waits.wake_due_read`), so that this claim can take
        them."""
        return [CLAIM_EXPIRED.sent({**claim_kinds(names), "limit": limit}),
                CLAIM_GATE.sent(), PAUSES_ACTIVE.sent(), LIMITS_ALL.sent(), wake_due_read()]

    def claim_in(
        self, tx: Tx, holder: str, names: Sequence[ClaimKind], limit: int,
        pre: ClaimReads | None = None, repaired: list[bool] | None = None,
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
        waits on a claim that waits on a limit lock."""
        if limit <= 0 or not names:
            return []
        if pre is None:
            pre = ClaimReads.of(tx.rows_many(self.reads(names, limit)))
        expired, pauses, limit_rows, woken = pre
        now = tx.now  # after the first read: BEGIN, clock and scan in one round trip
        self.core.repair_clock(tx, now, repaired)
        if woken:
            insert_audit(tx, wake_audit(woken, now))
        paused_types: set[str] = set()
        if pauses:
            if any(p.scope == "all" for p in pauses):
                return []
            paused_types = {p.target for p in pauses if p.scope == "type"}
            names = [n for n in names
                     if (n if isinstance(n, str) else n[0]) not in paused_types]
            expired = [row for row in expired if row.name not in paused_types]
            if not names:
                return []
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
        previous: dict[str, LeaseRow] = {row.id: row for row in expired}
        rows: list[ClaimRow] = []
        if expired:
            rows.extend(CLAIM_TAKEOVER.all(tx, {"holder": holder, "now": now,
                                                "ids": list(previous)}))
        if limit > len(expired):
            limits = [limit_record(r) for r in limit_rows]
            # Limits are per task name, whatever the version: a type's cap holds across
            # the versions its workers run.
            scopes = (bulkheads.lock_scopes(limits, list(dict.fromkeys(kinds["names"])))
                      if limits else None)
            if scopes is None:
                rows.extend(CLAIM_READY.all(tx, {"now": now, **kinds,
                                                 "limit": limit - len(expired),
                                                 "holder": holder}))
            else:
                rows.extend(_claim_limited(tx, holder, now, kinds, limit - len(expired),
                                           limits, scopes, paused_types))
        for row in rows:
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
        steps: dict[str, dict[str, StepRecord]] = {}
        effects: dict[str, dict[str, EffectRecord]] = {}
        if resumed:
            for s in CLAIM_STEPS.all(tx, {"ids": resumed}):
                steps.setdefault(s.task_id, {})[s.name] = StepRecord(
                    s.name, s.result, s.generation, s.committed_at, s.seq)
            for e in CLAIM_EFFECTS.all(tx, {"ids": resumed}):
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


def _claim_limited(
    tx: Tx, holder: str, now: float, kinds: dict[str, list[Any]], want: int,
    limits: list[Limit], scopes: list[str], paused: set[str],
) -> list[ClaimRow]:
    """Fresh claims under bulkheads (DESIGN §8): the limits' advisory locks first
    (PostgreSQL; SQLite's write lock serialises already), then the RUNNING counts and
    which reserved scopes have ready work (statements after the lock see every claim
    its previous holder committed), then ``claim_limited`` with the numbers
    :func:`ratchet.ledger.bulkheads.allowance` computes. One round trip more than an
    unlimited claim, and only when a limit applies.

    ``kinds``: the claim's aligned ``names`` / ``lo`` / ``hi`` lists
    (:func:`~ratchet.ledger.base.claim_kinds`; a name may appear once per version).
    The allowance is per *name* (counts, caps and reservations cover every version of
    a type); each entry carries its name's numbers and the SQL ranks a name's tasks
    across all its entries, so a claim of two versions of a capped type takes at most
    the cap's free slots in all.

    ``paused``: the paused task types (control, DESIGN §8). Their ``PENDING`` tasks
    are not ready work: a paused type's reservation is lent out, like an idle one's,
    and a tenant's ready work counts only tasks of types not paused."""
    names = list(dict.fromkeys(kinds["names"]))
    # No two overlapping entries (the SQL would rank a task once per entry): a bare
    # name (every version) covers that name's (name, version) pairs.
    bare = {n for n, lo, hi in zip(kinds["names"], kinds["lo"], kinds["hi"], strict=True)
            if lo == 1 and hi == MAX_VERSION}
    entries = [(n, lo, hi)
               for n, lo, hi in zip(kinds["names"], kinds["lo"], kinds["hi"], strict=True)
               if n not in bare or (lo == 1 and hi == MAX_VERSION)]
    kinds = {"names": [e[0] for e in entries], "lo": [e[1] for e in entries],
             "hi": [e[2] for e in entries]}
    ready_types, ready_tenants = bulkheads.reserved_groups(limits)
    ready_types = [n for n in ready_types if n not in paused]
    reads = [LIMITS_LOCK.sent({"scopes": scopes}), LIMITS_RUNNING.sent()]
    if ready_types or ready_tenants:
        reads.append(LIMITS_READY.sent({"names": ready_types, "tenants": ready_tenants,
                                        "paused": sorted(paused), "now": now}))
    _, running_rows, *ready = tx.rows_many(reads)
    ready_rows = LIMITS_READY.of(ready[0]) if ready else []
    plan = bulkheads.allowance(
        limits, names, want,
        {(r.name, r.tenant): int(r.n) for r in LIMITS_RUNNING.of(running_rows)},
        {r.name for r in ready_rows if r.scope == "type"},
        {r.name for r in ready_rows if r.scope == "tenant"})
    if plan.limit <= 0:
        return []
    per_name = {n: (cap, own) for n, cap, own
                in zip(plan.names, plan.name_limits, plan.name_reserved, strict=True)}
    return CLAIM_LIMITED.all(tx, {
        "now": now, "holder": holder, "limit": plan.limit, **kinds,
        "name_limits": [per_name[n][0] for n in kinds["names"]],
        "name_reserved": [per_name[n][1] for n in kinds["names"]],
        "pool": plan.pool, "tenants": plan.tenants, "tenant_limits": plan.tenant_limits,
        "tenant_reserved": plan.tenant_reserved, "tenant_pool": plan.tenant_pool})
