"""Rows of the ledger's statements: each read statement bound to its row shape
(:class:`Read`, shapes in :mod:`ratchet.ledger.shapes`), row → record mappers, the audit
row and its insert. Both schemas store the same columns in the same order, so SQLite and
PostgreSQL read and audit tasks with one definition; this module is the one place where a
column's position becomes its name."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from ..errors import IllegalTransition
from ..serde import Undecodable, dumps, loads, printable
from ..states import State
from ..storedtext import StoredState, UndecodableText, stored_note
from . import shapes as sh
from .base import EffectRecord, EffectState, LateEffect, TaskInfo, TaskWrite, Transition, WorkerInfo
from .dialect import Tx
from .records_schedules import ScheduleRecord

__all__ = [
    "EFFECT_COLUMNS",
    "TASK_COLUMNS",
    "AuditRow",
    "Read",
    "decode_detail",
    "decode_json",
    "effect_record",
    "effect_state",
    "insert_audit",
    "known_state",
    "reschedules",
    "schedule_record",
    "task_info",
    "task_state",
    "transition_audit",
]

AuditRow = tuple[str, float, str, str | None, str | None, int | None, str | None, str]
"""``(task_id, at, kind, from_state, to_state, generation, holder, detail_json)``."""

TASK_COLUMNS = (
    "id, name, version, state, generation, attempt, max_attempts, holder, lease_until, "
    "run_at, created_at, updated_at, idempotency_key, params, params_digest, result, "
    "last_error, error_class, tenant, quarantined"
)
EFFECT_COLUMNS = (
    "name, key, params_digest, state, result, generation, attempt, calls, via_lookup, updated_at, "
    "seq"
)


def decode_json(text: str | None) -> Any:
    """Decode stored JSON; undecodable text becomes a :class:`~ratchet.serde.Undecodable`
    (its printable text and the reason) instead of an error, so one bad row affects only
    itself."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return loads(text)
    except (ValueError, RecursionError, UnicodeEncodeError) as exc:
        reason = "invalid UTF-8" if isinstance(exc, UnicodeEncodeError) else str(exc)
        return Undecodable(str(printable(text)), reason)


def decode_detail(text: str | None) -> dict[str, Any]:
    """An audit row's detail as a dict (``{"undecodable": ...}`` if it cannot be decoded)."""
    value = decode_json(text)
    if isinstance(value, Undecodable):
        return {"undecodable": value.text, "error": value.error}
    return value if isinstance(value, dict) else {}


_STATES: dict[object, State] = {s.value: s for s in State}
_EFFECT_STATES: dict[object, EffectState] = {s.value: s for s in EffectState}


def task_state(value: object) -> State | StoredState:
    """A stored ``tasks.state`` as a :class:`State`, or as a
    :class:`~ratchet.storedtext.StoredState` when it is not one (an unknown string,
    undecodable bytes, a BLOB): never an error, so one such row affects only itself."""
    try:
        return _STATES[value]
    except (KeyError, TypeError):
        return StoredState(value)


def known_state(task_id: str, value: object, action: str) -> State:
    """A stored ``tasks.state`` an operator command (``action``: ``"cancel"``, ...) acts
    on, as a :class:`State`.

    Raises:
        IllegalTransition: the row holds a value that is not a known state: the command
            changes nothing (no transition of the state machine starts from it).
    """
    state = task_state(value)
    if isinstance(state, StoredState):
        raise IllegalTransition(
            f"task {task_id} holds state '{state}' ({stored_note(state)}): "
            f"{action} changed nothing (the row must be repaired first)")
    return state


def effect_state(value: object) -> EffectState | StoredState:
    """A stored ``effects.state`` as an :class:`EffectState`, or as a
    :class:`~ratchet.storedtext.StoredState` when it is not one."""
    try:
        return _EFFECT_STATES[value]
    except (KeyError, TypeError):
        return StoredState(value)


_RESCHEDULES = frozenset({State.RETRY_WAIT, State.PENDING, State.WAITING, State.COMPENSATING})


def reschedules(target: State) -> bool:
    """True for targets that get a new ``run_at`` (backoff, release delay, a wait's
    deadline, compensations to run now)."""
    return target in _RESCHEDULES


_TASK_FIELDS = ("task_id", "name", "version", "state", "generation", "attempt", "max_attempts",
                "holder", "lease_until", "run_at", "created_at", "updated_at",
                "idempotency_key", "params", "params_digest", "result", "last_error",
                "error_class", "tenant", "quarantined", "last_traceback")
