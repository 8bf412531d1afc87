"""The worker's event loop for ``async def`` task bodies (DESIGN §5, async bodies).

One :class:`AsyncRunner` per worker process, started only when the worker serves an
``async def`` task type: an asyncio event loop on a thread of its own, beside the thread
pool of sync bodies (:mod:`ratchet.worker.executor`). Claimed attempts of async task
types are pushed to it (:meth:`AsyncRunner.push`); each becomes an asyncio task, and at
most ``size`` of them run at once (``Worker(async_concurrency=)``, ``ratchet worker
--async-concurrency``); the others wait for a slot in arrival order. Blocking work of
Ratchet's machinery that an attempt needs (start checks, the final outcome, ledger reads)
runs in the loop's default executor, a small thread pool of :data:`IO_THREADS` threads;
durable commits are awaited through the ledger writer's callbacks, holding no thread.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Generic, TypeVar

__all__ = ["IO_THREADS", "AsyncRunner"]

log = logging.getLogger("ratchet.worker")

T = TypeVar("T")

IO_THREADS: Final = 8
"""Threads of the event loop's default executor: they run the blocking parts of async
attempts (start checks, the final outcome, ledger reads, transaction steps, durable
waits), each for a short while."""

_STOP_WAIT_S: Final = 2.0
"""At stop, how long the tasks still on the loop (cancelled) get to unwind, seconds."""


class AsyncRunner(Generic[T]):
    """An event loop on its own thread running ``run(item)`` for each pushed item, at
    most ``size`` at once.

    Args:
        size: most items running at once (>= 1).
        run: the coroutine function run for each item; it must not raise (what it
            raises is logged).
        name: the loop thread's name.
    """

    def __init__(self, size: int, run: Callable[[T], Awaitable[None]],
                 name: str = "ratchet-async") -> None:
        self.size = size
        self._run = run
        self._loop = asyncio.new_event_loop()
        self._loop.set_default_executor(ThreadPoolExecutor(
            max_workers=IO_THREADS, thread_name_prefix=f"{name}-io"))
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # pushed and not finished (waiting for a slot or running)
        self._running = 0  # holding a slot (loop thread only)
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False  # loop thread only: no slot is waited for any more
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop."""
        return self._loop

    @property
    def pending(self) -> int:
        """Items pushed and not finished yet."""
        return self._pending

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            try:
                self._loop.run_until_complete(self._loop.shutdown_default_executor())
            except Exception:  # pragma: no cover - best effort at exit
                log.exception("async runner: stopping its executor")
            self._loop.close()

    def push(self, items: Iterable[T]) -> None:
        """Queue ``items`` (any thread); each runs once a slot is free."""
        batch = list(items)
        if not batch:
            return
        with self._lock:
            self._pending += len(batch)
        self._loop.call_soon_threadsafe(self._spawn, batch)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread soon (any thread; nothing if the loop is
        closed)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _spawn(self, batch: list[T]) -> None:
        for item in batch:
            task = self._loop.create_task(self._one(item))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _one(self, item: T) -> None:
        slot = False
        try:
            while self._running >= self.size and not self._closing:
                waiter: asyncio.Future[None] = self._loop.create_future()
                self._waiters.append(waiter)
                await waiter
            self._running += 1
            slot = True
            await self._run(item)
        except asyncio.CancelledError:  # stop() cancels what is left: its attempt was ended
            log.debug("async runner: an attempt's task was cancelled at stop")
        except BaseException:  # run must not raise: never leak the slot
            log.exception("async runner: internal error")
        finally:
            if slot:
                self._running -= 1
                while self._waiters:
                    waiter = self._waiters.popleft()
                    if not waiter.done():
                        waiter.set_result(None)
                        break
            with self._idle:
                self._pending -= 1
                if self._pending == 0:
                    self._idle.notify_all()

    def close(self) -> None:
        """Stop waiting for slots (any thread): items still waiting run at once (a
        stopping worker releases them without running their bodies)."""
        def wake_all() -> None:
            self._closing = True
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
        self.call_soon(wake_all)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait until every pushed item finished (at most ``timeout_s`` seconds); True if
        they all did."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def stop(self) -> None:
        """Cancel what still runs on the loop (given :data:`_STOP_WAIT_S` to unwind),
        then stop the loop and its thread (any thread but the loop's)."""
        if not self._thread.is_alive():
            return

        async def cancel_all() -> None:
            tasks = [t for t in self._tasks if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=_STOP_WAIT_S)
            self._loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self._loop)
        except RuntimeError:
            return
        self._thread.join(timeout=_STOP_WAIT_S + 5.0)
