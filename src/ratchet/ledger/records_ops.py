"""The records of operator actions and their answers: resolve, cancel / retry
(:class:`ControlOutcome`), pauses, quarantine replays, concurrency limits and their live
use, prunes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..states import State

__all__ = [
    "ControlOutcome",
    "ControlRequest",
    "Limit",
    "LimitScope",
    "PauseRecord",
    "PauseResult",
    "PruneReport",
    "QuarantineGroup",
    "ReplayedTask",
    "ResolveOutcome",
    "SlotUsage",
]


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
        events: events of the mailbox sent before the cutoff, deleted (0 in a dry run,
            which counts finished tasks only).
        outbox: outbox messages sent (confirmed by the broker) before the cutoff,
            deleted (in a dry run: that would be). Unsent messages are never pruned,
            whatever their age.
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
    events: int = 0
    outbox: int = 0
