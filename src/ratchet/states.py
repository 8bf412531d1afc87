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
    "OPERATOR_MOVES",
    "PARKED",
    "TERMINAL",
    "TRANSITIONS",
    "State",
    "check_operator_move",
    "check_transition",
    "is_allowed",
    "is_operator_move",
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
    WAITING = "WAITING"
    """Parked by the task itself (durable sleep, an event, its children): no lease, no
    slot; the ledger moves it to ``PENDING`` at its deadline, when its event arrives or
    when its last awaited child ends (DESIGN §3, waits)."""
    COMPENSATING = "COMPENSATING"
    """Ended ``FAILED`` with compensations to run (or sent back by an operator's
    ``compensate``); made ``PENDING`` for the next claim, whose holder runs them."""
    COMPENSATED = "COMPENSATED"
    """Failed, and every compensation of its completed effects ran (terminal)."""


TERMINAL: frozenset[State] = frozenset(
    {State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATED})
"""States no worker write, claim, lease expiry or revocation ever changes. ``SUCCEEDED``,
``CANCELLED`` and ``COMPENSATED`` never change at all; ``FAILED`` (the dead-letter state)
is left only by an operator's explicit retry or compensate (:data:`OPERATOR_MOVES`)."""

CLAIMABLE: frozenset[State] = frozenset({State.PENDING, State.RETRY_WAIT})
"""States a worker may claim from once ``run_at`` has passed (plus expired ``RUNNING``)."""

PARKED: frozenset[State] = frozenset({State.WAITING, State.COMPENSATING})
"""States the ledger makes ``PENDING`` once ``run_at`` has passed (the claim's wake-up),
or at once when what a ``WAITING`` task waits for arrives (an event, its last child)."""

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
            State.WAITING,
            State.COMPENSATING,
            State.COMPENSATED,
        }
    ),
    # A wait ends by the ledger's wake-up (deadline, event, last child): to PENDING.
    State.WAITING: frozenset({State.PENDING, State.PAUSED, State.CANCELLED}),
    # Made PENDING for the claim whose holder runs the compensations.
    State.COMPENSATING: frozenset({State.PENDING}),
    State.COMPENSATED: frozenset(),
    State.RETRY_WAIT: frozenset({State.RUNNING, State.PAUSED, State.CANCELLED}),
    # An operator resolves UNKNOWN: the effect is settled and the task resumes (PENDING),
    # or the operator gives up on it (FAILED / CANCELLED).
    State.UNKNOWN: frozenset({State.PENDING, State.FAILED, State.CANCELLED}),
    State.PAUSED: frozenset({State.PENDING, State.CANCELLED}),
    State.SUCCEEDED: frozenset(),
    # FAILED leaves only by an operator's retry or quarantine replay (OPERATOR_MOVES).
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}


OPERATOR_MOVES: dict[State, frozenset[State]] = {
    # cancel / pause of a task that is not running: at once, generation + 1.
    State.PENDING: frozenset({State.CANCELLED, State.PAUSED}),
    State.RETRY_WAIT: frozenset({State.CANCELLED, State.PAUSED}),
    # resume (to PENDING) or cancel of a paused task.
    State.PAUSED: frozenset({State.PENDING, State.CANCELLED}),
    # resolve (done / not-done -> PENDING; a cancel request kept on the task -> CANCELLED;
    # give-up -> FAILED).
    State.UNKNOWN: frozenset({State.PENDING, State.FAILED, State.CANCELLED, State.PAUSED}),
    # An operator's retry of a dead-lettered task: a fresh set of attempts, history kept
    # (DESIGN §3: FAILED is left only this way, never by a worker's write), or an
    # operator's compensate: its completed effects are undone.
    State.FAILED: frozenset({State.PENDING, State.COMPENSATING}),
    # cancel / pause of a waiting task: at once, generation + 1 (a resume replays it to
    # its wait, which parks it again unless what it waited for came meanwhile).
    State.WAITING: frozenset({State.CANCELLED, State.PAUSED}),
    State.COMPENSATING: frozenset(),
    State.COMPENSATED: frozenset(),
    # A RUNNING task is never moved by an operator directly: a request is recorded and its
    # holder (or the ledger, once the lease is gone) makes the fenced move.
    State.RUNNING: frozenset(),
    State.SUCCEEDED: frozenset(),
    State.CANCELLED: frozenset(),
}
"""The moves an operator's command makes (``ratchet cancel / retry / pause / resume /
resolve``), each one audited with who and why. Kept apart from :data:`TRANSITIONS`, which
holds the moves of the workers and of the ledger itself: nothing but an audited operator
command may take these edges (the engine checks them with :func:`check_operator_move`)."""


def is_operator_move(current: State, target: State) -> bool:
    """Return True when an operator's command may move a task ``current -> target``."""
    return target in OPERATOR_MOVES[current]


def check_operator_move(current: State, target: State) -> None:
    """Raise :class:`~ratchet.errors.IllegalTransition` unless :data:`OPERATOR_MOVES` allows
    an operator's ``current -> target``.

    Raises:
        IllegalTransition: not an operator move (e.g. out of ``SUCCEEDED``; DESIGN §3).
    """
    if not is_operator_move(current, target):
        raise IllegalTransition(
            f"illegal operator move {current} -> {target} (DESIGN §3: SUCCEEDED, "
            "CANCELLED and COMPENSATED never move; FAILED only by an operator's retry or "
            "compensate)")


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
