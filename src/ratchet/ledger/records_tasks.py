"""The ledger's records of a task and its history: what a submit writes (:class:`NewTask`),
the task row (:class:`TaskInfo`), its steps, effects, audit events and late effects, and
the query and timeline that read them back."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..states import State
from ..storedtext import StoredState
from .fastinit import fast_init

__all__ = [
    "AuditEvent",
    "EffectRecord",
    "EffectState",
    "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE",
    "LateEffect",
    "NewTask",
    "StepRecord",
    "SubmitResult",
    "TaskEffect",
    "TaskInfo",
    "TaskQuery",
    "Timeline",
]


class EffectState(StrEnum):
    """State of one effect record."""

    INTENT = "intent"
    """Intent committed, outcome not (yet) recorded: on recovery, look up first."""
    DONE = "done"
    """Result recorded (from the call, from a lookup, or from an operator)."""
    NOT_DONE = "not_done"
    """An operator confirmed the call did not happen: call again with the same key."""
    GIVEN_UP = "given_up"
    """An operator gave up on the task (``resolve --outcome give-up``): the outcome stays
    unknown. Should the task be retried (``ratchet retry``), it is settled like an open
    intent (lookup first)."""


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to submit.

    Attributes:
        task_id: id chosen by the caller (used only if the task is new).
        name: registered task name.
        version: definition version the instance pins.
        params_json: canonical JSON of the params.
        params_digest: digest of name + params, compared on idempotency-key reuse.
        idempotency_key: submit dedupe key, or None.
        delay_s: seconds after ledger-now before the task is ready (0 = now).
        run_at_epoch_s: absolute ready time in epoch seconds; overrides ``delay_s``.
        max_attempts: executions allowed before dead-letter.
        lease_s: lease length for claims of this task, in seconds.
        quarantine_after: failures in a row with one error fingerprint, or deliveries
            whose worker died, that quarantine the task (``RetryPolicy.quarantine_after``);
            None: never quarantined (DESIGN §7).
        tenant: the submitter's tenant (bulkheads, DESIGN §8), or None.
        trace_context: the submitter's trace context (W3C ``traceparent`` / ``tracestate``
            as a JSON object, :mod:`ratchet.observe.tracing`), or None; stored with the
            task and handed to every claim (DESIGN §9).
        parent_id: the task that submits this one from its body (``ctx.submit``), or None.
        queue: the named queue (DESIGN §8, flow control); a worker serving other queues
            never claims it.
        priority: higher first among the ready tasks of a queue (ties by ``run_at``).
        fair_key: the fairness key of a task of a fair type (claims go round-robin
            across keys), or None for a type that is not fair.
        ckey: the concurrency key (at most ``ckey_max`` of its tasks hold a slot; the
            others wait ``WAITING`` for one, oldest first), or None.
        ckey_max: the most tasks of ``ckey`` that hold a slot at once (1: one at a time,
            in submit order).
        rate_key: the rate-limit bucket key computed from the params by the type's
            :class:`~ratchet.ratelimit.RateLimit`, or None (one bucket, or a key param).
        debounce_key: the debounce group (submits within ``debounce_s`` collapse into one
            task), or None.
        debounce_s: seconds after the last submit of the group that the task starts.
        debounce_max_s: seconds after the first submit of the group that the task starts
            at the latest.
    """

    task_id: str
    name: str
    version: int
    params_json: str
    params_digest: str
    idempotency_key: str | None
    max_attempts: int
    lease_s: float
    delay_s: float = 0.0
    run_at_epoch_s: float | None = None
    quarantine_after: int | None = None
    tenant: str | None = None
    trace_context: str | None = None
    parent_id: str | None = None
    queue: str = "default"
    priority: int = 0
    fair_key: str | None = None
    ckey: str | None = None
    ckey_max: int | None = None
    rate_key: str | None = None
    debounce_key: str | None = None
    debounce_s: float = 0.0
    debounce_max_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """Per-task result of :meth:`Ledger.submit`: the id, and whether a row was written."""

    task_id: str
    created: bool


@fast_init
@dataclass(frozen=True, slots=True)
class StepRecord:
    """A committed step: its JSON result and the generation that committed it.

    Attributes:
        name: stored checkpoint name: the step's name for its first occurrence in the
            task's code path, ``name#N`` for the N-th (DESIGN §5, occurrences).
        result_json: the step's JSON result.
        generation: fencing token of the claim that committed it.
        committed_at: ledger clock, epoch seconds.
        seq: 0-based position of the checkpoint among all steps and effects of the task
            (None for rows written by a release that did not record it).
    """

    name: str
    result_json: str
    generation: int
    committed_at: float
    seq: int | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class EffectRecord:
    """The ledger's record of one effect of a task."""

    name: str
    key: str
    params_digest: str
    state: EffectState | StoredState
    """A :class:`~ratchet.storedtext.StoredState` when the row holds a value that is not a
    known effect state (shown as stored; settled by nothing)."""
    result_json: str | None
    generation: int
    attempt: int
    calls: int
    via_lookup: bool
    updated_at: float
    seq: int | None = None
    """0-based position among the task's checkpoints (None: written without one)."""


