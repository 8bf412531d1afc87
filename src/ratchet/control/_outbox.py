"""The outbox as :class:`ratchet.Control` shows it (DESIGN §6 row 10, §9): its backlog,
the oldest unsent message's age, the relays holding its partitions, the messages relays
fail to publish, and a list of messages (``ratchet status``, the ``ratchet_outbox_*``
metrics, ``GET /api/outbox``, the dashboard's Outbox page)."""

from __future__ import annotations

from ..errors import SchemaTooOld
from ..ledger.base import OutboxMessage, OutboxStats
from ._reads import ControlReads

__all__ = ["ControlOutbox"]


class ControlOutbox(ControlReads):
    """The outbox calls of :class:`ratchet.Control` (see there)."""

    def outbox(self, top: int = 10) -> OutboxStats | None:
        """The outbox at a glance (:class:`~ratchet.control.OutboxStats`): unsent
        messages, the oldest unsent age (seconds, ledger clock), sent messages kept,
        unsent per topic (the ``top`` largest), the failing messages with their last
        error, and per relay the partitions it holds with an unexpired lease. Cheap on a
        large outbox: partial indexes and the 32 lease rows only (counts capped at
        ``count_cap``, flagged when reached).

        Returns:
            the stats, or None: the ledger has no outbox yet (schema below 16; a ledger
            a newer release reads before migrating it).

        Raises:
            InvalidArguments: ``top`` not in 0..1000.
            LedgerUnavailable: no ledger there.
        """
        try:
            return self._reader().outbox_stats(top)
        except SchemaTooOld:
            return None

    def outbox_messages(self, limit: int = 50, *, unsent_only: bool = False,
                        topic: str | None = None, key: str | None = None,
                        ) -> list[OutboxMessage]:
        """Outbox messages without their payload (:class:`~ratchet.control.OutboxMessage`
        with its ``state``: ``sent``, ``failing`` or ``unsent``), at most ``limit``: the
        newest first; with ``unsent_only`` the unsent ones in outbox order (what the
        relays publish next); only those of ``topic`` and / or ``key`` when given. An
        outbox-less ledger (schema below 16) has none.

        Raises:
            InvalidArguments: ``limit`` not in 1..10000, an empty or over-long topic or
                key.
            LedgerUnavailable: no ledger there.
        """
        try:
            return self._reader().outbox_messages(limit, unsent_only, topic, key)
        except SchemaTooOld:
            return []
