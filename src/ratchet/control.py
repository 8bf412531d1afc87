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
:meth:`Control.schema_version`)
open the ledger with ``must_exist=True`` and without migrating: pointed at a file or
schema that holds no ledger they raise :class:`~ratchet.errors.LedgerUnavailable` and
change nothing. :meth:`Control.resolve` needs an existing ledger too (it migrates it if
older). :meth:`Control.migrate` creates or upgrades. :meth:`Control.submit` goes through
the :class:`~ratchet.app.App` (its registry checks the task name and params).

Later operations (list, cancel, retry, pause) are further methods of the same class on
the same two ledger handles (:meth:`_reader`, :meth:`_writer`), each returning a record.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

from .app import App, TaskHandle
from .capacity import ALL_TYPES, LimitReached, TypeStatusView, capacity_views
from .config import parse_ledger_url, redact_url
from .errors import ConfigError, InvalidArguments, LedgerCorrupt, LedgerError, TaskNotFound
from .errortext import error_summary
from .ledger import open_ledger
from .ledger.base import (
    LATE_ACCOUNTED_FOR,
    LATE_POSSIBLE_DUPLICATE,
    AuditEvent,
    ControlOutcome,
    EffectRecord,
    EffectState,
    LateEffect,
    Ledger,
    Limit,
    LimitScope,
    PauseRecord,
    PauseResult,
    PruneReport,
    QuarantineGroup,
    ReplayedTask,
    ResolveOutcome,
    TaskEffect,
    TaskInfo,
    TaskQuery,
    Timeline,
)
from .ledger.migrations import load_migrations
from .serde import Undecodable, dumps, loads_stored, printable
from .states import State
from .storedtext import StoredState, UndecodableText
from .validation import MAX_KEY_BYTES, MAX_NAME_BYTES, check_identifier, check_rate_per_s
from .worker.registry import GONE_STATES, UNRESPONSIVE_FLOOR_S, host_identity, process_state

