"""Waits, events and children (DESIGN §3, waits): a task parking itself in its fenced
write (``RUNNING -> WAITING``), the claim's wake-up of parked rows whose ``run_at`` has
passed, the mailbox (an event sent is stored, then delivered to every task waiting on its
name and key), and the children of a task.

Where each wake-up happens, once:

* a **deadline** (a sleep, an event's timeout; and ``COMPENSATING``, due at once): the
  claim's :func:`wake_due`, in the claim's own transaction (``tasks_waiting``);
* an **event**: its send (:meth:`Waits.send_event`) writes the delivery as the waiting
  task's checkpoint and makes it ``PENDING``; an event stored before the wait is found by
  the wait itself (:func:`park`, ``wait_event_check``). Both take the (name, key)'s
  advisory lock on PostgreSQL (SQLite's write lock orders them), so no event is missed
  between the two;
* the **last child**: the ``tasks_fan_in`` trigger (migration 12), on whatever path ends
  the child (its holder's write, lease expiry, an operator's command); O(1) per child.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import InvalidArguments, TaskNotFound
from ...serde import dumps
from ...states import State
from ..base import FOREVER, EventReceipt, TaskInfo, TaskWrite, Transition, WaitInfo
from ..dialect import Tx
from ..rows import (
    EVENT_DELIVER,
    EVENT_GET,
    EVENT_INSERT,
    TASK_WAIT,
    WAIT_CHILDREN,
    WAIT_EVENT_CHECK,
    WAKE_DUE,
    AuditRow,
    Read,
    insert_audit,
    task_info,
)
from ..shapes import TaskRow, WokenRow
from .core import EngineCore

__all__ = ["WAKE_BATCH", "Waits", "park", "wake_audit", "wake_due_read"]

WAKE_BATCH = 500
"""Parked rows one claim wakes at most (the next claim wakes the rest)."""

TASK_CHILDREN = Read.rows("task_children", lambda row: TaskRow(*row))


def wake_due_read() -> tuple[str, Mapping[str, Any]]:
    """The claim's wake-up, to send with the claim's first reads (one round trip):
    parked rows whose ``run_at`` has passed become ``PENDING`` (``wake_due``)."""
    return WAKE_DUE.sent({"wake_limit": WAKE_BATCH})


def wake_audit(woken: Sequence[WokenRow], now: float) -> list[AuditRow]:
    """The audit rows of a wake-up (``wake``: ``WAITING``/``COMPENSATING -> PENDING``)."""
    return [(row.id, now, "wake",
             State.COMPENSATING.value if row.wait_kind == "compensate" else State.WAITING.value,
             State.PENDING.value, row.generation, None,
             dumps({"cause": "deadline" if row.wait_kind != "compensate" else "compensate"}))
            for row in woken]


def park(tx: Tx, parked: Sequence[tuple[TaskWrite, Transition]], audit: list[AuditRow],
         now: float) -> bool:
    """Record what each task that just parked itself waits for, in the commit's
    transaction, after its ``RUNNING -> WAITING`` (or ``COMPENSATING``) row was written.
    A wait whose event is already in the mailbox, or whose children have all ended, is
    made ``PENDING`` at once (audited ``wake``). Returns True when one was (the caller
    wakes the workers)."""
    woken = False
    compensating = [w.task_id for w, t in parked if t.to is State.COMPENSATING]
    if compensating:
        tx.execute("compensating_mark", {"ids": compensating})
    for write, t in parked:
        spec = t.wait
        if t.to is not State.WAITING or spec is None:
            continue
        ids = {"id": write.task_id, "generation": write.generation}
        tx.execute("wait_set", {**ids, "kind": spec.kind, "name": spec.name,
                                "key": spec.key, "step": spec.step, "seq": spec.seq,
                                "after": spec.after})
        cause: str | None = None
        if spec.kind == "event":
            if WAIT_EVENT_CHECK.all(tx, {**ids, "name": spec.name, "key": spec.key}):
                cause = "event already sent"
        elif spec.kind == "children":
            rows = WAIT_CHILDREN.all(tx, {**ids, "children": list(spec.children)})
            if any(row[-1] == State.PENDING.value for row in rows):
                cause = "children ended"
        if cause is not None:
            woken = True
            audit.append((write.task_id, now, "wake", State.WAITING.value,
                          State.PENDING.value, write.generation, write.holder,
                          dumps({"cause": cause})))
    return woken


class Waits:
    """:meth:`Ledger.send_event <ratchet.ledger.base.Ledger.send_event>`,
    ``children`` and ``waits``."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def send_event(self, name: str, key: str, payload_json: str, event_id: str | None,
                   by: str | None) -> EventReceipt:
        """Store an event in the mailbox and deliver it to every task ``WAITING`` on
        ``(name, key)`` (DESIGN §3, waits), in one transaction: each delivery is written
        as the wait's checkpoint (``{"seq", "payload"}``) and the task made ``PENDING``,
        audited ``event_delivered``; the send itself is audited ``event_sent`` (under
        ``event:<event id>``).

        ``event_id``: the event's identity (None: a new one). The same id sent again is
        the same event: nothing is written or delivered (``duplicate=True``).

        Raises:
            InvalidArguments: ``event_id`` was already used for another name, key or
                payload.
            LedgerUnavailable: the ledger cannot be reached.
        """
        eid = event_id if event_id is not None else uuid.uuid4().hex

        def body(tx: Tx) -> EventReceipt:
            now = tx.now
            inserted = EVENT_INSERT.all(tx, {"event_id": eid, "name": name, "key": key,
                                             "payload": payload_json, "by": by})
            if not inserted:
                found = EVENT_GET.first(tx, {"event_id": eid})
                if found is None:  # pruned between the two statements: a new one
                    raise InvalidArguments(f"event id {eid!r} is being pruned; send again")
                if (found.name, found.key, found.payload) != (name, key, payload_json):
                    raise InvalidArguments(
                        f"event id {eid!r} was already sent as event {found.name!r} with "
                        f"key {found.key!r} and another payload: an event id names one "
                        "event; use a new id for a new event")
                return EventReceipt(eid, int(found.seq), True, 0, float(found.sent_at))
            seq = int(inserted[0].seq)
            delivered = EVENT_DELIVER.all(tx, {"name": name, "key": key, "seq": seq,
                                               "payload": payload_json})
            audit: list[AuditRow] = [(f"event:{eid}", now, "event_sent", None, None, None, by,
                                      dumps({"name": name, "key": key, "seq": seq,
                                             "delivered": len(delivered)}))]
            audit.extend((row.id, now, "event_delivered", State.WAITING.value,
                          State.PENDING.value, row.generation, by,
                          dumps({"event": name, "key": key, "event_id": eid, "seq": seq}))
                         for row in delivered)
            insert_audit(tx, audit)
            if delivered:
                tx.wake()
            return EventReceipt(eid, seq, False, len(delivered), now)

        return self.core.dialect.run(body)

    def children(self, task_id: str) -> list[TaskInfo]:
        """See :meth:`Ledger.children`: the tasks ``task_id`` submitted with
        ``ctx.submit``, oldest first (read only).

        Raises:
            TaskNotFound: no such task.
        """
        def body(tx: Tx) -> list[TaskInfo] | None:
            if not TASK_WAIT.all(tx, {"ids": [task_id]}):
                return None
            return [task_info(row) for row in TASK_CHILDREN.all(tx, {"id": task_id})]

        found = self.core.dialect.run(body, write=False)
        if found is None:
            raise TaskNotFound(f"no task {task_id!r} in the ledger")
        return found

    def waits(self, task_ids: Sequence[str]) -> list[WaitInfo]:
        """See :meth:`Ledger.waits`: what each task waits for (its ``kind`` is None unless
        it is ``WAITING``) and its parent; tasks not found are left out."""
        if not task_ids:
            return []
        rows = self.core.dialect.run(lambda tx: TASK_WAIT.all(tx, {"ids": list(task_ids)}),
                                     write=False)
        out: list[WaitInfo] = []
        for row in rows:
            waiting = row.state == State.WAITING.value
            kind = row.wait_kind if waiting else None
            out.append(WaitInfo(
                row.id, row.parent_id, kind,
                event_name=row.wait_name if kind == "event" else None,
                event_key=row.wait_key if kind == "event" else None,
                children_left=row.wait_count if kind == "children" else None,
                until=float(row.run_at) if kind in ("sleep", "event") and
                float(row.run_at) < FOREVER else None))
        return out
