"""The shape of each catalogue statement's rows, by name (DESIGN §10).

One :class:`~typing.NamedTuple` per result (a shape several statements share is named once):
the engine reads ``row.generation``, never ``row[2]``. Both catalogues
(``ledger/sql/<dialect>.sql``) select the same columns in the same order, so one shape
serves both dialects; :mod:`ratchet.ledger.rows` binds each statement to its shape.
Times are ledger-clock epoch seconds; ``Any`` marks a stored value read as the database
gives it (a state that may not be a known one, a 0/1 flag).
"""

from __future__ import annotations

from typing import Any, NamedTuple


class TaskRow(NamedTuple):
    """A task row as ``task_get`` / ``task_get_many`` / ``tasks_list`` select it
    (:data:`~ratchet.ledger.rows.TASK_COLUMNS`; ``tasks_list`` has no ``last_traceback``)."""
    id: str
    name: str
    version: int
    state: Any
    generation: int
    attempt: int
    max_attempts: int
    holder: str | None
    lease_until: float | None
    run_at: float
    created_at: float
    updated_at: float
    idempotency_key: str | None
    params: str | None
    params_digest: str
    result: str | None
    last_error: str | None
    error_class: str | None
    tenant: str | None = None
    quarantined: Any = 0
    last_traceback: str | None = None
    parent_id: str | None = None
    queue: str = "default"
    priority: int = 0
    ckey: str | None = None
    key_slot: Any = 0
    rate_key: str | None = None
    flow_wait: str | None = None


class EffectRow(NamedTuple):
    """An effect row as ``timeline_effects`` selects it (:data:`EFFECT_COLUMNS`)."""
    name: str
    key: str
    params_digest: str
    state: Any
    result: str | None
    generation: int
    attempt: int
    calls: int
    via_lookup: Any
    updated_at: float
    seq: int | None


class TaskEffectRow(NamedTuple):
    """An effect row with its task (``claim_effects``)."""
    task_id: str
    name: str
    key: str
    params_digest: str
    state: Any
    result: str | None
    generation: int
    attempt: int
    calls: int
    via_lookup: Any
    updated_at: float
    seq: int | None


class TypeEffectRow(NamedTuple):
    """An effect of a task of one type with the task's facts (``effects_of_type``)."""
    task_id: str
    task_state: Any
    task_generation: int
    created_at: float
    name: str
    key: str
    params_digest: str
    state: Any
    result: str | None
    generation: int
    attempt: int
    calls: int
    via_lookup: Any
    updated_at: float
    seq: int | None


class StepRow(NamedTuple):
    """A step row (``timeline_steps``)."""
    name: str
    result: str
    generation: int
    committed_at: float
    seq: int | None


class TaskStepRow(NamedTuple):
    """A step row with its task (``claim_steps``)."""
    task_id: str
    name: str
    result: str
    generation: int
    committed_at: float
    seq: int | None


class LeaseRow(NamedTuple):
    """A locked ``RUNNING`` row whose holder may be gone (``claim_expired``, ``holder_running``)."""
    id: str
    holder: str
    generation: int
    attempt: int
    max_attempts: int
    name: str
    control_request: str | None
    crash_count: int | None
    quarantine_after: int | None


class ClaimRow(NamedTuple):
    """A task a claim leased (``claim_takeover``, ``claim_ready``, ``claim_limited``);
    ``from_state``: its state before."""
    id: str
    name: str
    version: int
    params: str
    generation: int
    attempt: int
    max_attempts: int
    lease_s: float
    lease_until: float
    from_state: str
    control_request: str | None
    trace_context: str | None


class FenceRow(NamedTuple):
    """The fence of a write (``fence_read``)."""
    id: str
    state: Any
    generation: int
    attempt: int
    name: str
    control_request: str | None


class StreakRow(NamedTuple):
    """A task's failure streak (``quarantine_read``)."""
    id: str
    fingerprint: str | None
    streak: int | None
    quarantine_after: int | None


class IntentRow(NamedTuple):
    """An open effect intent (``open_intents``)."""
    task_id: str
    name: str
    key: str


