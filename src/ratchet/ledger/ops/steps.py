"""Transaction steps (``ctx.transaction``, DESIGN §5): the user's writes commit in the
ledger's own transaction, with the step's checkpoint."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from ...errors import TransactionMisuse
from ...serde import dumps, printable
from ...states import State
from ..base import CommitOutcome, TaskWrite
from ..dialect import CommitOutcomeUnknown, Tx
from ..rows import FENCE_READ, TRANSACTION_STEP_READ, AuditRow, insert_audit, task_state
from .core import EngineCore
from .guarded import GuardedConnection
from .segment import Segment, step_entry

__all__ = ["TransactionSteps"]

StepResult = tuple[CommitOutcome, tuple[Any, ...] | None]
"""The outcome of a transaction step and the step entry it recorded (None if stale)."""


class TransactionSteps:
    """:meth:`Ledger.transaction_step <ratchet.ledger.base.Ledger.transaction_step>`.

    Transaction steps hold a connection while user code runs: never all of a pool's, so
    the writer and the heartbeat always get one (a starved heartbeat loses leases)."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        slots = core.dialect.user_transaction_slots()
        self._slots = threading.BoundedSemaphore(slots) if slots is not None else None

    def transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> StepResult:
        """See :meth:`Ledger.transaction_step`: one transaction of the ledger's database
        that reads the task's fence under lock (PostgreSQL: ``fence_read``'s row lock;
        SQLite: ``BEGIN IMMEDIATE``), runs ``fn`` on a connection of that same transaction
        if the fence holds, writes ``write``'s steps plus the step entry ``fn`` returned
        (the commit's own code path, :class:`~ratchet.ledger.ops.segment.Segment`) and
        commits.

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
        if self._slots is None:
            return self._transaction_step(write, fn)
        with self._slots:
            return self._transaction_step(write, fn)

    def _transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> StepResult:
        """:meth:`transaction_step` once a connection slot for user code is held."""
        lost: list[tuple[Any, ...]] = []  # the step entry of an attempt whose COMMIT was lost
        dialect = self.core.dialect
        try:
            return dialect.run(lambda tx: self._transaction_in(tx, write, fn, lost, None))
        except _UserCodeFailed as failed:
            raise failed.error from None
        except CommitOutcomeUnknown:
            if not lost:
                raise
        try:
            return dialect.run(lambda tx: self._transaction_in(tx, write, fn, [], lost[-1]))
        except _UserCodeFailed as failed:
            raise failed.error from None

    def _transaction_in(
        self, tx: Tx, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]],
        made: list[tuple[Any, ...]], resend: tuple[Any, ...] | None,
    ) -> StepResult:
        """The transaction step inside ``tx`` (see :meth:`transaction_step`). ``made``
        receives the step entry once ``fn`` returned it; ``resend``: the entry of an
        earlier attempt whose COMMIT reply was lost."""
        row = FENCE_READ.first(tx, {"ids": [write.task_id]})
        now = tx.now
        if resend is not None:
            found = TRANSACTION_STEP_READ.first(tx, {
                "task_id": write.task_id,
                "name": step_entry(write.task_id, write.generation, resend)["name"]})
            if found is not None and found.generation == write.generation:
                # The lost COMMIT went through: the user's writes with it.
                return CommitOutcome(write.task_id, True, False, write.generation), resend
        if row is None or row.state != State.RUNNING.value or row.generation != write.generation:
            state = task_state(row.state) if row is not None else None
            generation = row.generation if row is not None else None
            insert_audit(tx, [(write.task_id, now, "stale_rejected", None, None,
                               write.generation, write.holder,
                               dumps({"operation": printable(write.operation),
                                      "current_generation": generation,
                                      "current_state": None if state is None
                                      else str(state)}))])
            return CommitOutcome(write.task_id, False, True, generation, state), None
        dialect = self.core.dialect
        with dialect.user_connection(tx) as conn:
            try:
                entry = fn(GuardedConnection(conn))
            except TransactionMisuse:
                raise
            except Exception as exc:
                raise _UserCodeFailed(exc) from exc
            status = dialect.transaction_status(tx)
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
        segment = Segment()
        segment.add(dataclasses.replace(write, steps=[*write.steps, entry]), row.attempt,
                    audit, now)
        segment.apply(tx, now, False)
        insert_audit(tx, audit)
        return CommitOutcome(write.task_id, True, False, write.generation), entry


class _UserCodeFailed(Exception):
    """Internal: the user's function of a transaction step raised ``error``; the dialect
    rolls back (without mapping or retrying it) and the engine re-raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error
