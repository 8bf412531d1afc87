"""Retry governance (DESIGN §7): failure classes, exponential backoff with cap and jitter.

Every exception a task raises is put in one of four classes by :func:`classify`:

* ``TRANSIENT``  — retry after backoff while attempts remain, then ``FAILED`` (dead-letter);
* ``PERMANENT``  — ``FAILED`` at once;
* ``UNKNOWN_OUTCOME`` — the call may have happened: look the key up before anything else;
* ``OVERLOAD``   — the downstream asked us to slow down: retry, but with a longer floor
  (``retry_after_s`` when the downstream gave one) so retries do not pile on.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

import httpx

from .errors import (
    ConfigError,
    IllegalTransition,
    InvalidArguments,
    OutcomeUnknownError,
    OverloadError,
    PermanentError,
    SubmitError,
    TaskFailure,
    TransientError,
    UndecodableData,
)
from .validation import check_finite, check_int

__all__ = [
    "downstream_unreachable",
    "DEFAULT_QUARANTINE_AFTER",
    "MAX_ATTEMPTS_LIMIT",
    "FailureClass",
    "RetryBudget",
    "TIME_LIMIT",
    "RetryPolicy",
    "classify",
    "proves_not_executed",
    "retry_after_s",
]

MAX_ATTEMPTS_LIMIT = 1_000_000
"""Largest ``RetryPolicy.max_attempts``: the ledger stores attempts as a 32-bit integer on
PostgreSQL, and a task retried a million times is a configuration mistake."""

DEFAULT_QUARANTINE_AFTER = 3
"""Default ``RetryPolicy.quarantine_after``: three identical failures in a row (or three
deliveries whose worker died) quarantine a task (DESIGN §7)."""


TIME_LIMIT = "time_limit"
"""``error_class`` recorded for an attempt the worker ended at its task type's time limit
(:class:`~ratchet.errors.TimeLimitExceeded`). Its failure class is ``TRANSIENT``: backoff
and retry while attempts remain, then ``FAILED`` (``UNKNOWN`` with an open effect intent),
like any transient failure; the error class tells it apart in ``ratchet inspect`` /
``ratchet tasks``."""


class FailureClass(StrEnum):
    """The four failure classes of DESIGN §7."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN_OUTCOME = "unknown_outcome"
    OVERLOAD = "overload"


