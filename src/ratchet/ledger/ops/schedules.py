"""Periodic schedules: registration, the scheduler's pass (a compare-and-set of cursors
read back, and the due ticks' submits, in one transaction), and the operator's read
(DESIGN §8, periodic tasks)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ...serde import dumps
from ..base import NewTask
from ..dialect import Tx
from ..records_schedules import (
    ScheduleAdvance,
    ScheduleFired,
    SchedulePlanner,
    ScheduleRecord,
    ScheduleSpec,
)
from ..rows import SCHEDULE_ADVANCE, SCHEDULE_CURSORS, SCHEDULES_ALL
from .core import EngineCore
from .schema import SCHEDULES
from .submit import SubmitConflict, submit_in

__all__ = ["Schedules"]

CONFLICT_REASON = ("idempotency conflict: the tick's key was already used with other params "
                   "(the schedule's params changed while the tick was being fired)")
"""The missed reason of a tick whose key another submit took with other params."""


class Schedules:
    """Schedules of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def register_schedules(self, holder: str,
                           specs: Sequence[ScheduleSpec]) -> list[ScheduleRecord]:
        """See :meth:`Ledger.register_schedules`."""
        self.core.schema.require(SCHEDULES, "register periodic schedules")

        def body(tx: Tx) -> list[ScheduleRecord]:
            cursor = math.floor(tx.now)
            tx.batch("schedule_register", [
                {"name": s.name, "task": s.task, "spec": s.spec, "tz": s.tz,
                 "grace": float(s.misfire_grace_s), "cursor": cursor}
                for s in sorted(specs, key=lambda s: s.name)], holder=holder)
            return SCHEDULES_ALL.all(tx)

        return self.core.dialect.run(body)

    def schedules(self) -> list[ScheduleRecord]:
        """See :meth:`Ledger.schedules` (none on a ledger not yet migrated to them)."""
        if not self.core.schema.has(SCHEDULES):
            return []
        return self.core.dialect.run(lambda tx: SCHEDULES_ALL.all(tx), write=False)

    def schedules_seen(self, holder: str, names: Sequence[str]) -> None:
        """See :meth:`Ledger.schedules_seen`."""
        if names:
            self.core.dialect.run(lambda tx: tx.execute(
                "schedule_seen", {"holder": holder, "names": sorted(names)}))

    def fire_schedules(self, holder: str, names: Sequence[str],
                       plan: SchedulePlanner) -> ScheduleFired:
        """See :meth:`Ledger.fire_schedules`.

        A tick whose key was taken by another submit with other params
        (:class:`~ratchet.errors.IdempotencyConflict`) rolls the pass back once; it is
        then recorded as missed with that reason and the pass runs again without it, so
        one such tick never holds the schedule's other ticks or the other schedules up.
        """
        self.core.schema.require(SCHEDULES, "fire periodic schedules")
        if not names:
            return ScheduleFired(now_s=self.core.dialect.run(lambda tx: tx.now, write=False))
        conflicted: set[str] = set()
        while True:
            try:
                return self.core.dialect.run(
                    lambda tx: _fire(tx, holder, sorted(set(names)), plan, conflicted))
            except SubmitConflict as stop:
                key = stop.conflict.key
                if key in conflicted:  # cannot happen: the key is not sent again
                    raise stop.conflict from None
                conflicted.add(key)


def _fire(tx: Tx, holder: str, names: list[str], plan: SchedulePlanner,
          conflicted: set[str]) -> ScheduleFired:
    read = {r.name: r for r in SCHEDULE_CURSORS.all(tx, {"names": names})}
    decided = plan(tx.now, read)
    advances = [_without(a, conflicted) for a in decided.advances
                if a.name in read and a.from_s == read[a.name].cursor_s]
    advances = [a for a in advances if a.to_s != a.from_s or a.tasks or a.missed]
    rows = dict(read)
    if not advances:
        return ScheduleFired(now_s=tx.now, rows=rows)
    moved = SCHEDULE_ADVANCE.all(tx, {"holder": holder, "rows": dumps([
        {"name": a.name, "from_s": a.from_s, "to_s": a.to_s, "fired_s": a.fired_s,
         "nfired": len(a.tasks), "nmissed": a.missed, "missed_s": a.last_missed_s,
         "reason": a.missed_reason}
        for a in advances])})
    won = {r.name for r in moved}  # read back: never an affected-row count
    rows.update({r.name: r for r in moved})
    tasks: list[NewTask] = [t for a in advances if a.name in won for t in a.tasks]
    results = submit_in(tx, tasks) if tasks else []
    return ScheduleFired(
        now_s=tx.now, rows=rows, advanced=frozenset(won),
        lost=frozenset(a.name for a in advances if a.name not in won),
        submitted={t.idempotency_key or t.task_id: r.task_id
                   for t, r in zip(tasks, results, strict=True)},
        created=sum(r.created for r in results))


def _without(advance: ScheduleAdvance, conflicted: set[str]) -> ScheduleAdvance:
    """``advance`` with the ticks whose keys conflicted turned into missed ticks."""
    pairs = list(zip(advance.tasks, advance.ticks, strict=True))
    if not conflicted or not any(t.idempotency_key in conflicted for t, _ in pairs):
        return advance
    keep = [(t, tick) for t, tick in pairs if t.idempotency_key not in conflicted]
    gone = [tick for t, tick in pairs if t.idempotency_key in conflicted]
    last_missed = max([*gone, *([advance.last_missed_s] if advance.last_missed_s else [])])
    return replace(advance, tasks=[t for t, _ in keep], ticks=[tick for _, tick in keep],
                   fired_s=max((tick for _, tick in keep), default=None),
                   missed=advance.missed + len(gone), last_missed_s=last_missed,
                   missed_reason=CONFLICT_REASON)
