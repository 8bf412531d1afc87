"""The reports :class:`ratchet.Control` gives about the system as a whole (status,
throughput, versions and definitions, workers, limits, reconcile counts): frozen
dataclasses whose ``dataclasses.asdict`` is their JSON form (the CLI's ``--json``, the
HTTP API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..capacity import TypeStatusView
from ..ledger.base import AuditEvent, OutboxStats, PauseRecord
from ..worker.registry import GONE_STATES
from ._flowviews import QueueStatusView, RateLimitView, TypeFlowView

__all__ = [
    "DEFAULT_LEASE_S",
    "LIVE_WORKER_S",
    "MAX_BUCKETS",
    "MAX_WINDOW_S",
    "DefinitionView",
    "LimitView",
    "LimitsReport",
    "ReconcileCounts",
    "StatusReport",
    "ThroughputBucket",
    "UsageView",
    "VersionWaitView",
    "WorkerView",
]


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
        claims: claims, from the audit log (this and the six counts below count every
            audit row ever written, kept when ``prune`` deletes the rows).
        takeovers: claims that took a task over from a holder whose lease expired.
        revocations: leases taken away from a holder whose process was seen gone.
        stale_rejections: writes refused because their holder's claim was stale.
        lookup_hits: effects settled by asking the target (a lookup) instead of calling.
        idempotency_conflicts: submits refused: a known key with other params.
        operator_actions: audited operator commands (resolve, cancel, retry, pause, ...).
        durability: the durability level (``fsync``, ``buffered``, ``replicated``).
        backend_settings: what the level maps to (SQLite pragmas, PostgreSQL settings).
        schema_version: the ledger's schema version.
        ledger_now: the ledger clock, epoch seconds.
        late_effects: calls sent by holders after their claim was taken over
            (:meth:`Control.late_effects`), both kinds.
        late_effects_accounted_for: those of them accounted for (a lookup hit settled
            the effect with the late call's execution); the rest are possible duplicates.
        pauses: the active pauses (scope, target, who, why, since, version) with the
            RUNNING tasks in each scope still short of a safe boundary.
        window_s: the window of the arrival and completion rates, seconds.
        drain_within_s: the time to drain each backlog in the status was asked for,
            seconds (each type's ``slots_needed``); None: not asked.
        types: the capacity view per task type (:class:`TypeStatusView`), by name: every
            type with a task in the ledger or one that arrived or finished in the window.
        totals: the same figures over every type (a :class:`TypeStatusView` named
            :data:`ALL_TYPES`): counts, backlog, rates summed, the oldest ages the oldest
            of any type, the drain ETA from the summed rates. None only on a report not
            made by :meth:`Control.status`.
        queues: the live tasks per queue (:class:`~ratchet.control.QueueStatusView`):
            ready, scheduled, running, waiting for a key slot, rate-limited, parked.
        flow: per task type with tasks flow control holds back, how many
            (:class:`~ratchet.control.TypeFlowView`: rate-limited, waiting for a key slot).
        outbox: the outbox's backlog, oldest unsent age, relays and failing messages
            (:class:`~ratchet.control.OutboxStats`, as :meth:`Control.outbox`); None on a
            ledger without an outbox (schema below 16).
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
    drain_within_s: float | None = None
    types: list[TypeStatusView] = field(default_factory=list)
    totals: TypeStatusView | None = None
    queues: list[QueueStatusView] = field(default_factory=list)
    flow: list[TypeFlowView] = field(default_factory=list)
    outbox: OutboxStats | None = None


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
        changes: the latest limit changes, rate limits' too (audit events, newest first).
        ledger_now: the ledger clock of the read, epoch seconds.
        rate_limits: every rate limit with the tasks it holds back now
            (:class:`~ratchet.control.RateLimitView`).
    """

    limits: list[LimitView]
    usage: list[UsageView]
    running: int
    changes: list[AuditEvent]
    ledger_now: float
    rate_limits: list[RateLimitView] = field(default_factory=list)
