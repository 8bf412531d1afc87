"""The records :class:`ratchet.Control` answers with: frozen dataclasses whose
``dataclasses.asdict`` is their JSON form (the CLI's ``--json``, the HTTP API).

The views of what the ledger stores (:class:`TaskTimeline`, :class:`StepView`,
:class:`EffectView`, :class:`LateEffectView`, :class:`TaskEffectView`,
:class:`QuarantineGroupView`) are built from the ledger's records
(:mod:`ratchet.ledger.base`) by their ``from_record`` / ``from_timeline``: the fields both
have by the same name are copied (the list is derived from the two classes, so a field the
ledger adds under a view's name is carried without a second copy of the code); the others
are the stored values decoded (``result_json`` -> ``result``, an ``Undecodable`` when not
JSON) or left out (digests, sequence numbers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .capacity import TypeStatusView
from .errortext import error_summary
from .ledger.base import (
    LATE_POSSIBLE_DUPLICATE,
    AuditEvent,
    EffectRecord,
    EffectState,
    LateEffect,
    PauseRecord,
    QuarantineGroup,
    ReplayedTask,
    StepRecord,
    TaskEffect,
    TaskInfo,
    Timeline,
)
from .serde import loads_stored
from .storedtext import StoredState, UndecodableText
from .worker.registry import GONE_STATES

__all__ = [
    "DEFAULT_LEASE_S",
    "LIVE_WORKER_S",
    "MAX_BUCKETS",
    "MAX_WINDOW_S",
    "DefinitionView",
    "EffectPage",
    "EffectView",
    "LateEffectView",
    "LimitView",
    "LimitsReport",
    "QuarantineGroupView",
    "ReconcileCounts",
    "ReplayReport",
    "StatusReport",
    "StepView",
    "TaskEffectView",
    "TaskTimeline",
    "ThroughputBucket",
    "UsageView",
    "VersionWaitView",
    "WorkerView",
]


def _copied(view: type, record: type, *, converted: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of ``view`` that ``record`` has by the same name, in the view's order,
    except those the view holds ``converted`` (decoded, or of another type)."""
    names = {f.name for f in dataclasses.fields(record)}
    return tuple(f.name for f in dataclasses.fields(view)
                 if f.name in names and f.name not in converted)