MAX_BUDGET_WINDOW_S = 300.0
"""Longest ``RetryBudget.window_s``, seconds (the window is counted in 1 s buckets)."""


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """A cluster-wide cap on retries over a sliding window (DESIGN §7; Finagle's and
    gRPC's retry budgets): in any ``window_s`` seconds, retries may start at most
    ``min_per_s * window_s + ratio * calls`` times (at least once), where ``calls`` are the
    calls counted over the last ``window_s`` seconds when the retry is scheduled. A retry
    over budget is not dropped: it waits (``RETRY_WAIT`` with the reason, a later
    ``run_at``) for the first second where the window has room, and holds its place there.

    A budget of a task type (``RetryPolicy(budget=...)``) counts each attempt of the type
    as a call and each of its retries against it; a budget of a downstream
    (``app.downstream(name, budget=...)``, effects declaring ``downstream=name``) counts
    each request an effect sent to it as a call, and the retry of a task whose attempt
    failed in such an effect. The counts live in the ledger (``budget_counts``: 1 s buckets
    per budget and worker), so the cap holds across every worker.

    Attributes:
        ratio: share of the calls retries may add, in ``[0, 1]`` (0.1: 10 %).
        min_per_s: retries per second allowed whatever the traffic, >= 0 (so a quiet
            service can still retry).
        window_s: the sliding window, seconds, from 1 to 300.

    Raises:
        ConfigError: a field out of range or not a finite number.
    """

    ratio: float = 0.1
    min_per_s: float = 1.0
    window_s: float = 10.0

    def __post_init__(self) -> None:
        for label in ("ratio", "min_per_s", "window_s"):
            value = getattr(self, label)
            try:
                check_finite(value, f"RetryBudget.{label}")
            except InvalidArguments:
                raise ConfigError(
                    f"RetryBudget.{label} must be a finite number, got {value!r}") from None
        if not 0.0 <= self.ratio <= 1.0:
            raise ConfigError(f"RetryBudget.ratio must be within [0, 1], got {self.ratio!r}")
        if self.min_per_s < 0:
            raise ConfigError(f"RetryBudget.min_per_s must be >= 0, got {self.min_per_s!r}")
        if not 1.0 <= self.window_s <= MAX_BUDGET_WINDOW_S:
            raise ConfigError(
                f"RetryBudget.window_s must be from 1 to {MAX_BUDGET_WINDOW_S:g} seconds, got "
                f"{self.window_s!r}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task type retries.

    Attributes:
        max_attempts: total executions allowed (first run included); ``>= 1``. When a
            transient or overload failure happens on the last attempt the task is ``FAILED``.
        base_delay_s: backoff before the second attempt, in seconds.
        max_delay_s: cap of the exponential backoff, in seconds.
        multiplier: growth factor per attempt.
        jitter: fraction of the delay drawn at random, in ``[0, 1]``; 1.0 is "full jitter"
            (delay uniform in ``[0, d]``), 0 is no jitter.
        overload_min_delay_s: floor of the delay after an overload failure, in seconds.
        quarantine_after: quarantine the task (``FAILED`` with the quarantine flag, never
            redelivered automatically; ``ratchet quarantine replay``) after this many
            failures in a row with the same error fingerprint (:mod:`ratchet.fingerprint`;
            transient and permanent failures count, overload and unknown outcomes do not),
            or after this many deliveries whose worker died holding the task (lease
            expiry, revocation). ``None`` turns quarantine off. Counted in the ledger, per
            task, from its submit or its last replay (DESIGN §7).
        budget: a :class:`RetryBudget` of this task type (None: no cap), cluster-wide.

    Raises:
        ConfigError: a field is out of range or of the wrong type (checked at definition, so
            a bad policy never reaches a submit): ``max_attempts`` must be an ``int`` >= 1
            (not a bool, not a float such as 1.5 or NaN); delays finite numbers >= 0
            seconds; ``multiplier`` finite and >= 1; ``jitter`` within ``[0, 1]``;
            ``quarantine_after`` ``None`` or an ``int`` from 1 to ``MAX_ATTEMPTS_LIMIT``;
            ``budget`` None or a :class:`RetryBudget`.
    """

    max_attempts: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = 300.0
    multiplier: float = 2.0
    jitter: float = 0.5
    overload_min_delay_s: float = 5.0
    quarantine_after: int | None = DEFAULT_QUARANTINE_AFTER
    budget: RetryBudget | None = None

    def __post_init__(self) -> None:
        if self.budget is not None and not isinstance(self.budget, RetryBudget):
            raise ConfigError(
                f"RetryPolicy.budget must be a ratchet.RetryBudget or None, got "
                f"{type(self.budget).__name__}")
        quarantine = self.quarantine_after
        if quarantine is not None:
            check_int(quarantine, "RetryPolicy.quarantine_after (failures in a row; None for "
                      "no quarantine)", minimum=1, maximum=MAX_ATTEMPTS_LIMIT, error=ConfigError)
        check_int(self.max_attempts, "RetryPolicy.max_attempts (runs allowed, the first "
                  "included)", minimum=1, maximum=MAX_ATTEMPTS_LIMIT, error=ConfigError)
        for label in ("base_delay_s", "max_delay_s", "overload_min_delay_s", "multiplier",
                      "jitter"):
            value = getattr(self, label)
            try:
                check_finite(value, f"RetryPolicy.{label}")
            except InvalidArguments:
                raise ConfigError(
                    f"RetryPolicy.{label} must be a finite number, got {value!r}") from None
        for label in ("base_delay_s", "max_delay_s", "overload_min_delay_s"):
            if getattr(self, label) < 0:
                raise ConfigError(
                    f"RetryPolicy.{label} must be >= 0 seconds, got {getattr(self, label)!r}"
                )
        if self.multiplier < 1:
            raise ConfigError(f"RetryPolicy.multiplier must be >= 1, got {self.multiplier!r}")
        if not 0.0 <= self.jitter <= 1.0:
            raise ConfigError(f"RetryPolicy.jitter must be within [0, 1], got {self.jitter!r}")

    def ceiling_s(self, attempt: int) -> float:
        """Un-jittered delay after failed attempt number ``attempt`` (1-based), in seconds."""
        exponent = max(0, attempt - 1)
        try:
            delay = self.base_delay_s * (self.multiplier**exponent)
        except OverflowError:  # huge attempt numbers: the cap applies
            return self.max_delay_s
        return min(self.max_delay_s, delay)

    def backoff_s(
        self,
        attempt: int,
        failure: FailureClass = FailureClass.TRANSIENT,
        hint_s: float | None = None,
        rng: random.Random | None = None,
        *,
        overload_floor_s: float | None = None,
    ) -> float:
        """Delay before the next attempt after attempt ``attempt`` failed, in seconds.

        The result lies in ``[ceiling * (1 - jitter), ceiling]``; for overload it is at least
        ``max(overload_min_delay_s, hint_s)``, otherwise at least ``hint_s`` when given
        (both still capped by ``max_delay_s``). ``overload_floor_s`` (seconds), when given,
        replaces ``overload_min_delay_s`` (a worker's override for tests,
        ``Worker(overload_floor_s=)``).
        """
        ceiling = self.ceiling_s(attempt)
        draw = (rng or random).random()
        delay = ceiling * (1.0 - self.jitter * draw)
        if failure is FailureClass.OVERLOAD:
            own = self.overload_min_delay_s if overload_floor_s is None else overload_floor_s
            floor = max(own, hint_s or 0.0)
            delay = max(delay, min(floor, self.max_delay_s))
        elif hint_s:
            delay = max(delay, min(hint_s, self.max_delay_s))
        return delay


def retry_after_s(exc: BaseException) -> float | None:
    """The downstream's retry hint carried by ``exc`` in seconds, if any."""
    if isinstance(exc, OverloadError | TransientError):
        return exc.retry_after_s
    if isinstance(exc, httpx.HTTPStatusError):
        raw = exc.response.headers.get("Retry-After")
        if raw is not None:
            try:
                seconds = float(raw)
            except ValueError:  # the HTTP-date form
                try:
                    when = parsedate_to_datetime(raw)
                except (TypeError, ValueError):
                    return None
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                seconds = (when - datetime.now(UTC)).total_seconds()
            return max(0.0, seconds) if math.isfinite(seconds) else None
    return None


def proves_not_executed(exc: BaseException) -> bool:
    """True when ``exc`` proves an external call did not execute.

    Only two kinds of evidence count: the request never left (connection refused, connect
    or pool timeout) or the target answered and refused it (HTTP 4xx, 429, 503). A 500,
    502 or 504, a read timeout or a dropped reply prove nothing.
    """
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return True
    if isinstance(exc, ConnectionRefusedError):
        return True
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return 400 <= status < 500 or status == 503
    return False


def downstream_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` proves only that the downstream could not be reached (connection
    refused, connect timeout, no free connection): the request never left. Such a failure
    is transient but says nothing about the task, so it does not count toward quarantine
    (DESIGN §7): an outage of a downstream would otherwise quarantine every task in flight
    after ``quarantine_after`` quick retries, cutting ``max_attempts`` short."""
    return isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
                      | ConnectionRefusedError)


def classify(exc: BaseException) -> FailureClass:
    """Put an exception in its failure class (DESIGN §7).

    Ratchet's own :class:`~ratchet.errors.TaskFailure` subclasses say their class (an
    attempt past its time limit, :class:`~ratchet.errors.TimeLimitExceeded`, is a
    ``TransientError``: transient, recorded with ``error_class`` :data:`TIME_LIMIT`). httpx
    errors are classified by what they prove about the request: not sent (connect errors,
    pool timeout) is transient; sent without a reply (read/write timeouts, dropped
    connection) is an unknown outcome; 429/503 is overload; other 5xx transient; other 4xx
    permanent. ``TimeoutError`` is an unknown outcome. Programming errors (``TypeError``,
    ``ValueError``, ``KeyError``, ...) and unserialisable results are permanent. Anything
    else is transient, so it is retried within the budget and then dead-lettered.
    """
    if isinstance(exc, PermanentError):
        return FailureClass.PERMANENT
    if isinstance(exc, OverloadError):
        return FailureClass.OVERLOAD
    if isinstance(exc, OutcomeUnknownError):
        return FailureClass.UNKNOWN_OUTCOME
    if isinstance(exc, TransientError | TaskFailure):
        return FailureClass.TRANSIENT
    if isinstance(exc, SubmitError | ConfigError | IllegalTransition | UndecodableData):
        # bad input, bad settings, an illegal state change, undecodable data: retrying
        # cannot fix them
        return FailureClass.PERMANENT
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        if status in (429, 503):
            return FailureClass.OVERLOAD
        if status >= 500 or status in (408, 409, 425):
            return FailureClass.TRANSIENT
        return FailureClass.PERMANENT
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return FailureClass.TRANSIENT
    if isinstance(
        exc,
        httpx.ReadTimeout
        | httpx.WriteTimeout
        | httpx.ReadError
        | httpx.WriteError
        | httpx.RemoteProtocolError,
    ):
        return FailureClass.UNKNOWN_OUTCOME
    if isinstance(exc, TimeoutError):
        return FailureClass.UNKNOWN_OUTCOME
    if isinstance(
        exc, TypeError | ValueError | KeyError | AttributeError | IndexError | NotImplementedError
    ):
        return FailureClass.PERMANENT
    return FailureClass.TRANSIENT
