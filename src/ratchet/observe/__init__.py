"""Observability: Prometheus metrics (:mod:`.metrics`), OpenTelemetry spans
(:mod:`.tracing`, a no-op without the ``otel`` extra) and structured logs (:mod:`.logs`),
all fed by worker :class:`~ratchet.worker.hooks.Middleware` and the Control API."""
