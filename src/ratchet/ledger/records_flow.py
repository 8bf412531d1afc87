"""The records of flow control as operators see it (DESIGN §8, flow control): the rate
limits in the ledger and the live tasks per queue and flow wait."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FlowCount", "RateLimitSetting"]


@dataclass(frozen=True, slots=True)
class RateLimitSetting:
    """One row of the ledger's ``rate_limits`` table: a token bucket per key.

    Attributes:
        scope: ``"type"`` (a task type's claims) or ``"downstream"``.
        name: the task type (or downstream).
        per_s: the rate, tasks per second (> 0).
        burst: the bucket's size, tasks (>= 1).
        key_param: the parameter whose value is the bucket key, or None (one bucket, or a
            key the code computes at submit: ``tasks.rate_key``).
        source: ``"code"`` (a worker registered it from ``@app.task(rate_limit=...)``) or
            ``"operator"`` (set with ``ratchet limits set --rate``; it wins over the
            code's until cleared).
        version: how many times the row was written (1 for a new row).
        updated_at: ledger clock of the last write, epoch seconds.
        updated_by: the operator, or the worker (holder) that registered the code's row.
        reason: the operator's reason (``"declared in code"`` for a code row).
    """

    scope: str
    name: str
    per_s: float
    burst: int
    key_param: str | None
    source: str
    version: int
    updated_at: float
    updated_by: str | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class FlowCount:
    """Live tasks of one (type, queue, state, flow wait) (:meth:`Ledger.flow_counts`).

    Attributes:
        name: the task type; queue: its queue.
        state: ``PENDING``, ``RETRY_WAIT``, ``RUNNING``, ``WAITING`` or ``COMPENSATING``
            (as stored).
        flow_wait: ``"rate"``, ``"key"``, ``"debounce"`` or None.
        n: how many; due: how many of them have a ``run_at`` at or before the read's
            ledger clock (ready tasks; every ``RUNNING`` one; 0 for parked states).
    """

    name: str
    queue: str
    state: str
    flow_wait: str | None
    n: int
    due: int