@dataclass(frozen=True, slots=True)
class TaskEffect:
    """One effect record with the task it belongs to (:meth:`Ledger.effects_of_type`).

    Attributes:
        task_id: the task. task_state: its state now. task_generation: its current
            fencing generation. task_created_at: when it was submitted (ledger clock,
            epoch seconds; the walk's order and cursor).
        effect: the effect record.
    """

    task_id: str
    task_state: State | StoredState
    task_generation: int
    task_created_at: float
    effect: EffectRecord


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A snapshot of one task row."""

    task_id: str
    name: str
    version: int
    state: State | StoredState
    """The task's state; a :class:`~ratchet.storedtext.StoredState` (as stored, with
    ``"state"`` in :attr:`undecodable`) when the row holds a value that is not a known
    state: such a row is never claimed or moved."""
    generation: int
    attempt: int
    max_attempts: int
    holder: str | None
    lease_until: float | None
    run_at: float
    created_at: float
    updated_at: float
    idempotency_key: str | None
    params: Any
    params_digest: str
    result: Any
    last_error: str | None
    error_class: str | None
    tenant: str | None = None
    quarantined: bool = False
    """A ``FAILED`` task taken out of the retry path (DESIGN §7; ``ratchet quarantine``)."""
    undecodable: tuple[str, ...] = ()
    """The fields whose stored value could not be decoded and are shown as stored: text
    that is not valid UTF-8 (a :class:`~ratchet.storedtext.UndecodableText`, ``\\x``
    escapes for the bytes), JSON that is not (a :class:`~ratchet.serde.Undecodable`), or
    a state that is not a known one (``"state"``, a
    :class:`~ratchet.storedtext.StoredState`)."""
    last_traceback: str | None = None
    """The traceback of :attr:`last_error` (None when it has none). Read by ``get``,
    ``get_many`` and ``timeline``; None in lists (:meth:`Ledger.list_tasks`)."""
    parent_id: str | None = None
    """The task that submitted this one from its body (``ctx.submit``), or None. Read by
    ``get``, ``get_many``, ``timeline`` and ``children``; None in lists."""
    waiting_for: str | None = None
    """What a ``WAITING`` task waits for, for people (``"sleep until
    2026-12-04T11:30:00Z"``, ``"event shipped/order-7"``, ``"3 children"``): set by the
    control API's reads (:meth:`ratchet.Control.inspect`, ``get``, ``children``) from
    :meth:`Ledger.waits`; None from the ledger's own reads and for a task not waiting."""
    queue: str = "default"
    """The named queue the task is in (DESIGN §8, flow control)."""
    priority: int = 0
    """Its priority within its queue (higher first)."""
    ckey: str | None = None
    """Its concurrency key (``@app.task(concurrency_key=...)``), or None."""
    key_slot: bool = False
    """Whether it holds one of its concurrency key's slots."""
    rate_key: str | None = None
    """The rate-limit bucket key its submit computed, or None (one bucket, or no limit)."""
    flow_wait: str | None = None
    """Why flow control holds it back: ``"rate"`` (its ``run_at`` was moved to when its
    bucket has a token), ``"key"`` (it waits for a key slot), ``"debounce"`` (its debounce
    window is open), or None."""

    @property
    def terminal(self) -> bool:
        """True for SUCCEEDED, FAILED, CANCELLED and COMPENSATED."""
        return self.state in (State.SUCCEEDED, State.FAILED, State.CANCELLED,
                              State.COMPENSATED)


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audit row: a transition, claim, stale rejection, lookup or operator action."""

    seq: int
    task_id: str
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    generation: int | None
    holder: str | None
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """A filter and page of :meth:`Ledger.list_tasks`; None means "any".

    Attributes:
        states: task states to include.
        names: task types to include.
        key: the submit idempotency key.
        created_from, created_to: ``created_from <= created_at < created_to``, ledger-clock
            epoch seconds.
        limit: at most this many tasks (>= 1).
        after: ``(created_at, task_id)`` of the last task of the previous page.
    """

    states: tuple[State, ...] | None = None
    names: tuple[str, ...] | None = None
    key: str | None = None
    created_from: float | None = None
    created_to: float | None = None
    limit: int = 50
    after: tuple[float, str] | None = None


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything the ledger knows about one task (``ratchet inspect``)."""

    task: TaskInfo
    events: list[AuditEvent]
    steps: list[StepRecord]
    effects: list[EffectRecord]
    late_effects: list[LateEffect] = field(default_factory=list)
    """Calls stale holders sent after a takeover (possible duplicates), newest first."""


LATE_POSSIBLE_DUPLICATE = "possible_duplicate"
"""A late effect's kind: it may have executed a second time (check the target)."""


LATE_ACCOUNTED_FOR = "accounted_for"
"""A late effect's kind: its request was the only one sent, and the new holder's lookup
found its execution and settled the effect with it (no second call)."""


@dataclass(frozen=True, slots=True)
class LateEffect:
    """A call that a stale holder sent after its claim had been taken over (DESIGN §5).

    Append-only evidence of a possible duplicate at a target that cannot deduplicate on
    its own (a lookup-only target and a sender frozen between its lease check and its
    send): no fence rejects these rows.

    Attributes:
        seq: ledger-assigned sequence number (0 before it is stored).
        task_id: the task.
        effect: stored checkpoint name of the effect (``name`` or ``name#N``).
        key: the business idempotency key the call carried.
        generation: the stale holder's fencing token.
        holder: the stale holder.
        at: ledger clock when it was recorded, epoch seconds.
        outcome: ``"done"`` (the call returned) or ``"unknown"`` (it raised; it may have
            executed).
        detail: the call's JSON result, or the error text.
        kind: :data:`LATE_ACCOUNTED_FOR` when the effect's current record was settled by
            a lookup hit and only one intent was ever recorded for it (so only one request
            was ever sent: the late one, which the hit found; the new holder did not call),
            else :data:`LATE_POSSIBLE_DUPLICATE`. Derived when read, from the record as it
            is then: a late effect recorded before the new holder's lookup settled the
            record is a possible duplicate until it does.
    """

    seq: int
    task_id: str
    effect: str
    key: str
    generation: int
    holder: str
    at: float
    outcome: str
    detail: str | None
    kind: str = LATE_POSSIBLE_DUPLICATE
