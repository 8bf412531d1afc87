"""The ledger as an outbox relay calls it (:class:`RelayLedger`, DESIGN §6.2): partition
leases, the unsent rows of held partitions, and the fenced mark of confirmed messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..outbox import OUTBOX_PARTITIONS
from .protocol_handle import LedgerHandle
from .records_relay import OutboxRow, PartLease

__all__ = ["RelayLedger"]


@runtime_checkable
class RelayLedger(LedgerHandle, Protocol):
    """The calls of ``ratchet relay``. Each is one transaction on the ledger clock."""

    def outbox_lease(self, holder: str, lease_s: float, want: int = OUTBOX_PARTITIONS,
                     *, rebalance: bool = True) -> list[PartLease]:
        """Renew the partitions ``holder`` holds (``lease_until = now + lease_s``), take
        free or expired ones (each take: ``generation + 1``, the fencing token) up to the
        fair share ``min(want, ceil(OUTBOX_PARTITIONS / live relays))`` (live relays:
        distinct holders of an unexpired lease or presence row, plus this one), and with
        ``rebalance`` give back partitions held above the share so a newly started relay
        gets some (a relay rebalances only between its publish rounds). Returns every
        partition ``holder`` holds after the call, in part order.

        Raises:
            InvalidArguments: an empty holder, ``lease_s <= 0`` or ``want < 0``.
        """
        ...

    def outbox_fetch(self, parts: Sequence[int], limit: int) -> list[OutboxRow]:
        """At most ``limit`` unsent rows of partitions ``parts``, in id order (per key,
        commit order)."""
        ...

    def outbox_mark_sent(self, holder: str, leases: Sequence[tuple[int, int]],
                         ids: Sequence[int]) -> int:
        """Mark rows ``ids`` sent (``sent_at``, ``sent_by``), fenced: only rows of a
        partition named in ``leases`` as ``(part, generation)`` that ``holder`` still holds
        at that generation with an unexpired lease. Returns the rows marked (a relay that
        lost the partition marks none)."""
        ...

    def outbox_failed(self, holder: str, ids: Sequence[int], error: str) -> None:
        """Count a failed publish of rows ``ids`` (``attempts + 1``, ``last_error``)."""
        ...

    def outbox_release(self, holder: str) -> None:
        """Give back every partition ``holder`` holds and drop its presence (a clean
        stop)."""
        ...
