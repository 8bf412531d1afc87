"""OpenTelemetry spans for submit, attempts, steps and effects (DESIGN §9).

OpenTelemetry is optional (the ``otel`` extra: ``pip install 'ratchet[otel]'``). Without
it, or without a configured ``TracerProvider``, every function here is a cheap no-op:
:func:`enabled` is False, submits store no trace context and the worker installs no
tracing middleware.

What is traced:

* ``submit TYPE`` (kind ``PRODUCER``), around :meth:`ratchet.App.submit` (its shared
  submit transaction included); ``submit_many`` is one span for the whole batch. Its W3C
  trace context (``traceparent``, ``tracestate``) is stored with the task
  (``tasks.trace_context``, a JSON object) and comes back with every claim.
* ``attempt TYPE`` (kind ``CONSUMER``), one per claim, from ``before_attempt`` to
  ``after_attempt`` of :class:`TracingMiddleware`. It **links** to the submit span (the
  OpenTelemetry recommendation for queue consumers: each attempt is a trace of its own,
  and a retry's attempt links to the same submit span). ``TracingMiddleware(parent=True)``
  (``RATCHET_TRACE_PARENT=1``) makes the attempt a *child* of the submit span as well (one
  trace per task across its retries, which may then last hours).
* ``step NAME`` (``INTERNAL``) and ``effect NAME`` (``CLIENT``), children of the attempt
  span (or of the enclosing step), current while they run so that instrumented libraries
  called inside them (httpx, ...) nest under them.

Attributes (a fixed set; task ids and business keys go to spans, never to metrics):
``ratchet.task.id``, ``ratchet.task.type``, ``ratchet.task.version``,
``ratchet.task.generation``, ``ratchet.task.attempt``, ``ratchet.task.max_attempts``,
``ratchet.worker.holder``, ``ratchet.outcome`` (the state written, or ``stale`` /
``lease_lost`` / ``abandoned``), ``ratchet.takeover``, ``ratchet.step.name`` /
``ratchet.step.cached``, ``ratchet.effect.name`` / ``ratchet.effect.key`` /
``ratchet.effect.settled``; submit: ``ratchet.idempotency_key``, ``ratchet.tenant``,
``ratchet.created``, ``ratchet.task.count`` (submit_many). An exception is recorded on the
span (``record_exception``) with status ``ERROR``; an attempt that did not succeed has
status ``ERROR`` too.

Enabling: the worker installs :class:`TracingMiddleware` by itself (first in its list) when
:func:`enabled`: OpenTelemetry importable, a recording ``TracerProvider`` (the global one,
or one given to :func:`configure`), and not switched off (``RATCHET_TRACE=0`` or
``configure(enabled=False)``). ``ratchet worker --trace-file PATH`` sets up a provider that
writes spans to a file, one JSON object per line (:class:`JsonLinesSpanExporter`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..version import __version__
from ..worker.hooks import (
    ContextLike,
    EffectSettlement,
    Middleware,
    WorkerLike,
    add_default_middleware,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExportResult
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from ..ledger.base import Claim

__all__ = [
    "MAX_TRACE_CONTEXT_CHARS",
    "JsonLinesSpanExporter",
    "SubmitSpan",
    "TracingMiddleware",
    "auto_middleware",
    "available",
    "configure",
    "current_ids",
    "enabled",
    "parse_trace_context",
    "submit_span",
]

log = logging.getLogger("ratchet.observe.tracing")

TRACER_NAME = "ratchet"
MAX_TRACE_CONTEXT_CHARS = 1024
"""Longest trace context stored with a task; a longer ``tracestate`` is dropped (the
``traceparent`` alone is 55 characters)."""

_FAILED_OUTCOMES = frozenset({"FAILED", "UNKNOWN", "RETRY_WAIT", "stale", "lease_lost",
                              "abandoned"})


class _Config:
    """Module state: the provider override, the on/off switch, the loaded API."""

    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.enabled: bool | None = None  # None: automatic
        self.loaded: bool | None = None  # None: not tried yet


_config = _Config()


_trace: Any = None  # the opentelemetry.trace module, once loaded
_api: Any = None  # what the hot paths use, imported once (a local import costs ~1 us)
_NOT_RECORDING: tuple[type, ...] = ()  # the API's proxy and no-op providers
_OFF = ("0", "false", "no", "off")


class _Api:
    """The OpenTelemetry names the middleware uses, bound once."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self.context = context
        self.Context = context.Context
        self.trace = trace
        self.Link = Link
        self.SpanKind = SpanKind
        self.Status = Status
        self.StatusCode = StatusCode
        self.propagator = TraceContextTextMapPropagator()