class EffectKeyRow(NamedTuple):
    """An effect's name and key (``resolve_open_effects``)."""
    name: str
    key: str


class IdRow(NamedTuple):
    """One id (``submit_present``, ``pause_insert``, ``quarantine_lock``, ``prune_pick``)."""
    id: Any


class KeyRow(NamedTuple):
    """The task holding an idempotency key (``submit_existing``)."""
    key: str
    id: str
    params_digest: str
    created_at: float


class OutboxSameRow(NamedTuple):
    """An outbox row of a chosen message id, read back after its insert (``outbox_same``)."""
    message_id: str
    task_id: str | None
    topic: str
    key: str | None
    payload: str


class DebounceRow(NamedTuple):
    """The open task of a debounce group after a submit (``submit_debounce``): its id,
    the group, its state and when it starts (``run_at``, or ``due_at`` while it waits for
    a concurrency key slot)."""
    id: str
    name: str
    key: str
    state: Any
    start: float


class LeaseUntilRow(NamedTuple):
    """A lease and its end (``renew``, ``renew_held``)."""
    id: str
    generation: int
    lease_until: float


class ResolveRow(NamedTuple):
    """An ``UNKNOWN`` task's facts for its resolution (``resolve_lock``)."""
    state: Any
    generation: int
    name: str
    control_request: str | None


class ControlRow(NamedTuple):
    """A task as an operator command reads it (``control_lock``)."""
    state: Any
    generation: int
    name: str
    control_request: str | None
    holder: str | None
    lease_until: float | None
    attempt: int
    max_attempts: int
    updated_at: float


class RequestRow(NamedTuple):
    """An operator request on a held lease (``control_requests``)."""
    id: str
    generation: int
    request: str


class PauseRow(NamedTuple):
    """An active pause (``pauses_active``)."""
    id: int
    scope: str
    target: str
    version: int
    paused_by: str
    reason: str
    created_at: float


class PauseEndRow(NamedTuple):
    """A pause a resume ended (``pause_resume``)."""
    id: int
    version: int


class PausedRow(NamedTuple):
    """A ``PAUSED`` task (``paused_tasks``)."""
    id: str
    name: str
    generation: int
    control_request: str | None


class ValueRow(NamedTuple):
    """A single value (``pause_version``, ``stats_oldest``, ``stats_unknown``)."""
    value: Any


class NameCount(NamedTuple):
    """A count per task type (``running_by_type``, ``status_quarantined``,
    ``rate_held``)."""
    name: str
    n: int


class KindCount(NamedTuple):
    """A count per audit kind (``counts_window_audit``, ``stats_kinds``)."""
    kind: str
    n: int


class StateCount(NamedTuple):
    """A count per task type and state (``counts_window_tasks``, ``stats_counts``)."""
    name: str
    state: str
    n: int


class LimitRow(NamedTuple):
    """A concurrency limit (``limits_all``, ``limit_upsert``, ``limit_delete``)."""
    scope: str
    name: str
    reserved: int
    maximum: int | None
    version: int
    updated_at: float
    updated_by: str
    reason: str


class RateSettingRow(NamedTuple):
    """A rate limit (``rate_limit_list``, ``rate_limit_set``, ``rate_limit_clear``)."""
    scope: str
    name: str
    rate_per_s: float
    burst: int
    key_param: str | None
    source: str
    version: int
    updated_at: float
    updated_by: str | None
    reason: str | None


class TakenRow(NamedTuple):
    """The tokens left in a bucket after a take (``rate_take``)."""
    tokens: float


class TakeWaitRow(NamedTuple):
    """A refused take: the task's fence and its bucket (``rate_take_wait``)."""
    generation: int
    state: Any
    tokens: float | None
    updated_at: float | None


class FlowCountRow(NamedTuple):
    """Live tasks per type, queue, state and flow wait, and those due now
    (``flow_counts``)."""
    name: str
    queue: str
    state: Any
    flow_wait: str | None
    n: int
    due: int


class RunningRow(NamedTuple):
    """RUNNING tasks per type and tenant (``limits_running``)."""
    name: str
    tenant: str | None
    n: int


