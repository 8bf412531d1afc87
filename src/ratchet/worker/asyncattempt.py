"""One attempt of an ``async def`` task body, on the worker's event loop
(:mod:`ratchet.worker.asyncrun`; DESIGN §5, async bodies).

The same steps as a sync attempt (:mod:`ratchet.worker.attempt`), and the same code for
them: :meth:`~ratchet.worker.attempt.AttemptLadder._begin` (hooks, context, time limit),
:meth:`~ratchet.worker.attempt.AttemptLadder._start` (the start checks: on the loop when
nothing in them can wait, i.e. a read of the operator requests covering the lease is fresh
and the lease is confirmed, else in a thread of the loop's executor), then the body
awaited on the loop with an :class:`~ratchet.worker.asynccontext.AsyncTaskContext`, then
:meth:`~ratchet.worker.attempt.AttemptLadder._conclude` (the exception ladder turning the
ending into a transition handed to the writer, without waiting) and
:meth:`~ratchet.worker.attempt.AttemptLadder._end`, on the loop; an attempt ended without
its body (whose late result waits for the attempt's own ending write) concludes in a
thread.

A time limit or the end of the shutdown grace ends the attempt without its body (as for
a sync body) and cancels the body's asyncio task: the body sees
``asyncio.CancelledError`` at its current ``await`` (its outcome was already written by
the worker). An attempt whose task is an async type's sharded job is refused (sharded
jobs and ``ctx.batches`` run on threads: sync task types only).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ..app import TaskDefinition
from ..errors import InvalidArguments, TransactionMisuse
from ..ledger.base import Claim
from .asynccontext import AsyncTaskContext
from .attempt import AttemptLadder, compensations, replay_ended
from .context import TaskContext
from .heartbeat import LeaseHandle
from .timelimit import Attempt

__all__ = ["AsyncAttempts"]

log = logging.getLogger("ratchet.worker")

T = TypeVar("T")


class _Body:
    """Whether an async attempt's body is being awaited (loop thread only): a time limit
    cancels the asyncio task only then, never its start checks nor its final write."""

    __slots__ = ("running", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.running = False

    def cancel(self) -> None:
        if self.running and self.task is not None:
            self.task.cancel()


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread of the loop's executor, awaited to its end even when the
    awaiting task is cancelled meanwhile (a cancellation requested just as the body
    returned must not cut the attempt's final write short)."""
    inner = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    while True:
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.cancelled():
                raise


class AsyncAttempts(AttemptLadder):
    """Runs one claimed attempt of an ``async def`` task type (see the module
    docstring)."""

    async def _execute_async(self, item: tuple[Claim, LeaseHandle]) -> None:
        claim, lease = item
        outcome: str | None = "abandoned"
        ctx: TaskContext | None = None
        attempt: Attempt | None = None
        try:
            definition, ctx, attempt = self._begin(claim, lease, AsyncTaskContext, None)
            body = _Body(asyncio.current_task())
            runner = self._async
            assert runner is not None
            attempt.cancel = lambda: runner.call_soon(body.cancel)
            try:
                if (self._start_check.fresh(lease) and not lease.lost
                        and lease.remaining_s() > 0):
                    params = self._start(ctx)  # nothing in it can block now
                else:
                    params = await asyncio.to_thread(self._start, ctx)
                if not self._attempts.is_running(claim):
                    # Ended meanwhile (time limit, shutdown grace): the body never starts.
                    raise asyncio.CancelledError()
                body.running = True
                try:
                    result = await self._call_async(definition, ctx, params)
                finally:
                    body.running = False
                    # A task the body started and left running must not checkpoint into
                    # an attempt that has ended: its next ctx call raises.
                    ctx.interrupt(TransactionMisuse(
                        "this attempt has ended (its body returned or raised): a "
                        "checkpoint from an asyncio task the body started and did not "
                        "await is refused"))
            except BaseException as exc:
                error: BaseException | None = exc
                result = None
            else:
                error = None
            if self._attempts.is_running(claim):
                # The common end: the transition handed to the writer, nothing that waits
                # (hooks and logging run here, as the step hooks do).
                outcome = self._conclude(definition, claim, ctx, result, error)
            else:
                # Ended without the body (time limit, grace): a late result waits for the
                # attempt's own ending write to be handed over first.
                outcome = await _in_thread(self._conclude, definition, claim, ctx, result,
                                           error)
        except BaseException:  # never let one task kill the worker or leak its slot
            log.exception("internal error while running task %s", claim.task_id)
            outcome = "abandoned"
        self._end(claim, lease, attempt, ctx, outcome)  # never waits

    async def _call_async(self, definition: TaskDefinition, ctx: TaskContext,
                          params: dict[str, Any]) -> Any:
        """The body: ``await fn(ctx, **params)``, or its compensation replay."""
        if ctx.shard_job is not None:
            raise InvalidArguments(
                f"task {definition.name!r} is async def: a sharded job's parent runs on "
                "threads (ctx.batches), for plain def task types only")
        if ctx.compensation_mode:
            try:
                await definition.fn(ctx, **params)
            except BaseException as exc:
                replay_ended(ctx, exc)
            return await asyncio.to_thread(compensations, ctx)
        return await definition.fn(ctx, **params)
