"""What a demo run is made of: its knobs (:class:`DemoSettings`), the task of each kind of
payment target and what that kind guarantees, the order workflow's task, and the fixed
names (the freeze point, the PostgreSQL schema, the work dir's marker)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import State

__all__ = [
    "DEMO_APP", "DEMO_PG_SCHEMA", "FREEZE_HEAD_START_S", "FREEZE_POINT", "GUARANTEES",
    "ORDER_KIND", "ORDER_TASK", "PG_SCHEMA_COMMENT", "SETTLED", "TASKS", "TASK_OF",
    "WORKDIR_MARKER", "DemoSettings",
]

DEMO_APP = "ratchet.demo.orders:app"
"""The demo's app as ``MODULE:APP``, what its workers run: :mod:`ratchet.demo.billing`'s
app, with the order workflow (:mod:`ratchet.demo.orders`) registered on it."""
WORKDIR_MARKER = ".ratchet-demo"
"""The file that marks a work dir as the demo's (wiped on every run)."""
DEMO_PG_SCHEMA = "ratchet_demo"
"""The demo's schema on a PostgreSQL ledger whose URL names none (dropped every run)."""
PG_SCHEMA_COMMENT = "created by ratchet demo; dropped and recreated at the start of every run"
"""The comment on the demo's PostgreSQL schema: only a schema with it is ever dropped."""
FREEZE_POINT = "effect.before_call"
"""Where a frozen sender stops itself (``RATCHET_PAUSE_AT``): lease checked, call not sent."""
FREEZE_HEAD_START_S = 15.0
"""Seconds the would-be frozen senders run alone before the workers start (at most)."""
SETTLED = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATED, State.UNKNOWN)
"""States in which a task no longer moves by itself (UNKNOWN waits for a person; a task
that fails with compensations to run goes to COMPENSATING, not FAILED)."""

TASKS: dict[str, str] = {
    "idempotent": "billing.charge",
    "fenced": "billing.charge_fenced",
    "lookup": "billing.charge_lookup",
    "neither": "billing.charge_neither",
}
"""Task name per kind of payment target (:data:`~ratchet.demo.payments.KINDS`)."""

ORDER_KIND = "order"
"""The kind of a run's order workflows (beside the kinds of payment target)."""
ORDER_TASK = "order.fulfil"
"""The order workflow's task (:mod:`ratchet.demo.orders`)."""
TASK_OF: dict[str, str] = {**TASKS, ORDER_KIND: ORDER_TASK}
"""Task name per kind of task the demo submits."""

GUARANTEES: dict[str, str] = {
    "idempotent": "exactly once (the service deduplicates the key)",
    "fenced": "exactly once (the service refuses a stale fencing token)",
    "lookup": "exactly once, unless a sender froze past its lease: then the duplicate "
    "is recorded as a late effect",
    "neither": "at most one send per attempt; an unknown outcome goes to UNKNOWN for a "
    "person (at-least-once if resolved not-done)",
}
"""What each kind of target guarantees for a charge (the demo's report checks it)."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Knobs of one demo run (defaults sized for about a minute on 2 cores).

    Kills are placed at random points of *progress* (fractions of tasks settled), not of
    wall time, so they land on busy workers on a fast or a slow machine.

    Attributes:
        concurrency: task threads per worker process.
        arrival_s: submissions are spread over this many seconds.
        batches: number of ``submit_many`` batches.
        chaos_from: first progress fraction at which a kill may happen.
        chaos_to: last progress fraction at which a kill may happen.
        min_kill_gap_s: least time between two kills, seconds.
        resubmits: keys resubmitted to show submit dedupe.
        stall_s: once every task is submitted, the run fails when no task has changed
            state (and no claim happened) for this many seconds: the deadline follows the
            workload, it is not fixed.
        deadline_s: optional hard cap on the run, seconds from the first submission
            (None: none; the stall window alone decides).
        reply_lost: payment-service probability of dropping a reply after charging.
        burst_503: payment-service probability of starting a burst of 503s.
        slow: payment-service probability of a slow charge.
        honour_keys: the ``idempotent`` service deduplicates on ``Idempotency-Key`` (set
            False to watch the invariants catch duplicates: ``billing.charge`` declares
            the target idempotent, and lookup-first alone cannot see a request still in
            flight).
        slow_s: how slow a slow charge is, seconds (above the client's 1 s read timeout).
        latency_s: mean processing time of every charge at the services, seconds (keeps
            the workers' threads busy, so kills hit tasks in flight).
        in_flight_s: ``in_flight_s`` of the lookup-only charge, seconds (None: the
            services' slowest processing, ``max(slow_s, 1.5 * latency_s)``, plus 1 s).
        freeze: freeze one sender per kind of target in the middle of a call.
        pause_factor: a frozen sender stays frozen at least this many leases, and until
            another worker has settled its task.
        freeze_max_s: ... but at most this long, seconds (then it is resumed anyway).
        tick_s: main-loop period (progress refresh, event scheduling), seconds.
        ship_ratio: share of the order workflows the warehouse ships (the others never),
            in [0, 1].
        ship_min_s, ship_max_s: a shipped order leaves the warehouse this many seconds
            after its reservation (uniform between the two).
        ship_timeout_s: how long an order workflow waits for its ``shipped`` event,
            seconds; keep it above ``ship_max_s``, with a margin, or shipped orders time
            out too.
        books_orders: orders of yesterday the sharded job reconciles
            (:mod:`ratchet.demo.books`; 0: no job).
        books_shards: its shard count.
    """

    concurrency: int = 8
    arrival_s: float = 5.0
    batches: int = 10
    chaos_from: float = 0.05
    chaos_to: float = 0.85
    min_kill_gap_s: float = 0.7
    resubmits: int = 5
    stall_s: float = 30.0
    deadline_s: float | None = None
    reply_lost: float = 0.05
    burst_503: float = 0.02
    slow: float = 0.03
    slow_s: float = 1.5
    honour_keys: bool = True
    latency_s: float = 0.35
    in_flight_s: float | None = None
    freeze: bool = True
    pause_factor: float = 1.0
    freeze_max_s: float = 45.0
    tick_s: float = 0.2
    ship_ratio: float = 0.75
    ship_min_s: float = 1.0
    ship_max_s: float = 3.0
    ship_timeout_s: float = 6.0
    books_orders: int = 4000
    books_shards: int = 4

    @property
    def effective_in_flight_s(self) -> float:
        """The lookup-only charge's ``in_flight_s``, seconds (see :attr:`in_flight_s`)."""
        if self.in_flight_s is not None:
            return self.in_flight_s
        return max(self.slow_s, 1.5 * self.latency_s) + 1.0


