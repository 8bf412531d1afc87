"""Retention (DESIGN §10.2): prune finished tasks and their history in batches, with an
optional export of each batch's records, keeping the counts rollup right."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ...errors import InvalidArguments
from ...serde import dumps, printable
from ...validation import check_finite
from ..base import PruneReport
from ..dialect import CommitOutcomeUnknown, Tx
from ..rows import (
    CLAIM_EFFECTS,
    CLAIM_STEPS,
    PRUNE_AUDIT,
    PRUNE_AUDIT_GONE,
    PRUNE_AUDIT_WALK,
    PRUNE_COUNT,
    PRUNE_EXPORT_AUDIT,
    PRUNE_EXPORT_LATE,
    PRUNE_PICK,
    PRUNE_TASKS,
    TASK_GET_MANY,
    insert_audit,
)
from ..shapes import AuditGoneRow, PruneCountRow
from .core import EngineCore
from .counts import advance_counts, keep_audit_counts, shared_mark
from .outboxviews import OUTBOX, count_prunable, prune_outbox_batch

__all__ = ["Retention"]


class Retention:
    """:meth:`Ledger.prune <ratchet.ledger.base.Ledger.prune>` over ``core``'s dialect."""

    def __init__(self, core: EngineCore, now: Callable[[], float]) -> None:
        self.core = core
        self._now = now

    def prune(
        self,
        older_than_s: float,
        *,
        by: str,
        dry_run: bool = False,
        batch_size: int = 500,
        export: Callable[[list[dict[str, Any]]], None] | None = None,
        audit_empty: bool = True,
        pace: float | None = None,
    ) -> PruneReport:
        """See :meth:`Ledger.prune` (DESIGN §10.2).

        Each batch is one transaction: pick up to ``batch_size`` of the oldest finished
        tasks (PostgreSQL ``FOR UPDATE SKIP LOCKED``: rows another transaction holds are
        left for later, so neither a commit nor another prune waits on this one), hand
        their records to ``export``, delete them (terminal ones only), then their steps,
        effects (the idempotency records of their keys go with the task row that
        deduplicates them), late effects and audit rows, and settle the counts rollup.
        Then the mailbox's events and the outbox's sent messages older than the cutoff
        (by ``sent_at``; unsent ones never, whatever their age) with the ``outbox_keys``
        lock rows of their keys, in batches too.
        Between batches the prune sleeps ``pace`` times as long as the batch took (default:
        1 on a single-writer database, SQLite, so waiting writers get the lock in between;
        0 on PostgreSQL, where nothing waits for it but it shares the server's CPU and
        disk: the worker's background prune passes 1).

        Raises:
            ValueError: ``older_than_s`` below 0 or not finite, ``batch_size`` below 1.
            LedgerError: as any operation (batches committed before stay committed).
            Exception: whatever ``export`` raises (that batch is rolled back).
        """
        try:
            check_finite(older_than_s, "older_than_s", minimum=0)
        except InvalidArguments as exc:
            raise ValueError(str(exc)) from None  # the Ledger contract's error
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        dialect = self.core.dialect
        if pace is None:
            pace = 1.0 if dialect.single_writer else 0.0
        started = time.monotonic()
        cutoff = self._now() - older_than_s
        if dry_run:
            row = dialect.run(lambda tx: PRUNE_COUNT.first(tx, {"cutoff": cutoff}), write=False)
            n = PruneCountRow(*(int(v) for v in row)) if row else PruneCountRow(0, 0, 0, 0, 0)
            outbox = (dialect.run(lambda tx: count_prunable(tx, cutoff), write=False)
                      if self.core.schema.has(OUTBOX) else 0)
            return PruneReport(older_than_s, cutoff, True, n.tasks, n.steps, n.effects,
                               n.late_effects, n.audit, 0, 0, by, time.monotonic() - started,
                               outbox=outbox)
        advance_counts(dialect)
        totals: Counter[str] = Counter()
        while True:
            t0 = time.monotonic()
            try:
                picked, done = dialect.run(
                    lambda tx: _prune_batch(tx, cutoff, batch_size, export))
                totals.update(done)
            except CommitOutcomeUnknown:
                picked = batch_size  # the next batch finds out (deletes are idempotent)
            if picked < batch_size:
                break
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        after: tuple[float, int] = (0.0, 0)  # the walk's position: (at, seq)
        while True:
            t0 = time.monotonic()
            walked, rows = dialect.run(functools.partial(
                _prune_orphans, cutoff=cutoff, after=after, limit=batch_size))
            totals.update(audit=len(rows), batches=1 if rows else 0)
            if walked is None:
                break
            after = walked
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        while True:  # the mailbox: events sent before the cutoff (DESIGN §3, waits)
            t0 = time.monotonic()
            gone = dialect.run(lambda tx: tx.execute("events_prune", {
                "cutoff": cutoff, "limit": batch_size}))
            totals.update(events=gone, batches=1 if gone else 0)
            if gone < batch_size:
                break
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        while self.core.schema.has(OUTBOX):  # sent outbox messages (DESIGN §6, row 10)
            t0 = time.monotonic()
            picked, gone = dialect.run(functools.partial(
                prune_outbox_batch, cutoff=cutoff, limit=batch_size))
            totals.update(outbox=gone, batches=1 if gone else 0)
            if picked < batch_size:
                break
            if pace > 0:
                time.sleep(pace * max(time.monotonic() - t0, 0.002))
        report = PruneReport(
            older_than_s, cutoff, False, totals["tasks"], totals["steps"], totals["effects"],
            totals["late_effects"], totals["audit"], totals["batches"], totals["exported"],
            by, time.monotonic() - started, totals["events"], totals["outbox"])
        if audit_empty or report.tasks or report.audit or report.events or report.outbox:
            detail = dumps_report(report)
            dialect.run(lambda tx: insert_audit(tx, [
                ("", tx.now, "prune", None, None, None, printable(by), detail)]))
        return report


