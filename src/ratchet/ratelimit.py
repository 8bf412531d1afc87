"""Rate limits: a token bucket per key, kept in the ledger and spent at claim (DESIGN §8,
flow control). Pure: the parsing of ``"20/s"``, the bucket's arithmetic and the plan of
one claim (which candidates take a token, which wait and until when); the ledger reads
and writes the buckets, the claim applies the plan.

The bucket (the classic token bucket, as Hatchet, Inngest and DBOS queues use): it holds
at most ``burst`` tokens and refills at ``per_s`` tokens a second; starting a task spends
one. Over any interval of ``t`` seconds at most ``burst + per_s * t`` tasks of one key
start. A task that finds its bucket empty is not claimed and spends no attempt: its
``run_at`` moves to the instant its bucket will hold a token again (``flow_wait`` =
``'rate'``), later candidates of the same key in the same claim one interval after each
other, so a backlog is not re-read by every claim; it is never dropped.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = [
    "BucketState",
    "RateCandidate",
    "RateLimit",
    "RatePlan",
    "parse_rate",
    "plan_takes",
    "refill",
]

_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0,
          "d": 86400.0, "day": 86400.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")

_EPSILON = 1e-9
"""Tokens short of one that still count as one: a deferred task comes back at the instant
its bucket refills, and floating-point arithmetic may land a hair below."""

MAX_PER_S = 1_000_000.0
"""The highest rate a limit may name, tasks per second (a bigger one limits nothing)."""


def parse_rate(text: str) -> float:
    """``"20/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/h"``, ``"2/d"`` as tasks per second.

    Raises:
        ConfigError: not of the form ``N/[M]unit`` (unit ``s``, ``m``, ``h`` or ``d``), a
            rate of 0, or above :data:`MAX_PER_S`.
    """
    if not isinstance(text, str):
        raise ConfigError(f"a rate is text such as '20/s', got {text!r}")
    found = _RATE.match(text.lower())
    if found is None or found.group(3) not in _UNITS:
        raise ConfigError(
            f"rate {text!r} is not N/unit: write '20/s', '100/m', '5/10s', '1000/h' or '2/d'")
    count = float(found.group(1))
    period_s = float(found.group(2) or 1) * _UNITS[found.group(3)]
    if count <= 0 or period_s <= 0:
        raise ConfigError(f"rate {text!r} must be above 0")
    per_s = count / period_s
    if per_s > MAX_PER_S:
        raise ConfigError(f"rate {text!r} is above {MAX_PER_S:g}/s")
    return per_s


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A rate limit on a task type (``@app.task(rate_limit=...)``) or a downstream
    (``app.downstream(name, rate_limit=...)``): at most ``burst`` tasks at once, then
    ``rate`` on average, per key, cluster-wide (the buckets live in the ledger).

    Args:
        rate: ``"20/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/h"`` (:func:`parse_rate`).
        key: what divides the tasks into buckets: a function of the params returning the
            key (``lambda p: p["merchant"]``; its result as text, computed at submit), the
            name of a parameter (``"merchant"``), or None for one bucket for the type.
        burst: the bucket's size, tasks (>= 1); default the rate's count per second,
            rounded up (``"20/s"``: 20; ``"100/m"``: 2).

    Attributes:
        per_s: the rate, tasks per second.

    Raises:
        ConfigError: a bad rate, a burst below 1, or a key that is neither callable, a
            parameter name nor None.
    """

    rate: str
    key: Callable[[Mapping[str, Any]], Any] | str | None = None
    burst: int | None = None

    def __post_init__(self) -> None:
        per_s = parse_rate(self.rate)
        if self.burst is None:
            object.__setattr__(self, "burst", max(1, math.ceil(per_s)))
        elif (isinstance(self.burst, bool) or not isinstance(self.burst, int)
              or self.burst < 1):
            raise ConfigError(f"burst must be a whole number of tasks >= 1, got {self.burst!r}")
        if not (self.key is None or callable(self.key)
                or (isinstance(self.key, str) and self.key)):
            raise ConfigError(
                "key must be a function of the params, a parameter name or None, got "
                f"{self.key!r}")

    @property
    def per_s(self) -> float:
        """The rate, tasks per second."""
        return parse_rate(self.rate)

    @property
    def size(self) -> int:
        """The bucket's size (``burst``, resolved), tasks."""
        assert self.burst is not None  # set by __post_init__
        return self.burst

    @property
    def key_param(self) -> str | None:
        """The parameter whose value is the key, when ``key`` names one."""
        return self.key if isinstance(self.key, str) else None


