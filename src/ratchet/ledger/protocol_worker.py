"""The ledger as an application and its workers call it (:class:`WorkerLedger`): submit,
claim, renew, the fenced commits, transaction steps, operator requests to a holder, the
worker registry and fast takeover."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..outbox import NewMessage
from .protocol_handle import LedgerHandle, Subscription
from .records_batches import BatchRun
from .records_claims import Claim, ClaimKind, ClaimScope, CommitOutcome, RenewResult, TaskWrite
from .records_registry import DefinitionChange, DefinitionSpec, WorkerInfo
from .records_schedules import ScheduleFired, SchedulePlanner, ScheduleRecord, ScheduleSpec
from .records_tasks import EffectRecord, LateEffect, NewTask, SubmitResult
from .records_waits import EventReceipt

__all__ = ["WorkerLedger"]


@runtime_checkable
class WorkerLedger(LedgerHandle, Protocol):
    """The calls of :class:`ratchet.App` (submit) and of a worker (claims, leases, fenced
    writes, the registry). Each is one transaction; every write on behalf of a task carries
    its fencing generation (DESIGN §4)."""

    def submit(self, tasks: Sequence[NewTask], connection: Any = None) -> list[SubmitResult]:
        """Insert tasks, deduplicated per idempotency key, all-or-nothing.

        ``connection``: write them inside the caller's own open transaction on that
        connection (a ``sqlite3.Connection`` on the ledger's file, a psycopg 3 connection
        on the ledger's database), under a savepoint: they exist if and only if the
        caller commits (:meth:`Dialect.join <ratchet.ledger.dialect.Dialect.join>`, whose
        errors it raises too). None: a transaction of its own.

        Same key + same digest returns the existing id (``created=False``), writing nothing.
        A task with a ``debounce_key`` collapses into the open (not yet claimed) task of
        its group instead: that task takes its params and later start, and its id is
        returned with ``created=False`` (``True`` for the submit that opened the window).

        Raises:
            IdempotencyConflict: a key exists with another digest (nothing is written;
                the conflict is counted in the audit log).
            WriteRejected: the database refused a row for its content (nothing is written).
        """
        ...

    def emit(self, messages: Sequence[NewMessage], connection: Any = None) -> None:
        """Write outbox messages (DESIGN §6, row 10) in a transaction of their own, or in
        the caller's on ``connection`` (as :meth:`submit`). A message id already written
        is kept, not written twice.

        Raises:
            WriteRejected: the database refused a row for its content.
        """
        ...

    def send_event(self, name: str, key: str, payload_json: str, event_id: str | None = None,
                   by: str | None = None) -> EventReceipt:
        """Store an event in the mailbox and deliver it to every task ``WAITING`` on
        ``(name, key)`` (DESIGN §3, waits), in one transaction, audited. ``payload_json``:
        the payload as canonical JSON text; ``event_id``: the event's identity (None: a
        new one; the same id again is the same event: ``duplicate=True``, nothing
        delivered); ``by``: who sent it (audit).

        Raises:
            InvalidArguments: ``event_id`` was already used for another name, key or
                payload.
        """
        ...

    def batch_open(self, task_id: str, run: str
                   ) -> tuple[BatchRun | None, dict[str, EffectRecord]]:
        """Where a ``ctx.batches`` run of the task stands (DESIGN §6 row 9): the run (None
        before its first committed batch) and the effects made by its batches at or past
        the watermark, by stored name (the only ones a resume can meet again; a claim does
        not load batch effects). Read only, one transaction."""
        ...

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int,
              scope: ClaimScope | None = None) -> list[Claim]:
        """Lease up to ``limit`` ready tasks (or expired leases) of the given kinds: a
        ``(name, version)`` pair claims only tasks that pinned that version (DESIGN §8), a
        bare name every version of it (:data:`ClaimKind`). ``scope``: the queues served
        (None: every queue) and the fair types (:class:`ClaimScope`; flow control, DESIGN
        §8): ready tasks go by priority, then ``run_at``; a rate-limited type's task whose
        bucket is empty is not claimed and waits for a token.

        Each claim sets ``holder``, ``lease_until = ledger_now + lease_s`` and
        ``generation + 1`` in one transaction, with an audit row per task.
        """
        ...

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """Extend every ``(task_id, generation)`` lease that ``holder`` still holds.

        A lease renews only if the task is RUNNING at that generation for that holder and
        ``lease_until`` has not passed by the ledger clock. The holder's registry heartbeat
        (``workers.last_seen``) moves to ledger-now in the same transaction. A lease whose
        task row another transaction holds locked (PostgreSQL: a transaction step running
        its user code) is not waited for: it is reported ``ok`` at its current, unextended
        ``lease_until``, and the next renewal extends it.
        """
        ...

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """Commit several tasks' steps, effects and transitions in one transaction.

        Each task's writes are fenced on its generation; a stale task's writes change
        nothing and are audited (``stale_rejected``) without affecting the other tasks.
        When the reply to ``COMMIT`` is lost, the writes are re-sent once; what the lost
        transaction applied is acknowledged (``ok``), not reported stale.

        Raises:
            IllegalTransition: a transition is not in the table (nothing is written).
            WriteRejected: the database refused a write of the batch for its content (a
                value over an index row's limit, ...). Raised for the whole call and
                nothing is written; the message names the statement and the batch's
                writes. A caller isolates the bad write by committing the writes one by
                one (the worker's writer does).
            LedgerUnavailable: the ledger cannot be reached.
        """
        ...

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[ClaimKind], limit: int,
        scope: ClaimScope | None = None,
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """:meth:`commit` then :meth:`claim` in one transaction: a worker whose tasks just
        finished claims their successors with the same fsync. Same fencing and errors."""
        ...

    def transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """Run ``fn`` inside one fenced transaction of the ledger's own database and commit
        its writes together with a step checkpoint (``ctx.transaction``, DESIGN §5).

        In one transaction: read the task's fence under lock (PostgreSQL: the task row's
        lock; SQLite: the write lock of ``BEGIN IMMEDIATE``); if ``write.generation`` is
        not current or the task is not ``RUNNING``, write only the ``stale_rejected`` audit
        row and return the stale outcome without calling ``fn``. Otherwise call
        ``fn(conn)``, where ``conn`` is the DB-API connection of that same transaction
        (``sqlite3.Connection`` / ``psycopg.Connection``, behind a guard that refuses
        ``commit``, ``rollback``, ``close`` and ``with conn:``), then write ``write.steps``
        plus the step entry ``fn`` returns (shaped like an item of ``TaskWrite.steps``) and
        commit: the user's writes and the checkpoint commit together or not at all.

        ``fn`` may be called again (never twice with both calls committed) when the
        database rolled a transaction back for its own reasons (a deadlock, a connection
        lost before ``COMMIT``) and after a lost ``COMMIT`` reply whose transaction turned
        out not to have committed (decided by the step row at this generation). Its
        ``conn`` sees the database's default ``search_path`` on PostgreSQL. While ``fn``
        runs, SQLite's single write lock is held (every other writer waits) and PostgreSQL
        holds the task row's lock and ends a session idle longer than the ledger's
        ``idle_in_transaction_session_timeout`` (3 s), rolling it back.

        Args:
            write: the fence (``task_id``, ``generation``, ``holder``, ``operation``) and
                pipelined steps to carry; no effects, no transition.
            fn: the user's code, ``fn(conn) -> step entry``.

        Returns:
            ``(outcome, entry)``: ``entry`` is what ``fn`` returned, None when stale.

        Raises:
            ValueError: ``write`` has effects or a transition.
            TransactionMisuse: ``fn`` ended the transaction, or left it aborted (nothing
                was recorded; a permanent failure).
            Exception: what ``fn`` raised, unchanged (everything was rolled back).
            WriteRejected, LedgerUnavailable: as :meth:`commit`.
        """
        ...

    def control_requests(self, holder: str) -> list[tuple[str, int, str]]:
        """``(task_id, generation, request)`` of every ``RUNNING`` task ``holder`` holds
        that carries an operator request (a read; the heartbeat polls it)."""
        ...

    def register_definitions(
        self, holder: str, definitions: Sequence[DefinitionSpec]
    ) -> list[DefinitionChange]:
        """Record the definitions a starting worker has (DESIGN §8), in one transaction:
        each (name, version) is inserted or its ``last_registered_at`` moved to ledger-now,
        and ``holder``'s set of (name, version) pairs is replaced by these.

        A (name, version) stored with a *different* spec is replaced by the new one (the
        newest registration wins), audited (``definition_changed``, task id
        ``definition:NAME:VERSION``, with both specs) and returned, so the worker logs a
        warning naming the differences. Nothing is refused: a changed retry policy or
        lease under the same version is an operator's decision; a changed params schema
        should come with a new version.

        Returns:
            The changes, one per (name, version) whose spec differed.
        """
        ...

    def rate_take(self, task_id: str, generation: int, name: str, key: str, per_s: float,
                  burst: int) -> float:
        """Take one token of downstream ``name``'s bucket ``key`` (``per_s`` tokens a
        second, at most ``burst``; a bucket never used is full) for an effect call of the
        task, in one short transaction, fenced on ``generation``. Returns 0.0 when taken,
        else the seconds until the bucket holds a token (nothing written).

        Raises:
            StaleGeneration: the task is not RUNNING under ``generation``.
        """
        ...

    def record_late_effect(self, late: LateEffect) -> None:
        """Append ``late`` (its ``seq`` and ``at`` are set by the ledger) and a
        ``late_effect`` audit row, in one transaction. Unfenced: a stale holder's evidence
        is always kept.

        Raises:
            LedgerUnavailable: the ledger cannot be reached.
        """
        ...

    def subscribe(self, on_ready: Callable[[], None], channel: str = "ready") -> Subscription:
        """Call ``on_ready()`` (from another thread) when a task may have become ready
        (``channel="ready"``) or outbox rows were committed (``"outbox"``: relays).

        A hint only: callers still claim, and still poll as the fallback. PostgreSQL uses
        LISTEN/NOTIFY; SQLite has no server to notify and returns a subscription that never
        calls back.
        """
        ...

    def register_worker(self, info: WorkerInfo) -> None:
        """Record a worker process in the registry (``state = alive``, ``last_seen = now``)."""
        ...

    def record_worker_slots(self, holder: str, slots: int,
                            queues: Sequence[str] | None = None) -> None:
        """Record worker ``holder``'s slots (its concurrency, task threads) and the queues
        it serves (None: every queue) for ``ratchet status``
        (:meth:`~OperatorLedger.live_worker_slots`): its registry row's ``slots`` and
        ``queues`` (call after :meth:`register_worker`)."""
        ...

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """Registry heartbeat: set ``last_seen = now`` and ``state`` (``stopped`` on a clean
        exit). A worker already marked ``dead`` stays dead."""
        ...

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """Live workers registered with ``host_id``, or every registered worker if None."""
        ...

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """Take every lease ``holder`` holds away from it, authoritatively.

        One transaction: each RUNNING task of ``holder`` gets ``generation + 1`` and becomes
        ``RETRY_WAIT`` ready now (the crashed run counts as an attempt), or is retired like an
        expired final attempt (``FAILED``, or ``UNKNOWN`` with an open effect intent); an
        audit row ``revoke`` per task; the worker is marked ``dead``. Whatever the holder
        still writes is fenced out. Only a worker that has *seen* the holder's process gone
        on the same host calls this (DESIGN: fast takeover); elsewhere leases expire.

        Returns:
            the ids of the tasks taken away.
        """
        ...

    # ---------------------------------------------------------------- schedules

    def register_schedules(self, holder: str,
                           specs: Sequence[ScheduleSpec]) -> list[ScheduleRecord]:
        """Record the periodic schedules a starting scheduler has, in one transaction: a new
        name is inserted with its cursor at ledger-now (whole seconds; no earlier tick
        fires), a known one gets the new task, spec, time zone and grace and keeps its
        cursor and counts; ``registered_at`` / ``seen_at`` become ledger-now, ``holder``
        the worker id that did it.

        Returns:
            Every stored schedule after the registration, by name (the caller logs those
            its code lacks).

        Raises:
            SchemaTooOld: the ledger has no schedules table (run ``ratchet migrate``).
        """
        ...

    def fire_schedules(self, holder: str, names: Sequence[str],
                       plan: SchedulePlanner) -> ScheduleFired:
        """One scheduler pass over the schedules ``names``, in one transaction: read their
        rows (PostgreSQL: locked, skipping rows another pass holds), call
        ``plan(ledger_now_s, rows)``, move each planned cursor by a compare-and-set from
        the cursor read (``UPDATE ... RETURNING``: the rows that moved are read back, never
        counted), and submit the planned tasks of the schedules whose cursor moved,
        deduplicated per idempotency key. A tick whose key another submit used with other
        params is recorded as missed (reason says so) instead of failing the pass.

        Returns:
            The rows after the pass, the names advanced and lost, and the submitted tasks.

        Raises:
            SchemaTooOld: the ledger has no schedules table.
            LedgerUnavailable: the ledger cannot be reached (the next pass decides again).
        """
        ...

    def schedules_seen(self, holder: str, names: Sequence[str]) -> None:
        """Mark the schedules ``names`` as seen now by ``holder``'s running scheduler."""
        ...
