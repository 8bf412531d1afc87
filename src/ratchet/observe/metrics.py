"""Prometheus metrics of a worker process (DESIGN §9), and the rules every Ratchet metric
follows.

Install :class:`WorkerMetrics` as a worker middleware; its :attr:`~WorkerMetrics.registry`
(a :class:`prometheus_client.CollectorRegistry` of its own, never the global default, so
several workers in one process and tests do not collide) holds the series, and
:class:`MetricsServer` serves it over HTTP (``ratchet worker --metrics-port``)::

    metrics = WorkerMetrics()
    worker = Worker(app, middleware=[metrics])
    server = MetricsServer(metrics.registry, port=9464)   # GET http://127.0.0.1:9464/metrics

Naming: ``ratchet_`` prefix, base units (seconds), counters end in ``_total``. Labels come
only from :data:`ALLOWED_LABELS` (``type``, ``outcome``, ``state``, ``downstream``,
``schedule``: a periodic schedule's name, from the code, capped per scrape; ``queue``: a
task queue's name, from the code or a submit, capped per scrape; ``holder``: an outbox
relay holding partitions now, capped per scrape) and
their values from fixed sets: task types this worker claims, downstreams its app
configured, outcomes listed here; anything else is counted under ``"other"``. So the
number of series does not grow with the number of tasks run; task ids, idempotency keys
and business keys go to logs and traces only. :func:`check_labels` enforces the label
names on a whole registry (the tests run it on every registry Ratchet builds).

The ledger-wide view (tasks by type and state, oldest pending age, audit totals) is
:mod:`ratchet.observe.ledger_metrics`, read through the Control API at scrape time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..breaker import BreakerState
from ..errors import CircuitOpen, ConfigError
from ..ledger.base import Claim
from ..validation import check_int
from ..worker.hooks import ContextLike, EffectSettlement, Middleware, WorkerLike

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


__all__ = [
    "ALLOWED_LABELS",
    "ATTEMPT_OUTCOMES",
    "EFFECT_OUTCOMES",
    "OTHER",
    "MetricsServer",
    "WorkerMetrics",
    "check_labels",
    "render",
]

ALLOWED_LABELS = frozenset({"type", "outcome", "state", "downstream", "schedule", "queue",
                            "holder"})
"""The only label names a Ratchet metric may carry (DESIGN §9). Histogram buckets add
Prometheus' own ``le``."""

_STRUCTURAL_LABELS = frozenset({"le", "quantile"})

OTHER = "other"
"""Label value for anything outside a label's fixed set of values."""

ATTEMPT_OUTCOMES = (
    "succeeded", "retry_wait", "failed", "unknown", "pending", "cancelled", "paused",
    "stale", "lease_lost", "abandoned", OTHER,
)
"""``outcome`` values of ``ratchet_attempts_total``: the state written, lower case
(``pending``: released, e.g. at shutdown or while a breaker is open), or ``stale`` (fenced
out: a newer generation exists), ``lease_lost``, ``abandoned`` (nothing final written)."""

EFFECT_OUTCOMES: tuple[EffectSettlement, ...] = ("call", "lookup", "cached", "unknown", "failed")
"""``outcome`` values of ``ratchet_effects_total`` (:data:`~ratchet.worker.hooks.EffectSettlement`):
a new call recorded, a lookup hit, a result cached from an earlier attempt, an unknown
outcome (the task goes ``UNKNOWN``), or a failure."""

STEP_OUTCOMES = ("ran", "cached", "failed")
"""``outcome`` values of ``ratchet_steps_total``."""

_OK_ERROR = ("ok", "error")

_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0)
"""Histogram buckets (seconds) of ledger round trips: renewals, commits."""

_TASK_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
"""Histogram buckets (seconds) of attempts and effects."""


def check_label_names(metric: str, names: Iterable[str]) -> tuple[str, ...]:
    """Return ``names`` as a tuple if every one is in :data:`ALLOWED_LABELS`.

    Raises:
        ConfigError: a label outside the allow-list (named, with the metric).
    """
    names = tuple(names)
    extra = sorted(set(names) - ALLOWED_LABELS)
    if extra:
        raise ConfigError(f"metric {metric}: label(s) {extra} not in the allow-list "
                          f"{sorted(ALLOWED_LABELS)} (DESIGN §9)")
    return names