class ReadyGroupRow(NamedTuple):
    """A reserved scope with ready work (``limits_ready``)."""
    scope: str
    name: str


class SlotReadyRow(NamedTuple):
    """Ready tasks per type and tenant (``slot_ready``)."""
    name: str
    tenant: str | None
    n: int
    oldest: float


class AuditEventRow(NamedTuple):
    """An audit row (``timeline_audit``, ``limits_audit``, ``prune_export_audit``)."""
    seq: int
    task_id: str
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    generation: int | None
    holder: str | None
    detail: str | None


class QuarantineGroupRow(NamedTuple):
    """Quarantined tasks per fingerprint (``quarantine_groups``)."""
    fingerprint: str
    name: str
    n: int
    first_at: float
    last_at: float


class QuarantineSampleRow(NamedTuple):
    """A quarantined task of a group (``quarantine_samples``)."""
    fingerprint: str
    id: str
    last_error: str | None
    error_class: str | None


class ReplayRow(NamedTuple):
    """A quarantined task a replay picks (``quarantine_pick``)."""
    id: str
    name: str
    generation: int
    failures: int
    crashes: int
    updated_at: float


class MarkRow(NamedTuple):
    """The counts mark (``counts_read_mark``, ``counts_mark_share``)."""
    upto: float


class CountsLockRow(NamedTuple):
    """The counts mark and the horizon it may advance to (``counts_lock``)."""
    upto: float
    horizon: float


class LateCountRow(NamedTuple):
    """Late effects in all and accounted for (``stats_late``)."""
    total: int
    accounted_for: int


class ReadyRow(NamedTuple):
    """Ready tasks of a type (``status_ready``)."""
    name: str
    scheduled: int | None
    oldest: float | None


class UnknownRow(NamedTuple):
    """``UNKNOWN`` tasks of a type (``status_unknown``)."""
    name: str
    n: int
    oldest: float
    entered: int | None
    recent: int | None


class ArrivalRow(NamedTuple):
    """Arrivals of a type in a window (``status_arrivals``)."""
    name: str
    n: int
    recent: int | None
    last: float


class CompletionRow(NamedTuple):
    """Completions of a type in a window (``status_completions``)."""
    name: str
    n: int
    recent: int | None


class AttemptsRow(NamedTuple):
    """Ended attempts of a type in a window and their summed duration (``status_attempts``)."""
    name: str
    n: int
    total_s: float | None


class BucketCount(NamedTuple):
    """A count per time bucket (``throughput_arrivals``, ``throughput_completions``)."""
    bucket: int
    n: int


class PruneCountRow(NamedTuple):
    """What a prune would delete (``prune_count``)."""
    tasks: int
    steps: int
    effects: int
    late_effects: int
    audit: int


class PrunedTaskRow(NamedTuple):
    """A deleted task (``prune_tasks``)."""
    id: str
    name: str
    state: str
    updated_at: float


class AuditGoneRow(NamedTuple):
    """A deleted audit row (``prune_audit``, ``prune_audit_gone``)."""
    kind: str
    at: float


class AuditWalkRow(NamedTuple):
    """An audit row of the prune's walk (``prune_audit_walk``)."""
    seq: int
    task_id: str
    at: float


class LateExportRow(NamedTuple):
    """A late effect as exported (``prune_export_late``)."""
    seq: int
    task_id: str
    effect: str
    key: str
    generation: int
    holder: str
    at: float
    outcome: str
    detail: str | None


class HolderRow(NamedTuple):
    """A worker's holder id (``workers_prune``)."""
    holder: str


class GenerationRow(NamedTuple):
    """A step's generation (``transaction_step_read``)."""
    generation: int


class SpecRow(NamedTuple):
    """A stored definition's spec (``definitions_of``)."""
    name: str
    version: int
    spec: str


class DefinitionRow(NamedTuple):
    """A stored definition (``definitions_all``)."""
    name: str
    version: int
    spec: str
    first_registered_at: float
    last_registered_at: float


class HolderSpecRow(NamedTuple):
    """A registered worker's definition spec (``worker_definition_specs``)."""
    holder: str
    spec: str


