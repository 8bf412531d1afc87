"""An App's messages: events in (:meth:`Messages.send_event`, :meth:`Messages.signal`, to
tasks waiting in ``ctx.wait_for_event``) and messages out through the transactional outbox
(:meth:`Messages.emit`, relayed to a broker by ``ratchet relay``)."""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from ..errors import PayloadTooLarge
from ..ledger.base import EventReceipt, Ledger
from ..outbox import new_message
from ..serde import dumps
from ..validation import MAX_KEY_BYTES, MAX_NAME_BYTES, check_identifier

__all__ = ["Messages"]


class _App(Protocol):
    """What the message calls use of :class:`ratchet.App`."""

    max_payload_bytes: int

    @property
    def ledger(self) -> Ledger: ...

    def send_event(self, name: str, *, key: str, payload: Any = None,
                   event_id: str | None = None, by: str | None = None) -> EventReceipt: ...


class Messages:
    """The message calls of :class:`ratchet.App` (a base class of it)."""

    def send_event(self: _App, name: str, *, key: str, payload: Any = None,
                   event_id: str | None = None, by: str | None = None) -> EventReceipt:
        """Send the event ``(name, key)``: stored in the ledger's mailbox and delivered to
        every task waiting on it in ``ctx.wait_for_event`` (DESIGN §3, waits), audited.

        A task that reaches its wait later still receives it (the mailbox keeps events
        until ``ratchet prune`` removes those older than the retention age). The same
        ``event_id`` sent twice is one event (the second send writes and delivers nothing:
        ``duplicate=True``).

        Args:
            name: the event's name (``"shipped"``).
            key: the event's key (an order id; a task's id for a signal).
            payload: plain JSON, size-limited like params.
            event_id: the event's identity (a webhook's delivery id, say); None: a new one.
            by: who sent it, for the audit trail.

        Returns:
            The :class:`~ratchet.ledger.base.EventReceipt` (event id, mailbox position,
            duplicate, how many waiting tasks it woke).

        Raises:
            InvalidArguments: a name, key or event id that is not a storable identifier,
                or an event id already used for another event.
            PayloadNotSerializable: the payload is not plain JSON.
            PayloadTooLarge: the payload is over the size limit.
            LedgerError: the ledger failed (send again with the same ``event_id``).
        """
        check_identifier(name, "event name", MAX_NAME_BYTES)
        check_identifier(key, "event key", MAX_KEY_BYTES)
        if event_id is not None:
            check_identifier(event_id, "event id", MAX_KEY_BYTES)
        payload_json = dumps(payload, what=f"payload of event {name!r}")
        size = len(payload_json.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(size, self.max_payload_bytes)
        return self.ledger.send_event(name, key, payload_json, event_id, by)

    def signal(self: _App, task_id: str, name: str, payload: Any = None, *,
               event_id: str | None = None, by: str | None = None) -> EventReceipt:
        """Signal one task: the event ``(name, key=task_id)``, which that task receives
        with ``ctx.wait_for_event(name, key=ctx.task_id)``. See :meth:`send_event`.

        Raises:
            Same as :meth:`send_event`.
        """
        return self.send_event(name, key=task_id, payload=payload, event_id=event_id, by=by)


    # ------------------------------------------------------------------ the outbox

    def emit(self: _App, topic: str, message: Any, *, key: str | None = None,
             message_id: str | None = None, connection: Any = None) -> str:
        """Write a message to the transactional outbox from outside a task (inside a task
        use ``ctx.emit``): a relay (``ratchet relay``) publishes it to the broker and marks
        it sent once the broker confirmed it (DESIGN §6, row 10).

        With ``connection``, the message is written in your own open transaction on the
        ledger's database (a psycopg 3 connection for PostgreSQL, the ``sqlite3``
        connection on the ledger's file for SQLite), under a savepoint: it exists if and
        only if your transaction commits, together with your own rows. Without it, in a
        transaction of its own.

        Args:
            topic: the RabbitMQ routing key / NATS subject, dot-separated words
                (``"order.paid"``).
            message: plain JSON, size-limited like params.
            key: the ordering key (an order id): messages of one key reach the broker in
                the order their transactions committed. None: no order.
            message_id: the id consumers deduplicate by; default a new random one. The
                same message written twice under one id is one message (the second write
                keeps the first); another message under an id already used is refused.
            connection: your open transaction's connection, or None.

        Returns:
            The message id.

        Raises:
            InvalidArguments: a topic, key or message id that cannot be stored or routed,
                or a ``connection`` that cannot hold the message (see
                :meth:`ratchet.App.submit`).
            PayloadNotSerializable: ``message`` is not plain JSON.
            PayloadTooLarge: the encoded message is over the size limit.
            WriteRejected: ``message_id`` was already used for another message.
            LedgerError: the ledger failed.
        """
        mid = message_id if message_id is not None else uuid.uuid4().hex
        msg = new_message(topic, message, key=key, message_id=mid,
                          max_payload_bytes=self.max_payload_bytes,
                          chosen_id=message_id is not None)
        self.ledger.emit([msg], connection)
        return mid
