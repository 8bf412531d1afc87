"""The aggregates of ``ratchet status`` (DESIGN §9): counts by type and state, audit kinds,
capacity per type over a window, throughput buckets. Reads no history: the counts rollup
(:mod:`.counts`) plus what happened since its mark."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from ...errors import LedgerError
from ..base import ATTEMPT_SAMPLE, RECENT_FRACTION, LedgerStats, ThroughputCount, TypeCapacity
from ..dialect import Tx
from ..rows import (
    COUNTS_READ_MARK,
    STATS_COUNTS,
    STATS_KINDS,
    STATS_LATE,
    STATS_OLDEST,
    STATS_UNKNOWN,
    STATUS_ARRIVALS,
    STATUS_ATTEMPTS,
    STATUS_COMPLETIONS,
    STATUS_QUARANTINED,
    STATUS_READY,
    STATUS_UNKNOWN,
    THROUGHPUT_ARRIVALS,
    THROUGHPUT_COMPLETIONS,
)
from .core import EngineCore
from .counts import advance_counts
from .schema import RETENTION, RETRY_GOVERNANCE

__all__ = ["MARK_LOCK_WAIT_S", "OPERATOR_KINDS", "Stats"]

OPERATOR_KINDS = ("operator_resolve", "operator_cancel", "operator_retry", "operator_pause",
                  "operator_resume", "operator_replay", "limit_set", "limit_cleared",
                  "rate_limit_set", "rate_limit_cleared")
"""Audit kinds of operator commands, every one audited with who and a reason (``ratchet
status``: operator actions): resolve, cancel, retry, pause, resume, quarantine replay,
``limits set`` and ``limits clear`` (rate limits too). A prune is not one: workers prune
on their own."""


MARK_LOCK_WAIT_S = 0.1
"""The longest wait of ``stats`` for the locks that advancing the counts mark takes,
seconds. Advancing is optional (what finished since the mark is counted anyway), so a
process frozen inside a write transaction (SQLite: holding the write lock) or a long prune
batch costs ``ratchet status`` and the dashboard this much, not the busy timeout."""


class Stats:
    """The aggregate reads of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def _counted_mark(self) -> None:
        """Advance the counts mark (skipped if the ledger refuses the write, e.g. a
        read-only file, or its locks are not had within :data:`MARK_LOCK_WAIT_S`: the
        count since the mark is then just longer)."""
        with contextlib.suppress(LedgerError):
            advance_counts(self.core.dialect, lock_wait_s=MARK_LOCK_WAIT_S)

    def stats(self, window_s: float | None = None) -> LedgerStats:
        """See :meth:`Ledger.stats` (decodes no stored JSON).

        Reads no history (DESIGN §9): non-terminal tasks are counted exactly from their
        partial index; finished tasks and audit kinds are the rollup (before the counts
        mark) plus what finished or happened since the mark. The mark is advanced first,
        in a short write transaction of its own (skipped if the ledger refuses it, e.g. a
        read-only file: the count since the mark is then just longer).
        """
        core = self.core
        core.schema.require(RETENTION, "ratchet status")
        # An older ledger opened read-only (not migrated): no quarantine column to count.
        quarantine = window_s is not None and core.schema.has(RETRY_GOVERNANCE)
        self._counted_mark()

        def body(tx: Tx) -> LedgerStats:
            mark = COUNTS_READ_MARK.first(tx)
            upto = float(mark.upto) if mark else 0.0
            counts: dict[str, dict[str, int]] = {}
            for r in STATS_COUNTS.all(tx, {"upto": upto}):
                counts.setdefault(r.name, {})[r.state] = int(r.n)
            oldest_row = STATS_OLDEST.first(tx, {"now": tx.now})
            oldest = oldest_row.value if oldest_row else None
            kinds = {r.kind: int(r.n) for r in STATS_KINDS.all(tx, {"upto": upto})}
            unknown_row = STATS_UNKNOWN.first(tx)
            late_row = STATS_LATE.first(tx)
            capacity = ([] if window_s is None else
                        _capacity(tx, tx.now - window_s, counts, quarantine,
                                  tx.now - window_s * RECENT_FRACTION))
            return LedgerStats(
                counts=counts,
                oldest_pending_age_s=(tx.now - oldest) if oldest is not None else None,
                unknown_count=int(unknown_row.value) if unknown_row else 0,
                claims=kinds.get("claim", 0) + kinds.get("takeover", 0),
                takeovers=kinds.get("takeover", 0),
                stale_rejections=kinds.get("stale_rejected", 0),
                lookup_hits=kinds.get("lookup_hit", 0),
                idempotency_conflicts=kinds.get("idempotency_conflict", 0),
                operator_actions=sum(kinds.get(k, 0) for k in OPERATOR_KINDS),
                revocations=kinds.get("revoke", 0),
                late_effects=int(late_row.total) if late_row else 0,
                late_effects_accounted_for=int(late_row.accounted_for) if late_row else 0,
                durability=core.config.durability.value,
                backend_settings=core.dialect.backend_settings(tx),
                schema_version=0,
                ledger_now=tx.now,
                window_s=window_s or 0.0,
                capacity=capacity,
            )

        # One snapshot: the mark and the counts since it must agree (an advance committed
        # between them would count its window twice).
        stats = core.dialect.run(body, write=False, snapshot=True)
        return dataclasses.replace(stats, schema_version=core.dialect.schema_version())

    def throughput(self, window_s: float, bucket_s: float,
                   name: str | None = None) -> list[ThroughputCount]:
        """See :meth:`Ledger.throughput`: ``ceil(window_s / bucket_s)`` buckets ending at
        the ledger clock, two range scans of the window (tasks_created, tasks_finished)."""
        buckets = max(1, math.ceil(window_s / bucket_s - 1e-9))

        def body(tx: Tx) -> list[ThroughputCount]:
            start = tx.now - buckets * bucket_s
            window = {"from_at": start, "to_at": tx.now, "bucket_s": bucket_s, "name": name}
            created, finished = tx.rows_many([THROUGHPUT_ARRIVALS.sent(window),
                                              THROUGHPUT_COMPLETIONS.sent(window)])
            came = {int(r.bucket): int(r.n) for r in THROUGHPUT_ARRIVALS.of(created)}
            went = {int(r.bucket): int(r.n) for r in THROUGHPUT_COMPLETIONS.of(finished)}
            return [ThroughputCount(start + i * bucket_s, came.get(i, 0), went.get(i, 0))
                    for i in range(buckets)]

        return self.core.dialect.run(body, write=False)

    def audit_kind_counts(self) -> dict[str, int]:
        """See :meth:`Ledger.audit_kind_counts` (the counts mark is advanced first, as by
        :meth:`stats`)."""
        self.core.schema.require(RETENTION, "audit counts")
        self._counted_mark()

        def body(tx: Tx) -> dict[str, int]:
            mark = COUNTS_READ_MARK.first(tx)
            upto = float(mark.upto) if mark else 0.0
            return {str(r.kind): int(r.n) for r in STATS_KINDS.all(tx, {"upto": upto})}

        return self.core.dialect.run(body, write=False, snapshot=True)


