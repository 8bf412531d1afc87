"""The control API: the one Python interface the operator faces call (the ``ratchet`` CLI
today; an HTTP listing and a dashboard later).

Example::

    from ratchet import Control

    with Control("sqlite:///ratchet.db") as control:       # or Control(app=my_app)
        report = control.status()                          # StatusReport
        view = control.inspect(task_id)                    # TaskTimeline
        control.resolve(task_id, "done", result={"charge_id": "ch_1"},
                        reason="seen in the PSP dashboard", by="alice")

Every answer is a frozen dataclass: ``dataclasses.asdict(record)`` is its JSON form (the
CLI's ``--json`` prints exactly that), so the JSON cannot drift from the records.

Read-only calls (:meth:`Control.status`, :meth:`Control.throughput`,
:meth:`Control.inspect`, :meth:`Control.workers`, :meth:`Control.late_effects`,
:meth:`Control.limits`, :meth:`Control.effects`, :meth:`Control.reconcile_counts`,
:meth:`Control.schema_version`, :meth:`Control.children`, :meth:`Control.batch_progress`,
:meth:`Control.batch_activity`, :meth:`Control.check`, :meth:`Control.schedules`,
:meth:`Control.rate_limits`, :meth:`Control.outbox`, :meth:`Control.outbox_messages`)
open the ledger with ``must_exist=True`` and without migrating: pointed at a file or
schema that holds no ledger they raise :class:`~ratchet.errors.LedgerUnavailable` and
change nothing. :meth:`Control.resolve` needs an existing ledger too (it migrates it if
older). :meth:`Control.migrate` creates or upgrades. :meth:`Control.submit` goes through
the :class:`~ratchet.app.App` (its registry checks the task name and params).

Where things are: the task records in :mod:`ratchet.control._records`, the system reports
in :mod:`ratchet.control._reports`, the task page and the cancel / retry App and Control
share in :mod:`ratchet.app._taskops`, the ledger handles in :mod:`ratchet.control._base`, the
read calls in :mod:`ratchet.control._reads`, the writes in :mod:`ratchet.control._writes`,
the rate limits in :mod:`ratchet.control._flow` and the views of flow control in
:mod:`ratchet.control._flowviews`, the outbox in :mod:`ratchet.control._outbox`,
forks in :mod:`ratchet.control._fork`,
the argument checks in :mod:`ratchet.app._checks`. This module puts them together and is the
import path: every name below stays importable from here.
"""

from __future__ import annotations

from ..app import App as App
from ..app import TaskHandle as TaskHandle
from ..app._checks import REASON_REQUIRED, default_operator
from ..app._taskops import TaskPage
from ..capacity import ALL_TYPES, LimitReached, TypeStatusView
from ..ledger.base import (
    BATCH_EFFECT_PREFIX,
    FORK_AT_END,
    LATE_ACCOUNTED_FOR,
    LATE_POSSIBLE_DUPLICATE,
    AuditEvent,
    BatchActivity,
    ControlOutcome,
    EffectRecord,
    EffectState,
    EventReceipt,
    ForkLinks,
    ForkRecord,
    PauseRecord,
    PauseResult,
    PruneReport,
    ReplayedTask,
    ResolveOutcome,
    TaskInfo,
)
from ..ledger.base import Limit as Limit
from ..ledger.base import LimitScope as LimitScope
from ..ledger.base import OutboxMessage as OutboxMessage
from ..ledger.base import OutboxRelay as OutboxRelay
from ..ledger.base import OutboxStats as OutboxStats
from ..ledger.base import OutboxTopic as OutboxTopic
from ..ledger.base import Timeline as Timeline
from ..serde import Undecodable
from ..states import State as State
from ._batches import BatchProgress, ConservationLine, ConservationReport, ControlBatches
from ._flow import ControlFlow
from ._flowviews import QueueStatusView, RateLimitView, TypeFlowView
from ._fork import ControlFork
from ._outbox import ControlOutbox
from ._records import (
    EffectPage,
    EffectView,
    LateEffectView,
    QuarantineGroupView,
    ReplayReport,
    StepView,
    TaskEffectView,
    TaskTimeline,
)
from ._reports import DEFAULT_LEASE_S as DEFAULT_LEASE_S
from ._reports import LIVE_WORKER_S as LIVE_WORKER_S
from ._reports import MAX_BUCKETS as MAX_BUCKETS
from ._reports import MAX_WINDOW_S as MAX_WINDOW_S
from ._reports import (
    DefinitionView,
    LimitsReport,
    LimitView,
    ReconcileCounts,
    StatusReport,
    ThroughputBucket,
    UsageView,
    VersionWaitView,
    WorkerView,
)
from ._schedules import STALE_SCHEDULE_S, ScheduleView
from ._writes import ControlWrites

__all__ = [
    "ALL_TYPES",
    "AuditEvent",
    "BATCH_EFFECT_PREFIX",
    "BatchActivity",
    "BatchProgress",
    "ConservationLine",
    "ConservationReport",
    "Control",
    "ControlOutcome",
    "DefinitionView",
    "EffectPage",
    "EffectRecord",
    "EffectState",
    "EffectView",
    "EventReceipt",
    "FORK_AT_END",
    "ForkLinks",
    "ForkRecord",
    "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE",
    "LateEffectView",
    "LimitReached",
    "LimitView",
    "LimitsReport",
    "OutboxMessage",
    "OutboxRelay",
    "OutboxStats",
    "OutboxTopic",
    "PauseRecord",
    "PauseResult",
    "PruneReport",
    "QuarantineGroupView",
    "QueueStatusView",
    "REASON_REQUIRED",
    "RateLimitView",
    "ReconcileCounts",
    "ReplayReport",
    "ReplayedTask",
    "ResolveOutcome",
    "STALE_SCHEDULE_S",
    "ScheduleView",
    "StatusReport",
    "StepView",
    "TaskEffectView",
    "TaskInfo",
    "TaskPage",
    "TaskTimeline",
    "ThroughputBucket",
    "TypeFlowView",
    "TypeStatusView",
    "Undecodable",
    "UsageView",
    "VersionWaitView",
    "WorkerView",
    "default_operator",
]


class Control(ControlWrites, ControlBatches, ControlFlow, ControlOutbox, ControlFork):
    """Operator operations on one ledger.

    Args:
        ledger_url: a ledger URL, or ``None`` for ``RATCHET_LEDGER_URL`` (default
            ``sqlite:///ratchet.db``). Not together with ``app``.
        app: an :class:`~ratchet.app.App`; its ledger is used, and :meth:`submit` needs it.

    Nothing is opened until the first call. Use as a context manager, or call
    :meth:`close`.

    Raises:
        ConfigError: the URL is malformed, ``app`` is not an App, or both were given (at
            construction).
    """


    def __enter__(self) -> Control:
        return self
