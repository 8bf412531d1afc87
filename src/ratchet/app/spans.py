"""OpenTelemetry set-up and the submit span (DESIGN §9): what :meth:`ratchet.App.submit`
needs of tracing, below the app so that it imports nothing of the worker.

OpenTelemetry is optional (the ``otel`` extra). Without it, or without a configured
``TracerProvider``, :func:`enabled` is False and :func:`submit_span` is a cheap no-op.
:mod:`ratchet.observe.tracing` (the worker's middleware, the span exporter) builds on the
state kept here: the provider override, the on/off switch and the OpenTelemetry names,
loaded once.

The ``submit TYPE`` span (kind ``PRODUCER``) is current around one submit (its shared
submit transaction included); ``submit_many`` is one span for the whole batch. Its W3C
trace context (``traceparent``, ``tracestate``) is stored with the task
(``tasks.trace_context``, a JSON object, at most :data:`MAX_TRACE_CONTEXT_CHARS`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from ..version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = [
    "MAX_TRACE_CONTEXT_CHARS",
    "TRACER_NAME",
    "SubmitSpan",
    "available",
    "configure",
    "enabled",
    "submit_span",
]

TRACER_NAME = "ratchet"
MAX_TRACE_CONTEXT_CHARS = 1024
"""Longest trace context stored with a task; a longer ``tracestate`` is dropped (the
``traceparent`` alone is 55 characters)."""

_OFF = ("0", "false", "no", "off")


class _Config:
    """Module state: the provider override, the on/off switch, the loaded API."""

    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.enabled: bool | None = None  # None: automatic
        self.loaded: bool | None = None  # None: not tried yet


_config = _Config()


class _Api:
    """The OpenTelemetry names the hot paths use, bound once by :func:`available` (a
    local import costs about a microsecond). One object for the life of the process:
    modules that import it see the names once they are loaded."""

    trace: Any
    context: Any
    Context: Any
    Link: Any
    SpanKind: Any
    Status: Any
    StatusCode: Any
    propagator: Any
    not_recording: tuple[type, ...] = ()
    """The API's proxy and no-op providers (they record nothing)."""

    def load(self) -> None:
        """Import OpenTelemetry's API and SDK and bind the names.

        Raises:
            ImportError: OpenTelemetry (API or SDK) is not installed.
        """
        import opentelemetry.sdk.trace  # noqa: F401
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
        self.not_recording = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)


_api = _Api()


def available() -> bool:
    """True when the OpenTelemetry API and SDK can be imported (the ``otel`` extra)."""
    if _config.loaded is None:
        try:
            _api.load()
        except ImportError:
            _config.loaded = False
        else:
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
    """The configured provider, else OpenTelemetry's global one (needs :func:`available`)."""
    if _config.provider is not None:
        return _config.provider
    provider: TracerProvider = _api.trace.get_tracer_provider()
    return provider


def enabled() -> bool:
    """True when spans are recorded: OpenTelemetry importable, not switched off
    (``RATCHET_TRACE=0``, ``configure(enabled=False)``) and a provider that records (not
    the API's default proxy or no-op provider). Cheap (about a microsecond without a
    provider): called on every submit."""
    if _config.enabled is False or not (_config.loaded or available()):
        return False
    provider = _config.provider if _config.provider is not None \
        else _api.trace.get_tracer_provider()
    if isinstance(provider, _api.not_recording):
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
