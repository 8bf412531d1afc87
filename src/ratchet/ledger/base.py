"""The ledger contract (DESIGN §10): named, batched operations; callers never see SQL.

Every operation is one short transaction. Writes on behalf of a task carry the task's
fencing generation and are checked against the ledger row inside that transaction; a
write whose generation is not current changes nothing, is audited as ``stale_rejected``
and is reported back per task (:attr:`CommitOutcome.stale`). All time that decides
correctness (``lease_until``, ``run_at``) is the ledger's clock, read inside the
transaction — never a worker's clock.

Operations take and return batches so that group commit (several tasks' writes in one
transaction, one fsync) never changes a caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any, Protocol, TypeVar, runtime_checkable

from ..config import LedgerConfig
from ..errors import LedgerCorrupt
from ..states import State
from ..storedtext import StoredState
from ..validation import MAX_VERSION

__all__ = [
    "MAX_VERSION",
    "RECENT_FRACTION",
    "AuditEvent",
    "BudgetUse",
    "Claim",
    "ClaimKind",
    "DefinitionChange",
    "DefinitionRecord",
    "DefinitionSpec",
    "CommitOutcome",
    "ControlOutcome",
    "ControlRequest",
    "PauseRecord",
    "PauseResult",
    "EffectRecord",
    "EffectState",
    "EffectWrite",
    "LATE_ACCOUNTED_FOR",
    "LATE_POSSIBLE_DUPLICATE",
    "LateEffect",
    "Ledger",
    "Limit",
    "LimitScope",
    "LedgerStats",
    "NewTask",
    "PruneReport",
    "QuarantineGroup",
    "RenewResult",
    "ReplayedTask",
    "SlotUsage",
    "ResolveOutcome",
    "StepRecord",
    "SubmitResult",
    "Subscription",
    "TaskInfo",
    "TaskQuery",
    "TaskEffect",
    "TaskWrite",
    "ThroughputCount",
    "Timeline",
    "TypeCapacity",
    "Transition",
    "VersionBacklog",
    "WorkerInfo",
    "claim_kinds",
]


_R = TypeVar("_R")


class _Factory:
    """Default of a field with a ``default_factory`` in a :func:`_fast_init` signature."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _fast_init(cls: type[_R]) -> type[_R]:
    """Give a frozen, slotted dataclass a faster ``__init__`` (records built per task).

    The ``__init__`` dataclasses generates for a frozen class stores every field with
    ``object.__setattr__`` (a global and an attribute lookup, then the generic setter);
    this one calls each slot's own descriptor, about twice as fast. Same signature,
    defaults and default factories; instances stay frozen (assignment still raises
    ``FrozenInstanceError``) and compare and hash as before.

    Raises:
        TypeError: ``cls`` is not a frozen slotted dataclass with plain positional fields
            and no ``__post_init__`` (checked at import).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if (params is None or not params.frozen or "__slots__" not in cls.__dict__
            or hasattr(cls, "__post_init__")):
        raise TypeError(f"_fast_init needs a frozen slotted dataclass, got {cls.__name__}")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    args: list[str] = []
    body: list[str] = []
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only:
            raise TypeError(f"_fast_init: field {cls.__name__}.{f.name} is not a plain one")
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        value = f.name
        if f.default is not MISSING:
            namespace[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_FACTORY")
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            args.append(f.name)
        body.append(f"    _set_{f.name}(self, {value})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body) + "\n"
    exec(source, namespace)  # built from the field names above only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


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


class ResolveOutcome(StrEnum):
    """An operator's verdict on an ``UNKNOWN`` effect."""

    DONE = "done"
    NOT_DONE = "not-done"
    GIVE_UP = "give-up"
    """The operator gives up on the task: ``UNKNOWN`` -> ``FAILED`` with their reason; the
    open effects are marked ``given_up`` (their outcome stays unknown)."""