def available() -> bool:
    """True when the OpenTelemetry API and SDK can be imported (the ``otel`` extra)."""
    global _trace, _api, _NOT_RECORDING
    if _config.loaded is None:
        try:
            import opentelemetry.sdk.trace  # noqa: F401
            from opentelemetry import trace

            api = _Api()
        except ImportError:
            _config.loaded = False
        else:
            _trace, _api = trace, api
            _NOT_RECORDING = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
            _config.loaded = True
    return _config.loaded


def configure(
    tracer_provider: TracerProvider | None = None, *, enabled: bool | None = None
) -> None:
    """Set the ``TracerProvider`` Ratchet uses (None: OpenTelemetry's global one) and
    whether tracing is on (None: automatic, i.e. on when that provider records; False:
    off whatever is configured; True: on, when a provider is configured).

    Used by ``ratchet worker --trace-file`` / ``--no-trace`` and by tests; an application
    normally configures the global provider (``opentelemetry.trace.set_tracer_provider``)
    and needs nothing here.
    """
    _config.provider = tracer_provider
    _config.enabled = enabled


def _provider() -> TracerProvider:
    if _config.provider is not None:
        return _config.provider
    provider: TracerProvider = _trace.get_tracer_provider()
    return provider


def enabled() -> bool:
    """True when spans are recorded: OpenTelemetry importable, not switched off
    (``RATCHET_TRACE=0``, ``configure(enabled=False)``) and a provider that records (not
    the API's default proxy or no-op provider). Cheap (about a microsecond without a
    provider): called on every submit."""
    if _config.enabled is False or not (_config.loaded or available()):
        return False
    provider = _config.provider if _config.provider is not None \
        else _trace.get_tracer_provider()
    if isinstance(provider, _NOT_RECORDING):
        return False
    if _config.enabled is None:
        switch = os.environ.get("RATCHET_TRACE")
        if switch is not None and switch.strip().lower() in _OFF:
            return False
    return True


_tracers: dict[int, tuple[Any, Any]] = {}  # id(provider) -> (provider, its tracer)


def _tracer_of(provider: TracerProvider) -> Tracer:
    """Ratchet's tracer of ``provider``, made once (``get_tracer`` builds a new one)."""
    cached = _tracers.get(id(provider))
    if cached is not None and cached[0] is provider:
        tracer: Tracer = cached[1]
        return tracer
    tracer = provider.get_tracer(TRACER_NAME, __version__)
    _tracers[id(provider)] = (provider, tracer)
    return tracer


