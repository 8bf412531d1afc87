"""What long work in batches carries through the ledger (DESIGN §6 row 9, the contiguous
watermark): a committed batch as a holder's fenced write carries it (:class:`BatchMark`),
and a batch run as read back (:class:`BatchRun`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BATCH_EFFECT_PREFIX", "BATCH_RUN_PREFIX", "BatchActivity", "BatchMark", "BatchRun",
           "batch_effect_prefix"]

BATCH_RUN_PREFIX = "ratchet:batches:"
"""Stored checkpoint names of ``ctx.batches`` runs start with this (the rest is the run's
name with its occurrence: ``ratchet:batches:import``, ``ratchet:batches:import#2``)."""

BATCH_EFFECT_PREFIX = "ratchet:batch:"
"""Stored names of effects made inside a batch function start with this: they belong to
one batch occurrence, not to the task's ordered code path, so a claim does not load them
(:func:`batch_effect_prefix`)."""


def batch_effect_prefix(run: str, start: int) -> str:
    """The stored-name prefix of the effects made by the batch at item position ``start``
    of the run ``run`` (a stored run name, :data:`BATCH_RUN_PREFIX`): the position is
    zero-padded to 20 digits, so that the names of one run sort by position and the
    effects of the batches at or past a watermark are one index range."""
    return f"{BATCH_EFFECT_PREFIX}{run[len(BATCH_RUN_PREFIX):]}@{start:020d}/"


@dataclass(frozen=True, slots=True)
class BatchMark:
    """One committed batch of a ``ctx.batches`` run, carried by the holder's fenced write
    (:attr:`TaskWrite.batches <ratchet.ledger.base.TaskWrite.batches>`).

    Attributes:
        run: the run's stored checkpoint name (:data:`BATCH_RUN_PREFIX`).
        start: position of the batch's first item (0-based).
        end: position after its last item (``end - start`` items; ``start == end`` for a
            mark that only finishes the run).
        succeeded, failed, skipped: how the batch's items ended (they add up to
            ``end - start``).
        total: the run's item count when known (sent with every mark), or None.
        done: the source is exhausted at ``end`` and every batch is committed.
    """

    run: str
    start: int
    end: int
    succeeded: int = 0
    failed: int = 0
    skipped: int = 0
    total: int | None = None
    done: bool = False


@dataclass(frozen=True, slots=True)
class BatchRun:
    """A ``ctx.batches`` run of a task as the ledger holds it.

    Attributes:
        task_id: the task.
        run: its stored checkpoint name (``ratchet:batches:<name>[#N]``).
        watermark: every item position below it is committed (the contiguous position,
            never the last written one).
        above: the batches committed past the watermark, ``(start, end)`` pairs in order.
        succeeded, failed, skipped: item counts of the committed batches.
        batches: how many batches committed.
        total: the run's item count when known, else None.
        done: the source was exhausted and every batch committed.
        started_at: ledger time of the first committed batch, epoch seconds.
        updated_at: ledger time of the last one, epoch seconds.
        generation: the fencing token of the holder that wrote last.
    """

    task_id: str
    run: str
    watermark: int
    above: tuple[tuple[int, int], ...]
    succeeded: int
    failed: int
    skipped: int
    batches: int
    total: int | None
    done: bool
    started_at: float
    updated_at: float
    generation: int

    @property
    def name(self) -> str:
        """The run's name as the task code gave it (with ``#N`` past the first)."""
        return self.run[len(BATCH_RUN_PREFIX):] if self.run.startswith(
            BATCH_RUN_PREFIX) else self.run

    @property
    def processed(self) -> int:
        """Items of the committed batches: succeeded + failed + skipped."""
        return self.succeeded + self.failed + self.skipped

    @property
    def committed_items(self) -> int:
        """Items the committed positions cover: the watermark plus the batches above it
        (equal to :attr:`processed` unless a batch was counted twice or lost)."""
        return self.watermark + sum(end - start for start, end in self.above)


@dataclass(frozen=True, slots=True)
class BatchActivity:
    """The unfinished ``ctx.batches`` runs of one task type (tasks not ended), for metrics.

    Attributes:
        name: the task type.
        runs: how many runs.
        watermark: their watermarks, summed (items).
        processed: items of their committed batches, summed.
    """

    name: str
    runs: int
    watermark: int
    processed: int
