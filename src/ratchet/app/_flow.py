"""Flow control of a task type (DESIGN §8, flow control): its queue, rate limit,
concurrency key and fairness as declared by ``@app.task``, and what a submit stores from
them (:func:`flow_fields`): the keys are computed from the params here, at submit, so the
ledger enforces them at claim without the task's code."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InvalidArguments
from ..ratelimit import RateLimit
from ..validation import MAX_KEY_BYTES, check_identifier, check_queue_name

__all__ = ["DEFAULT_QUEUE", "MAX_DEBOUNCE_S", "MAX_PRIORITY", "FlowSpec", "flow_fields"]

DEFAULT_QUEUE = "default"
"""The queue of a task type that names none."""

MAX_PRIORITY = 1_000_000
"""Priorities are whole numbers in ``-MAX_PRIORITY .. MAX_PRIORITY`` (higher first)."""

MAX_DEBOUNCE_S = 7 * 86400.0
"""The longest debounce window, seconds (a week)."""

KeyFn = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class FlowSpec:
    """How a task type's tasks are shaped at claim (``@app.task(...)`` arguments).

    Attributes:
        queue: the named queue its tasks go to unless a submit names another.
        rate_limit: a token bucket per key (:class:`~ratchet.ratelimit.RateLimit`), or None.
        concurrency_key: a function of the params whose value (as text) is the key: at
            most ``max_per_key`` tasks of one key hold a slot (run, or wait to be retried)
            at once, cluster-wide; None: no key.
        max_per_key: slots per key value (>= 1).
        ordered: one slot per key, given in submit order (``max_per_key`` must be 1).
        fair: claims take this type's ready tasks round-robin across fairness keys
            (the tenant, or ``fair_key``'s value).
        fair_key: a function of the params giving the fairness key (implies ``fair``).

    Raises:
        ConfigError: a bad queue name, ``rate_limit`` not a RateLimit, a key function
            that is not callable, ``max_per_key`` below 1 or not whole, ``ordered`` with
            ``max_per_key`` above 1.
    """

    queue: str = DEFAULT_QUEUE
    rate_limit: RateLimit | None = None
    concurrency_key: KeyFn | None = None
    max_per_key: int = 1
    ordered: bool = False
    fair: bool = False
    fair_key: KeyFn | None = None

    def __post_init__(self) -> None:
        check_queue_name(self.queue, ConfigError)
        if self.rate_limit is not None and not isinstance(self.rate_limit, RateLimit):
            raise ConfigError(
                f"rate_limit must be a ratchet.RateLimit, got {type(self.rate_limit).__name__}")
        for what, fn in (("concurrency_key", self.concurrency_key),
                         ("fair_key", self.fair_key)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{what} must be a function of the params, got {fn!r}")
        if (isinstance(self.max_per_key, bool) or not isinstance(self.max_per_key, int)
                or self.max_per_key < 1):
            raise ConfigError(f"max_per_key must be a whole number >= 1, got "
                              f"{self.max_per_key!r}")
        if self.ordered and self.max_per_key != 1:
            raise ConfigError("ordered=True runs one task of a key at a time: leave "
                              f"max_per_key at 1 (got {self.max_per_key})")
        if self.ordered and self.concurrency_key is None:
            raise ConfigError("ordered=True needs a concurrency_key (the order is per key)")
        if self.max_per_key != 1 and self.concurrency_key is None:
            raise ConfigError("max_per_key needs a concurrency_key")
        if self.fair_key is not None:
            object.__setattr__(self, "fair", True)

    def spec(self) -> dict[str, Any]:
        """The settings as the ledger stores them with the definition (JSON)."""
        limit = self.rate_limit
        return {
            "queue": self.queue,
            "rate_limit": None if limit is None else {
                "per_s": limit.per_s, "burst": limit.size, "key_param": limit.key_param,
                "keyed": limit.key is not None},
            "concurrency_key": self.concurrency_key is not None,
            "max_per_key": self.max_per_key, "ordered": self.ordered, "fair": self.fair,
        }


def _key(fn: KeyFn, params: Mapping[str, Any], what: str, task: str) -> str:
    """``fn(params)`` as stored key text.

    Raises:
        InvalidArguments: ``fn`` raised, or returned something that is not text, a whole
            number or a finite float, or text that cannot be stored as a key."""
    try:
        value = fn(params)
    except Exception as exc:
        raise InvalidArguments(
            f"{what} of task {task!r} raised {type(exc).__name__}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, str | int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise InvalidArguments(
            f"{what} of task {task!r} must return text or a number, got {value!r}")
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:  # an int too large to print
        raise InvalidArguments(f"{what} of task {task!r} returned a number too large to use "
                               "as a key") from None
    check_identifier(text, f"{what} of task {task!r}", MAX_KEY_BYTES)
    return text


def flow_fields(
    flow: FlowSpec, task: str, params: Mapping[str, Any], *, queue: str | None,
    priority: int, tenant: str | None, debounce_s: float | None,
    debounce_max_s: float | None, idempotency_key: str | None,
) -> dict[str, Any]:
    """The flow-control fields of the :class:`~ratchet.ledger.base.NewTask` one submit
    writes (``queue``, ``priority``, ``fair_key``, ``ckey``, ``ckey_max``, ``rate_key``,
    ``debounce_key``, ``debounce_s``, ``debounce_max_s``).

    Raises:
        InvalidArguments: a bad queue name, a priority that is not a whole number in
            ``-MAX_PRIORITY .. MAX_PRIORITY``, a key function that fails, a debounce without
            an idempotency key or with a window outside ``0 < s <= MAX_DEBOUNCE_S`` (the
            longest wait no shorter than the window).
    """
    if queue is not None:
        check_queue_name(queue)
    if (isinstance(priority, bool) or not isinstance(priority, int)
            or abs(priority) > MAX_PRIORITY):
        raise InvalidArguments(
            f"priority must be a whole number from -{MAX_PRIORITY} to {MAX_PRIORITY}, got "
            f"{priority!r}")
    fields: dict[str, Any] = {"queue": queue or flow.queue, "priority": priority}
    if flow.fair:
        fields["fair_key"] = (_key(flow.fair_key, params, "fair_key", task)
                              if flow.fair_key is not None else (tenant or ""))
    if flow.concurrency_key is not None:
        fields["ckey"] = _key(flow.concurrency_key, params, "concurrency_key", task)
        fields["ckey_max"] = flow.max_per_key
    limit = flow.rate_limit
    if limit is not None and callable(limit.key):
        fields["rate_key"] = _key(limit.key, params, "rate_limit key", task)
    if debounce_s is not None or debounce_max_s is not None:
        window = _seconds(debounce_s, "debounce_s")
        longest = window if debounce_max_s is None else _seconds(debounce_max_s,
                                                                 "debounce_max_s")
        if longest < window:
            raise InvalidArguments(
                f"debounce_max_s ({longest:g}) must be at least debounce_s ({window:g})")
        if idempotency_key is None:
            raise InvalidArguments(
                "debounce_s needs an idempotency_key: the key names the submits that "
                "collapse into one task")
        fields.update(debounce_key=idempotency_key, debounce_s=window,
                      debounce_max_s=longest)
    return fields


def _seconds(value: object, what: str) -> float:
    """A debounce window in seconds, ``0 < s <= MAX_DEBOUNCE_S``.

    Raises:
        InvalidArguments: anything else (None included)."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 < value <= MAX_DEBOUNCE_S):
        raise InvalidArguments(
            f"{what} must be a number of seconds above 0 and at most {MAX_DEBOUNCE_S:g}, "
            f"got {value!r}")
    return float(value)