"""The :class:`TaskInfo` field of each column of :data:`TASK_COLUMNS` (and of
``last_traceback``, which ``task_get`` and ``task_get_many`` add)."""


def _undecodable(
    row: sh.TaskRow, state: State | StoredState, params: Any, result: Any
) -> tuple[str, ...]:
    """The fields of a task row whose stored value could not be decoded, or is not a known
    state (``()`` at the cost of one scan of the row when there is none)."""
    if (UndecodableText not in map(type, row) and type(params) is not Undecodable
            and type(result) is not Undecodable and type(state) is not StoredState):
        return ()
    decoded = {"state": state, "params": params, "result": result}
    return tuple(f for f, v in zip(_TASK_FIELDS, row, strict=False)
                 if isinstance(decoded.get(f, v), UndecodableText | Undecodable | StoredState))


def task_info(row: sh.TaskRow) -> TaskInfo:
    """A :class:`TaskInfo` from a task row (:data:`TASK_COLUMNS`; ``task_get`` and
    ``task_get_many`` add ``last_traceback``); its ``undecodable`` names the fields
    whose stored value could not be decoded (``"state"`` for a state that is not a known
    one, read as a :class:`~ratchet.storedtext.StoredState`)."""
    state = task_state(row.state)
    params = decode_json(row.params)
    result = decode_json(row.result)
    return TaskInfo(
        task_id=row.id,
        name=row.name,
        version=row.version,
        state=state,
        generation=row.generation,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        holder=row.holder,
        lease_until=row.lease_until,
        run_at=row.run_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        idempotency_key=row.idempotency_key,
        params=params,
        params_digest=row.params_digest,
        result=result,
        last_error=None if row.last_error is None else printable(row.last_error),
        error_class=row.error_class,
        tenant=row.tenant,
        quarantined=bool(row.quarantined),
        undecodable=_undecodable(row, state, params, result),
        last_traceback=None if row.last_traceback is None else printable(row.last_traceback),
        parent_id=row.parent_id,
        queue=row.queue,
        priority=int(row.priority),
        ckey=row.ckey,
        key_slot=bool(row.key_slot),
        rate_key=row.rate_key,
        flow_wait=row.flow_wait,
    )


def effect_record(row: sh.EffectRow | sh.TaskEffectRow | sh.TypeEffectRow) -> EffectRecord:
    """An :class:`EffectRecord` from an effect row (:data:`EFFECT_COLUMNS`, alone or after
    its task's columns; a state that is not a known one as a
    :class:`~ratchet.storedtext.StoredState`)."""
    return EffectRecord(
        name=row.name,
        key=row.key,
        params_digest=row.params_digest,
        state=effect_state(row.state),
        result_json=row.result,
        generation=row.generation,
        attempt=row.attempt,
        calls=row.calls,
        via_lookup=bool(row.via_lookup),
        updated_at=row.updated_at,
        seq=row.seq,
    )


def transition_audit(write: TaskWrite, t: Transition, now: float) -> AuditRow:
    """The audit row of a fenced ``RUNNING -> t.to`` transition written by ``write``."""
    detail: dict[str, Any] = {"operation": write.operation}
    if t.reason:
        detail["reason"] = t.reason
    if t.error:
        detail["error"] = printable(t.error[:2000])
    if t.error_class:
        detail["error_class"] = t.error_class
    if t.to in (State.RETRY_WAIT, State.PENDING) and t.delay_s:
        detail["delay_s"] = round(t.delay_s, 3)
    return (write.task_id, now, "transition", "RUNNING", t.to.value, write.generation,
            write.holder, dumps(detail))


_AUDIT_KEYS = ("task_id", "at", "kind", "from_state", "to_state", "generation", "holder",
               "detail")


def insert_audit(tx: Tx, rows: Sequence[AuditRow]) -> None:
    """Insert audit rows (in order) in ``tx`` (``audit_insert``, one batch)."""
    if rows:
        tx.batch("audit_insert", [dict(zip(_AUDIT_KEYS, row, strict=True)) for row in rows])


_R = TypeVar("_R")
_S = TypeVar("_S")


