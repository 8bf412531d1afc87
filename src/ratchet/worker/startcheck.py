"""The pause check before a claimed task's body starts (DESIGN §8, pause / resume).

A claim transaction reads the active pauses, so a task claimed after a pause returned is
never claimed. A task claimed *before* it may wait, leased, in the worker's local queue
(prefetch) and start later; the heartbeat learns of a pause only at its next read of the
operator requests (every 0.5 s; a PostgreSQL NOTIFY brings it forward by ~50 ms). So before
a body starts, :meth:`StartCheck.ensure` requires a read of the operator requests and pauses
that covers the task's lease and began at most :data:`START_CHECK_S` ago: the claim's own
(for a task started at once), the heartbeat's periodic one, or a read made now
(:meth:`Heartbeat.check_control`: one ledger read, shared by every thread starting a task
while it runs). A pause that returned more than :data:`START_CHECK_S` before a start was
committed before that read began, so the read saw it and the task is not started
(``PAUSED``, attempt handed back); a cancel likewise. Only a read slower than the window
lets a start come later than that, by at most that read's own duration.
"""

from __future__ import annotations

import threading
import time

from ..errors import LedgerUnavailable
from .heartbeat import Heartbeat, LeaseHandle

__all__ = ["START_CHECK_S", "StartCheck"]

START_CHECK_S = 0.01
"""How old (seconds) the read of the operator requests covering a task may be when its body
starts. Why 10 ms: a worker making this read for every start would add a ledger round trip
to every body (prefetch exists to hide the completion's commit behind the next body);
shared over a 10 ms window it costs at most about 100 small reads a second per busy worker,
and a task claimed and started within it needs none."""


class StartCheck:
    """Makes task starts wait for a fresh enough read of the operator requests.

    Args:
        heartbeat: the worker's heartbeat (its :meth:`~Heartbeat.check_control` is the
            read, made on the calling thread).
        window_s: :data:`START_CHECK_S`.
    """

    def __init__(self, heartbeat: Heartbeat, window_s: float = START_CHECK_S) -> None:
        self._heartbeat = heartbeat
        self._window_s = window_s
        self._cond = threading.Condition(threading.Lock())
        self._reading = False
        self.reads = 0
        """Reads made for a start (the claim's and the heartbeat's not counted)."""

    def fresh(self, lease: LeaseHandle) -> bool:
        """True when :meth:`ensure` would return at once for ``lease`` (a read covering it
        began at most the window ago): no ledger read, no wait."""
        return lease.checked_at >= time.monotonic() - self._window_s

    def ensure(self, lease: LeaseHandle) -> None:
        """Return once a read of the operator requests that began at most ``window_s``
        before the call covers ``lease`` (its :attr:`~LeaseHandle.request` is then up to
        date). At most one such read runs at a time; threads that ask meanwhile wait for
        it, and read again only if it began too early for them.

        Raises:
            LedgerUnavailable: the read failed (the task is not started; the runner hands
                the attempt back).
        """
        oldest = time.monotonic() - self._window_s
        if lease.checked_at >= oldest:
            return
        with self._cond:
            while self._reading:
                self._cond.wait(1.0)
                if lease.checked_at >= oldest:
                    return
            if lease.checked_at >= oldest:
                return
            self._reading = True
        try:
            self.reads += 1
            self._heartbeat.check_control(raise_errors=True)
        except LedgerUnavailable:
            raise
        except Exception as exc:
            raise LedgerUnavailable(
                f"cannot read the operator requests before starting task {lease.task_id}: "
                f"{exc}") from exc
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()