def _tracer() -> Tracer:
    return _tracer_of(_provider())


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span as lowercase hex (32 and 16 chars), or
    None when there is no valid current span or OpenTelemetry is not installed."""
    if not (_config.loaded or available()):
        return None
    sc = _trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


# ---------------------------------------------------------------------- submit


class SubmitSpan:
    """The submit span as :func:`submit_span` yields it.

    Attributes:
        trace_context: the span's W3C trace context to store with the task (JSON text, at
            most :data:`MAX_TRACE_CONTEXT_CHARS`), or None when not tracing.
    """

    __slots__ = ("_span", "trace_context")

    def __init__(self, span: Span | None = None, trace_context: str | None = None) -> None:
        self._span = span
        self.trace_context = trace_context

    def submitted(self, task_id: str, created: bool, version: int) -> None:
        """Record the outcome: the task id (the existing one when deduplicated), whether
        a row was written and the definition version pinned."""
        if self._span is not None:
            self._span.set_attributes({"ratchet.task.id": task_id, "ratchet.created": created,
                                       "ratchet.task.version": version})

    def submitted_many(self, count: int, created: int) -> None:
        """Record the outcome of a ``submit_many``: tasks in the batch and rows written."""
        if self._span is not None:
            self._span.set_attributes({"ratchet.task.count": count,
                                       "ratchet.created_count": created})


_NO_SPAN = SubmitSpan()


def _inject() -> str | None:
    """The current context as stored trace-context text, or None if it has no span."""
    carrier: dict[str, str] = {}
    _api.propagator.inject(carrier)
    if "traceparent" not in carrier:
        return None
    text = json.dumps(carrier, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_TRACE_CONTEXT_CHARS:
        text = json.dumps({"traceparent": carrier["traceparent"]}, separators=(",", ":"))
    return text


class _NoSubmitSpan:
    """The context manager :func:`submit_span` returns when not tracing (no generator)."""

    def __enter__(self) -> SubmitSpan:
        return _NO_SPAN

    def __exit__(self, *exc: object) -> None:
        return None


_NO_SUBMIT_SPAN = _NoSubmitSpan()


def submit_span(
    name: str, *, idempotency_key: str | None = None, tenant: str | None = None,
    many: bool = False,
) -> AbstractContextManager[SubmitSpan]:
    """A ``submit NAME`` span (current while the block runs) around one submit, or a
    ``submit_many`` span around a batch (``many``). Yields a :class:`SubmitSpan` whose
    ``trace_context`` goes into the task rows. An exception raised in the block is
    recorded on the span and re-raised. A no-op (yields a span-less
    :class:`SubmitSpan`) when not :func:`enabled`."""
    if not enabled():
        return _NO_SUBMIT_SPAN
    return _submit_span(name, idempotency_key, tenant, many)


@contextmanager
def _submit_span(
    name: str, idempotency_key: str | None, tenant: str | None, many: bool
) -> Iterator[SubmitSpan]:
    attributes: dict[str, Any] = {"messaging.system": "ratchet"}
    if not many:
        attributes["ratchet.task.type"] = name
        attributes["messaging.destination.name"] = name
    if idempotency_key is not None:
        attributes["ratchet.idempotency_key"] = idempotency_key
    if tenant is not None:
        attributes["ratchet.tenant"] = tenant
    with _tracer().start_as_current_span(
        "submit_many" if many else f"submit {name}", kind=_api.SpanKind.PRODUCER,
        attributes=attributes,
    ) as span:
        yield SubmitSpan(span, _inject())


def parse_trace_context(text: str | None) -> Context | None:
    """The submitter's context from a task's stored trace context, or None when there is
    none or it cannot be read (text from an older or foreign writer is ignored, never
    fatal)."""
    if not text:
        return None
    try:
        carrier = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(carrier, dict) or not isinstance(carrier.get("traceparent"), str):
        return None
    if not (_config.loaded or available()):
        return None
    clean = {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}
    try:
        ctx: Context = _api.propagator.extract(clean)
    except Exception:  # a malformed header: no link rather than no attempt
        return None
    return ctx if _api.trace.get_current_span(ctx).get_span_context().is_valid else None


# ---------------------------------------------------------------------- worker


@dataclass(slots=True)
class _Open:
    """An attempt's span, the context it makes current and its open step/effect spans."""

    span: Span
    context: Context
    inner: list[Span]


