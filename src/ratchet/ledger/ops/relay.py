"""The outbox's relay side (DESIGN §6.2): partition leases with a fair share, the unsent
rows of held partitions, and the fenced mark of what a broker confirmed."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

from ...errors import InvalidArguments
from ...outbox import OUTBOX_PARTITIONS
from ..dialect import Tx
from ..records_relay import OutboxRow, PartLease
from .core import EngineCore

__all__ = ["Relay", "presence_part"]


def presence_part(holder: str) -> int:
    """The negative ``outbox_leases.part`` of ``holder``'s presence row: a relay that holds
    no partition yet still counts as live in every other relay's fair share."""
    return -1 - zlib.crc32(holder.encode("utf-8", "surrogatepass")) % (1 << 30)


def fair_share(live_relays: int, want: int) -> int:
    """Partitions one relay may hold: ``ceil(OUTBOX_PARTITIONS / live_relays)``, at most
    ``want``."""
    return min(want, math.ceil(OUTBOX_PARTITIONS / max(1, live_relays)))


class Relay:
    """The relay calls of :class:`~ratchet.ledger.base.Ledger` over ``core``'s dialect."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def outbox_lease(self, holder: str, lease_s: float, want: int = OUTBOX_PARTITIONS,
                     *, rebalance: bool = True) -> list[PartLease]:
        """See :meth:`Ledger.outbox_lease`. One transaction on the ledger clock: renew this
        holder's unexpired partitions and its presence row, take free or expired ones up
        to the fair share (generation + 1 each), and with ``rebalance`` give back what it
        holds above the share (highest parts first)."""
        if not holder or lease_s <= 0 or want < 0:
            raise InvalidArguments("outbox_lease needs a holder, lease_s > 0 and want >= 0")

        def body(tx: Tx) -> list[PartLease]:
            now = tx.now
            tx.execute("outbox_presence_prune")
            rows = tx.rows("outbox_lease_rows")
            mine_all = {int(p): (int(g), float(u))
                        for p, g, u in tx.rows("outbox_lease_mine", {"holder": holder})}
            tx.execute("outbox_presence", {"part": presence_part(holder), "holder": holder,
                                           "lease_s": lease_s})
            others = tx.one("outbox_lease_live", {"holder": holder})
            share = fair_share(1 + int(others[0] if others else 0), want)
            until = now + lease_s
            locked_mine = [(int(p), int(g)) for p, h, g, u in rows
                           if h == holder and u is not None and u > now]
            free = [(int(p), int(g)) for p, h, g, u in rows
                    if h is None or u is None or u <= now]
            writes: list[dict[str, object]] = []
            held: dict[int, tuple[int, float]] = {}
            unlocked = {p: v for p, v in mine_all.items()
                        if p not in {q for q, _ in locked_mine}}
            keep = max(0, share - len(unlocked)) if rebalance else len(locked_mine)
            for p, g in locked_mine[:keep]:
                writes.append({"part": p, "holder": holder, "generation": g,
                               "lease_until": until})
                held[p] = (g, until)
            for p, g in locked_mine[keep:]:
                writes.append({"part": p, "holder": None, "generation": g,
                               "lease_until": None})
            held.update(unlocked)
            for p, g in free:
                if len(held) >= share:
                    break
                writes.append({"part": p, "holder": holder, "generation": g + 1,
                               "lease_until": until})
                held[p] = (g + 1, until)
            tx.batch("outbox_lease_write", writes)
            return [PartLease(p, g, u, now) for p, (g, u) in sorted(held.items())]

        return self.core.dialect.run(body)

    def outbox_fetch(self, parts: Sequence[int], limit: int) -> list[OutboxRow]:
        """See :meth:`Ledger.outbox_fetch`."""
        if not parts or limit <= 0:
            return []

        def body(tx: Tx) -> list[OutboxRow]:
            return [OutboxRow(int(r[0]), r[1], r[2], r[3], int(r[4]), r[5], r[6], r[7],
                              float(r[8]), int(r[9]))
                    for r in tx.rows("outbox_fetch", {"parts": [int(p) for p in parts],
                                                      "limit": int(limit)})]

        return self.core.dialect.run(body, write=False)

    def outbox_mark_sent(self, holder: str, leases: Sequence[tuple[int, int]],
                         ids: Sequence[int]) -> int:
        """See :meth:`Ledger.outbox_mark_sent`."""
        if not leases or not ids:
            return 0
        params = {"holder": holder, "parts": [int(p) for p, _ in leases],
                  "generations": [int(g) for _, g in leases], "ids": [int(i) for i in ids]}
        return self.core.dialect.run(lambda tx: tx.execute("outbox_mark_sent", params))

    def outbox_failed(self, holder: str, ids: Sequence[int], error: str) -> None:
        """See :meth:`Ledger.outbox_failed`."""
        if not ids:
            return
        params = {"ids": [int(i) for i in ids], "error": f"{holder}: {error}"[:2000]}
        self.core.dialect.run(lambda tx: tx.execute("outbox_failed", params))

    def outbox_release(self, holder: str) -> None:
        """See :meth:`Ledger.outbox_release`."""
        self.core.dialect.run(lambda tx: tx.execute("outbox_release", {"holder": holder}))