class Read(Generic[_R]):
    """A catalogue statement that returns rows, bound to the shape of its rows.

    Declared once below (``FENCE_READ = Read.rows("fence_read", FenceRow._make)``); the
    engine runs it with :meth:`all` / :meth:`first`, or sends it with others
    (:meth:`sent`, ``Tx.rows_many``) and shapes what came back with :meth:`of`.
    """

    __slots__ = ("_make", "name")

    def __init__(self, name: str, make: Callable[[Iterable[Any]], _R]) -> None:
        self.name = name
        self._make = make

    @classmethod
    def rows(cls, name: str, make: Callable[[Iterable[Any]], _S]) -> Read[_S]:
        """Declare statement ``name`` of the catalogue, whose rows ``make`` shapes."""
        return Read(name, make)

    def all(self, tx: Tx, params: Mapping[str, Any] | None = None) -> list[_R]:
        """Run the statement in ``tx``; its rows, shaped."""
        return list(map(self._make, tx.rows(self.name, params)))

    def first(self, tx: Tx, params: Mapping[str, Any] | None = None) -> _R | None:
        """Run the statement in ``tx``; its first row, shaped, or None."""
        row = tx.one(self.name, params)
        return None if row is None else self._make(row)

    def sent(self, params: Mapping[str, Any] | None = None) -> tuple[str, Mapping[str, Any]]:
        """The ``(name, params)`` pair of ``Tx.rows_many``."""
        return self.name, params or {}

    def of(self, rows: Iterable[Sequence[Any]]) -> list[_R]:
        """Rows this statement returned (through ``Tx.rows_many``), shaped."""
        return list(map(self._make, rows))


def _task_row(row: Iterable[Any]) -> sh.TaskRow:
    return sh.TaskRow(*row)  # tasks_list selects no last_traceback


def _late_effect(row: Iterable[Any]) -> LateEffect:
    return LateEffect(*row)


def _worker(row: Iterable[Any]) -> WorkerInfo:
    return WorkerInfo(*row)


# The read statements of the engine, by concern. Write statements without rows are run by
# name (``tx.execute`` / ``tx.batch``) where they are used.
TASK_GET = Read.rows("task_get", _task_row)
TASK_GET_MANY = Read.rows("task_get_many", _task_row)
TASKS_LIST = Read.rows("tasks_list", _task_row)
TIMELINE_AUDIT = Read.rows("timeline_audit", sh.AuditEventRow._make)
TIMELINE_STEPS = Read.rows("timeline_steps", sh.StepRow._make)
TIMELINE_EFFECTS = Read.rows("timeline_effects", sh.EffectRow._make)

SUBMIT_PRESENT = Read.rows("submit_present", sh.IdRow._make)
SUBMIT_EXISTING = Read.rows("submit_existing", sh.KeyRow._make)
SUBMIT_DEBOUNCE = Read.rows("submit_debounce", sh.DebounceRow._make)
OUTBOX_SAME = Read.rows("outbox_same", sh.OutboxSameRow._make)

CLAIM_EXPIRED = Read.rows("claim_expired", sh.LeaseRow._make)
CLAIM_GATE = Read.rows("claim_gate", tuple)
CLAIM_TAKEOVER = Read.rows("claim_takeover", sh.ClaimRow._make)
CLAIM_READY = Read.rows("claim_ready", sh.ClaimRow._make)
CLAIM_LIMITED = Read.rows("claim_limited", sh.ClaimRow._make)
CLAIM_READY_QUEUES = Read.rows("claim_ready_queues", sh.ClaimRow._make)
CLAIM_FIFO = Read.rows("claim_fifo", sh.ClaimRow._make)
CLAIM_FIFO_QUEUES = Read.rows("claim_fifo_queues", sh.ClaimRow._make)
CLAIM_FLOW = Read.rows("claim_flow", sh.FlowRow._make)
CLAIM_CANDIDATES = Read.rows("claim_candidates", sh.CandidateRow._make)
CLAIM_FAIR_KEYS = Read.rows("claim_fair_keys", sh.FairKeyRow._make)
CLAIM_FAIR_CANDIDATES = Read.rows("claim_fair_candidates", sh.CandidateRow._make)
CLAIM_FAIR_UNKEYED = Read.rows("claim_fair_unkeyed", sh.CandidateRow._make)
CLAIM_IDS = Read.rows("claim_ids", sh.ClaimRow._make)
KEY_REFILL_TAKE = Read.rows("key_refill_take", sh.RefillRow._make)
RATE_BUCKETS_LOCK = Read.rows("rate_buckets_lock", sh.BucketRow._make)
CLAIM_STEPS = Read.rows("claim_steps", sh.TaskStepRow._make)
CLAIM_EFFECTS = Read.rows("claim_effects", sh.TaskEffectRow._make)
CLAIM_STEPS_TAKEN = Read.rows("claim_steps_taken", sh.TaskStepRow._make)
CLAIM_EFFECTS_TAKEN = Read.rows("claim_effects_taken", sh.TaskEffectRow._make)
HOLDER_RUNNING = Read.rows("holder_running", sh.LeaseRow._make)
OPEN_INTENTS = Read.rows("open_intents", sh.IntentRow._make)
RENEW = Read.rows("renew", sh.LeaseUntilRow._make)
RENEW_HELD = Read.rows("renew_held", sh.LeaseUntilRow._make)

