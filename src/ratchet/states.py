"""The task state machine (DESIGN §3): one table of allowed transitions.

Every ledger backend consults :data:`TRANSITIONS` (through :func:`check_transition`) before
it issues a conditional update; nothing else decides which moves are legal. Terminal states
have no outgoing edges, so nothing can move a finished task back.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import IllegalTransition

__all__ = [
    "CLAIMABLE",
    "TERMINAL",
    "TRANSITIONS",
    "State",
    "check_transition",
    "is_allowed",
]


class State(StrEnum):
    """Lifecycle states of a task, stored as their names in the ledger."""

    PENDING = "PENDING"
    """Ready, or scheduled for ``run_at`` in the future."""
    RUNNING = "RUNNING"
    """Leased by a holder at a generation."""
    RETRY_WAIT = "RETRY_WAIT"
    """Failed transiently; claimable again at ``run_at`` (backoff)."""
    UNKNOWN = "UNKNOWN"
    """An effect's outcome could not be established; waits for an operator."""
    PAUSED = "PAUSED"
    """Held back by a control command; not claimable."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    """Dead-letter: retries exhausted or a permanent error."""
    CANCELLED = "CANCELLED"


TERMINAL: frozenset[State] = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
"""States that never change again."""

CLAIMABLE: frozenset[State] = frozenset({State.PENDING, State.RETRY_WAIT})
"""States a worker may claim from once ``run_at`` has passed (plus expired ``RUNNING``)."""

TRANSITIONS: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.PAUSED, State.CANCELLED}),
    # A takeover of an expired or revoked lease is a claim (generation + 1, new holder),
    # not a transition: no write moves a task to RUNNING.
    # RUNNING -> PENDING is a release (graceful shutdown) or a revocation.
    State.RUNNING: frozenset(
        {
            State.PENDING,
            State.RETRY_WAIT,
            State.UNKNOWN,
            State.SUCCEEDED,
            State.FAILED,
            State.PAUSED,
            State.CANCELLED,
        }
    ),
    State.RETRY_WAIT: frozenset({State.RUNNING, State.PAUSED, State.CANCELLED}),
    # An operator resolves UNKNOWN: the effect is settled and the task resumes (PENDING),
    # or the operator gives up on it (FAILED / CANCELLED).
    State.UNKNOWN: frozenset({State.PENDING, State.FAILED, State.CANCELLED}),
    State.PAUSED: frozenset({State.PENDING, State.CANCELLED}),
    State.SUCCEEDED: frozenset(),
    # An operator's replay of a quarantined task (or retry of a dead-lettered one) makes a
    # FAILED task PENDING again with fresh attempt counters, its history kept; no worker
    # write and no automatic path moves a FAILED task (DESIGN §3, §7).
    State.FAILED: frozenset({State.PENDING}),
    State.CANCELLED: frozenset(),
}


def is_allowed(current: State, target: State) -> bool:
    """Return True when the table allows ``current -> target``."""
    return target in TRANSITIONS[current]


def check_transition(current: State, target: State) -> None:
    """Raise :class:`~ratchet.errors.IllegalTransition` unless ``current -> target`` is allowed.

    Raises:
        IllegalTransition: the move is not in :data:`TRANSITIONS` (e.g. out of a terminal state).
    """
    if not is_allowed(current, target):
        raise IllegalTransition(f"illegal transition {current} -> {target} (DESIGN §3)")
