"""Replay a task's function against its recorded history, locally (``ratchet replay``,
:func:`ratchet.testing.replay`): see what the code would do with a task's history before
deploying it, and check a new definition version against recorded histories of the old one.

* :mod:`ratchet.replay.history`: the recorded checkpoints of a task's code path;
* :mod:`ratchet.replay.context`: the replay contexts a body receives (sync and async);
* :mod:`ratchet.replay.run`: :func:`replay`, :func:`replay_sample` and their reports.

The how-to page: ``docs/how-to/replay.md``.
"""

from __future__ import annotations

from .context import AsyncReplayContext, ReplayContext
from .history import RecordedCheckpoint
from .run import DEFAULT_TIMEOUT_S, MAX_SAMPLE, Divergence, ReplayReport, replay, replay_sample

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_SAMPLE", "AsyncReplayContext", "Divergence",
           "RecordedCheckpoint", "ReplayContext", "ReplayReport", "replay", "replay_sample"]