def check_labels(registry: CollectorRegistry) -> int:
    """Collect ``registry`` once and check every sample's label names against
    :data:`ALLOWED_LABELS` (plus ``le`` / ``quantile`` of histograms and summaries).

    Returns:
        The number of series (samples) collected.

    Raises:
        ConfigError: a sample carries another label (the metric and label are named).
    """
    series = 0
    for family in registry.collect():
        for sample in family.samples:
            series += 1
            extra = sorted(set(sample.labels) - ALLOWED_LABELS - _STRUCTURAL_LABELS)
            if extra:
                raise ConfigError(f"metric {sample.name}: label(s) {extra} not in the "
                                  f"allow-list {sorted(ALLOWED_LABELS)} (DESIGN §9)")
    return series


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The text exposition of ``registry``: ``(body, content type)`` for an HTTP reply."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


M = TypeVar("M", bound=MetricWrapperBase)


class _Children(Generic[M]):
    """Cached labelled children of one metric: ``labels()`` takes a lock and builds a
    key each call; a dict read does not. Keys are tuples of label values."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], M] = {}

    def get(self, *values: str) -> M:
        child = self._cache.get(values)
        if child is None:  # two threads may both build it: labels() returns the same one
            child = self._cache[values] = self._metric.labels(*values)
        return child


class WorkerMetrics(Middleware):
    """Worker middleware keeping Prometheus metrics of one worker (module docstring).

    One instance per :class:`~ratchet.worker.runner.Worker` (it reads that worker's leases,
    stuck threads and circuit breakers at scrape time); thread-safe, as middleware must be.

    Series (``type`` = task name, ``downstream`` = a downstream the app configured):

    * ``ratchet_claims_total{type}``, ``ratchet_takeovers_total{type}`` (claims of a task
      whose previous lease expired or was revoked);
    * ``ratchet_attempts_total{type,outcome}`` (:data:`ATTEMPT_OUTCOMES`),
      ``ratchet_attempt_duration_seconds{type}`` (start of the body to the final write's
      commit), ``ratchet_retries_total{type}`` (attempts ended ``RETRY_WAIT``),
      ``ratchet_stale_rejections_total{type}`` (attempts fenced out by a newer generation);
    * ``ratchet_effects_total{type,outcome}`` (:data:`EFFECT_OUTCOMES`),
      ``ratchet_effect_duration_seconds{type}``, ``ratchet_late_effects_total{type}`` (calls
      this worker sent after a takeover, recorded as late effects),
      ``ratchet_steps_total{type,outcome}`` (:data:`STEP_OUTCOMES`);
    * ``ratchet_downstream_requests_total{downstream}`` (requests effects sent: what the
      downstream's retry budget counts), ``ratchet_circuit_open_rejections_total{downstream}``
      (effects not sent, the breaker open), ``ratchet_circuit_breaker_state{downstream,state}``
      (1 for the current state), ``ratchet_circuit_breaker_opened_total{downstream}``;
    * ``ratchet_lease_renewals_total{outcome}`` (``ok`` / ``error``: the ledger call
      failed), ``ratchet_lease_renewal_duration_seconds``, ``ratchet_leases_revoked_total``
      (renewals the ledger refused: revoked or taken over), ``ratchet_leases_held``,
      ``ratchet_lease_min_remaining_seconds`` (the smallest safe window left among held
      leases, at scrape; absent while none is held);
    * ``ratchet_commits_total{outcome}``, ``ratchet_commit_duration_seconds`` (the
      writer's transactions: group commits, with claims riding on them, and a task's own
      writes such as effect intents);
    * ``ratchet_stuck_threads`` (task threads still in the code of an attempt ended
      without them);
    * ``ratchet_ledger_corrupt`` (1 once a call of this worker's ledger raised
      :class:`~ratchet.errors.LedgerCorrupt`: the worker stops and exits with
      :data:`~ratchet.errors.EXIT_LEDGER_CORRUPT`).

    Args:
        registry: where the series go; default a new :class:`CollectorRegistry`.
        process: also register prometheus_client's ``process_*`` collector (CPU, memory,
            open files of this process): for a process that runs one worker
            (``ratchet worker`` does).
    """

    def __init__(self, registry: CollectorRegistry | None = None, *,
                 process: bool = False) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        """The registry holding this worker's series."""
        self._worker: WorkerLike | None = None
        self._types: frozenset[str] = frozenset()
        self._downstreams: frozenset[str] = frozenset()
        self._attempt_started: dict[tuple[str, int], float] = {}
        self._attempt_plan: dict[tuple[str, str], tuple[tuple[Counter, ...], Histogram]] = {}
        self._sent_before = threading.local()
        r = self.registry

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, check_label_names(name, labels), registry=r)

        def histogram(name: str, doc: str, buckets: Sequence[float],
                      labels: Sequence[str] = ()) -> Histogram:
            return Histogram(name, doc, check_label_names(name, labels), registry=r,
                             buckets=buckets)

        self.claims = counter("ratchet_claims", "Tasks claimed by this worker.", ["type"])
        self.takeovers = counter(
            "ratchet_takeovers", "Claims that took a task over from a holder whose lease "
            "expired (a revoked holder's tasks go back to ready and are claimed as new: see "
            "ratchet_leases_revoked_total).", ["type"])
        self.attempts = counter(
            "ratchet_attempts", "Attempts ended, by the outcome written.", ["type", "outcome"])
        self.attempt_duration = histogram(
            "ratchet_attempt_duration_seconds", "Attempt duration: start of the task body to "
            "the commit of its final write.", _TASK_BUCKETS, ["type"])
        self.retries = counter(
            "ratchet_retries", "Attempts that ended in RETRY_WAIT (a retry scheduled).",
            ["type"])
        self.stale = counter(
            "ratchet_stale_rejections", "Attempts whose writes the ledger fenced out: a newer "
            "generation of the task exists.", ["type"])
        self.effects = counter(
            "ratchet_effects", "Effects settled: call (new call), lookup (lookup hit), cached "
            "(recorded by an earlier attempt), unknown, failed.", ["type", "outcome"])
        self.effect_duration = histogram(
            "ratchet_effect_duration_seconds", "ctx.effect duration (intent, call, result).",
            _TASK_BUCKETS, ["type"])
        self.late_effects = counter(
            "ratchet_late_effects", "Calls this worker sent after its claim was taken over "
            "(recorded as late effects: possible duplicates).", ["type"])
        self.steps = counter("ratchet_steps", "Steps ended: ran, cached, failed.",
                             ["type", "outcome"])
        self.downstream_requests = counter(
            "ratchet_downstream_requests", "Requests effects sent to a downstream (the calls "
            "its retry budget counts).", ["downstream"])
        self.circuit_open = counter(
            "ratchet_circuit_open_rejections", "Effects not sent because the downstream's "
            "circuit breaker was open (the attempt is handed back).", ["downstream"])
        self.renewals = counter(
            "ratchet_lease_renewals", "Batched lease renewals: ok, or error (the ledger call "
            "failed).", ["outcome"])
        self.renewal_duration = histogram(
            "ratchet_lease_renewal_duration_seconds", "Batched lease renewal latency.",
            _FAST_BUCKETS)
        self.revoked = counter(
            "ratchet_leases_revoked", "Leases the ledger refused to renew (revoked, or taken "
            "over after expiry): lost to this worker.")
        self.commits = counter(
            "ratchet_commits", "Ledger write transactions of the worker's writer (group "
            "commits, a task's own writes such as effect intents): ok or error.", ["outcome"])
        self.commit_duration = histogram(
            "ratchet_commit_duration_seconds", "Writer transaction latency (claims ride on "
            "group commits).",
            _FAST_BUCKETS)
        self._c_claims = _Children(self.claims)
        self._c_takeovers = _Children(self.takeovers)
        self._c_attempts = _Children(self.attempts)
        self._c_attempt_duration = _Children(self.attempt_duration)
        self._c_retries = _Children(self.retries)
        self._c_stale = _Children(self.stale)
        self._c_effects = _Children(self.effects)
        self._c_effect_duration = _Children(self.effect_duration)
        self._c_late = _Children(self.late_effects)
        self._c_steps = _Children(self.steps)
        self._c_requests = _Children(self.downstream_requests)
        self._c_circuit_open = _Children(self.circuit_open)
        self._renew_ok = self.renewals.labels("ok")
        self._renew_error = self.renewals.labels("error")
        self._commit_ok = self.commits.labels("ok")
        self._commit_error = self.commits.labels("error")
        r.register(_WorkerStateCollector(self))
        if process:
            ProcessCollector(registry=r)

    # ------------------------------------------------------------------ label values

    def _type(self, name: str) -> str:
        return name if name in self._types else OTHER

    def _downstream(self, name: str | None) -> str:
        return name if name is not None and name in self._downstreams else OTHER

    @property
    def worker(self) -> WorkerLike | None:
        """The worker reported on (set by ``worker_start``), or None before."""
        return self._worker

    # ------------------------------------------------------------------ hooks

    def worker_start(self, worker: WorkerLike) -> None:
        """Bind to ``worker`` and create every labelled series at zero (its task types,
        its app's downstreams), so series exist before the first event."""
        self._worker = worker
        self._attempt_plan.clear()
        self._types = frozenset(worker.names)
        self._downstreams = frozenset(worker.app.downstreams) | frozenset(worker.app.breakers)
        for t in sorted(self._types):
            for children in (self._c_claims, self._c_takeovers, self._c_retries,
                             self._c_stale, self._c_late, self._c_attempt_duration,
                             self._c_effect_duration):
                children.get(t)
            for outcome in ATTEMPT_OUTCOMES:
                self._c_attempts.get(t, outcome)
            for outcome in EFFECT_OUTCOMES:
                self._c_effects.get(t, outcome)
            for outcome in STEP_OUTCOMES:
                self._c_steps.get(t, outcome)
        for d in sorted(self._downstreams):
            self._c_requests.get(d)
            self._c_circuit_open.get(d)

    def after_claim(self, worker: WorkerLike, claims: list[Claim]) -> None:
        """Count claims and takeovers by type."""
        for claim in claims:
            t = self._type(claim.name)
            self._c_claims.get(t).inc()
            if claim.takeover:
                self._c_takeovers.get(t).inc()

    def before_attempt(self, worker: WorkerLike, claim: Claim) -> None:
        """Note when the attempt started."""
        self._attempt_started[(claim.task_id, claim.generation)] = time.perf_counter()

    def after_attempt(
        self, worker: WorkerLike, claim: Claim, outcome: str, exception: BaseException | None
    ) -> None:
        """Count the attempt by type and outcome; observe its duration."""
        plan = self._attempt_plan.get((claim.name, outcome))
        if plan is None:
            plan = self._plan_attempt(claim.name, outcome)
        for counter in plan[0]:
            counter.inc()
        started = self._attempt_started.pop((claim.task_id, claim.generation), None)
        if started is not None:
            plan[1].observe(time.perf_counter() - started)

    def _plan_attempt(self, name: str, outcome: str) -> tuple[tuple[Counter, ...], Histogram]:
        """The series one (task name, outcome) moves, looked up once and kept."""
        t = self._type(name)
        label = outcome.lower()
        if label not in _ATTEMPT_OUTCOME_SET:
            label = OTHER
        counters = [self._c_attempts.get(t, label)]
        if label == "retry_wait":
            counters.append(self._c_retries.get(t))
        elif label == "stale":
            counters.append(self._c_stale.get(t))
        plan = (tuple(counters), self._c_attempt_duration.get(t))
        if len(self._attempt_plan) < 10_000:  # names and outcomes are few; never unbounded
            self._attempt_plan[(name, outcome)] = plan
        return plan

    def after_step(
        self, ctx: ContextLike, name: str, cached: bool, duration_s: float,
        exception: BaseException | None,
    ) -> None:
        """Count the step: ran, cached or failed."""
        outcome = "cached" if cached else "failed" if exception is not None else "ran"
        self._c_steps.get(self._type(ctx.name), outcome).inc()

    def before_effect(self, ctx: ContextLike, name: str, key: str) -> None:
        """Note the requests already sent toward the effect's downstream."""
        downstream = ctx.effect_downstream
        if downstream is not None:
            self._sent_before.value = ctx.downstream_calls.get(downstream, 0)

    def after_effect(
        self, ctx: ContextLike, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        """Count the settlement; the requests sent toward its downstream; a breaker's
        refusal."""
        t = self._type(ctx.name)
        self._c_effects.get(t, settled).inc()
        self._c_effect_duration.get(t).observe(duration_s)
        downstream = ctx.effect_downstream
        if downstream is not None:
            sent = ctx.downstream_calls.get(downstream, 0) - getattr(
                self._sent_before, "value", 0)
            if sent > 0:
                self._c_requests.get(self._downstream(downstream)).inc(
                    sent)
        if isinstance(exception, CircuitOpen):
            self._c_circuit_open.get(
                self._downstream(exception.downstream)).inc()

    def late_effect(self, ctx: ContextLike, name: str, key: str, outcome: str) -> None:
        """Count a late effect of this (stale) worker."""
        self._c_late.get(self._type(ctx.name)).inc()

    def after_renew(
        self, worker: WorkerLike, leases: int, refused: int, duration_s: float,
        error: BaseException | None,
    ) -> None:
        """Count the renewal, observe its latency, count refused leases."""
        if error is not None:
            self._renew_error.inc()
            return
        self._renew_ok.inc()
        self.renewal_duration.observe(duration_s)
        if refused:
            self.revoked.inc(refused)

    def after_commit(
        self, worker: WorkerLike, batch_size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """Count the writer's transaction and observe its latency."""
        (self._commit_ok if error is None else self._commit_error).inc()
        self.commit_duration.observe(duration_s)


_ATTEMPT_OUTCOME_SET = frozenset(ATTEMPT_OUTCOMES)


class _WorkerStateCollector(Collector):
    """Gauges read from the worker at scrape time: leases held and the smallest safe window
    left, stuck task threads, circuit breakers."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return []  # names are not known before the worker starts; nothing to check

    def collect(self) -> Iterator[Metric]:
        worker = self._metrics.worker
        held = GaugeMetricFamily("ratchet_leases_held", "Leases this worker holds now.")
        remaining = GaugeMetricFamily(
            "ratchet_lease_min_remaining_seconds", "Smallest safe window left among the "
            "leases held (seconds; negative: closed, awaiting renewal); absent when none.")
        stuck = GaugeMetricFamily(
            "ratchet_stuck_threads", "Task threads still inside the code of an attempt that "
            "was ended without them (time limit, shutdown grace).")
        state = GaugeMetricFamily(
            "ratchet_circuit_breaker_state", "1 for the current state of this process's "
            "circuit breaker toward a downstream.", labels=["downstream", "state"])
        opened = CounterMetricFamily(
            "ratchet_circuit_breaker_opened", "Times this process's breaker opened.",
            labels=["downstream"])
        corrupt = GaugeMetricFamily(
            "ratchet_ledger_corrupt", "1 once the database reported this worker's ledger "
            "damaged (the worker stops): restore it from a backup.")
        if worker is not None:
            corrupt.add_metric([], 0.0 if worker.ledger.corruption is None else 1.0)
            leases = worker.heartbeat.held()
            held.add_metric([], len(leases))
            if leases:
                remaining.add_metric([], min(h.remaining_s() for h in leases))
            stuck.add_metric([], worker.stats.stuck_threads)
            for name, breaker in sorted(worker.app.breakers.items()):
                current = breaker.state
                for s in BreakerState:
                    state.add_metric([name, s.value], 1.0 if s is current else 0.0)
                opened.add_metric([name], breaker.opened)
        yield from (held, remaining, stuck, state, opened, corrupt)


class MetricsServer:
    """Serves a registry's exposition over HTTP from a daemon thread
    (:func:`prometheus_client.start_http_server`): ``GET /metrics`` (any path answers).

    Args:
        registry: what to serve.
        host: the address to bind (default ``127.0.0.1``: loopback only).
        port: the TCP port; 0 picks a free one (read :attr:`port`).

    Raises:
        ConfigError: the address cannot be bound (in use, not an address of this host).
    """

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        check_int(port, "metrics port", minimum=0, maximum=65535, error=ConfigError)
        try:
            server, thread = start_http_server(port, host, registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from None
        self._server: WSGIServer = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_port
        """The port bound (the one picked when 0 was asked)."""

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
