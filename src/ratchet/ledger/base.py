"""The ledger contract (DESIGN §10): named, batched operations; callers never see SQL.

Every operation is one short transaction. Writes on behalf of a task carry the task's
fencing generation and are checked against the ledger row inside that transaction; a
write whose generation is not current changes nothing, is audited as ``stale_rejected``
and is reported back per task (:attr:`CommitOutcome.stale`). All time that decides
correctness (``lease_until``, ``run_at``) is the ledger's clock, read inside the
transaction — never a worker's clock.

Operations take and return batches so that group commit (several tasks' writes in one
transaction, one fsync) never changes a caller.

This module gathers the contract's names in one place; they live in modules by concern:

* :mod:`~ratchet.ledger.records_tasks`: a task and its history (submit, the row, steps,
  effects, audit events, late effects, queries, timelines);
* :mod:`~ratchet.ledger.records_claims`: what a worker's claims, renewals and fenced
  commits carry;
* :mod:`~ratchet.ledger.records_ops`: operator actions and their answers (control,
  pauses, quarantine, limits, prunes);
* :mod:`~ratchet.ledger.records_stats`: the aggregates of ``ratchet status``;
* :mod:`~ratchet.ledger.records_flow`: rate limits and live tasks per queue (flow
  control);
* :mod:`~ratchet.ledger.records_outbox`: the outbox as operators see it (backlog,
  relays, failing messages);
* :mod:`~ratchet.ledger.records_registry`: the worker and definition registries;
* :mod:`~ratchet.ledger.records_relay`: the outbox relay's partition leases and rows;
* :mod:`~ratchet.ledger.records_fork`: a fork of a task from a step and its links;
* :mod:`~ratchet.ledger.records_schedules`: periodic schedules, their cursors and a
  scheduler pass;
* :mod:`~ratchet.ledger.protocol`: the :class:`Ledger` Protocol, made of
  :class:`WorkerLedger`, :class:`OperatorLedger` and :class:`AdminLedger`.
"""

from __future__ import annotations

from ..validation import MAX_VERSION
from .protocol import (
    AdminLedger,
    Ledger,
    LedgerHandle,
    OperatorLedger,
    RelayLedger,
    Subscription,
    WorkerLedger,
)
from .records_batches import (
    BATCH_EFFECT_PREFIX,
    BATCH_RUN_PREFIX,
    BatchActivity,
    BatchMark,
    BatchRun,
    batch_effect_prefix,
)
from .records_claims import (
    BudgetUse,
    Claim,
    ClaimKind,
    ClaimScope,
    CommitOutcome,
    EffectWrite,
    RenewResult,
    TaskWrite,
    Transition,
    claim_kinds,
)
from .records_flow import FlowCount, RateLimitSetting
from .records_fork import FORK_AT_END, LINEAGE_STEP, ForkLinks, ForkRecord
from .records_ops import (
    ControlOutcome,
    ControlRequest,
    Limit,
    LimitScope,
    PauseRecord,
    PauseResult,
    PruneReport,
    QuarantineGroup,
    ReplayedTask,
    ResolveOutcome,
    SlotUsage,
)
from .records_outbox import OutboxMessage, OutboxRelay, OutboxStats, OutboxTopic
from .records_registry import (
    DefinitionChange,
    DefinitionRecord,
    DefinitionSpec,
    VersionBacklog,
    WorkerInfo,
    WorkerSlots,
)
from .records_relay import OutboxRow, PartLease
from .records_schedules import (
    ScheduleAdvance,
    ScheduleFired,
    SchedulePlan,
    SchedulePlanner,
    ScheduleRecord,
    ScheduleSpec,
)
from .records_stats import (
    ATTEMPT_SAMPLE,
    RECENT_FRACTION,
    LedgerStats,
    ThroughputCount,
    TypeCapacity,
)
from .records_tasks import (
    LATE_ACCOUNTED_FOR,
    LATE_POSSIBLE_DUPLICATE,
    AuditEvent,
    EffectRecord,
    EffectState,
    LateEffect,
    NewTask,
    StepRecord,
    SubmitResult,
    TaskEffect,
    TaskInfo,
    TaskQuery,
    Timeline,
)
from .records_waits import (
    COMPENSABLE_STEP,
    COMPENSATING_STEP,
    FOREVER,
    EventReceipt,
    WaitInfo,
    WaitSpec,
)

__all__ = [
    "BATCH_EFFECT_PREFIX",
    "BATCH_RUN_PREFIX",
    "BatchActivity",
    "BatchMark",
    "BatchRun",
    "batch_effect_prefix",
    "ScheduleAdvance",
    "ScheduleFired",
    "SchedulePlan",
    "SchedulePlanner",
    "ScheduleRecord",
    "ScheduleSpec",
    "MAX_VERSION",
    "RECENT_FRACTION",
    "AuditEvent",
    "BudgetUse",
    "COMPENSABLE_STEP",
    "COMPENSATING_STEP",
    "FOREVER",
    "EventReceipt",
    "FlowCount",
    "FORK_AT_END",
    "ForkLinks",
    "ForkRecord",
    "LINEAGE_STEP",
    "WaitInfo",
    "WaitSpec",
    "Claim",
    "ClaimKind",
    "ClaimScope",
    "DefinitionChange",
    "DefinitionRecord",
    "DefinitionSpec",
    "CommitOutcome",
    "ControlOutcome",
    "ControlRequest",
    "PauseRecord",
    "PauseResult",
    "EffectRecord",
    "EffectState",
    "EffectWrite",
    "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE",
    "LateEffect",
    "ATTEMPT_SAMPLE",
    "AdminLedger",
    "Ledger",
    "LedgerHandle",
    "OperatorLedger",
    "OutboxRow",
    "PartLease",
    "RelayLedger",
    "WorkerLedger",
    "Limit",
    "LimitScope",
    "LedgerStats",
    "NewTask",
    "OutboxMessage",
    "OutboxRelay",
    "OutboxStats",
    "OutboxTopic",
    "PruneReport",
    "QuarantineGroup",
    "RateLimitSetting",
    "RenewResult",
    "ReplayedTask",
    "SlotUsage",
    "ResolveOutcome",
    "StepRecord",
    "SubmitResult",
    "Subscription",
    "TaskInfo",
    "TaskQuery",
    "TaskEffect",
    "TaskWrite",
    "ThroughputCount",
    "Timeline",
    "TypeCapacity",
    "Transition",
    "VersionBacklog",
    "WorkerInfo",
    "WorkerSlots",
    "claim_kinds",
]
