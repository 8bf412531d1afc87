"""Shared by the tests of the faces of batches and sharded jobs (CLI, HTTP API, metrics,
dashboard): the tasks they run and the states they bring them to.

* ``bt.items`` runs ``ctx.batches("items", range(n), ...)`` (a sequence: total known); a
  batch at a position in ``hold`` waits for :attr:`Gates.release`, so the run stands still
  with a known watermark and known batches committed above it.
* ``bt.stream`` reads its items from a callable source (no total): the same holds.
* ``bt.shard`` is a sharded job's task: each shard processes the keys ``0 .. n - 1`` it
  owns in batches of 5; the shard ``fail_shard`` raises a ``PermanentError`` in its second
  batch, so it ends FAILED midway with its remaining items never processed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ratchet import App, Control, PermanentError, RetryPolicy, TaskContext
from ratchet.control import BatchProgress
from ratchet.shards import shard_of
from ratchet.testing import wait_for

HOLD_TIMEOUT_S = 60.0
"""The longest a held batch waits for its release (a test that fails before releasing
must not hang its worker)."""


@dataclass
class Gates:
    """The release of the held batches (set it before the worker stops)."""

    release: threading.Event = field(default_factory=threading.Event)


def register(app: App, gates: Gates) -> None:
    """Register ``bt.items``, ``bt.stream`` and ``bt.shard`` on ``app``."""

    def hold_at(hold: list[int]) -> Any:
        def fn(batch: list[int], pos: int) -> None:
            if pos in hold:
                gates.release.wait(HOLD_TIMEOUT_S)
        return fn

    @app.task(name="bt.items")
    def items(ctx: TaskContext, n: int, size: int, parallel: int = 1,
              hold: list[int] | None = None) -> Any:
        return ctx.batches("items", list(range(n)), hold_at(hold or []), size=size,
                           parallel=parallel)

    @app.task(name="bt.stream")
    def stream(ctx: TaskContext, n: int, size: int, hold: list[int] | None = None) -> Any:
        return ctx.batches("stream", lambda start: iter(range(start, n)),
                           hold_at(hold or []), size=size)

    @app.task(name="bt.shard", retry=RetryPolicy(max_attempts=1))
    def shard(ctx: TaskContext, n: int, fail_shard: int = -1) -> Any:
        s = ctx.shard
        assert s is not None
        mine = [i for i in range(n) if s.owns(str(i))]

        def fn(batch: list[int], pos: int) -> None:
            if s.index == fail_shard and pos >= 5:
                raise PermanentError(f"shard {s.index} cannot process item {batch[0]}")

        return ctx.batches("mine", mine, fn, size=5)


def shard_items(n: int, shards: int, index: int) -> int:
    """How many of the keys ``0 .. n - 1`` shard ``index`` of ``shards`` owns."""
    return sum(1 for i in range(n) if shard_of(str(i), shards) == index)


def held(control: Control, task_id: str, watermark: int, above: int = 0) -> BatchProgress:
    """Wait until ``task_id``'s one run stands at ``watermark`` with ``above`` batches
    committed above it (the held batches reached), and return it."""
    def probe() -> BatchProgress | None:
        runs = control.batch_progress(task_id)
        if len(runs) == 1 and runs[0].watermark == watermark and len(runs[0].above) == above:
            return runs[0]
        return None

    found: BatchProgress = wait_for(f"{task_id}'s run to stand at {watermark}", probe,
                                    timeout_s=30)
    return found

