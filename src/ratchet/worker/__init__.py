"""Workers: claim loop, task context, heartbeat and group-commit writer."""

from __future__ import annotations

from .asynccontext import AsyncTaskContext
from .context import NOT_FOUND, NotFound, TaskContext
from .hooks import Middleware
from .runner import (
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
    Worker,
    WorkerStats,
)

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_POLL_INTERVAL_S",
    "MAX_PREFETCH",
    "MAX_STUCK_THREADS",
    "MAX_WRITERS",
    "NOT_FOUND", "AsyncTaskContext", "Middleware", "NotFound", "TaskContext", "Worker",
    "WorkerStats"]