class ControlRequest(StrEnum):
    """An operator's request to the holder of a ``RUNNING`` task (``tasks.control_request``),
    applied at the holder's next step/effect boundary (DESIGN §3, arbitration)."""

    CANCEL = "cancel"
    """End the task ``CANCELLED`` (fenced, by its holder or by the ledger)."""
    PAUSE = "pause"
    """Stop the task at a boundary, release the lease (attempt handed back): ``PAUSED``."""


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """What an operator command did to one task (``ratchet cancel`` / ``retry``).

    Attributes:
        task_id: the task.
        action: ``"cancel"``, ``"retry"``, ...
        outcome: ``"done"`` (the task moved now), ``"requested"`` (a request was recorded:
            its holder, or the ledger once the lease is gone, or the resolution of an open
            effect, applies it) or ``"unchanged"`` (nothing to do: e.g. the task had
            already finished; ``message`` says why).
        previous_state: the state the command found.
        state: the state after the command.
        generation: the task's fencing generation after the command.
        message: one line for people.
    """

    task_id: str
    action: str
    outcome: str
    previous_state: State
    state: State
    generation: int
    message: str


@dataclass(frozen=True, slots=True)
class PauseRecord:
    """One pause (``pauses`` table): a versioned, audited record (DESIGN §8).

    Attributes:
        pause_id: the record's id.
        scope: ``"all"``, ``"type"`` or ``"task"``.
        target: ``""`` (all), the task type, or the task id.
        version: the ledger's control version when it was made (grows with every pause
            and resume).
        paused_by, reason: who paused, and why.
        created_at: ledger clock, epoch seconds.
        running: RUNNING tasks in its scope, still short of a safe boundary (they stop at
            their next one and become ``PAUSED``); filled by :meth:`Ledger.pauses`.
        resumed_at, resumed_by, resume_reason, resumed_version: the resume, once made.
    """

    pause_id: int
    scope: str
    target: str
    version: int
    paused_by: str
    reason: str
    created_at: float
    running: int = 0
    resumed_at: float | None = None
    resumed_by: str | None = None
    resume_reason: str | None = None
    resumed_version: int | None = None


@dataclass(frozen=True, slots=True)
class PauseResult:
    """What ``ratchet pause`` / ``resume`` did.

    Attributes:
        action: ``"pause"`` or ``"resume"``.
        outcome: ``"done"``, or ``"unchanged"`` (already paused / nothing to resume /
            a finished task; ``message`` says which).
        pauses: the records made (pause) or ended (resume); for an unchanged pause, the
            active record that already covers the scope.
        tasks: tasks moved now: ``PAUSED`` by a pause (one task, not running), back to
            ``PENDING`` by a resume.
        running: RUNNING tasks asked to stop at their next boundary (pause).
        message: one line for people.
    """

    action: str
    outcome: str
    pauses: list[PauseRecord]
    tasks: int
    running: int
    message: str


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


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """Per-task result of :meth:`Ledger.submit`: the id, and whether a row was written."""

    task_id: str
    created: bool


@_fast_init
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


@_fast_init
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


@_fast_init
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


@_fast_init
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


@_fast_init
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


@_fast_init
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


@_fast_init
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


@_fast_init
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
    """

    task_id: str
    generation: int
    holder: str
    operation: str
    steps: Sequence[tuple[str, str, int | None] | tuple[str, str]] = ()
    effects: Sequence[EffectWrite] = ()
    transition: Transition | None = None


@_fast_init
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

    @property
    def terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED."""
        return self.state in (State.SUCCEEDED, State.FAILED, State.CANCELLED)


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
class PruneReport:
    """What a prune deleted, or would delete (``ratchet prune``, DESIGN §10.2).

    Attributes:
        older_than_s: the age asked for, seconds: tasks finished (``SUCCEEDED``,
            ``FAILED``, ``CANCELLED``) longer ago than this are pruned.
        cutoff: ``ledger now - older_than_s``, ledger-clock epoch seconds: tasks whose
            finish time is before it.
        dry_run: nothing was deleted; the counts are what a prune would delete now.
        tasks, steps, effects, late_effects, audit: rows deleted (or, in a dry run, that
            would be); ``audit`` includes rows older than the cutoff whose task was gone.
        batches: transactions that deleted something (0 in a dry run).
        exported: tasks written to the export before their deletion (0 without one).
        by: who pruned (an operator's name, or a worker's holder identity).
        elapsed_s: wall-clock seconds the prune took.
    """

    older_than_s: float
    cutoff: float
    dry_run: bool
    tasks: int
    steps: int
    effects: int
    late_effects: int
    audit: int
    batches: int
    exported: int
    by: str
    elapsed_s: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """Everything the ledger knows about one task (``ratchet inspect``)."""

    task: TaskInfo
    events: list[AuditEvent]
    steps: list[StepRecord]
    effects: list[EffectRecord]
    late_effects: list[LateEffect] = field(default_factory=list)
    """Calls stale holders sent after a takeover (possible duplicates), newest first."""


