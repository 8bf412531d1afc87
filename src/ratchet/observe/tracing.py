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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..app.spans import (
    MAX_TRACE_CONTEXT_CHARS,
    SubmitSpan,
    _api,
    _config,
    _provider,
    _tracer_of,
    available,
    configure,
    enabled,
    submit_span,
)
from ..errors import ConfigError
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

_FAILED_OUTCOMES = frozenset({"FAILED", "UNKNOWN", "RETRY_WAIT", "stale", "lease_lost",
                              "abandoned"})


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span as lowercase hex (32 and 16 chars), or
    None when there is no valid current span or OpenTelemetry is not installed."""
    if not (_config.loaded or available()):
        return None
    sc = _api.trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"


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
