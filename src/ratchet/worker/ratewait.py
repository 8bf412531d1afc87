"""Downstream rate limits at effect time (DESIGN §8, flow control): before an effect toward
a downstream with a rate limit (``app.downstream(name, rate_limit=RateLimit(...))``) is
sent, the worker takes a token of the downstream's bucket for the effect's key, in one
short ledger transaction fenced on the task's generation. When the bucket is empty the
call is not sent, no intent is recorded and the worker hands the attempt back (like an
open circuit breaker): the task goes ``PENDING`` with ``run_at`` at the instant the bucket
holds a token and ``flow_wait = 'rate'``, and spends no attempt and no retry.

The buckets are cluster-wide (``rate_buckets``, scope ``'downstream'``): over any ``t``
seconds the effects of every worker send at most ``burst + rate * t`` calls per key. Each
worker takes with its own code's figures (workers of different code share the bucket).
A take of a task that retries later is spent: a token is taken per call sent, not per
effect completed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArguments
from ..ledger.base import WorkerLedger
from ..ratelimit import RateLimit
from ..validation import MAX_KEY_BYTES, check_identifier

__all__ = ["RateWait", "downstream_key", "take_token"]


class RateWait(BaseException):
    """Raised before an effect's call when its downstream's bucket is empty (internal:
    the worker hands the attempt back, ``PENDING`` for ``wait_s`` seconds with
    ``flow_wait = 'rate'``; task code should not catch it, like
    :class:`~ratchet.worker.checkpoints.Shutdown`).

    Attributes:
        downstream: the downstream's name.
        wait_s: seconds until its bucket holds a token (> 0).
    """

    def __init__(self, downstream: str, wait_s: float) -> None:
        super().__init__(f"rate limit of downstream {downstream!r}: next token in "
                         f"{wait_s:.3f} s")
        self.downstream = downstream
        self.wait_s = wait_s


def downstream_key(limit: RateLimit, params: Any, downstream: str) -> str:
    """The bucket key of one effect call: ``limit.key(params)`` when the key is a
    function, ``params[key]`` when it names a parameter (the effect's ``params=``), ``""``
    when the limit has no key.

    Raises:
        InvalidArguments: the key function raised or returned something other than text, a
            whole number or a finite float; the named parameter is missing (or ``params``
            is not a mapping); the key cannot be stored.
    """
    key = limit.key
    if key is None:
        return ""
    where = f"rate_limit key of downstream {downstream!r}"
    if callable(key):
        try:
            value = key(params)
        except Exception as exc:
            raise InvalidArguments(f"{where} raised {type(exc).__name__}: {exc}") from None
    elif isinstance(params, Mapping) and key in params:
        value = params[key]
    else:
        raise InvalidArguments(
            f"{where} names parameter {key!r}, but the effect's params= has no such key: "
            "pass params={...} to ctx.effect")
    if isinstance(value, bool) or not isinstance(value, str | int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise InvalidArguments(f"{where} must be text or a number, got {value!r}")
    text = value if isinstance(value, str) else str(value)
    check_identifier(text, where, MAX_KEY_BYTES)
    return text


def take_token(ledger: WorkerLedger, task_id: str, generation: int, downstream: str,
               limit: RateLimit, params: Any) -> None:
    """Take one token of ``downstream``'s bucket for an effect call of the task.

    Raises:
        RateWait: the bucket is empty (nothing was written).
        StaleGeneration: the task is no longer this claim's.
        InvalidArguments: the key cannot be computed (:func:`downstream_key`).
        LedgerUnavailable: the ledger cannot be reached.
    """
    key = downstream_key(limit, params, downstream)
    wait_s = ledger.rate_take(task_id, generation, downstream, key, limit.per_s, limit.size)
    if wait_s > 0:
        raise RateWait(downstream, wait_s)
