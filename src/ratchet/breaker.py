"""Circuit breakers toward downstreams (DESIGN §7, "overload").

An overloaded downstream (HTTP 429 / 503, :class:`~ratchet.errors.OverloadError`, an
exhausted connection pool) must be given less work, not more retries. A
:class:`CircuitBreaker` on a downstream (``app.downstream(name, breaker=...)``; effects
declare ``ctx.effect(..., downstream=name)``) does that with three states:

* **closed** — calls go through; ``failure_threshold`` overloads in a row open it;
* **open** — for ``open_s`` seconds no call is sent: an effect toward the downstream
  raises :class:`~ratchet.errors.CircuitOpen` *before* recording its intent, and the worker
  hands the attempt back (the task goes ``PENDING`` until the breaker may probe; no attempt
  and no retry is spent);
* **half-open** — after ``open_s``, at most ``half_open_probes`` calls at a time go
  through; ``half_open_probes`` successes close the breaker, an overload opens it again
  (for ``open_s`` again).

So concurrency toward the downstream drops to zero, then to the probes, then back.

The state is per worker process (per :class:`~ratchet.App` object), not cluster-wide: each
worker learns the downstream's overload from its own calls, so N workers send up to N
probes. A call that fails otherwise (a transient error, an unknown outcome) neither opens
nor closes the breaker; a call that succeeds resets the count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import httpx

from .errors import CircuitOpen, ConfigError, OverloadError
from .validation import check_finite, check_int

__all__ = ["BreakerState", "CircuitBreaker", "DownstreamBreaker", "is_overload"]


class BreakerState(StrEnum):
    """The three states of a circuit breaker."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class CircuitBreaker:
    """Settings of a downstream's circuit breaker (module docstring).

    Attributes:
        failure_threshold: overloads in a row that open the breaker, >= 1.
        open_s: how long it stays open before probing, seconds (> 0, at most 3600).
        half_open_probes: calls at a time while half-open, and successes that close it,
            >= 1.

    Raises:
        ConfigError: a field out of range or of the wrong type.
    """

    failure_threshold: int = 5
    open_s: float = 5.0
    half_open_probes: int = 1

    def __post_init__(self) -> None:
        for label in ("failure_threshold", "half_open_probes"):
            value = getattr(self, label)
            check_int(value, f"CircuitBreaker.{label}", minimum=1, maximum=10_000,
                      error=ConfigError)
        check_finite(self.open_s, "CircuitBreaker.open_s (seconds)", minimum=0.0,
                     above_minimum=True, maximum=3600, error=ConfigError)


def is_overload(exc: BaseException) -> bool:
    """True for what says "slow down": :class:`OverloadError`, HTTP 429 / 503, and an
    exhausted client connection pool (``httpx.PoolTimeout``)."""
    if isinstance(exc, OverloadError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in (429, 503)
    return isinstance(exc, httpx.PoolTimeout)


class DownstreamBreaker:
    """The breaker state of one downstream in this process. Thread-safe.

    Args:
        name: the downstream.
        settings: its :class:`CircuitBreaker`.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, name: str, settings: CircuitBreaker,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._state = BreakerState.CLOSED
        self._failures = 0  # overloads in a row (closed)
        self._opened_at = 0.0
        self._probing = 0  # calls in flight while half-open
        self._successes = 0  # probe successes while half-open
        self.opened = 0
        """How many times the breaker opened (for tests and metrics)."""

    @property
    def probing(self) -> int:
        """Half-open probes in flight now (0 unless half-open)."""
        with self._lock:
            return self._probing if self._state is BreakerState.HALF_OPEN else 0

    @property
    def state(self) -> BreakerState:
        """The current state (open turns half-open once ``open_s`` has passed)."""
        with self._lock:
            self._advance()
            return self._state

    def _advance(self) -> None:
        if (self._state is BreakerState.OPEN
                and self._clock() - self._opened_at >= self.settings.open_s):
            self._state = BreakerState.HALF_OPEN
            self._probing = 0
            self._successes = 0

    def acquire(self) -> bool:
        """Ask to send one call. Returns whether it is a half-open probe (pass it to
        :meth:`release`).

        Raises:
            CircuitOpen: the breaker is open, or half-open with every probe in flight;
                ``retry_after_s`` says when to ask again.
        """
        with self._lock:
            self._advance()
            if self._state is BreakerState.CLOSED:
                return False
            if self._state is BreakerState.HALF_OPEN \
                    and self._probing < self.settings.half_open_probes:
                self._probing += 1
                return True
            if self._state is BreakerState.OPEN:
                wait = self.settings.open_s - (self._clock() - self._opened_at)
            else:
                wait = min(1.0, self.settings.open_s)  # probes in flight: ask again soon
            raise CircuitOpen(self.name, max(0.05, wait))

    def cancel(self, probe: bool) -> None:
        """The call :meth:`acquire` allowed was not sent after all: free its probe slot."""
        with self._lock:
            if probe and self._state is BreakerState.HALF_OPEN:
                self._probing = max(0, self._probing - 1)

    def release(self, probe: bool, error: BaseException | None) -> None:
        """The call :meth:`acquire` allowed ended, with ``error`` (None: it succeeded)."""
        overload = error is not None and is_overload(error)
        with self._lock:
            if probe and self._state is BreakerState.HALF_OPEN:
                self._probing = max(0, self._probing - 1)
            if overload:
                if self._state is BreakerState.HALF_OPEN:
                    self._open()
                elif self._state is BreakerState.CLOSED:
                    self._failures += 1
                    if self._failures >= self.settings.failure_threshold:
                        self._open()
                return
            if error is not None:
                return  # not about load: neither opens nor closes
            if self._state is BreakerState.HALF_OPEN:
                self._successes += 1
                if self._successes >= self.settings.half_open_probes:
                    self._state = BreakerState.CLOSED
                    self._failures = 0
            elif self._state is BreakerState.CLOSED:
                self._failures = 0

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()
        self._failures = 0
        self._probing = 0
        self._successes = 0
        self.opened += 1