@dataclass(frozen=True, slots=True)
class QuarantineGroup:
    """Quarantined ``FAILED`` tasks of one error fingerprint and task type (DESIGN §7).

    Attributes:
        fingerprint: the error fingerprint (:mod:`ratchet.fingerprint`).
        name: the task type.
        count: quarantined tasks with it.
        first_at, last_at: ledger clock of the first and the latest quarantine, epoch s.
        error_class: the recorded failure class of the newest one (``lease_expired`` for
            a worker that died).
        example_error: the newest one's recorded error (``Type: message``).
        task_ids: up to ``per_group`` task ids, newest quarantine first.
    """

    fingerprint: str
    name: str
    count: int
    first_at: float
    last_at: float
    error_class: str | None
    example_error: str | None
    task_ids: list[str]


@dataclass(frozen=True, slots=True)
class ReplayedTask:
    """A quarantined task a replay re-queued (or, in a dry run, would re-queue).

    Attributes:
        task_id, name: the task.
        run_at: ledger-clock epoch seconds at which it becomes ready (staggered by the
            replay's rate).
        failures, crashes: the streak and the dead-worker deliveries it was quarantined
            with (reset to 0 by the replay).
    """

    task_id: str
    name: str
    run_at: float
    failures: int
    crashes: int


@dataclass(frozen=True, slots=True)
class LedgerStats:
    """Aggregates for ``ratchet status``.

    Attributes:
        counts: ``{task name: {state: count}}``, what the ledger holds (DESIGN §9: exact,
            without reading the history).
        oldest_pending_age_s: age of the oldest ready PENDING/RETRY_WAIT task, seconds.
        unknown_count: tasks in ``UNKNOWN``.
        claims, takeovers, stale_rejections, lookup_hits, idempotency_conflicts,
        operator_actions: audit rows of each kind ever written (kept when a prune
            deletes the rows).
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


class LimitScope(StrEnum):
    """What a concurrency limit applies to (bulkheads, DESIGN §8)."""

    TOTAL = "total"
    """The cluster's slots: every RUNNING task takes one (``name`` is ``""``)."""
    TYPE = "type"
    """The RUNNING tasks of one task type (``name`` is the task name)."""
    TENANT = "tenant"
    """The RUNNING tasks of one tenant, whatever their type (``name`` is the tenant)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One cluster-wide concurrency limit, as stored in the ledger's ``limits`` table.

    Attributes:
        scope: what it applies to.
        name: the task type or tenant; ``""`` for :attr:`LimitScope.TOTAL`.
        reserved: slots of the total kept for this scope while it has ready work (0 for the
            total itself); only meaningful when a total is set.
        maximum: at most this many RUNNING tasks of the scope at any instant (``None``: no
            cap); for the total, the number of slots.
        version: how many times this row was set (1 for a new row).
        updated_at: ledger clock of the last change, epoch seconds.
        updated_by: the operator who set it; reason: why (both also in the audit log).
    """

    scope: LimitScope
    name: str
    reserved: int
    maximum: int | None
    version: int
    updated_at: float
    updated_by: str
    reason: str


