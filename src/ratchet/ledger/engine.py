"""The ledger engine: every rule of the ledger, once, over any SQL dialect (DESIGN §10).

:class:`LedgerEngine` implements the :class:`~ratchet.ledger.base.Ledger` protocol on top
of a :class:`~ratchet.ledger.dialect.Dialect`. It owns the policy: the fence of every
write (state and generation read in the write's own transaction), transitions checked
against :mod:`ratchet.states`, the audit trail, retirement of a final attempt whose holder
is gone (``FAILED``, or ``UNKNOWN`` with an open effect intent), revocation, operator
resolution, submit dedupe (idempotency key + params digest), the re-send of writes whose
``COMMIT`` reply was lost, and the aggregates of ``ratchet status``. It never holds SQL: it
names statements of the dialect's catalogue (``ledger/sql/<dialect>.sql``). Adding a
ledger operation is one engine method plus one named statement per dialect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..config import LedgerConfig
from ..errors import (
    IdempotencyConflict,
    IllegalTransition,
    InvalidArguments,
    LedgerCorrupt,
    LedgerError,
    SchemaTooOld,
    TaskNotFound,
    TransactionMisuse,
    WriteRejected,
)
from ..fingerprint import worker_died
from ..outcome import AttemptFacts, Ending, Happened, decide
from ..serde import dumps, printable
from ..states import TERMINAL, State, check_operator_move, check_transition
from . import bulkheads
from . import clock as ledger_clock
from .base import (
    MAX_VERSION,
    RECENT_FRACTION,
    AuditEvent,
    Claim,
    ClaimKind,
    CommitOutcome,
    ControlOutcome,
    ControlRequest,
    DefinitionChange,
    DefinitionRecord,
    DefinitionSpec,
    EffectRecord,
    EffectState,
    LateEffect,
    LedgerStats,
    Limit,
    LimitScope,
    NewTask,
    PauseRecord,
    PauseResult,
    PruneReport,
    QuarantineGroup,
    RenewResult,
    ReplayedTask,
    ResolveOutcome,
    SlotUsage,
    StepRecord,
    SubmitResult,
    Subscription,
    TaskEffect,
    TaskInfo,
    TaskQuery,
    TaskWrite,
    ThroughputCount,
    Timeline,
    Transition,
    TypeCapacity,
    VersionBacklog,
    WorkerInfo,
    claim_kinds,
)
from .budgets import BudgetBook
from .dialect import CommitOutcomeUnknown, Dialect, Tx
from .rows import (
    AuditRow,
    decode_detail,
    effect_record,
    known_state,
    reschedules,
    task_info,
    task_state,
    transition_audit,
)

__all__ = ["LedgerEngine"]

_T = TypeVar("_T")

_AUDIT_KEYS = ("task_id", "at", "kind", "from_state", "to_state", "generation", "holder",
               "detail")


class _Conflict(Exception):
    """Internal: roll the submit transaction back (an idempotency conflict)."""

    def __init__(self, conflict: IdempotencyConflict) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict


def _audit(tx: Tx, rows: Sequence[AuditRow]) -> None:
    """Insert audit rows (in order) in ``tx``."""
    if rows:
        tx.batch("audit_insert", [dict(zip(_AUDIT_KEYS, row, strict=True)) for row in rows])


class LedgerEngine:
    """The :class:`~ratchet.ledger.base.Ledger` contract over a :class:`Dialect`.

    Thread-safe as far as the dialect is (both dialects are: per-thread SQLite connections,
    a PostgreSQL pool). Every public method is one transaction of the dialect, except where
    its docstring says otherwise.

    Args:
        config: the parsed ledger URL.
        dialect: the database under the engine (it is closed by :meth:`close`).
    """

    def __init__(self, config: LedgerConfig, dialect: Dialect) -> None:
        self.config = config
        self.dialect = dialect
        self._schema_has: set[str] = set()  # migrations known applied (_require_schema)
        self._definitions_ready = False  # see _has_definitions
        slots = dialect.user_transaction_slots()
        # Transaction steps hold a connection while user code runs: never all of a pool's,
        # so the writer and the heartbeat always get one (a starved heartbeat loses leases).
        self._user_slots = threading.BoundedSemaphore(slots) if slots is not None else None
        # Backward steps of the ledger clock, seen from this process (ledger/clock.py).
        self._clock_watch = ledger_clock.ClockWatch()

    # ------------------------------------------------------------------ schema, clock

    def migrate(self) -> int:
        """See :meth:`Ledger.migrate`."""
        return self.dialect.migrate()

    def schema_version(self) -> int:
        """See :meth:`Ledger.schema_version`."""
        return self.dialect.schema_version()

    def now(self) -> float:
        """See :meth:`Ledger.now`: the ledger clock, epoch seconds."""
        return self.dialect.run(lambda tx: tx.now, write=False)

    @property
    def corruption(self) -> LedgerCorrupt | None:
        """See :attr:`Ledger.corruption`."""
        return self.dialect.corruption

    # ------------------------------------------------------------------ submit

    def submit(self, tasks: Sequence[NewTask]) -> list[SubmitResult]:
        """See :meth:`Ledger.submit`: one multi-row insert per batch, deduplicated per
        idempotency key (``ON CONFLICT DO NOTHING``, then one read of the batch's keys).

        All-or-nothing: an :class:`IdempotencyConflict` rolls the whole batch back, then the
        conflict is counted in the audit log in a transaction of its own.

        When the connection is lost during ``COMMIT`` (outcome unknown), the batch is sent
        again: a task id is unique per :class:`NewTask`, so a row with one of the batch's
        ids was written by the lost transaction and is reported ``created``, not inserted
        twice.
        """
        if not tasks:
            return []
        clock: list[float] = []  # the clock of the lost attempt, if it read one
        try:
            try:
                return self.dialect.run(lambda tx: self._submit_in(tx, tasks, clock))
            except CommitOutcomeUnknown:
                return self.dialect.run(
                    lambda tx: self._submit_in(tx, tasks, [], resend=clock or [None]))
        except _Conflict as stop:
            found = stop.conflict
        detail = dumps({"key": found.key, "existing_digest": found.existing_digest,
                        "new_digest": found.new_digest})
        self.dialect.run(lambda tx: _audit(tx, [(
            found.task_id, tx.now, "idempotency_conflict", None, None, None, None, detail)]))
        raise found

    def _submit_in(
        self, tx: Tx, tasks: Sequence[NewTask], clock: list[float],
        resend: Sequence[float | None] = (),
    ) -> list[SubmitResult]:
        """``clock`` receives this transaction's clock if it is read. ``resend``: the clock
        of the lost attempt (``[None]`` if it read none): a key-less row with one of our ids
        was written by it; a keyed row is ours if stamped with that clock."""
        # The clock is read only where a keyed row must be told apart from an older one:
        # a batch without keys is BEGIN + INSERT + COMMIT in one round trip on PostgreSQL.
        clock.clear()  # a retried attempt (the dialect's) reads its own
        present: set[str] = set()
        if resend:
            present = {r[0] for r in tx.rows("submit_present", {
                "ids": [t.task_id for t in tasks if t.idempotency_key is None]})}
        rows = [
            {
                "id": t.task_id, "name": t.name, "version": t.version, "params": t.params_json,
                "digest": t.params_digest, "key": t.idempotency_key,
                "max_attempts": t.max_attempts, "lease_s": t.lease_s,
                "run_at": t.run_at_epoch_s, "delay": max(0.0, t.delay_s),
                "quarantine_after": t.quarantine_after,
                "tenant": t.tenant, "trace": t.trace_context,
            }
            for t in tasks
            if t.task_id not in present
        ]
        # Key order: two batches sharing keys take their locks in the same order.
        rows.sort(key=lambda r: (r["key"] is None, r["key"] or ""))
        tx.batch("submit_insert", rows)
        keys = sorted({t.idempotency_key for t in tasks if t.idempotency_key is not None})
        existing: dict[str, tuple[str, str, float]] = {}
        if keys:
            existing = {r[0]: (r[1], r[2], r[3])
                        for r in tx.rows("submit_existing", {"keys": keys})}
        results: list[SubmitResult] = []
        for t in tasks:
            if t.idempotency_key is None:
                results.append(SubmitResult(t.task_id, created=True))
                continue
            task_id, stored_digest, created_at = existing[t.idempotency_key]
            now = tx.now
            if not clock:
                clock.append(now)
            # Written by this transaction: our id, stamped with this transaction's clock (a
            # re-submission of the same NewTask finds its older row: created=False).
            if task_id == t.task_id and (created_at == now or created_at in resend):
                results.append(SubmitResult(task_id, created=True))
            elif stored_digest != t.params_digest:
                raise _Conflict(IdempotencyConflict(
                    t.idempotency_key, stored_digest, t.params_digest, task_id))
            else:
                results.append(SubmitResult(task_id, created=False))
        if any(r.created for r in results) and any(
            t.run_at_epoch_s is None and t.delay_s <= 0 for t in tasks
        ):
            tx.wake()
        return results

    # ------------------------------------------------------------------ claim / renew

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int) -> list[Claim]:
        """See :meth:`Ledger.claim`. Expired leases are taken over before fresh work.

        An expired lease on a task's final attempt is not taken over: the holder died or
        hung on every attempt, so the task is retired (``FAILED``, or ``UNKNOWN`` when an
        effect intent is open: the call may have happened).
        """
        if limit <= 0 or not names:
            return []
        if self.dialect.probe_before_claim:
            maybe, clock = self.dialect.probe()
            # Nothing claimable on the clock as it is, but it stepped back: rows written
            # ahead of it are re-anchored by the claim (ledger/clock.py).
            if not maybe and (clock is None or not self._clock_watch.observe(clock)):
                return []
        return self._run_repairing(
            lambda tx, repaired: self._claim_in(tx, holder, names, limit, repaired=repaired))

    def _repair_clock(self, tx: Tx, now: float, repaired: list[bool] | None) -> None:
        """Re-anchor the rows written ahead of the ledger clock ``now`` (epoch seconds) in
        ``tx`` when this process's watch saw it step back, or is new
        (:func:`ratchet.ledger.clock.repair`). ``repaired`` receives ``True`` when it did:
        the caller marks the repair done once ``tx`` committed. Run by every claim and by
        the operator's pause and resume (which come while workers are stopped: a type's
        delayed rows then wait their own wait from the command, not from the first claim)."""
        if self._clock_watch.observe(now):
            ledger_clock.repair(tx, now, self._clock_watch)
            if repaired is not None:
                repaired.append(True)

    def _run_repairing(self, body: Callable[[Tx, list[bool]], _T]) -> _T:
        """``dialect.run(body)`` for a body that may call :meth:`_repair_clock` with the
        list it is given; the repair is marked done after the commit."""
        repaired: list[bool] = []

        def run(tx: Tx) -> _T:
            repaired.clear()  # a retried attempt decides again
            return body(tx, repaired)

        result = self.dialect.run(run)
        if repaired:
            self._clock_watch.repaired()
        return result

    @staticmethod
    def _claim_reads(
        names: Sequence[ClaimKind], limit: int
    ) -> list[tuple[str, dict[str, Any]]]:
        """The reads a claim starts with, to send with others (one round trip): the
        expired-lease scan of the claimed kinds (DESIGN §8 versions), the pause gate
        (PostgreSQL: a shared advisory lock, taken before any bulkheads limit lock), the
        active pauses (DESIGN §8 control) and the concurrency limits (bulkheads, DESIGN §8)."""
        return [("claim_expired", {**claim_kinds(names), "limit": limit}),
                ("claim_gate", {}), ("pauses_active", {}), ("limits_all", {})]

    def _claim_in(
        self, tx: Tx, holder: str, names: Sequence[ClaimKind], limit: int,
        pre: Sequence[list[tuple[Any, ...]]] | None = None,
        repaired: list[bool] | None = None,
    ) -> list[Claim]:
        """The claim, inside the caller's write transaction (see :meth:`claim`).
        ``pre``: the rows of :meth:`_claim_reads`, if the caller already read them.
        ``repaired``: receives ``True`` when this transaction re-anchored the ledger's rows
        after a backward step of its clock (:mod:`ratchet.ledger.clock`; the caller marks
        the repair done once the transaction committed).

        No attempt starts in a paused scope (DESIGN §8): the active pauses are read under
        the pause gate, a paused type's tasks are neither claimed (under a limit or not)
        nor taken over, and a pause of everything claims nothing. The pause gate is held
        before the limits' advisory locks (:meth:`_claim_limited`), so a pause never
        waits on a claim that waits on a limit lock."""
        if limit <= 0 or not names:
            return []
        if pre is None:
            pre = tx.rows_many(self._claim_reads(names, limit))
        expired, _gate, pauses, limit_rows = pre
        now = tx.now  # after the first read: BEGIN, clock and scan in one round trip
        self._repair_clock(tx, now, repaired)
        paused_types: set[str] = set()
        if pauses:
            if any(p[1] == "all" for p in pauses):
                return []
            paused_types = {p[2] for p in pauses if p[1] == "type"}
            names = [n for n in names
                     if (n if isinstance(n, str) else n[0]) not in paused_types]
            expired = [row for row in expired if row[5] not in paused_types]
            if not names:
                return []
        kinds = claim_kinds(names)
        audit: list[AuditRow] = []
        if any(row[6] is not None for row in expired):
            # An operator's request on a lease whose holder is gone: applied now unless an
            # effect intent is open (then the takeover's holder settles it by lookup first).
            applied = self._apply_requests(tx, expired, audit, "lease expired")
            expired = [row for row in expired if row[0] not in applied]
        if expired:
            expired = self._holder_gone(tx, expired, audit, "lease expired on final attempt",
                                        "lease expired")
        previous = {row[0]: (row[1], row[2]) for row in expired}
        rows: list[tuple[Any, ...]] = []
        if expired:
            rows.extend(tx.rows("claim_takeover",
                                {"holder": holder, "now": now, "ids": list(previous)}))
        if limit > len(expired):
            limits = [_limit(r) for r in limit_rows] if limit_rows else []
            # Limits are per task name, whatever the version: a type's cap holds across
            # the versions its workers run.
            scopes = (bulkheads.lock_scopes(limits, list(dict.fromkeys(kinds["names"])))
                      if limits else None)
            if scopes is None:
                rows.extend(tx.rows("claim_ready", {"now": now, **kinds,
                                                    "limit": limit - len(expired),
                                                    "holder": holder}))
            else:
                rows.extend(self._claim_limited(tx, holder, now, kinds,
                                                limit - len(expired), limits, scopes,
                                                paused_types))
        for row in rows:
            prev = previous.get(row[0])
            detail: dict[str, Any] = {"attempt": row[5], "lease_s": row[7]}
            if prev is not None:
                detail.update(previous_holder=prev[0], previous_generation=prev[1])
            audit.append((row[0], now, "takeover" if prev is not None else "claim", row[9],
                          "RUNNING", row[4], holder, dumps(detail)))
        _audit(tx, audit)
        # Steps and effects can only exist after an earlier claim: generation > 1.
        # (Not attempt: a release hands its attempt back, the generation never goes back.)
        resumed = [row[0] for row in rows if row[4] > 1]
        steps: dict[str, dict[str, StepRecord]] = {}
        effects: dict[str, dict[str, EffectRecord]] = {}
        if resumed:
            for s in tx.rows("claim_steps", {"ids": resumed}):
                steps.setdefault(s[0], {})[s[1]] = StepRecord(s[1], s[2], s[3], s[4], s[5])
            for e in tx.rows("claim_effects", {"ids": resumed}):
                effects.setdefault(e[0], {})[e[1]] = effect_record(e[1:])
        return [
            Claim(
                task_id=row[0], name=row[1], version=row[2], params_json=row[3],
                generation=row[4], attempt=row[5], max_attempts=row[6], lease_s=row[7],
                lease_until=row[8], ledger_now=now, takeover=row[0] in previous,
                previous_holder=previous[row[0]][0] if row[0] in previous else None,
                steps=steps.get(row[0], {}), effects=effects.get(row[0], {}),
                control_request=row[10] if len(row) > 10 else None,
                trace_context=row[11] if len(row) > 11 else None,
            )
            for row in rows
        ]

    def _holder_gone(
        self, tx: Tx, rows: Sequence[tuple[Any, ...]], audit: list[AuditRow],
        final_reason: str, cause: str,
    ) -> list[tuple[Any, ...]]:
        """Deliveries that ended with their holder gone (lease expiry, revocation): locked
        RUNNING rows ``(id, holder, generation, attempt, max_attempts, name, control_request,
        crash_count, quarantine_after)``. Each is counted in ``crash_count`` (the worker is
        dead, so the ledger counts, DESIGN §7). A final attempt is retired (:meth:`_retire`); a task
        whose worker died ``quarantine_after`` times is quarantined (retired with the
        quarantine flag and the :func:`~ratchet.fingerprint.worker_died` fingerprint;
        ``UNKNOWN`` without the flag when an effect intent is open). Returns the rows that
        stay on the retry path (to take over or revoke)."""
        now = tx.now
        survivors: list[tuple[Any, ...]] = []
        exhausted: list[tuple[Any, ...]] = []
        poisoned: list[tuple[Any, ...]] = []
        crashes: dict[str, int] = {}
        for row in rows:
            crashes[row[0]] = int(row[7] or 0) + 1
            # The outcome table without the intent read (made for the retired rows only).
            rules = decide(_gone_facts(row, now, False, with_request=False)).rules
            if "gone_quarantine" in rules:
                poisoned.append(row)
            elif "gone_final" in rules:
                exhausted.append(row)
            else:
                survivors.append(row)
        marks: list[dict[str, Any]] = [
            {"id": row[0], "fingerprint": None, "count": None, "crashes": crashes[row[0]],
             "quarantined": False} for row in [*survivors, *exhausted]]
        if exhausted:
            self._retire(tx, exhausted, audit, final_reason)
        if poisoned:
            targets = self._retire(tx, poisoned, audit, "quarantined: its worker died on "
                                   f"{crashes[poisoned[0][0]]} deliveries ({cause})")
            for row in poisoned:
                flagged = targets[row[0]] is State.FAILED
                fp = worker_died(row[5])
                marks.append({"id": row[0], "fingerprint": fp, "count": crashes[row[0]],
                              "crashes": crashes[row[0]], "quarantined": flagged})
                if flagged:
                    audit.append((row[0], now, "quarantine", State.RUNNING.value,
                                  State.FAILED.value, row[2] + 1, None,
                                  dumps({"fingerprint": fp, "cause": "worker_died",
                                         "count": crashes[row[0]], "previous_holder": row[1],
                                         "reason": cause})))
        tx.batch("quarantine_mark", marks, now=now)
        return survivors

    def _claim_limited(
        self, tx: Tx, holder: str, now: float, kinds: dict[str, list[Any]], want: int,
        limits: list[Limit], scopes: list[str], paused: set[str],
    ) -> list[tuple[Any, ...]]:
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
        reads: list[tuple[str, dict[str, Any]]] = [("limits_lock", {"scopes": scopes}),
                                                    ("limits_running", {})]
        if ready_types or ready_tenants:
            reads.append(("limits_ready", {"names": ready_types, "tenants": ready_tenants,
                                           "paused": sorted(paused), "now": now}))
        _, running_rows, *ready = tx.rows_many(reads)
        ready_rows = ready[0] if ready else []
        plan = bulkheads.allowance(
            limits, names, want, {(r[0], r[1]): int(r[2]) for r in running_rows},
            {r[1] for r in ready_rows if r[0] == "type"},
            {r[1] for r in ready_rows if r[0] == "tenant"})
        if plan.limit <= 0:
            return []
        per_name = {n: (cap, own) for n, cap, own
                    in zip(plan.names, plan.name_limits, plan.name_reserved, strict=True)}
        return tx.rows("claim_limited", {
            "now": now, "holder": holder, "limit": plan.limit, **kinds,
            "name_limits": [per_name[n][0] for n in kinds["names"]],
            "name_reserved": [per_name[n][1] for n in kinds["names"]],
            "pool": plan.pool, "tenants": plan.tenants, "tenant_limits": plan.tenant_limits,
            "tenant_reserved": plan.tenant_reserved, "tenant_pool": plan.tenant_pool})

    def _retire(
        self, tx: Tx, rows: Sequence[tuple[Any, ...]], audit: list[AuditRow], reason: str
    ) -> dict[str, State]:
        """Retire locked RUNNING rows ``(id, holder, generation, attempt, max_attempts, ...)``
        whose holder is gone on the final attempt or quarantined: where each ends is the
        outcome table's (:func:`ratchet.outcome.decide`): ``FAILED``, or ``UNKNOWN`` when an
        effect intent is open (the call may have happened; an operator resolves it).
        Returns each task's new state."""
        open_intents: dict[str, tuple[str, str]] = {}
        for task_id, name, key in tx.rows("open_intents", {"ids": [r[0] for r in rows]}):
            open_intents.setdefault(task_id, (name, key))
        batch: list[dict[str, Any]] = []
        targets: dict[str, State] = {}
        for row in rows:
            task_id, holder, generation, attempt, max_attempts = row[:5]
            intent = open_intents.get(task_id)
            ending = decide(_gone_facts(row, tx.now, intent is not None))
            target = ending.state
            targets[task_id] = target
            check_transition(State.RUNNING, target)
            error = (f"holder {holder} is gone ({reason}) during attempt {attempt} of "
                     f"{max_attempts}")
            if intent:
                error += f"; effect {intent[0]!r} (key {intent[1]!r}) has an open intent"
            # An operator's request waits on UNKNOWN for the resolution (DESIGN §3).
            batch.append({"id": task_id, "generation": generation, "state": target.value,
                          "error": error, "error_class": ending.error_class,
                          "request": ending.request})
            audit.append((task_id, tx.now, "transition", State.RUNNING.value, target.value,
                          generation + 1, None,
                          dumps({"reason": reason, "previous_holder": holder, "error": error})))
        tx.batch("retire", batch, now=tx.now)
        return targets

    def _apply_requests(
        self, tx: Tx, rows: Sequence[tuple[Any, ...]], audit: list[AuditRow], why: str
    ) -> set[str]:
        """Apply the operator requests of locked RUNNING rows ``(id, holder, generation,
        attempt, max_attempts, name, control_request)`` whose holder is gone (``why``):
        ``cancel`` -> ``CANCELLED``, ``pause`` -> ``PAUSED``, generation + 1, for rows
        without an open effect intent (with one, the next holder settles it by lookup
        first, DESIGN §3). Returns the ids moved."""
        requested = [row for row in rows if row[6] is not None]
        if not requested:
            return set()
        open_ids = {r[0] for r in tx.rows("open_intents", {"ids": [r[0] for r in requested]})}
        batch: list[dict[str, Any]] = []
        for row in requested:
            task_id, holder, generation, request = row[0], row[1], row[2], row[6]
            ending = decide(_gone_facts(row, tx.now, task_id in open_ids))
            if "gone_request" not in ending.rules:
                continue  # an intent is open: the takeover's holder settles it first
            target = ending.state
            check_transition(State.RUNNING, target)
            error = f"{request} requested by an operator; holder {holder} is gone ({why})"
            batch.append({"id": task_id, "generation": generation, "state": target.value,
                          "error": error, "error_class": ending.error_class,
                          "request": None})
            audit.append((task_id, tx.now, "transition", State.RUNNING.value, target.value,
                          generation + 1, None,
                          dumps({"reason": f"{request} requested ({why})", "request": request,
                                 "previous_holder": holder})))
        tx.batch("retire", batch, now=tx.now)
        return {row["id"] for row in batch}

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """See :meth:`Ledger.renew`. Expired leases are not renewed (the ledger clock
        decides); the holder's registry heartbeat (``workers.last_seen``) moves with it."""
        if not leases:
            return []

        def body(tx: Tx) -> list[RenewResult]:
            renewed = {
                (r[0], r[1]): r[2]
                for r in tx.rows("renew", {
                    "ids": [task_id for task_id, _ in leases],
                    "generations": [generation for _, generation in leases],
                    "holder": holder,
                })
            }
            held: dict[tuple[str, int], float] = {}
            missing = [lease for lease in leases if lease not in renewed]
            if missing:
                # Not extended: expired or taken over (lost), or its row was locked by
                # another transaction (PostgreSQL skips it): still ours until its current
                # lease_until, extended by the next round.
                for r in tx.rows("renew_held", {
                    "ids": [task_id for task_id, _ in missing],
                    "generations": [generation for _, generation in missing],
                    "holder": holder,
                }):
                    held[(r[0], r[1])] = r[2]
            tx.execute("worker_seen", {"holder": holder, "now": tx.now})
            out = []
            for lease in leases:
                if lease in renewed:
                    out.append(RenewResult(lease[0], lease[1], True, renewed[lease], tx.now))
                else:
                    until = held.get(lease)
                    out.append(RenewResult(lease[0], lease[1], until is not None, until,
                                           tx.now, False))
            return out

        return self.dialect.run(body)

    # ------------------------------------------------------------------ commit

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """See :meth:`Ledger.commit`: one transaction, fenced per task.

        When the connection is lost during ``COMMIT`` (outcome unknown), the writes are
        sent again in a new transaction: a write already applied at its generation is
        acknowledged (``ok``), not reported stale, and re-sent intents are not counted as
        new calls. A write the database refuses raises
        :class:`~ratchet.errors.WriteRejected` for the whole call (nothing is written); the
        worker's writer then applies the writes one by one.
        """
        self._check_transitions(writes)
        if not writes:
            return []
        try:
            try:
                return self.dialect.run(lambda tx: self._commit_in(tx, writes)[0])
            except CommitOutcomeUnknown:
                return self.dialect.run(lambda tx: self._commit_in(tx, writes, resend=True)[0])
        except WriteRejected as exc:
            raise _naming(exc, writes) from exc

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[ClaimKind], limit: int
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """See :meth:`Ledger.commit_and_claim`: both in one transaction (one fsync).

        After a lost ``COMMIT`` reply only the writes are re-sent; tasks the lost
        transaction may have claimed stay leased, unseen, until their leases expire.
        """
        self._check_transitions(writes)

        claiming = limit > 0 and bool(names)
        repaired: list[bool] = []

        def body(tx: Tx) -> tuple[list[CommitOutcome], list[Claim]]:
            repaired.clear()  # a retried attempt decides again
            # The expired-lease scan, the pause gate, the pauses and the limits travel
            # with the fence read (one round trip).
            also = self._claim_reads(names, limit) if claiming else []
            outcomes, pre = self._commit_in(tx, writes, also=also)
            if not claiming:
                return outcomes, []
            # The scan ran before the writes: a lease this commit ended (its holder's own
            # final write, e.g. a completion or a release) is not expired any more.
            ended = {w.task_id for w, o in zip(writes, outcomes, strict=True)
                     if o.ok and w.transition is not None
                     and w.transition.to is not State.RUNNING}
            still = [row for row in pre[0] if row[0] not in ended]
            return outcomes, self._claim_in(tx, holder, names, limit, [still, *pre[1:]],
                                            repaired)

        try:
            try:
                result = self.dialect.run(body)
                if repaired:
                    self._clock_watch.repaired()
                return result
            except CommitOutcomeUnknown:
                return self.dialect.run(
                    lambda tx: self._commit_in(tx, writes, resend=True)[0]), []
        except WriteRejected as exc:
            raise _naming(exc, writes) from exc

    @staticmethod
    def _check_transitions(writes: Sequence[TaskWrite]) -> None:
        for write in writes:
            if write.transition is not None:
                check_transition(State.RUNNING, write.transition.to)

    def _commit_in(
        self, tx: Tx, writes: Sequence[TaskWrite], resend: bool = False,
        also: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> tuple[list[CommitOutcome], list[list[tuple[Any, ...]]]]:
        """The commit, inside the caller's transaction (see :meth:`commit`).

        ``resend``: these writes were sent before in a transaction whose COMMIT reply was
        lost. A write at the task's current generation whose task has already moved on
        was applied then: it is acknowledged.
        """
        if not writes:
            return [], tx.rows_many(also) if also else []
        # Failures that count toward quarantine: their streaks travel with the fence read.
        counted = sorted({w.task_id for w in writes
                          if w.transition is not None and w.transition.fingerprint})
        reads = [("fence_read", {"ids": sorted({w.task_id for w in writes})})]
        if counted:
            reads.append(("quarantine_read", {"ids": counted}))
        # Retry budgets: the windows of budgets that must admit a retry, read (under the
        # budgets' locks) in the same round trip.
        book = BudgetBook(writes)
        reads.extend(book.reads())
        fence, *extra = tx.rows_many([*reads, *also])
        streaks: dict[str, tuple[str | None, int, int | None]] = {}
        if counted:
            streaks = {r[0]: (r[1], int(r[2] or 0), r[3]) for r in extra.pop(0)}
        if book.locked:
            extra.pop(0)  # budget_lock
            book.load(extra.pop(0))
        marks: list[dict[str, Any]] = []
        current: dict[str, tuple[str, int, int, str, str | None]] = {
            r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in fence
        }
        now = tx.now  # after the first read: BEGIN, clock and fence in one round trip
        # Operator requests on tasks this batch moves out of RUNNING (rare: one read then).
        requested = sorted({w.task_id for w in writes if w.transition is not None
                            and (c := current.get(w.task_id)) is not None and c[4]})
        open_db: dict[str, set[str]] = {}
        if requested:
            for task_id, name, _key in tx.rows("open_intents", {"ids": requested}):
                open_db.setdefault(task_id, set()).add(name)
        # A holder stopping for a pause: is a pause still active for it (rare: one read)?
        active: list[tuple[Any, ...]] | None = None
        if any(w.transition is not None and w.transition.to is State.PAUSED for w in writes):
            active = tx.rows("pauses_active")
        outcomes: dict[int, CommitOutcome] = {}
        audit: list[AuditRow] = []
        segment = _Segment()
        ready = False
        seen: set[str] = set()
        for index, write in enumerate(writes):
            if write.task_id in seen:
                # A task written twice in one batch: apply what came before first, so the
                # second write sees the first (as if committed one after the other).
                segment.apply(tx, now, resend)
                segment, seen = _Segment(), set()
            seen.add(write.task_id)
            row = current.get(write.task_id)
            t = write.transition
            if row is not None and row[1] == write.generation and (
                (t is not None and t.to is not State.RUNNING and row[0] == t.to.value)
                or (resend and row[0] != State.RUNNING.value)
            ):
                # Already applied at this generation (only the holder of a generation writes
                # with it): a re-send after a lost COMMIT reply. Acknowledge; write nothing.
                outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
                continue
            if row is None or row[0] != State.RUNNING.value or row[1] != write.generation:
                state = task_state(row[0]) if row is not None else None
                generation = row[1] if row is not None else None
                audit.append((write.task_id, now, "stale_rejected", None, None,
                              write.generation, write.holder,
                              dumps({"operation": printable(write.operation),
                                     "current_generation": generation,
                                     "current_state": None if state is None
                                     else str(state)})))
                outcomes[index] = CommitOutcome(write.task_id, False, True, generation, state)
                continue
            attempt = row[2]
            original = t.to if t is not None else None
            if t is not None and t.to is not State.RUNNING:
                # The ledger's half of the outcome table: request, pause, quarantine.
                t, request = self._arbitrate(tx, write, t, row, open_db.get(write.task_id),
                                             active, streaks, marks, audit, now)
                write = dataclasses.replace(write, transition=t)
            else:
                request = row[4] if t is None or t.to is State.RUNNING else None
            if t is not None and t.budgets:
                t = book.charge(write.holder, t, now)
                write = dataclasses.replace(write, transition=t)
            segment.add(write, attempt, audit, now, request)
            if t is not None:
                audit.append(transition_audit(write, t, now))
                # Later writes of this batch for the same task see the new state.
                current[write.task_id] = (t.to.value, row[1], row[2], row[3], request)
                ready = ready or (reschedules(t.to) and t.delay_s <= 0)
            # The state applied, when arbitration changed the write's (else None).
            applied = t.to if t is not None and write.transition is not None and (
                t.to is not original) else None
            outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation,
                                            applied)
        segment.apply(tx, now, resend)
        tx.batch("quarantine_mark", marks, now=now)
        book.flush(tx, now)
        _audit(tx, audit)
        if ready:
            tx.wake()
        return [outcomes[i] for i in range(len(writes))], extra

    @staticmethod
    def _arbitrate(
        tx: Tx, write: TaskWrite, t: Transition, row: tuple[str, int, int, str, str | None],
        open_before: set[str] | None, active: list[tuple[Any, ...]] | None,
        streaks: dict[str, tuple[str | None, int, int | None]],
        marks: list[dict[str, Any]], audit: list[AuditRow], now: float,
    ) -> tuple[Transition, str | None]:
        """Complete a holder's fenced move out of ``RUNNING`` with the ledger's facts
        (DESIGN §3 arbitration, §7 quarantine) through the outcome table
        (:func:`ratchet.outcome.decide`): the operator request on the task (``row[4]``),
        whether a pause still covers it, the quarantine streak. ``row``: the fence row
        ``(state, generation, attempt, name, control_request)``; ``open_before``: the
        task's open intents when it has a request (read with the batch). Returns the
        transition to apply and the request the task keeps."""
        request = row[4]
        fp = t.fingerprint
        count, limit = 0, None
        if fp is not None:
            previous, count, limit = streaks.get(write.task_id, (None, 0, None))
            count = count + 1 if previous == fp else 1
        intent_open = False
        if request or (limit and count >= limit):
            if open_before is None:
                open_before = {r[1] for r in tx.rows("open_intents", {"ids": [write.task_id]})}
            settled = {e.name for e in write.effects if e.state is not EffectState.INTENT}
            opened = {e.name for e in write.effects if e.state is EffectState.INTENT}
            intent_open = bool((open_before - settled) | opened)
        ending = decide(AttemptFacts(
            Happened.ASKED, now=now, error_class=t.error_class, delay_s=t.delay_s,
            intent_open=intent_open, proposed=t.to, request=request,
            pause_active=t.to is not State.PAUSED or _covered(active or [], write.task_id, row[3]),
            streak=count, quarantine_after=limit))
        rules = set(ending.rules)
        if "request_applied" in rules:
            check_transition(State.RUNNING, ending.state)
            t = Transition(
                ending.state, error=t.error, traceback=t.traceback, error_class=ending.error_class,
                reason=f"{request} requested by an operator; the attempt ended {t.to.value} "
                       f"({t.reason or t.error_class or '-'})")
        elif "pause_lifted" in rules:
            # Resumed before this holder reached its boundary: released instead.
            t = Transition(State.PENDING, reason="paused, then resumed before the "
                           "boundary: released (attempt handed back)")
        elif "request_dropped" in rules:
            why = f"{request} request dropped: the attempt ended {t.to.value} first"
            t = dataclasses.replace(t, reason=f"{t.reason}; {why}" if t.reason else why)
        if fp is not None and not ending.replaced:
            t = LedgerEngine._count_failure(write, t, ending, count, limit, streaks, marks,
                                            audit, now)
        return t, ending.request

    @staticmethod
    def _count_failure(
        write: TaskWrite, t: Transition, ending: Ending, count: int, limit: int | None,
        streaks: dict[str, tuple[str | None, int, int | None]],
        marks: list[dict[str, Any]], audit: list[AuditRow], now: float,
    ) -> Transition:
        """Count a fenced failure that carries an error fingerprint (DESIGN §7): the
        streak of failures in a row with the same fingerprint grows, or restarts at 1
        (``count``, this failure included). Where it ends at the task's
        ``quarantine_after`` is the outcome table's (``ending``): a ``RETRY_WAIT`` becomes
        a quarantined ``FAILED`` (``UNKNOWN``, not flagged, when an effect intent is open),
        and a ``FAILED`` (attempts exhausted, permanent) is flagged. Returns the transition
        to apply."""
        fp = t.fingerprint
        streaks[write.task_id] = (fp, count, limit)
        rules = set(ending.rules)
        if rules & {"quarantine", "quarantine_intent_open"}:
            why = f"quarantined: the same error {count} times in a row (fingerprint {fp})"
            check_transition(State.RUNNING, ending.state)
            t = dataclasses.replace(
                t, to=ending.state, delay_s=0.0,
                reason=why if ending.quarantined else f"{why}; an effect intent is open")
        if ending.quarantined:
            audit.append((write.task_id, now, "quarantine", State.RUNNING.value,
                          State.FAILED.value, write.generation, write.holder,
                          dumps({"fingerprint": fp, "cause": "error", "count": count,
                                 "error_class": t.error_class})))
        marks.append({"id": write.task_id, "fingerprint": fp, "count": count, "crashes": None,
                      "quarantined": ending.quarantined})
        return t

    # ------------------------------------------------------------------ operator

    def resolve(
        self,
        task_id: str,
        outcome: ResolveOutcome,
        reason: str,
        operator: str,
        result_json: str | None = None,
    ) -> TaskInfo:
        """See :meth:`Ledger.resolve`."""

        def body(tx: Tx) -> None:
            row = tx.one("resolve_lock", {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            if row[0] != State.UNKNOWN.value:
                raise IllegalTransition(
                    f"task {task_id} is {row[0]}, not UNKNOWN; only UNKNOWN tasks can be resolved"
                )
            request = row[3]
            # give-up: FAILED. Otherwise the task resumes, unless an operator request was
            # kept waiting for this resolution (DESIGN §3): then it is applied now.
            if outcome is ResolveOutcome.GIVE_UP:
                target = State.FAILED
            elif request is not None:
                target = (State.CANCELLED if request == ControlRequest.CANCEL
                          else State.PAUSED)
            else:
                target = State.PENDING
            check_operator_move(State.UNKNOWN, target)
            open_effects = tx.rows("resolve_open_effects", {"id": task_id})
            new_state = {ResolveOutcome.DONE: EffectState.DONE,
                         ResolveOutcome.NOT_DONE: EffectState.NOT_DONE,
                         ResolveOutcome.GIVE_UP: EffectState.GIVEN_UP}[outcome]
            tx.execute("resolve_effects", {
                "state": new_state.value,
                "result": result_json if new_state is EffectState.DONE else None,
                "now": tx.now, "id": task_id,
            })
            generation = row[1]
            if target is State.PENDING:
                tx.execute("resolve_task", {"now": tx.now, "id": task_id,
                                            "generation": generation})
                tx.wake()
            else:
                # Generation + 1: the task's history is settled by an operator here.
                given_up = outcome is ResolveOutcome.GIVE_UP
                tx.execute("control_move", {
                    "id": task_id, "from_state": State.UNKNOWN.value, "generation": generation,
                    "state": target.value, "bump": 1, "request": None, "run_at": None,
                    "reset": False, "now": tx.now,
                    "error": (f"given up by {operator}: {reason}" if given_up else None),
                    "error_class": ("given_up" if given_up
                                    else _REQUEST_CLASS[ControlRequest(request)]),
                })
                generation += 1
            detail: dict[str, Any] = {
                "operator": operator, "reason": reason, "outcome": outcome.value,
                "effects": [{"name": e[0], "key": e[1]} for e in open_effects]}
            if request is not None:
                detail["request"] = request
            _audit(tx, [(task_id, tx.now, "operator_resolve", State.UNKNOWN.value,
                         target.value, generation, None, dumps(detail))])

        self.dialect.run(body)
        return self.get(task_id)

    def cancel(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.cancel` (DESIGN §3, arbitration): one transaction under the
        task's lock; audited as ``operator_cancel`` with operator and reason."""

        def body(tx: Tx) -> ControlOutcome:
            row = tx.one("control_lock", {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state, generation, lease_until = known_state(task_id, row[0], "cancel"), row[1], row[5]
            now = tx.now
            if state in TERMINAL:
                return ControlOutcome(
                    task_id, "cancel", "unchanged", state, state, generation,
                    f"task {task_id} already ended {state.value}: nothing changed (a task "
                    "that finished first keeps its outcome)")
            intents = [r[1] for r in tx.rows("open_intents", {"ids": [task_id]})]
            detail: dict[str, Any] = {"operator": operator, "reason": reason}
            gone = (state is State.RUNNING and lease_until is not None
                    and lease_until < now)
            if (state is State.RUNNING and not gone) or state is State.UNKNOWN or intents:
                # A request, for the holder's next boundary, the next holder's lookup or the
                # resolution (an open effect intent is settled first, never abandoned).
                tx.execute("control_request_set", {
                    "id": task_id, "from_state": state.value, "generation": generation,
                    "request": ControlRequest.CANCEL.value})
                if state is State.UNKNOWN:
                    message = (f"task {task_id} is UNKNOWN: the cancel is recorded and applied "
                               "when its effect is resolved (ratchet resolve)")
                elif intents:
                    message = (f"task {task_id} is {state.value} with an open effect intent "
                               f"({', '.join(intents)}): the cancel is recorded; the holder "
                               "settles the effect (lookup) first, then cancels")
                else:
                    message = (f"task {task_id} is RUNNING: its holder cancels it at its "
                               "next step boundary")
                detail.update(outcome="requested", open_intents=intents)
                _audit(tx, [(task_id, now, "operator_cancel", state.value, None, generation,
                             None, dumps(detail))])
                tx.wake()  # PostgreSQL: the holder's heartbeat reads its requests now
                return ControlOutcome(task_id, "cancel", "requested", state, state,
                                      generation, message)
            if gone:
                # The holder's lease is over and no effect is open: nobody can still apply
                # the request at a boundary, so the ledger applies it (generation + 1).
                check_transition(State.RUNNING, State.CANCELLED)
                tx.batch("retire", [{
                    "id": task_id, "generation": generation, "state": State.CANCELLED.value,
                    "error": f"cancelled by {operator}: {reason} (holder {row[4]} is gone: "
                             "lease expired)",
                    "error_class": "cancelled", "request": None}], now=now)
            else:
                check_operator_move(state, State.CANCELLED)
                tx.execute("control_move", {
                    "id": task_id, "from_state": state.value, "generation": generation,
                    "state": State.CANCELLED.value, "bump": 1, "request": None,
                    "run_at": None, "reset": False, "now": now,
                    "error": None, "error_class": "cancelled"})
            detail["outcome"] = "done"
            _audit(tx, [(task_id, now, "operator_cancel", state.value,
                         State.CANCELLED.value, generation + 1, None, dumps(detail))])
            return ControlOutcome(task_id, "cancel", "done", state, State.CANCELLED,
                                  generation + 1, f"task {task_id} cancelled (was "
                                  f"{state.value})")

        return self.dialect.run(body)

    def retry(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.retry`: ``FAILED -> PENDING`` (an operator move, DESIGN §3),
        attempts reset, generation + 1, ready now; audited as ``operator_retry``."""

        def body(tx: Tx) -> ControlOutcome:
            row = tx.one("control_lock", {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state, generation, attempts = known_state(task_id, row[0], "retry"), row[1], row[6]
            if state is not State.FAILED:
                why = ("it never moves again" if state in TERMINAL
                       else "it has not failed")
                return ControlOutcome(
                    task_id, "retry", "unchanged", state, state, generation,
                    f"task {task_id} is {state.value}, not FAILED: nothing changed ({why})")
            check_operator_move(State.FAILED, State.PENDING)
            now = tx.now
            self._unfinish(tx, [(row[2], state.value, float(row[8]))])
            tx.execute("control_move", {
                "id": task_id, "from_state": state.value, "generation": generation,
                "state": State.PENDING.value, "bump": 1, "request": None, "run_at": now,
                "reset": True, "now": now, "error": None, "error_class": None})
            _audit(tx, [(task_id, now, "operator_retry", State.FAILED.value,
                         State.PENDING.value, generation + 1, None,
                         dumps({"operator": operator, "reason": reason,
                                "previous_attempts": attempts}))])
            tx.wake()
            return ControlOutcome(
                task_id, "retry", "done", state, State.PENDING, generation + 1,
                f"task {task_id} queued again with a fresh set of {row[7]} attempt(s) "
                f"(it had used {attempts}); done steps stay done")

        return self.dialect.run(body)

    def pause(self, scope: str, target: str, reason: str, operator: str) -> PauseResult:
        """See :meth:`Ledger.pause` (DESIGN §8)."""
        if scope not in _SCOPES:
            raise InvalidArguments(f"pause scope must be one of {', '.join(_SCOPES)}, "
                                   f"got {scope!r}")

        def body(tx: Tx, repaired: list[bool]) -> PauseResult:
            task: tuple[Any, ...] | None = None
            if scope == "task":
                # One task: its row lock serializes with its claims and its holder.
                task = tx.one("control_lock", {"id": target})
                if task is None:
                    raise TaskNotFound(f"no task {target!r} in the ledger")
                if known_state(target, task[0], "pause") in TERMINAL:
                    return PauseResult("pause", "unchanged", [], 0, 0,
                                       f"task {target} already ended {task[0]}: nothing to "
                                       "pause")
            else:
                tx.one("pause_gate", {})  # claims in flight finish first; later ones see it
            now = tx.now
            self._repair_clock(tx, now, repaired)  # after the lock or gate: it never waits
            active = [_pause_record(r) for r in tx.rows("pauses_active")]
            same = [p for p in active if (p.scope, p.target) == (scope, target)]
            if same:
                return PauseResult("pause", "unchanged", same, 0, 0,
                                   f"{_scope_text(scope, target)} is already paused "
                                   f"(pause record version {same[0].version}, "
                                   f"by {same[0].paused_by})")
            version_row = tx.one("pause_version", {})
            version = int(version_row[0] or 0) + 1 if version_row else 1
            [(pause_id,)] = tx.rows("pause_insert", {
                "scope": scope, "target": target, "version": version, "by": operator,
                "reason": reason, "now": now})
            moved = running = 0
            audit: list[AuditRow] = []
            detail = {"operator": operator, "reason": reason, "scope": scope,
                      "target": target, "version": version, "pause_id": pause_id}
            if task is not None:
                state, generation = known_state(target, task[0], "pause"), task[1]
                if state in (State.PENDING, State.RETRY_WAIT):
                    check_operator_move(state, State.PAUSED)
                    tx.execute("control_move", {
                        "id": target, "from_state": state.value, "generation": generation,
                        "state": State.PAUSED.value, "bump": 1, "request": task[3],
                        "run_at": None, "reset": False, "now": now, "error": None,
                        "error_class": None})
                    audit.append((target, now, "operator_pause", state.value,
                                  State.PAUSED.value, generation + 1, None, dumps(detail)))
                    moved = 1
                else:
                    if state in (State.RUNNING, State.UNKNOWN) and task[3] is None:
                        # RUNNING: the holder stops at its next boundary; UNKNOWN: applied
                        # by the resolution. A cancel already asked for wins.
                        tx.execute("control_request_set", {
                            "id": target, "from_state": state.value,
                            "generation": generation, "request": ControlRequest.PAUSE.value})
                    running = int(state is State.RUNNING)
                    audit.append((target, now, "operator_pause", state.value, None,
                                  generation, None, dumps(detail)))
            else:
                counts = dict(tx.rows("running_by_type"))
                running = sum(int(n) for name, n in counts.items()
                              if scope == "all" or name == target)
                audit.append((f"pause:{pause_id}", now, "operator_pause", None, None, None,
                              None, dumps(detail)))
            _audit(tx, audit)
            tx.wake()  # PostgreSQL: holders' heartbeats read their requests now
            record = PauseRecord(pause_id, scope, target, version, operator, reason, now,
                                 running)
            what = _scope_text(scope, target)
            message = (f"{what} paused (pause record version {version})"
                       + (f"; {running} running task(s) stop at their next step boundary"
                          if running else "")
                       + ("; the task is PAUSED now" if moved else ""))
            return PauseResult("pause", "done", [record], moved, running, message)

        return self._run_repairing(body)

    def resume(self, scope: str, target: str, reason: str, operator: str,
               rate_per_s: float | None = None) -> PauseResult:
        """See :meth:`Ledger.resume` (DESIGN §8)."""
        if scope not in _SCOPES:
            raise InvalidArguments(f"resume scope must be one of {', '.join(_SCOPES)}, "
                                   f"got {scope!r}")

        def body(tx: Tx, repaired: list[bool]) -> PauseResult:
            before = tx.rows("pauses_active")
            now = tx.now
            self._repair_clock(tx, now, repaired)
            version_row = tx.one("pause_version", {})
            version = int(version_row[0] or 0) + 1 if version_row else 1
            ended = tx.rows("pause_resume", {"scope": scope, "target": target, "now": now,
                                             "by": operator, "reason": reason,
                                             "version": version})
            if not ended:
                return PauseResult("resume", "unchanged", [], 0, 0,
                                   f"{_scope_text(scope, target)} is not paused")
            ended_ids = {r[0] for r in ended}
            still = [p for p in before if p[0] not in ended_ids]
            audit: list[AuditRow] = []
            if scope == "task":
                task = tx.one("control_lock", {"id": target})
                candidates = []
                if task is not None:
                    if task[0] == State.PAUSED.value:
                        candidates = [(target, task[2], task[1])]
                    elif task[3] == ControlRequest.PAUSE.value:
                        # Not at a boundary yet (or UNKNOWN): the request is withdrawn.
                        tx.execute("control_request_set", {
                            "id": target, "from_state": task[0], "generation": task[1],
                            "request": None})
            else:
                candidates = [(r[0], r[1], r[2]) for r in tx.rows(
                    "paused_tasks", {"name": target if scope == "type" else None})]
            readmit = [c for c in candidates if not _covered(still, c[0], c[1])]
            step = 0.0 if not rate_per_s else 1.0 / rate_per_s
            rows = [{"id": tid, "generation": generation, "run_at": now + i * step}
                    for i, (tid, _name, generation) in enumerate(readmit)]
            tx.batch("resume_tasks", rows, now=now)
            detail = {"operator": operator, "reason": reason, "scope": scope,
                      "target": target, "version": version}
            for pause_id, _ in ended:
                audit.append((target if scope == "task" else f"pause:{pause_id}", now,
                              "operator_resume", None, None, None, None,
                              dumps({**detail, "pause_id": pause_id})))
            for row in rows:
                audit.append((row["id"], now, "operator_resume", State.PAUSED.value,
                              State.PENDING.value, row["generation"], None,
                              dumps({**detail, "run_at": row["run_at"]})))
            _audit(tx, audit)
            if rows:
                tx.wake()
            records = [_pause_record(p) for p in before if p[0] in ended_ids]
            records = [dataclasses.replace(r, resumed_at=now, resumed_by=operator,
                                           resume_reason=reason, resumed_version=version)
                       for r in records]
            kept = len(candidates) - len(readmit)
            message = (f"{_scope_text(scope, target)} resumed (pause record version {version}); "
                       f"{len(rows)} paused task(s) ready again"
                       + (f" at {rate_per_s:g}/s" if rate_per_s and rows else "")
                       + (f"; {kept} stay paused by another pause" if kept else ""))
            return PauseResult("resume", "done", records, len(rows), 0, message)

        return self._run_repairing(body)

    def pauses(self) -> list[PauseRecord]:
        """See :meth:`Ledger.pauses`."""

        def body(tx: Tx) -> list[PauseRecord]:
            active, counts = tx.rows_many([("pauses_active", {}), ("running_by_type", {})])
            if not active:
                return []
            by_type = {name: int(n) for name, n in counts}
            tasks = [p[2] for p in active if p[1] == "task"]
            running_tasks = {r[0] for r in tx.rows("task_get_many", {"ids": tasks})
                             if r[3] == State.RUNNING.value} if tasks else set()
            out = []
            for p in active:
                if p[1] == "all":
                    running = sum(by_type.values())
                elif p[1] == "type":
                    running = by_type.get(p[2], 0)
                else:
                    running = int(p[2] in running_tasks)
                out.append(dataclasses.replace(_pause_record(p), running=running))
            return out

        return self.dialect.run(body, write=False)

    def quarantine_groups(self, limit: int = 100, per_group: int = 5) -> list[QuarantineGroup]:
        """See :meth:`Ledger.quarantine_groups` (one read transaction, two statements)."""

        def body(tx: Tx) -> list[QuarantineGroup]:
            groups = tx.rows("quarantine_groups", {"limit": limit})
            if not groups:
                return []
            # A fingerprint includes the task type: one fingerprint is one group.
            samples: dict[str, list[tuple[Any, ...]]] = {}
            for r in tx.rows("quarantine_samples", {
                    "fingerprints": sorted({g[0] for g in groups}), "per_group": per_group}):
                samples.setdefault(r[0], []).append(r)
            out = []
            for fp, name, count, first_at, last_at in groups:
                rows = samples.get(fp, [])
                out.append(QuarantineGroup(
                    fingerprint=fp, name=name, count=int(count), first_at=first_at,
                    last_at=last_at, error_class=rows[0][3] if rows else None,
                    example_error=printable(rows[0][2]) if rows and rows[0][2] else None,
                    task_ids=[r[1] for r in rows]))
            return out

        return self.dialect.run(body, write=False)

    def control_requests(self, holder: str) -> list[tuple[str, int, str]]:
        """See :meth:`Ledger.control_requests`."""
        rows = self.dialect.run(
            lambda tx: tx.rows("control_requests", {"holder": holder}), write=False)
        return [(r[0], r[1], r[2]) for r in rows]

    def quarantine_replay(
        self, fingerprint: str, rate_per_s: float, operator: str, reason: str,
        dry_run: bool = False, limit: int = 10_000,
    ) -> list[ReplayedTask]:
        """See :meth:`Ledger.quarantine_replay`."""
        if not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s!r}")

        def body(tx: Tx) -> list[ReplayedTask]:
            picked = tx.rows("quarantine_pick", {"fingerprint": fingerprint, "limit": limit})
            now = tx.now
            if not dry_run and picked:
                locked = {r[0] for r in tx.rows("quarantine_lock",
                                                 {"ids": sorted(r[0] for r in picked)})}
                picked = [r for r in picked if r[0] in locked]
            check_operator_move(State.FAILED, State.PENDING)
            out = [ReplayedTask(r[0], r[1], now + i / rate_per_s, int(r[3]), int(r[4]))
                   for i, r in enumerate(picked)]
            if dry_run or not out:
                return out
            self._unfinish(tx, [(r[1], State.FAILED.value, float(r[5])) for r in picked])
            tx.batch("quarantine_replay_task",
                     [{"id": p.task_id, "run_at": p.run_at} for p in out], now=now)
            generations = {r[0]: r[2] for r in picked}
            _audit(tx, [(
                p.task_id, now, "operator_replay", State.FAILED.value, State.PENDING.value,
                generations[p.task_id], None,
                dumps({"operator": operator, "reason": reason, "fingerprint": fingerprint,
                       "run_at": p.run_at, "failures": p.failures, "crashes": p.crashes}),
            ) for p in out])
            if out[0].run_at <= now:
                tx.wake()
            return out

        return self.dialect.run(body, write=not dry_run)

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""

        def body(tx: Tx) -> list[str]:
            rows = tx.rows("holder_running", {"holder": holder})
            audit: list[AuditRow] = []
            applied = self._apply_requests(tx, rows, audit, f"revoked by {by}: {reason}")
            everything, rows = rows, [r for r in rows if r[0] not in applied]
            retry = self._holder_gone(tx, rows, audit, f"holder revoked by {by}: {reason}",
                                      f"holder revoked by {by}") if rows else []
            if retry:
                tx.execute("revoke_retry", {
                    "now": tx.now, "error": f"holder {holder} revoked by {by}: {reason}",
                    "ids": [r[0] for r in retry], "holder": holder,
                })
                for r in retry:
                    audit.append((r[0], tx.now, "revoke", State.RUNNING.value,
                                  State.RETRY_WAIT.value, r[2] + 1, by,
                                  dumps({"previous_holder": holder, "previous_generation": r[2],
                                         "reason": reason})))
                tx.wake()
            tx.execute("worker_dead", {"holder": holder})
            _audit(tx, audit)
            return [r[0] for r in everything]

        return self.dialect.run(body)

    # ------------------------------------------------------------------ bulkheads

    def limits(self) -> list[Limit]:
        """See :meth:`Ledger.limits`."""
        rows = self.dialect.run(lambda tx: tx.rows("limits_all"), write=False)
        return [_limit(r) for r in rows]

    def set_limit(
        self, scope: LimitScope, name: str, reserved: int, maximum: int | None,
        operator: str, reason: str,
    ) -> Limit:
        """See :meth:`Ledger.set_limit`. Checked on its own (``reserved <= maximum``,
        ``maximum >= 1``, ...) and against the other rows in the same transaction, under
        the total's claim lock (``*``, so two sets never race): with a total, the
        reservations of the types, and those of the tenants, add up to at most the total.
        Audited as ``limit_set`` (task id ``limit:SCOPE[:NAME]``) with the old and new
        values. A claim already in flight finishes under the limits it read; tasks running
        above a lowered cap are not stopped (no preemption)."""
        scope = LimitScope(scope)
        _check_limit(scope, name, reserved, maximum)

        def body(tx: Tx) -> Limit:
            [_, rows] = tx.rows_many([("limits_lock", {"scopes": ["*"]}), ("limits_all", {})])
            current = {(lim.scope, lim.name): lim for lim in map(_limit, rows)}
            old = current.get((scope, name))
            current[(scope, name)] = Limit(scope, name, reserved, maximum, 0, 0.0, "", "")
            _check_reservations(current)
            row = tx.one("limit_upsert", {
                "scope": scope.value, "name": name, "reserved": reserved,
                "maximum": maximum, "now": tx.now, "operator": operator, "reason": reason})
            assert row is not None
            new = _limit(row)
            _audit(tx, [(_limit_audit_id(scope, name), tx.now, "limit_set", None, None,
                         None, None, dumps({
                             "operator": operator, "reason": reason, "scope": scope.value,
                             "name": name, "reserved": reserved, "maximum": maximum,
                             "version": new.version,
                             "previous": None if old is None else
                             {"reserved": old.reserved, "maximum": old.maximum}}))])
            return new

        return self.dialect.run(body)

    def clear_limit(self, scope: LimitScope, name: str, operator: str, reason: str) -> Limit:
        """See :meth:`Ledger.clear_limit`. Audited as ``limit_cleared``. Clearing the total
        while reservations remain is allowed (they then have no effect)."""
        scope = LimitScope(scope)

        def body(tx: Tx) -> Limit:
            row = tx.one("limit_delete", {"scope": scope.value, "name": name})
            if row is None:
                raise InvalidArguments(
                    f"no {scope.value} limit {name!r} to clear" if name else
                    f"no {scope.value} limit to clear")
            old = _limit(row)
            _audit(tx, [(_limit_audit_id(scope, name), tx.now, "limit_cleared", None, None,
                         None, None, dumps({
                             "operator": operator, "reason": reason, "scope": scope.value,
                             "name": name, "previous": {"reserved": old.reserved,
                                                        "maximum": old.maximum}}))])
            return old

        return self.dialect.run(body)

    def limit_changes(self, limit: int = 20) -> list[AuditEvent]:
        """See :meth:`Ledger.limit_changes`."""
        rows = self.dialect.run(lambda tx: tx.rows("limits_audit", {"limit": limit}),
                                write=False)
        return [AuditEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], decode_detail(r[8]))
                for r in rows]

    def slot_usage(self) -> SlotUsage:
        """See :meth:`Ledger.slot_usage` (one read transaction)."""

        def body(tx: Tx) -> SlotUsage:
            running = {(r[0], r[1]): int(r[2]) for r in tx.rows("limits_running")}
            ready_rows = tx.rows("slot_ready", {"now": tx.now})
            return SlotUsage(running, {(r[0], r[1]): int(r[2]) for r in ready_rows},
                             {(r[0], r[1]): float(r[3]) for r in ready_rows}, tx.now)

        return self.dialect.run(body, write=False)

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskInfo:
        """See :meth:`Ledger.get`. Stored JSON that cannot be decoded is returned as an
        :class:`~ratchet.serde.Undecodable` in its field, never raised."""
        row = self.dialect.run(lambda tx: tx.one("task_get", {"id": task_id}), write=False)
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in the ledger")
        return task_info(row)

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """See :meth:`Ledger.get_many`."""
        ids = list(task_ids)
        if not ids:
            return []
        rows = self.dialect.run(lambda tx: tx.rows("task_get_many", {"ids": ids}), write=False)
        return [task_info(r) for r in rows]

    def list_tasks(self, query: TaskQuery) -> list[TaskInfo]:
        """See :meth:`Ledger.list_tasks`."""
        params = {
            "states": None if query.states is None else [s.value for s in query.states],
            "names": None if query.names is None else list(query.names),
            "key": query.key, "created_from": query.created_from,
            "created_to": query.created_to, "limit": query.limit,
            "cursor_at": query.after[0] if query.after else None,
            "cursor_id": query.after[1] if query.after else None,
        }
        rows = self.dialect.run(lambda tx: tx.rows("tasks_list", params), write=False)
        return [task_info(r) for r in rows]

    def timeline(self, task_id: str) -> Timeline:
        """See :meth:`Ledger.timeline`."""

        def body(tx: Tx) -> Timeline:
            row = tx.one("task_get", {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            events = [
                AuditEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], decode_detail(r[8]))
                for r in tx.rows("timeline_audit", {"id": task_id})
            ]
            steps = [StepRecord(r[0], r[1], r[2], r[3], r[4])
                     for r in tx.rows("timeline_steps", {"id": task_id})]
            effects = [effect_record(r) for r in tx.rows("timeline_effects", {"id": task_id})]
            late = [LateEffect(*r) for r in tx.rows("late_effects_task",
                                                     {"id": task_id, "limit": 1000})]
            return Timeline(task_info(row), events, steps, effects, late)

        return self.dialect.run(body, write=False)

    def stats(self, window_s: float | None = None) -> LedgerStats:
        """See :meth:`Ledger.stats` (decodes no stored JSON).

        Reads no history (DESIGN §9): non-terminal tasks are counted exactly from their
        partial index; finished tasks and audit kinds are the rollup (before the counts
        mark) plus what finished or happened since the mark. The mark is advanced first,
        in a short write transaction of its own (skipped if the ledger refuses it, e.g. a
        read-only file: the count since the mark is then just longer).
        """
        self._require_schema("retention.sql", "ratchet status")
        # An older ledger opened read-only (not migrated): no quarantine column to count.
        quarantine = window_s is not None and self._has_migration("retry_governance.sql")
        with contextlib.suppress(LedgerError):
            self._advance_counts()

        def body(tx: Tx) -> LedgerStats:
            mark = tx.one("counts_read_mark")
            upto = float(mark[0]) if mark else 0.0
            counts: dict[str, dict[str, int]] = {}
            for name, state, n in tx.rows("stats_counts", {"upto": upto}):
                counts.setdefault(name, {})[state] = int(n)
            oldest_row = tx.one("stats_oldest", {"now": tx.now})
            oldest = oldest_row[0] if oldest_row else None
            kinds = {k: int(n) for k, n in tx.rows("stats_kinds", {"upto": upto})}
            unknown_row = tx.one("stats_unknown")
            late_row = tx.one("stats_late")
            capacity = ([] if window_s is None else
                        self._capacity(tx, tx.now - window_s, counts, quarantine,
                                       tx.now - window_s * RECENT_FRACTION))
            return LedgerStats(
                counts=counts,
                oldest_pending_age_s=(tx.now - oldest) if oldest is not None else None,
                unknown_count=int(unknown_row[0]) if unknown_row else 0,
                claims=kinds.get("claim", 0) + kinds.get("takeover", 0),
                takeovers=kinds.get("takeover", 0),
                stale_rejections=kinds.get("stale_rejected", 0),
                lookup_hits=kinds.get("lookup_hit", 0),
                idempotency_conflicts=kinds.get("idempotency_conflict", 0),
                operator_actions=sum(kinds.get(k, 0) for k in _OPERATOR_KINDS),
                revocations=kinds.get("revoke", 0),
                late_effects=int(late_row[0]) if late_row else 0,
                late_effects_accounted_for=int(late_row[1]) if late_row else 0,
                durability=self.config.durability.value,
                backend_settings=self.dialect.backend_settings(tx),
                schema_version=0,
                ledger_now=tx.now,
                window_s=window_s or 0.0,
                capacity=capacity,
            )

        stats = self.dialect.run(body, write=False)
        return _with_version(stats, self.dialect.schema_version())

    @staticmethod
    def _capacity(tx: Tx, from_at: float, counts: Mapping[str, Mapping[str, int]],
                  quarantine: bool = True, recent_at: float | None = None
                  ) -> list[TypeCapacity]:
        """Per task type: scheduled / oldest ready (tasks_ready), unknown (the parked
        index), quarantined (tasks_quarantine), and arrivals / completions since
        ``from_at`` and since ``recent_at`` (the window's recent part; default
        ``from_at``), with the newest arrival (ranges of tasks_created / tasks_finished,
        the same rows): the backlog and the window, never the history (DESIGN §9)."""
        window = {"from_at": from_at, "recent_at": from_at if recent_at is None else recent_at}
        # The UNKNOWN rows of the types the counts show with some (a seek per type).
        waiting = sorted(n for n, states in counts.items() if states.get("UNKNOWN"))
        reads: list[tuple[str, dict[str, Any]]] = [
            ("status_ready", {}), ("status_arrivals", {**window}),
            ("status_completions", {**window})]
        if waiting:
            reads.append(("status_unknown", {"names": waiting, **window}))
        if quarantine:
            reads.append(("status_quarantined", {}))
        ready, arrivals, completions, *more = tx.rows_many(reads)
        unknown = more.pop(0) if waiting else []
        quarantined = more.pop(0) if quarantine else []
        by: dict[str, dict[str, Any]] = {name: {} for name in counts}
        for name, later, oldest in ready:
            by.setdefault(name, {}).update(
                scheduled=int(later or 0),
                oldest_ready_at=None if oldest is None else float(oldest))
        for name, n, oldest, entered, recent in unknown:
            by.setdefault(name, {}).update(unknown=int(n), oldest_unknown_at=float(oldest),
                                           unknown_entered=int(entered or 0),
                                           recent_unknown_entered=int(recent or 0))
        for name, n in quarantined:
            by.setdefault(name, {})["quarantined"] = int(n)
        for name, n, recent, last in arrivals:
            by.setdefault(name, {}).update(arrivals=int(n), recent_arrivals=int(recent or 0),
                                           last_arrival_at=float(last))
        for name, n, recent in completions:
            by.setdefault(name, {}).update(completions=int(n),
                                           recent_completions=int(recent or 0))
        return [TypeCapacity(name, **by[name]) for name in sorted(by)]

    def throughput(self, window_s: float, bucket_s: float,
                   name: str | None = None) -> list[ThroughputCount]:
        """See :meth:`Ledger.throughput`: ``ceil(window_s / bucket_s)`` buckets ending at
        the ledger clock, two range scans of the window (tasks_created, tasks_finished)."""
        buckets = max(1, math.ceil(window_s / bucket_s - 1e-9))

        def body(tx: Tx) -> list[ThroughputCount]:
            start = tx.now - buckets * bucket_s
            created, finished = tx.rows_many([
                ("throughput_arrivals",
                 {"from_at": start, "to_at": tx.now, "bucket_s": bucket_s, "name": name}),
                ("throughput_completions",
                 {"from_at": start, "to_at": tx.now, "bucket_s": bucket_s, "name": name})])
            came = {int(b): int(n) for b, n in created}
            went = {int(b): int(n) for b, n in finished}
            return [ThroughputCount(start + i * bucket_s, came.get(i, 0), went.get(i, 0))
                    for i in range(buckets)]

        return self.dialect.run(body, write=False)

    # ------------------------------------------------------------------ retention
    # (issue 10: prune; DESIGN §10.2) and the counts rollup behind stats (DESIGN §9)

    def _advance_counts(self) -> None:
        """Move the counts mark to the horizon (every finished task and audit row stamped
        before it is committed), adding what finished or was audited in between to the
        rollup (``finished_counts``, ``audit_counts``). One short write transaction; never
        touches a task row, so no claim or commit waits on it. Serialised with other
        advances and with prune batches by the mark row (PostgreSQL: ``FOR UPDATE``
        against the batches' ``FOR SHARE``; SQLite: the write lock)."""

        def body(tx: Tx) -> None:
            row = tx.one("counts_lock")
            if row is None:
                return
            upto, horizon = float(row[0]), float(row[1])
            if horizon <= upto:  # nothing new (or another advance went further meanwhile)
                return
            tasks, kinds = tx.rows_many([
                ("counts_window_tasks", {"from_at": upto, "to_at": horizon}),
                ("counts_window_audit", {"from_at": upto, "to_at": horizon})])
            tx.batch("counts_add_tasks",
                     [{"name": r[0], "state": r[1], "n": int(r[2])} for r in tasks])
            tx.batch("counts_add_audit", [{"kind": r[0], "n": int(r[1])} for r in kinds])
            tx.execute("counts_set_mark", {"upto": horizon})

        self.dialect.run(body)

    def prune(
        self,
        older_than_s: float,
        *,
        by: str,
        dry_run: bool = False,
        batch_size: int = 500,
        export: Callable[[list[dict[str, Any]]], None] | None = None,
        audit_empty: bool = True,
        pace: float | None = None,
    ) -> PruneReport:
        """See :meth:`Ledger.prune` (DESIGN §10.2).

        Each batch is one transaction: pick up to ``batch_size`` of the oldest finished
        tasks (PostgreSQL ``FOR UPDATE SKIP LOCKED``: rows another transaction holds are
        left for later, so neither a commit nor another prune waits on this one), hand
        their records to ``export``, delete them (terminal ones only), then their steps,
        effects (the idempotency records of their keys go with the task row that
        deduplicates them), late effects and audit rows, and settle the counts rollup.
        Between batches the prune sleeps ``pace`` times as long as the batch took (default:
        1 on a single-writer database, SQLite, so waiting writers get the lock in between;
        0 on PostgreSQL, where nothing waits for it but it shares the server's CPU and
        disk: the worker's background prune passes 1).

        Raises:
            ValueError: ``older_than_s`` below 0 or not finite, ``batch_size`` below 1.
            LedgerError: as any operation (batches committed before stay committed).
            Whatever ``export`` raises (that batch is rolled back).
        """
        if not older_than_s >= 0 or older_than_s == float("inf"):
            raise ValueError(f"older_than_s must be a finite number >= 0, got {older_than_s!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if pace is None:
            pace = 1.0 if self.dialect.single_writer else 0.0
        started = time.monotonic()
        cutoff = self.now() - older_than_s
        if dry_run:
            row = self.dialect.run(lambda tx: tx.one("prune_count", {"cutoff": cutoff}),
                                   write=False)
            n = [int(v) for v in row] if row else [0] * 5
            return PruneReport(older_than_s, cutoff, True, n[0], n[1], n[2], n[3], n[4], 0,
                               0, by, time.monotonic() - started)
        self._advance_counts()
        totals: Counter[str] = Counter()
        while True:
            t0 = time.monotonic()
            try:
                picked, done = self.dialect.run(
                    lambda tx: self._prune_batch(tx, cutoff, batch_size, export))
                totals.update(done)
            except CommitOutcomeUnknown:
                picked = batch_size  # the next batch finds out (deletes are idempotent)
            if picked < batch_size:
                break
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        after: tuple[float, int] = (0.0, 0)  # the walk's position: (at, seq)
        while True:
            t0 = time.monotonic()
            walked, rows = self.dialect.run(functools.partial(
                self._prune_orphans, cutoff=cutoff, after=after, limit=batch_size))
            totals.update(audit=len(rows), batches=1 if rows else 0)
            if walked is None:
                break
            after = walked
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        report = PruneReport(
            older_than_s, cutoff, False, totals["tasks"], totals["steps"], totals["effects"],
            totals["late_effects"], totals["audit"], totals["batches"], totals["exported"],
            by, time.monotonic() - started)
        if audit_empty or report.tasks or report.audit:
            detail = dumps({k: v for k, v in dataclasses.asdict(report).items()
                            if k not in ("by", "dry_run")})
            self.dialect.run(lambda tx: _audit(tx, [
                ("", tx.now, "prune", None, None, None, printable(by), detail)]))
        return report

    def _prune_batch(
        self, tx: Tx, cutoff: float, limit: int,
        export: Callable[[list[dict[str, Any]]], None] | None,
    ) -> tuple[int, Counter[str]]:
        """One prune batch inside ``tx``: how many tasks it picked, and the rows it deleted
        by kind (counted by the caller once the transaction committed)."""
        batch: Counter[str] = Counter()
        picked = [r[0] for r in tx.rows("prune_pick", {"cutoff": cutoff, "limit": limit})]
        if not picked:
            return 0, batch
        mark = tx.one("counts_mark_share")
        upto = float(mark[0]) if mark else 0.0
        exported = 0
        if export is not None:
            records = self._export_records(tx, picked)
            export(records)
            exported = len(records)
        deleted = tx.rows("prune_tasks", {"ids": picked})
        ids = [r[0] for r in deleted]
        if ids:
            batch["steps"] = tx.execute("prune_steps", {"ids": ids})
            batch["effects"] = tx.execute("prune_effects", {"ids": ids})
            batch["late_effects"] = tx.execute("prune_late_effects", {"ids": ids})
            audit_rows = tx.rows("prune_audit", {"ids": ids})
            batch["audit"] = len(audit_rows)
            # The rollup counts tasks finished before the mark: those leave it; audit kinds
            # are counted for ever, so rows since the mark join it as they go.
            gone = Counter((r[1], r[2]) for r in deleted if float(r[3]) < upto)
            tx.batch("counts_add_tasks", [{"name": name, "state": state, "n": -n}
                                          for (name, state), n in sorted(gone.items())])
            self._keep_audit_counts(tx, audit_rows, upto)
        batch.update(tasks=len(ids), batches=1 if ids else 0, exported=exported)
        return len(picked), batch

    def _prune_orphans(
        self, tx: Tx, cutoff: float, after: tuple[float, int], limit: int
    ) -> tuple[tuple[float, int] | None, list[tuple[Any, ...]]]:
        """One step of the walk over audit rows older than ``cutoff`` (after ``after``):
        delete those whose task is gone. Returns where the walk goes on (None: at its end)
        and the deleted ``(kind, at)`` rows."""
        walked = tx.rows("prune_audit_walk", {"cutoff": cutoff, "from_at": after[0],
                                              "from_seq": after[1], "limit": limit})
        if not walked:
            return None, []
        mark = tx.one("counts_mark_share")
        upto = float(mark[0]) if mark else 0.0
        rows = tx.rows("prune_audit_gone", {"seqs": [int(r[0]) for r in walked]})
        self._keep_audit_counts(tx, rows, upto)
        last = walked[-1]
        return ((float(last[2]), int(last[0])) if len(walked) == limit else None), rows

    @staticmethod
    def _unfinish(tx: Tx, rows: Sequence[tuple[str, str, float]]) -> None:
        """Finished tasks ``(name, terminal state, updated_at)`` that an operator move
        re-queues (retry, quarantine replay) leave the finished rollup if it counts them
        (finished before the counts mark, read FOR SHARE so the mark cannot move before
        this transaction commits); DESIGN §9 / §10.2."""
        if not rows:
            return
        mark = tx.one("counts_mark_share")
        upto = float(mark[0]) if mark else 0.0
        gone = Counter((name, state) for name, state, at in rows if at < upto)
        tx.batch("counts_add_tasks", [{"name": name, "state": state, "n": -n}
                                      for (name, state), n in sorted(gone.items())])

    @staticmethod
    def _keep_audit_counts(tx: Tx, rows: Sequence[tuple[Any, ...]], upto: float) -> None:
        """Deleted audit rows ``(kind, at)`` stamped since the mark join ``audit_counts``
        (those before it are counted there already)."""
        kinds = Counter(r[0] for r in rows if float(r[1]) >= upto)
        tx.batch("counts_add_audit", [{"kind": k, "n": n} for k, n in sorted(kinds.items())])

    @staticmethod
    def _export_records(tx: Tx, ids: list[str]) -> list[dict[str, Any]]:
        """One JSON-ready record per task of ``ids`` with its history, stored text as
        stored (``params``, ``result``, step values, effect results and audit details are
        JSON text; SQLite text that was not valid UTF-8 comes with lone surrogates)."""
        steps: dict[str, list[dict[str, Any]]] = {}
        for r in tx.rows("claim_steps", {"ids": ids}):
            steps.setdefault(r[0], []).append(dict(zip(
                ("name", "result", "generation", "committed_at", "seq"), r[1:], strict=True)))
        effects: dict[str, list[dict[str, Any]]] = {}
        for r in tx.rows("claim_effects", {"ids": ids}):
            record = dict(zip(("name", "key", "params_digest", "state", "result",
                               "generation", "attempt", "calls", "via_lookup", "updated_at",
                               "seq"), r[1:], strict=True))
            record["via_lookup"] = bool(record["via_lookup"])
            effects.setdefault(r[0], []).append(record)
        audit: dict[str, list[dict[str, Any]]] = {}
        for r in tx.rows("prune_export_audit", {"ids": ids}):
            audit.setdefault(r[1], []).append(dict(zip(
                ("seq", "at", "kind", "from_state", "to_state", "generation", "holder",
                 "detail"), (r[0], *r[2:]), strict=True)))
        late: dict[str, list[dict[str, Any]]] = {}
        for r in tx.rows("prune_export_late", {"ids": ids}):
            late.setdefault(r[1], []).append(dict(zip(
                ("seq", "effect", "key", "generation", "holder", "at", "outcome", "detail"),
                (r[0], *r[2:]), strict=True)))
        records = []
        for r in sorted(tx.rows("task_get_many", {"ids": ids}), key=lambda r: (r[11], r[0])):
            task = dict(zip(("id", "name", "version", "state", "generation", "attempt",
                             "max_attempts", "holder", "lease_until", "run_at", "created_at",
                             "updated_at", "idempotency_key", "params", "params_digest",
                             "result", "last_error", "error_class", "tenant",
                             "quarantined", "last_traceback"), r,
                            strict=True))
            tid = task["id"]
            records.append({"task": task, "steps": steps.get(tid, []),
                            "effects": effects.get(tid, []), "audit": audit.get(tid, []),
                            "late_effects": late.get(tid, [])})
        return records

    # ------------------------------------------------------------------ late effects

    def record_late_effect(self, late: LateEffect) -> None:
        """See :meth:`Ledger.record_late_effect`."""

        def body(tx: Tx) -> None:
            now = tx.now
            tx.execute("late_effect_insert", {
                "task_id": late.task_id, "effect": late.effect, "key": late.key,
                "generation": late.generation, "holder": late.holder, "now": now,
                "outcome": late.outcome,
                "detail": None if late.detail is None else printable(late.detail[:4000]),
            })
            _audit(tx, [(late.task_id, now, "late_effect", None, None, late.generation,
                         late.holder, dumps({"effect": late.effect, "key": late.key,
                                             "outcome": late.outcome}))])

        self.dialect.run(body)

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects`."""
        if task_id is None:
            rows = self.dialect.run(
                lambda tx: tx.rows("late_effects_all", {"limit": limit}), write=False)
        else:
            rows = self.dialect.run(
                lambda tx: tx.rows("late_effects_task", {"id": task_id, "limit": limit}),
                write=False)
        return [LateEffect(*r) for r in rows]

    # ------------------------------------------------------------------ reconciliation
    # (ratchet reconcile, DESIGN §5): reads of a type's effects and the audit of a run

    def effects_of_type(
        self, name: str, created_from: float | None, limit: int,
        after: tuple[float, str, str] | None = None,
    ) -> list[TaskEffect]:
        """See :meth:`Ledger.effects_of_type` (one read; the tasks by ``tasks_created``,
        their effects by primary key)."""
        params = {
            "name": name, "created_from": created_from, "limit": limit,
            "cursor_at": after[0] if after else None,
            "cursor_id": after[1] if after else None,
            "cursor_name": after[2] if after else None,
        }
        rows = self.dialect.run(lambda tx: tx.rows("effects_of_type", params), write=False)
        return [TaskEffect(r[0], task_state(r[1]), int(r[2]), float(r[3]), effect_record(r[4:]))
                for r in rows]

    def late_effects_of_type(
        self, name: str, since: float | None, limit: int
    ) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects_of_type`."""
        rows = self.dialect.run(lambda tx: tx.rows(
            "late_effects_of_type", {"name": name, "since": since, "limit": limit}),
            write=False)
        return [LateEffect(*r) for r in rows]

    def record_reconcile(
        self, name: str, operator: str, summary_json: str,
        findings: Sequence[tuple[str, str, int | None, str]],
    ) -> None:
        """See :meth:`Ledger.record_reconcile`. Kinds must start with ``reconcile``."""
        for _, kind, _, _ in findings:
            if not kind.startswith("reconcile_"):
                raise InvalidArguments(f"a reconcile finding's audit kind must start with "
                                       f"'reconcile_', got {kind!r}")

        def body(tx: Tx) -> None:
            now = tx.now
            _audit(tx, [(f"reconcile:{name}", now, "reconcile", None, None, None,
                         printable(operator), summary_json)]
                   + [(task_id, now, kind, None, None, generation, printable(operator), detail)
                      for task_id, kind, generation, detail in findings])

        self.dialect.run(body)

    def audit_kind_counts(self) -> dict[str, int]:
        """See :meth:`Ledger.audit_kind_counts` (the counts mark is advanced first, as by
        :meth:`stats`)."""
        self._require_schema("retention.sql", "audit counts")
        with contextlib.suppress(LedgerError):
            self._advance_counts()

        def body(tx: Tx) -> dict[str, int]:
            mark = tx.one("counts_read_mark")
            upto = float(mark[0]) if mark else 0.0
            return {str(k): int(n) for k, n in tx.rows("stats_kinds", {"upto": upto})}

        return self.dialect.run(body, write=False)

    # ------------------------------------------------------------------ wake-ups, registry

    def subscribe(self, on_ready: Callable[[], None]) -> Subscription:
        """See :meth:`Ledger.subscribe` (PostgreSQL: LISTEN/NOTIFY; SQLite: never calls)."""
        return self.dialect.subscribe(on_ready)

    def register_worker(self, info: WorkerInfo) -> None:
        """See :meth:`Ledger.register_worker`."""
        self.dialect.run(lambda tx: tx.execute("worker_register", {
            "holder": info.holder, "host_id": info.host_id, "hostname": info.hostname,
            "pid": info.pid, "pid_start": info.pid_start, "now": tx.now,
        }))

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """See :meth:`Ledger.touch_worker`."""
        self.dialect.run(lambda tx: tx.execute(
            "worker_touch", {"now": tx.now, "state": state, "holder": holder}))

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """See :meth:`Ledger.list_workers`."""
        if host_id is None:
            rows = self.dialect.run(lambda tx: tx.rows("workers_all"), write=False)
        else:
            rows = self.dialect.run(
                lambda tx: tx.rows("workers_on_host", {"host_id": host_id}), write=False)
        return [WorkerInfo(*r) for r in rows]

    def prune_workers(self, older_than_s: float) -> list[str]:
        """See :meth:`Ledger.prune_workers`."""
        definitions = self._has_definitions()

        def body(tx: Tx) -> list[str]:
            cutoff = {"cutoff": tx.now - older_than_s}
            if definitions:
                tx.execute("worker_definitions_prune", cutoff)
            return sorted(str(r[0]) for r in tx.rows("workers_prune", cutoff))

        return self.dialect.run(body)

    # ------------------------------------------------------------------ definitions (DESIGN §8)

    def register_definitions(
        self, holder: str, definitions: Sequence[DefinitionSpec]
    ) -> list[DefinitionChange]:
        """See :meth:`Ledger.register_definitions`."""

        def body(tx: Tx) -> list[DefinitionChange]:
            names = sorted({d.name for d in definitions})
            stored = {(r[0], r[1]): r[2]
                      for r in tx.rows("definitions_of", {"names": names})} if names else {}
            changes: list[DefinitionChange] = []
            audit: list[AuditRow] = []
            for d in sorted(definitions, key=lambda d: (d.name, d.version)):
                old = stored.get((d.name, d.version))
                if old is not None and old != d.spec_json:
                    change = DefinitionChange(d.name, d.version, _spec_differences(
                        old, d.spec_json), old, d.spec_json)
                    changes.append(change)
                    audit.append((f"definition:{d.name}:{d.version}", tx.now,
                                  "definition_changed", None, None, None, holder,
                                  dumps({"name": d.name, "version": d.version,
                                         "differences": list(change.differences),
                                         "old_spec": old, "new_spec": d.spec_json})))
                tx.execute("definition_upsert", {"name": d.name, "version": d.version,
                                                 "spec": d.spec_json, "now": tx.now})
            tx.execute("worker_definitions_clear", {"holder": holder})
            for d in definitions:
                tx.execute("worker_definition_insert",
                           {"holder": holder, "name": d.name, "version": d.version})
            _audit(tx, audit)
            return changes

        return self.dialect.run(body)

    def _require_schema(self, migration: str, what: str) -> None:
        """Raise :class:`~ratchet.errors.SchemaTooOld` unless the ledger has the migration
        whose file name ends ``_<migration>`` (read-only callers never migrate; found by
        file name, so renumbering changes nothing)."""
        if migration in self._schema_has:
            return
        from .migrations import load_migrations

        needed = next((m.version for m in load_migrations(self.config.scheme)
                       if m.name.split("_", 1)[1] == migration), None)
        if needed is not None:
            found = self.schema_version()
            if found < needed:
                raise SchemaTooOld(found, needed, what)
        self._schema_has.add(migration)  # schemas only move up

    def _has_migration(self, migration: str) -> bool:
        """Whether the ledger has the migration whose file name ends ``_<migration>`` (for
        a read that degrades on an older schema instead of failing)."""
        try:
            self._require_schema(migration, "")
        except SchemaTooOld:
            return False
        return True

    def _has_definitions(self) -> bool:
        """Whether this ledger's schema has the definition tables: a read-only caller
        (``ratchet status`` of a newer release) may open a ledger no process of this
        release has migrated yet. Found by the migration's file name, so renumbering
        migrations changes nothing; remembered once true (schemas only move up)."""
        if not self._definitions_ready:
            from .migrations import load_migrations

            needed = next((m.version for m in load_migrations(self.config.scheme)
                           if m.name.split("_", 1)[1] == "definitions.sql"), None)
            self._definitions_ready = needed is not None and self.schema_version() >= needed
        return self._definitions_ready

    def _live(self, tx: Tx, live_within_s: float) -> dict[tuple[str, int], int]:
        return {(r[0], r[1]): r[2]
                for r in tx.rows("live_definitions", {"since": tx.now - live_within_s})}

    def definitions(self, live_within_s: float) -> list[DefinitionRecord]:
        """See :meth:`Ledger.definitions` (none on a ledger not yet migrated to them)."""
        if not self._has_definitions():
            return []

        def body(tx: Tx) -> list[DefinitionRecord]:
            live = self._live(tx, live_within_s)
            return [DefinitionRecord(r[0], r[1], r[2], r[3], r[4], live.get((r[0], r[1]), 0))
                    for r in tx.rows("definitions_all")]

        return self.dialect.run(body, write=False)

    def worker_definition_specs(self) -> list[tuple[str, str]]:
        """See :meth:`Ledger.worker_definition_specs` (the registry is small)."""
        if not self._has_definitions():
            return []
        # Kept as read (an undecodable holder stays equal to its registry row's).
        return [(r[0], r[1]) for r in self.dialect.run(
            lambda tx: tx.rows("worker_definition_specs"), write=False)]

    def version_backlog(self, live_within_s: float) -> list[VersionBacklog]:
        """See :meth:`Ledger.version_backlog` (none on a ledger not yet migrated to the
        definition tables: no worker of this release has run on it)."""
        if not self._has_definitions():
            return []

        def body(tx: Tx) -> list[VersionBacklog]:
            live = self._live(tx, live_within_s)
            return sorted(
                (VersionBacklog(r[0], r[1], r[2], r[3], live.get((r[0], r[1]), 0))
                 for r in tx.rows("ready_by_version")),
                key=lambda b: (b.name, b.version))

        return self.dialect.run(body, write=False)

    def close(self) -> None:
        """See :meth:`Ledger.close`."""
        self.dialect.close()

    # ------------------------------------------------------------------ transaction steps
    # (issue 9: ctx.transaction; the user's writes commit with the step's checkpoint)

    def transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """See :meth:`Ledger.transaction_step`: one transaction of the ledger's database
        that reads the task's fence under lock (PostgreSQL: ``fence_read``'s row lock;
        SQLite: ``BEGIN IMMEDIATE``), runs ``fn`` on a connection of that same transaction
        if the fence holds, writes ``write``'s steps plus the step entry ``fn`` returned
        (the commit's own code path, :class:`_Segment`) and commits.

        A stale write (the generation is not current, or the task is not ``RUNNING``) never
        calls ``fn``: the transaction holds only its ``stale_rejected`` audit row.

        When the reply to ``COMMIT`` is lost (PostgreSQL), ``fn`` is not run again blindly:
        a new transaction locks the fence (waiting for the lost one if its session still
        holds the row), then looks for the step row at this generation; the step row
        commits atomically with the user's writes, so if it is there everything was
        committed (``ok``); if not, nothing was, and the step runs again under the fence.
        """
        if write.transition is not None or write.effects:
            raise ValueError("a transaction step writes steps only (no effect, no transition)")
        slots = self._user_slots
        if slots is None:
            return self._transaction_step(write, fn)
        with slots:
            return self._transaction_step(write, fn)

    def _transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """:meth:`transaction_step` once a connection slot for user code is held."""
        lost: list[tuple[Any, ...]] = []  # the step entry of an attempt whose COMMIT was lost
        try:
            return self.dialect.run(lambda tx: self._transaction_in(tx, write, fn, lost, None))
        except _UserCodeFailed as failed:
            raise failed.error from None
        except CommitOutcomeUnknown:
            if not lost:
                raise
        try:
            return self.dialect.run(
                lambda tx: self._transaction_in(tx, write, fn, [], lost[-1]))
        except _UserCodeFailed as failed:
            raise failed.error from None

    def _transaction_in(
        self, tx: Tx, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]],
        made: list[tuple[Any, ...]], resend: tuple[Any, ...] | None,
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """The transaction step inside ``tx`` (see :meth:`transaction_step`). ``made``
        receives the step entry once ``fn`` returned it; ``resend``: the entry of an
        earlier attempt whose COMMIT reply was lost."""
        row = tx.one("fence_read", {"ids": [write.task_id]})
        now = tx.now
        if resend is not None:
            found = tx.one("transaction_step_read", {"task_id": write.task_id,
                                                     "name": resend[0]})
            if found is not None and found[0] == write.generation:
                # The lost COMMIT went through: the user's writes with it.
                return CommitOutcome(write.task_id, True, False, write.generation), resend
        if row is None or row[1] != State.RUNNING.value or row[2] != write.generation:
            state = task_state(row[1]) if row is not None else None
            generation = row[2] if row is not None else None
            _audit(tx, [(write.task_id, now, "stale_rejected", None, None, write.generation,
                         write.holder,
                         dumps({"operation": printable(write.operation),
                                "current_generation": generation,
                                "current_state": None if state is None
                                else str(state)}))])
            return CommitOutcome(write.task_id, False, True, generation, state), None
        with self.dialect.user_connection(tx) as conn:
            try:
                entry = fn(_GuardedConnection(conn))
            except TransactionMisuse:
                raise
            except Exception as exc:
                raise _UserCodeFailed(exc) from exc
            status = self.dialect.transaction_status(tx)
            if status not in ("open", "lost"):
                raise TransactionMisuse(
                    f"the function of transaction step {write.operation!r} "
                    + ("ended the transaction it was given (COMMIT or ROLLBACK)"
                       if status == "ended" else
                       "caught a failed statement and went on; the transaction is aborted "
                       "(use a savepoint, psycopg's conn.transaction(), to recover from a "
                       "statement's error)")
                    + "; nothing of the step was recorded")
        made.append(entry)
        audit: list[AuditRow] = []
        segment = _Segment()
        segment.add(dataclasses.replace(write, steps=[*write.steps, entry]), row[3], audit, now)
        segment.apply(tx, now, False)
        _audit(tx, audit)
        return CommitOutcome(write.task_id, True, False, write.generation), entry


def _limit(row: Sequence[Any]) -> Limit:
    """A :class:`Limit` from a ``limits`` row."""
    return Limit(LimitScope(row[0]), row[1], int(row[2]),
                 None if row[3] is None else int(row[3]), int(row[4]), float(row[5]),
                 row[6], row[7])


def _limit_audit_id(scope: LimitScope, name: str) -> str:
    """The ``task_id`` of a limit's audit rows (``limit:type:NAME``; ``ratchet limits``
    lists them)."""
    return f"limit:{scope.value}:{name}" if name else f"limit:{scope.value}"


MAX_LIMIT = 2**31 - 1
"""The largest ``reserved`` / ``maximum`` of a concurrency limit (PostgreSQL ``integer``)."""


def _check_limit(scope: LimitScope, name: str, reserved: int, maximum: int | None) -> None:
    """Refuse a limit that cannot be right on its own (InvalidArguments)."""
    if scope is LimitScope.TOTAL:
        if name:
            raise InvalidArguments("the total limit has no name")
        if maximum is None:
            raise InvalidArguments("the total limit needs a maximum (the number of slots)")
        if reserved:
            raise InvalidArguments("the total limit reserves nothing (reserve per type or "
                                   "tenant)")
    elif not name:
        raise InvalidArguments(f"a {scope.value} limit needs the {scope.value}'s name")
    for label, value in (("reserved", reserved), ("maximum", maximum)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidArguments(f"{label} must be an integer, got {value!r}")
        if value is not None and value > MAX_LIMIT:
            raise InvalidArguments(f"{label} must be at most {MAX_LIMIT} (the ledger stores "
                                   f"a 32-bit integer), got {value}")
    if reserved < 0:
        raise InvalidArguments(f"reserved must be >= 0, got {reserved}")
    if maximum is not None and maximum < 1:
        raise InvalidArguments(
            f"maximum must be >= 1, got {maximum} (to stop a type, pause it)")
    if maximum is not None and reserved > maximum:
        raise InvalidArguments(f"reserved ({reserved}) exceeds maximum ({maximum})")
    if maximum is None and not reserved and scope is not LimitScope.TOTAL:
        raise InvalidArguments("a limit needs reserved > 0 or a maximum (to remove one, "
                               "clear it)")


def _check_reservations(limits: dict[tuple[LimitScope, str], Limit]) -> None:
    """With a total, the reservations of the types, and those of the tenants, add up to
    at most the total (InvalidArguments)."""
    total = limits.get((LimitScope.TOTAL, ""))
    if total is None or total.maximum is None:
        return
    for scope in (LimitScope.TYPE, LimitScope.TENANT):
        reserved = sum(lim.reserved for lim in limits.values() if lim.scope is scope)
        if reserved > total.maximum:
            raise InvalidArguments(
                f"the {scope.value} reservations would add up to {reserved}, more than the "
                f"total of {total.maximum} slots")


def _spec_differences(old_json: str, new_json: str) -> tuple[str, ...]:
    """The top-level keys whose values differ between two definition specs (``("spec",)``
    when one of them is not a JSON object)."""
    import json

    try:
        old, new = json.loads(old_json), json.loads(new_json)
    except ValueError:
        return ("spec",)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ("spec",)
    return tuple(sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)))


def _naming(exc: WriteRejected, writes: Sequence[TaskWrite]) -> WriteRejected:
    """``exc`` with the writes of the refused batch named (operation and task, at most 5)."""
    named = ", ".join(f"{printable(w.operation)[:80]!r} of task {w.task_id}" for w in writes[:5])
    more = f" and {len(writes) - 5} more" if len(writes) > 5 else ""
    return WriteRejected(f"{exc} (in the batch: {named}{more})")


def _with_version(stats: LedgerStats, version: int) -> LedgerStats:
    return dataclasses.replace(stats, schema_version=version)


class _Segment:
    """Fenced rows of one commit segment (each task at most once), written set-wise: one
    batch per kind of row, whatever the number of tasks."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str], dict[str, Any]] = {}
        self.intents: dict[tuple[str, str], dict[str, Any]] = {}
        self.outcomes: dict[tuple[str, str], dict[str, Any]] = {}
        self.transitions: list[dict[str, Any]] = []

    def add(self, write: TaskWrite, attempt: int, audit: list[AuditRow], now: float,
            request: str | None = None) -> None:
        """Queue the rows of one fenced write (which passed its fence); ``request``: the
        operator request the task keeps after the write's transition (if any)."""
        for step in write.steps:
            name = step[0]
            self.steps[(write.task_id, name)] = {
                "task_id": write.task_id, "name": name, "result": step[1],
                "generation": write.generation, "seq": step[2] if len(step) > 2 else None}
        for e in write.effects:
            row = {"task_id": write.task_id, "name": e.name, "key": e.key,
                   "digest": e.params_digest, "generation": write.generation,
                   "attempt": attempt, "seq": e.seq}
            if e.state is EffectState.INTENT:
                self.intents[(write.task_id, e.name)] = row
                continue
            row.update(state=e.state.value, result=e.result_json, via_lookup=e.via_lookup)
            self.outcomes[(write.task_id, e.name)] = row
            if e.via_lookup:
                audit.append((write.task_id, now, "lookup_hit", None, None, write.generation,
                              write.holder, dumps({"effect": e.name, "key": e.key})))
        t = write.transition
        if t is not None:
            self.transitions.append(_transition_row(write, t, now, request))

    def apply(self, tx: Tx, now: float, resend: bool) -> None:
        """Write the queued rows in ``tx``."""
        tx.batch("steps_upsert", list(self.steps.values()), now=now)
        tx.batch("effects_intent", list(self.intents.values()), now=now, resend=resend)
        tx.batch("effects_outcome", list(self.outcomes.values()), now=now)
        tx.batch("transition", self.transitions, now=now)


def _transition_row(write: TaskWrite, t: Transition, now: float,
                    request: str | None = None) -> dict[str, Any]:
    """Parameters of the ``transition`` statement for one fenced write. A release (to
    ``PENDING``) and a pause at a boundary (to ``PAUSED``) hand their attempt back;
    ``request``: the operator request the task keeps (``UNKNOWN``, or an open intent)."""
    return {
        "id": write.task_id, "generation": write.generation, "state": t.to.value,
        "run_at": now + max(0.0, t.delay_s) if reschedules(t.to) else None,
        "release": t.to is State.PENDING or t.to is State.PAUSED,
        "keep": t.to is State.RUNNING, "request": request,
        "result": t.result_json, "error": printable(t.error) if t.error else t.error,
        "error_class": t.error_class,
        "traceback": printable(t.traceback) if t.error and t.traceback else None,
    }


_OPERATOR_KINDS = ("operator_resolve", "operator_cancel", "operator_retry", "operator_pause",
                   "operator_resume", "operator_replay", "limit_set", "limit_cleared")
"""Audit kinds of operator commands, every one audited with who and a reason (``ratchet
status``: operator actions): resolve, cancel, retry, pause, resume, quarantine replay,
``limits set`` and ``limits clear``. A prune is not one: workers prune on their own."""

_SCOPES = ("all", "type", "task")


def _scope_text(scope: str, target: str) -> str:
    return {"all": "everything", "type": f"task type {target!r}",
            "task": f"task {target}"}[scope]


def _pause_record(row: Sequence[Any]) -> PauseRecord:
    """A :class:`PauseRecord` from a ``pauses_active`` row."""
    return PauseRecord(int(row[0]), row[1], row[2], int(row[3]), row[4], row[5], row[6])


def _covered(pauses: Sequence[tuple[Any, ...]], task_id: str, name: str,
             skip: int | None = None) -> bool:
    """Is the task ``task_id`` of type ``name`` in the scope of one of ``pauses`` (rows of
    ``pauses_active``: id, scope, target, ...), not counting pause ``skip``?"""
    for p in pauses:
        if p[0] == skip:
            continue
        if p[1] == "all" or (p[1] == "type" and p[2] == name) or (
                p[1] == "task" and p[2] == task_id):
            return True
    return False


_REQUEST_CLASS = {ControlRequest.CANCEL: "cancelled", ControlRequest.PAUSE: "paused"}
"""``error_class`` recorded when an operator request ends a task's run."""


def _gone_facts(row: Sequence[Any], now: float, intent_open: bool, *,
                with_request: bool = True) -> AttemptFacts:
    """The outcome table's facts of a locked RUNNING row whose holder is gone: ``(id,
    holder, generation, attempt, max_attempts, name, control_request, crash_count,
    quarantine_after)`` (the last two absent: no quarantine); this delivery counts as a
    crash."""
    return AttemptFacts(
        Happened.HOLDER_GONE, now=now, attempt=row[3], max_attempts=row[4],
        intent_open=intent_open, request=row[6] if with_request and len(row) > 6 else None,
        streak=int(row[7] or 0) + 1 if len(row) > 7 else 0,
        quarantine_after=row[8] if len(row) > 8 else None)


class _UserCodeFailed(Exception):
    """Internal: the user's function of a transaction step raised ``error``; the dialect
    rolls back (without mapping or retrying it) and the engine re-raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


_FORBIDDEN = frozenset({"commit", "rollback", "close", "executescript", "autocommit",
                        "set_autocommit", "isolation_level", "set_isolation_level",
                        "tpc_begin", "tpc_commit", "tpc_prepare", "tpc_rollback"})
"""Connection attributes a transaction step's function may not use (they would end or
reconfigure the ledger's transaction)."""


class _GuardedConnection:
    """The DB-API connection of a transaction step, minus what would end the transaction.

    Everything is delegated to the real connection (``execute``, ``executemany``,
    ``cursor``, psycopg's ``transaction()`` for a savepoint, ...) except ``commit``,
    ``rollback``, ``close``, ``executescript`` (it commits first), ``autocommit`` /
    ``isolation_level`` and two-phase commit, which raise :class:`TransactionMisuse`, as
    does setting any attribute (it would stay on the ledger's connection); a ``with
    conn:`` block is refused too (on sqlite3 it commits, on psycopg it closes).
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name: str) -> Any:
        if name in _FORBIDDEN:
            raise TransactionMisuse(
                f"a transaction step may not call {name!r} on its connection: Ratchet "
                "commits the step's writes together with its checkpoint (or rolls them back)")
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Any attribute set here would stay on the ledger's own connection (row_factory,
        # text_factory, autocommit...) after the step.
        raise TransactionMisuse(
            f"a transaction step may not set {name!r} on its connection (it is the "
            "ledger's own; set row factories on a cursor instead)")

    def __enter__(self) -> Any:
        raise TransactionMisuse(
            "a transaction step may not use its connection as a context manager (it would "
            "commit or close it); use the connection directly, or a savepoint")

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<transaction step connection {self._conn!r}>"
