"""Outbox writes (DESIGN §6, row 10): the rows of emitted messages, written inside the
transaction that decided them (a task's fenced commit, a caller's own transaction)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import WriteRejected
from ...outbox import NewMessage
from ..dialect import Tx
from ..rows import OUTBOX_SAME
from .core import EngineCore
from .guarded import joinable

__all__ = ["Emit", "write_messages"]


def write_messages(tx: Tx, messages: Sequence[NewMessage]) -> None:
    """Write ``messages`` in ``tx``: first each key's ``outbox_keys`` row (in key order:
    on PostgreSQL its row lock, held to commit, makes a later emit to the same key take a
    later id, so per key id order is commit order), then the rows (a message id already
    written is kept, not written twice; a chosen id already used for another message is
    refused). Wakes the relays at commit.

    Raises:
        WriteRejected: a chosen message id names another message already (the caller's
            transaction must roll back).
    """
    if not messages:
        return
    keys = sorted({m.key for m in messages if m.key is not None})
    tx.batch("outbox_key_lock", [{"key": k} for k in keys])
    tx.batch("outbox_insert", [
        {"message_id": m.message_id, "topic": m.topic, "key": m.key, "part": m.part,
         "payload": m.payload_json, "task_id": m.task_id}
        for m in messages])
    chosen = {m.message_id: m for m in messages if m.chosen_id}
    if chosen:
        # A chosen id kept by ON CONFLICT must be this very message (a re-send of it), not
        # another one that used the id first: that one would be dropped without a word.
        for row in OUTBOX_SAME.all(tx, {"ids": sorted(chosen)}):
            mine = chosen[row.message_id]
            if (row.task_id, row.topic, row.key, row.payload) != (
                    mine.task_id, mine.topic, mine.key, mine.payload_json):
                raise WriteRejected(
                    f"refused write 'outbox_insert': message_id {row.message_id!r} was "
                    f"already used for another message (topic {row.topic!r}, key "
                    f"{row.key!r}, task {row.task_id or 'none'}); a message id names one "
                    "message: choose another, or let Ratchet derive it")
    tx.wake("outbox")


class Emit:
    """:meth:`Ledger.emit <ratchet.ledger.base.Ledger.emit>` over ``core``'s dialect."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def emit(self, messages: Sequence[NewMessage], connection: Any = None) -> None:
        """Write ``messages`` in a transaction of their own, or inside the caller's open
        transaction on ``connection`` (:meth:`Dialect.join
        <ratchet.ledger.dialect.Dialect.join>`)."""
        if not messages:
            return
        dialect = self.core.dialect
        if connection is not None:
            dialect.join(joinable(connection), lambda tx: write_messages(tx, messages),
                         what="the message" if len(messages) == 1 else "the messages")
        else:
            dialect.run(lambda tx: write_messages(tx, messages))
