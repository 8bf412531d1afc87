"""Quarantine (DESIGN §7): the operator's list of quarantined tasks by fingerprint, their
replay at a rate, and the control requests a holder's heartbeat polls."""

from __future__ import annotations

from ...serde import dumps, printable
from ...states import State, check_operator_move
from ..base import QuarantineGroup, ReplayedTask
from ..dialect import Tx
from ..rows import (
    CONTROL_REQUESTS,
    QUARANTINE_GROUPS,
    QUARANTINE_LOCK,
    QUARANTINE_PICK,
    QUARANTINE_SAMPLES,
    insert_audit,
)
from ..shapes import QuarantineSampleRow
from .core import EngineCore
from .counts import unfinish
from .fork import FORKS, linked

__all__ = ["Quarantine"]


class Quarantine:
    """Quarantine list and replay of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def quarantine_groups(self, limit: int = 100, per_group: int = 5) -> list[QuarantineGroup]:
        """See :meth:`Ledger.quarantine_groups` (one read transaction, two statements)."""

        def body(tx: Tx) -> list[QuarantineGroup]:
            groups = QUARANTINE_GROUPS.all(tx, {"limit": limit})
            if not groups:
                return []
            # A fingerprint includes the task type: one fingerprint is one group.
            samples: dict[str, list[QuarantineSampleRow]] = {}
            for r in QUARANTINE_SAMPLES.all(tx, {
                    "fingerprints": sorted({g.fingerprint for g in groups}),
                    "per_group": per_group}):
                samples.setdefault(r.fingerprint, []).append(r)
            out = []
            for g in groups:
                rows = samples.get(g.fingerprint, [])
                first = rows[0] if rows else None
                out.append(QuarantineGroup(
                    fingerprint=g.fingerprint, name=g.name, count=int(g.n),
                    first_at=g.first_at, last_at=g.last_at,
                    error_class=first.error_class if first else None,
                    example_error=printable(first.last_error)
                    if first and first.last_error else None,
                    task_ids=[r.id for r in rows]))
            return out

        return self.core.dialect.run(body, write=False)

    def control_requests(self, holder: str) -> list[tuple[str, int, str]]:
        """See :meth:`Ledger.control_requests`."""
        rows = self.core.dialect.run(
            lambda tx: CONTROL_REQUESTS.all(tx, {"holder": holder}), write=False)
        return [(r.id, r.generation, r.request) for r in rows]

    def quarantine_replay(
        self, fingerprint: str, rate_per_s: float, operator: str, reason: str,
        dry_run: bool = False, limit: int = 10_000,
    ) -> list[ReplayedTask]:
        """See :meth:`Ledger.quarantine_replay`."""
        if not rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s!r}")

        def body(tx: Tx) -> list[ReplayedTask]:
            picked = QUARANTINE_PICK.all(tx, {"fingerprint": fingerprint, "limit": limit})
            # A task a fork links stays quarantined: `ratchet retry` checks its lineage.
            forked = linked(tx, [r.id for r in picked], self.core.schema.has(FORKS))
            picked = [r for r in picked if r.id not in forked]
            now = tx.now
            if not dry_run and picked:
                locked = {r.id for r in QUARANTINE_LOCK.all(
                    tx, {"ids": sorted(r.id for r in picked)})}
                picked = [r for r in picked if r.id in locked]
            check_operator_move(State.FAILED, State.PENDING)
            out = [ReplayedTask(r.id, r.name, now + i / rate_per_s, int(r.failures),
                                int(r.crashes))
                   for i, r in enumerate(picked)]
            if dry_run or not out:
                return out
            unfinish(tx, [(r.name, State.FAILED.value, float(r.updated_at)) for r in picked])
            tx.batch("quarantine_replay_task",
                     [{"id": p.task_id, "run_at": p.run_at} for p in out], now=now)
            generations = {r.id: r.generation for r in picked}
            insert_audit(tx, [(
                p.task_id, now, "operator_replay", State.FAILED.value, State.PENDING.value,
                generations[p.task_id], None,
                dumps({"operator": operator, "reason": reason, "fingerprint": fingerprint,
                       "run_at": p.run_at, "failures": p.failures, "crashes": p.crashes}),
            ) for p in out])
            if out[0].run_at <= now:
                tx.wake()
            return out

        return self.core.dialect.run(body, write=not dry_run)
