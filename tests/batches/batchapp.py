"""The Ratchet app the batch crash tests run in real worker subprocesses.

Everything that must be counted is counted *outside* Ratchet:

* every call of a batch function appends one JSON line to the file named by ``BATCH_LOG``
  (``{"task", "pos", "pid", "generation", "attempt"}``) when it starts, so a batch that ran
  but whose commit was lost still shows up;
* every batch delivers its items over real HTTP to the counting service
  (:mod:`ratchet.testing`) at ``BATCH_PAY_URL`` through ``ctx.effect`` (key derived from
  the task and the batch's position, the service's lookup as ``lookup=``): the request's
  body carries the batch's items and the service applies each one, counted per item in its
  own SQLite file.

Tasks:

* ``batch.deliver(n, size, parallel, hold_first=False)``: ``ctx.batches`` over the items
  ``0 .. n-1`` (a ``range``: read from any position). With ``hold_first``, the batch at
  position 0 of the first claim (generation 1) delivers its items and then holds until
  the file named by ``BATCH_GATE`` exists (at most ``BATCH_HOLD_S`` seconds, default 60),
  so a test can let later batches commit first, deterministically.
* ``batch.shard(n, size, parallel, fail_shard=None, fail_at=0)``: one shard of a sharded
  job (``App.submit_sharded``): ``ctx.batches`` over the items of ``0 .. n-1`` its shard
  owns (``ctx.shard.owns(str(item))``). The shard ``fail_shard`` fails permanently in its
  batch at position ``fail_at`` (before delivering it).

The service may be slow (a test's ``latency_s``): then ``BATCH_IN_FLIGHT_S`` says how
long a delivery can stay in flight there (its processing bound plus the lease check
before sending), the effect's ``in_flight_s``: a lookup's "not found" proves nothing until
then, since a dead holder's request may still execute (the service does not honour keys).

Leases come from ``BATCH_LEASE_S`` (default 2 s) at submit; retries are fast and there is
no quarantine (these tests kill workers on purpose).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import ratchet
from ratchet import PermanentError, RetryPolicy, TaskContext
from ratchet.testing import ConditionTimeout, CountingClient, wait_for

__all__ = ["DELIVER", "LEASE_S", "SHARD", "app", "build_app", "deliver_key"]

DELIVER = "batch.deliver"
SHARD = "batch.shard"
LEASE_S = float(os.environ.get("BATCH_LEASE_S", "2.0"))
IN_FLIGHT_S = (
    float(os.environ["BATCH_IN_FLIGHT_S"]) if os.environ.get("BATCH_IN_FLIGHT_S") else None
)
FAST_RETRY = RetryPolicy(
    max_attempts=60, base_delay_s=0.05, max_delay_s=1.0, jitter=0.5, overload_min_delay_s=0.2,
    quarantine_after=None,
)

_client: CountingClient | None = None


def payment_client() -> CountingClient:
    """The counting-service client of this process (created on first use)."""
    global _client
    if _client is None:
        _client = CountingClient(os.environ["BATCH_PAY_URL"], timeout_s=10.0)
    return _client


def deliver_key(task: str, pos: int) -> str:
    """The external idempotency key of the batch of ``task`` (a task id, or a shard's
    name) at position ``pos``."""
    return f"deliver:{task}@{pos}"


def record_call(ctx: TaskContext, pos: int) -> None:
    """Append one line to the external call log: a batch function starts."""
    path = os.environ.get("BATCH_LOG")
    if not path:
        return
    line = json.dumps({"task": ctx.task_id, "pos": pos, "pid": os.getpid(),
                       "generation": ctx.generation, "attempt": ctx.attempt})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _hold() -> None:
    """Hold until the test opens the gate file (at most BATCH_HOLD_S seconds, then go on)."""
    gate = os.environ.get("BATCH_GATE")
    with contextlib.suppress(ConditionTimeout):
        wait_for("the test to open the gate", lambda: bool(gate and Path(gate).exists()),
                 timeout_s=float(os.environ.get("BATCH_HOLD_S", "60")), interval_s=0.01)


def deliver(ctx: TaskContext, tag: str, batch: list[Any], pos: int) -> None:
    """Deliver one batch's items to the counting service, once (``ctx.effect``)."""
    client = payment_client()
    body = {"pos": pos, "items": batch}
    ctx.effect("deliver", lambda k: client.execute(k, body), key=deliver_key(tag, pos),
               lookup=client.lookup, params={"pos": pos, "n": len(batch)},
               in_flight_s=IN_FLIGHT_S)


def build_app(ledger: str | None = None, lease_s: float | None = None) -> ratchet.App:
    """A fresh App with the batch tasks registered (``lease_s``: of the tasks it submits)."""
    app = ratchet.App(ledger)

    @app.task(name=DELIVER, retry=FAST_RETRY, lease_s=lease_s or LEASE_S)
    def deliver_all(ctx: TaskContext, n: int, size: int, parallel: int,
                    hold_first: bool = False) -> dict[str, Any]:
        def fn(batch: list[int], pos: int) -> None:
            record_call(ctx, pos)
            deliver(ctx, ctx.task_id, batch, pos)
            if hold_first and pos == 0 and ctx.generation == 1:
                _hold()

        return ctx.batches("items", range(n), fn, size=size, parallel=parallel)

    @app.task(name=SHARD, retry=FAST_RETRY, lease_s=lease_s or LEASE_S)
    def shard(ctx: TaskContext, n: int, size: int, parallel: int,
              fail_shard: int | None = None, fail_at: int = 0) -> dict[str, Any]:
        place = ctx.shard
        if place is None:
            raise PermanentError(f"{SHARD} runs as a shard of a job (App.submit_sharded)")
        mine = [i for i in range(n) if place.owns(str(i))]
        tag = f"shard{place.index}"

        def fn(batch: list[int], pos: int) -> None:
            record_call(ctx, pos)
            if place.index == fail_shard and pos == fail_at:
                raise PermanentError(f"shard {place.index} refuses its batch at {pos}")
            deliver(ctx, tag, batch, pos)

        return ctx.batches("mine", mine, fn, size=size, parallel=parallel)

    return app


app = build_app()
if os.environ.get("BATCH_PAY_URL"):
    # Build the HTTP client at import, before the worker starts its threads.
    payment_client()