@dataclass(frozen=True, slots=True)
class BucketState:
    """One bucket as the ledger keeps it: ``tokens`` (may be fractional) at ``at``
    (ledger-clock epoch seconds)."""

    tokens: float
    at: float


def refill(state: BucketState | None, now: float, per_s: float, burst: int) -> float:
    """The tokens a bucket holds at ``now``: a bucket never used is full; refilled at
    ``per_s`` since its last write, at most ``burst``; a clock that stepped back adds
    nothing."""
    if state is None:
        return float(burst)
    return min(float(burst), state.tokens + max(0.0, now - state.at) * per_s)


@dataclass(frozen=True, slots=True)
class RateCandidate:
    """A ready task a claim may take: its id and its bucket (``(scope, name, key)``,
    None when no limit applies to it), in the claim's order."""

    task_id: str
    bucket: tuple[str, str, str] | None


@dataclass(frozen=True, slots=True)
class RatePlan:
    """What one claim does under rate limits (:func:`plan_takes`).

    Attributes:
        take: the candidates' ids to claim, in order.
        defer: ``(task_id, run_at)`` of the candidates whose bucket is empty: the
            ``run_at`` (epoch seconds) when their bucket will hold a token for them.
        buckets: the buckets' new states, to write.
    """

    take: list[str]
    defer: list[tuple[str, float]]
    buckets: dict[tuple[str, str, str], BucketState]


def plan_takes(
    candidates: Sequence[RateCandidate], want: int, now: float,
    limits: Mapping[tuple[str, str], tuple[float, int]],
    buckets: Mapping[tuple[str, str, str], BucketState],
) -> RatePlan:
    """Which of ``candidates`` (in order) a claim of at most ``want`` takes, spending a
    token of each one's bucket; those whose bucket is empty wait (``defer``).

    ``limits``: ``(scope, name) -> (per_s, burst)``; ``buckets``: the states read, by
    ``(scope, name, key)`` (absent: never used, full). A candidate past ``want`` is left
    as it is (the next claim sees it), a candidate without a bucket is taken while
    ``want`` allows. The k-th deferred candidate of a bucket gets the instant its bucket
    holds k tokens: ``now + (k - tokens) / per_s``.
    """
    take: list[str] = []
    defer: list[tuple[str, float]] = []
    tokens: dict[tuple[str, str, str], float] = {}
    # A bucket's clock never goes back: a claim whose clock reads earlier than the
    # bucket's last write (a PostgreSQL transaction's now() is its start) refills nothing
    # and keeps that write's time, or the next claim would refill the same seconds twice.
    clock: dict[tuple[str, str, str], float] = {}
    behind: dict[tuple[str, str, str], int] = {}
    for c in candidates:
        if c.bucket is None:
            if len(take) < want:
                take.append(c.task_id)
            continue
        per_s, burst = limits[c.bucket[:2]]
        if c.bucket not in tokens:
            state = buckets.get(c.bucket)
            tokens[c.bucket] = refill(state, now, per_s, burst)
            clock[c.bucket] = now if state is None else max(now, state.at)
        if tokens[c.bucket] >= 1.0 - _EPSILON and len(take) < want:
            tokens[c.bucket] -= 1.0
            take.append(c.task_id)
        elif tokens[c.bucket] < 1.0 - _EPSILON:
            behind[c.bucket] = behind.get(c.bucket, 0) + 1
            wait_s = (behind[c.bucket] - tokens[c.bucket]) / per_s
            defer.append((c.task_id, now + wait_s))
    return RatePlan(take, defer,
                    {b: BucketState(max(0.0, t), clock[b]) for b, t in tokens.items()})