class VersionReadyRow(NamedTuple):
    """Ready tasks per type and version (``ready_by_version``)."""
    name: str
    version: int
    n: int
    oldest: float


class LiveRow(NamedTuple):
    """Live workers per type and version (``live_definitions``)."""
    name: str
    version: int
    n: int


class WorkerSlotRow(NamedTuple):
    """A live worker, one type it registered and its slots (``live_worker_slots``)."""
    holder: str
    name: str
    slots: int | None
    queues: str | None


class BudgetCountRow(NamedTuple):
    """A retry budget's summed bucket (``budget_window``)."""
    budget: str
    bucket: int
    calls: int | None
    retries: int | None


class WokenRow(NamedTuple):
    """A parked task the claim's wake-up made ``PENDING`` (``wake_due``)."""
    id: str
    generation: int
    wait_kind: str | None


class EventSeqRow(NamedTuple):
    """An event stored in the mailbox (``event_insert``)."""
    seq: int


class EventRow(NamedTuple):
    """An event as stored (``event_get``)."""
    seq: int
    event_id: str
    name: str
    key: str
    payload: str
    sent_at: float


class DeliveredRow(NamedTuple):
    """A waiting task an event was delivered to (``event_deliver``)."""
    id: str
    generation: int


class WaitRow(NamedTuple):
    """What a task waits for, and its parent (``task_wait``)."""
    id: str
    parent_id: str | None
    state: Any
    wait_kind: str | None
    wait_name: str | None
    wait_key: str | None
    wait_count: int | None
    run_at: float


class BatchRunRow(NamedTuple):
    """A ``ctx.batches`` run (``batch_runs_read``); ``above`` is JSON text."""
    task_id: str
    run: str
    watermark: int
    above: str
    succeeded: int
    failed: int
    skipped: int
    batches: int
    total: int | None
    done: Any
    started_at: float
    updated_at: float
    generation: int


class BatchActiveRow(NamedTuple):
    """Unfinished batch runs of one task type (``batch_runs_active``)."""
    name: str
    runs: int
    watermark: int | None
    processed: int | None

# ---------------------------------------------------------------- schedules


class ScheduleRow(NamedTuple):
    """A periodic schedule's row (``schedules_all``, ``schedule_cursors``,
    ``schedule_advance``)."""
    name: str
    task: str
    spec: str
    tz: str
    misfire_grace_s: float
    cursor_at: int
    last_fired_at: int | None
    fired: int
    missed: int
    last_missed_at: int | None
    last_missed_reason: str | None
    first_registered_at: float
    registered_at: float
    registered_by: str
    seen_at: float
    seen_by: str


class FlowRow(NamedTuple):
    """One row of ``claim_flow``: ``kind`` ``queue`` (``name``, ``queue``: a pair),
    ``rate`` (``name``, ``rate_per_s``, ``burst``, ``key_param``: a type's rate limit) or
    ``priority`` (a claimable task has a priority)."""
    kind: str
    name: str | None
    queue: str | None
    rate_per_s: float | None
    burst: int | None
    key_param: str | None


class QueuePairRow(NamedTuple):
    """A (task name, queue) pair ever submitted (``claim_flow``)."""
    name: str
    queue: str


class RateLimitTypeRow(NamedTuple):
    """A rate limit on a task type as the claim reads it (``claim_flow``)."""
    name: str
    rate_per_s: float
    burst: int
    key_param: str | None


class CandidateRow(NamedTuple):
    """A ready task a claim under flow control may take (``claim_candidates``,
    ``claim_fair_candidates``)."""
    id: str
    name: str
    tenant: str | None
    fair_key: str | None
    rate_key: str | None
    params: str
    priority: int
    run_at: float


class RefillRow(NamedTuple):
    """A key whose admission found its lock taken (``key_refill_take``)."""
    name: str
    key: str
    max: int


class FairKeyRow(NamedTuple):
    """A fairness key with ready-state tasks (``claim_fair_keys``)."""
    key: str


class BucketRow(NamedTuple):
    """A rate-limit token bucket (``rate_buckets_lock``)."""
    scope: str
    name: str
    key: str
    tokens: float
    updated_at: float
