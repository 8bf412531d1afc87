"""Little's law for the capacity figures of ``ratchet status`` (DESIGN §9): pure arithmetic
over what the ledger read returned, no I/O.

In a stable system the mean number in service ``L`` is the arrival rate ``λ`` times the
mean time in service ``W`` (``L = λ·W``). A task type whose arrivals need ``L`` attempts in
flight at once, served by ``N`` slots (the task threads of the live workers that serve
it), converges only while ``L < N``: at ``L >= N`` the service rate cannot exceed the
arrivals, and the backlog grows whatever the workers do.

To drain a backlog ``B`` within ``T`` seconds while tasks keep arriving at ``λ``, the
slots must serve ``B + λ·T`` attempts of ``W`` seconds each in ``T`` seconds:
``ceil((B + λ·T) · W / T)`` slots, the fewest that do (:func:`slots_needed`). Units:
seconds, tasks per second, slots (task threads).

The estimate's limits: ``W`` is a mean over the window's ended attempts (a type whose
durations vary widely, or changed within the window, is served worse than the mean
says); it runs from the claim to the holder's end of the attempt, so it includes the time
a prefetched task waited in its worker but not the time it waited in the ledger
(queueing); slots serving several types are shared between them, so each type's figure
is an upper bound of what it can get.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .ledger.records_registry import WorkerSlots

__all__ = [
    "SlotsServing",
    "drain_work_s",
    "in_flight",
    "mean_attempt_s",
    "slots_by_type",
    "slots_for",
    "slots_needed",
    "slots_total",
]

_EPSILON = 1e-9
"""Relative slack of :func:`slots_needed` against floating-point noise (``2.0000000001``
slots are 2, not 3)."""


@dataclass(frozen=True, slots=True)
class SlotsServing:
    """The live workers serving a task type (or every type) and their slots.

    Attributes:
        slots: the sum of their concurrency (task threads), each worker once; a worker
            that registered several types shares these slots between them, so this is an
            upper bound of what one type can get.
        workers: how many live workers serve it.
        unrecorded: of them, those with no slots record (an older release): their slots
            are not in ``slots``, which is then a lower bound too.
    """

    slots: int = 0
    workers: int = 0
    unrecorded: int = 0


def mean_attempt_s(attempts: int, total_s: float) -> float | None:
    """The mean attempt duration ``W``, seconds: ``total_s / attempts``; None when no
    attempt was measured (``attempts <= 0``)."""
    if attempts <= 0:
        return None
    return max(0.0, total_s) / attempts


def in_flight(arrival_per_s: float, mean_s: float) -> float:
    """Little's ``L = λ·W``: the mean number of attempts in flight the arrivals need.

    Args:
        arrival_per_s: ``λ``, tasks per second (>= 0).
        mean_s: ``W``, the mean attempt duration, seconds (>= 0).

    Raises:
        ValueError: a negative or non-finite argument.
    """
    _check(arrival_per_s, "arrival_per_s")
    _check(mean_s, "mean_s")
    return arrival_per_s * mean_s


def drain_work_s(backlog: int, arrival_per_s: float, mean_s: float, within_s: float) -> float:
    """The service time, slot-seconds, of draining ``backlog`` within ``within_s`` seconds
    while tasks keep arriving at ``arrival_per_s``: ``(backlog + λ·T) · W``.

    Args:
        backlog: tasks ready now (>= 0).
        arrival_per_s: ``λ``, tasks per second (>= 0).
        mean_s: ``W``, the mean attempt duration, seconds (>= 0).
        within_s: ``T``, seconds (> 0).

    Raises:
        ValueError: a negative or non-finite argument, or ``within_s`` not above 0.
    """
    _check(float(backlog), "backlog")
    _check(arrival_per_s, "arrival_per_s")
    _check(mean_s, "mean_s")
    _check(within_s, "within_s")
    if within_s <= 0:
        raise ValueError(f"within_s must be above 0, got {within_s!r}")
    return (backlog + arrival_per_s * within_s) * mean_s


def slots_for(work_s: float, within_s: float) -> int:
    """The fewest slots that serve ``work_s`` slot-seconds within ``within_s`` seconds:
    ``ceil(work_s / within_s)`` (a relative slack of 1e-9 absorbs floating-point noise).

    Raises:
        ValueError: a negative or non-finite ``work_s``, or ``within_s`` not above 0.
    """
    _check(work_s, "work_s")
    if not math.isfinite(within_s) or within_s <= 0:
        raise ValueError(f"within_s must be a finite number above 0, got {within_s!r}")
    return max(0, math.ceil(work_s / within_s * (1 - _EPSILON) - _EPSILON))


def slots_needed(backlog: int, arrival_per_s: float, mean_s: float, within_s: float) -> int:
    """The fewest slots that drain ``backlog`` within ``within_s`` seconds while tasks
    keep arriving at ``arrival_per_s``: ``ceil((backlog + λ·T) · W / T)`` (0 when there
    is no work). Each slot serves ``T / W`` attempts in ``T``.

    Args:
        backlog: tasks ready now (>= 0).
        arrival_per_s: ``λ``, tasks per second (>= 0).
        mean_s: ``W``, the mean attempt duration, seconds (>= 0).
        within_s: ``T``, seconds (> 0).

    Raises:
        ValueError: a negative or non-finite argument, or ``within_s`` not above 0.
    """
    return slots_for(drain_work_s(backlog, arrival_per_s, mean_s, within_s), within_s)


def slots_by_type(workers: Sequence[WorkerSlots]) -> dict[str, SlotsServing]:
    """Per task type, the live workers that registered it and their slots (each worker
    once per type, whatever versions it runs)."""
    slots: dict[str, int] = {}
    count: dict[str, int] = {}
    unrecorded: dict[str, int] = {}
    for w in workers:
        for name in set(w.names):
            count[name] = count.get(name, 0) + 1
            if w.slots is None:
                unrecorded[name] = unrecorded.get(name, 0) + 1
            else:
                slots[name] = slots.get(name, 0) + w.slots
    return {n: SlotsServing(slots.get(n, 0), count[n], unrecorded.get(n, 0)) for n in count}


def slots_total(workers: Sequence[WorkerSlots]) -> SlotsServing:
    """Every live worker that serves some type, once, and their slots."""
    serving = [w for w in workers if w.names]
    return SlotsServing(sum(w.slots or 0 for w in serving), len(serving),
                        sum(1 for w in serving if w.slots is None))


def _check(value: float, what: str) -> None:
    """Raise ValueError unless ``value`` is finite and >= 0."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