FENCE_READ = Read.rows("fence_read", sh.FenceRow._make)
QUARANTINE_READ = Read.rows("quarantine_read", sh.StreakRow._make)
TRANSACTION_STEP_READ = Read.rows("transaction_step_read", sh.GenerationRow._make)

RESOLVE_LOCK = Read.rows("resolve_lock", sh.ResolveRow._make)
RESOLVE_OPEN_EFFECTS = Read.rows("resolve_open_effects", sh.EffectKeyRow._make)
CONTROL_LOCK = Read.rows("control_lock", sh.ControlRow._make)
CONTROL_REQUESTS = Read.rows("control_requests", sh.RequestRow._make)
PAUSE_GATE = Read.rows("pause_gate", tuple)
PAUSES_ACTIVE = Read.rows("pauses_active", sh.PauseRow._make)
PAUSE_VERSION = Read.rows("pause_version", sh.ValueRow._make)
PAUSE_INSERT = Read.rows("pause_insert", sh.IdRow._make)
PAUSE_RESUME = Read.rows("pause_resume", sh.PauseEndRow._make)
PAUSED_TASKS = Read.rows("paused_tasks", sh.PausedRow._make)
RUNNING_BY_TYPE = Read.rows("running_by_type", sh.NameCount._make)
QUARANTINE_GROUPS = Read.rows("quarantine_groups", sh.QuarantineGroupRow._make)
QUARANTINE_SAMPLES = Read.rows("quarantine_samples", sh.QuarantineSampleRow._make)
QUARANTINE_PICK = Read.rows("quarantine_pick", sh.ReplayRow._make)
QUARANTINE_LOCK = Read.rows("quarantine_lock", sh.IdRow._make)

LIMITS_ALL = Read.rows("limits_all", sh.LimitRow._make)
LIMITS_LOCK = Read.rows("limits_lock", tuple)
LIMITS_RUNNING = Read.rows("limits_running", sh.RunningRow._make)
LIMITS_READY = Read.rows("limits_ready", sh.ReadyGroupRow._make)
LIMIT_UPSERT = Read.rows("limit_upsert", sh.LimitRow._make)
LIMIT_DELETE = Read.rows("limit_delete", sh.LimitRow._make)
LIMITS_AUDIT = Read.rows("limits_audit", sh.AuditEventRow._make)
SLOT_READY = Read.rows("slot_ready", sh.SlotReadyRow._make)
RATE_LIMIT_LIST = Read.rows("rate_limit_list", sh.RateSettingRow._make)
RATE_LIMIT_SET = Read.rows("rate_limit_set", sh.RateSettingRow._make)
RATE_LIMIT_CLEAR = Read.rows("rate_limit_clear", sh.RateSettingRow._make)
RATE_HELD = Read.rows("rate_held", sh.NameCount._make)
RATE_TAKE = Read.rows("rate_take", sh.TakenRow._make)
RATE_TAKE_WAIT = Read.rows("rate_take_wait", sh.TakeWaitRow._make)
FLOW_COUNTS = Read.rows("flow_counts", sh.FlowCountRow._make)

COUNTS_READ_MARK = Read.rows("counts_read_mark", sh.MarkRow._make)
COUNTS_MARK_SHARE = Read.rows("counts_mark_share", sh.MarkRow._make)
COUNTS_LOCK = Read.rows("counts_lock", sh.CountsLockRow._make)
COUNTS_WINDOW_TASKS = Read.rows("counts_window_tasks", sh.StateCount._make)
COUNTS_WINDOW_AUDIT = Read.rows("counts_window_audit", sh.KindCount._make)
STATS_COUNTS = Read.rows("stats_counts", sh.StateCount._make)
STATS_OLDEST = Read.rows("stats_oldest", sh.ValueRow._make)
STATS_KINDS = Read.rows("stats_kinds", sh.KindCount._make)
STATS_UNKNOWN = Read.rows("stats_unknown", sh.ValueRow._make)
STATS_LATE = Read.rows("stats_late", sh.LateCountRow._make)
STATUS_READY = Read.rows("status_ready", sh.ReadyRow._make)
STATUS_ARRIVALS = Read.rows("status_arrivals", sh.ArrivalRow._make)
STATUS_COMPLETIONS = Read.rows("status_completions", sh.CompletionRow._make)
STATUS_UNKNOWN = Read.rows("status_unknown", sh.UnknownRow._make)
STATUS_QUARANTINED = Read.rows("status_quarantined", sh.NameCount._make)
STATUS_ATTEMPTS = Read.rows("status_attempts", sh.AttemptsRow._make)
THROUGHPUT_ARRIVALS = Read.rows("throughput_arrivals", sh.BucketCount._make)
THROUGHPUT_COMPLETIONS = Read.rows("throughput_completions", sh.BucketCount._make)

