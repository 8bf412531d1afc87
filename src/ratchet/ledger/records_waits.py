"""What workflows carry through the ledger (DESIGN §3, waits): what a parked task waits
for (:class:`WaitSpec`, on a ``RUNNING -> WAITING`` :class:`~ratchet.ledger.base.Transition`),
the receipt of an event sent to the mailbox (:class:`EventReceipt`), and what a task waits
for as read back (:class:`WaitInfo`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COMPENSABLE_STEP", "COMPENSATING_STEP", "FOREVER", "EventReceipt", "WaitInfo",
           "WaitSpec"]

FOREVER = 253402300799.0
"""``run_at`` of a wait without a deadline (9999-12-31T23:59:59Z, epoch seconds): only an
event, its last child or an operator wakes it."""

COMPENSABLE_STEP = "ratchet:compensable"
"""Name of the marker step a task records with its first completed effect that has a
compensation: the ledger reads it to send a task an operator gives up on to
``COMPENSATING`` instead of ``FAILED``."""

COMPENSATING_STEP = "ratchet:compensating"
"""Name of the marker step written when a task enters ``COMPENSATING``: the next claim's
holder runs the task in compensation mode (its recorded history replayed, then the
compensations of its completed effects in reverse order)."""


@dataclass(frozen=True, slots=True)
class WaitSpec:
    """What a task parking itself (``RUNNING -> WAITING``) waits for.

    Attributes:
        kind: ``"sleep"`` (its ``run_at`` only), ``"event"`` or ``"children"``.
        name: the event's name (``"event"``).
        key: the event's key (``"event"``).
        step: the stored name of the checkpoint a delivered event is written into
            (``"event"``): ``{"seq": <event seq>, "payload": <payload>}``.
        seq: that checkpoint's position in the task's code path.
        after: the last event seq of this (name, key) the task already received (an
            earlier wait of the same code path), or 0: only later events are delivered.
        children: the child task ids waited for (``"children"``), in order.
    """

    kind: str
    name: str | None = None
    key: str | None = None
    step: str | None = None
    seq: int | None = None
    after: int = 0
    children: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class EventReceipt:
    """What :meth:`Ledger.send_event <ratchet.ledger.base.Ledger.send_event>` (and
    ``App.send_event``) answers.

    Attributes:
        event_id: the event's id (given, or generated).
        seq: its position in the mailbox (orders the events of one name and key).
        duplicate: True when an event with this id was already stored (nothing written:
            the same event id twice is one event).
        woken: waiting tasks this send delivered the event to (0 for a duplicate).
        sent_at: when the event was stored, ledger-clock epoch seconds.
    """

    event_id: str
    seq: int
    duplicate: bool
    woken: int
    sent_at: float


@dataclass(frozen=True, slots=True)
class WaitInfo:
    """What a task waits for, and its parent, as read back (``inspect``, the dashboard).

    Attributes:
        task_id: the task.
        parent_id: the task that submitted it with ``ctx.submit``, or None.
        kind: ``"sleep"`` / ``"event"`` / ``"children"`` while it is ``WAITING``, else None.
        event_name: the event's name (``"event"``).
        event_key: the event's key (``"event"``).
        children_left: children not ended yet (``"children"``).
        until: epoch seconds it waits until (the deadline of a sleep or an event's
            timeout); None when it waits without one.
    """

    task_id: str
    parent_id: str | None
    kind: str | None
    event_name: str | None = None
    event_key: str | None = None
    children_left: int | None = None
    until: float | None = None

    def describe(self) -> str | None:
        """One line for people (``"event shipped/order-7"``, ``"3 children"``,
        ``"sleep"``), or None when the task is not waiting."""
        if self.kind == "event":
            return f"event {self.event_name}/{self.event_key}"
        if self.kind == "children":
            n = self.children_left or 0
            return f"{n} child{'ren' if n != 1 else ''}"
        if self.kind == "sleep":
            return "sleep"
        return None
