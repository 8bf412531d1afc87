"""Lease renewal (the holder's heartbeat, DESIGN §3)."""

from __future__ import annotations

from collections.abc import Sequence

from ..base import RenewResult
from ..dialect import Tx
from ..rows import RENEW, RENEW_HELD
from .core import EngineCore

__all__ = ["Renew"]


class Renew:
    """:meth:`Ledger.renew <ratchet.ledger.base.Ledger.renew>` over ``core``'s dialect."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """See :meth:`Ledger.renew`. Expired leases are not renewed (the ledger clock
        decides); the holder's registry heartbeat (``workers.last_seen``) moves with it."""
        if not leases:
            return []

        def body(tx: Tx) -> list[RenewResult]:
            renewed = {
                (r.id, r.generation): r.lease_until
                for r in RENEW.all(tx, {
                    "ids": [task_id for task_id, _ in leases],
                    "generations": [generation for _, generation in leases],
                    "holder": holder,
                })
            }
            held: dict[tuple[str, int], float] = {}
            missing = [lease for lease in leases if lease not in renewed]
            if missing:
                # Not extended: expired or taken over (lost), or its row was locked by
                # another transaction (PostgreSQL skips it): still ours until its current
                # lease_until, extended by the next round.
                for r in RENEW_HELD.all(tx, {
                    "ids": [task_id for task_id, _ in missing],
                    "generations": [generation for _, generation in missing],
                    "holder": holder,
                }):
                    held[(r.id, r.generation)] = r.lease_until
            tx.execute("worker_seen", {"holder": holder, "now": tx.now})
            out = []
            for task_id, generation in leases:
                lease = (task_id, generation)
                if lease in renewed:
                    out.append(RenewResult(task_id, generation, True, renewed[lease], tx.now))
                else:
                    until = held.get(lease)
                    out.append(RenewResult(task_id, generation, until is not None, until,
                                           tx.now, False))
            return out

        return self.core.dialect.run(body)
