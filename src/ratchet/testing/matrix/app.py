"""The Ratchet app the crash-point matrix runs in real ``ratchet worker`` subprocesses:
``ratchet worker ratchet.testing.matrix.app:app``.

Everything the matrix counts is counted *outside* Ratchet:

* every execution of a step function appends one JSON line to the file named by
  ``MATRIX_STEP_LOG`` (``{"task", "step", "pid", "generation", "attempt"}``) before it
  returns, so a step that ran but whose commit was lost still shows up;
* every charge, and every batch of items, goes over real HTTP to the counting service
  (:mod:`ratchet.testing.services`) at ``MATRIX_PAY_URL``, which counts executions per key
  (and applied items) in its own SQLite file. Keys and items start with ``MATRIX_WORLD``
  (the world's prefix: the worlds of one matrix run share the service).

Tasks:

* :data:`CHARGE` ``(order_id, amount_cents)``: a pipelined step ``prepare``, a charge
  through ``ctx.effect`` (key ``charge:<order_id>``, the service's lookup as ``lookup=``;
  the service does not dedupe keys, so only Ratchet's protocol prevents a second
  execution) and a durable step ``finalize``.
* :data:`DELIVER` ``(n, size, parallel, hold_first=False)``: ``ctx.batches`` over the
  items ``0 .. n-1``, each batch delivered through ``ctx.effect`` (key
  ``deliver:<task>@<position>``). With ``hold_first`` the batch at position 0 of the first
  claim delivers and then holds until the file named by ``MATRIX_GATE`` exists (at most
  ``MATRIX_HOLD_S`` seconds, default 60), so later batches commit first.
  With ``MATRIX_ASYNC=1`` in the worker's environment (``ratchet crash-matrix
  --async``) the same body is ``async def``: ``await ctx.step`` / ``await ctx.effect``,
  the charge and its lookup sent with an
  :class:`~ratchet.testing.counting.client.AsyncCountingClient` (the worker runs it on its
  event loop); the checkpoints, keys and results are the same.
* :data:`EMIT` ``(n, keys)``: ``ctx.emit`` of ``n`` messages (topic :data:`EVENT_TOPIC`,
  ``{"n": i}``, key ``k<i mod keys>``) to the transactional outbox; returns
  ``{"messages": [[key, message id], ...]}`` in emit order (row 10).

Leases come from ``MATRIX_LEASE_S`` (default 1 s) at submit; retries are fast and there is
no quarantine (the matrix kills workers on purpose). The ledger comes from
``RATCHET_LEDGER_URL`` (the worker CLI's ``--ledger`` overrides it).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ...app import App
from ...retry import RetryPolicy
from ...worker.asynccontext import AsyncTaskContext
from ...worker.context import TaskContext
from ..counting.client import AsyncCountingClient, CountingClient
from ..processes import ConditionTimeout, wait_for

__all__ = ["CHARGE", "DELIVER", "EMIT", "EVENT_TOPIC", "LEASE_S", "app", "build_app",
           "charge_key", "deliver_key"]

CHARGE = "matrix.charge"
DELIVER = "matrix.deliver"
EMIT = "matrix.emit"
EVENT_TOPIC = "matrix.event"
"""The topic of the messages :data:`EMIT` writes to the outbox."""
LEASE_S = float(os.environ.get("MATRIX_LEASE_S", "1.0"))
"""Lease of the tasks this process submits, seconds."""

WORLD = os.environ.get("MATRIX_WORLD", "")
"""This process's world's prefix of every key and item sent to the counting service (worlds
of one matrix run share one service)."""

FAST_RETRY = RetryPolicy(
    max_attempts=60, base_delay_s=0.05, max_delay_s=1.0, jitter=0.5, overload_min_delay_s=0.2,
    quarantine_after=None,
)

ASYNC = os.environ.get("MATRIX_ASYNC") == "1"
"""Register the charge task's ``async def`` body instead of its plain def one."""

_client: CountingClient | None = None


def payment_client() -> CountingClient:
    """The counting-service client of this process (created on first use)."""
    global _client
    if _client is None:
        _client = CountingClient(os.environ["MATRIX_PAY_URL"], timeout_s=10.0)
    return _client


_async_client: AsyncCountingClient | None = None


def async_payment_client() -> AsyncCountingClient:
    """The async counting-service client of this process, for the ``async def`` charge
    (created on first use; used on the worker's one event loop only)."""
    global _async_client
    if _async_client is None:
        _async_client = AsyncCountingClient(os.environ["MATRIX_PAY_URL"], timeout_s=10.0)
    return _async_client


def charge_key(order_id: str) -> str:
    """The external idempotency key of the charge of ``order_id`` (after the world's
    prefix)."""
    return f"{WORLD}charge:{order_id}"


def deliver_key(task_id: str, pos: int) -> str:
    """The external idempotency key of the batch of ``task_id`` at position ``pos`` (after
    the world's prefix)."""
    return f"{WORLD}deliver:{task_id}@{pos}"


