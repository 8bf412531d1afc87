"""Late effects (an effect call a stale holder made after losing its lease) and the reads
and audit of ``ratchet reconcile`` (DESIGN §5)."""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import InvalidArguments
from ...serde import dumps, printable
from ..base import LateEffect, TaskEffect
from ..dialect import Tx
from ..rows import (
    EFFECTS_OF_TYPE,
    LATE_EFFECTS_ALL,
    LATE_EFFECTS_OF_TYPE,
    LATE_EFFECTS_TASK,
    effect_record,
    insert_audit,
    task_state,
)
from .core import EngineCore

__all__ = ["LateEffects"]


class LateEffects:
    """Late effects and reconciliation of the :class:`~ratchet.ledger.base.Ledger`
    contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def record_late_effect(self, late: LateEffect) -> None:
        """See :meth:`Ledger.record_late_effect`."""

        def body(tx: Tx) -> None:
            now = tx.now
            tx.execute("late_effect_insert", {
                "task_id": late.task_id, "effect": late.effect, "key": late.key,
                "generation": late.generation, "holder": late.holder, "now": now,
                "outcome": late.outcome,
                "detail": None if late.detail is None else printable(late.detail[:4000]),
            })
            insert_audit(tx, [(late.task_id, now, "late_effect", None, None, late.generation,
                               late.holder, dumps({"effect": late.effect, "key": late.key,
                                                   "outcome": late.outcome}))])

        self.core.dialect.run(body)

    def late_effects(self, task_id: str | None = None, limit: int = 100) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects`."""
        if task_id is None:
            return self.core.dialect.run(
                lambda tx: LATE_EFFECTS_ALL.all(tx, {"limit": limit}), write=False)
        return self.core.dialect.run(
            lambda tx: LATE_EFFECTS_TASK.all(tx, {"id": task_id, "limit": limit}),
            write=False)

    def effects_of_type(
        self, name: str, created_from: float | None, limit: int,
        after: tuple[float, str, str] | None = None,
    ) -> list[TaskEffect]:
        """See :meth:`Ledger.effects_of_type` (one read; the tasks by ``tasks_created``,
        their effects by primary key)."""
        params = {
            "name": name, "created_from": created_from, "limit": limit,
            "cursor_at": after[0] if after else None,
            "cursor_id": after[1] if after else None,
            "cursor_name": after[2] if after else None,
        }
        rows = self.core.dialect.run(lambda tx: EFFECTS_OF_TYPE.all(tx, params), write=False)
        return [TaskEffect(r.task_id, task_state(r.task_state), int(r.task_generation),
                           float(r.created_at), effect_record(r)) for r in rows]

    def late_effects_of_type(
        self, name: str, since: float | None, limit: int
    ) -> list[LateEffect]:
        """See :meth:`Ledger.late_effects_of_type`."""
        return self.core.dialect.run(lambda tx: LATE_EFFECTS_OF_TYPE.all(
            tx, {"name": name, "since": since, "limit": limit}), write=False)

    def record_reconcile(
        self, name: str, operator: str, summary_json: str,
        findings: Sequence[tuple[str, str, int | None, str]],
    ) -> None:
        """See :meth:`Ledger.record_reconcile`. Kinds must start with ``reconcile``."""
        for _, kind, _, _ in findings:
            if not kind.startswith("reconcile_"):
                raise InvalidArguments(f"a reconcile finding's audit kind must start with "
                                       f"'reconcile_', got {kind!r}")

        def body(tx: Tx) -> None:
            now = tx.now
            insert_audit(tx, [(f"reconcile:{name}", now, "reconcile", None, None, None,
                               printable(operator), summary_json)]
                         + [(task_id, now, kind, None, None, generation, printable(operator),
                             detail)
                            for task_id, kind, generation, detail in findings])

        self.core.dialect.run(body)
