"""Ratchet: recoverable task execution for Python.

Submitted work reaches a correct end although processes are killed, hosts pause past
their lease, replies are lost and messages arrive twice; every external side effect is
executed once per business key. See DESIGN §1-§7.
"""

from __future__ import annotations

from .app import App, SubmitRequest, TaskDefinition, TaskHandle
from .breaker import CircuitBreaker
from .config import Durability
from .control import (
    Control,
    ControlOutcome,
    LimitsReport,
    PauseRecord,
    PauseResult,
    ScheduleView,
    StatusReport,
    TaskTimeline,
    WorkerView,
)
from .errors import (
    ChildFailed,
    CircuitOpen,
    ConfigError,
    ContextUsedInAnotherProcess,
    EffectOutcomeUnknown,
    EventTimeout,
    FenceError,
    IdempotencyConflict,
    IllegalTransition,
    InvalidArguments,
    LeaseLost,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    NonDeterministicReplay,
    OutcomeUnknownError,
    OverloadError,
    PayloadNotSerializable,
    PayloadTooLarge,
    PermanentError,
    RatchetError,
    SchemaTooNew,
    SchemaTooOld,
    StaleGeneration,
    SubmitError,
    TaskFailure,
    TaskNotFound,
    TimeLimitExceeded,
    TokenRejected,
    TransactionMisuse,
    TransientError,
    UndecodableData,
    UnknownTask,
    WaitTimeout,
)
from .ledger import open_ledger
from .ledger.base import EventReceipt, Limit, LimitScope, TaskInfo

# A worker traces by itself when OpenTelemetry records (DESIGN §9): the tracing exporter
# registers its middleware with the worker (ratchet.worker.hooks.add_default_middleware)
# when imported, so every program that imports ratchet has it.
from .observe import tracing as _tracing  # noqa: F401  (registers on import)
from .ratelimit import RateLimit
from .retry import FailureClass, RetryBudget, RetryPolicy
from .schedule import Schedule
from .shards import Shard
from .states import State
from .version import __version__
from .worker import NOT_FOUND, AsyncTaskContext, Middleware, TaskContext, Worker
from .worker.batches import BatchCounts
from .worker.waits import ChildHandle

__all__ = [
    "App",
    "AsyncTaskContext",
    "BatchCounts",
    "ChildFailed",
    "ChildHandle",
    "CircuitBreaker",
    "CircuitOpen",
    "ConfigError",
    "ContextUsedInAnotherProcess",
    "Control",
    "ControlOutcome",
    "Durability",
    "EffectOutcomeUnknown",
    "EventReceipt",
    "EventTimeout",
    "FailureClass",
    "FenceError",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidArguments",
    "LeaseLost",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerUnavailable",
    "Limit",
    "LimitScope",
    "LimitsReport",
    "Middleware",
    "NOT_FOUND",
    "NonDeterministicReplay",
    "OutcomeUnknownError",
    "OverloadError",
    "PauseRecord",
    "PauseResult",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "PermanentError",
    "RatchetError",
    "RateLimit",
    "RetryBudget",
    "RetryPolicy",
    "Schedule",
    "ScheduleView",
    "SchemaTooNew",
    "SchemaTooOld",
    "Shard",
    "StaleGeneration",
    "State",
    "StatusReport",
    "SubmitError",
    "SubmitRequest",
    "TaskContext",
    "TaskDefinition",
    "TaskFailure",
    "TaskHandle",
    "TaskInfo",
    "TaskNotFound",
    "TaskTimeline",
    "TimeLimitExceeded",
    "TokenRejected",
    "TransactionMisuse",
    "TransientError",
    "UndecodableData",
    "UnknownTask",
    "WaitTimeout",
    "Worker",
    "WorkerView",
    "__version__",
    "open_ledger",
]
