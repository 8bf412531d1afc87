"""The counts rollup behind ``ratchet status`` (DESIGN §9, §10.2): finished tasks and audit
kinds counted up to a mark, so stats never read the history. Kept right by every operation
that deletes counted rows (prune) or re-queues finished tasks (retry, replay)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..dialect import Dialect, Tx
from ..rows import COUNTS_LOCK, COUNTS_MARK_SHARE, COUNTS_WINDOW_AUDIT, COUNTS_WINDOW_TASKS
from ..shapes import AuditGoneRow

__all__ = ["advance_counts", "keep_audit_counts", "shared_mark", "unfinish"]


def advance_counts(dialect: Dialect, lock_wait_s: float | None = None) -> None:
    """Move the counts mark to the horizon (every finished task and audit row stamped
    before it is committed), adding what finished or was audited in between to the
    rollup (``finished_counts``, ``audit_counts``). One short write transaction; never
    touches a task row, so no claim or commit waits on it. Serialised with other
    advances and with prune batches by the mark row (PostgreSQL: ``FOR UPDATE``
    against the batches' ``FOR SHARE``; SQLite: the write lock). ``lock_wait_s``: the
    longest wait for those locks, seconds (``Dialect.run``; None: the ledger's own).

    Raises:
        LedgerError: the transaction failed (a lock not had within ``lock_wait_s`` too).
    """

    def body(tx: Tx) -> None:
        row = COUNTS_LOCK.first(tx)
        if row is None:
            return
        upto, horizon = float(row.upto), float(row.horizon)
        if horizon <= upto:  # nothing new (or another advance went further meanwhile)
            return
        tasks, kinds = tx.rows_many([
            COUNTS_WINDOW_TASKS.sent({"from_at": upto, "to_at": horizon}),
            COUNTS_WINDOW_AUDIT.sent({"from_at": upto, "to_at": horizon})])
        tx.batch("counts_add_tasks", [{"name": r.name, "state": r.state, "n": int(r.n)}
                                      for r in COUNTS_WINDOW_TASKS.of(tasks)])
        tx.batch("counts_add_audit", [{"kind": r.kind, "n": int(r.n)}
                                      for r in COUNTS_WINDOW_AUDIT.of(kinds)])
        tx.execute("counts_set_mark", {"upto": horizon})

    dialect.run(body, lock_wait_s=lock_wait_s)


def shared_mark(tx: Tx) -> float:
    """The counts mark, read ``FOR SHARE`` (it cannot move before ``tx`` commits)."""
    mark = COUNTS_MARK_SHARE.first(tx)
    return float(mark.upto) if mark else 0.0


def unfinish(tx: Tx, rows: Sequence[tuple[str, str, float]]) -> None:
    """Finished tasks ``(name, terminal state, updated_at)`` that an operator move
    re-queues (retry, quarantine replay) leave the finished rollup if it counts them
    (finished before the counts mark, read FOR SHARE so the mark cannot move before
    this transaction commits); DESIGN §9 / §10.2."""
    if not rows:
        return
    upto = shared_mark(tx)
    gone = Counter((name, state) for name, state, at in rows if at < upto)
    tx.batch("counts_add_tasks", [{"name": name, "state": state, "n": -n}
                                  for (name, state), n in sorted(gone.items())])


def keep_audit_counts(tx: Tx, rows: Sequence[AuditGoneRow], upto: float) -> None:
    """Deleted audit rows stamped since the mark join ``audit_counts`` (those before it
    are counted there already)."""
    kinds = Counter(r.kind for r in rows if float(r.at) >= upto)
    tx.batch("counts_add_audit", [{"kind": k, "n": n} for k, n in sorted(kinds.items())])
