"""The task executor: long-lived threads pulling claimed tasks from one local queue.

A ``ThreadPoolExecutor.submit`` per task wakes one thread per task (a condition variable,
a context switch and a GIL hand-off each time). Here a thread that finishes a task takes
the next queued one without sleeping, so short tasks run back to back on one or two
threads, and more threads are woken only when the queued work is not being picked up:

* :meth:`Executor.push` wakes a thread only when none is awake to take the work;
* a thread about to block on something Ratchet knows about (a durable ledger write, an
  effect's call) calls :meth:`Executor.blocking`, which wakes a spare thread if tasks wait;
* :meth:`Executor.check_stalled` (called by the worker's main loop every few
  milliseconds while tasks wait) wakes another thread when the queue has made no progress
  for ``stall_s``: the awake threads are stuck in long task code.

At most ``size`` threads exist, so at most ``size`` task bodies run at once. A thread
whose task the worker gave up on (past its time limit, or at the end of the shutdown grace:
Python cannot kill a thread) is *detached* (:meth:`Executor.detach`): it no longer counts
toward ``size``, so another thread takes its place, and it ends once its task returns.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["Executor"]

log = logging.getLogger("ratchet.worker")

T = TypeVar("T")


class Executor(Generic[T]):
    """Runs ``run(item)`` for every pushed item on at most ``size`` threads.

    Args:
        size: most threads (and so most task bodies running at once).
        run: called once per item in an executor thread; must not raise.
        name: thread name prefix.
    """

    def __init__(self, size: int, run: Callable[[T], None], name: str = "ratchet-task") -> None:
        self._size = size
        self._run = run
        self._name = name
        self._queue: collections.deque[T] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []
        self._detached: set[threading.Thread] = set()  # given up on; end after their item
        self._idle = 0  # threads waiting on the condition
        self._awake = 0  # threads running or about to take work
        self._shutdown = False
        self._progress = time.monotonic()  # last time a queued item was taken

    # ------------------------------------------------------------------ producer side

    def push(self, items: Iterable[T]) -> None:
        """Queue ``items``; wake a thread only if none is awake to take them."""
        with self._cond:
            was_empty = not self._queue
            self._queue.extend(items)
            if not self._queue:
                return
            if was_empty:
                self._progress = time.monotonic()
            if self._awake == 0:
                self._wake_one()

    def blocking(self) -> None:
        """The calling executor thread is about to block: wake a spare thread if work waits."""
        if self._queue:
            with self._cond:
                if self._queue and self._awake - 1 < len(self._queue):
                    self._wake_one()

    def check_stalled(self, stall_s: float) -> bool:
        """Wake one more thread if queued work made no progress for ``stall_s`` seconds.

        Returns:
            True while items are queued (the caller should check again soon).
        """
        if not self._queue:
            return False
        with self._cond:
            if self._queue and time.monotonic() - self._progress >= stall_s:
                self._progress = time.monotonic()
                self._wake_one()
            return bool(self._queue)

    def _wake_one(self) -> None:
        """With the condition held: wake an idle thread, or start a new one if allowed."""
        if self._idle > 0:
            self._idle -= 1
            self._awake += 1
            self._cond.notify()
        elif len(self._threads) < self._size:
            self._awake += 1
            thread = threading.Thread(
                target=self._loop, name=f"{self._name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    # ------------------------------------------------------------------ threads

    def _loop(self) -> None:
        cond = self._cond
        queue = self._queue
        while True:
            with cond:
                while not queue:
                    if self._shutdown:  # counts no longer matter once shutting down
                        return
                    # _wake_one moves a thread from idle back to awake before notifying.
                    self._awake -= 1
                    self._idle += 1
                    cond.wait()
                item = queue.popleft()
                self._progress = time.monotonic()
            try:
                self._run(item)
            except BaseException:  # run() must not raise; never lose the thread silently
                log.exception("task executor: unexpected error")
            if self._detached:
                with cond:
                    me = threading.current_thread()
                    if me in self._detached:  # replaced while stuck: end, take no more work
                        self._detached.discard(me)
                        return

    def detach(self, thread: threading.Thread) -> bool:
        """Stop counting ``thread`` (an executor thread stuck in the item it runs) toward
        ``size``: another thread may start in its place, and ``thread`` ends once its item
        returns, without taking another. Returns False if ``thread`` is not one of ours."""
        with self._cond:
            if thread not in self._threads:
                return False
            self._threads.remove(thread)
            self._detached.add(thread)
            self._awake -= 1  # it was running its item
            if self._queue and self._awake < len(self._queue):
                self._wake_one()
            return True

    def detached(self) -> int:
        """Detached threads still running their item."""
        with self._cond:
            return len(self._detached)

    def take_queued(self) -> list[T]:
        """Remove and return every item not yet taken by a thread (in queue order)."""
        with self._cond:
            items = list(self._queue)
            self._queue.clear()
            return items

    def shutdown(self) -> None:
        """Run what is queued, then end every thread and wait for them (detached threads
        excepted: see :meth:`join`)."""
        self.close()
        self.join()

    def close(self) -> None:
        """Run what is queued, then let every thread end (without waiting for them)."""
        with self._cond:
            if self._queue and self._awake == 0:
                self._wake_one()
            self._shutdown = True
            self._cond.notify_all()

    def join(self, timeout_s: float | None = None) -> bool:
        """After :meth:`close`: wait for every thread that is not detached, at most
        ``timeout_s`` seconds in all (None: no limit). Returns True when they all ended."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._cond:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return True
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            alive[0].join(remaining)
