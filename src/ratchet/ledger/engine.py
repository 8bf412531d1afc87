"""The ledger engine: every rule of the ledger, once, over any SQL dialect (DESIGN §10).

:class:`LedgerEngine` implements the :class:`~ratchet.ledger.base.Ledger` protocol on top
of a :class:`~ratchet.ledger.dialect.Dialect` by composition: each concern is one object of
:mod:`ratchet.ledger.ops` sharing the dialect, the parsed URL, the schema gate and the
ledger clock's watch (:class:`~ratchet.ledger.ops.core.EngineCore`). They own the policy:
the fence of every write (state and generation read in the write's own transaction),
transitions checked against :mod:`ratchet.states`, the audit trail, retirement of a final
attempt whose holder is gone (``FAILED``, or ``UNKNOWN`` with an open effect intent),
revocation, operator resolution, submit dedupe (idempotency key + params digest), the re-send
of writes whose ``COMMIT`` reply was lost, and the aggregates of ``ratchet status``. None
holds SQL: they name statements of the dialect's catalogue (``ledger/sql/<dialect>.sql``),
read rows through their shapes (:mod:`ratchet.ledger.rows`). Adding a ledger operation is
one method of its concern, one delegation here, and one named statement per dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..config import LedgerConfig
from ..errors import LedgerCorrupt
from ..outbox import OUTBOX_PARTITIONS, NewMessage
from .base import (
    AuditEvent,
    BatchActivity,
    BatchRun,
    Claim,
    ClaimKind,
    ClaimScope,
    CommitOutcome,
    ControlOutcome,
    DefinitionChange,
    DefinitionRecord,
    DefinitionSpec,
    EffectRecord,
    EventReceipt,
    FlowCount,
    ForkLinks,
    ForkRecord,
    LateEffect,
    LedgerStats,
    Limit,
    LimitScope,
    NewTask,
    OutboxMessage,
    OutboxRow,
    OutboxStats,
    PartLease,
    PauseRecord,
    PauseResult,
    PruneReport,
    QuarantineGroup,
    RateLimitSetting,
    RenewResult,
    ReplayedTask,
    ResolveOutcome,
    SlotUsage,
    SubmitResult,
    Subscription,
    TaskEffect,
    TaskInfo,
    TaskQuery,
    TaskWrite,
    ThroughputCount,
    Timeline,
    VersionBacklog,
    WaitInfo,
    WorkerInfo,
    WorkerSlots,
)
from .dialect import Dialect
from .ops.batches import Batches
from .ops.claims import Claims
from .ops.commands import Commands
from .ops.commit import Commits
from .ops.core import EngineCore
from .ops.emit import Emit
from .ops.fork import Forks
from .ops.late_effects import LateEffects
from .ops.limits import MAX_LIMIT as MAX_LIMIT
from .ops.limits import Limits
from .ops.outboxviews import OutboxViews
from .ops.pauses import Pauses
from .ops.quarantine import Quarantine
from .ops.ratelimits import RateLimits
from .ops.reads import Reads
from .ops.registry import Registry
from .ops.relay import Relay
from .ops.renew import Renew
from .ops.retention import Retention
from .ops.schedules import Schedules
from .ops.stats import Stats
from .ops.steps import TransactionSteps
from .ops.submit import Submit
from .ops.waits import Waits
from .records_schedules import (
    ScheduleFired,
    SchedulePlanner,
    ScheduleRecord,
    ScheduleSpec,
)

__all__ = ["MAX_LIMIT", "LedgerEngine"]


class LedgerEngine:
    """The :class:`~ratchet.ledger.base.Ledger` contract over a :class:`Dialect`.

    Thread-safe as far as the dialect is (both dialects are: per-thread SQLite connections,
    a PostgreSQL pool). Every public method is one transaction of the dialect, except where
    its docstring says otherwise; each delegates to the object of its concern
    (:mod:`ratchet.ledger.ops`), whose docstring has the details.

    Args:
        config: the parsed ledger URL.
        dialect: the database under the engine (it is closed by :meth:`close`).
    """

    def __init__(self, config: LedgerConfig, dialect: Dialect) -> None:
        self.config = config
        core = self._core = EngineCore(config, dialect)
        self._submit = Submit(core)
        self._emit = Emit(core)
        self._relay = Relay(core)
        self._claims = Claims(core)
        self._renew = Renew(core)
        self._commits = Commits(core, self._claims)
        self._steps = TransactionSteps(core)
        self._commands = Commands(core)
        self._forks = Forks(core)
        self._pauses = Pauses(core)
        self._quarantine = Quarantine(core)
        self._limits = Limits(core)
        self._rates = RateLimits(core)
        self._reads = Reads(core)
        self._stats = Stats(core)
        self._retention = Retention(core, self.now)
        self._late = LateEffects(core)
        self._registry = Registry(core)
        self._waits = Waits(core)
        self._batches = Batches(core)
        self._schedules = Schedules(core)
        self._outboxviews = OutboxViews(core)

    @property
    def dialect(self) -> Dialect:
        """The database under the engine (shared by every concern; replacing it, as a
        test's fault-injecting wrapper does, replaces it for all of them)."""
        return self._core.dialect

    @dialect.setter
    def dialect(self, dialect: Dialect) -> None:
        self._core.dialect = dialect

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

    def subscribe(self, on_ready: Callable[[], None], channel: str = "ready") -> Subscription:
        """See :meth:`Ledger.subscribe` (PostgreSQL: LISTEN/NOTIFY; SQLite: never calls)."""
        return self.dialect.subscribe(on_ready, channel)

    def close(self) -> None:
        """See :meth:`Ledger.close`."""
        self.dialect.close()

    # ------------------------------------------------------------------ the task's life

    def submit(self, tasks: Sequence[NewTask], connection: Any = None) -> list[SubmitResult]:
        """See :meth:`Ledger.submit` (:class:`~ratchet.ledger.ops.submit.Submit`)."""
        return self._submit.submit(tasks, connection)

    def emit(self, messages: Sequence[NewMessage], connection: Any = None) -> None:
        """See :meth:`Ledger.emit` (:class:`~ratchet.ledger.ops.emit.Emit`)."""
        self._emit.emit(messages, connection)

    def outbox_lease(self, holder: str, lease_s: float, want: int = OUTBOX_PARTITIONS,
                     *, rebalance: bool = True) -> list[PartLease]:
        """See :meth:`Ledger.outbox_lease` (:class:`~ratchet.ledger.ops.relay.Relay`)."""
        return self._relay.outbox_lease(holder, lease_s, want, rebalance=rebalance)

    def outbox_fetch(self, parts: Sequence[int], limit: int, *,
                     skip_keys: Sequence[str] = (),
                     skip_ids: Sequence[int] = ()) -> list[OutboxRow]:
        """See :meth:`Ledger.outbox_fetch`."""
        return self._relay.outbox_fetch(parts, limit, skip_keys=skip_keys, skip_ids=skip_ids)

    def outbox_mark_sent(self, holder: str, leases: Sequence[tuple[int, int]],
                         ids: Sequence[int]) -> int:
        """See :meth:`Ledger.outbox_mark_sent` (fenced by the partitions' generations)."""
        return self._relay.outbox_mark_sent(holder, leases, ids)

    def outbox_failed(self, holder: str, ids: Sequence[int], error: str) -> None:
        """See :meth:`Ledger.outbox_failed`."""
        self._relay.outbox_failed(holder, ids, error)

    def outbox_release(self, holder: str) -> None:
        """See :meth:`Ledger.outbox_release`."""
        self._relay.outbox_release(holder)

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int,
              scope: ClaimScope | None = None) -> list[Claim]:
        """See :meth:`Ledger.claim` (:class:`~ratchet.ledger.ops.claims.Claims`)."""
        return self._claims.claim(holder, names, limit, scope)

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """See :meth:`Ledger.renew` (:class:`~ratchet.ledger.ops.renew.Renew`)."""
        return self._renew.renew(holder, leases)

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """See :meth:`Ledger.commit` (:class:`~ratchet.ledger.ops.commit.Commits`)."""
        return self._commits.commit(writes)

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[ClaimKind], limit: int,
        scope: ClaimScope | None = None,
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """See :meth:`Ledger.commit_and_claim` (one transaction)."""
        return self._commits.commit_and_claim(writes, holder, names, limit, scope)

    def transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """See :meth:`Ledger.transaction_step`
        (:class:`~ratchet.ledger.ops.steps.TransactionSteps`)."""
        return self._steps.transaction_step(write, fn)

    # ------------------------------------------------------------------ operator

    def resolve(
        self,
        task_id: str,
        outcome: ResolveOutcome,
        reason: str,
        operator: str,
        result_json: str | None = None,
    ) -> TaskInfo:
        """See :meth:`Ledger.resolve`; returns the task as resolved."""
        self._commands.resolve(task_id, outcome, reason, operator, result_json)
        return self.get(task_id)

    def cancel(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.cancel` (:class:`~ratchet.ledger.ops.commands.Commands`)."""
        return self._commands.cancel(task_id, reason, operator)

    def retry(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.retry`."""
        return self._commands.retry(task_id, reason, operator)

    def compensate(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.compensate`."""
        return self._commands.compensate(task_id, reason, operator)

    def fork(self, task_id: str, from_step: str, new_task_id: str, version: int | None,
             reason: str, operator: str, known_versions: Sequence[int] = ()) -> ForkRecord:
        """See :meth:`Ledger.fork` (:class:`~ratchet.ledger.ops.fork.Forks`)."""
        return self._forks.fork(task_id, from_step, new_task_id, version, reason, operator,
                                known_versions)

    def fork_links(self, task_id: str) -> ForkLinks:
        """See :meth:`Ledger.fork_links`."""
        return self._forks.fork_links(task_id)

    # ------------------------------------------------------------------ workflows

    def send_event(self, name: str, key: str, payload_json: str, event_id: str | None = None,
                   by: str | None = None) -> EventReceipt:
        """See :meth:`Ledger.send_event` (:class:`~ratchet.ledger.ops.waits.Waits`)."""
        return self._waits.send_event(name, key, payload_json, event_id, by)

    def children(self, task_id: str) -> list[TaskInfo]:
        """See :meth:`Ledger.children`."""
        return self._waits.children(task_id)

    def waits(self, task_ids: Sequence[str]) -> list[WaitInfo]:
        """See :meth:`Ledger.waits`."""
        return self._waits.waits(task_ids)

    # ------------------------------------------------------------------ batches

    def batch_open(self, task_id: str, run: str
                   ) -> tuple[BatchRun | None, dict[str, EffectRecord]]:
        """See :meth:`Ledger.batch_open` (:class:`~ratchet.ledger.ops.batches.Batches`)."""
        return self._batches.batch_open(task_id, run)

    def batch_runs(self, task_ids: Sequence[str]) -> list[BatchRun]:
        """See :meth:`Ledger.batch_runs`."""
        return self._batches.batch_runs(task_ids)

    def batch_activity(self) -> list[BatchActivity]:
        """See :meth:`Ledger.batch_activity`."""
        return self._batches.batch_activity()

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""
        return self._commands.revoke_holder(holder, by, reason)

    def pause(self, scope: str, target: str, reason: str, operator: str) -> PauseResult:
        """See :meth:`Ledger.pause` (:class:`~ratchet.ledger.ops.pauses.Pauses`)."""
        return self._pauses.pause(scope, target, reason, operator)

    def resume(self, scope: str, target: str, reason: str, operator: str,
               rate_per_s: float | None = None) -> PauseResult:
        """See :meth:`Ledger.resume`."""
        return self._pauses.resume(scope, target, reason, operator, rate_per_s)

    def pauses(self) -> list[PauseRecord]:
        """See :meth:`Ledger.pauses`."""
        return self._pauses.pauses()

    def control_requests(self, holder: str) -> list[tuple[str, int, str]]:
        """See :meth:`Ledger.control_requests`."""
        return self._quarantine.control_requests(holder)

    def quarantine_groups(self, limit: int = 100, per_group: int = 5) -> list[QuarantineGroup]:
        """See :meth:`Ledger.quarantine_groups`
        (:class:`~ratchet.ledger.ops.quarantine.Quarantine`)."""
        return self._quarantine.quarantine_groups(limit, per_group)

    def quarantine_replay(
        self, fingerprint: str, rate_per_s: float, operator: str, reason: str,
        dry_run: bool = False, limit: int = 10_000,
    ) -> list[ReplayedTask]:
        """See :meth:`Ledger.quarantine_replay`."""
        return self._quarantine.quarantine_replay(fingerprint, rate_per_s, operator, reason,
                                                  dry_run, limit)

    # ------------------------------------------------------------------ bulkheads

    def limits(self) -> list[Limit]:
        """See :meth:`Ledger.limits` (:class:`~ratchet.ledger.ops.limits.Limits`)."""
        return self._limits.limits()

    def set_limit(
        self, scope: LimitScope, name: str, reserved: int, maximum: int | None,
        operator: str, reason: str,
    ) -> Limit:
        """See :meth:`Ledger.set_limit`."""
        return self._limits.set_limit(scope, name, reserved, maximum, operator, reason)

    def clear_limit(self, scope: LimitScope, name: str, operator: str, reason: str) -> Limit:
        """See :meth:`Ledger.clear_limit`."""
        return self._limits.clear_limit(scope, name, operator, reason)

    def limit_changes(self, limit: int = 20) -> list[AuditEvent]:
        """See :meth:`Ledger.limit_changes`."""
        return self._limits.limit_changes(limit)

    def slot_usage(self) -> SlotUsage:
        """See :meth:`Ledger.slot_usage`."""
        return self._limits.slot_usage()

    # ------------------------------------------------------------------ rate limits

    def rate_limits(self) -> list[RateLimitSetting]:
        """See :meth:`Ledger.rate_limits`
        (:class:`~ratchet.ledger.ops.ratelimits.RateLimits`)."""
        return self._rates.rate_limits()

    def rate_held(self) -> dict[str, int]:
        """See :meth:`Ledger.rate_held`."""
        return self._rates.rate_held()

    def flow_counts(self) -> list[FlowCount]:
        """See :meth:`Ledger.flow_counts`."""
        return self._rates.flow_counts()

    def set_rate_limit(self, name: str, per_s: float, burst: int, key_param: str | None,
                       operator: str, reason: str) -> RateLimitSetting:
        """See :meth:`Ledger.set_rate_limit`."""
        return self._rates.set_rate_limit(name, per_s, burst, key_param, operator, reason)

    def clear_rate_limit(self, name: str, operator: str, reason: str) -> RateLimitSetting:
        """See :meth:`Ledger.clear_rate_limit`."""
        return self._rates.clear_rate_limit(name, operator, reason)

    def rate_take(self, task_id: str, generation: int, name: str, key: str, per_s: float,
                  burst: int) -> float:
        """See :meth:`Ledger.rate_take`."""
        return self._rates.rate_take(task_id, generation, name, key, per_s, burst)

    # ------------------------------------------------------------------ reads, stats

    def outbox_stats(self, top: int = 10) -> OutboxStats:
        """See :meth:`Ledger.outbox_stats`
        (:class:`~ratchet.ledger.ops.outboxviews.OutboxViews`)."""
        return self._outboxviews.outbox_stats(top)

    def outbox_messages(self, limit: int = 50, unsent_only: bool = False,
                        topic: str | None = None, key: str | None = None,
                        ) -> list[OutboxMessage]:
        """See :meth:`Ledger.outbox_messages`."""
        return self._outboxviews.outbox_messages(limit, unsent_only, topic, key)

    def get(self, task_id: str) -> TaskInfo:
        """See :meth:`Ledger.get` (:class:`~ratchet.ledger.ops.reads.Reads`)."""
        return self._reads.get(task_id)

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """See :meth:`Ledger.get_many`."""
        return self._reads.get_many(task_ids)

    def list_tasks(self, query: TaskQuery) -> list[TaskInfo]:
        """See :meth:`Ledger.list_tasks`."""
        return self._reads.list_tasks(query)

    def timeline(self, task_id: str) -> Timeline:
        """See :meth:`Ledger.timeline`."""
        return self._reads.timeline(task_id)

    def stats(self, window_s: float | None = None) -> LedgerStats:
        """See :meth:`Ledger.stats` (:class:`~ratchet.ledger.ops.stats.Stats`)."""
        return self._stats.stats(window_s)

    def throughput(self, window_s: float, bucket_s: float,
                   name: str | None = None) -> list[ThroughputCount]:
        """See :meth:`Ledger.throughput`."""
        return self._stats.throughput(window_s, bucket_s, name)

    def audit_kind_counts(self) -> dict[str, int]:
        """See :meth:`Ledger.audit_kind_counts`."""
        return self._stats.audit_kind_counts()

    # ------------------------------------------------------------------ retention

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
        """See :meth:`Ledger.prune` (:class:`~ratchet.ledger.ops.retention.Retention`)."""
        return self._retention.prune(older_than_s, by=by, dry_run=dry_run,
                                     batch_size=batch_size, export=export,
                                     audit_empty=audit_empty, pace=pace)

    # ------------------------------------------------------------------ late effects

    def record_late_effect(self, late: LateEffect) -> None:
        """See :meth:`Ledger.record_late_effect`
        (:class:`~ratchet.ledger.ops.late_effects.LateEffects`)."""
        self._late.record_late_effect(late)

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects`."""
        return self._late.late_effects(task_id, limit)

    def effects_of_type(
        self, name: str, created_from: float | None, limit: int,
        after: tuple[float, str, str] | None = None,
    ) -> list[TaskEffect]:
        """See :meth:`Ledger.effects_of_type`."""
        return self._late.effects_of_type(name, created_from, limit, after)

    def late_effects_of_type(
        self, name: str, since: float | None, limit: int
    ) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects_of_type`."""
        return self._late.late_effects_of_type(name, since, limit)

    def record_reconcile(
        self, name: str, operator: str, summary_json: str,
        findings: Sequence[tuple[str, str, int | None, str]],
    ) -> None:
        """See :meth:`Ledger.record_reconcile`."""
        self._late.record_reconcile(name, operator, summary_json, findings)

    # ------------------------------------------------------------------ registry

    def register_worker(self, info: WorkerInfo) -> None:
        """See :meth:`Ledger.register_worker` (:class:`~ratchet.ledger.ops.registry.Registry`)."""
        self._registry.register_worker(info)

    def record_worker_slots(self, holder: str, slots: int,
                            queues: Sequence[str] | None = None) -> None:
        """See :meth:`Ledger.record_worker_slots`."""
        self._registry.record_worker_slots(holder, slots, queues)

    def live_worker_slots(self, live_within_s: float) -> list[WorkerSlots]:
        """See :meth:`Ledger.live_worker_slots`."""
        return self._registry.live_worker_slots(live_within_s)

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """See :meth:`Ledger.touch_worker`."""
        self._registry.touch_worker(holder, state)

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """See :meth:`Ledger.list_workers`."""
        return self._registry.list_workers(host_id)

    def prune_workers(self, older_than_s: float) -> list[str]:
        """See :meth:`Ledger.prune_workers`."""
        return self._registry.prune_workers(older_than_s)

    def register_definitions(
        self, holder: str, definitions: Sequence[DefinitionSpec]
    ) -> list[DefinitionChange]:
        """See :meth:`Ledger.register_definitions`."""
        return self._registry.register_definitions(holder, definitions)

    def definitions(self, live_within_s: float) -> list[DefinitionRecord]:
        """See :meth:`Ledger.definitions`."""
        return self._registry.definitions(live_within_s)

    def worker_definition_specs(self) -> list[tuple[str, str]]:
        """See :meth:`Ledger.worker_definition_specs`."""
        return self._registry.worker_definition_specs()

    def version_backlog(self, live_within_s: float) -> list[VersionBacklog]:
        """See :meth:`Ledger.version_backlog`."""
        return self._registry.version_backlog(live_within_s)

    # ------------------------------------------------------------------ schedules

    def register_schedules(self, holder: str,
                           specs: Sequence[ScheduleSpec]) -> list[ScheduleRecord]:
        """See :meth:`Ledger.register_schedules`
        (:class:`~ratchet.ledger.ops.schedules.Schedules`)."""
        return self._schedules.register_schedules(holder, specs)

    def fire_schedules(self, holder: str, names: Sequence[str],
                       plan: SchedulePlanner) -> ScheduleFired:
        """See :meth:`Ledger.fire_schedules`."""
        return self._schedules.fire_schedules(holder, names, plan)

    def schedules_seen(self, holder: str, names: Sequence[str]) -> None:
        """See :meth:`Ledger.schedules_seen`."""
        self._schedules.schedules_seen(holder, names)

    def schedules(self) -> list[ScheduleRecord]:
        """See :meth:`Ledger.schedules`."""
        return self._schedules.schedules()
