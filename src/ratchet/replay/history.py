"""A task's recorded history as replay reads it: the checkpoints of its code path by
position, each with its kind, stored name and recorded value (DESIGN §5).

Built from the ledger's own record of the task (:meth:`ratchet.Control.history`): the
step and effect rows that carry a position. Rows without one are not part of the task
body's code path and are left out: the marker steps of compensation
(:data:`~ratchet.ledger.base.COMPENSABLE_STEP`, :data:`~ratchet.ledger.base.COMPENSATING_STEP`),
the effects made inside ``ctx.batches`` functions (the batch run's own checkpoint is in),
rows of a release that recorded no position. The effects the compensations made
(``compensate:<effect>``) follow the body's history in a ``COMPENSATED`` task's record and
are left out too: the body never calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger.base import BATCH_RUN_PREFIX, EffectState, Timeline
from ..worker.checkpoints import EMIT_PREFIX

__all__ = ["COMPENSATION_PREFIX", "RecordedCheckpoint", "describe_call", "recorded_history"]

COMPENSATION_PREFIX = "compensate:"
"""Stored names of the effects compensations made start with this (not the body's)."""

_LABELS: tuple[tuple[str, str, str], ...] = (
    (EMIT_PREFIX, "emit", ""),
    (BATCH_RUN_PREFIX, "batches", ""),
    ("sleep:", "sleep", ""),
    ("event-deadline:", "wait_for_event", ", its deadline"),
    ("event:", "wait_for_event", ", its event"),
    ("submit:", "submit", ""),
    ("submit_many:", "submit_many", ""),
)
"""How the workflow calls that are stored as steps are named for people: a stored name's
prefix, the ``ctx`` method that recorded it, and which of its checkpoints it is (a wait
for an event records two: its deadline at first reach, the event once delivered)."""


def describe_call(kind: str, stored_name: str, key: str | None = None) -> str:
    """A checkpoint for people, as the ``ctx`` call that makes it: ``"step 'quote'
    (occurrence 1)"``, ``"effect 'charge' (occurrence 2) key 'charge:o-7'"``, ``"sleep
    'cool-off' (occurrence 1)"``, ``"emit 'order.paid' (occurrence 1)"``,
    ``"wait_for_event 'shipped' (occurrence 1, its deadline)"``.

    Args:
        kind: ``"step"`` or ``"effect"``.
        stored_name: the stored checkpoint name (``name`` or ``name#N``).
        key: an effect's idempotency key (None for a step).
    """
    base, sep, n = stored_name.rpartition("#")
    if not (sep and n.isdigit() and base):
        base, n = stored_name, "1"
    label, note = kind, ""
    if kind == "step":
        if base == "gather":
            label, base = "gather", ""
        for prefix, name, which in _LABELS:
            if base.startswith(prefix):
                label, base, note = name, base[len(prefix):], which
                break
    where = f"(occurrence {n}{note})"
    text = f"{label} {base!r} {where}" if base else f"{label} {where}"
    return text if key is None else f"{text} key {key!r}"


@dataclass(frozen=True, slots=True)
class RecordedCheckpoint:
    """One position of a task's recorded code path.

    Attributes:
        position: 0-based position among the task's checkpoints.
        kind: ``"step"`` (steps, transaction steps, emits, sleeps, waits, children,
            batch runs) or ``"effect"``.
        stored_name: the stored name (``name`` or ``name#N``).
        value_json: the recorded value (a step's result, an effect's result), JSON text;
            None for an effect without a result.
        key: an effect's idempotency key (None for a step).
        params_digest: an effect's params digest (None for a step).
        state: an effect's state (``"done"``, ``"intent"``, ``"not_done"``,
            ``"given_up"``); None for a step.
    """

    position: int
    kind: str
    stored_name: str
    value_json: str | None
    key: str | None = None
    params_digest: str | None = None
    state: str | None = None

    def describe(self) -> str:
        """For people: :func:`describe_call` of this checkpoint."""
        return describe_call(self.kind, self.stored_name, self.key)

    @property
    def settled(self) -> bool:
        """True for a step, and for an effect whose result is recorded."""
        return self.kind == "step" or self.state == EffectState.DONE.value


def recorded_history(timeline: Timeline) -> list[RecordedCheckpoint]:
    """The checkpoints of ``timeline``'s task body, by position (see the module docstring).

    Args:
        timeline: the ledger's record of the task (:meth:`ratchet.Control.history`).

    Returns:
        The checkpoints with a position, sorted by it.
    """
    found: list[RecordedCheckpoint] = []
    for step in timeline.steps:
        if step.seq is not None:
            found.append(RecordedCheckpoint(step.seq, "step", step.name, step.result_json))
    for ef in timeline.effects:
        if ef.seq is None or ef.name.startswith(COMPENSATION_PREFIX):
            continue
        state = ef.state.value if isinstance(ef.state, EffectState) else str(ef.state)
        found.append(RecordedCheckpoint(ef.seq, "effect", ef.name, ef.result_json, ef.key,
                                        ef.params_digest, state))
    found.sort(key=lambda c: c.position)
    return found
