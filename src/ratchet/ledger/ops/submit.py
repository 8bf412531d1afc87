"""Submit: one multi-row insert per batch, deduplicated per idempotency key (DESIGN §4);
debounced rows collapse into their group's open task (:mod:`.debounce`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import IdempotencyConflict
from ...serde import dumps
from ..base import NewTask, SubmitResult
from ..dialect import CommitOutcomeUnknown, Tx
from ..rows import SUBMIT_EXISTING, SUBMIT_PRESENT, insert_audit
from ..shapes import KeyRow
from .core import EngineCore
from .debounce import submit_debounced
from .flowclaims import DEFAULT_QUEUE
from .guarded import joinable

__all__ = ["Submit", "SubmitConflict", "submit_in"]


class _Conflict(Exception):
    """Internal: roll the submit transaction back (an idempotency conflict)."""

    def __init__(self, conflict: IdempotencyConflict) -> None:
        super().__init__(str(conflict))
        self.conflict = conflict


class Submit:
    """:meth:`Ledger.submit <ratchet.ledger.base.Ledger.submit>` over ``core``'s dialect."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def submit(self, tasks: Sequence[NewTask], connection: Any = None) -> list[SubmitResult]:
        """See :meth:`Ledger.submit`: one multi-row insert per batch, deduplicated per
        idempotency key (``ON CONFLICT DO NOTHING``, then one read of the batch's keys).
        A row with a ``debounce_key`` is inserted, or collapses into the open task of its
        group (:func:`~ratchet.ledger.ops.debounce.submit_debounced`): its result is that
        task's id, ``created`` only for the submit that opened the window.

        All-or-nothing: an :class:`IdempotencyConflict` rolls the whole batch back, then the
        conflict is counted in the audit log in a transaction of its own.

        When the connection is lost during ``COMMIT`` (outcome unknown), the batch is sent
        again: a task id is unique per :class:`NewTask`, so a row with one of the batch's
        ids was written by the lost transaction and is reported ``created``, not inserted
        twice.

        ``connection``: the caller's open transaction to write in (:meth:`Dialect.join
        <ratchet.ledger.dialect.Dialect.join>`); a conflict rolls back only the batch's
        savepoint, and is audited in the caller's transaction (kept if it commits).
        """
        if not tasks:
            return []
        dialect = self.core.dialect
        clock: list[float] = []  # the clock of the lost attempt, if it read one
        try:
            if connection is not None:
                return dialect.join(joinable(connection),
                                    lambda tx: _submit_in(tx, tasks, clock),
                                    what="the task" if len(tasks) == 1 else "the tasks")
            try:
                return dialect.run(lambda tx: _submit_in(tx, tasks, clock))
            except CommitOutcomeUnknown:
                return dialect.run(lambda tx: _submit_in(tx, tasks, [], resend=clock or [None]))
        except _Conflict as stop:
            found = stop.conflict
        detail = dumps({"key": found.key, "existing_digest": found.existing_digest,
                        "new_digest": found.new_digest})
        def audit(tx: Tx) -> None:
            insert_audit(tx, [(found.task_id, tx.now, "idempotency_conflict", None, None,
                               None, None, detail)])

        if connection is not None:
            # In the caller's transaction too: on SQLite a transaction of our own would
            # wait for the write lock that transaction holds.
            dialect.join(connection, audit)
        else:
            dialect.run(audit)
        raise found


def _submit_in(
    tx: Tx, tasks: Sequence[NewTask], clock: list[float],
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
        present = {r.id for r in SUBMIT_PRESENT.all(tx, {
            "ids": [t.task_id for t in tasks if t.idempotency_key is None]})}
    rows = [
        {
            "id": t.task_id, "name": t.name, "version": t.version, "params": t.params_json,
            "digest": t.params_digest, "key": t.idempotency_key,
            "max_attempts": t.max_attempts, "lease_s": t.lease_s,
            "run_at": t.run_at_epoch_s, "delay": max(0.0, t.delay_s),
            "quarantine_after": t.quarantine_after,
            "tenant": t.tenant, "trace": t.trace_context, "parent": t.parent_id,
            "queue": t.queue, "priority": t.priority, "fair_key": t.fair_key,
            "ckey": t.ckey, "ckey_max": t.ckey_max, "rate_key": t.rate_key,
            "debounce_key": t.debounce_key, "debounce_max_s": t.debounce_max_s,
        }
        for t in tasks
        if t.task_id not in present
    ]
    plain = [r for r in rows if r["debounce_key"] is None]
    # Key order: two batches sharing keys take their locks in the same order.
    plain.sort(key=lambda r: (r["key"] is None, r["key"] or ""))
    tx.batch("submit_insert", plain)
    debounced = submit_debounced(tx, [r for r in rows if r["debounce_key"] is not None])
    # The (name, queue) pairs a claim walks (PostgreSQL); the default queue is walked for
    # every name whatever the table holds (flowclaims.entries_of), so it is not written.
    tx.batch("submit_queues", [{"name": n, "queue": q}
                               for n, q in sorted({(r["name"], r["queue"]) for r in rows})
                               if q != DEFAULT_QUEUE])
    keyed = sorted({(r["name"], r["ckey"], r["ckey_max"]) for r in rows
                    if r["ckey"] is not None})
    if keyed:
        # Admitted now if the key has a free slot: oldest waiter first, this batch's
        # rows included (ledger/migrations, schema 15).
        tx.batch("key_fill", [{"name": n, "key": k, "max": m} for n, k, m in keyed])
    keys = sorted({t.idempotency_key for t in tasks if t.idempotency_key is not None})
    existing: dict[str, KeyRow] = {}
    if keys:
        existing = {r.key: r for r in SUBMIT_EXISTING.all(tx, {"keys": keys})}
    results: list[SubmitResult] = []
    for t in tasks:
        if t.task_id in debounced:
            results.append(debounced[t.task_id])
            continue
        if t.idempotency_key is None:
            results.append(SubmitResult(t.task_id, created=True))
            continue
        found = existing[t.idempotency_key]
        now = tx.now
        if not clock:
            clock.append(now)
        # Written by this transaction: our id, stamped with this transaction's clock (a
        # re-submission of the same NewTask finds its older row: created=False).
        if found.id == t.task_id and (found.created_at == now or found.created_at in resend):
            results.append(SubmitResult(found.id, created=True))
        elif found.params_digest != t.params_digest:
            raise _Conflict(IdempotencyConflict(
                t.idempotency_key, found.params_digest, t.params_digest, found.id))
        else:
            results.append(SubmitResult(found.id, created=False))
    if any(r.created for r in results) and any(
        t.run_at_epoch_s is None and t.delay_s <= 0 for t in tasks
    ):
        tx.wake()
    return results


SubmitConflict = _Conflict
"""Raised by :func:`submit_in` on an idempotency conflict: it leaves the transaction (rolled
back); its ``conflict`` is the :class:`IdempotencyConflict`."""


def submit_in(tx: Tx, tasks: Sequence[NewTask]) -> list[SubmitResult]:
    """Submit ``tasks`` inside ``tx``, a transaction of another operation (a scheduler pass
    submits its ticks with the compare-and-set of its cursors): deduplicated per
    idempotency key as :meth:`Submit.submit` does.

    Raises:
        SubmitConflict: a key was used before with other params (``tx`` must roll back).
    """
    return _submit_in(tx, tasks, [])
