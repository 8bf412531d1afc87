"""The aggregates ``ratchet status`` reads (:class:`LedgerStats`): counts per type and
state, audit counters, per-type capacity over a window, throughput buckets."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "ATTEMPT_SAMPLE",
    "LedgerStats",
    "RECENT_FRACTION",
    "ThroughputCount",
    "TypeCapacity",
]


@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Aggregates for ``ratchet status``.

    Attributes:
        counts: ``{task name: {state: count}}``, what the ledger holds (DESIGN §9: exact,
            without reading the history).
        oldest_pending_age_s: age of the oldest ready PENDING/RETRY_WAIT task, seconds.
        unknown_count: tasks in ``UNKNOWN``.
        claims: claim audit rows ever written (kept when a prune deletes the rows; so
            are the five counts below).
        takeovers: takeover audit rows ever written.
        stale_rejections: stale-write rejections ever recorded.
        lookup_hits: effect lookups that found an outcome.
        idempotency_conflicts: submits refused for a conflicting idempotency key.
        operator_actions: audited operator commands.
        durability: the durability level this connection runs with.
        backend_settings: backend-specific facts (journal mode, synchronous, ...).
        schema_version: the ledger's schema version.
        ledger_now: the ledger clock, epoch seconds.
    """

    counts: dict[str, dict[str, int]]
    oldest_pending_age_s: float | None
    unknown_count: int
    claims: int
    takeovers: int
    stale_rejections: int
    lookup_hits: int
    idempotency_conflicts: int
    operator_actions: int
    durability: str
    backend_settings: dict[str, str]
    schema_version: int
    ledger_now: float
    revocations: int = 0
    late_effects: int = 0
    """Calls sent by a holder after its claim was taken over (:class:`LateEffect` rows),
    every kind."""
    late_effects_accounted_for: int = 0
    """Of :attr:`late_effects`, those of kind :data:`LATE_ACCOUNTED_FOR` (the rest are
    possible duplicates)."""
    window_s: float = 0.0
    """The window of :attr:`capacity`'s arrivals and completions, seconds (0: not read)."""
    capacity: list[TypeCapacity] = field(default_factory=list)
    """Per task type (with a task in the ledger or one that arrived or finished in the
    window), read in the same transaction as :attr:`counts`, by name; empty unless
    ``stats(window_s=...)`` asked for it."""


RECENT_FRACTION = 0.25
"""The recent part of the status window (:meth:`Ledger.stats`), as a fraction of it: the
``recent_*`` counts of :class:`TypeCapacity` are over its last quarter (15 s of 60 s). No
arrival in it means arrivals stopped (:mod:`ratchet.capacity`)."""


@dataclass(frozen=True, slots=True)
class TypeCapacity:
    """What the ledger holds about one task type's capacity (``ratchet status``, DESIGN §9):
    figures the per-state counts do not give, each read from an index, never the history.

    Attributes:
        name: the task type.
        scheduled: ``PENDING`` / ``RETRY_WAIT`` tasks with ``run_at`` after the ledger clock
            (delayed, or backing off); the rest of those states is ready now.
        oldest_ready_at: the earliest ``run_at`` of those ready now, epoch seconds (None:
            none is).
        oldest_unknown_at: the earliest ``updated_at`` of its ``UNKNOWN`` tasks (when each
            last changed: it entered ``UNKNOWN``), epoch seconds (None: none is).
        unknown: its ``UNKNOWN`` tasks.
        quarantined: its quarantined ``FAILED`` tasks (DESIGN §7).
        arrivals: its tasks created in the window (those the ledger still holds).
        completions: its tasks that reached ``SUCCEEDED``, ``FAILED`` or ``CANCELLED`` in
            the window (by ``updated_at``, the finish time).
        unknown_entered: its ``UNKNOWN`` tasks that entered ``UNKNOWN`` in the window (they
            wait for a person, not for a worker: the drain rate counts them as gone).
        recent_arrivals, recent_completions, recent_unknown_entered: the same three counted
            over the window's recent part only (its last :data:`RECENT_FRACTION`).
        last_arrival_at: the newest ``created_at`` in the window, epoch seconds (None: no
            task arrived in it).
        attempts: its attempts that ended in the window (of the newest
            :data:`ATTEMPT_SAMPLE` ended over all types): a claim (or takeover) and its
            holder's own end of it, whatever the outcome (finished, retry, parked in
            ``WAITING``, ``UNKNOWN``) but a release (handed back at a shutdown, mostly a
            prefetched task that never ran). An attempt whose holder was gone (taken over,
            revoked, retired) has no end of its own and is not counted; nor is a parked
            task's wait (its wake is a new claim).
        attempt_s: the summed durations of those attempts, claim to end, seconds (the
            claim of one that ended in the window may lie before it).
    """

    name: str
    scheduled: int = 0
    oldest_ready_at: float | None = None
    oldest_unknown_at: float | None = None
    unknown: int = 0
    quarantined: int = 0
    arrivals: int = 0
    unknown_entered: int = 0
    completions: int = 0
    recent_arrivals: int = 0
    recent_completions: int = 0
    recent_unknown_entered: int = 0
    last_arrival_at: float | None = None
    attempts: int = 0
    attempt_s: float = 0.0


ATTEMPT_SAMPLE = 10_000
"""The most ended attempts :attr:`TypeCapacity.attempts` measures per status read, the
newest of the window (so that the read's cost does not grow with the throughput)."""


@dataclass(frozen=True, slots=True)
class ThroughputCount:
    """Arrivals and completions in one time bucket (:meth:`Ledger.throughput`).

    Attributes:
        start: the bucket's start, epoch seconds (ledger clock); it lasts the bucket width.
        arrivals: tasks created in it; completions: tasks that reached a terminal state
            in it (both: rows the ledger still holds).
    """

    start: float
    arrivals: int
    completions: int