PRUNE_COUNT = Read.rows("prune_count", sh.PruneCountRow._make)
PRUNE_PICK = Read.rows("prune_pick", sh.IdRow._make)
PRUNE_TASKS = Read.rows("prune_tasks", sh.PrunedTaskRow._make)
PRUNE_AUDIT = Read.rows("prune_audit", sh.AuditGoneRow._make)
PRUNE_AUDIT_WALK = Read.rows("prune_audit_walk", sh.AuditWalkRow._make)
PRUNE_AUDIT_GONE = Read.rows("prune_audit_gone", sh.AuditGoneRow._make)
PRUNE_EXPORT_AUDIT = Read.rows("prune_export_audit", sh.AuditEventRow._make)
PRUNE_EXPORT_LATE = Read.rows("prune_export_late", sh.LateExportRow._make)

LATE_EFFECTS_ALL = Read.rows("late_effects_all", _late_effect)
LATE_EFFECTS_TASK = Read.rows("late_effects_task", _late_effect)
LATE_EFFECTS_OF_TYPE = Read.rows("late_effects_of_type", _late_effect)
EFFECTS_OF_TYPE = Read.rows("effects_of_type", sh.TypeEffectRow._make)

WORKERS_ALL = Read.rows("workers_all", _worker)
WORKERS_ON_HOST = Read.rows("workers_on_host", _worker)
WORKERS_PRUNE = Read.rows("workers_prune", sh.HolderRow._make)
DEFINITIONS_OF = Read.rows("definitions_of", sh.SpecRow._make)
DEFINITIONS_ALL = Read.rows("definitions_all", sh.DefinitionRow._make)
WORKER_DEFINITION_SPECS = Read.rows("worker_definition_specs", sh.HolderSpecRow._make)
READY_BY_VERSION = Read.rows("ready_by_version", sh.VersionReadyRow._make)
LIVE_DEFINITIONS = Read.rows("live_definitions", sh.LiveRow._make)
LIVE_WORKER_SLOTS = Read.rows("live_worker_slots", sh.WorkerSlotRow._make)

WAKE_DUE = Read.rows("wake_due", sh.WokenRow._make)
WAIT_EVENT_CHECK = Read.rows("wait_event_check", sh.IdRow._make)
WAIT_CHILDREN = Read.rows("wait_children", tuple)
EVENT_INSERT = Read.rows("event_insert", sh.EventSeqRow._make)
EVENT_GET = Read.rows("event_get", sh.EventRow._make)
EVENT_DELIVER = Read.rows("event_deliver", sh.DeliveredRow._make)
TASK_WAIT = Read.rows("task_wait", sh.WaitRow._make)
COMPENSABLE_READ = Read.rows("compensable_read", sh.IdRow._make)

BATCH_RUNS_READ = Read.rows("batch_runs_read", sh.BatchRunRow._make)
BATCH_EFFECTS = Read.rows("batch_effects", sh.TaskEffectRow._make)
BATCH_RUNS_ACTIVE = Read.rows("batch_runs_active", sh.BatchActiveRow._make)


# ---------------------------------------------------------------- schedules


def schedule_record(row: Iterable[Any]) -> ScheduleRecord:
    """A ``schedules`` row (its column order, :class:`~ratchet.ledger.shapes.ScheduleRow`)
    as a :class:`~ratchet.ledger.records_schedules.ScheduleRecord`."""
    r = sh.ScheduleRow(*row)
    return ScheduleRecord(
        r.name, r.task, r.spec, r.tz, float(r.misfire_grace_s), int(r.cursor_at),
        None if r.last_fired_at is None else int(r.last_fired_at), int(r.fired),
        int(r.missed), None if r.last_missed_at is None else int(r.last_missed_at),
        r.last_missed_reason, float(r.first_registered_at), float(r.registered_at),
        r.registered_by, float(r.seen_at), r.seen_by)


SCHEDULES_ALL = Read.rows("schedules_all", schedule_record)
SCHEDULE_CURSORS = Read.rows("schedule_cursors", schedule_record)
SCHEDULE_ADVANCE = Read.rows("schedule_advance", schedule_record)
