"""What the counting service and its clients agree on: headers, error strings, the
``Retry-After`` of an injected 503, the fault settings, and the error raised when the
service cannot be started or read. (HTTP API: :mod:`ratchet.testing.services`.)"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ...errors import RatchetError
from ...validation import check_finite, check_int

__all__ = [
    "ITEMS_ERROR",
    "RETRY_AFTER_S",
    "STALE_TOKEN_ERROR",
    "TOKEN_HEADER",
    "FaultSettings",
    "ServiceError",
    "valid_items",
]

RETRY_AFTER_S = 0.2
"""``Retry-After`` sent with every injected 503, in seconds."""

TOKEN_HEADER = "Fencing-Token"
"""The request header that carries a fencing token (a decimal integer >= 0)."""

STALE_TOKEN_ERROR = "stale fencing token"
"""The ``error`` of a 409 reply to a request whose fencing token is stale."""


ITEMS_ERROR = "items must be a list of strings and integers"
"""The ``error`` of a 400 reply to a request whose ``items`` is malformed."""


def valid_items(items: Any) -> bool:
    """True when ``items`` (a request body's ``items``) is a list of strings and integers
    (not booleans): what the service applies one by one."""
    return isinstance(items, list) and all(
        isinstance(i, str) or (isinstance(i, int) and not isinstance(i, bool)) for i in items)


class ServiceError(RatchetError):
    """The counting service could not be started, did not become ready, or its file is
    missing."""



@dataclass
class FaultSettings:
    """Fault-injection settings of a running service (all changeable at runtime).

    Attributes:
        honour_keys: deduplicate on ``Idempotency-Key`` (False: every POST executes).
        check_tokens: fenced mode: every ``/effects`` request must carry a
            ``Fencing-Token``; one lower than the highest token seen for its key (by an
            execution or a lookup) is refused with 409 and executes nothing (False: the
            header is ignored).
        reply_lost: probability that an executed request's reply is dropped, in [0, 1].
        burst_503: probability that a request to ``/effects`` starts a 503 burst, in [0, 1].
        burst_len: requests answered 503 per burst (the starting one included).
        slow: probability that a POST sleeps ``slow_s`` before executing, in [0, 1].
        slow_s: the sleep of a slow request, seconds.
        latency_s: mean processing time of every POST before it executes, seconds
            (drawn uniformly from ``[0.5, 1.5] * latency_s``; 0 for none).
        reply_lost_next: drop the replies of the next N executing requests.
        fail_next_503: answer the next N requests to ``/effects`` with 503.
        slow_next: make the next N POSTs slow.
    """

    honour_keys: bool = True
    check_tokens: bool = False
    reply_lost: float = 0.0
    burst_503: float = 0.0
    burst_len: int = 5
    slow: float = 0.0
    slow_s: float = 2.0
    latency_s: float = 0.0
    reply_lost_next: int = 0
    fail_next_503: int = 0
    slow_next: int = 0

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` (field name → value), validating every value first.

        Raises:
            ValueError: an unknown field or a value out of range; nothing is changed (the
                HTTP layer answers 400 with the message).
        """
        known = {f.name for f in fields(self)}
        staged: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault setting {name!r}; known: {sorted(known)}")
            staged[name] = _validated(name, value)
        for name, value in staged.items():
            setattr(self, name, value)


def _validated(name: str, value: Any) -> Any:
    if name in ("honour_keys", "check_tokens"):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    if name in ("reply_lost", "burst_503", "slow"):
        return check_finite(value, f"{name} (a probability)", minimum=0.0, maximum=1.0,
                            error=ValueError)
    if name in ("slow_s", "latency_s"):
        return check_finite(value, f"{name} (seconds)", minimum=0.0, error=ValueError)
    return check_int(value, name, minimum=1 if name == "burst_len" else 0, error=ValueError)
