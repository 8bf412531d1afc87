"""The public surface: the exact names of ``ratchet`` and ``ratchet.control``.

A name added or removed fails here, on purpose: the list is what users import, so a change
to it is a decision (update the list, the changelog and the docs), never a side effect of
moving code. Each name must resolve, and each list is kept sorted.
"""

from __future__ import annotations

import importlib
import typing
from types import ModuleType

import pytest

import ratchet
import ratchet.control
from ratchet import TaskContext, params

RATCHET_ALL = [
    "App", "BatchCounts", "ChildFailed", "ChildHandle", "CircuitBreaker", "CircuitOpen",
    "ConfigError",
    "ContextUsedInAnotherProcess", "Control", "ControlOutcome", "Durability",
    "EffectOutcomeUnknown", "EventReceipt", "EventTimeout", "FailureClass",
    "FenceError", "IdempotencyConflict", "IllegalTransition", "InvalidArguments", "LeaseLost",
    "LedgerCorrupt", "LedgerError", "LedgerUnavailable", "Limit", "LimitScope",
    "LimitsReport", "Middleware", "NOT_FOUND", "NonDeterministicReplay",
    "OutcomeUnknownError", "OverloadError", "PauseRecord", "PauseResult",
    "PayloadNotSerializable", "PayloadTooLarge", "PermanentError", "RatchetError", "RateLimit",
    "RetryBudget", "RetryPolicy", "Schedule", "ScheduleView", "SchemaTooNew", "SchemaTooOld",
    "Shard", "StaleGeneration", "State", "StatusReport", "SubmitError", "SubmitRequest",
    "TaskContext", "TaskDefinition",
    "TaskFailure", "TaskHandle", "TaskInfo", "TaskNotFound", "TaskTimeline",
    "TimeLimitExceeded", "TokenRejected", "TransactionMisuse", "TransientError",
    "UndecodableData", "UnknownTask", "WaitTimeout", "Worker", "WorkerView", "__version__",
    "open_ledger",
]

CONTROL_ALL = [
    "ALL_TYPES", "AuditEvent", "BATCH_EFFECT_PREFIX", "BatchActivity", "BatchProgress",
    "ConservationLine",
    "ConservationReport", "Control", "ControlOutcome", "DefinitionView", "EffectPage",
    "EffectRecord", "EffectState", "EffectView", "EventReceipt", "FORK_AT_END", "ForkLinks",
    "ForkRecord", "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE", "LateEffectView", "LimitReached", "LimitView", "LimitsReport",
    "OutboxMessage", "OutboxRelay", "OutboxStats", "OutboxTopic",
    "PauseRecord", "PauseResult", "PruneReport", "QuarantineGroupView", "QueueStatusView",
    "REASON_REQUIRED", "RateLimitView", "ReconcileCounts", "ReplayReport", "ReplayedTask",
    "ResolveOutcome", "STALE_SCHEDULE_S",
    "ScheduleView", "StatusReport",
    "StepView", "TaskEffectView", "TaskInfo", "TaskPage", "TaskTimeline", "ThroughputBucket",
    "TypeFlowView", "TypeStatusView", "Undecodable", "UsageView", "VersionWaitView", "WorkerView",
    "default_operator",
]


@pytest.mark.parametrize(("module", "expected"), [
    (ratchet, RATCHET_ALL),
    (ratchet.control, CONTROL_ALL),
], ids=["ratchet", "ratchet.control"])
def test_all_is_exactly_the_pinned_sorted_list(module: ModuleType, expected: list[str]) -> None:
    names = list(module.__all__)
    assert names == sorted(names), "keep __all__ sorted"
    assert len(names) == len(set(names)), "a name listed twice"
    assert names == expected


@pytest.mark.parametrize("module_name", ["ratchet", "ratchet.control"])
def test_every_public_name_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == []
    namespace: dict[str, object] = {}
    exec(f"from {module_name} import *", namespace)  # the star import users write
    assert set(module.__all__) <= set(namespace)


def test_control_names_are_the_defining_objects() -> None:
    """``ratchet.control`` re-exports: the names are the objects of the modules that define
    them, not copies (``ratchet.Control is ratchet.control.Control``, ...)."""
    for name in set(RATCHET_ALL) & set(CONTROL_ALL):
        assert getattr(ratchet, name) is getattr(ratchet.control, name), name
    assert typing.get_type_hints(ratchet.App.list_tasks)["return"] is ratchet.control.TaskPage
    for name in ("DEFAULT_LEASE_S", "LIVE_WORKER_S", "MAX_BUCKETS", "MAX_WINDOW_S"):
        assert isinstance(getattr(ratchet.control, name), int | float), name


def test_the_context_check_knows_the_real_context_class() -> None:
    """:mod:`ratchet.params` sits below the worker: the worker registers its context class
    with it, so the first-parameter check judges annotations against the real class."""
    assert params._context_classes == [TaskContext]