def dumps_report(report: PruneReport) -> str:
    """The detail of a prune's audit row: the report without who and the dry-run flag."""
    return dumps({k: v for k, v in dataclasses.asdict(report).items()
                  if k not in ("by", "dry_run")})


def _prune_batch(
    tx: Tx, cutoff: float, limit: int,
    export: Callable[[list[dict[str, Any]]], None] | None,
) -> tuple[int, Counter[str]]:
    """One prune batch inside ``tx``: how many tasks it picked, and the rows it deleted
    by kind (counted by the caller once the transaction committed)."""
    batch: Counter[str] = Counter()
    picked = [r.id for r in PRUNE_PICK.all(tx, {"cutoff": cutoff, "limit": limit})]
    if not picked:
        return 0, batch
    upto = shared_mark(tx)
    exported = 0
    if export is not None:
        records = _export_records(tx, picked)
        export(records)
        exported = len(records)
    deleted = PRUNE_TASKS.all(tx, {"ids": picked})
    ids = [r.id for r in deleted]
    if ids:
        batch["steps"] = tx.execute("prune_steps", {"ids": ids})
        batch["effects"] = tx.execute("prune_effects", {"ids": ids})
        batch["late_effects"] = tx.execute("prune_late_effects", {"ids": ids})
        tx.execute("prune_batch_runs", {"ids": ids})  # counted with the task
        tx.execute("prune_forks", {"ids": ids})  # counted with the task
        audit_rows = PRUNE_AUDIT.all(tx, {"ids": ids})
        batch["audit"] = len(audit_rows)
        # The rollup counts tasks finished before the mark: those leave it; audit kinds
        # are counted for ever, so rows since the mark join it as they go.
        gone = Counter((r.name, r.state) for r in deleted if float(r.updated_at) < upto)
        tx.batch("counts_add_tasks", [{"name": name, "state": state, "n": -n}
                                      for (name, state), n in sorted(gone.items())])
        keep_audit_counts(tx, audit_rows, upto)
    batch.update(tasks=len(ids), batches=1 if ids else 0, exported=exported)
    return len(picked), batch


def _prune_orphans(
    tx: Tx, cutoff: float, after: tuple[float, int], limit: int
) -> tuple[tuple[float, int] | None, list[AuditGoneRow]]:
    """One step of the walk over audit rows older than ``cutoff`` (after ``after``):
    delete those whose task is gone. Returns where the walk goes on (None: at its end)
    and the deleted rows."""
    walked = PRUNE_AUDIT_WALK.all(tx, {"cutoff": cutoff, "from_at": after[0],
                                       "from_seq": after[1], "limit": limit})
    if not walked:
        return None, []
    upto = shared_mark(tx)
    rows = PRUNE_AUDIT_GONE.all(tx, {"seqs": [int(r.seq) for r in walked]})
    keep_audit_counts(tx, rows, upto)
    last = walked[-1]
    return ((float(last.at), int(last.seq)) if len(walked) == limit else None), rows


def _export_records(tx: Tx, ids: list[str]) -> list[dict[str, Any]]:
    """One JSON-ready record per task of ``ids`` with its history, stored text as
    stored (``params``, ``result``, step values, effect results and audit details are
    JSON text; SQLite text that was not valid UTF-8 comes with lone surrogates)."""
    steps: dict[str, list[dict[str, Any]]] = {}
    for s in CLAIM_STEPS.all(tx, {"ids": ids}):
        record = s._asdict()
        del record["task_id"]
        steps.setdefault(s.task_id, []).append(record)
    effects: dict[str, list[dict[str, Any]]] = {}
    for e in CLAIM_EFFECTS.all(tx, {"ids": ids}):
        record = e._asdict()
        del record["task_id"]
        record["via_lookup"] = bool(record["via_lookup"])
        effects.setdefault(e.task_id, []).append(record)
    audit: dict[str, list[dict[str, Any]]] = {}
    for a in PRUNE_EXPORT_AUDIT.all(tx, {"ids": ids}):
        record = a._asdict()
        del record["task_id"]
        audit.setdefault(a.task_id, []).append(record)
    late: dict[str, list[dict[str, Any]]] = {}
    for le in PRUNE_EXPORT_LATE.all(tx, {"ids": ids}):
        record = le._asdict()
        del record["task_id"]
        late.setdefault(le.task_id, []).append(record)
    records = []
    for t in sorted(TASK_GET_MANY.all(tx, {"ids": ids}), key=lambda r: (r.updated_at, r.id)):
        task = t._asdict()
        tid = t.id
        records.append({"task": task, "steps": steps.get(tid, []),
                        "effects": effects.get(tid, []), "audit": audit.get(tid, []),
                        "late_effects": late.get(tid, [])})
    return records
