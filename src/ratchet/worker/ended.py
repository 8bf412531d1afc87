"""Attempts ended without their thread: at the task type's time limit (the watchdog of
:mod:`ratchet.worker.timelimit`), or when the shutdown grace ended (their leases handed
back). The thread, which Python cannot kill, is replaced and counted stuck; at
``max_stuck_threads`` the worker stops itself, for a restart (DESIGN §7).

Time limits (DESIGN §7): an attempt of a task type with ``time_limit_s`` that runs longer
is ended by the watchdog thread (:mod:`ratchet.worker.timelimit`) as a failed attempt
(``error_class`` ``"time_limit"``: ``RETRY_WAIT`` with backoff, ``FAILED`` on the last
attempt, ``UNKNOWN`` then if an effect's intent is open), written by this holder at the
attempt's generation. Its lease is no longer trusted (no new effect call can start) nor
renewed, its slot is freed, and its task thread, which Python cannot kill, is replaced by
a fresh one; the stuck thread's next ``ctx.step`` / ``ctx.effect`` raises
:class:`~ratchet.errors.TimeLimitExceeded`, and whatever it writes later is fenced out.
Stuck threads are counted (``stats.stuck_threads``); at ``max_stuck_threads`` the worker
stops itself, for a restart.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import traceback
from types import FrameType

from ..errors import TimeLimitExceeded
from ..errortext import error_message
from ..ledger.base import Transition
from ..retry import TIME_LIMIT
from ..states import State
from .asyncattempt import AsyncAttempts
from .context import Shutdown
from .options import STUCK_CONFIRM_S
from .timelimit import ENDED_BY_SHUTDOWN_GRACE, Attempt

__all__ = ["EndedAttempts"]

log = logging.getLogger("ratchet.worker")


class EndedAttempts(AsyncAttempts):
    """Ends attempts without their threads (see the module docstring)."""

    def _on_time_limit(self, attempt: Attempt) -> None:
        """The watchdog ended ``attempt`` at its time limit (watchdog thread): a failed
        attempt (``error_class`` ``"time_limit"``) written at its own generation, its slot
        freed now although its thread is still in the task's code (DESIGN §7)."""
        claim, ctx = attempt.claim, attempt.ctx
        limit = attempt.time_limit_s or 0.0
        exc = TimeLimitExceeded(claim.task_id, claim.attempt, claim.max_attempts, limit)
        self._give_up(attempt)  # first: from here on the thread can start no effect call
        ctx.exception = exc
        ctx.interrupt(exc)  # its next ctx.step / ctx.effect raises it
        self.stats.add("time_limited")
        # Read after the lease was marked lost: an intent not recorded in the context yet
        # is one whose call cannot start any more (the call needs a confirmed lease).
        open_intents = ctx.open_intents()
        try:
            transition = self._failure_transition(
                self.app.definition(claim.name, claim.version), claim, exc, open_intents,
                error_class=TIME_LIMIT,
                error=error_message(exc), trace=_where(attempt.thread),
            )
            self.on_failure(claim, transition)
        except BaseException:  # e.g. an overridden on_failure: never leak the slot
            log.exception("internal error at the time limit of task %s", claim.task_id)
            self._done(claim, attempt.lease, "abandoned", exc)  # the lease will expire
        else:
            self._write_ended(attempt, transition, "time_limit")
        if self.stats.stuck_threads >= self.max_stuck_threads:
            # Decide once the threads had STUCK_CONFIRM_S to come back (each one back has
            # uncounted itself by then), never at the moment of the time limit.
            confirm = threading.Timer(STUCK_CONFIRM_S, self._stop_if_stuck)
            confirm.daemon = True
            confirm.start()

    def _stop_if_stuck(self) -> None:
        """Stop the worker (for a restart) when ``max_stuck_threads`` threads are still in
        task code past their attempts' ends, :data:`STUCK_CONFIRM_S` after a time limit
        brought the count there."""
        stuck = self.stats.stuck_threads
        if stuck >= self.max_stuck_threads and not self._stopping.is_set():
            log.error("%d task threads are stuck in task code past their attempt's end "
                      "(max_stuck_threads=%d): stopping this worker so that it is restarted",
                      stuck, self.max_stuck_threads)
            self.stop_reason = "stuck_threads"
            self.stop()

    def _hand_back(self, reason: str) -> None:
        """Hand back the lease of every attempt still running (the shutdown grace ended, or
        a second signal came): a fenced release to ``PENDING`` each, so another worker can
        claim the task at once. The attempt is handed back too (not counted), as for a
        release at a step boundary: stopping is the worker's decision, not a failure of the
        task (a hang is what ``time_limit_s`` is for)."""
        running = self._attempts.running()
        if running:
            log.warning("%s: handing back the leases of %d running task(s) still in task "
                        "code", reason, len(running))
        for attempt in running:
            if not self._attempts.take(attempt, ENDED_BY_SHUTDOWN_GRACE):
                continue  # it ended meanwhile
            self._give_up(attempt)
            attempt.ctx.interrupt(Shutdown())
            self.stats.add("handed_back")
            self._write_ended(attempt, Transition(State.PENDING, reason=reason), "hand_back")

    def _taken_from_thread(self, attempt: Attempt) -> None:
        """``attempt`` was just ended without its thread (time limit, shutdown grace), under
        the attempts register's lock (:meth:`Attempts.take`): its task thread is replaced,
        so the worker's concurrency is kept, and counted stuck. Done there, not later by
        the watchdog: a thread that comes back from task code at once (it was in a ledger
        call, or about to start an effect) must find itself detached and counted, else it
        would uncount itself first and then be detached while idle or running the next task
        (stuck threads never reaching ``max_stuck_threads``, a healthy thread dropped).
        An async body holds no thread: its asyncio task is cancelled instead."""
        if attempt.cancel is not None:
            attempt.cancel()
            return
        self._executor.detach(attempt.thread)
        self.stats.add("stuck_threads")

    def _give_up(self, attempt: Attempt) -> None:
        """Stop acting for ``attempt``, taken from its thread (which is detached and counted
        stuck already: :meth:`_taken_from_thread`): its lease is no longer trusted (no new
        effect call can start) nor renewed."""
        attempt.lease.mark_lost()
        self.heartbeat.remove(attempt.lease)


def _current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()`` with the garbage collector held off: up to CPython 3.11 a
    collection that starts inside it (it allocates frame objects while holding the
    runtime's thread-list lock) can free a ``threading.local``, whose deallocation takes
    that lock again, and the process deadlocks (python/cpython#106883)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


def _where(thread: threading.Thread) -> str:
    """Where ``thread`` is now: its innermost frames, for the time-limit error."""
    frame = _current_frames().get(thread.ident or -1)
    if frame is None:
        return "(its thread has just ended)\n"
    stack = "".join(traceback.format_stack(frame, limit=8))
    return f"the task thread ({thread.name}) is at (innermost last):\n{stack}"[-1500:]

