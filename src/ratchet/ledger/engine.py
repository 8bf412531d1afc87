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

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..config import LedgerConfig
from ..errors import (
    IdempotencyConflict,
    IllegalTransition,
    InvalidArguments,
    TaskNotFound,
    TransactionMisuse,
    WriteRejected,
)
from ..serde import dumps, printable
from ..states import State, check_transition
from . import bulkheads
from .base import (
    MAX_VERSION,
    AuditEvent,
    Claim,
    ClaimKind,
    CommitOutcome,
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
    RenewResult,
    ResolveOutcome,
    SlotUsage,
    StepRecord,
    SubmitResult,
    Subscription,
    TaskInfo,
    TaskQuery,
    TaskWrite,
    Timeline,
    Transition,
    VersionBacklog,
    WorkerInfo,
    claim_kinds,
)
from .dialect import CommitOutcomeUnknown, Dialect, Tx
from .rows import (
    AuditRow,
    decode_detail,
    effect_record,
    reschedules,
    task_info,
    transition_audit,
)

__all__ = ["LedgerEngine"]

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
        self._definitions_ready = False  # see _has_definitions
        slots = dialect.user_transaction_slots()
        # Transaction steps hold a connection while user code runs: never all of a pool's,
        # so the writer and the heartbeat always get one (a starved heartbeat loses leases).
        self._user_slots = threading.BoundedSemaphore(slots) if slots is not None else None

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
                "tenant": t.tenant,
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
        if self.dialect.probe_before_claim and not self.dialect.probe():
            return []
        return self.dialect.run(lambda tx: self._claim_in(tx, holder, names, limit))

    @staticmethod
    def _claim_reads(names: Sequence[ClaimKind], limit: int) -> list[tuple[str, dict[str, Any]]]:
        """The reads a claim starts with, to send with others: the expired-lease scan of the
        claimed kinds (DESIGN §8 versions) and the concurrency limits (bulkheads, DESIGN §8)."""
        return [("claim_expired", {**claim_kinds(names), "limit": limit}), ("limits_all", {})]

    def _claim_in(
        self, tx: Tx, holder: str, names: Sequence[ClaimKind], limit: int,
        pre: Sequence[list[tuple[Any, ...]]] | None = None,
    ) -> list[Claim]:
        """The claim, inside the caller's write transaction (see :meth:`claim`).
        ``pre``: the rows of :meth:`_claim_reads`, if the caller already read them."""
        if limit <= 0 or not names:
            return []
        kinds = claim_kinds(names)
        if pre is None:
            pre = tx.rows_many(self._claim_reads(names, limit))
        expired, limit_rows = pre
        now = tx.now  # after the first read: BEGIN, clock and scan in one round trip
        audit: list[AuditRow] = []
        exhausted = [row for row in expired if row[3] >= row[4]]
        if exhausted:
            self._retire(tx, exhausted, audit, "lease expired on final attempt")
            expired = [row for row in expired if row[3] < row[4]]
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
                                                limit - len(expired), limits, scopes))
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
            )
            for row in rows
        ]

    def _claim_limited(
        self, tx: Tx, holder: str, now: float, kinds: dict[str, list[Any]], want: int,
        limits: list[Limit], scopes: list[str],
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
        the cap's free slots in all."""
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
        reads: list[tuple[str, dict[str, Any]]] = [("limits_lock", {"scopes": scopes}),
                                                    ("limits_running", {})]
        if ready_types or ready_tenants:
            reads.append(("limits_ready", {"names": ready_types, "tenants": ready_tenants,
                                           "now": now}))
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
    ) -> None:
        """Retire locked RUNNING rows ``(id, holder, generation, attempt, max_attempts, ...)``
        whose holder is gone on the final attempt: ``FAILED``, or ``UNKNOWN`` when an effect
        intent is open (the call may have happened; an operator resolves it)."""
        open_intents: dict[str, tuple[str, str]] = {}
        for task_id, name, key in tx.rows("open_intents", {"ids": [r[0] for r in rows]}):
            open_intents.setdefault(task_id, (name, key))
        batch: list[dict[str, Any]] = []
        for task_id, holder, generation, attempt, max_attempts, *_ in rows:
            intent = open_intents.get(task_id)
            target = State.UNKNOWN if intent else State.FAILED
            check_transition(State.RUNNING, target)
            error = (f"holder {holder} is gone ({reason}) during attempt {attempt} of "
                     f"{max_attempts}")
            if intent:
                error += f"; effect {intent[0]!r} (key {intent[1]!r}) has an open intent"
            batch.append({"id": task_id, "generation": generation, "state": target.value,
                          "error": error})
            audit.append((task_id, tx.now, "transition", State.RUNNING.value, target.value,
                          generation + 1, None,
                          dumps({"reason": reason, "previous_holder": holder, "error": error})))
        tx.batch("retire", batch, now=tx.now)

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

        def body(tx: Tx) -> tuple[list[CommitOutcome], list[Claim]]:
            # The expired-lease scan and the limits travel with the fence read (one round
            # trip).
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
            return outcomes, self._claim_in(tx, holder, names, limit, [still, pre[1]])

        try:
            try:
                return self.dialect.run(body)
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
        fence, *extra = tx.rows_many(
            [("fence_read", {"ids": sorted({w.task_id for w in writes})}), *also])
        current: dict[str, tuple[str, int, int, str]] = {
            r[0]: (r[1], r[2], r[3], r[4]) for r in fence
        }
        now = tx.now  # after the first read: BEGIN, clock and fence in one round trip
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
                state = State(row[0]) if row is not None else None
                generation = row[1] if row is not None else None
                audit.append((write.task_id, now, "stale_rejected", None, None,
                              write.generation, write.holder,
                              dumps({"operation": printable(write.operation),
                                     "current_generation": generation,
                                     "current_state": state.value if state else None})))
                outcomes[index] = CommitOutcome(write.task_id, False, True, generation, state)
                continue
            attempt = row[2]
            segment.add(write, attempt, audit, now)
            if t is not None:
                audit.append(transition_audit(write, t, now))
                # Later writes of this batch for the same task see the new state.
                current[write.task_id] = (t.to.value, row[1], row[2], row[3])
                ready = ready or (reschedules(t.to) and t.delay_s <= 0)
            outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
        segment.apply(tx, now, resend)
        _audit(tx, audit)
        if ready:
            tx.wake()
        return [outcomes[i] for i in range(len(writes))], extra

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
            check_transition(State.UNKNOWN, State.PENDING)
            open_effects = tx.rows("resolve_open_effects", {"id": task_id})
            new_state = (
                EffectState.DONE if outcome is ResolveOutcome.DONE else EffectState.NOT_DONE
            )
            tx.execute("resolve_effects", {
                "state": new_state.value,
                "result": result_json if new_state is EffectState.DONE else None,
                "now": tx.now, "id": task_id,
            })
            tx.execute("resolve_task", {"now": tx.now, "id": task_id, "generation": row[1]})
            _audit(tx, [(
                task_id, tx.now, "operator_resolve", State.UNKNOWN.value, State.PENDING.value,
                row[1], None,
                dumps({"operator": operator, "reason": reason, "outcome": outcome.value,
                       "effects": [{"name": e[0], "key": e[1]} for e in open_effects]}),
            )])
            tx.wake()

        self.dialect.run(body)
        return self.get(task_id)

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""

        def body(tx: Tx) -> list[str]:
            rows = tx.rows("holder_running", {"holder": holder})
            audit: list[AuditRow] = []
            final = [r for r in rows if r[3] >= r[4]]
            retry = [r for r in rows if r[3] < r[4]]
            if final:
                self._retire(tx, final, audit, f"holder revoked by {by}: {reason}")
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
            return [r[0] for r in rows]

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

    def stats(self) -> LedgerStats:
        """See :meth:`Ledger.stats` (decodes no stored JSON)."""

        def body(tx: Tx) -> LedgerStats:
            counts: dict[str, dict[str, int]] = {}
            for name, state, n in tx.rows("stats_counts"):
                counts.setdefault(name, {})[state] = int(n)
            oldest_row = tx.one("stats_oldest", {"now": tx.now})
            oldest = oldest_row[0] if oldest_row else None
            kinds = {k: int(n) for k, n in tx.rows("stats_kinds")}
            unknown_row = tx.one("stats_unknown")
            late_row = tx.one("stats_late")
            return LedgerStats(
                counts=counts,
                oldest_pending_age_s=(tx.now - oldest) if oldest is not None else None,
                unknown_count=int(unknown_row[0]) if unknown_row else 0,
                claims=kinds.get("claim", 0) + kinds.get("takeover", 0),
                takeovers=kinds.get("takeover", 0),
                stale_rejections=kinds.get("stale_rejected", 0),
                lookup_hits=kinds.get("lookup_hit", 0),
                idempotency_conflicts=kinds.get("idempotency_conflict", 0),
                operator_actions=kinds.get("operator_resolve", 0),
                revocations=kinds.get("revoke", 0),
                late_effects=int(late_row[0]) if late_row else 0,
                durability=self.config.durability.value,
                backend_settings=self.dialect.backend_settings(tx),
                schema_version=0,
                ledger_now=tx.now,
            )

        stats = self.dialect.run(body, write=False)
        return _with_version(stats, self.dialect.schema_version())

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
            state = State(row[1]) if row is not None else None
            generation = row[2] if row is not None else None
            _audit(tx, [(write.task_id, now, "stale_rejected", None, None, write.generation,
                         write.holder,
                         dumps({"operation": printable(write.operation),
                                "current_generation": generation,
                                "current_state": state.value if state else None}))])
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

    def add(self, write: TaskWrite, attempt: int, audit: list[AuditRow], now: float) -> None:
        """Queue the rows of one fenced write (which passed its fence)."""
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
            self.transitions.append(_transition_row(write, t, now))

    def apply(self, tx: Tx, now: float, resend: bool) -> None:
        """Write the queued rows in ``tx``."""
        tx.batch("steps_upsert", list(self.steps.values()), now=now)
        tx.batch("effects_intent", list(self.intents.values()), now=now, resend=resend)
        tx.batch("effects_outcome", list(self.outcomes.values()), now=now)
        tx.batch("transition", self.transitions, now=now)


def _transition_row(write: TaskWrite, t: Transition, now: float) -> dict[str, Any]:
    """Parameters of the ``transition`` statement for one fenced write."""
    return {
        "id": write.task_id, "generation": write.generation, "state": t.to.value,
        "run_at": now + max(0.0, t.delay_s) if reschedules(t.to) else None,
        "release": t.to is State.PENDING, "keep": t.to is State.RUNNING,
        "result": t.result_json, "error": printable(t.error) if t.error else t.error,
        "error_class": t.error_class,
    }


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
