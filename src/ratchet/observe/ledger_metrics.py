"""Prometheus metrics of the ledger, read through the public Control API at scrape time
(DESIGN §9): what the web service serves at ``/metrics``.

:class:`LedgerCollector` calls :meth:`Control.status <ratchet.control.Control.status>`
once per scrape (a read of the rollup and the ready index, milliseconds with millions of
finished tasks; no history is read) and turns the report into gauges and counters. Every
per-state count is the ledger's own ``GROUP BY state``, never derived from event
counters. Labels: ``type`` (task name) and ``state`` (lower case), from
:data:`~ratchet.observe.metrics.ALLOWED_LABELS`; each type gets every state, zeros
included, so the series stay the same while tasks move. At most
:data:`MAX_TYPE_SERIES` type values per scrape: the rest are summed under ``other``.

Series:

* ``ratchet_ledger_up`` (1: the status read succeeded; 0: it failed, nothing else is
  reported), ``ratchet_ledger_corrupt`` (1: this read or an earlier call of the same
  Control found the ledger corrupt, :class:`~ratchet.errors.LedgerCorrupt`; alert on it),
  ``ratchet_ledger_scrape_duration_seconds``;
* ``ratchet_ledger_tasks{type,state}``;
* per type: ``ratchet_ledger_backlog_tasks`` (ready to run now),
  ``ratchet_ledger_scheduled_tasks`` (waiting for a later ``run_at``),
  ``ratchet_ledger_waiting_tasks`` (``WAITING``: parked in a durable sleep, an event or
  its children; apart from the backlog and from ``state="running"``),
  ``ratchet_ledger_arrivals_per_second``, ``ratchet_ledger_completions_per_second`` (over
  the status window), ``ratchet_ledger_net_drain_per_second`` (over the window, or its
  last quarter once arrivals stopped: ``ratchet.capacity``),
  ``ratchet_ledger_drain_eta_seconds`` (only while the backlog drains),
  ``ratchet_ledger_oldest_pending_age_seconds`` (0 when nothing is ready),
  ``ratchet_ledger_unknown_tasks``, ``ratchet_ledger_oldest_unknown_age_seconds`` (0 when
  none), ``ratchet_ledger_quarantined_tasks``;
* flow control (DESIGN §8): ``ratchet_ledger_queue_tasks{queue,state}`` (the live tasks
  per queue; ``state`` one of ``ready``, ``scheduled``, ``running``, ``key_waiting``,
  ``rate_limited``, ``waiting``; at most :data:`MAX_TYPE_SERIES` queues, the rest summed
  under ``other``), and per type ``ratchet_ledger_rate_limited_tasks`` (held back by a
  rate limit now) and ``ratchet_ledger_key_waiting_tasks`` (waiting for a concurrency
  key's slot), zeros included for every type;
* ledger-wide: ``ratchet_ledger_late_effects`` (recorded now, both kinds),
  ``ratchet_ledger_late_effects_possible_duplicates`` and
  ``ratchet_ledger_late_effects_accounted_for`` (its two kinds: alert on the first), and
  the audit totals, ever
  (kept by ``prune``): ``ratchet_ledger_claims_total``, ``..._takeovers_total``,
  ``..._revocations_total``, ``..._stale_rejections_total``, ``..._lookup_hits_total``,
  ``..._idempotency_conflicts_total``, ``..._operator_actions_total``;
* batches, per type, over the unfinished ``ctx.batches`` runs of tasks not ended
  (:meth:`Control.batch_activity <ratchet.control.Control.batch_activity>`):
  ``ratchet_ledger_batch_watermark`` (their watermarks summed, items),
  ``ratchet_ledger_batch_items_processed`` (items of their committed batches),
  ``ratchet_ledger_batch_runs``; a type with no such run has no series;
* per periodic schedule (label ``schedule``, at most :data:`MAX_TYPE_SERIES` values, the
  rest summed under ``other``; from :meth:`Control.schedules`):
  ``ratchet_ledger_schedule_fired_total`` (ticks submitted, ever),
  ``ratchet_ledger_schedule_missed_total`` (ticks recorded as missed, later than their
  misfire grace: alert on its increase), ``ratchet_ledger_schedule_stale`` (1: no running
  scheduler has the schedule in its code);
* the outbox (DESIGN §6 row 10; absent on a ledger without one):
  ``ratchet_outbox_unsent_messages`` (written, not yet confirmed by the broker),
  ``ratchet_outbox_oldest_unsent_age_seconds`` (0 when none: alert on it),
  ``ratchet_outbox_failing_messages`` (unsent, a relay failed to publish them at least
  once), ``ratchet_outbox_sent_messages`` (sent, kept until pruned; an estimate past the
  count cap), ``ratchet_outbox_free_partitions`` (held by no relay: their messages wait)
  and ``ratchet_outbox_relay_partitions{holder}`` (partitions each relay holds with an
  unexpired lease; at most :data:`MAX_TYPE_SERIES` holders).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..control import (
    MAX_WINDOW_S,
    BatchActivity,
    Control,
    OutboxStats,
    QueueStatusView,
    StatusReport,
    TypeStatusView,
)
from ..errors import InvalidArguments, LedgerCorrupt, RatchetError
from ..reconcile import OUTCOMES
from ..states import State
from ..validation import check_finite
from .metrics import OTHER, check_label_names, render

__all__ = ["LedgerCollector", "ledger_metrics_registry", "render_ledger_metrics"]

log = logging.getLogger("ratchet.observe.metrics")

_AUDIT_TOTALS = (
    ("claims", "Claims recorded in the audit log, ever."),
    ("takeovers", "Claims that took a task over from an expired lease, ever (a revoked "
     "lease's task goes back to ready and is claimed as new: see revocations)."),
    ("revocations", "Leases revoked (a dead same-host holder, an operator), ever."),
    ("stale_rejections", "Writes rejected for a stale generation (fenced out), ever."),
    ("lookup_hits", "Effects settled by a lookup that found an earlier execution, ever."),
    ("idempotency_conflicts", "Submits refused: same idempotency key, other params, ever."),
    ("operator_actions", "Operator actions (cancel, retry, pause, resolve ...), ever."),
)

_PER_TYPE = (
    # (metric, help, TypeStatusView attribute, only when not None)
    ("ratchet_ledger_backlog_tasks", "Tasks ready to run now (PENDING / RETRY_WAIT due).",
     "backlog"),
    ("ratchet_ledger_scheduled_tasks", "Tasks waiting for a later run_at (delayed, backoff).",
     "scheduled"),
    ("ratchet_ledger_waiting_tasks", "Tasks WAITING: parked by their own code (a durable "
     "sleep, an event, their children), holding no lease and no slot; neither backlog "
     "nor running.", "waiting"),
    ("ratchet_ledger_arrivals_per_second", "Tasks submitted per second over the status "
     "window.", "arrival_per_s"),
    ("ratchet_ledger_completions_per_second", "Tasks that left the work per second over the "
     "status window (finished, or gone UNKNOWN: waiting for a person).", "completion_per_s"),
    ("ratchet_ledger_net_drain_per_second", "Completions minus arrivals per second over "
     "the status window, or over its last quarter once arrivals stopped (negative: the "
     "backlog grows).", "net_drain_per_s"),
    ("ratchet_ledger_drain_eta_seconds", "Backlog / net drain rate; absent unless the "
     "backlog drains (and while the type is paused).", "drain_eta_s"),
    ("ratchet_ledger_oldest_pending_age_seconds", "Age of the oldest ready task (0: none "
     "ready).", "oldest_pending_age_s"),
    ("ratchet_ledger_unknown_tasks", "Tasks in UNKNOWN, waiting for an operator "
     "(ratchet resolve).", "unknown"),
    ("ratchet_ledger_oldest_unknown_age_seconds", "Age of the oldest UNKNOWN task (0: none).",
     "oldest_unknown_age_s"),
    ("ratchet_ledger_quarantined_tasks", "Tasks quarantined (held for an operator's replay).",
     "quarantined"),
)

_ABSENT_WHEN_NONE = frozenset({"drain_eta_s"})

_BATCH_GAUGES = (
    # (metric, help, BatchActivity attribute)
    ("ratchet_ledger_batch_watermark", "Watermarks of the unfinished ctx.batches runs of "
     "tasks not ended, summed per type (items: every position below a run's watermark is "
     "committed).", "watermark"),
    ("ratchet_ledger_batch_items_processed", "Items of the committed batches of the "
     "unfinished ctx.batches runs of tasks not ended, summed per type (at or above the "
     "watermark: batches commit out of order).", "processed"),
    ("ratchet_ledger_batch_runs", "Unfinished ctx.batches runs of tasks not ended, per "
     "type.", "runs"),
)

MAX_TYPE_SERIES = 200
"""Task types reported under their own ``type`` label per scrape; the types after the
first ``MAX_TYPE_SERIES - 1`` (by name) are summed under ``type="other"`` (counts, backlog,
rates; the oldest ages are the largest; no drain ETA), so a ledger holding thousands of
distinct task names does not make thousands of series per metric."""


class LedgerCollector(Collector):
    """A prometheus_client collector reading :meth:`Control.status` at each scrape.

    Args:
        control: the Control to read (its ledger is read, never written, except that
            ``status`` moves the counts mark forward as it always does).
        window_s: the window of the arrival and completion rates, seconds (default 60;
            :meth:`Control.status` checks it at each scrape).

    A failed read (``LedgerUnavailable`` ...) is logged and reported as
    ``ratchet_ledger_up 0``; the scrape itself does not fail.

    Raises:
        InvalidArguments: ``window_s`` is not in (0, :data:`~ratchet.control.MAX_WINDOW_S`].
    """

    def __init__(self, control: Control, window_s: float = 60.0) -> None:
        try:
            window = check_finite(window_s, "ledger metrics window_s", minimum=0.0,
                                  maximum=MAX_WINDOW_S)
        except InvalidArguments:
            window = 0.0
        if window == 0:
            raise InvalidArguments(f"ledger metrics window_s must be a number of seconds above "
                                   f"0 and at most {MAX_WINDOW_S:g}, got {window_s!r}")
        self._control = control
        self._window_s = window
        for name, _help, _attr in (*_PER_TYPE, *_BATCH_GAUGES):
            check_label_names(name, ["type"])
        check_label_names("ratchet_ledger_tasks", ["type", "state"])
        check_label_names("ratchet_ledger_queue_tasks", ["queue", "state"])
        check_label_names("ratchet_outbox_relay_partitions", ["holder"])

    def describe(self) -> Iterable[Metric]:
        return []  # no read at registration: the series are known only from the ledger

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        up = GaugeMetricFamily("ratchet_ledger_up", "1 if the ledger status read succeeded.")
        corrupt = GaugeMetricFamily(
            "ratchet_ledger_corrupt", "1 if the database reported the ledger's data damaged "
            "(to this read or an earlier call of this service): restore it from a backup.")
        try:
            report = self._control.status(window_s=self._window_s)
        except RatchetError as exc:
            log.warning("ledger metrics: status read failed: %s", exc)
            up.add_metric([], 0.0)
            corrupt.add_metric([], 1.0 if isinstance(exc, LedgerCorrupt) else self._corrupt())
            yield up
            yield corrupt
            return
        up.add_metric([], 1.0)
        corrupt.add_metric([], self._corrupt())
        yield up
        yield corrupt
        yield from _families(report)
        yield from self._batch_families()
        yield from self._reconcile_families()
        yield from self._schedule_families()
        took = GaugeMetricFamily("ratchet_ledger_scrape_duration_seconds",
                                 "How long the status read took.")
        took.add_metric([], time.perf_counter() - t0)
        yield took


    def _corrupt(self) -> float:
        return 0.0 if self._control.ledger_corruption() is None else 1.0

    def _batch_families(self) -> Iterator[Metric]:
        """``ratchet_ledger_batch_watermark{type}``, ``ratchet_ledger_batch_items_processed
        {type}`` and ``ratchet_ledger_batch_runs{type}``: the unfinished ``ctx.batches``
        runs of tasks not ended, summed per type (:meth:`Control.batch_activity`); a type
        with none has no series. Past :data:`MAX_TYPE_SERIES` types the rest are summed
        under ``other``."""
        try:
            activity = self._control.batch_activity()
        except RatchetError as exc:
            log.warning("ledger metrics: batch activity read failed: %s", exc)
            return
        rows = _capped_activity(sorted(activity, key=lambda a: a.name))
        for metric, doc, attr in _BATCH_GAUGES:
            family = GaugeMetricFamily(metric, doc, labels=["type"])
            for row in rows:
                family.add_metric([row.name], float(getattr(row, attr)))
            yield family

    def _reconcile_families(self) -> Iterator[Metric]:
        """``ratchet_reconcile_runs_total`` and ``ratchet_reconcile_findings_total{outcome}``
        (every outcome of :data:`ratchet.reconcile.OUTCOMES` plus ``resolved``, zeros too),
        from the audit rollup (:meth:`Control.reconcile_counts`; DESIGN §5.1)."""
        try:
            counts = self._control.reconcile_counts()
        except RatchetError as exc:
            log.warning("ledger metrics: reconcile counts read failed: %s", exc)
            return
        runs = CounterMetricFamily("ratchet_reconcile_runs", "Recorded reconcile runs.")
        runs.add_metric([], float(counts.runs))
        yield runs
        findings = CounterMetricFamily(
            "ratchet_reconcile_findings", "Reconcile findings by outcome (absent, "
            "unrecorded, not_executed, unknown, late, no_lookup) and resolved by --apply.",
            labels=["outcome"])
        for outcome in (*OUTCOMES, "resolved"):
            findings.add_metric([outcome], float(counts.findings.get(outcome, 0)))
        yield findings


    def _schedule_families(self) -> Iterator[Metric]:
        """Fired and missed ticks, and staleness, per schedule (:meth:`Control.schedules`)."""
        try:
            views = self._control.schedules()
        except RatchetError as exc:
            log.warning("ledger metrics: schedules read failed: %s", exc)
            return
        fired = CounterMetricFamily("ratchet_ledger_schedule_fired", "Ticks of a periodic "
                                    "schedule submitted as tasks, ever.", labels=["schedule"])
        missed = CounterMetricFamily(
            "ratchet_ledger_schedule_missed", "Ticks of a periodic schedule recorded as "
            "missed (later than its misfire grace; never run), ever.", labels=["schedule"])
        stale = GaugeMetricFamily(
            "ratchet_ledger_schedule_stale", "1 if no running scheduler has had the schedule "
            "in its code for 90 s (it does not fire).", labels=["schedule"])
        totals: dict[str, list[float]] = {}
        named = [v for v in views if v.name != OTHER]
        keep = {v.name for v in (named if len(views) <= MAX_TYPE_SERIES
                                 else named[:MAX_TYPE_SERIES - 1])}
        for v in views:
            label = v.name if v.name in keep else OTHER
            row = totals.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += v.fired
            row[1] += v.missed
            row[2] = max(row[2], 1.0 if v.stale else 0.0)
        for label, (n_fired, n_missed, is_stale) in totals.items():
            fired.add_metric([label], n_fired)
            missed.add_metric([label], n_missed)
            stale.add_metric([label], is_stale)
        yield fired
        yield missed
        yield stale


def _families(report: StatusReport) -> Iterator[Metric]:
    """The metric families of one status report."""
    views = _capped(sorted(report.types, key=lambda v: v.name))
    tasks = GaugeMetricFamily("ratchet_ledger_tasks", "Tasks by type and state, as the "
                              "ledger holds them.", labels=["type", "state"])
    known = {s.value for s in State}
    for view in views:
        for state in State:
            tasks.add_metric([view.name, state.value.lower()],
                             float(view.counts.get(state.value, 0)))
        for other in sorted(set(view.counts) - known):
            tasks.add_metric([view.name, other.lower()], float(view.counts[other]))
    yield tasks
    for metric, doc, attr in _PER_TYPE:
        family = GaugeMetricFamily(metric, doc, labels=["type"])
        for view in views:
            raw: float | int | None = getattr(view, attr)
            if raw is None and attr in _ABSENT_WHEN_NONE:
                continue
            family.add_metric([view.name], float(raw or 0.0))
        yield family
    yield from _flow_families(report, views)
    if report.outbox is not None:
        yield from _outbox_families(report.outbox)
    window = GaugeMetricFamily("ratchet_ledger_rate_window_seconds",
                               "The window of the arrival and completion rates.")
    window.add_metric([], float(report.window_s))
    yield window
    late = GaugeMetricFamily("ratchet_ledger_late_effects", "Late effects recorded (calls "
                             "sent by holders after a takeover), both kinds.")
    late.add_metric([], float(report.late_effects))
    yield late
    duplicates = GaugeMetricFamily(
        "ratchet_ledger_late_effects_possible_duplicates", "Late effects that may have "
        "executed a second time at the target (check it).")
    duplicates.add_metric([], float(report.late_effects - report.late_effects_accounted_for))
    yield duplicates
    accounted = GaugeMetricFamily(
        "ratchet_ledger_late_effects_accounted_for", "Late effects accounted for: the only "
        "request sent, whose execution a lookup hit settled the effect with.")
    accounted.add_metric([], float(report.late_effects_accounted_for))
    yield accounted
    for attr, doc in _AUDIT_TOTALS:
        counter = CounterMetricFamily(f"ratchet_ledger_{attr}", doc)
        counter.add_metric([], float(getattr(report, attr)))
        yield counter


def _outbox_families(s: OutboxStats) -> Iterator[Metric]:
    """The ``ratchet_outbox_*`` gauges of one read of the outbox."""
    for metric, doc, value in (
        ("ratchet_outbox_unsent_messages", "Outbox messages written and not yet confirmed "
         "by the broker (the relays' backlog).", s.unsent),
        ("ratchet_outbox_oldest_unsent_age_seconds", "Age of the oldest unsent outbox "
         "message at the head of a partition, ledger clock (0: none unsent). Alert when "
         "it stays above what consumers tolerate.", s.oldest_unsent_age_s or 0.0),
        ("ratchet_outbox_failing_messages", "Unsent outbox messages a relay failed to "
         "publish at least once.", s.failing),
        ("ratchet_outbox_sent_messages", "Sent outbox messages kept until the retention "
         "prune (an estimate past the count cap).", s.sent),
        ("ratchet_outbox_free_partitions", "Outbox partitions no relay holds now: their "
         "messages wait for a relay.", s.free_partitions),
    ):
        gauge = GaugeMetricFamily(metric, doc)
        gauge.add_metric([], float(value))
        yield gauge
    relays = GaugeMetricFamily("ratchet_outbox_relay_partitions", "Outbox partitions each "
                               "relay holds with an unexpired lease.", labels=["holder"])
    held = {r.holder: float(len(r.partitions)) for r in s.relays}
    if len(held) > MAX_TYPE_SERIES:
        names = sorted(held)
        keep = names[:MAX_TYPE_SERIES - 1]
        held = {**{h: held[h] for h in keep},
                OTHER: sum(held[h] for h in names[MAX_TYPE_SERIES - 1:])}
    for holder, n in held.items():
        relays.add_metric([holder], n)
    yield relays


_QUEUE_STATES = ("ready", "scheduled", "running", "key_waiting", "rate_limited", "waiting")
"""The ``state`` values of ``ratchet_ledger_queue_tasks`` (:class:`QueueStatusView`'s
counts)."""


def _flow_families(report: StatusReport, views: list[TypeStatusView]) -> Iterator[Metric]:
    """``ratchet_ledger_queue_tasks{queue,state}``, and per type (those of ``views``)
    ``ratchet_ledger_rate_limited_tasks`` and ``ratchet_ledger_key_waiting_tasks``."""
    queues = GaugeMetricFamily(
        "ratchet_ledger_queue_tasks", "Live tasks by queue and state: ready (due now), "
        "scheduled (a later run_at), running, key_waiting (for a concurrency key's slot), "
        "rate_limited (held back by a rate limit), waiting (parked by their own code).",
        labels=["queue", "state"])
    for q in _capped_queues(report.queues):
        for state in _QUEUE_STATES:
            queues.add_metric([q.queue, state], float(getattr(q, state)))
    yield queues
    held: dict[str, list[float]] = {v.name: [0.0, 0.0] for v in views}
    for f in report.flow:
        # A type past the cap is summed under "other" (a type absent from the views has
        # no live task counted: none to add).
        row = held.get(f.name) or held.get(OTHER)
        if row is not None:
            row[0] += f.rate_limited
            row[1] += f.key_waiting
    rate = GaugeMetricFamily("ratchet_ledger_rate_limited_tasks", "Tasks a rate limit "
                             "holds back now (PENDING, run_at moved to when their bucket "
                             "has a token).", labels=["type"])
    key = GaugeMetricFamily("ratchet_ledger_key_waiting_tasks", "Tasks waiting for a slot "
                            "of their concurrency key.", labels=["type"])
    for name, (n_rate, n_key) in held.items():
        rate.add_metric([name], n_rate)
        key.add_metric([name], n_key)
    yield rate
    yield key


def _capped_queues(rows: list[QueueStatusView]) -> list[QueueStatusView]:
    """``rows`` if at most :data:`MAX_TYPE_SERIES`, else the first ``MAX_TYPE_SERIES - 1``
    and one ``other`` row summing the rest."""
    if len(rows) <= MAX_TYPE_SERIES:
        return rows
    named = [r for r in rows if r.queue != OTHER]
    keep = named[:MAX_TYPE_SERIES - 1]
    kept = {r.queue for r in keep}
    rest = [r for r in rows if r.queue not in kept]
    return [*keep, QueueStatusView(OTHER, **{s: sum(getattr(r, s) for r in rest)
                                             for s in _QUEUE_STATES})]


def _capped_activity(rows: list[BatchActivity]) -> list[BatchActivity]:
    """``rows`` (sorted by type) if at most :data:`MAX_TYPE_SERIES`, else the first
    ``MAX_TYPE_SERIES - 1`` and one ``other`` row summing the rest."""
    if len(rows) <= MAX_TYPE_SERIES:
        return rows
    named = [r for r in rows if r.name != OTHER]
    keep = named[:MAX_TYPE_SERIES - 1]
    kept = {r.name for r in keep}
    rest = [r for r in rows if r.name not in kept]
    return [*keep, BatchActivity(OTHER, sum(r.runs for r in rest),
                                 sum(r.watermark for r in rest),
                                 sum(r.processed for r in rest))]


def _capped(views: list[TypeStatusView]) -> list[TypeStatusView]:
    """``views`` (sorted by name) if at most :data:`MAX_TYPE_SERIES`, else the first
    ``MAX_TYPE_SERIES - 1`` and one ``other`` view summing the rest."""
    if len(views) <= MAX_TYPE_SERIES:
        return views
    named = [v for v in views if v.name != OTHER]  # a type named "other" joins the sum
    keep = named[:MAX_TYPE_SERIES - 1]
    kept = {v.name for v in keep}
    rest = [v for v in views if v.name not in kept]
    counts: dict[str, int] = {}
    for v in rest:
        for state, n in v.counts.items():
            counts[state] = counts.get(state, 0) + n

    def total(attr: str) -> float:
        return float(sum(getattr(v, attr) for v in rest))

    def oldest(attr: str) -> float | None:
        ages = [a for a in (getattr(v, attr) for v in rest) if a is not None]
        return max(ages) if ages else None

    other = TypeStatusView(
        name=OTHER, counts=counts, total=sum(v.total for v in rest),
        backlog=sum(v.backlog for v in rest), scheduled=sum(v.scheduled for v in rest),
        running=sum(v.running for v in rest), waiting=sum(v.waiting for v in rest),
        arrival_per_s=total("arrival_per_s"),
        completion_per_s=total("completion_per_s"),
        net_drain_per_s=total("net_drain_per_s"), drain_eta_s=None,
        oldest_pending_age_s=oldest("oldest_pending_age_s"),
        unknown=sum(v.unknown for v in rest),
        oldest_unknown_age_s=oldest("oldest_unknown_age_s"),
        quarantined=sum(v.quarantined for v in rest))
    return [*keep, other]


def ledger_metrics_registry(control: Control, window_s: float = 60.0) -> CollectorRegistry:
    """A new registry holding one :class:`LedgerCollector` on ``control`` (nothing is read
    until it is collected); ``window_s``: the rate window, seconds."""
    registry = CollectorRegistry()
    registry.register(LedgerCollector(control, window_s))
    return registry


def render_ledger_metrics(control: Control, window_s: float = 60.0) -> tuple[bytes, str]:
    """Read the ledger's status once and return the text exposition: ``(body, content
    type)``, for an HTTP route (blocking: call it from a worker thread in async code).

    Raises:
        InvalidArguments: ``window_s`` out of range; a ledger that cannot be read is not
            an error (``ratchet_ledger_up 0``).
    """
    return render(ledger_metrics_registry(control, window_s))
