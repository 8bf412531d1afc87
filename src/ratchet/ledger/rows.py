"""Row shapes shared by the ledger backends: column lists, row → record mappers, the
transition audit row. Both schemas store the same columns in the same order, so SQLite and
PostgreSQL read and audit tasks with one definition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import IllegalTransition
from ..serde import Undecodable, dumps, loads, printable
from ..states import State
from ..storedtext import StoredState, UndecodableText, stored_note
from .base import EffectRecord, EffectState, TaskInfo, TaskWrite, Transition

__all__ = [
    "EFFECT_COLUMNS",
    "TASK_COLUMNS",
    "AuditRow",
    "decode_detail",
    "decode_json",
    "effect_record",
    "effect_state",
    "known_state",
    "reschedules",
    "task_info",
    "task_state",
    "transition_audit",
]

AuditRow = tuple[str, float, str, str | None, str | None, int | None, str | None, str]
"""``(task_id, at, kind, from_state, to_state, generation, holder, detail_json)``."""

TASK_COLUMNS = (
    "id, name, version, state, generation, attempt, max_attempts, holder, lease_until, "
    "run_at, created_at, updated_at, idempotency_key, params, params_digest, result, "
    "last_error, error_class, tenant, quarantined"
)
EFFECT_COLUMNS = (
    "name, key, params_digest, state, result, generation, attempt, calls, via_lookup, updated_at, "
    "seq"
)


def decode_json(text: str | None) -> Any:
    """Decode stored JSON; undecodable text becomes a :class:`~ratchet.serde.Undecodable`
    (its printable text and the reason) instead of an error, so one bad row affects only
    itself."""
    if text is None:
        return None
    try:
        text.encode("utf-8")
        return loads(text)
    except (ValueError, RecursionError, UnicodeEncodeError) as exc:
        reason = "invalid UTF-8" if isinstance(exc, UnicodeEncodeError) else str(exc)
        return Undecodable(str(printable(text)), reason)


def decode_detail(text: str | None) -> dict[str, Any]:
    """An audit row's detail as a dict (``{"undecodable": ...}`` if it cannot be decoded)."""
    value = decode_json(text)
    if isinstance(value, Undecodable):
        return {"undecodable": value.text, "error": value.error}
    return value if isinstance(value, dict) else {}


_STATES: dict[object, State] = {s.value: s for s in State}
_EFFECT_STATES: dict[object, EffectState] = {s.value: s for s in EffectState}


def task_state(value: object) -> State | StoredState:
    """A stored ``tasks.state`` as a :class:`State`, or as a
    :class:`~ratchet.storedtext.StoredState` when it is not one (an unknown string,
    undecodable bytes, a BLOB): never an error, so one such row affects only itself."""
    try:
        return _STATES[value]
    except (KeyError, TypeError):
        return StoredState(value)


def known_state(task_id: str, value: object, action: str) -> State:
    """A stored ``tasks.state`` an operator command (``action``: ``"cancel"``, ...) acts
    on, as a :class:`State`.

    Raises:
        IllegalTransition: the row holds a value that is not a known state: the command
            changes nothing (no transition of the state machine starts from it).
    """
    state = task_state(value)
    if isinstance(state, StoredState):
        raise IllegalTransition(
            f"task {task_id} holds state '{state}' ({stored_note(state)}): "
            f"{action} changed nothing (the row must be repaired first)")
    return state


def effect_state(value: object) -> EffectState | StoredState:
    """A stored ``effects.state`` as an :class:`EffectState`, or as a
    :class:`~ratchet.storedtext.StoredState` when it is not one."""
    try:
        return _EFFECT_STATES[value]
    except (KeyError, TypeError):
        return StoredState(value)


def reschedules(target: State) -> bool:
    """True for targets that get a new ``run_at`` (backoff, release delay)."""
    return target is State.RETRY_WAIT or target is State.PENDING


_TASK_FIELDS = ("task_id", "name", "version", "state", "generation", "attempt", "max_attempts",
                "holder", "lease_until", "run_at", "created_at", "updated_at",
                "idempotency_key", "params", "params_digest", "result", "last_error",
                "error_class", "tenant", "quarantined", "last_traceback")
"""The :class:`TaskInfo` field of each column of :data:`TASK_COLUMNS` (and of
``last_traceback``, which ``task_get`` and ``task_get_many`` add)."""


def _undecodable(
    row: Sequence[Any], state: State | StoredState, params: Any, result: Any
) -> tuple[str, ...]:
    """The fields of a task row whose stored value could not be decoded, or is not a known
    state (``()`` at the cost of one scan of the row when there is none)."""
    if (UndecodableText not in map(type, row) and type(params) is not Undecodable
            and type(result) is not Undecodable and type(state) is not StoredState):
        return ()
    decoded = {"state": state, "params": params, "result": result}
    return tuple(f for f, v in zip(_TASK_FIELDS, row, strict=False)
                 if isinstance(decoded.get(f, v), UndecodableText | Undecodable | StoredState))


def task_info(row: Sequence[Any]) -> TaskInfo:
    """A :class:`TaskInfo` from a row selected with :data:`TASK_COLUMNS` (``task_get``
    and ``task_get_many`` add ``last_traceback``); its ``undecodable`` names the fields
    whose stored value could not be decoded (``"state"`` for a state that is not a known
    one, read as a :class:`~ratchet.storedtext.StoredState`)."""
    state = task_state(row[3])
    params = decode_json(row[13])
    result = decode_json(row[15])
    return TaskInfo(
        task_id=row[0],
        name=row[1],
        version=row[2],
        state=state,
        generation=row[4],
        attempt=row[5],
        max_attempts=row[6],
        holder=row[7],
        lease_until=row[8],
        run_at=row[9],
        created_at=row[10],
        updated_at=row[11],
        idempotency_key=row[12],
        params=params,
        params_digest=row[14],
        result=result,
        last_error=None if row[16] is None else printable(row[16]),
        error_class=row[17],
        tenant=row[18] if len(row) > 18 else None,
        quarantined=bool(row[19]) if len(row) > 19 else False,
        undecodable=_undecodable(row, state, params, result),
        last_traceback=printable(row[20]) if len(row) > 20 and row[20] is not None else None,
    )


def effect_record(row: Sequence[Any]) -> EffectRecord:
    """An :class:`EffectRecord` from a row selected with :data:`EFFECT_COLUMNS` (a state
    that is not a known one as a :class:`~ratchet.storedtext.StoredState`)."""
    return EffectRecord(
        name=row[0],
        key=row[1],
        params_digest=row[2],
        state=effect_state(row[3]),
        result_json=row[4],
        generation=row[5],
        attempt=row[6],
        calls=row[7],
        via_lookup=bool(row[8]),
        updated_at=row[9],
        seq=row[10] if len(row) > 10 else None,
    )


def transition_audit(write: TaskWrite, t: Transition, now: float) -> AuditRow:
    """The audit row of a fenced ``RUNNING -> t.to`` transition written by ``write``."""
    detail: dict[str, Any] = {"operation": write.operation}
    if t.reason:
        detail["reason"] = t.reason
    if t.error:
        detail["error"] = printable(t.error[:2000])
    if t.error_class:
        detail["error_class"] = t.error_class
    if t.to in (State.RETRY_WAIT, State.PENDING) and t.delay_s:
        detail["delay_s"] = round(t.delay_s, 3)
    return (write.task_id, now, "transition", "RUNNING", t.to.value, write.generation,
            write.holder, dumps(detail))
