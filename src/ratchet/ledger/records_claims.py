"""What a worker's calls carry: the claim it receives (:class:`Claim`), its lease renewals,
and the fenced writes it commits for a task (:class:`TaskWrite`: steps, effects, a
transition) with their outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..outbox import NewMessage
from ..states import State
from ..storedtext import StoredState
from ..validation import MAX_VERSION
from .fastinit import fast_init
from .records_batches import BatchMark
from .records_tasks import EffectRecord, EffectState, StepRecord
from .records_waits import WaitSpec

__all__ = [
    "BudgetUse",
    "Claim",
    "ClaimKind",
    "ClaimScope",
    "CommitOutcome",
    "EffectWrite",
    "RenewResult",
    "TaskWrite",
    "Transition",
    "claim_kinds",
]


ClaimKind = str | tuple[str, int]
"""What a claim asks for: ``(name, version)`` (a worker sends one pair per definition it
has, DESIGN §8), or a bare name: every version of it (tools and tests)."""


@dataclass(frozen=True, slots=True)
class ClaimScope:
    """What a claim may take beyond its kinds (DESIGN §8, flow control).

    Attributes:
        queues: the named queues the worker serves (``ratchet worker --queues``), sorted;
            None: every queue.
        fair: the task names whose ready tasks are claimed round-robin across their
            fairness keys (``@app.task(fair=True)``).
    """

    queues: tuple[str, ...] | None = None
    fair: frozenset[str] = frozenset()


def claim_kinds(kinds: Sequence[ClaimKind]) -> dict[str, list[Any]]:
    """The claim statements' parameters for ``kinds``: aligned lists ``names``, ``lo``,
    ``hi`` (entry i claims versions ``lo[i]`` .. ``hi[i]`` of ``names[i]``), each kind
    once, in the order given."""
    names: list[str] = []
    lo: list[int] = []
    hi: list[int] = []
    for kind in dict.fromkeys(kinds):
        if isinstance(kind, str):
            names.append(kind)
            lo.append(1)
            hi.append(MAX_VERSION)
        else:
            names.append(kind[0])
            lo.append(kind[1])
            hi.append(kind[1])
    return {"names": names, "lo": lo, "hi": hi}


@fast_init
@dataclass(frozen=True, slots=True)
class Claim:
    """A task leased to a worker.

    Attributes:
        task_id, name, version, params_json: the task.
        generation: the fencing token of this claim; every write must carry it.
        attempt: 1-based count of runs that count toward ``max_attempts`` (releases by a
            graceful shutdown hand their attempt back).
        max_attempts: retry ceiling.
        lease_s: lease length, seconds.
        lease_until: ledger-clock expiry, epoch seconds.
        ledger_now: ledger clock when the claim committed, epoch seconds.
        takeover: True when the previous holder's lease had expired (or was revoked).
        previous_holder: holder the task was taken from, if any.
        steps: committed steps by name (empty on a first claim).
        effects: effect records by name (empty on a first claim).
        control_request: an operator's request recorded on the task (``"cancel"`` /
            ``"pause"``, :class:`ControlRequest`) that this holder must apply once the
            open effect intent it inherits is settled; None almost always.
        trace_context: the submitter's trace context as stored at submit
            (:attr:`NewTask.trace_context`), or None.
    """

    task_id: str
    name: str
    version: int
    params_json: str
    generation: int
    attempt: int
    max_attempts: int
    lease_s: float
    lease_until: float
    ledger_now: float
    takeover: bool = False
    previous_holder: str | None = None
    steps: dict[str, StepRecord] = field(default_factory=dict)
    effects: dict[str, EffectRecord] = field(default_factory=dict)
    control_request: str | None = None
    trace_context: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class RenewResult:
    """Per-lease result of :meth:`Ledger.renew`; ``ok`` False means the lease is lost.

    ``extended`` False (with ``ok``): still held, but not extended this time (its task row
    was locked by another transaction); ``lease_until`` is the current expiry, and the
    caller should renew again soon.
    """

    task_id: str
    generation: int
    ok: bool
    lease_until: float | None
    ledger_now: float
    extended: bool = True


@fast_init
@dataclass(frozen=True, slots=True)
class EffectWrite:
    """An effect row to write (intent, or outcome).

    Attributes:
        name: effect name, unique within the task.
        key: business idempotency key.
        params_digest: digest of what the effect sends.
        state: ``INTENT`` before calling out, ``DONE`` with ``result_json`` after.
        result_json: the call's (or lookup's) result as JSON.
        via_lookup: the result came from a lookup, not from our call.
        seq: the checkpoint's 0-based position in the task's code path (None: unknown;
            an outcome write then keeps the position its intent recorded).
    """

    name: str
    key: str
    params_digest: str
    state: EffectState | StoredState
    """A :class:`~ratchet.storedtext.StoredState` when the row holds a value that is not a
    known effect state (shown as stored; settled by nothing)."""
    result_json: str | None = None
    via_lookup: bool = False
    seq: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class BudgetUse:
    """What one attempt charges to a retry budget (DESIGN §7), carried by its final
    transition; the engine counts it in the commit's transaction.

    Attributes:
        key: the budget: ``type:<task name>`` or ``downstream:<name>``.
        calls: calls this attempt made (1 per attempt for a task type; requests sent for a
            downstream).
        retry: the transition is a ``RETRY_WAIT`` this budget must admit.
        ratio, min_per_s, window_s: the :class:`~ratchet.retry.RetryBudget`.
    """

    key: str
    calls: int
    retry: bool
    ratio: float
    min_per_s: float
    window_s: float


@fast_init
@dataclass(frozen=True, slots=True)
class Transition:
    """A state change of a running task, committed with its audit row.

    Attributes:
        to: target state (checked against the transition table).
        delay_s: for ``RETRY_WAIT``/``PENDING``: seconds after ledger-now before it is ready.
        result_json: the task's return value, for ``SUCCEEDED``.
        error: last error text, for ``RETRY_WAIT``/``FAILED``/``UNKNOWN``: the
            exception's type and message (:func:`ratchet.errortext.error_message`).
        error_class: failure class name.
        traceback: the failure's traceback, kept apart from ``error``
            (``tasks.last_traceback``); None when there is none. Written with ``error``:
            a new error without one clears the previous traceback.
        reason: audit detail (e.g. ``"shutdown"``, ``"retry"``).
        fingerprint: the error's fingerprint (:mod:`ratchet.fingerprint`) for a failure
            that counts toward quarantine; the engine counts it in the same transaction
            and may turn a ``RETRY_WAIT`` into a quarantined ``FAILED`` (DESIGN §7).
        budgets: retry budgets this attempt charges (:class:`BudgetUse`); a ``RETRY_WAIT``
            over budget gets a later ``run_at`` and the reason (DESIGN §7).
        wait: for ``WAITING``: what the task waits for
            (:class:`~ratchet.ledger.records_waits.WaitSpec`).
        run_at: for ``WAITING``: its deadline (a sleep's, an event's timeout), ledger-clock
            epoch seconds, recorded as the task's checkpoint; overrides ``delay_s`` so the
            wake-up is due at the recorded instant, not at the commit's clock plus a delay.
        flow_wait: for ``PENDING``: ``"rate"`` when a downstream's rate limit handed the
            attempt back (``tasks.flow_wait``; DESIGN §8, flow control); None otherwise.
    """

    to: State
    delay_s: float = 0.0
    result_json: str | None = None
    error: str | None = None
    error_class: str | None = None
    reason: str | None = None
    fingerprint: str | None = None
    budgets: tuple[BudgetUse, ...] = ()
    traceback: str | None = None
    wait: WaitSpec | None = None
    run_at: float | None = None
    flow_wait: str | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class TaskWrite:
    """Everything one worker writes for one task in one commit, fenced on ``generation``.

    Attributes:
        task_id: the task.
        generation: the writer's fencing token.
        holder: the writer's identity (for the audit of stale rejections).
        operation: short label for audit and errors (``"step:quote"``, ``"complete"``...).
        steps: ``(stored name, result_json, seq)`` triples to record as done (``seq``:
            the step's position in the task's code path, or None; a ``(name,
            result_json)`` pair means no position).
        effects: effect rows to write.
        transition: optional state change.
        batches: committed batches of ``ctx.batches`` runs (the run's watermark moves in
            the same transaction, DESIGN §6 row 9).
        outbox: messages the task emitted (``ctx.emit``), written only if the write
            passes its fence (DESIGN §6 row 10).
    """

    task_id: str
    generation: int
    holder: str
    operation: str
    steps: Sequence[tuple[str, str, int | None] | tuple[str, str]] = ()
    effects: Sequence[EffectWrite] = ()
    transition: Transition | None = None
    batches: Sequence[BatchMark] = ()
    outbox: Sequence[NewMessage] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """Per-task result of :meth:`Ledger.commit`: ``ok``, or ``stale`` and the current row.

    With ``ok``, ``current_state`` is None unless an operator request changed the state
    the write asked for (DESIGN §3 arbitration: e.g. ``RETRY_WAIT`` applied as
    ``CANCELLED``); then it is the state applied."""

    task_id: str
    ok: bool
    stale: bool
    current_generation: int | None = None
    current_state: State | StoredState | None = None
