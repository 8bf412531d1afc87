"""The attempts a worker is running, and the watchdog that ends them at their time limit
(DESIGN §7, time limits; §4 for the lease side).

Every attempt a task thread starts is registered here (:meth:`Attempts.begin`) and ends
exactly once, by whoever gets there first (:meth:`Attempts.end`):

* the task thread, when the body returned or raised (the normal case: it then writes the
  attempt's final transition);
* the watchdog thread, when the attempt's task type has a ``time_limit_s`` and the body
  has run that long (``"time_limit"``);
* the worker's shutdown, when the grace period ended with the body still running
  (``"shutdown_grace"``: its lease is handed back).

The loser of that race does nothing for the attempt (its lease, its slot, its outcome are
the winner's), so an attempt is never reported twice and its slot is freed once. When the
task thread loses, it is *stuck*: Python cannot kill a thread, so it stays inside the
task's code until that returns. What it writes then is fenced out by the ledger (the
attempt's generation is no longer the running one), and the worker counts it in
``WorkerStats.stuck_threads`` until it ends.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..ledger.base import Claim
from .heartbeat import LeaseHandle

__all__ = ["Attempt", "Attempts"]

log = logging.getLogger("ratchet.worker")

ENDED_BY_BODY = "body"
ENDED_BY_TIME_LIMIT = "time_limit"
ENDED_BY_SHUTDOWN_GRACE = "shutdown_grace"


class Attempt:
    """One attempt a task thread runs.

    Attributes:
        claim: the claim it runs under.
        lease: its lease.
        ctx: its task context (``TaskContext``).
        thread: the task thread running it.
        started: monotonic instant it began, seconds.
        time_limit_s: its task type's limit, seconds (None: no limit).
        deadline: ``started + time_limit_s`` (monotonic seconds), or None.
        ended_by: None while running, then who ended it (``"body"``, ``"time_limit"``,
            ``"shutdown_grace"``).
    """

    __slots__ = ("cancel", "claim", "ctx", "deadline", "end_sent", "ended_by", "lease",
                 "started", "thread", "time_limit_s")

    def __init__(
        self, claim: Claim, lease: LeaseHandle, ctx: Any, time_limit_s: float | None
    ) -> None:
        self.claim = claim
        self.lease = lease
        self.ctx = ctx
        self.thread = threading.current_thread()
        self.started = time.monotonic()
        self.time_limit_s = time_limit_s
        self.deadline = None if time_limit_s is None else self.started + time_limit_s
        self.ended_by: str | None = None
        self.cancel: Callable[[], None] | None = None
        """For an ``async def`` body (on the worker's event loop, not a task thread of its
        own): cancels its asyncio task (any thread); None for a sync body."""
        self.end_sent: threading.Event | None = None
        """For an attempt ended without its thread: set once its ending write was handed
        to the writer (anything its thread writes later is queued behind it)."""


class Attempts(threading.Thread):
    """The running attempts of one worker, and the watchdog thread of their time limits.

    Args:
        on_time_limit: called in the watchdog thread with an attempt it ended at its time
            limit (the attempt is already ended: its lease, slot and outcome are the
            callee's). Must not raise (it is logged if it does).
        on_taken: called with every attempt ended without its thread (:meth:`take`),
            while the register's lock is held: the thread's own end (:meth:`end`,
            :meth:`came_back`) waits for it, so what it does (detach the thread from the
            executor, count it stuck) happens before that thread can come back. Must be
            quick and must not call back into this register.
    """

    def __init__(
        self, on_time_limit: Callable[[Attempt], None],
        on_taken: Callable[[Attempt], None] | None = None,
    ) -> None:
        super().__init__(name="ratchet-time-limits", daemon=True)
        self._on_time_limit = on_time_limit
        self._on_taken = on_taken
        self._cond = threading.Condition(threading.Lock())
        self._running: dict[tuple[str, int], Attempt] = {}
        self._stuck: dict[tuple[str, int], Attempt] = {}  # ended without their thread
        self._deadlines: list[tuple[float, int, Attempt]] = []  # heap
        self._seq = itertools.count()
        self._halt = False

    def begin(
        self, claim: Claim, lease: LeaseHandle, ctx: Any, time_limit_s: float | None
    ) -> Attempt:
        """Register the attempt the calling (task) thread is starting; its time limit, if
        any, runs from now."""
        attempt = Attempt(claim, lease, ctx, time_limit_s)
        with self._cond:
            self._running[(claim.task_id, claim.generation)] = attempt
            if attempt.deadline is not None:
                first = not self._deadlines or attempt.deadline < self._deadlines[0][0]
                heapq.heappush(self._deadlines, (attempt.deadline, next(self._seq), attempt))
                if first:
                    self._cond.notify()
        return attempt

    def end(self, claim: Claim) -> bool:
        """The task thread's end of the attempt of ``claim`` (its body returned or raised).
        True if it was still running: the caller owns its end (final write, lease, slot).
        False if the watchdog or the shutdown ended it first: the caller is stuck past
        that end and must leave the attempt alone."""
        with self._cond:
            running = self._running
            attempt = running.pop((claim.task_id, claim.generation), None)
            if attempt is None:
                return False
            attempt.ended_by = ENDED_BY_BODY
            heap = self._deadlines
            if len(heap) > 2 * len(running) + 64:
                # Ended attempts stay in the heap until their deadline (lazy deletion);
                # drop them now and then, so it holds at most about twice the running ones
                # (amortised O(1) per attempt) instead of every attempt of a time limit.
                self._deadlines = [e for e in heap if e[2].ended_by is None]
                heapq.heapify(self._deadlines)
            return True

    def is_running(self, claim: Claim) -> bool:
        """True while the attempt of ``claim`` has not been ended by anyone."""
        return (claim.task_id, claim.generation) in self._running  # one dict read: atomic

    def take(self, attempt: Attempt, by: str) -> bool:
        """End ``attempt`` on behalf of ``by`` (watchdog, shutdown) if it is still running;
        True if this call ended it."""
        with self._cond:
            key = (attempt.claim.task_id, attempt.claim.generation)
            if self._running.get(key) is not attempt:
                return False
            del self._running[key]
            attempt.ended_by = by
            attempt.end_sent = threading.Event()
            self._stuck[key] = attempt
            if self._on_taken is not None:
                self._on_taken(attempt)
            return True

    def came_back(self, claim: Claim) -> Attempt | None:
        """The task thread of ``claim``'s attempt, ended without it by :meth:`take`, came
        back from task code: forget it and return it (None if it was not ended so)."""
        with self._cond:
            return self._stuck.pop((claim.task_id, claim.generation), None)

    def running(self) -> list[Attempt]:
        """The attempts still running, oldest first."""
        with self._cond:
            return sorted(self._running.values(), key=lambda a: a.started)

    def stop(self) -> None:
        """End the watchdog thread (time limits are no longer enforced after this)."""
        with self._cond:
            self._halt = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            expired: list[Attempt] = []
            with self._cond:
                while not self._halt:
                    heap = self._deadlines
                    # Drop attempts that ended before their deadline.
                    while heap and heap[0][2].ended_by is not None:
                        heapq.heappop(heap)
                    now = time.monotonic()
                    if heap and heap[0][0] <= now:
                        break
                    self._cond.wait(None if not heap else heap[0][0] - now)
                if self._halt:
                    return
                now = time.monotonic()
                while self._deadlines and self._deadlines[0][0] <= now:
                    attempt = heapq.heappop(self._deadlines)[2]
                    if attempt.ended_by is None:
                        expired.append(attempt)
            for attempt in expired:
                if self.take(attempt, ENDED_BY_TIME_LIMIT):
                    try:
                        self._on_time_limit(attempt)
                    except Exception:  # the watchdog must outlive one bad attempt
                        log.exception(
                            "time limit of task %s: internal error", attempt.claim.task_id)
