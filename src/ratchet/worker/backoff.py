"""Backoff and log throttling for an operation that keeps failing (the writer's claims
while the ledger is unavailable: a full disk, a database restart).

A worker polls for work every ``poll_interval_s`` (50 ms by default); retried at that pace a
failing claim would log twenty lines a second and hold SQLite's write lock as often.
:class:`RepeatedFailure` spaces the tries out exponentially and logs the first failure at
once, then one summary line with a count per :data:`SUMMARY_EVERY_S`, then one line when
the operation succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["BACKOFF_BASE_S", "BACKOFF_MAX_S", "SUMMARY_EVERY_S", "RepeatedFailure"]

BACKOFF_BASE_S = 0.1
"""Wait after the first failure, seconds; doubled after each further one."""

BACKOFF_MAX_S = 5.0
"""Longest wait between tries, seconds: once the cause is gone, work resumes within this."""

SUMMARY_EVERY_S = 10.0
"""Seconds between the summary lines of a failure that goes on."""


class RepeatedFailure:
    """The state of one operation that may fail many times in a row (thread-safe).

    Args:
        what: the operation, for messages (``"claim"``).
        logger: where the lines go (the first failure and the summaries at ``level``, the
            recovery at WARNING).
        level: the logging level of the failure lines (default ERROR).
        base_s: the first wait, seconds (:data:`BACKOFF_BASE_S`).
        max_s: the longest wait, seconds (:data:`BACKOFF_MAX_S`).
        summary_every_s: seconds between summary lines (:data:`SUMMARY_EVERY_S`).
        clock: monotonic clock, seconds.
    """

    def __init__(
        self, what: str, logger: logging.Logger, *, level: int = logging.ERROR,
        base_s: float = BACKOFF_BASE_S,
        max_s: float = BACKOFF_MAX_S, summary_every_s: float = SUMMARY_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._log = logger
        self._level = level
        self._base_s = base_s
        self._max_s = max_s
        self._summary_every_s = summary_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0  # in a row
        self._unlogged = 0  # since the last line
        self._first_at = 0.0
        self._logged_at = 0.0
        self._retry_at = float("-inf")

    @property
    def failures(self) -> int:
        """Failures in a row so far (0: the last try succeeded, or none was made)."""
        return self._failures

    def ready(self) -> bool:
        """True when the operation may be tried now (its backoff has passed)."""
        return self._clock() >= self._retry_at

    def failed(self, error: BaseException) -> float:
        """Count a failure; log it if it is the first or a summary is due.

        Returns:
            Seconds until :meth:`ready` is true again.
        """
        with self._lock:
            now = self._clock()
            self._failures += 1
            delay = min(self._max_s, self._base_s * 2.0 ** min(self._failures - 1, 60))
            self._retry_at = now + delay
            if self._failures == 1:
                self._first_at = self._logged_at = now
                self._unlogged = 0
                self._log.log(self._level, "%s failed: %s (repeats are summarised every %g s)",
                              self._what, error, self._summary_every_s)
            elif now - self._logged_at >= self._summary_every_s:
                self._log.log(self._level, "%s failed %d more times in %.0f s (%d in a row, "
                              "for %.0f s; next try in %.1f s): %s", self._what,
                              self._unlogged + 1, now - self._logged_at, self._failures,
                              now - self._first_at, delay, error)
                self._logged_at = now
                self._unlogged = 0
            else:
                self._unlogged += 1
            return delay

    def succeeded(self) -> None:
        """The operation worked: end the backoff; log the recovery if it had failed."""
        if not self._failures:  # the common case: no lock
            return
        with self._lock:
            if self._failures:
                self._log.warning("%s works again after %d failures in a row over %.1f s",
                                  self._what, self._failures, self._clock() - self._first_at)
            self._failures = 0
            self._retry_at = float("-inf")
