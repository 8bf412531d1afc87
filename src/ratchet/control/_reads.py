"""The read-only calls of :class:`ratchet.Control` (status, listings, timelines,
workers, definitions, limits, quarantine): none writes, none creates or migrates a
ledger (the one write, :meth:`ControlReads.status` moving the counts mark forward, is
skipped when refused)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

from ..app import _checks as opchecks
from ..app import _taskops as taskops
from ..app._taskops import TaskPage
from ..capacity import capacity_views
from ..config import redact_url
from ..errors import InvalidArguments, LedgerError, SchemaTooOld, TaskNotFound
from ..ledger.base import (
    EffectRecord,
    Ledger,
    Limit,
    LimitScope,
    OutboxStats,
    PauseRecord,
    TaskInfo,
    Timeline,
)
from ..ledger.migrations import load_migrations
from ..serde import loads_stored
from ..shards import job_shards, task_shard
from ..states import State
from ..validation import MAX_DURATION_S, MAX_NAME_BYTES, check_identifier
from ..worker.registry import UNRESPONSIVE_FLOOR_S, host_identity, process_state
from ._base import ControlHandles
from ._flowviews import RateLimitView, flow_views, serving_workers
from ._records import (
    EffectPage,
    LateEffectView,
    QuarantineGroupView,
    TaskEffectView,
    TaskTimeline,
    waiting_text,
)
from ._reports import (
    DEFAULT_LEASE_S,
    LIVE_WORKER_S,
    MAX_BUCKETS,
    MAX_WINDOW_S,
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
from ._schedules import ScheduleView, schedule_view

__all__ = ["ControlReads"]


def _with_waits(led: Ledger, tasks: list[TaskInfo]) -> list[TaskInfo]:
    """``tasks`` with ``waiting_for`` set on each ``WAITING`` one (one read of the
    ledger's :meth:`~ratchet.ledger.base.Ledger.waits`, none when no task waits)."""
    ids = [t.task_id for t in tasks if t.state is State.WAITING]
    if not ids:
        return tasks
    found = {w.task_id: waiting_text(w) for w in led.waits(ids)}
    return [dataclasses.replace(t, waiting_for=found[t.task_id]) if found.get(t.task_id)
            else t for t in tasks]


class ControlReads(ControlHandles):
    """The read-only calls of :class:`ratchet.Control` (see there)."""

    def status(self, window_s: float = 60.0,
               drain_within_s: float | None = None) -> StatusReport:
        """Counts per task type and state, oldest pending age, unknowns, audit counters,
        durability, ready tasks per pinned (name, version) with the live workers that
        have it (``versions``: a version no live worker has waits), and the capacity view
        per type (``types``, ``totals``: backlog, scheduled, rates over the last
        ``window_s`` seconds, net drain rate and drain ETA, oldest ages, unknown and
        quarantined counts; :class:`TypeStatusView`), the live tasks per queue
        (``queues``), the tasks flow control holds back per type (``flow``) and the outbox
        (``outbox``: :meth:`outbox`). Reads no
        history (DESIGN §9): the non-terminal rows from their indexes, and the window's
        rows by range scans of ``tasks_created`` / ``tasks_finished``; it first moves the
        counts mark forward in a short write transaction of its own (skipped if the
        ledger refuses the write).

        Each type's view also has its capacity by Little's law (DESIGN §9): the mean
        attempt duration ``W`` over the window (the newest ended attempts, a range of the
        audit's time index), the slots of the live workers serving it, ``L = λ·W`` against
        them, and with ``drain_within_s`` the slots that drain its backlog within that
        time while tasks keep arriving.

        Args:
            window_s: the rate window, seconds (above 0, at most :data:`MAX_WINDOW_S`).
            drain_within_s: the time to drain each backlog in, seconds (above 0, at most
                :data:`~ratchet.validation.MAX_DURATION_S`), for
                :attr:`TypeStatusView.slots_needed`; None: not computed.

        Raises:
            InvalidArguments: ``window_s`` or ``drain_within_s`` out of range.
            LedgerUnavailable: no ledger there (nothing is created), or unreachable.
            ConfigError: malformed URL.
        """
        window = opchecks.check_seconds(window_s, "window_s", MAX_WINDOW_S)
        within = (None if drain_within_s is None else
                  opchecks.check_seconds(drain_within_s, "drain_within_s", MAX_DURATION_S))
        led = self._reader()
        s = led.stats(window)
        pauses = _active_pauses(led)
        limits = _all_limits(led)
        usage = (led.slot_usage() if any(lim.scope is LimitScope.TENANT for lim in limits)
                 else None)
        live = led.live_worker_slots(LIVE_WORKER_S)
        counts = led.flow_counts()
        types, totals = capacity_views(s.counts, s.capacity, s.ledger_now, window,
                                       pauses=pauses, limits=limits, usage=usage,
                                       workers=serving_workers(live, counts),
                                       drain_within_s=within)
        queues, flow = flow_views(counts, live)
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
            drain_within_s=within,
            types=types,
            totals=totals,
            queues=queues,
            flow=flow,
            outbox=_outbox_stats(led),
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
        window = opchecks.check_seconds(window_s, "window_s", MAX_WINDOW_S)
        bucket = opchecks.check_seconds(bucket_s, "bucket_s", window)
        if math.ceil(window / bucket - 1e-9) > MAX_BUCKETS:
            raise InvalidArguments(f"window_s / bucket_s must be at most {MAX_BUCKETS} "
                                   f"buckets, got {window:g} / {bucket:g}")
        if name is not None:
            check_identifier(name, "task type", MAX_NAME_BYTES)
        return [ThroughputBucket(b.start, b.arrivals, b.completions)
                for b in self._reader().throughput(window, bucket, name)]

    def get(self, task_id: str) -> TaskInfo:
        """One task's row (``waiting_for`` says what it waits for when it is ``WAITING``).

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        [task] = _with_waits(led, [led.get(opchecks.task_id(task_id))])
        return task

    def children(self, task_id: str) -> list[TaskInfo]:
        """The tasks ``task_id`` submitted with ``ctx.submit`` / ``ctx.submit_many`` (their
        ``parent_id`` is ``task_id``), oldest first; empty for a task that submitted none
        (``ratchet inspect`` and the dashboard's task page show them as a tree, one level
        at a time).

        Raises:
            InvalidArguments: a malformed task id. LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        return _with_waits(led, led.children(opchecks.task_id(task_id)))

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """The rows of ``task_ids`` (those that exist, in no particular order): one read,
        for a face or a harness that follows many tasks at once (the demo's progress).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().get_many([opchecks.task_id(t) for t in task_ids])

    def history(self, task_id: str) -> Timeline:
        """The ledger's own record of one task (its row, audit events, step and effect
        records, late effects), undecoded: what :mod:`ratchet.testing`'s checks take.
        :meth:`inspect` is the same with the stored values decoded, for people.

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        return self._reader().timeline(opchecks.task_id(task_id))

    def ledger_now(self) -> float:
        """The ledger clock (epoch seconds), the clock every lease and audit row uses.

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().now()

    def schema_version(self) -> int:
        """The ledger's schema version (one small read; ``ratchet serve``'s health check
        with :meth:`ledger_now`).

        Raises:
            LedgerUnavailable: no ledger there, or unreachable.
        """
        return self._reader().schema_version()

    def inspect(self, task_id: str) -> TaskTimeline:
        """The task with its audit events, steps, effects, children, ``ctx.batches``
        runs (a sharded job's: its shards' runs too) and fork links (``ratchet inspect``).

        Values that cannot be decoded are returned as
        :class:`~ratchet.serde.Undecodable` (their text and the reason), not raised.

        Raises:
            TaskNotFound: no task with that id. LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        tid = opchecks.task_id(task_id)
        timeline = led.timeline(tid)
        [task, *children] = _with_waits(led, [timeline.task, *led.children(tid)])
        shards = job_shards(task.params)
        shard_ids = [c.task_id for c in children if task_shard(c.params) is not None]
        return TaskTimeline.from_timeline(
            dataclasses.replace(timeline, task=task), children, led.batch_runs([tid]),
            shards, led.batch_runs(shard_ids) if shards is not None and shard_ids else (),
            led.fork_links(tid))

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
        opchecks.check_limit(limit, 10000)
        led = self._reader()
        records = led.late_effects(None if task_id is None else opchecks.task_id(task_id), limit)
        views: list[LateEffectView] = []
        timelines: dict[str, Any] = {}
        for le in records:
            if le.task_id not in timelines:
                try:
                    timelines[le.task_id] = led.timeline(le.task_id)
                except TaskNotFound:
                    timelines[le.task_id] = None
            tl = timelines[le.task_id]
            views.append(LateEffectView.from_record(le, tl.task.name if tl else None,
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
        opchecks.check_optional_age(newer_than_s, "newer_than_s")
        opchecks.check_limit(limit, 10000)
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
            views.append(LateEffectView.from_record(le, task_type, timelines[le.task_id]))
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
        opchecks.check_optional_age(newer_than_s, "newer_than_s")
        opchecks.check_limit(limit, 1000)
        after = opchecks.parse_effect_cursor(cursor)
        led = self._reader()
        since = None if newer_than_s is None else led.now() - newer_than_s
        found = led.effects_of_type(task_type, since, limit + 1, after)
        page = found[:limit]
        last = page[-1] if len(found) > limit and page else None
        next_cursor = (json.dumps([last.task_created_at, last.task_id, last.effect.name])
                       if last is not None else None)
        return EffectPage([TaskEffectView.from_record(te, task_type) for te in page], next_cursor)

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
            older_than_s: only tasks created more than this many seconds ago (by the
                ledger clock).
            newer_than_s: only tasks created less than this many seconds ago (by the
                ledger clock).
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
        return taskops.list_tasks(
            self._reader, state=state, name=name, key=key, older_than_s=older_than_s,
            newer_than_s=newer_than_s, limit=limit, cursor=cursor)

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

    def schedules(self) -> list[ScheduleView]:
        """Every periodic schedule schedulers registered, by name: spec, next tick, last
        fired tick, missed ticks (count, last, reason), and whether a running scheduler
        still has it (``stale``) and this Control's App has it (``in_code``).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        now = led.now()
        names = set(self._app.periodic_tasks) if self._app is not None else None
        return [schedule_view(r, now, names) for r in led.schedules()]

    def limits(self) -> LimitsReport:
        """The concurrency limits and their live use, and the rate limits with the tasks
        they hold back (DESIGN §8, ``ratchet limits``).

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
        held = led.rate_held()
        rates = [RateLimitView.of(r, held.get(r.name, 0) if r.scope == "type" else 0)
                 for r in led.rate_limits()]
        return LimitsReport(views, per_type, running_by.get(("total", ""), 0),
                            led.limit_changes(20), now, rates)

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
        opchecks.check_limit(limit, 10_000)
        return [QuarantineGroupView.from_record(g) for g in self._reader().quarantine_groups(limit)]



def _active_pauses(led: Ledger) -> list[PauseRecord]:
    """The active pauses; none on a ledger read-only opened before its migration to the
    schema that has pauses (``status`` still answers)."""
    try:
        return led.pauses()
    except LedgerError:
        if led.schema_version() >= load_migrations(led.config.scheme)[-1].version:
            raise
        return []


def _outbox_stats(led: Ledger) -> OutboxStats | None:
    """The outbox's stats; None on a ledger without an outbox (read-only opened before
    its migration to schema 16)."""
    try:
        return led.outbox_stats()
    except SchemaTooOld:
        return None


def _all_limits(led: Ledger) -> list[Limit]:
    """The concurrency limits; none on a ledger read-only opened before its migration to
    the schema that has limits (``status`` still answers)."""
    try:
        return led.limits()
    except LedgerError:
        if led.schema_version() >= load_migrations(led.config.scheme)[-1].version:
            raise
        return []

