"""Workers: claim loop, task context, heartbeat and group-commit writer."""

from __future__ import annotations

from .context import NOT_FOUND, NotFound, TaskContext
from .hooks import Middleware
from .runner import Worker, WorkerStats

__all__ = ["NOT_FOUND", "Middleware", "NotFound", "TaskContext", "Worker", "WorkerStats"]