def _copy(record: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(record, n) for n in names}


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What ``ratchet status`` shows.

    Attributes:
        ledger: the ledger URL with any password redacted.
        backend: ``sqlite`` or ``postgresql``.
        counts: ``{task name: {state: count}}``.
        oldest_pending_age_s: age of the oldest ready PENDING/RETRY_WAIT task, seconds
            (``None`` when nothing is ready).
        unknown: tasks in ``UNKNOWN`` (waiting for an operator: ``ratchet resolve``).
        claims, takeovers, revocations, stale_rejections, lookup_hits,
        idempotency_conflicts, operator_actions: counts from the audit log, ever (kept
            when ``prune`` deletes the rows).
        durability: the durability level (``fsync``, ``buffered``, ``replicated``).
        backend_settings: what the level maps to (SQLite pragmas, PostgreSQL settings).
        schema_version: the ledger's schema version.
        ledger_now: the ledger clock, epoch seconds.
        late_effects: calls sent by holders after their claim was taken over
            (:meth:`Control.late_effects`), both kinds; late_effects_accounted_for: those
            of them accounted for (a lookup hit settled the effect with the late call's
            execution); the rest are possible duplicates.
        pauses: the active pauses (scope, target, who, why, since, version) with the
            RUNNING tasks in each scope still short of a safe boundary.
        window_s: the window of the arrival and completion rates, seconds.
        types: the capacity view per task type (:class:`TypeStatusView`), by name: every
            type with a task in the ledger or one that arrived or finished in the window.
        totals: the same figures over every type (a :class:`TypeStatusView` named
            :data:`ALL_TYPES`): counts, backlog, rates summed, the oldest ages the oldest
            of any type, the drain ETA from the summed rates. None only on a report not
            made by :meth:`Control.status`.
    """

    ledger: str
    backend: str
    counts: dict[str, dict[str, int]]
    oldest_pending_age_s: float | None
    unknown: int
    claims: int
    takeovers: int
    revocations: int
    stale_rejections: int
    lookup_hits: int
    idempotency_conflicts: int
    operator_actions: int
    durability: str
    backend_settings: dict[str, str]
    schema_version: int
    ledger_now: float
    late_effects: int = 0
    late_effects_accounted_for: int = 0
    versions: list[VersionWaitView] = field(default_factory=list)
    pauses: list[PauseRecord] = field(default_factory=list)
    """Ready tasks per pinned (name, version) with the live workers that have it; a
    version no live worker has waits (DESIGN §8)."""
    window_s: float = 60.0
    types: list[TypeStatusView] = field(default_factory=list)
    totals: TypeStatusView | None = None


MAX_WINDOW_S = 86_400.0
"""The longest window of the status rates and of :meth:`Control.throughput`, seconds."""

MAX_BUCKETS = 10_000
"""The most buckets :meth:`Control.throughput` returns."""


@dataclass(frozen=True, slots=True)
class ThroughputBucket:
    """Arrivals and completions in one time bucket (:meth:`Control.throughput`, the
    dashboard's arrival-vs-completion chart).

    Attributes:
        start: the bucket's start, epoch seconds (ledger clock); it lasts ``bucket_s``.
        arrivals: tasks created in it.
        completions: tasks that reached ``SUCCEEDED``, ``FAILED`` or ``CANCELLED`` in it.
    """

    start: float
    arrivals: int
    completions: int


LIVE_WORKER_S = 30.0
"""A registered worker counts as live for the version view while it is ``alive`` in the
registry and was seen (registry heartbeat every 5 s, lease renewals) within this many
seconds."""


@dataclass(frozen=True, slots=True)
class VersionWaitView:
    """Ready tasks (``PENDING`` / ``RETRY_WAIT``) of one pinned (name, version).

    Attributes:
        name, version: the task type and the definition version its tasks pinned.
        ready: how many (including those scheduled for later).
        oldest_run_at: the earliest ``run_at`` among them, epoch seconds.
        live_workers: live registered workers that have this version
            (:data:`LIVE_WORKER_S`; a ``--no-fast-takeover`` worker is not registered
            and is not counted).
        waiting: no live worker has this version: the tasks wait (never failed or
            dropped) until a worker that has it starts.
        note: ``"no live worker has version N"`` when waiting, else ``""``.
    """

    name: str
    version: int
    ready: int
    oldest_run_at: float
    live_workers: int
    waiting: bool
    note: str


@dataclass(frozen=True, slots=True)
class DefinitionView:
    """One definition registered by workers (``ratchet definitions``, DESIGN §8).

    Attributes:
        name, version: the task type and its definition version.
        spec: the stored spec (retry policy, ``lease_s``, ``params_schema``, ...), decoded
            (an :class:`~ratchet.serde.Undecodable` if it cannot be).
        first_registered_at, last_registered_at: ledger clock, epoch seconds.
        live_workers: live registered workers that have it (:data:`LIVE_WORKER_S`).
        last_registered_age_s: seconds since ``last_registered_at`` by the ledger clock.
    """

    name: str
    version: int
    spec: Any
    first_registered_at: float
    last_registered_at: float
    live_workers: int
    last_registered_age_s: float


@dataclass(frozen=True, slots=True)
class LateEffectView:
    """A call a stale holder sent after its claim was taken over (DESIGN §5), for
    reconciliation: a possible duplicate at a target that cannot deduplicate, unless
    accounted for (``kind``).

    Attributes:
        seq: the record's sequence number in the ledger.
        task_id, task_name: the task (``task_name`` None if the task row is gone).
        effect: the effect's stored name (``name`` or ``name#N`` for its N-th occurrence).
        key: the business idempotency key the late call carried.
        generation: the stale holder's fencing token; holder: the stale holder.
        at: ledger clock when it was recorded, epoch seconds.
        outcome: ``done`` (the call returned) or ``unknown`` (it raised; it may have
            executed).
        detail: the call's result (decoded JSON) or the error text.
        recorded_key: the key the ledger recorded for this effect (what the current
            holder settled), None if none.
        recorded_generation: the generation that recorded the effect's outcome, if any.
        kind: ``accounted_for`` (:data:`~ratchet.ledger.base.LATE_ACCOUNTED_FOR`): the
            effect's record was settled by a lookup hit and only one intent was ever
            recorded for it, so the late call was the only request sent and the hit found
            its execution (the new holder did not call); ``possible_duplicate``: anything
            else (check the target). Read from the record as it is now: a late effect
            recorded before the new holder's lookup settled the record changes kind then.
    """

    seq: int
    task_id: str
    task_name: str | None
    effect: str
    key: str
    generation: int
    holder: str
    at: float
    outcome: str
    detail: Any
    recorded_key: str | None
    recorded_generation: int | None
    kind: str = LATE_POSSIBLE_DUPLICATE

    @classmethod
    def from_record(cls, le: LateEffect, task_name: str | None,
                    effects: list[EffectRecord]) -> LateEffectView:
        """The view of ``le``, a late effect of task ``task_name`` (None: the task row is
        gone) whose recorded effects are ``effects``: its ``detail`` decoded when the call
        returned, and what the ledger recorded for that effect."""
        recorded = next((e for e in effects if e.name == le.effect), None)
        detail = (loads_stored(le.detail, f"late effect {le.effect!r} detail")
                  if le.outcome == "done" and le.detail is not None else le.detail)
        return cls(
            **_copy(le, _LATE_COPIED), task_name=task_name, detail=detail,
            recorded_key=recorded.key if recorded else None,
            recorded_generation=recorded.generation
            if recorded and recorded.state is not EffectState.INTENT else None,
        )


@dataclass(frozen=True, slots=True)
class StepView:
    """A committed step of a task.

    Attributes:
        name: the step name.
        result: the stored value, decoded (an :class:`~ratchet.serde.Undecodable` when the
            stored text is not JSON).
        generation: fencing generation of the claim that committed it.
        committed_at: ledger clock, epoch seconds.
    """

    name: str
    result: Any
    generation: int
    committed_at: float

    @classmethod
    def from_record(cls, s: StepRecord) -> StepView:
        """The view of ``s``, its stored result decoded."""
        return cls(**_copy(s, _STEP_COPIED),
                   result=loads_stored(s.result_json, f"step {s.name!r}"))


@dataclass(frozen=True, slots=True)
class EffectView:
    """An effect of a task, as the ledger records it.

    Attributes:
        name: effect name; key: its business idempotency key.
        state: ``intent`` (outcome not recorded), ``done``, ``not_done`` or ``given_up``;
            a :class:`~ratchet.storedtext.StoredState` when the row holds another value.
        result: the recorded result, decoded (``Undecodable`` when not JSON).
        generation, attempt: the claim that wrote it last.
        calls: how many times the call was made.
        via_lookup: the result came from a lookup, not from a call.
        updated_at: ledger clock, epoch seconds.
        undecodable: the fields shown as stored (``"state"`` for a state that is not a
            known one; ``"name"``, ``"key"`` for text that is not valid UTF-8).
    """

    name: str
    key: str
    state: str
    result: Any
    generation: int
    attempt: int
    calls: int
    via_lookup: bool
    updated_at: float
    undecodable: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, e: EffectRecord) -> EffectView:
        """The view of ``e``: its state as text, its result decoded, and in
        ``undecodable`` its fields shown as stored."""
        shown = tuple(f for f, v in (("name", e.name), ("key", e.key), ("state", e.state))
                      if isinstance(v, UndecodableText | StoredState))
        return cls(**_copy(e, _EFFECT_COPIED), state=e.state.value,
                   result=loads_stored(e.result_json, f"effect {e.name!r} result"),
                   undecodable=shown)


@dataclass(frozen=True, slots=True)
class TaskEffectView:
    """One effect of a task of a type, with its task (:meth:`Control.effects`).

    Attributes:
        task_id, task_name: the task. task_state: its state now (``SUCCEEDED``,
            ``UNKNOWN``, ...). task_generation: its current fencing generation.
        task_created_at: when it was submitted (ledger clock, epoch seconds).
        effect: the effect record (its ``name`` is the stored occurrence, ``name`` or
            ``name#N``).
    """

    task_id: str
    task_name: str
    task_state: str
    task_generation: int
    task_created_at: float
    effect: EffectView

    @classmethod
    def from_record(cls, te: TaskEffect, task_type: str) -> TaskEffectView:
        """The view of ``te``, an effect of a task of type ``task_type``."""
        return cls(**_copy(te, _TASK_EFFECT_COPIED), task_name=task_type,
                   task_state=te.task_state.value, effect=EffectView.from_record(te.effect))


@dataclass(frozen=True, slots=True)
class EffectPage:
    """A page of :meth:`Control.effects`.

    Attributes:
        effects: newest task first, by effect name within a task.
        next_cursor: pass it as ``cursor=`` for the next page; None when this is the last.
    """

    effects: list[TaskEffectView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class ReconcileCounts:
    """What reconcile runs recorded, ever (audit rows per kind, kept when prune deletes
    the rows; DESIGN §5, reconciliation): for a metrics collector
    (``ratchet_reconcile_findings_total{outcome=...}``).

    Attributes:
        runs: reconcile runs (audit kind ``reconcile``).
        findings: findings per outcome (``absent``, ``unrecorded``, ``not_executed``,
            ``unknown``, ``late``, ``late_accounted_for``, ``no_lookup``; audit kind
            ``reconcile_<outcome>``),
            and ``resolved``: findings a run's ``--apply`` resolved.
    """

    runs: int
    findings: dict[str, int]


@dataclass(frozen=True, slots=True)
class TaskTimeline:
    """What ``ratchet inspect`` shows: the task and everything the ledger knows about it.

    Attributes:
        task: the task row (params and result decoded; ``Undecodable`` when not JSON).
        events: audit events (claims, transitions, stale rejections, lookups, operator
            actions), oldest first.
        steps: committed steps, in code-path order.
        effects: effect records, in code-path order.
        late_effects: calls stale holders sent after a takeover (possible duplicates),
            newest first.
    """

    task: TaskInfo
    events: list[AuditEvent]
    steps: list[StepView]
    effects: list[EffectView]
    late_effects: list[LateEffectView] = field(default_factory=list)

    @classmethod
    def from_timeline(cls, tl: Timeline) -> TaskTimeline:
        """The view of the ledger's :class:`~ratchet.ledger.base.Timeline`: the same
        fields, each step, effect and late effect decoded."""
        effects = list(tl.effects)
        return cls(
            **_copy(tl, _TIMELINE_COPIED), events=list(tl.events),
            steps=[StepView.from_record(s) for s in tl.steps],
            effects=[EffectView.from_record(e) for e in effects],
            late_effects=[LateEffectView.from_record(le, tl.task.name, effects)
                          for le in tl.late_effects],
        )


@dataclass(frozen=True, slots=True)
class QuarantineGroupView:
    """Quarantined tasks of one error fingerprint (``ratchet quarantine list``, DESIGN §7).

    Attributes:
        fingerprint: the error fingerprint (16 hex digits; ``--fingerprint`` of a replay).
        task_type: the task type (part of the fingerprint).
        count: quarantined ``FAILED`` tasks with it.
        error_class: the recorded failure class of the newest one (``lease_expired``: its
            worker died on every counted delivery).
        example_message: the newest one's error, one line (``Class: message``, the
            message's first line).
        example_error: the newest one's recorded error message in full.
        first_seen, last_seen: ledger clock of the first and the latest quarantine, epoch s.
        task_ids: a sample of its task ids (at most 5), newest first.
    """

    fingerprint: str
    task_type: str
    count: int
    error_class: str | None
    example_message: str
    example_error: str | None
    first_seen: float
    last_seen: float
    task_ids: list[str]

    @classmethod
    def from_record(cls, g: QuarantineGroup) -> QuarantineGroupView:
        """The view of ``g``: its example error in full and as one line."""
        return cls(**_copy(g, _QUARANTINE_COPIED), task_type=g.name,
                   example_message=error_summary(g.example_error),
                   first_seen=g.first_at, last_seen=g.last_at, task_ids=list(g.task_ids))


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a quarantine replay did (or, with ``dry_run``, would do).

    Attributes:
        fingerprint: the replayed fingerprint.
        dry_run: True: nothing was changed.
        rate_per_s: admission rate, tasks per second (``run_at`` staggered by ``1/rate``).
        operator, reason: who and why (audited per task unless a dry run).
        tasks: the tasks, in replay order, with the ``run_at`` each gets.
        ledger_now: the ledger clock when it ran, epoch seconds.
    """

    fingerprint: str
    dry_run: bool
    rate_per_s: float
    operator: str
    reason: str
    tasks: list[ReplayedTask]
    ledger_now: float


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker process in the registry (``ratchet workers``).

    Attributes:
        holder: lease-holder identity. host_id: host + PID-namespace identity.
        hostname, pid: where it runs.
        state: ``alive``, ``stopped`` (clean exit) or ``dead`` (revoked).
        process: for an ``alive`` worker on this host, what the OS says of its process
            (:func:`~ratchet.worker.registry.process_state`: ``running``, ``stopped``,
            ``tracing-stop``, ``disk-sleep``, ``zombie`` or ``gone``); ``other host`` when
            it cannot be judged from here, ``-`` when not alive.
        started_at, last_seen: ledger clock, epoch seconds.
        last_seen_age_s: seconds between its last registry heartbeat and the ledger clock.
        lease_s: the lease it is judged by, seconds: the shortest ``lease_s`` of the
            definitions it registered (:data:`DEFAULT_LEASE_S` when it registered none).
        unresponsive: an ``alive`` worker whose last heartbeat (registry heartbeat or lease
            renewal) is older than ``lease_s`` (and than
            :data:`~ratchet.worker.registry.UNRESPONSIVE_FLOOR_S`): frozen (SIGSTOP, a VM
            pause), hung, or cut off from the ledger; its leases expire and are taken over.
            Its process may still exist (``process`` says ``stopped`` for a SIGSTOP).
    """

    holder: str
    host_id: str
    hostname: str
    pid: int
    state: str
    process: str
    started_at: float
    last_seen: float
    last_seen_age_s: float
    lease_s: float = 15.0
    unresponsive: bool = False

    @property
    def process_gone(self) -> bool:
        """An ``alive`` worker on this host whose process is ``gone`` or a ``zombie``: it
        will never write again (its leases are revoked by a same-host peer)."""
        return self.state == "alive" and self.process in GONE_STATES


DEFAULT_LEASE_S = 15.0
"""The lease of a task definition that names none (``App.task(lease_s=15.0)``), seconds."""


@dataclass(frozen=True, slots=True)
class LimitView:
    """One concurrency limit and its live use (``ratchet limits``, DESIGN §8).

    Attributes:
        scope: ``total``, ``type`` or ``tenant``; name: the task type or tenant (``""``
            for the total).
        reserved: slots of the total kept for the scope while it has ready work.
        maximum: the cap on its RUNNING tasks (for the total: the number of slots), or
            None.
        running: its RUNNING tasks now (expired leases not yet taken over included).
        ready: its ready tasks now; oldest_ready_age_s: age of the oldest, seconds (None
            when none is ready).
        version, updated_at, updated_by, reason: the row's last change.
    """

    scope: str
    name: str
    reserved: int
    maximum: int | None
    running: int
    ready: int
    oldest_ready_age_s: float | None
    version: int
    updated_at: float
    updated_by: str
    reason: str


@dataclass(frozen=True, slots=True)
class UsageView:
    """RUNNING and ready tasks of one task type (all tenants)."""

    name: str
    running: int
    ready: int
    oldest_ready_age_s: float | None


@dataclass(frozen=True, slots=True)
class LimitsReport:
    """What ``ratchet limits`` shows.

    Attributes:
        limits: every limit with its live use, ordered by scope and name.
        usage: per task type with RUNNING or ready tasks, limited or not.
        running: RUNNING tasks in all.
        changes: the latest limit changes (audit events, newest first).
        ledger_now: the ledger clock of the read, epoch seconds.
    """

    limits: list[LimitView]
    usage: list[UsageView]
    running: int
    changes: list[AuditEvent]
    ledger_now: float



_LATE_COPIED = _copied(LateEffectView, LateEffect, converted=("detail",))
_STEP_COPIED = _copied(StepView, StepRecord, converted=("result",))
_EFFECT_COPIED = _copied(EffectView, EffectRecord, converted=("state", "result", "undecodable"))
_TASK_EFFECT_COPIED = _copied(TaskEffectView, TaskEffect, converted=("task_state", "effect"))
_TIMELINE_COPIED = _copied(TaskTimeline, Timeline,
                           converted=("events", "steps", "effects", "late_effects"))
_QUARANTINE_COPIED = _copied(QuarantineGroupView, QuarantineGroup, converted=("task_ids",))