class TracingMiddleware(Middleware):
    """Worker middleware recording an ``attempt`` span per claim and a span per step and
    effect (see the module docstring for names, kinds and attributes).

    Thread-safe: spans are kept per ``(task id, generation)``; ``after_attempt`` may run
    on another thread than ``before_attempt`` (the writer's, once the final write
    committed). While the body runs, the attempt span is the task thread's current span.

    Args:
        parent: also make the attempt a child of the submit span (one trace per task);
            default False, or ``RATCHET_TRACE_PARENT=1``: the attempt starts a trace of its
            own and links to the submit span.
        tracer_provider: the provider to use; default the one :func:`configure` set, else
            OpenTelemetry's global one.

    Raises:
        ConfigError: OpenTelemetry is not installed.
    """

    def __init__(
        self, parent: bool | None = None, tracer_provider: TracerProvider | None = None
    ) -> None:
        if not available():
            raise ConfigError("tracing needs OpenTelemetry: pip install 'ratchet[otel]'")
        if parent is None:
            parent = os.environ.get("RATCHET_TRACE_PARENT", "").strip().lower() in (
                "1", "true", "yes", "on")
        self.parent = parent
        self._provider = tracer_provider
        self._tracer: Tracer | None = None
        self._open: dict[tuple[str, int], _Open] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # token: the attached attempt context, this thread

    def _get_tracer(self) -> Tracer:
        if self._tracer is None:
            self._tracer = _tracer_of(
                self._provider if self._provider is not None else _provider())
        return self._tracer

    def worker_stop(self, worker: WorkerLike) -> None:
        """Flush the provider's span processors (an SDK provider), so that a worker that
        exits right after :meth:`Worker.run` loses no span."""
        provider = self._provider if self._provider is not None else _provider()
        flush = getattr(provider, "force_flush", None)
        if callable(flush):
            flush()

    def before_attempt(self, worker: WorkerLike, claim: Claim) -> None:
        """Start the attempt span (linked to the submit span) and make it current."""
        api = _api
        otel_context, trace = api.context, api.trace
        submitter = parse_trace_context(claim.trace_context)
        links: list[Any] = []
        if submitter is not None:
            links.append(api.Link(trace.get_current_span(submitter).get_span_context()))
        parent_ctx = submitter if (self.parent and submitter is not None) else api.Context()
        span = self._get_tracer().start_span(
            f"attempt {claim.name}", context=parent_ctx, kind=api.SpanKind.CONSUMER,
            links=links, attributes={
                "messaging.system": "ratchet",
                "ratchet.task.id": claim.task_id, "ratchet.task.type": claim.name,
                "ratchet.task.version": claim.version,
                "ratchet.task.generation": claim.generation,
                "ratchet.task.attempt": claim.attempt,
                "ratchet.task.max_attempts": claim.max_attempts,
                "ratchet.worker.holder": worker.holder, "ratchet.takeover": claim.takeover,
            })
        ctx = trace.set_span_in_context(span, api.Context())
        with self._lock:
            self._open[(claim.task_id, claim.generation)] = _Open(span, ctx, [])
        for token in [*reversed(getattr(self._local, "inner", None) or ()),
                      getattr(self._local, "token", None)]:
            if token is not None:  # this thread's last attempt ended on another thread
                otel_context.detach(token)
        self._local.inner = []
        self._local.token = otel_context.attach(ctx)
        self._local.key = (claim.task_id, claim.generation)

    def after_attempt(
        self, worker: WorkerLike, claim: Claim, outcome: str, exception: BaseException | None
    ) -> None:
        """End the attempt span with its outcome; ``exception`` is recorded on it."""
        api = _api
        key = (claim.task_id, claim.generation)
        with self._lock:
            opened = self._open.pop(key, None)
        if getattr(self._local, "key", None) == key:
            api.context.detach(self._local.token)
            self._local.token = self._local.key = None
        if opened is None:
            return
        span = opened.span
        for inner in reversed(opened.inner):  # a step the attempt was ended inside
            inner.end()
        span.set_attribute("ratchet.outcome", outcome)
        if exception is not None:
            span.record_exception(exception)
        if outcome in _FAILED_OUTCOMES:
            span.set_status(api.Status(api.StatusCode.ERROR, outcome if exception is None
                                       else f"{outcome}: {type(exception).__name__}"))
        span.end()

    def _start_inner(self, ctx: ContextLike, name: str, kind_name: str,
                     attributes: dict[str, Any]) -> None:
        api = _api
        with self._lock:
            opened = self._open.get((ctx.task_id, ctx.generation))
        tokens = getattr(self._local, "inner", None)
        if tokens is None:
            tokens = self._local.inner = []
        if opened is None:  # the attempt already ended (time limit): no span, keep pairs
            tokens.append(None)
            return
        trace = api.trace
        parent = trace.set_span_in_context(opened.inner[-1]) if opened.inner else opened.context
        span = self._get_tracer().start_span(
            name, context=parent, kind=getattr(api.SpanKind, kind_name), attributes=attributes)
        opened.inner.append(span)
        tokens.append(api.context.attach(trace.set_span_in_context(span, parent)))

    def _end_inner(self, ctx: ContextLike, attributes: dict[str, Any],
                   exception: BaseException | None) -> None:
        api = _api
        with self._lock:
            opened = self._open.get((ctx.task_id, ctx.generation))
        tokens = getattr(self._local, "inner", None)
        token = tokens.pop() if tokens else None
        if token is not None:
            api.context.detach(token)
        if opened is None or not opened.inner:
            return
        span = opened.inner.pop()
        span.set_attributes(attributes)
        if exception is not None:
            span.record_exception(exception)
            span.set_status(api.Status(api.StatusCode.ERROR, type(exception).__name__))
        span.end()

    def before_step(self, ctx: ContextLike, name: str) -> None:
        """Start a ``step NAME`` span, current while the step runs."""
        self._start_inner(ctx, f"step {name}", "INTERNAL", {
            "ratchet.step.name": name, "ratchet.task.id": ctx.task_id,
            "ratchet.task.generation": ctx.generation})

    def after_step(
        self, ctx: ContextLike, name: str, cached: bool, duration_s: float,
        exception: BaseException | None,
    ) -> None:
        """End the step span (``ratchet.step.cached``; the exception recorded)."""
        self._end_inner(ctx, {"ratchet.step.cached": cached}, exception)

    def before_effect(self, ctx: ContextLike, name: str, key: str) -> None:
        """Start an ``effect NAME`` span with the business key, current while it runs."""
        self._start_inner(ctx, f"effect {name}", "CLIENT", {
            "ratchet.effect.name": name, "ratchet.effect.key": key,
            "ratchet.task.id": ctx.task_id, "ratchet.task.generation": ctx.generation})

    def after_effect(
        self, ctx: ContextLike, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        """End the effect span (``ratchet.effect.settled``; the exception recorded)."""
        self._end_inner(ctx, {"ratchet.effect.settled": settled}, exception)


def auto_middleware(installed: Sequence[Middleware]) -> TracingMiddleware | None:
    """The tracing middleware a worker installs by itself: a new
    :class:`TracingMiddleware` when :func:`enabled` and none is in ``installed``, else
    None."""
    if any(isinstance(mw, TracingMiddleware) for mw in installed) or not enabled():
        return None
    return TracingMiddleware()


# ---------------------------------------------------------------------- export


def _span_record(span: ReadableSpan) -> dict[str, Any]:
    sc = span.get_span_context()
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{sc.trace_id:032x}" if sc is not None else None,
        "span_id": f"{sc.span_id:016x}" if sc is not None else None,
        "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
        "start_s": (span.start_time or 0) / 1e9,
        "end_s": (span.end_time or 0) / 1e9,
        "status": span.status.status_code.name,
        "status_description": span.status.description,
        "attributes": dict(span.attributes or {}),
        "links": [{"trace_id": f"{link.context.trace_id:032x}",
                   "span_id": f"{link.context.span_id:016x}"} for link in span.links],
        "events": [{"name": e.name, "attributes": dict(e.attributes or {})}
                   for e in span.events],
        "resource": dict(span.resource.attributes),
    }