__all__ = [
    "ALL_TYPES",
    "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE",
    "AuditEvent",
    "Control",
    "DefinitionView",
    "ControlOutcome",
    "EffectRecord",
    "EffectState",
    "EffectPage",
    "EffectView",
    "LateEffectView",
    "ReconcileCounts",
    "TaskEffectView",
    "LimitReached",
    "LimitView",
    "LimitsReport",
    "PruneReport",
    "REASON_REQUIRED",
    "PauseRecord",
    "PauseResult",
    "QuarantineGroupView",
    "ReplayReport",
    "ReplayedTask",
    "ResolveOutcome",
    "StatusReport",
    "StepView",
    "TaskInfo",
    "TaskPage",
    "TaskTimeline",
    "ThroughputBucket",
    "TypeStatusView",
    "Undecodable",
    "UsageView",
    "VersionWaitView",
    "WorkerView",
    "default_operator",
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


def _seconds(value: object, what: str, top: float) -> float:
    """``value`` as a finite number of seconds in (0, ``top``], else InvalidArguments."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= top):
        raise InvalidArguments(f"{what} must be a number of seconds above 0 and at most "
                               f"{top:g}, got {value!r}")
    return float(value)


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


@dataclass(frozen=True, slots=True)
class TaskPage:
    """A page of ``ratchet tasks`` / :meth:`Control.list_tasks`.

    Attributes:
        tasks: the tasks, newest first (params and results decoded).
        next_cursor: pass it as ``cursor=`` (``--cursor``) for the next page; None when
            this page is the last.
    """

    tasks: list[TaskInfo]
    next_cursor: str | None


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


def _where(url: str | None) -> str:
    """The redacted URL a ledger argument resolves to (env / default included)."""
    return redact_url(parse_ledger_url(url).url)


class Control:
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

    def __init__(self, ledger_url: str | None = None, *, app: App | None = None) -> None:
        if app is not None and not isinstance(app, App):
            raise ConfigError(f"app must be a ratchet.App, got {type(app).__name__}")
        if app is not None and ledger_url is not None:
            raise ConfigError(
                "give Control a ledger_url or an app, not both (the app's ledger is used)"
            )
        self._app = app
        self._url = app.ledger_url if app is not None else ledger_url
        if app is None or app.ledger_url is not None or not app.holds_ledger_object:
            parse_ledger_url(self._url)  # fail fast on a malformed URL (ConfigError)
        self._read: Ledger | None = None
        self._write: Ledger | None = None
        # One Control may serve many threads (``ratchet serve``'s threadpool): the ledgers
        # are thread-safe, their lazy opening is made so here (never two handles).
        self._open_lock = threading.Lock()

    # ------------------------------------------------------------------ ledgers

    def _reader(self) -> Ledger:
        """The ledger for read-only calls: must exist, never created or migrated."""
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger
        if self._read is None:
            with self._open_lock:
                if self._read is None:
                    self._read = open_ledger(self._url, migrate=False, must_exist=True)
        return self._read

    def _writer(self) -> Ledger:
        """The ledger for operator writes: must exist; migrated if older."""
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger
        if self._write is None:
            with self._open_lock:
                if self._write is None:
                    self._write = open_ledger(self._url, migrate=True, must_exist=True)
        return self._write

    def close(self) -> None:
        """Close the connections this object opened (not the App's)."""
        with self._open_lock:
            for led in (self._read, self._write):
                if led is not None:
                    led.close()
            self._read = self._write = None

    @property
    def can_submit(self) -> bool:
        """True when this Control was made with an App (:meth:`submit` needs its task
        registry)."""
        return self._app is not None

    def __enter__(self) -> Control:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "<ledger object>" if self._app is not None and self._app.holds_ledger_object \
            else _where(self._url)
        return f"<ratchet.Control ledger={where!r}>"

    # ------------------------------------------------------------------ reads

    def status(self, window_s: float = 60.0) -> StatusReport:
        """Counts per task type and state, oldest pending age, unknowns, audit counters,
        durability, ready tasks per pinned (name, version) with the live workers that
        have it (``versions``: a version no live worker has waits), and the capacity view
        per type (``types``, ``totals``: backlog, scheduled, rates over the last
        ``window_s`` seconds, net drain rate and drain ETA, oldest ages, unknown and
        quarantined counts; :class:`TypeStatusView`). Reads no history (DESIGN §9):
        the non-terminal rows from their indexes, and the window's rows by range scans of
        ``tasks_created`` / ``tasks_finished``; it first moves the counts mark forward in
        a short write transaction of its own (skipped if the ledger refuses the write).

        Args:
            window_s: the rate window, seconds (above 0, at most :data:`MAX_WINDOW_S`).

        Raises:
            InvalidArguments: ``window_s`` out of range.
            LedgerUnavailable: no ledger there (nothing is created), or unreachable.
            ConfigError: malformed URL.
        """
        window = _seconds(window_s, "window_s", MAX_WINDOW_S)
        led = self._reader()
        s = led.stats(window)
        pauses = _active_pauses(led)
        limits = _all_limits(led)
        usage = (led.slot_usage() if any(lim.scope is LimitScope.TENANT for lim in limits)
                 else None)
        types, totals = capacity_views(s.counts, s.capacity, s.ledger_now, window,
                                       pauses=pauses, limits=limits, usage=usage)
        return StatusReport(
            ledger=redact_url(led.config.url),
            backend=led.config.scheme,
            counts={name: dict(states) for name, states in s.counts.items()},
            oldest_pending_age_s=s.oldest_pending_age_s,
            unknown=s.unknown_count,
            claims=s.claims,
            takeovers=s.takeovers,
            revocations=s.revocations,
            stale_rejections=s.stale_rejections,
            lookup_hits=s.lookup_hits,
            idempotency_conflicts=s.idempotency_conflicts,
            operator_actions=s.operator_actions,
            durability=s.durability,
            backend_settings=dict(s.backend_settings),
            schema_version=s.schema_version,
            ledger_now=s.ledger_now,
            late_effects=s.late_effects,
            late_effects_accounted_for=s.late_effects_accounted_for,
            versions=[
                VersionWaitView(b.name, b.version, b.ready, b.oldest_run_at, b.live_workers,
                                b.live_workers == 0,
                                f"no live worker has version {b.version}"
                                if b.live_workers == 0 else "")
                for b in led.version_backlog(LIVE_WORKER_S)
            ],
            pauses=pauses,
            window_s=window,
            types=types,
            totals=totals,
        )

    def throughput(self, window_s: float = 600.0, bucket_s: float = 30.0,
                   name: str | None = None) -> list[ThroughputBucket]:
        """Arrivals and completions per bucket (the dashboard's arrival-vs-completion
        chart): ``ceil(window_s / bucket_s)`` buckets of ``bucket_s`` seconds, oldest
        first, the last one ending at the ledger clock, every bucket present (zeros when
        empty). Two range scans of the window (``tasks_created``, ``tasks_finished``):
        the cost follows the tasks in the window, never the history.

        Args:
            window_s: seconds (above 0, at most :data:`MAX_WINDOW_S`).
            bucket_s: seconds (above 0, at most ``window_s``; at most
                :data:`MAX_BUCKETS` buckets).
            name: one task type only (default: every type).

        Raises:
            InvalidArguments: a window or bucket out of range, a malformed name.
            LedgerUnavailable: no ledger there.
        """
        window = _seconds(window_s, "window_s", MAX_WINDOW_S)
        bucket = _seconds(bucket_s, "bucket_s", window)
        if math.ceil(window / bucket - 1e-9) > MAX_BUCKETS:
            raise InvalidArguments(f"window_s / bucket_s must be at most {MAX_BUCKETS} "
                                   f"buckets, got {window:g} / {bucket:g}")
        if name is not None:
            check_identifier(name, "task type", MAX_NAME_BYTES)
        return [ThroughputBucket(b.start, b.arrivals, b.completions)
                for b in self._reader().throughput(window, bucket, name)]

    def get(self, task_id: str) -> TaskInfo:
        """One task's row.

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        return self._reader().get(_task_id(task_id))

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """The rows of ``task_ids`` (those that exist, in no particular order): one read,
        for a face or a harness that follows many tasks at once (the demo's progress).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().get_many([_task_id(t) for t in task_ids])

    def history(self, task_id: str) -> Timeline:
        """The ledger's own record of one task (its row, audit events, step and effect
        records, late effects), undecoded: what :mod:`ratchet.testing`'s checks take.
        :meth:`inspect` is the same with the stored values decoded, for people.

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        return self._reader().timeline(_task_id(task_id))

    def ledger_now(self) -> float:
        """The ledger clock (epoch seconds), the clock every lease and audit row uses.

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().now()

    def ledger_corruption(self) -> LedgerCorrupt | None:
        """The last :class:`~ratchet.errors.LedgerCorrupt` a call of this Control (or of
        its App's ledger object) raised, or None: no read, what was seen. A damaged page
        fails only the calls that read it; ``ratchet serve``'s health check reports it.
        Kept until :meth:`close` (a restored ledger is a new file or server state, which
        a process opens anew)."""
        ledgers = [self._read, self._write]
        if self._app is not None and self._app.holds_ledger_object:
            ledgers.insert(0, self._app.ledger)
        for led in ledgers:
            if led is not None and led.corruption is not None:
                return led.corruption
        return None

    def schema_version(self) -> int:
        """The ledger's schema version (one small read; ``ratchet serve``'s health check
        with :meth:`ledger_now`).

        Raises:
            LedgerUnavailable: no ledger there, or unreachable.
        """
        return self._reader().schema_version()

    def inspect(self, task_id: str) -> TaskTimeline:
        """The task with its audit events, steps and effects (``ratchet inspect``).

        Values that cannot be decoded are returned as
        :class:`~ratchet.serde.Undecodable` (their text and the reason), not raised.

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        tl = self._reader().timeline(_task_id(task_id))
        task = tl.task
        return TaskTimeline(
            task=task,
            events=list(tl.events),
            steps=[
                StepView(s.name, loads_stored(s.result_json, f"step {s.name!r}"),
                         s.generation, s.committed_at)
                for s in tl.steps
            ],
            effects=[
                _effect_view(e) for e in tl.effects
            ],
            late_effects=[_late_view(le, task.name, tl.effects) for le in tl.late_effects],
        )

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffectView]:
        """Calls that stale holders sent after their claim was taken over, newest first:
        possible duplicates at targets that cannot deduplicate (a lookup-only target and a
        sender frozen between its lease check and its send; DESIGN §5). Each is listed with
        what the ledger recorded for that effect, for reconciliation against the target.

        Args:
            task_id: only this task's (default: every task's).
            limit: at most this many records (1-10000).

        Raises:
            InvalidArguments: ``limit`` out of range. LedgerUnavailable: no ledger there.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise InvalidArguments(f"limit must be an integer from 1 to 10000, got {limit!r}")
        led = self._reader()
        records = led.late_effects(None if task_id is None else _task_id(task_id), limit)
        views: list[LateEffectView] = []
        timelines: dict[str, Any] = {}
        for le in records:
            if le.task_id not in timelines:
                try:
                    timelines[le.task_id] = led.timeline(le.task_id)
                except TaskNotFound:
                    timelines[le.task_id] = None
            tl = timelines[le.task_id]
            views.append(_late_view(le, tl.task.name if tl else None,
                                    tl.effects if tl else []))
        return views

    def late_effects_of_type(self, task_type: str, *, newer_than_s: float | None = None,
                             limit: int = 1000) -> list[LateEffectView]:
        """Late effects of the tasks of one type, newest first (as :meth:`late_effects`).

        Args:
            task_type: the task name.
            newer_than_s: only those recorded less than this many seconds ago (ledger
                clock); None: any time.
            limit: at most this many (1-10000).

        Raises:
            InvalidArguments: a malformed type, age or limit. LedgerUnavailable: no ledger.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        _check_age(newer_than_s, "newer_than_s")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10000:
            raise InvalidArguments(f"limit must be an integer from 1 to 10000, got {limit!r}")
        led = self._reader()
        since = None if newer_than_s is None else led.now() - newer_than_s
        records = led.late_effects_of_type(task_type, since, limit)
        timelines: dict[str, list[EffectRecord]] = {}
        views = []
        for le in records:
            if le.task_id not in timelines:
                try:
                    timelines[le.task_id] = list(led.timeline(le.task_id).effects)
                except TaskNotFound:
                    timelines[le.task_id] = []
            views.append(_late_view(le, task_type, timelines[le.task_id]))
        return views

    def effects(self, task_type: str, *, newer_than_s: float | None = None,
                limit: int = 100, cursor: str | None = None) -> EffectPage:
        """The effects the ledger recorded for the tasks of one type, newest task first
        (``ratchet reconcile`` walks them; DESIGN §5). Effects live as long as their task
        (prune deletes them together).

        Args:
            task_type: the task name.
            newer_than_s: only tasks submitted less than this many seconds ago (ledger
                clock); None: any time.
            limit: effects per page, 1-1000.
            cursor: ``next_cursor`` of the previous page.

        Returns:
            An :class:`EffectPage` (keyset-paginated on (task created time, task id,
            effect name): rows added meanwhile neither shift nor repeat pages).

        Raises:
            InvalidArguments: a malformed type, age, limit or cursor.
            LedgerUnavailable: no ledger there.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        _check_age(newer_than_s, "newer_than_s")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArguments(f"limit must be an integer from 1 to 1000, got {limit!r}")
        after = _parse_effect_cursor(cursor)
        led = self._reader()
        since = None if newer_than_s is None else led.now() - newer_than_s
        found = led.effects_of_type(task_type, since, limit + 1, after)
        page = found[:limit]
        last = page[-1] if len(found) > limit and page else None
        next_cursor = (json.dumps([last.task_created_at, last.task_id, last.effect.name])
                       if last is not None else None)
        return EffectPage([_task_effect_view(te, task_type) for te in page], next_cursor)

    def reconcile_counts(self) -> ReconcileCounts:
        """Reconcile runs and findings per outcome, ever (:class:`ReconcileCounts`; reads
        no history, as :meth:`status`).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        kinds = self._reader().audit_kind_counts()
        prefix = "reconcile_"
        return ReconcileCounts(
            kinds.get("reconcile", 0),
            {k[len(prefix):]: n for k, n in sorted(kinds.items()) if k.startswith(prefix)})

    def record_reconcile(self, task_type: str, summary: Mapping[str, Any],
                         findings: Sequence[tuple[str, str, int | None, Mapping[str, Any]]],
                         *, by: str | None = None) -> None:
        """Audit one reconcile run (:mod:`ratchet.reconcile` calls it), in one transaction:
        a ``reconcile`` row (task id ``reconcile:<task_type>``, the operator, ``summary``
        as its detail) and one row per finding ``(task_id, outcome, generation, detail)``
        of kind ``reconcile_<outcome>`` on the task it is about (``ratchet inspect``
        shows it; :meth:`reconcile_counts` counts them).

        Raises:
            InvalidArguments: a malformed type, operator or outcome name.
            PayloadNotSerializable: a detail is not plain JSON.
            LedgerUnavailable: no ledger there.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        who = by if by is not None else default_operator()
        check_identifier(who, "operator name", MAX_KEY_BYTES)
        rows = []
        for task_id, outcome, generation, detail in findings:
            if not isinstance(outcome, str) or not outcome.isidentifier():
                raise InvalidArguments(f"a finding's outcome must be a plain name, got "
                                       f"{outcome!r}")
            rows.append((_task_id(task_id), f"reconcile_{outcome}", generation,
                         dumps(dict(detail), what="a reconcile finding")))
        self._writer().record_reconcile(task_type, who,
                                        dumps(dict(summary), what="a reconcile summary"),
                                        rows)

    def list_tasks(
        self,
        *,
        state: str | State | Sequence[str | State] | None = None,
        name: str | Sequence[str] | None = None,
        key: str | None = None,
        older_than_s: float | None = None,
        newer_than_s: float | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> TaskPage:
        """Tasks, newest first, filtered and paginated (``ratchet tasks``).

        Args:
            state: one state or several (``"UNKNOWN"``, ``State.FAILED``; case-insensitive).
            name: one task type or several.
            key: the submit idempotency key.
            older_than_s, newer_than_s: only tasks created more / less than this many
                seconds ago (by the ledger clock).
            limit: tasks per page, 1-1000.
            cursor: ``next_cursor`` of the previous page.

        Returns:
            A :class:`TaskPage`; keyset-paginated on (created time, id), so tasks added
            meanwhile neither shift nor repeat pages.

        Raises:
            InvalidArguments: an unknown state, a negative or non-finite age, ``limit`` out
                of range, a malformed cursor.
            LedgerUnavailable: no ledger there.
        """
        states = _states(state)
        names = (None if name is None else
                 (name,) if isinstance(name, str) else tuple(name))
        if names is not None:
            for n in names:
                check_identifier(n, "task name", MAX_KEY_BYTES)
        if key is not None:
            check_identifier(key, "idempotency key", MAX_KEY_BYTES)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise InvalidArguments(f"limit must be an integer from 1 to 1000, got {limit!r}")
        for label, age in (("older_than_s", older_than_s), ("newer_than_s", newer_than_s)):
            if age is not None and (isinstance(age, bool) or not isinstance(age, int | float)
                                    or not math.isfinite(age) or age < 0):
                raise InvalidArguments(f"{label} must be a finite number of seconds >= 0, "
                                       f"got {age!r}")
        led = self._reader()
        now = led.now() if older_than_s is not None or newer_than_s is not None else 0.0
        query = TaskQuery(
            states=states, names=names, key=key,
            created_from=None if newer_than_s is None else now - newer_than_s,
            created_to=None if older_than_s is None else now - older_than_s,
            limit=limit + 1, after=_parse_cursor(cursor),
        )
        found = led.list_tasks(query)
        page = found[:limit]
        more = len(found) > limit and page
        next_cursor = f"{page[-1].created_at!r}:{page[-1].task_id}" if more else None
        return TaskPage(page, next_cursor)

    def workers(self) -> list[WorkerView]:
        """The worker registry, with whether each ``alive`` worker's process still runs
        (judged only for workers on this host and PID namespace).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        now = led.now()
        here = host_identity()
        leases: dict[str, float] = {}
        for holder, spec_json in led.worker_definition_specs():
            spec = loads_stored(spec_json, f"worker {holder!r} definition spec")
            lease = spec.get("lease_s") if isinstance(spec, dict) else None
            if isinstance(lease, int | float) and not isinstance(lease, bool) and lease > 0:
                leases[holder] = min(float(lease), leases.get(holder, math.inf))
        views = []
        for w in led.list_workers(None):
            if w.state != "alive":
                process = "-"
            elif w.host_id == here:
                process = process_state(w.pid, w.pid_start)
            else:
                process = "other host"
            age = max(0.0, now - w.last_seen)
            lease_s = leases.get(w.holder, DEFAULT_LEASE_S)
            views.append(
                WorkerView(w.holder, w.host_id, w.hostname, w.pid, w.state, process,
                           w.started_at, w.last_seen, age, lease_s,
                           w.state == "alive" and age > max(lease_s, UNRESPONSIVE_FLOOR_S))
            )
        return views

    def prune_workers(self, older_than_s: float) -> list[str]:
        """Delete the registry rows of workers ``stopped`` (clean exit) or ``dead``
        (revoked) whose last heartbeat is more than ``older_than_s`` seconds old by the
        ledger clock; ``alive`` rows are never deleted (``ratchet workers --prune-after``;
        running workers do it themselves once a minute with a 24 h retention,
        :data:`ratchet.worker.registry.REGISTRY_RETENTION_S`).

        Returns:
            the holders whose rows were deleted, sorted.

        Raises:
            InvalidArguments: a negative or non-finite age. LedgerUnavailable: no ledger.
        """
        if (isinstance(older_than_s, bool) or not isinstance(older_than_s, int | float)
                or not math.isfinite(older_than_s) or older_than_s < 0):
            raise InvalidArguments(f"older_than_s must be a finite number of seconds >= 0, "
                                   f"got {older_than_s!r}")
        return self._writer().prune_workers(float(older_than_s))

    def definitions(self) -> list[DefinitionView]:
        """The definitions workers registered when they started, by (name, version), with
        how many live workers have each (DESIGN §8).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        now = led.now()
        return [
            DefinitionView(d.name, d.version,
                           loads_stored(d.spec_json, f"definition {d.name!r} spec"),
                           d.first_registered_at, d.last_registered_at, d.live_workers,
                           max(0.0, now - d.last_registered_at))
            for d in led.definitions(LIVE_WORKER_S)
        ]

    # ------------------------------------------------------------------ writes

    def resolve(
        self,
        task_id: str,
        outcome: str | ResolveOutcome,
        result: Any = None,
        *,
        reason: str,
        by: str | None = None,
    ) -> TaskInfo:
        """Settle an ``UNKNOWN`` task's open effect (audited); the task then resumes, or
        ends ``FAILED`` (give-up), or ``CANCELLED`` / ``PAUSED`` when a cancel / pause
        request was waiting for this resolution.

        Args:
            task_id: the task.
            outcome: ``"done"`` (the effect happened; ``result`` is its return value),
                ``"not-done"`` (it did not; the task calls again with the same key) or
                ``"give-up"`` (nobody can tell: the task ends ``FAILED`` with ``reason``,
                generation + 1, and its open effects are marked ``given_up``, so
                ``inspect`` shows the operator gave up on them; ``retry`` can run it
                again, lookup first).
            result: for ``done`` only: the effect's result, plain JSON (``None`` is
                recorded as null). Refused with ``not-done`` / ``give-up``.
            reason: why (kept in the audit log); must not be blank.
            by: the operator's name (default: the login name).

        Returns:
            the task after the change.

        Raises:
            InvalidArguments: unknown outcome, blank reason, a malformed operator name, a
                ``result`` with ``not-done`` / ``give-up``.
            PayloadNotSerializable: ``result`` is not plain JSON.
            TaskNotFound: no such task. IllegalTransition: the task is not ``UNKNOWN``.
            LedgerUnavailable: no ledger there.
        """
        try:
            verdict = ResolveOutcome(outcome)
        except ValueError:
            raise InvalidArguments(
                "outcome must be 'done', 'not-done' or 'give-up', got "
                f"{printable(str(outcome))!r}") from None
        if result is not None and verdict is not ResolveOutcome.DONE:
            raise InvalidArguments(
                f"a result is recorded only with outcome 'done', not {verdict.value!r} "
                "(nothing was changed)")
        reason, who = _operator_args(reason, by)
        result_json = dumps(result, what="the effect's result")
        return self._writer().resolve(_task_id(task_id), verdict, reason, who, result_json)

    def limits(self) -> LimitsReport:
        """The concurrency limits and their live use (DESIGN §8, ``ratchet limits``).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        limits = led.limits()
        usage = led.slot_usage()
        now = usage.ledger_now
        running_by: dict[tuple[str, str], int] = {}
        ready_by: dict[tuple[str, str], int] = {}
        oldest_by: dict[tuple[str, str], float] = {}
        for (name, tenant), n in usage.running.items():
            for key in (("type", name), ("tenant", tenant or "\x00"), ("total", "")):
                running_by[key] = running_by.get(key, 0) + n
        for (name, tenant), n in usage.ready.items():
            at = usage.oldest_ready_at[(name, tenant)]
            for key in (("type", name), ("tenant", tenant or "\x00"), ("total", "")):
                ready_by[key] = ready_by.get(key, 0) + n
                oldest_by[key] = min(oldest_by.get(key, at), at)
        views = [
            LimitView(lim.scope.value, lim.name, lim.reserved, lim.maximum,
                      running_by.get((lim.scope.value, lim.name), 0),
                      ready_by.get((lim.scope.value, lim.name), 0),
                      now - oldest_by[(lim.scope.value, lim.name)]
                      if (lim.scope.value, lim.name) in oldest_by else None,
                      lim.version, lim.updated_at, lim.updated_by, lim.reason)
            for lim in limits
        ]
        names = sorted({k[1] for k in running_by if k[0] == "type"}
                       | {k[1] for k in ready_by if k[0] == "type"})
        per_type = [
            UsageView(name, running_by.get(("type", name), 0), ready_by.get(("type", name), 0),
                      now - oldest_by[("type", name)] if ("type", name) in oldest_by else None)
            for name in names
        ]
        return LimitsReport(views, per_type, running_by.get(("total", ""), 0),
                            led.limit_changes(20), now)

    def set_limit(
        self,
        scope: str | LimitScope,
        name: str = "",
        *,
        reserved: int = 0,
        maximum: int | None = None,
        reason: str,
        by: str | None = None,
    ) -> Limit:
        """Create or replace a cluster-wide concurrency limit (DESIGN §8), audited.

        Every worker's next claim obeys it: the ledger is the one copy (no per-process
        configuration). Tasks already running above a lowered cap finish (no preemption).

        Args:
            scope: ``"total"`` (``maximum`` = the cluster's slots; no name), ``"type"``
                (``name`` = a task name) or ``"tenant"`` (``name`` = a tenant, as given
                to ``App.submit(..., tenant=)``).
            name: the task type or tenant.
            reserved: slots of the total kept for the scope while it has ready work (lent
                to others while it has none; only with a total).
            maximum: at most this many RUNNING tasks of the scope (>= 1), or None.
            reason: why (audited); must not be blank. by: the operator (default: login).

        Returns:
            the stored :class:`~ratchet.ledger.base.Limit`.

        Raises:
            InvalidArguments: unknown scope, a name for the total or none for a type or
                tenant, ``reserved > maximum``, ``maximum < 1``, reservations adding up
                to more than the total, a blank reason. LedgerUnavailable: no ledger.
        """
        kind = _limit_scope(scope)
        reason, who = _operator_args(reason, by)
        if kind is not LimitScope.TOTAL:
            check_identifier(name, f"{kind.value} name", MAX_KEY_BYTES)
        return self._writer().set_limit(kind, name, reserved, maximum, who, reason)

    def clear_limit(
        self, scope: str | LimitScope, name: str = "", *, reason: str, by: str | None = None
    ) -> Limit:
        """Remove a concurrency limit (audited); returns what it was.

        Raises:
            InvalidArguments: unknown scope, no such limit, a blank reason.
            LedgerUnavailable: no ledger there.
        """
        kind = _limit_scope(scope)
        reason, who = _operator_args(reason, by)
        return self._writer().clear_limit(kind, name, who, reason)

    def prune(
        self,
        older_than_s: float,
        *,
        dry_run: bool = False,
        batch_size: int = 500,
        export: str | os.PathLike[str] | None = None,
        by: str | None = None,
    ) -> PruneReport:
        """Delete finished tasks (``SUCCEEDED``, ``FAILED``, ``CANCELLED``) that finished more
        than ``older_than_s`` seconds ago (ledger clock), with their steps, effects, late
        effects and audit rows, and audit rows older than that whose task is gone; in
        batches of ``batch_size`` tasks, each its own short transaction that never makes a
        claim or a commit wait (DESIGN §10.2). Non-terminal tasks are never deleted.
        Audited (kind ``prune``: who, the age, the counts) unless ``dry_run``.

        A task's idempotency key deduplicates submits only while its row exists, and its
        effect records go with it: after the prune, the same key submits a new task (the
        dedupe window is the retention age).

        Args:
            older_than_s: the age, seconds (``ratchet.validation.parse_duration_s("30d")``).
            dry_run: only count what would be deleted; change nothing.
            batch_size: tasks per transaction, 1-10000.
            export: a file to append one JSON line per pruned task to (its row and history,
                stored JSON as text), written and flushed to disk before the batch's
                delete commits. A batch whose commit then fails is exported again by the
                next prune (at least once).
            by: the operator's name (default: the login name).

        Returns:
            a :class:`PruneReport` (what was deleted, or would be).

        Raises:
            InvalidArguments: a negative or non-finite age, ``batch_size`` out of range, a
                malformed operator name, ``export`` with ``dry_run``.
            OSError: the export file cannot be opened or written (the batch is rolled back).
            LedgerUnavailable: no ledger there.
        """
        if (isinstance(older_than_s, bool) or not isinstance(older_than_s, int | float)
                or not math.isfinite(older_than_s) or older_than_s < 0):
            raise InvalidArguments(f"older_than_s must be a finite number of seconds >= 0, "
                                   f"got {older_than_s!r}")
        if (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                or not 1 <= batch_size <= 10000):
            raise InvalidArguments(
                f"batch_size must be an integer from 1 to 10000, got {batch_size!r}")
        if dry_run and export is not None:
            raise InvalidArguments("a dry run deletes nothing, so it exports nothing: "
                                   "drop the export or the dry run")
        who = by if by is not None else default_operator()
        check_identifier(who, "operator name", MAX_KEY_BYTES)
        led = self._writer() if not dry_run else self._reader()
        if export is None:
            return led.prune(float(older_than_s), by=who, dry_run=dry_run,
                             batch_size=batch_size)
        with open(export, "a", encoding="utf-8") as out:
            def write(records: list[dict[str, Any]]) -> None:
                out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
                out.flush()
                os.fsync(out.fileno())

            return led.prune(float(older_than_s), by=who, batch_size=batch_size,
                             export=write)

    def cancel(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Cancel a task (``ratchet cancel``), audited with ``by``, ``reason`` and the
        ledger's time (DESIGN §3, arbitration).

        * ``PENDING`` (also scheduled for later), ``RETRY_WAIT``, ``PAUSED``: ``CANCELLED``
          at once, generation + 1 (``outcome="done"``): cancel before start wins.
        * ``RUNNING``: a cancel request is recorded (``outcome="requested"``); the holder
          learns of it within about a second and stops at its next step/effect boundary
          (its pipelined checkpoints committed first) with a fenced ``RUNNING ->
          CANCELLED``. An effect in flight is settled first (its reply, or a lookup); if
          the holder is dead, the ledger cancels once the lease has expired or the holder
          is revoked (at once when the lease already has).
        * An open effect intent (any state) or ``UNKNOWN``: the request is recorded and
          applied once the effect is settled: by the next holder's lookup, or by
          :meth:`resolve` (then ``CANCELLED`` instead of resuming). A lookup that cannot
          settle it leaves the task ``UNKNOWN`` with the request kept.
        * ``SUCCEEDED``, ``FAILED``, ``CANCELLED``: nothing changes (``outcome=
          "unchanged"``; a success committed first stays a success).

        Returns:
            what happened (:class:`~ratchet.ledger.base.ControlOutcome`).

        Raises:
            InvalidArguments: blank reason, malformed task id or operator name.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        why, who = _operator_args(reason, by)
        return self._writer().cancel(_task_id(task_id), why, who)

    def retry(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Run a ``FAILED`` task again (``ratchet retry``), audited with ``by``, ``reason``
        and the ledger's time: a fresh set of attempts (the counter reset, the task's
        ``max_attempts`` again), generation + 1, ready now. Its history is kept: the audit
        trail, its steps (done steps stay done: it resumes from its checkpoint) and its
        effects (a done effect is not called again; one given up by ``resolve --outcome
        give-up`` is settled lookup first). The only move out of ``FAILED`` (DESIGN §3);
        ``SUCCEEDED`` and ``CANCELLED`` never move, and any state but ``FAILED`` is
        ``outcome="unchanged"``.

        Raises:
            InvalidArguments: blank reason, malformed task id or operator name.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        why, who = _operator_args(reason, by)
        return self._writer().retry(_task_id(task_id), why, who)

    def pause(self, scope: str, target: str | None = None, *, reason: str,
              by: str | None = None) -> PauseResult:
        """Pause everything (``pause("all")``), a task type (``pause("type", name)``) or one
        task (``pause("task", task_id)``): a versioned, audited record (who, why, when;
        DESIGN §8). Once this returns, no new attempt starts in the scope until
        :meth:`resume`: every claim transaction reads the active pauses (PostgreSQL: under
        an advisory lock the pause takes, so a claim in flight finishes first). Running
        tasks in scope learn of it within about a second and stop at their next
        step/effect boundary: their checkpoint committed, the lease released, the attempt
        handed back, state ``PAUSED``; an effect in flight is settled first (never flipped
        to failed). One task that is not running is ``PAUSED`` at once. A scope already
        paused is ``outcome="unchanged"`` (no second record).

        Limits: a task type's tasks that are ``PENDING`` stay ``PENDING`` (not claimed);
        a task whose holder died while its type is paused is taken over after resume.

        Raises:
            InvalidArguments: unknown scope, a missing / extra target, blank reason.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        scope, key = _scope(scope, target)
        why, who = _operator_args(reason, by)
        result = self._writer().pause(scope, key, why, who)
        if scope == "type" and key is not None and not self._type_known(key):
            # Pausing a type before its workers deploy is legitimate, so not refused; but
            # a typo would pause nothing, silently: say so.
            result = dataclasses.replace(result, message=(
                f"{result.message}; note: no worker has registered task type {key!r} and "
                "the ledger holds no task of it (check the name)"))
        return result

    def _type_known(self, name: str) -> bool:
        """Whether a worker registered a definition of ``name`` or the ledger holds a task
        of it."""
        if any(d.name == name for d in self.definitions()):
            return True
        return bool(self.list_tasks(name=name, limit=1).tasks)

    def resume(self, scope: str, target: str | None = None, *, reason: str,
               by: str | None = None, rate_per_s: float | None = None) -> PauseResult:
        """End the active pause of ``scope`` / ``target`` (same selectors as :meth:`pause`),
        audited: its ``PAUSED`` tasks not covered by another active pause go back to
        ``PENDING``, re-admitted at ``rate_per_s`` tasks per second (staggered ``run_at``;
        None: all at once), and pause requests not yet applied are withdrawn. No active
        pause there: ``outcome="unchanged"``.

        Raises:
            InvalidArguments: as :meth:`pause`, or ``rate_per_s`` not a finite number > 0.
            LedgerUnavailable: no ledger there.
        """
        scope, key = _scope(scope, target)
        why, who = _operator_args(reason, by)
        if rate_per_s is not None:
            rate_per_s = check_rate_per_s(rate_per_s, "rate_per_s")
        return self._writer().resume(scope, key, why, who,
                                     None if rate_per_s is None else float(rate_per_s))

    def pauses(self) -> list[PauseRecord]:
        """The active pauses, oldest first, each with its RUNNING tasks still short of a
        safe boundary (also in :meth:`status`).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().pauses()

    def quarantine_list(self, limit: int = 100) -> list[QuarantineGroupView]:
        """Quarantined tasks grouped by error fingerprint, the most recently quarantined
        group first (DESIGN §7).

        Args:
            limit: at most this many groups (1 to 10,000).

        Raises:
            InvalidArguments: ``limit`` out of range. LedgerUnavailable: no ledger there.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 10_000:
            raise InvalidArguments(f"limit must be an integer from 1 to 10000, got {limit!r}")
        return [_quarantine_view(g) for g in self._reader().quarantine_groups(limit)]

    def quarantine_replay(
        self,
        fingerprint: str,
        rate_per_s: float,
        *,
        dry_run: bool = False,
        reason: str | None = None,
        by: str | None = None,
        limit: int = 10_000,
    ) -> ReplayReport:
        """Replay the quarantined tasks of one fingerprint with fresh attempt counters.

        In one transaction, each quarantined ``FAILED`` task with ``fingerprint`` (oldest
        quarantine first) becomes ``PENDING`` with attempt, failure streak and crash count
        reset (its steps, effects and audit history kept, so done work is not redone), the
        i-th ready at ``ledger now + i / rate_per_s``, so workers admit them at that rate;
        each gets an ``operator_replay`` audit row (who, why, fingerprint, run_at). A dry
        run changes nothing and lists what would be replayed.

        Args:
            fingerprint: from :meth:`quarantine_list` (16 hex digits).
            rate_per_s: tasks per second, above 0 and at most 100,000.
            dry_run: only list.
            reason: why (audited); required unless ``dry_run``.
            by: the operator's name (default: the login name).
            limit: at most this many tasks (1 to 100,000).

        Raises:
            InvalidArguments: a malformed fingerprint, rate, limit, operator name, or a
                blank reason for a real replay. LedgerUnavailable: no ledger there.
        """
        fp = fingerprint.strip().lower() if isinstance(fingerprint, str) else fingerprint
        if not isinstance(fp, str) or len(fp) != 16 or any(c not in "0123456789abcdef"
                                                           for c in fp):
            raise InvalidArguments(
                f"fingerprint must be the 16 hex digits ratchet quarantine list shows, got "
                f"{printable(str(fingerprint))!r}")
        rate_per_s = check_rate_per_s(rate_per_s, "rate_per_s")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise InvalidArguments(f"limit must be an integer from 1 to 100000, got {limit!r}")
        if reason is None or not isinstance(reason, str) or not reason.strip():
            if not dry_run:
                raise InvalidArguments(REASON_REQUIRED)
            reason = ""
        else:
            check_identifier(reason, "reason", 4 * MAX_KEY_BYTES)
        who = by if by is not None else default_operator()
        check_identifier(who, "operator name", MAX_KEY_BYTES)
        ledger = self._reader() if dry_run else self._writer()
        tasks = ledger.quarantine_replay(fp, float(rate_per_s), who, reason, dry_run, limit)
        return ReplayReport(fp, dry_run, float(rate_per_s), who, reason, tasks,
                            ledger.now())

    def migrate(self) -> int:
        """Create the ledger or apply pending schema migrations; return the schema version.

        Raises:
            SchemaTooNew: the ledger is newer than this Ratchet (left untouched).
            LedgerUnavailable: cannot be opened.
        """
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger.migrate()
        led = open_ledger(self._url, migrate=False, must_exist=False)
        try:
            return led.migrate()
        finally:
            led.close()

    def submit(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | float | None = None,
        delay_s: float = 0.0,
        tenant: str | None = None,
        version: int | None = None,
    ) -> TaskHandle:
        """Submit one task through the App (see :meth:`ratchet.App.submit`; ``version``
        pins a definition version, default the newest the App defines).

        Raises:
            ConfigError: this Control was made without an App.
            UnknownTask, InvalidArguments, PayloadNotSerializable, PayloadTooLarge,
            IdempotencyConflict: refused, nothing written. LedgerError: the ledger failed.
        """
        if self._app is None:
            raise ConfigError(
                "submit needs the application's task registry: use Control(app=...)"
            )
        return self._app.submit(
            name, params, idempotency_key=idempotency_key, run_at=run_at, delay_s=delay_s,
            tenant=tenant, version=version)


def _limit_scope(scope: object) -> LimitScope:
    """``scope`` as a :class:`LimitScope`, else InvalidArguments."""
    try:
        return LimitScope(str(scope).lower())
    except ValueError:
        raise InvalidArguments(
            f"unknown limit scope {scope!r}; scopes are total, type, tenant") from None


def _quarantine_view(g: QuarantineGroup) -> QuarantineGroupView:
    return QuarantineGroupView(
        g.fingerprint, g.name, g.count, g.error_class, error_summary(g.example_error),
        g.example_error, g.first_at, g.last_at, list(g.task_ids))


def _late_view(le: LateEffect, task_name: str | None,
               effects: list[EffectRecord]) -> LateEffectView:
    recorded = next((e for e in effects if e.name == le.effect), None)
    return LateEffectView(
        le.seq, le.task_id, task_name, le.effect, le.key, le.generation, le.holder, le.at,
        le.outcome, loads_stored(le.detail, f"late effect {le.effect!r} detail")
        if le.outcome == "done" and le.detail is not None else le.detail,
        recorded.key if recorded else None,
        recorded.generation if recorded and recorded.state is not EffectState.INTENT else None,
        le.kind,
    )


def _task_effect_view(te: TaskEffect, task_type: str) -> TaskEffectView:
    return TaskEffectView(
        te.task_id, task_type, te.task_state.value, te.task_generation, te.task_created_at,
        _effect_view(te.effect))


def _effect_view(e: EffectRecord) -> EffectView:
    """An effect record as shown; ``undecodable`` names its fields shown as stored."""
    shown = tuple(f for f, v in (("name", e.name), ("key", e.key), ("state", e.state))
                  if isinstance(v, UndecodableText | StoredState))
    return EffectView(e.name, e.key, e.state.value,
                      loads_stored(e.result_json, f"effect {e.name!r} result"),
                      e.generation, e.attempt, e.calls, e.via_lookup, e.updated_at, shown)


def _check_age(age: object, label: str) -> None:
    """InvalidArguments unless ``age`` is None or a finite number of seconds >= 0."""
    if age is not None and (isinstance(age, bool) or not isinstance(age, int | float)
                            or not math.isfinite(age) or age < 0):
        raise InvalidArguments(f"{label} must be a finite number of seconds >= 0, got {age!r}")


def _parse_effect_cursor(cursor: str | None) -> tuple[float, str, str] | None:
    """A :class:`EffectPage` ``next_cursor`` back into ``(created_at, task_id, name)``."""
    if cursor is None:
        return None
    try:
        at, task_id, name = json.loads(cursor)
        if (isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at)
                or not isinstance(task_id, str) or not isinstance(name, str)):
            raise ValueError
    except (ValueError, TypeError):
        raise InvalidArguments(f"malformed cursor {printable(str(cursor))!r}: pass the "
                               "next_cursor of the previous page") from None
    return float(at), task_id, name


def _states(state: str | State | Sequence[str | State] | None) -> tuple[State, ...] | None:
    """``state`` (one or several names or :class:`State` values) as states, or None."""
    if state is None:
        return None
    items: list[str | State] = [state] if isinstance(state, str | State) else list(state)
    out: list[State] = []
    for item in items:
        if isinstance(item, State):
            out.append(item)
            continue
        try:
            out.append(State(str(item).upper()))
        except ValueError:
            raise InvalidArguments(
                f"unknown state {item!r}; states are "
                f"{', '.join(s.value for s in State)}") from None
    return tuple(out)


def _parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    """A ``next_cursor`` back into ``(created_at, task_id)``."""
    if cursor is None:
        return None
    at, sep, task_id = str(cursor).partition(":")
    try:
        value = float(at)
        if not sep or not task_id or not math.isfinite(value):
            raise ValueError
    except ValueError:
        raise InvalidArguments(f"malformed cursor {cursor!r}: pass the next_cursor of the "
                               "previous page") from None
    return value, task_id


def _task_id(task_id: object) -> str:
    """``task_id`` if it can name a task (a storable identifier), else InvalidArguments."""
    return check_identifier(task_id, "task id", MAX_KEY_BYTES)


def _active_pauses(led: Ledger) -> list[PauseRecord]:
    """The active pauses; none on a ledger read-only opened before its migration to the
    schema that has pauses (``status`` still answers)."""
    try:
        return led.pauses()
    except LedgerError:
        if led.schema_version() >= load_migrations(led.config.scheme)[-1].version:
            raise
        return []


def _all_limits(led: Ledger) -> list[Limit]:
    """The concurrency limits; none on a ledger read-only opened before its migration to
    the schema that has limits (``status`` still answers)."""
    try:
        return led.limits()
    except LedgerError:
        if led.schema_version() >= load_migrations(led.config.scheme)[-1].version:
            raise
        return []


def _scope(scope: object, target: object) -> tuple[str, str]:
    """``(scope, target)`` of a pause / resume, checked: ``all`` without a target, ``type``
    with a task type, ``task`` with a task id."""
    if scope not in ("all", "type", "task"):
        raise InvalidArguments(f"scope must be 'all', 'type' or 'task', got {scope!r}")
    if scope == "all":
        if target not in (None, ""):
            raise InvalidArguments("a pause of everything takes no target")
        return "all", ""
    if target is None:
        raise InvalidArguments(f"a {scope} pause needs its target (the task "
                               f"{'type' if scope == 'type' else 'id'})")
    if scope == "type":
        return "type", check_identifier(target, "task type", MAX_NAME_BYTES)
    return "task", _task_id(target)


REASON_REQUIRED = "reason (--reason) must say why: it is kept in the audit log"
"""The message of the :class:`~ratchet.errors.InvalidArguments` an operator write without a
reason raises; the CLI prints it for a missing ``--reason`` too (one style)."""


def _operator_args(reason: object, by: object) -> tuple[str, str]:
    """``(reason, operator)`` of an operator command, checked (``InvalidArguments``): a
    reason that says something, an operator name that can be stored (default
    :func:`default_operator`)."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArguments(REASON_REQUIRED)
    check_identifier(reason, "reason", 4 * MAX_KEY_BYTES)
    who = by if by is not None else default_operator()
    check_identifier(who, "operator name", MAX_KEY_BYTES)
    return reason, str(who)


def default_operator() -> str:
    """The operator name recorded when none is given: ``$USER``, else the login name, else
    ``"unknown"`` (a container without a passwd entry)."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):
        return "unknown"