def _capacity(tx: Tx, from_at: float, counts: Mapping[str, Mapping[str, int]],
              quarantine: bool = True, recent_at: float | None = None
              ) -> list[TypeCapacity]:
    """Per task type: scheduled / oldest ready (tasks_ready), unknown (the parked
    index), quarantined (tasks_quarantine), and arrivals / completions since
    ``from_at`` and since ``recent_at`` (the window's recent part; default
    ``from_at``), with the newest arrival (ranges of tasks_created / tasks_finished,
    the same rows), and the attempts that ended since ``from_at`` with their summed
    duration (the newest :data:`ATTEMPT_SAMPLE` ends, a range of audit_at, a seek of
    audit_task for each one's claim): the backlog and the window, never the history
    (DESIGN §9)."""
    window = {"from_at": from_at, "recent_at": from_at if recent_at is None else recent_at}
    # The UNKNOWN rows of the types the counts show with some (a seek per type).
    waiting = sorted(n for n, states in counts.items() if states.get("UNKNOWN"))
    reads = [STATUS_READY.sent(), STATUS_ARRIVALS.sent({**window}),
             STATUS_COMPLETIONS.sent({**window}),
             STATUS_ATTEMPTS.sent({"from_at": from_at, "limit": ATTEMPT_SAMPLE})]
    if waiting:
        reads.append(STATUS_UNKNOWN.sent({"names": waiting, **window}))
    if quarantine:
        reads.append(STATUS_QUARANTINED.sent())
    ready, arrivals, completions, attempts, *more = tx.rows_many(reads)
    unknown = STATUS_UNKNOWN.of(more.pop(0)) if waiting else []
    quarantined = STATUS_QUARANTINED.of(more.pop(0)) if quarantine else []
    by: dict[str, dict[str, Any]] = {name: {} for name in counts}
    for r in STATUS_READY.of(ready):
        by.setdefault(r.name, {}).update(
            scheduled=int(r.scheduled or 0),
            oldest_ready_at=None if r.oldest is None else float(r.oldest))
    for u in unknown:
        by.setdefault(u.name, {}).update(unknown=int(u.n), oldest_unknown_at=float(u.oldest),
                                         unknown_entered=int(u.entered or 0),
                                         recent_unknown_entered=int(u.recent or 0))
    for q in quarantined:
        by.setdefault(q.name, {})["quarantined"] = int(q.n)
    for a in STATUS_ARRIVALS.of(arrivals):
        by.setdefault(a.name, {}).update(arrivals=int(a.n), recent_arrivals=int(a.recent or 0),
                                         last_arrival_at=float(a.last))
    for c in STATUS_COMPLETIONS.of(completions):
        by.setdefault(c.name, {}).update(completions=int(c.n),
                                         recent_completions=int(c.recent or 0))
    for e in STATUS_ATTEMPTS.of(attempts):
        by.setdefault(e.name, {}).update(attempts=int(e.n),
                                         attempt_s=max(0.0, float(e.total_s or 0.0)))
    return [TypeCapacity(name, **by[name]) for name in sorted(by)]
