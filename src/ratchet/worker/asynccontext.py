"""What an ``async def`` task body sees: :class:`AsyncTaskContext` (DESIGN §5, async
bodies).

The same state and the same protocol as :class:`~ratchet.worker.context.TaskContext`
(it is a subclass: one :class:`~ratchet.worker.checkpoints.CheckpointState` per attempt),
with awaitable checkpoint methods of the same names and arguments. The checkpoint and
effect logic is the one sans-I/O core of :mod:`ratchet.worker.protocol`, driven by
:func:`~ratchet.worker.protocol.run_async` on the worker's event loop:

* ``await ctx.step(name, fn, *args, durable=False, **kwargs)``: ``fn`` may be a plain
  function (called on the event loop: keep it short, or hand blocking work to
  ``asyncio.to_thread`` yourself) or an ``async def`` (awaited).
* ``await ctx.effect(name, call, key=..., lookup=..., ...)``: ``call`` and ``lookup`` may
  be plain or ``async def`` functions; durable writes (the intent, the result) are handed
  to the worker's ledger writer and awaited without holding a thread.
* ``await ctx.emit(topic, message, key=, message_id=)``.
* ``await ctx.transaction(name, fn, *args, **kwargs)``: ``fn`` is a plain function given
  the ledger's sync DB-API connection (``sqlite3`` / psycopg); the whole transaction step
  runs in a thread of the loop's executor (the ledger drivers are synchronous).
* ``await ctx.sleep(...)``, ``await ctx.sleep_until(...)``,
  ``await ctx.wait_for_event(...)``, ``await ctx.submit(...)``,
  ``await ctx.submit_many(...)``, ``await ctx.gather(...)``, ``await ctx.wait(...)``:
  the same durable calls as the sync context's, each run in a thread of the loop's
  executor (they are ledger reads and writes with no user code).

Not available in an async body: ``ctx.batches`` and ``ctx.submit_shards`` (their batch
functions run on threads of their own), which raise
:class:`~ratchet.errors.InvalidArguments`. The context must be used from its task's own
coroutine, one checkpoint at a time: the checkpoints of a task form one ordered code path,
so one awaited from another coroutine while one is pending (``asyncio.gather`` of two
steps) raises :class:`~ratchet.errors.TransactionMisuse`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from ..errors import InvalidArguments, TransactionMisuse
from ..params import register_context_class
from .context import TaskContext
from .protocol import run_async
from .transaction import run_transaction
from .waits import ChildHandle

__all__ = ["AsyncTaskContext"]

T = TypeVar("T")


def _sync_only(what: str) -> NoReturn:
    raise InvalidArguments(
        f"{what} is not available in an async def task (its batch functions run on "
        "threads of their own): make this task a plain def task")


class AsyncTaskContext(TaskContext):
    """The handle an ``async def`` task function receives as its first argument: the
    attributes of :class:`~ratchet.worker.context.TaskContext` (``task_id``, ``name``,
    ``generation``, ``attempt``, ``params``, ``holder``, ``fencing_token``, ``shard``, ...)
    and awaitable checkpoint methods with the same names, arguments, results and errors
    (see the module docstring for how each one runs)."""

    _busy: asyncio.Task[Any] | None = None
    """The asyncio task awaiting one of this context's checkpoints, if any."""

    async def _one(self, run: Coroutine[Any, Any, T]) -> T:
        """Await ``run``, a checkpoint of this context: one at a time (the checkpoints of a
        task form one ordered code path).

        Raises:
            TransactionMisuse: another coroutine of the task (``asyncio.gather``,
                ``create_task``) is awaiting a checkpoint of this context; ``run`` is
                closed, never started.
        """
        task = asyncio.current_task()
        busy = self._busy
        if busy is not None and busy is not task:
            run.close()
            raise TransactionMisuse(
                "the checkpoints of a task (ctx.step, ctx.effect, ctx.emit, ...) are "
                "awaited one at a time, from one coroutine: their order is the task's "
                "code path, which a replay must find again. Await them one after the "
                "other (concurrency belongs inside one step's function)")
        if busy is task:  # nested (inside a step's own function): the boundary says why
            return await run
        self._busy = task
        try:
            return await run
        finally:
            self._busy = None

    async def step(
        self, name: str, fn: Callable[..., Any], *args: Any, durable: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``await`` form of :meth:`TaskContext.step`; ``fn`` may be ``async def``.

        Returns:
            The JSON round-trip of ``fn``'s result (awaited if it is an awaitable).

        Raises:
            The errors of :meth:`TaskContext.step`.
        """
        return await self._one(run_async(
            self._step_call_g(name, fn, args, kwargs, durable)))

    async def effect(
        self,
        name: str,
        call: Callable[..., Any],
        *,
        key: str,
        lookup: Callable[..., Any] | None = None,
        idempotent: bool = False,
        fenced: bool = False,
        params: Any = None,
        in_flight_s: float | None = None,
        downstream: str | None = None,
        compensate: Callable[[str, Any], Any] | None = None,
        compensate_lookup: Callable[[str], Any] | None = None,
    ) -> Any:
        """``await`` form of :meth:`TaskContext.effect`; ``call`` and ``lookup`` may be
        ``async def`` (awaited on the loop). ``compensate`` / ``compensate_lookup`` run
        in compensation mode, which runs in a thread: give plain functions.

        Returns:
            The JSON round-trip of the call's (or the lookup's) result.

        Raises:
            The errors of :meth:`TaskContext.effect`.
        """
        return await self._one(run_async(self._effect_call_g(
            name, call, key, lookup, idempotent, fenced, params, in_flight_s, downstream,
            compensate, compensate_lookup)))

    async def emit(  # type: ignore[override]
        self, topic: str, message: Any, *, key: str | None = None,
        message_id: str | None = None,
    ) -> str:
        """``await`` form of :meth:`TaskContext.emit` (returns once the row is durable).

        Returns:
            The message id.

        Raises:
            The errors of :meth:`TaskContext.emit`.
        """
        return await self._one(run_async(
            self._emit_call_g(topic, message, key, message_id)))

    async def transaction(
        self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any,
    ) -> Any:
        """``await`` form of :meth:`TaskContext.transaction`: ``fn(conn, *args,
        **kwargs)`` is a plain function on the ledger's sync connection; the whole
        transaction step runs in a thread of the loop's executor.

        Raises:
            InvalidArguments: ``fn`` is an ``async def`` function.
            The errors of :meth:`TaskContext.transaction`.
        """
        if asyncio.iscoroutinefunction(fn):
            raise InvalidArguments(
                f"ctx.transaction({name!r}, fn): fn runs inside the ledger's own (sync) "
                "transaction and cannot be async def; give a plain function of the "
                "connection")
        return await self._one(asyncio.to_thread(run_transaction, self, name, fn, args,
                                                  kwargs))

    async def sleep(self, name: str, seconds: float) -> None:  # type: ignore[override]
        """``await`` form of :meth:`TaskContext.sleep` (durable; the task is ``WAITING``
        meanwhile, no coroutine kept)."""
        await self._one(asyncio.to_thread(TaskContext.sleep, self, name, seconds))

    async def sleep_until(  # type: ignore[override]
        self, name: str, when: datetime | float,
    ) -> None:
        """``await`` form of :meth:`TaskContext.sleep_until`."""
        await self._one(asyncio.to_thread(TaskContext.sleep_until, self, name, when))

    async def wait_for_event(
        self, name: str, *, key: str, timeout_s: float | None = None,
    ) -> Any:
        """``await`` form of :meth:`TaskContext.wait_for_event`; returns the payload."""
        return await self._one(asyncio.to_thread(
            lambda: TaskContext.wait_for_event(self, name, key=key, timeout_s=timeout_s)))

    async def submit(  # type: ignore[override]
        self, name: str, params: Mapping[str, Any] | None = None, *, key: str | None = None,
    ) -> ChildHandle:
        """``await`` form of :meth:`TaskContext.submit` (a child task's handle)."""
        return await self._one(asyncio.to_thread(
            lambda: TaskContext.submit(self, name, params, key=key)))

    async def submit_many(  # type: ignore[override]
        self, name: str, params_list: Iterable[Mapping[str, Any]], *,
        keys: Sequence[str] | None = None,
    ) -> list[ChildHandle]:
        """``await`` form of :meth:`TaskContext.submit_many`."""
        items = list(params_list)
        return await self._one(asyncio.to_thread(
            lambda: TaskContext.submit_many(self, name, items, keys=keys)))

    async def gather(  # type: ignore[override]
        self, handles: Sequence[ChildHandle], *, return_exceptions: bool = False,
    ) -> list[Any]:
        """``await`` form of :meth:`TaskContext.gather` (durable: ``WAITING`` until the
        children ended)."""
        return await self._one(asyncio.to_thread(
            lambda: TaskContext.gather(self, handles, return_exceptions=return_exceptions)))

    async def wait(self, handle: ChildHandle) -> Any:
        """``await`` form of :meth:`TaskContext.wait` (one child's result)."""
        return (await self.gather([handle]))[0]

    def batches(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not available in an async body (see the module docstring).

        Raises:
            InvalidArguments: always.
        """
        _sync_only("ctx.batches")

    def submit_shards(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not available in an async body (see the module docstring).

        Raises:
            InvalidArguments: always.
        """
        _sync_only("ctx.submit_shards")


register_context_class(AsyncTaskContext)
