"""Long work in batches (DESIGN §6 row 9): the contiguous watermark of a ``ctx.batches``
run, moved by the holder's fenced commits.

A batch's commit carries a :class:`~ratchet.ledger.base.BatchMark` (its item positions and
counts). The commit applies it after the task's fence passed, in the same transaction
(:func:`apply_marks`): the batch joins the committed batches above the watermark, and the
watermark advances over every batch that is now contiguous with it. So the watermark is the
*contiguous* committed position, never the last written one: a batch whose commit was lost
while a later one committed leaves a hole the watermark cannot pass, and a resume from the
watermark processes it again (and skips the later one, found in ``above``). A mark for
positions already committed (a re-sent write) changes nothing; the watermark never moves
backwards.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...errors import WriteRejected
from ..base import (
    BatchActivity,
    BatchMark,
    BatchRun,
    EffectRecord,
    batch_effect_prefix,
)
from ..dialect import Tx
from ..rows import BATCH_EFFECTS, BATCH_RUNS_ACTIVE, BATCH_RUNS_READ, effect_record
from ..shapes import BatchRunRow
from .core import EngineCore

__all__ = ["Batches", "apply_marks", "batch_run", "merge_mark"]


def batch_run(row: BatchRunRow) -> BatchRun:
    """A :class:`~ratchet.ledger.base.BatchRun` from its row."""
    above = tuple((int(s), int(e)) for s, e in json.loads(row.above or "[]"))
    return BatchRun(
        task_id=row.task_id, run=row.run, watermark=int(row.watermark), above=above,
        succeeded=int(row.succeeded), failed=int(row.failed), skipped=int(row.skipped),
        batches=int(row.batches), total=None if row.total is None else int(row.total),
        done=bool(row.done), started_at=float(row.started_at),
        updated_at=float(row.updated_at), generation=int(row.generation))


def merge_mark(run: BatchRun | None, task_id: str, generation: int, mark: BatchMark,
               now: float) -> BatchRun:
    """The run after ``mark`` (pure; the commit's half of the watermark).

    A batch at positions already committed (below the watermark, or a batch above it with
    the same start) is a re-send: only ``total`` / ``done`` may change. Otherwise the batch
    joins ``above`` and the watermark advances over the contiguous batches.

    Raises:
        WriteRejected: the mark's positions or counts do not add up (``end < start``,
            negative counts, counts not equal to the batch's item count), or it overlaps a
            committed batch at another start (the source changed between attempts), or it
            finishes a run whose watermark is not at its end.
    """
    if run is None:
        run = BatchRun(task_id, mark.run, 0, (), 0, 0, 0, 0, None, False, now, now, generation)
    size = mark.end - mark.start
    counts = (mark.succeeded, mark.failed, mark.skipped)
    if mark.start < 0 or size < 0 or min(counts) < 0 or sum(counts) != size:
        raise WriteRejected(
            f"batch mark of run {mark.run!r} at [{mark.start}, {mark.end}) does not add up "
            f"(succeeded {mark.succeeded} + failed {mark.failed} + skipped {mark.skipped} "
            f"must be its {size} items)")
    watermark, above = run.watermark, list(run.above)
    succeeded, failed, skipped, batches = run.succeeded, run.failed, run.skipped, run.batches
    fresh = size > 0 and mark.start >= watermark and all(s != mark.start for s, _ in above)
    if fresh:
        for s, e in above:
            if s < mark.end and mark.start < e:
                raise WriteRejected(
                    f"batch [{mark.start}, {mark.end}) of run {mark.run!r} overlaps the "
                    f"committed batch [{s}, {e}): the source must yield the same items "
                    "from a position on every attempt")
        above.append((mark.start, mark.end))
        above.sort()
        succeeded, failed, skipped = (succeeded + mark.succeeded, failed + mark.failed,
                                      skipped + mark.skipped)
        batches += 1
        while above and above[0][0] <= watermark:
            watermark = max(watermark, above.pop(0)[1])
    total = mark.total if mark.total is not None else run.total
    done = run.done
    if mark.done:
        if above or watermark != mark.end:
            raise WriteRejected(
                f"run {mark.run!r} finished at position {mark.end}, but its watermark is "
                f"{watermark} with {len(above)} batch(es) above it")
        done = True
        total = watermark if total is None else total
    return BatchRun(task_id, mark.run, watermark, tuple(above), succeeded, failed, skipped,
                    batches, total, done, run.started_at, now, generation)


def apply_marks(tx: Tx, marks: Sequence[tuple[str, int, BatchMark]], now: float) -> None:
    """Apply the batch marks of fenced writes that passed their fence (``(task id,
    generation, mark)``, in write order), in the commit's transaction: one read of the
    runs, one upsert.

    Raises:
        WriteRejected: a mark does not add up (:func:`merge_mark`); the whole commit is
            refused.
    """
    ids = sorted({task_id for task_id, _, _ in marks})
    runs: dict[tuple[str, str], BatchRun] = {
        (r.task_id, r.run): batch_run(r) for r in BATCH_RUNS_READ.all(tx, {"ids": ids})}
    touched: dict[tuple[str, str], BatchRun] = {}
    for task_id, generation, mark in marks:
        key = (task_id, mark.run)
        merged = merge_mark(runs.get(key), task_id, generation, mark, now)
        runs[key] = touched[key] = merged
    tx.batch("batch_runs_upsert", [_upsert_row(r) for r in touched.values()], now=now)


def _upsert_row(run: BatchRun) -> dict[str, Any]:
    return {"task_id": run.task_id, "run": run.run, "watermark": run.watermark,
            "above": json.dumps([list(a) for a in run.above]), "succeeded": run.succeeded,
            "failed": run.failed, "skipped": run.skipped, "batches": run.batches,
            "total": run.total, "done": run.done, "started_at": run.started_at,
            "generation": run.generation}


class Batches:
    """:meth:`Ledger.batch_open <ratchet.ledger.base.Ledger.batch_open>`,
    ``batch_runs`` and ``batch_activity``."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def batch_open(self, task_id: str, run: str
                   ) -> tuple[BatchRun | None, dict[str, EffectRecord]]:
        """See :meth:`Ledger.batch_open`: the run (None before its first committed batch)
        and the effects of its batches at or past the watermark, by stored name; one read
        transaction, two statements."""
        def body(tx: Tx) -> tuple[BatchRun | None, dict[str, EffectRecord]]:
            found = [batch_run(r) for r in BATCH_RUNS_READ.all(tx, {"ids": [task_id]})
                     if r.run == run]
            current = found[0] if found else None
            watermark = current.watermark if current is not None else 0
            lo = batch_effect_prefix(run, watermark)
            hi = batch_effect_prefix(run, 0)[:-21] + "~"  # past every position
            effects = {e.name: effect_record(e)
                       for e in BATCH_EFFECTS.all(tx, {"id": task_id, "lo": lo, "hi": hi})}
            return current, effects

        return self.core.dialect.run(body, write=False)

    def batch_runs(self, task_ids: Sequence[str]) -> list[BatchRun]:
        """See :meth:`Ledger.batch_runs`: the batch runs of the tasks, by task then run."""
        if not task_ids:
            return []
        rows = self.core.dialect.run(
            lambda tx: BATCH_RUNS_READ.all(tx, {"ids": sorted(set(task_ids))}), write=False)
        return [batch_run(r) for r in rows]

    def batch_activity(self) -> list[BatchActivity]:
        """See :meth:`Ledger.batch_activity`: per task type, the unfinished runs of tasks
        not ended, their summed watermarks and processed items."""
        rows = self.core.dialect.run(lambda tx: BATCH_RUNS_ACTIVE.all(tx), write=False)
        return [BatchActivity(r.name, int(r.runs), int(r.watermark or 0),
                              int(r.processed or 0)) for r in rows]

