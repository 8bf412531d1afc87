"""The rows one commit segment writes, typed: steps, effect intents and outcomes,
transitions, outbox messages (:class:`Segment`). Used by the commit and by transaction steps.

The entries are TypedDicts: named and typed for the checker, and at run time the
very mappings the statements bind, so the commit path converts nothing per row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from ...outbox import NewMessage
from ...serde import dumps, printable
from ...states import State
from ..base import EffectState, TaskWrite, Transition
from ..dialect import Tx
from ..rows import AuditRow, reschedules
from .emit import write_messages

__all__ = ["IntentEntry", "OutcomeEntry", "Segment", "StepEntry", "TransitionEntry",
           "step_entry"]


class StepEntry(TypedDict):
    """A ``steps_upsert`` row: a step recorded done at ``generation``."""

    task_id: str
    name: str
    result: str
    generation: int
    seq: int | None


def step_entry(task_id: str, generation: int, step: Sequence[Any]) -> StepEntry:
    """A :attr:`TaskWrite.steps <ratchet.ledger.base.TaskWrite.steps>` item
    (``(name, result_json, seq)`` or ``(name, result_json)``) as the row it writes."""
    name, result, *rest = step
    return StepEntry(task_id=task_id, name=name, result=result, generation=generation,
                     seq=rest[0] if rest else None)


class IntentEntry(TypedDict):
    """An ``effects_intent`` row: an effect call about to be made."""

    task_id: str
    name: str
    key: str
    digest: str
    generation: int
    attempt: int
    seq: int | None


class OutcomeEntry(TypedDict):
    """An ``effects_outcome`` row: an effect call's settled outcome."""

    task_id: str
    name: str
    key: str
    digest: str
    generation: int
    attempt: int
    seq: int | None
    state: str
    result: str | None
    via_lookup: bool


class TransitionEntry(TypedDict):
    """A ``transition`` row: one fenced ``RUNNING -> state`` move (``run_at``: epoch
    seconds, or None to keep it; ``release``: the attempt is handed back; ``keep``: the
    lease stays; ``request``: the operator request the task keeps; ``flow_wait``: why
    flow control holds the task back after it, or None)."""

    id: str
    generation: int
    state: str
    run_at: float | None
    release: bool
    keep: bool
    request: str | None
    result: str | None
    error: str | None
    error_class: str | None
    traceback: str | None
    flow_wait: str | None


class Segment:
    """Fenced rows of one commit segment (each task at most once), written set-wise: one
    batch per kind of row, whatever the number of tasks."""

    def __init__(self) -> None:
        self.steps: dict[tuple[str, str], StepEntry] = {}
        self.intents: dict[tuple[str, str], IntentEntry] = {}
        self.outcomes: dict[tuple[str, str], OutcomeEntry] = {}
        self.transitions: list[TransitionEntry] = []
        self.messages: list[NewMessage] = []

    def add(self, write: TaskWrite, attempt: int, audit: list[AuditRow], now: float,
            request: str | None = None) -> None:
        """Queue the rows of one fenced write (which passed its fence); ``request``: the
        operator request the task keeps after the write's transition (if any)."""
        for step in write.steps:
            entry = step_entry(write.task_id, write.generation, step)
            self.steps[(write.task_id, entry["name"])] = entry
        for e in write.effects:
            if e.state is EffectState.INTENT:
                self.intents[(write.task_id, e.name)] = IntentEntry(
                    task_id=write.task_id, name=e.name, key=e.key, digest=e.params_digest,
                    generation=write.generation, attempt=attempt, seq=e.seq)
                continue
            self.outcomes[(write.task_id, e.name)] = OutcomeEntry(
                task_id=write.task_id, name=e.name, key=e.key, digest=e.params_digest,
                generation=write.generation, attempt=attempt, seq=e.seq,
                state=e.state.value, result=e.result_json, via_lookup=e.via_lookup)
            if e.via_lookup:
                audit.append((write.task_id, now, "lookup_hit", None, None, write.generation,
                              write.holder, dumps({"effect": e.name, "key": e.key})))
        self.messages.extend(write.outbox)
        t = write.transition
        if t is not None:
            self.transitions.append(transition_entry(write, t, now, request))

    def apply(self, tx: Tx, now: float, resend: bool) -> None:
        """Write the queued rows in ``tx``."""
        tx.batch("steps_upsert", list(self.steps.values()), now=now)
        tx.batch("effects_intent", list(self.intents.values()), now=now, resend=resend)
        tx.batch("effects_outcome", list(self.outcomes.values()), now=now)
        tx.batch("transition", self.transitions, now=now)
        write_messages(tx, self.messages)


_RELEASES = frozenset({State.PENDING, State.PAUSED, State.WAITING, State.COMPENSATING})
"""Targets that hand the attempt back: a release, a pause at a boundary, a wait (the
wake-up's claim is not a new attempt) and the start of compensation (which resets the
attempts for its own run: ``compensating_mark``)."""


def transition_entry(write: TaskWrite, t: Transition, now: float,
                     request: str | None = None) -> TransitionEntry:
    """The ``transition`` row of one fenced write. A release (to ``PENDING``) and a pause
    at a boundary (to ``PAUSED``) hand their attempt back; ``request``: the operator
    request the task keeps (``UNKNOWN``, or an open intent)."""
    return TransitionEntry(
        id=write.task_id, generation=write.generation, state=t.to.value,
        run_at=(t.run_at if t.run_at is not None
                else now + max(0.0, t.delay_s) if reschedules(t.to) else None),
        release=t.to in _RELEASES,
        keep=t.to is State.RUNNING, request=request,
        result=t.result_json, error=printable(t.error) if t.error else t.error,
        error_class=t.error_class,
        traceback=printable(t.traceback) if t.error and t.traceback else None,
        flow_wait=t.flow_wait,
    )