@dataclass(frozen=True, slots=True)
class SlotUsage:
    """The live use of slots (``ratchet limits``): RUNNING and ready tasks per
    ``(task name, tenant)`` (tenant ``None`` for tasks submitted without one).

    Attributes:
        running: RUNNING tasks (leased, whether or not the lease has expired: a slot is held
            until the holder's fenced write, a takeover or a revocation).
        ready: ready PENDING / RETRY_WAIT tasks (``run_at <= ledger_now``).
        oldest_ready_at: the oldest ready task's ``run_at``, epoch seconds.
        ledger_now: the ledger clock of the read.
    """

    running: dict[tuple[str, str | None], int]
    ready: dict[tuple[str, str | None], int]
    oldest_ready_at: dict[tuple[str, str | None], float]
    ledger_now: float


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


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker process in the registry (fast takeover of dead holders).

    Attributes:
        holder: the worker's lease-holder identity (unique per process start).
        host_id: identity of the host *and* PID namespace the process runs in (machine id,
            boot id, pid namespace): two workers with the same ``host_id`` can see each
            other's processes, so one may judge whether the other is alive.
        hostname: for people.
        pid: the process id, within ``host_id``'s PID namespace.
        pid_start: the process start time as the kernel reports it (``/proc/PID/stat``
            field 22, clock ticks since boot), so a recycled pid is not mistaken for the
            worker; ``None`` where unknown.
        started_at, last_seen: ledger clock, epoch seconds (``last_seen`` is the last
            registry heartbeat).
        state: ``alive``, ``stopped`` (clean exit) or ``dead`` (revoked).
    """

    holder: str
    host_id: str
    hostname: str
    pid: int
    pid_start: str | None
    started_at: float = 0.0
    last_seen: float = 0.0
    state: str = "alive"


ClaimKind = str | tuple[str, int]
"""What a claim asks for: ``(name, version)`` (a worker sends one pair per definition it
has, DESIGN §8), or a bare name: every version of it (tools and tests)."""


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


@dataclass(frozen=True, slots=True)
class DefinitionSpec:
    """One definition a worker registers (:meth:`Ledger.register_definitions`).

    Attributes:
        name, version: the task type and its definition version.
        spec_json: the definition's spec as JSON text (``TaskDefinition.spec()``: retry
            policy, ``lease_s``, params JSON Schema; extensible).
    """

    name: str
    version: int
    spec_json: str


@dataclass(frozen=True, slots=True)
class DefinitionChange:
    """A registration that replaced a different stored spec of the same (name, version).

    Attributes:
        name, version: the definition.
        differences: the top-level spec keys whose values differ, sorted.
        old_spec_json, new_spec_json: the spec before and after.
    """

    name: str
    version: int
    differences: tuple[str, ...]
    old_spec_json: str
    new_spec_json: str


@dataclass(frozen=True, slots=True)
class DefinitionRecord:
    """One stored definition (:meth:`Ledger.definitions`).

    Attributes:
        name, version: the definition.
        spec_json: its spec, JSON text.
        first_registered_at, last_registered_at: ledger clock, epoch seconds.
        live_workers: workers alive in the registry, seen within the liveness window,
            that have this (name, version).
    """

    name: str
    version: int
    spec_json: str
    first_registered_at: float
    last_registered_at: float
    live_workers: int = 0


@dataclass(frozen=True, slots=True)
class VersionBacklog:
    """Ready tasks (``PENDING`` / ``RETRY_WAIT``) of one (name, version).

    Attributes:
        name, version: the pinned definition.
        ready: how many are ready or scheduled (``run_at`` may be in the future).
        oldest_run_at: the earliest ``run_at`` among them, epoch seconds.
        live_workers: live registered workers that have this version (0: the tasks wait
            until one starts).
    """

    name: str
    version: int
    ready: int
    oldest_run_at: float
    live_workers: int


class Subscription(Protocol):
    """A wake-up subscription returned by :meth:`Ledger.subscribe`."""

    def close(self) -> None:
        """Stop calling back; release the connection or thread behind it."""
        ...


@runtime_checkable
class Ledger(Protocol):
    """The storage contract every backend implements (:class:`~ratchet.ledger.engine.
    LedgerEngine` over the SQLite and PostgreSQL dialects).

    Implementations must be safe to call from several threads; each method is one
    transaction. Errors from the driver surface as :class:`~ratchet.errors.LedgerError`:
    ``LedgerUnavailable`` for connection trouble, ``WriteRejected`` for a write the
    database refuses for its content. Reads never fail on stored JSON they cannot decode
    (``TaskInfo.params`` / ``.result`` then hold an
    :class:`~ratchet.serde.Undecodable`).
    """

    config: LedgerConfig

    def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version.

        Raises:
            SchemaTooNew: the ledger has a newer schema (it is left untouched).
        """
        ...

    def schema_version(self) -> int:
        """The ledger's current schema version (0 for an empty ledger)."""
        ...

    def now(self) -> float:
        """The ledger clock, epoch seconds."""
        ...

    @property
    def corruption(self) -> LedgerCorrupt | None:
        """The last :class:`~ratchet.errors.LedgerCorrupt` any call of this object raised
        (None while none did): a damaged page fails only the calls that read it, so a
        health check that reads little asks this too."""
        ...

    def submit(self, tasks: Sequence[NewTask]) -> list[SubmitResult]:
        """Insert tasks, deduplicated per idempotency key, all-or-nothing.

        Same key + same digest returns the existing id (``created=False``), writing nothing.

        Raises:
            IdempotencyConflict: a key exists with another digest (nothing is written;
                the conflict is counted in the audit log).
            WriteRejected: the database refused a row for its content (nothing is written).
        """
        ...

    def claim(self, holder: str, names: Sequence[ClaimKind], limit: int) -> list[Claim]:
        """Lease up to ``limit`` ready tasks (or expired leases) of the given kinds: a
        ``(name, version)`` pair claims only tasks that pinned that version (DESIGN §8), a
        bare name every version of it (:data:`ClaimKind`).

        Each claim sets ``holder``, ``lease_until = ledger_now + lease_s`` and
        ``generation + 1`` in one transaction, with an audit row per task.
        """
        ...

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """Extend every ``(task_id, generation)`` lease that ``holder`` still holds.

        A lease renews only if the task is RUNNING at that generation for that holder and
        ``lease_until`` has not passed by the ledger clock. The holder's registry heartbeat
        (``workers.last_seen``) moves to ledger-now in the same transaction. A lease whose
        task row another transaction holds locked (PostgreSQL: a transaction step running
        its user code) is not waited for: it is reported ``ok`` at its current, unextended
        ``lease_until``, and the next renewal extends it.
        """
        ...

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """Commit several tasks' steps, effects and transitions in one transaction.

        Each task's writes are fenced on its generation; a stale task's writes change
        nothing and are audited (``stale_rejected``) without affecting the other tasks.
        When the reply to ``COMMIT`` is lost, the writes are re-sent once; what the lost
        transaction applied is acknowledged (``ok``), not reported stale.

        Raises:
            IllegalTransition: a transition is not in the table (nothing is written).
            WriteRejected: the database refused a write of the batch for its content (a
                value over an index row's limit, ...). Raised for the whole call and
                nothing is written; the message names the statement and the batch's
                writes. A caller isolates the bad write by committing the writes one by
                one (the worker's writer does).
            LedgerUnavailable: the ledger cannot be reached.
        """
        ...

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[ClaimKind], limit: int
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """:meth:`commit` then :meth:`claim` in one transaction: a worker whose tasks just
        finished claims their successors with the same fsync. Same fencing and errors."""
        ...

    def register_definitions(
        self, holder: str, definitions: Sequence[DefinitionSpec]
    ) -> list[DefinitionChange]:
        """Record the definitions a starting worker has (DESIGN §8), in one transaction:
        each (name, version) is inserted or its ``last_registered_at`` moved to ledger-now,
        and ``holder``'s set of (name, version) pairs is replaced by these.

        A (name, version) stored with a *different* spec is replaced by the new one (the
        newest registration wins), audited (``definition_changed``, task id
        ``definition:NAME:VERSION``, with both specs) and returned, so the worker logs a
        warning naming the differences. Nothing is refused: a changed retry policy or
        lease under the same version is an operator's decision; a changed params schema
        should come with a new version.

        Returns:
            The changes, one per (name, version) whose spec differed.
        """
        ...

    def definitions(self, live_within_s: float) -> list[DefinitionRecord]:
        """Every stored definition by (name, version), with how many registered workers
        that are ``alive`` and were seen within ``live_within_s`` seconds have it."""
        ...

    def version_backlog(self, live_within_s: float) -> list[VersionBacklog]:
        """Ready tasks per (name, version) with the live workers that have each version
        (``ratchet status``: a version no live worker has waits, never fails)."""
        ...

    def resolve(
        self,
        task_id: str,
        outcome: ResolveOutcome,
        reason: str,
        operator: str,
        result_json: str | None = None,
    ) -> TaskInfo:
        """Settle an ``UNKNOWN`` task's open effect and make the task ready again (audited).

        Raises:
            TaskNotFound: no such task.
            IllegalTransition: the task is not ``UNKNOWN``.
        """
        ...

    # -- operator control (issue 10; DESIGN §3 arbitration, §8)

    def cancel(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """Cancel a task, audited (``operator``, ``reason``, ledger time), one transaction.

        ``PENDING`` / ``RETRY_WAIT`` / ``PAUSED`` without an open effect intent:
        ``CANCELLED`` at once, ``generation + 1`` (an older holder's write never applies).
        ``RUNNING``: a ``cancel`` request is recorded (``outcome="requested"``) and the
        holder applies it at its next boundary (fenced); a lease already expired without
        an open intent is cancelled at once. With an open effect intent (any state but a
        terminal one) or ``UNKNOWN``: the request is recorded and applied once the
        intent is settled (by the next holder's lookup, or by ``resolve``). A terminal task
        is unchanged (``outcome="unchanged"``).

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def retry(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """Run a ``FAILED`` (dead-lettered) task again, audited: ``FAILED -> PENDING``, the
        only move out of ``FAILED`` (an operator move, DESIGN §3), with the attempt counter
        reset (a fresh set of ``max_attempts``), generation + 1, ready now. Its history is
        kept: audit, steps (done steps stay done), effects. Any other state is unchanged
        (``outcome="unchanged"``).

        Raises:
            TaskNotFound: no such task.
        """
        ...

    def pause(self, scope: str, target: str, reason: str, operator: str) -> PauseResult:
        """Pause everything (``scope="all"``, ``target=""``), a task type (``"type"``) or
        one task (``"task"``), audited (``operator_pause``), one transaction.

        From the commit on, no new attempt starts in the scope (every claim reads the
        active pauses under a gate this transaction takes: PostgreSQL's advisory lock,
        SQLite's write lock). Running tasks in scope are asked to stop at their next
        boundary (they become ``PAUSED``, attempt handed back); one task that is not
        running is ``PAUSED`` at once (generation + 1). A scope already paused is
        ``unchanged``.

        Raises:
            InvalidArguments: unknown scope. TaskNotFound: no such task (``"task"``).
        """
        ...

    def resume(self, scope: str, target: str, reason: str, operator: str,
               rate_per_s: float | None = None) -> PauseResult:
        """End the active pause of ``scope`` / ``target`` (audited, ``operator_resume``):
        its ``PAUSED`` tasks not covered by another active pause go back to ``PENDING``,
        ready at ``now + i / rate_per_s`` for the i-th (all at once when None); pending
        pause requests of the scope are cleared. Nothing active: ``unchanged``."""
        ...

    def pauses(self) -> list[PauseRecord]:
        """The active pauses, oldest first, each with the RUNNING tasks in its scope."""
        ...

    def control_requests(self, holder: str) -> list[tuple[str, int, str]]:
        """``(task_id, generation, request)`` of every ``RUNNING`` task ``holder`` holds
        that carries an operator request (a read; the heartbeat polls it)."""
        ...

    def get(self, task_id: str) -> TaskInfo:
        """Read one task. Raises :class:`~ratchet.errors.TaskNotFound`."""
        ...

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """Read several tasks (missing ids are skipped)."""
        ...

    def list_tasks(self, query: TaskQuery) -> list[TaskInfo]:
        """Tasks matching ``query``, newest first (``created_at``, then id, descending), at
        most ``query.limit``; the next page starts after the last one returned."""
        ...

    def timeline(self, task_id: str) -> Timeline:
        """The task, its audit events, steps and effects. Raises ``TaskNotFound``."""
        ...

    def stats(self, window_s: float | None = None) -> LedgerStats:
        """Aggregates for ``ratchet status``; with ``window_s`` (seconds > 0) also the
        per-type :attr:`LedgerStats.capacity` over that window, in the same transaction."""
        ...

    def throughput(self, window_s: float, bucket_s: float,
                   name: str | None = None) -> list[ThroughputCount]:
        """Arrivals and completions per ``bucket_s`` seconds over the last ``window_s``
        seconds of the ledger clock (rounded up to whole buckets, the last one ending
        now), oldest first, every bucket present; ``name``: one task type only. Reads the
        window's rows only (``tasks_created``, ``tasks_finished``)."""
        ...

    def prune(
        self,
        older_than_s: float,
        *,
        by: str,
        dry_run: bool = False,
        batch_size: int = 500,
        export: Callable[[list[dict[str, Any]]], None] | None = None,
        audit_empty: bool = True,
        pace: float | None = None,
    ) -> PruneReport:
        """Delete finished tasks older than ``older_than_s`` with their steps, effects,
        late effects and audit rows, in batches of ``batch_size`` tasks, each its own
        short transaction; then audit rows older than the age whose task is gone. A dry
        run only counts. ``export(records)`` is called in each batch's transaction before
        its delete, with one JSON-ready record per task (row and history); if it raises,
        the batch is rolled back and the prune stops. The prune is audited (kind
        ``prune``) unless it is a dry run, or deleted nothing and ``audit_empty`` is off.
        Between batches it sleeps ``pace`` times the batch's duration (default: 1 where one
        writer holds the whole database, SQLite; else 0). Never deletes a task that is not
        terminal. See DESIGN §10.2.
        """
        ...

    def record_late_effect(self, late: LateEffect) -> None:
        """Append ``late`` (its ``seq`` and ``at`` are set by the ledger) and a
        ``late_effect`` audit row, in one transaction. Unfenced: a stale holder's evidence
        is always kept.

        Raises:
            LedgerUnavailable: the ledger cannot be reached.
        """
        ...

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffect]:
        """Late effects, newest first: of ``task_id``, or of every task (at most ``limit``)."""
        ...

    def effects_of_type(
        self, name: str, created_from: float | None, limit: int,
        after: tuple[float, str, str] | None = None,
    ) -> list[TaskEffect]:
        """The effect records of tasks of type ``name`` submitted at or after
        ``created_from`` (None: any time), newest task first and by effect name within a
        task, at most ``limit``; ``after`` is the ``(task_created_at, task_id, effect
        name)`` of the last row of the previous page (keyset pagination)."""
        ...

    def late_effects_of_type(
        self, name: str, since: float | None, limit: int
    ) -> list[LateEffect]:
        """Late effects of tasks of type ``name`` recorded at or after ``since`` (None: any
        time), newest first, at most ``limit``."""
        ...

    def record_reconcile(
        self, name: str, operator: str, summary_json: str,
        findings: Sequence[tuple[str, str, int | None, str]],
    ) -> None:
        """Audit one reconcile run in one transaction: a ``reconcile`` row (task id
        ``reconcile:<name>``, holder ``operator``, detail ``summary_json``) and one row per
        finding ``(task_id, kind, generation, detail_json)`` on the task it is about
        (DESIGN §5, reconciliation)."""
        ...

    def audit_kind_counts(self) -> dict[str, int]:
        """Audit rows ever written per kind (kept when prune deletes the rows; the rollup
        plus the rows since the counts mark, as :meth:`stats` reads them)."""
        ...

    def subscribe(self, on_ready: Callable[[], None]) -> Subscription:
        """Call ``on_ready()`` (from another thread) when a task may have become ready.

        A hint only: callers still claim, and still poll as the fallback. PostgreSQL uses
        LISTEN/NOTIFY; SQLite has no server to notify and returns a subscription that never
        calls back.
        """
        ...

    def register_worker(self, info: WorkerInfo) -> None:
        """Record a worker process in the registry (``state = alive``, ``last_seen = now``)."""
        ...

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """Registry heartbeat: set ``last_seen = now`` and ``state`` (``stopped`` on a clean
        exit). A worker already marked ``dead`` stays dead."""
        ...

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """Live workers registered with ``host_id``, or every registered worker if None."""
        ...

    def worker_definition_specs(self) -> list[tuple[str, str]]:
        """``(holder, spec JSON)`` of every definition each registered worker has (the
        ``worker_definitions`` rows joined with ``definitions``; ``ratchet workers`` reads
        their ``lease_s``). None on a ledger not yet migrated to the definition tables."""
        ...

    def prune_workers(self, older_than_s: float) -> list[str]:
        """Delete the registry rows of workers ``stopped`` or ``dead`` whose last heartbeat
        is more than ``older_than_s`` seconds old (ledger clock), with their definition
        rows; ``alive`` rows are never deleted. Returns the holders deleted. One short
        transaction over the registry only (no task row)."""
        ...

    def quarantine_groups(self, limit: int = 100, per_group: int = 5) -> list[QuarantineGroup]:
        """Quarantined ``FAILED`` tasks grouped by (fingerprint, task type), the most
        recently quarantined group first; at most ``limit`` groups, ``per_group`` sample
        task ids each (DESIGN §7)."""
        ...

    def quarantine_replay(
        self, fingerprint: str, rate_per_s: float, operator: str, reason: str,
        dry_run: bool = False, limit: int = 10_000,
    ) -> list[ReplayedTask]:
        """Re-queue the quarantined ``FAILED`` tasks with ``fingerprint`` (oldest
        quarantine first, at most ``limit``): one transaction; each becomes ``PENDING``
        with fresh attempt counters (attempt, failure streak and crash count 0; generation
        and history kept), the i-th at ``now + i / rate_per_s``, with an
        ``operator_replay`` audit row (operator, reason, fingerprint, run_at). A dry run
        writes nothing and returns what would be replayed."""
        ...

    def limits(self) -> list[Limit]:
        """Every concurrency limit in the ledger (DESIGN §8), ordered by scope and name."""
        ...

    def set_limit(
        self, scope: LimitScope, name: str, reserved: int, maximum: int | None,
        operator: str, reason: str,
    ) -> Limit:
        """Create or replace one limit, audited (``limit_set``) in the same transaction.
        The next claim of every worker obeys it (the ledger is the only copy).

        Raises:
            InvalidArguments: the limit is inconsistent (reserved > maximum, the reserved
                slots of one kind of scope would exceed the total, ...).
        """
        ...

    def clear_limit(self, scope: LimitScope, name: str, operator: str, reason: str) -> Limit:
        """Remove one limit (audited, ``limit_cleared``); returns the removed row.

        Raises:
            InvalidArguments: there is no such limit.
        """
        ...

    def limit_changes(self, limit: int = 20) -> list[AuditEvent]:
        """The latest ``limit_set`` / ``limit_cleared`` audit events, newest first (their
        ``task_id`` is ``limit:SCOPE[:NAME]``; the detail holds operator, reason, old and
        new values)."""
        ...

    def slot_usage(self) -> SlotUsage:
        """RUNNING and ready task counts per ``(name, tenant)`` (read-only)."""
        ...

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """Take every lease ``holder`` holds away from it, authoritatively.

        One transaction: each RUNNING task of ``holder`` gets ``generation + 1`` and becomes
        ``RETRY_WAIT`` ready now (the crashed run counts as an attempt), or is retired like an
        expired final attempt (``FAILED``, or ``UNKNOWN`` with an open effect intent); an
        audit row ``revoke`` per task; the worker is marked ``dead``. Whatever the holder
        still writes is fenced out. Only a worker that has *seen* the holder's process gone
        on the same host calls this (DESIGN: fast takeover); elsewhere leases expire.

        Returns:
            the ids of the tasks taken away.
        """
        ...

    def close(self) -> None:
        """Close every connection this object opened."""
        ...

    def transaction_step(
        self, write: TaskWrite, fn: Callable[[Any], tuple[Any, ...]]
    ) -> tuple[CommitOutcome, tuple[Any, ...] | None]:
        """Run ``fn`` inside one fenced transaction of the ledger's own database and commit
        its writes together with a step checkpoint (``ctx.transaction``, DESIGN §5).

        In one transaction: read the task's fence under lock (PostgreSQL: the task row's
        lock; SQLite: the write lock of ``BEGIN IMMEDIATE``); if ``write.generation`` is
        not current or the task is not ``RUNNING``, write only the ``stale_rejected`` audit
        row and return the stale outcome without calling ``fn``. Otherwise call
        ``fn(conn)``, where ``conn`` is the DB-API connection of that same transaction
        (``sqlite3.Connection`` / ``psycopg.Connection``, behind a guard that refuses
        ``commit``, ``rollback``, ``close`` and ``with conn:``), then write ``write.steps``
        plus the step entry ``fn`` returns (shaped like an item of ``TaskWrite.steps``) and
        commit: the user's writes and the checkpoint commit together or not at all.

        ``fn`` may be called again (never twice with both calls committed) when the
        database rolled a transaction back for its own reasons (a deadlock, a connection
        lost before ``COMMIT``) and after a lost ``COMMIT`` reply whose transaction turned
        out not to have committed (decided by the step row at this generation). Its
        ``conn`` sees the database's default ``search_path`` on PostgreSQL. While ``fn``
        runs, SQLite's single write lock is held (every other writer waits) and PostgreSQL
        holds the task row's lock and ends a session idle longer than the ledger's
        ``idle_in_transaction_session_timeout`` (3 s), rolling it back.

        Args:
            write: the fence (``task_id``, ``generation``, ``holder``, ``operation``) and
                pipelined steps to carry; no effects, no transition.
            fn: the user's code, ``fn(conn) -> step entry``.

        Returns:
            ``(outcome, entry)``: ``entry`` is what ``fn`` returned, None when stale.

        Raises:
            ValueError: ``write`` has effects or a transition.
            TransactionMisuse: ``fn`` ended the transaction, or left it aborted (nothing
                was recorded; a permanent failure).
            Exception: what ``fn`` raised, unchanged (everything was rolled back).
            WriteRejected, LedgerUnavailable: as :meth:`commit`.
        """
        ...
