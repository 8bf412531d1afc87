"""Task definitions: one registered version of a task type, and the checks of its lease
and time limit (DESIGN §8, "Definitions"; DESIGN §7, time limits)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ..errors import ConfigError, InvalidArguments
from ..params import ParamsSchema, check_task_function
from ..retry import RetryPolicy
from ..validation import MAX_VERSION, check_finite, check_int
from ._flow import FlowSpec

__all__ = ["MIN_LEASE_S", "TaskDefinition", "check_lease_s", "check_time_limit_s"]

MIN_LEASE_S = 1.0
"""Shortest lease a task type may declare, in seconds.

Where it comes from: a worker trusts a lease only until ``confirmed expiry - margin``
(``worker.heartbeat.margin_for``: 20 % of the lease, at most 2 s) and renews it every third
of the lease, each renewal one ledger round trip (a group-committed, fsynced transaction;
tens of milliseconds on a busy disk or a remote PostgreSQL). At 1 s the worker has a 0.2 s
margin and 0.33 s between renewals: a slow commit or a scheduling hiccup of a loaded host
still fits. Far below that the lease expires before the claim's own commit returns, so a
task is taken over again and again without ever running its effect (a 1 ms lease cycled
through 15-19 generations a second)."""


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A registered task type: one version of one name (DESIGN §8, "Definitions").

    Attributes:
        name: the registered name (``"billing.charge"``).
        fn: the function, called as ``fn(ctx, **params)``.
        version: definition version pinned by every instance at submit; a worker claims
            only the (name, version) pairs its app defines and runs each with its version.
        retry: the retry policy.
        lease_s: lease length in seconds, at least :data:`MIN_LEASE_S`; renewed every
            ``lease_s / 3`` while running.
        time_limit_s: most seconds one attempt may run (None: no limit, the default);
            see :func:`check_time_limit_s` and DESIGN §7 (time limits).
        params_model: the pydantic model validating the params, or ``None`` (the
            function's signature is the schema; :mod:`ratchet.params`).
        flow: its queue, rate limit, concurrency key and fairness
            (:class:`~ratchet.app._flow.FlowSpec`; DESIGN §8, flow control).

    Raises:
        ConfigError: a lease below :data:`MIN_LEASE_S`, a time limit that is not a finite
            number of seconds > 0 (or None), a ``retry`` that is not a
            :class:`RetryPolicy`, a version outside 1 .. 2**31 - 1 (the ledger stores a
            32-bit integer), ``fn`` not callable, or a function that cannot be called as
            ``fn(ctx, **params)`` (:func:`ratchet.params.check_task_function`), a
            rate limit whose ``key`` names a parameter the function does not have.
    """

    name: str
    fn: Callable[..., Any]
    version: int
    retry: RetryPolicy
    lease_s: float
    time_limit_s: float | None = None
    params_model: type[pydantic.BaseModel] | None = None
    flow: FlowSpec = field(default_factory=FlowSpec)
    _schema: ParamsSchema | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_lease_s(self.lease_s)
        check_time_limit_s(self.time_limit_s)
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(
                f"retry must be a ratchet.RetryPolicy, got {type(self.retry).__name__}"
            )
        check_int(self.version, "version", minimum=1, maximum=MAX_VERSION, error=ConfigError)
        if not callable(self.fn):
            raise ConfigError(f"task {self.name!r}: {self.fn!r} is not callable")
        object.__setattr__(self, "_schema",
                           check_task_function(self.name, self.fn, self.params_model))
        limit = self.flow.rate_limit
        fields = self.params_schema.get("properties")
        if limit is not None and limit.key_param is not None and isinstance(fields, dict) \
                and limit.key_param not in fields:
            # A misspelt key would put every task in the one bucket of its missing value.
            raise ConfigError(
                f"task {self.name!r}: rate_limit key {limit.key_param!r} is not one of its "
                f"parameters ({', '.join(sorted(fields)) or 'none'})")

    def validate(self, params_json: str) -> None:
        """Check the params' JSON text against the function's signature (or the params
        model), in pydantic's strict JSON mode; nothing is converted (:mod:`ratchet.params`).

        Raises:
            InvalidArguments: a missing required field, an unknown field, a wrong type;
                the message names each field.
        """
        if self._schema is not None:
            self._schema.validate(self.name, self.version, params_json)

    @property
    def is_async(self) -> bool:
        """True when ``fn`` is an ``async def`` function: the worker runs it on its event
        loop with an :class:`~ratchet.worker.asynccontext.AsyncTaskContext`."""
        return inspect.iscoroutinefunction(self.fn)

    @property
    def params_schema(self) -> dict[str, Any]:
        """The JSON Schema of the params (``{"type": "object"}`` when not introspectable)."""
        return self._schema.json_schema if self._schema is not None else {"type": "object"}

    def spec(self) -> dict[str, Any]:
        """The definition as the ledger stores it (``definitions.spec``, JSON): retry
        policy, ``lease_s``, the params schema and its source. Extensible: a key added
        later is one more entry; readers ignore keys they do not know."""
        return {
            "retry": dataclasses.asdict(self.retry),
            "lease_s": self.lease_s,
            "time_limit_s": self.time_limit_s,
            "params_schema": self.params_schema,
            "params_source": self._schema.source if self._schema is not None else "none",
            "flow": self.flow.spec(),
        }


def check_lease_s(lease_s: object) -> float:
    """``lease_s`` as a float if it is a valid lease length, in seconds.

    Raises:
        ConfigError: not a finite number, or below :data:`MIN_LEASE_S`.
    """
    try:
        seconds = check_finite(lease_s, "lease_s")
    except InvalidArguments:
        raise ConfigError(f"lease_s must be a finite number of seconds, got {lease_s!r}") from None
    if seconds < MIN_LEASE_S:
        raise ConfigError(
            f"lease_s must be at least {MIN_LEASE_S} s (ratchet.app.MIN_LEASE_S), got "
            f"{lease_s!r}: a shorter lease expires before the worker can renew it, so the "
            "task is taken over again and again without running"
        )
    return seconds


def check_time_limit_s(time_limit_s: object) -> float | None:
    """``time_limit_s`` as a float (or None: no limit) if it is a valid time limit of one
    attempt, in seconds (DESIGN §7, time limits: the worker ends an attempt that runs
    longer, as a failed attempt with ``error_class`` ``"time_limit"``).

    Raises:
        ConfigError: not None and not a finite number > 0 (a bool, NaN, infinity, 0 or a
            negative number; "no limit" is None).
    """
    if time_limit_s is None:
        return None
    try:
        seconds = check_finite(time_limit_s, "time_limit_s")
    except InvalidArguments:
        seconds = 0.0
    if seconds <= 0:
        raise ConfigError(
            f"time_limit_s must be a finite number of seconds > 0, or None for no limit; "
            f"got {time_limit_s!r}"
        )
    return seconds

