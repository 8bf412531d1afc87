"""Reads of tasks: one, many, a filtered page, a task's whole timeline."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import TaskNotFound
from ..base import AuditEvent, StepRecord, TaskInfo, TaskQuery, Timeline
from ..dialect import Tx
from ..rows import (
    LATE_EFFECTS_TASK,
    TASK_GET,
    TASK_GET_MANY,
    TASKS_LIST,
    TIMELINE_AUDIT,
    TIMELINE_EFFECTS,
    TIMELINE_STEPS,
    decode_detail,
    effect_record,
    task_info,
)
from .core import EngineCore

__all__ = ["Reads"]


class Reads:
    """Task reads of the :class:`~ratchet.ledger.base.Ledger` contract (read
    transactions). Stored JSON that cannot be decoded is returned as an
    :class:`~ratchet.serde.Undecodable` in its field, never raised."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def get(self, task_id: str) -> TaskInfo:
        """See :meth:`Ledger.get`."""
        row = self.core.dialect.run(lambda tx: TASK_GET.first(tx, {"id": task_id}),
                                    write=False)
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in the ledger")
        return task_info(row)

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """See :meth:`Ledger.get_many`."""
        ids = list(task_ids)
        if not ids:
            return []
        rows = self.core.dialect.run(lambda tx: TASK_GET_MANY.all(tx, {"ids": ids}),
                                     write=False)
        return [task_info(r) for r in rows]

    def list_tasks(self, query: TaskQuery) -> list[TaskInfo]:
        """See :meth:`Ledger.list_tasks`."""
        params = {
            "states": None if query.states is None else [s.value for s in query.states],
            "names": None if query.names is None else list(query.names),
            "key": query.key, "created_from": query.created_from,
            "created_to": query.created_to, "limit": query.limit,
            "cursor_at": query.after[0] if query.after else None,
            "cursor_id": query.after[1] if query.after else None,
        }
        rows = self.core.dialect.run(lambda tx: TASKS_LIST.all(tx, params), write=False)
        return [task_info(r) for r in rows]

    def timeline(self, task_id: str) -> Timeline:
        """See :meth:`Ledger.timeline`."""

        def body(tx: Tx) -> Timeline:
            row = TASK_GET.first(tx, {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            events = [
                AuditEvent(r.seq, r.task_id, r.at, r.kind, r.from_state, r.to_state,
                           r.generation, r.holder, decode_detail(r.detail))
                for r in TIMELINE_AUDIT.all(tx, {"id": task_id})
            ]
            steps = [StepRecord(r.name, r.result, r.generation, r.committed_at, r.seq)
                     for r in TIMELINE_STEPS.all(tx, {"id": task_id})]
            effects = [effect_record(r) for r in TIMELINE_EFFECTS.all(tx, {"id": task_id})]
            late = LATE_EFFECTS_TASK.all(tx, {"id": task_id, "limit": 1000})
            return Timeline(task_info(row), events, steps, effects, late)

        return self.core.dialect.run(body, write=False)
