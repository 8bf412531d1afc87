"""The ledger as operators and their tools call it (:class:`OperatorLedger`): reads of tasks,
timelines and aggregates, the audited operator actions (resolve, cancel, retry, pause,
resume, quarantine replay, limits) and reconciliation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .protocol_handle import LedgerHandle
from .records_batches import BatchActivity, BatchRun
from .records_flow import FlowCount, RateLimitSetting
from .records_fork import ForkLinks, ForkRecord
from .records_ops import (
    ControlOutcome,
    Limit,
    LimitScope,
    PauseRecord,
    PauseResult,
    QuarantineGroup,
    ReplayedTask,
    ResolveOutcome,
    SlotUsage,
)
from .records_outbox import OutboxMessage, OutboxStats
from .records_registry import DefinitionRecord, VersionBacklog, WorkerSlots
from .records_schedules import ScheduleRecord
from .records_stats import LedgerStats, ThroughputCount
from .records_tasks import AuditEvent, LateEffect, TaskEffect, TaskInfo, TaskQuery, Timeline
from .records_waits import WaitInfo

__all__ = ["OperatorLedger"]


@runtime_checkable
class OperatorLedger(LedgerHandle, Protocol):
    """The calls of :class:`ratchet.control.Control` and of the operator tools (reads,
    audited actions with ``operator`` and ``reason``, reconciliation; DESIGN §3
    arbitration, §7, §8)."""

    def get(self, task_id: str) -> TaskInfo:
        """Read one task. Raises :class:`~ratchet.errors.TaskNotFound`."""
        ...

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """Read several tasks (missing ids are skipped)."""
        ...

    def list_tasks(self, query: TaskQuery) -> list[TaskInfo]:
        """Tasks matching ``query``, newest first (``created_at``, then id, descending), at
        most ``query.limit``; the next page starts after the last one returned."""
        ...

    def timeline(self, task_id: str) -> Timeline:
        """The task, its audit events, steps and effects. Raises ``TaskNotFound``."""
        ...

    def stats(self, window_s: float | None = None) -> LedgerStats:
        """Aggregates for ``ratchet status``; with ``window_s`` (seconds > 0) also the
        per-type :attr:`LedgerStats.capacity` over that window, in the same transaction."""
        ...

    def throughput(self, window_s: float, bucket_s: float,
                   name: str | None = None) -> list[ThroughputCount]:
        """Arrivals and completions per ``bucket_s`` seconds over the last ``window_s``
        seconds of the ledger clock (rounded up to whole buckets, the last one ending
        now), oldest first, every bucket present; ``name``: one task type only. Reads the
        window's rows only (``tasks_created``, ``tasks_finished``)."""
        ...

    def resolve(
        self,
        task_id: str,
        outcome: ResolveOutcome,
        reason: str,
        operator: str,
        result_json: str | None = None,
    ) -> TaskInfo:
        """Settle an ``UNKNOWN`` task's open effect and make the task ready again (audited).

        Raises:
            TaskNotFound: no such task.
            IllegalTransition: the task is not ``UNKNOWN``.
        """
        ...

    def cancel(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """Cancel a task, audited (``operator``, ``reason``, ledger time), one transaction.

        ``PENDING`` / ``RETRY_WAIT`` / ``PAUSED`` without an open effect intent:
        ``CANCELLED`` at once, ``generation + 1`` (an older holder's write never applies).
        ``RUNNING``: a ``cancel`` request is recorded (``outcome="requested"``) and the
        holder applies it at its next boundary (fenced); a lease already expired without
        an open intent is cancelled at once. With an open effect intent (any state but a
        terminal one) or ``UNKNOWN``: the request is recorded and applied once the
        intent is settled (by the next holder's lookup, or by ``resolve``). A terminal task
        is unchanged (``outcome="unchanged"``).

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def retry(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """Run a ``FAILED`` (dead-lettered) task again, audited: ``FAILED -> PENDING``, the
        only move out of ``FAILED`` (an operator move, DESIGN §3), with the attempt counter
        reset (a fresh set of ``max_attempts``), generation + 1, ready now. Its history is
        kept: audit, steps (done steps stay done), effects. Any other state is unchanged
        (``outcome="unchanged"``).

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def compensate(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """Undo a ``FAILED`` task's completed effects, audited: ``FAILED -> COMPENSATING``
        (an operator move, DESIGN §3), generation + 1, a fresh set of attempts, due now;
        the next claim's holder runs the compensations registered with ``ctx.effect(...,
        compensate=...)`` in reverse order, then the task is ``COMPENSATED`` (DESIGN §5).
        Any other state is unchanged (``outcome="unchanged"``).

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def fork(self, task_id: str, from_step: str, new_task_id: str, version: int | None,
             reason: str, operator: str, known_versions: Sequence[int] = ()) -> ForkRecord:
        """Make the task ``new_task_id`` from ``task_id``'s history up to, not including,
        its checkpoint stored as ``from_step`` (DESIGN §8, fork), audited ``forked`` on
        both tasks with operator and reason, in one transaction.

        The new task has the source's name, params, queue, priority, tenant, attempts and
        lease; it pins ``version`` (None: the source's), is ``PENDING`` (``WAITING`` for
        its concurrency key slot when it has one) with no attempt spent, and its
        generation is the source's + 1. Its steps and effects are copies of the source's
        at positions below the fork point, in the state they were in; the source is not
        changed. The link is a ``forks`` row (:meth:`fork_links`).

        Args:
            task_id: the source; it must have ended ``SUCCEEDED``, ``FAILED`` or
                ``CANCELLED``.
            from_step: a stored checkpoint name of the source (``name``: its first
                occurrence, ``name#N``: the N-th; a step or an effect; an emit is the step
                ``ratchet:emit:<topic>``), or ``FORK_AT_END`` (``"ratchet:end"``: after the
                last recorded checkpoint, where a step that failed starts).
            new_task_id: the id of the new task.
            version: the definition version the fork pins, or None for the source's.
            known_versions: versions of the source's name the caller's app defines,
                accepted besides those a worker registered in ``definitions``.

        Returns:
            the link (:class:`~ratchet.ledger.base.ForkRecord`).

        Raises:
            TaskNotFound: no such task.
            InvalidArguments: the source has not ended (or was compensated), no
                checkpoint ``from_step`` (the message lists the recorded ones, in order),
                an unknown or malformed version.
            SchemaTooOld: the ledger has no ``forks`` table (below schema 17).
        """
        ...

    def fork_links(self, task_id: str) -> ForkLinks:
        """The fork that made ``task_id`` and the forks made from it, oldest first (empty
        on a ledger below schema 17; no error for an unknown task)."""
        ...

    def children(self, task_id: str) -> list[TaskInfo]:
        """The tasks ``task_id`` submitted from its body (``ctx.submit``), oldest first.

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def batch_runs(self, task_ids: Sequence[str]) -> list[BatchRun]:
        """The ``ctx.batches`` runs of the tasks (watermark, committed batches above it,
        item counts), by task then run; tasks without one are left out."""
        ...

    def batch_activity(self) -> list[BatchActivity]:
        """Per task type, the unfinished ``ctx.batches`` runs of tasks not ended: how
        many, their summed watermarks and processed items (metrics)."""
        ...

    def waits(self, task_ids: Sequence[str]) -> list[WaitInfo]:
        """What each task waits for (:class:`~ratchet.ledger.base.WaitInfo`: its kind is
        None unless it is ``WAITING``) and its parent; tasks not found are left out."""
        ...

    def pause(self, scope: str, target: str, reason: str, operator: str) -> PauseResult:
        """Pause everything (``scope="all"``, ``target=""``), a task type (``"type"``) or
        one task (``"task"``), audited (``operator_pause``), one transaction.

        From the commit on, no new attempt starts in the scope (every claim reads the
        active pauses under a gate this transaction takes: PostgreSQL's advisory lock,
        SQLite's write lock). Running tasks in scope are asked to stop at their next
        boundary (they become ``PAUSED``, attempt handed back); one ``PENDING`` or
        ``RETRY_WAIT`` task is ``PAUSED`` at once (generation + 1); one ``UNKNOWN`` task
        keeps its state with the request recorded, applied by its resolution (``PAUSED``;
        ``FAILED`` on give-up). A scope already paused is ``unchanged``.

        Raises:
            InvalidArguments: unknown scope. TaskNotFound: no such task (``"task"``).
        """
        ...

    def resume(self, scope: str, target: str, reason: str, operator: str,
               rate_per_s: float | None = None) -> PauseResult:
        """End the active pause of ``scope`` / ``target`` (audited, ``operator_resume``):
        its ``PAUSED`` tasks not covered by another active pause go back to ``PENDING``,
        ready at ``now + i / rate_per_s`` for the i-th (all at once when None); pending
        pause requests of the scope are cleared. Nothing active: ``unchanged``."""
        ...

    def pauses(self) -> list[PauseRecord]:
        """The active pauses, oldest first, each with the RUNNING tasks in its scope."""
        ...

    def quarantine_groups(self, limit: int = 100, per_group: int = 5) -> list[QuarantineGroup]:
        """Quarantined ``FAILED`` tasks grouped by (fingerprint, task type), the most
        recently quarantined group first; at most ``limit`` groups, ``per_group`` sample
        task ids each (DESIGN §7)."""
        ...

    def quarantine_replay(
        self, fingerprint: str, rate_per_s: float, operator: str, reason: str,
        dry_run: bool = False, limit: int = 10_000,
    ) -> list[ReplayedTask]:
        """Re-queue the quarantined ``FAILED`` tasks with ``fingerprint`` (oldest
        quarantine first, at most ``limit``): one transaction; each becomes ``PENDING``
        with fresh attempt counters (attempt, failure streak and crash count 0; generation
        and history kept), the i-th at ``now + i / rate_per_s``, with an
        ``operator_replay`` audit row (operator, reason, fingerprint, run_at). A dry run
        writes nothing and returns what would be replayed."""
        ...

    def limits(self) -> list[Limit]:
        """Every concurrency limit in the ledger (DESIGN §8), ordered by scope and name."""
        ...

    def set_limit(
        self, scope: LimitScope, name: str, reserved: int, maximum: int | None,
        operator: str, reason: str,
    ) -> Limit:
        """Create or replace one limit, audited (``limit_set``) in the same transaction.
        The next claim of every worker obeys it (the ledger is the only copy).

        Raises:
            InvalidArguments: the limit is inconsistent (reserved > maximum, the reserved
                slots of one kind of scope would exceed the total, ...).
        """
        ...

    def clear_limit(self, scope: LimitScope, name: str, operator: str, reason: str) -> Limit:
        """Remove one limit (audited, ``limit_cleared``); returns the removed row.

        Raises:
            InvalidArguments: there is no such limit.
        """
        ...

    def limit_changes(self, limit: int = 20) -> list[AuditEvent]:
        """The latest ``limit_set`` / ``limit_cleared`` audit events, newest first (their
        ``task_id`` is ``limit:SCOPE[:NAME]``; the detail holds operator, reason, old and
        new values)."""
        ...

    def slot_usage(self) -> SlotUsage:
        """RUNNING and ready task counts per ``(name, tenant)`` (read-only)."""
        ...

    def rate_limits(self) -> list[RateLimitSetting]:
        """Every rate limit in the ledger (DESIGN §8, flow control), the code's and the
        operators', ordered by scope and name (none on a ledger before flow control)."""
        ...

    def rate_held(self) -> dict[str, int]:
        """Tasks a rate limit holds back now, per task type: ``PENDING`` / ``RETRY_WAIT``
        with ``flow_wait = 'rate'`` and a ``run_at`` still to come (read-only)."""
        ...

    def flow_counts(self) -> list[FlowCount]:
        """Live tasks (ready or scheduled, running, parked) per type, queue, state and
        flow wait, from their indexes, never the history (read-only; none on a ledger
        before flow control)."""
        ...

    def set_rate_limit(self, name: str, per_s: float, burst: int, key_param: str | None,
                       operator: str, reason: str) -> RateLimitSetting:
        """Set an operator's rate limit of task type ``name`` (``per_s`` tasks a second,
        buckets of ``burst``, per value of parameter ``key_param`` or the key the code
        computes), replacing the code's until cleared; audited (``rate_limit_set``, task id
        ``limit:rate:NAME``, old and new values) in the same transaction. The next claims
        obey it.

        Raises:
            InvalidArguments: a rate not above 0 or above the highest, a burst below 1 or
                above 2**31 - 1, a name or key parameter that cannot be stored.
            SchemaTooOld: the ledger has no rate limits yet (migrate it).
        """
        ...

    def clear_rate_limit(self, name: str, operator: str, reason: str) -> RateLimitSetting:
        """Remove the operator's rate limit of task type ``name`` (audited,
        ``rate_limit_cleared``) and return it; the limit the type's newest registered
        definition declares, if any, applies again at once.

        Raises:
            InvalidArguments: the type has no operator's rate limit (a code row is not
                cleared: the message says so).
            SchemaTooOld: the ledger has no rate limits yet.
        """
        ...

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffect]:
        """Late effects, newest first: of ``task_id``, or of every task (at most ``limit``)."""
        ...

    def effects_of_type(
        self, name: str, created_from: float | None, limit: int,
        after: tuple[float, str, str] | None = None,
    ) -> list[TaskEffect]:
        """The effect records of tasks of type ``name`` submitted at or after
        ``created_from`` (None: any time), newest task first and by effect name within a
        task, at most ``limit``; ``after`` is the ``(task_created_at, task_id, effect
        name)`` of the last row of the previous page (keyset pagination)."""
        ...

    def late_effects_of_type(
        self, name: str, since: float | None, limit: int
    ) -> list[LateEffect]:
        """Late effects of tasks of type ``name`` recorded at or after ``since`` (None: any
        time), newest first, at most ``limit``."""
        ...

    def record_reconcile(
        self, name: str, operator: str, summary_json: str,
        findings: Sequence[tuple[str, str, int | None, str]],
    ) -> None:
        """Audit one reconcile run in one transaction: a ``reconcile`` row (task id
        ``reconcile:<name>``, holder ``operator``, detail ``summary_json``) and one row per
        finding ``(task_id, kind, generation, detail_json)`` on the task it is about
        (DESIGN §5, reconciliation)."""
        ...

    def audit_kind_counts(self) -> dict[str, int]:
        """Audit rows ever written per kind (kept when prune deletes the rows; the rollup
        plus the rows since the counts mark, as :meth:`stats` reads them)."""
        ...

    def definitions(self, live_within_s: float) -> list[DefinitionRecord]:
        """Every stored definition by (name, version), with how many registered workers
        that are ``alive`` and were seen within ``live_within_s`` seconds have it."""
        ...

    def version_backlog(self, live_within_s: float) -> list[VersionBacklog]:
        """Ready tasks per (name, version) with the live workers that have each version
        (``ratchet status``: a version no live worker has waits, never fails)."""
        ...

    def live_worker_slots(self, live_within_s: float) -> list[WorkerSlots]:
        """The registered workers that are ``alive`` and were seen within
        ``live_within_s`` seconds, each with its slots (its last
        :meth:`~WorkerLedger.record_worker_slots`, None without one) and the task types it
        registered, by holder (``ratchet status``: the slots serving each type). None on a
        ledger not yet migrated to the definition tables."""
        ...

    def worker_definition_specs(self) -> list[tuple[str, str]]:
        """``(holder, spec JSON)`` of every definition each registered worker has (the
        ``worker_definitions`` rows joined with ``definitions``; ``ratchet workers`` reads
        their ``lease_s``). None on a ledger not yet migrated to the definition tables."""
        ...

    # ---------------------------------------------------------------- schedules

    def schedules(self) -> list[ScheduleRecord]:
        """Every periodic schedule stored, by name (none on a ledger without the table)."""
        ...

    # ---------------------------------------------------------------- outbox

    def outbox_stats(self, top: int = 10) -> OutboxStats:
        """The outbox at a glance (DESIGN §6 row 10, §9): unsent and sent counts, the
        oldest unsent age (ledger clock, seconds), unsent per topic (the ``top`` largest),
        the messages relays failed to publish with their last error, and the relays
        holding partitions with an unexpired lease. Reads the partial indexes and the
        lease rows only (see :class:`~ratchet.ledger.base.OutboxStats` for the caps).

        Raises:
            InvalidArguments: ``top`` not in 0..1000.
            SchemaTooOld: the ledger has no outbox yet (schema below 16).
        """
        ...

    def outbox_messages(self, limit: int = 50, unsent_only: bool = False,
                        topic: str | None = None, key: str | None = None,
                        ) -> list[OutboxMessage]:
        """Outbox messages without their payload, at most ``limit`` (1..10000): the newest
        first, or with ``unsent_only`` the unsent ones in outbox order (what the relays
        publish next); only those of ``topic`` and / or ``key`` when given.

        Raises:
            InvalidArguments: a limit out of range, an empty or over-long topic or key.
            SchemaTooOld: the ledger has no outbox yet.
        """
        ...