class JsonLinesSpanExporter:
    """A span exporter writing one JSON object per finished span and line to a file
    (appended): ``name``, ``kind``, ``trace_id`` / ``span_id`` / ``parent_span_id`` (hex),
    ``start_s`` / ``end_s`` (epoch seconds), ``status``, ``attributes``, ``links``
    (``trace_id``, ``span_id``), ``events``, ``resource``. For ``ratchet worker
    --trace-file``, tests and quick looks; use an OTLP exporter for a collector.

    Args:
        path: the file; created if missing.

    Raises:
        OSError: the file cannot be opened for appending.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in shutdown)
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Write ``spans`` (one line each) and flush."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        text = "".join(json.dumps(_span_record(s), default=str) + "\n" for s in spans)
        with self._lock:
            if self._file.closed:
                return SpanExportResult.FAILURE
            self._file.write(text)
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (each export flushes)."""
        return True


def file_provider(path: str | os.PathLike[str], service_name: str = "ratchet-worker") -> Any:
    """An SDK ``TracerProvider`` exporting to ``path`` through a batch span processor and
    a :class:`JsonLinesSpanExporter` (``ratchet worker --trace-file``).

    Raises:
        ConfigError: OpenTelemetry is not installed.
        OSError: the file cannot be opened.
    """
    if not available():
        raise ConfigError("--trace-file needs OpenTelemetry: pip install 'ratchet[otel]'")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(JsonLinesSpanExporter(path)))  # type: ignore[arg-type]
    return provider


add_default_middleware(auto_middleware)  # every worker: first, when spans are recorded