def _append(line: dict[str, Any]) -> None:
    path = os.environ.get("MATRIX_STEP_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def record_step(ctx: TaskContext, step: str) -> None:
    """Append one line to the external step log: this step function is executing."""
    _append({"task": ctx.task_id, "step": step, "pid": os.getpid(),
             "generation": ctx.generation, "attempt": ctx.attempt,
             "body": "async" if isinstance(ctx, AsyncTaskContext) else "def"})


def _hold() -> None:
    """Hold until the runner opens the gate file (at most MATRIX_HOLD_S seconds)."""
    gate = os.environ.get("MATRIX_GATE")
    with contextlib.suppress(ConditionTimeout):
        wait_for("the runner to open the gate", lambda: bool(gate and Path(gate).exists()),
                 timeout_s=float(os.environ.get("MATRIX_HOLD_S", "60")), interval_s=0.01)


def build_app(ledger: str | None = None, lease_s: float | None = None) -> App:
    """A fresh App with the matrix tasks registered.

    Args:
        ledger: ledger URL (``None``: ``RATCHET_LEDGER_URL``).
        lease_s: lease of the tasks this app submits, seconds (default :data:`LEASE_S`).
    """
    app = App(ledger)
    lease = lease_s or LEASE_S

    if ASYNC:
        app.task(name=CHARGE, retry=FAST_RETRY, lease_s=lease)(charge_async)
    else:
        app.task(name=CHARGE, retry=FAST_RETRY, lease_s=lease)(charge)

    @app.task(name=DELIVER, retry=FAST_RETRY, lease_s=lease)
    def deliver(ctx: TaskContext, n: int, size: int, parallel: int,
                hold_first: bool = False) -> dict[str, Any]:
        def fn(batch: list[int], pos: int) -> None:
            _append({"task": ctx.task_id, "step": f"batch@{pos}", "pid": os.getpid(),
                     "generation": ctx.generation, "attempt": ctx.attempt})
            client = payment_client()
            body = {"pos": pos, "items": [f"{WORLD}{item}" for item in batch]}
            ctx.effect("deliver", lambda k: client.execute(k, body),
                       key=deliver_key(ctx.task_id, pos), lookup=client.lookup,
                       params={"pos": pos, "n": len(batch)})
            if hold_first and pos == 0 and ctx.generation == 1:
                _hold()

        return ctx.batches("items", range(n), fn, size=size, parallel=parallel)

    @app.task(name=EMIT, retry=FAST_RETRY, lease_s=lease)
    def emit(ctx: TaskContext, n: int, keys: int) -> dict[str, Any]:
        sent = []
        for i in range(n):
            key = f"k{i % keys}"
            sent.append([key, ctx.emit(EVENT_TOPIC, {"n": i}, key=key)])
        return {"messages": sent}

    return app


def charge(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """The charge task's plain def body (see the module docstring)."""
    def prepare() -> dict[str, Any]:
        record_step(ctx, "prepare")
        return {"order_id": order_id, "amount_cents": amount_cents, "currency": "EUR"}

    quote = ctx.step("prepare", prepare)
    client = payment_client()
    key = charge_key(order_id)
    body = {"order_id": order_id, "amount_cents": amount_cents}
    receipt = ctx.effect("charge", lambda k: client.execute(k, body), key=key,
                         lookup=client.lookup, params=body)

    def finalize() -> dict[str, Any]:
        record_step(ctx, "finalize")
        return {"order_id": order_id, "status": "paid"}

    final = ctx.step("finalize", finalize, durable=True)
    charged = receipt["body"]["amount_cents"] if isinstance(receipt, dict) else receipt
    # Only deterministic parts: a crash-free control run must return exactly this.
    return {"quote": quote, "final": final, "charged": charged}


async def charge_async(ctx: AsyncTaskContext, order_id: str,
                       amount_cents: int) -> dict[str, Any]:
    """The charge task's ``async def`` body (``MATRIX_ASYNC=1``): the same checkpoints as
    :func:`charge`, the charge and its lookup sent with an ``httpx.AsyncClient``
    (:class:`~ratchet.testing.counting.client.AsyncCountingClient`)."""
    async def prepare() -> dict[str, Any]:
        record_step(ctx, "prepare")
        return {"order_id": order_id, "amount_cents": amount_cents, "currency": "EUR"}

    quote = await ctx.step("prepare", prepare)
    key = charge_key(order_id)
    body = {"order_id": order_id, "amount_cents": amount_cents}
    client = async_payment_client()
    receipt = await ctx.effect("charge", lambda k: client.execute(k, body), key=key,
                               lookup=client.lookup, params=body)

    def finalize() -> dict[str, Any]:  # a plain function inside an async body
        record_step(ctx, "finalize")
        return {"order_id": order_id, "status": "paid"}

    final = await ctx.step("finalize", finalize, durable=True)
    charged = receipt["body"]["amount_cents"] if isinstance(receipt, dict) else receipt
    return {"quote": quote, "final": final, "charged": charged}


app = build_app()
if os.environ.get("MATRIX_PAY_URL"):
    # Build the HTTP client at import, before the worker starts its threads.
    payment_client()
    if ASYNC:
        # And the async one (its TLS context, its transport's imports), so that the first
        # charge takes as long as in a plain def body: the rows count transactions.
        import anyio._backends._asyncio  # noqa: F401
        import httpcore._async  # noqa: F401

        async_payment_client()
