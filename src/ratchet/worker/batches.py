"""Long work in batches (DESIGN §6 row 9): ``ctx.batches`` with a contiguous watermark, and
the fan-out and fan-in of a sharded job (DESIGN §8, logical shards).

``ctx.batches(name, source, fn, size=..., parallel=...)`` reads items from ``source(start)``
and hands them to ``fn(batch, position)`` in batches of ``size``, up to ``parallel`` at a
time (they may finish out of order). Each batch, once ``fn`` returned, is committed by a
fenced write of the task's holder that carries a
:class:`~ratchet.ledger.base.BatchMark`; the ledger moves the run's **watermark** over every
batch contiguous with it (:mod:`ratchet.ledger.ops.batches`). A new attempt resumes from the
watermark, skips the batches committed above it, and processes again every batch whose
commit was lost, even when a later batch committed: the watermark is the contiguous
position, not the last written one.

A batch is one unit of exactly-once *commit*, not of execution: after a crash, a batch whose
commit was lost runs again. Its external effects go through ``ctx.effect`` (called from
``fn``, with keys derived from the position): they belong to that batch occurrence (stored
as ``ratchet:batch:<run>@<position>/<effect>``), so the second run of a batch finds the
first run's effects (recorded results, open intents to settle) and each happens once.
Inside ``fn`` only ``ctx.effect`` may be called (and it may not register a compensation):
steps, waits, children and nested batches belong to the task's ordered code path, which
batches running side by side do not have.

How far ahead of the watermark batches may run is bounded (:data:`WINDOW_BATCHES` per
``parallel``): the ledger keeps the committed batches above the watermark in the run's row,
so a resume reads one row whatever the number of finished batches.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from ..errors import (
    ChildFailed,
    InvalidArguments,
    LedgerUnavailable,
    NonDeterministicReplay,
    StaleGeneration,
    TransactionMisuse,
)
from ..faults import point as fault_point
from ..ledger.base import (
    BATCH_RUN_PREFIX,
    BatchMark,
    BatchRun,
    EffectRecord,
    TaskWrite,
    batch_effect_prefix,
)
from ..serde import dumps, loads
from ..shards import SHARD_PARAM, check_shards
from ..states import State
from ..validation import check_checkpoint_name
from .checkpoints import HistoryEnd
from .effects import _until_ledger_answers
from .waits import ChildHandle, WorkflowCalls

__all__ = ["MAX_BATCH_SIZE", "MAX_PARALLEL", "WINDOW_BATCHES", "BatchCalls", "BatchCounts",
           "run_shard_job"]

MAX_BATCH_SIZE = 1_000_000
"""Most items in one batch."""

MAX_PARALLEL = 64
"""Most batches of one run in flight at once."""

WINDOW_BATCHES = 4
"""Batches may start at most ``WINDOW_BATCHES * parallel`` batches past the watermark: a
slow batch holds the others back that far, and no further (the run's row keeps the
committed batches above the watermark, so their number stays bounded)."""

_local = threading.local()


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """What ``fn`` of ``ctx.batches`` may return for a batch whose items did not all
    succeed: how many ``failed`` and how many were ``skipped`` (the rest succeeded).
    Returning None means every item succeeded.

    Attributes:
        failed: items that failed (a count, >= 0).
        skipped: items deliberately left out (a count, >= 0).
    """

    failed: int = 0
    skipped: int = 0


def _counts(value: object, size: int, where: str) -> tuple[int, int, int]:
    """(succeeded, failed, skipped) of a batch of ``size`` items from what ``fn`` returned."""
    if value is None:
        return size, 0, 0
    if not isinstance(value, BatchCounts):
        raise InvalidArguments(
            f"{where}: fn must return None or ratchet.BatchCounts(failed=, skipped=), got "
            f"{type(value).__name__}")
    failed, skipped = value.failed, value.skipped
    if (isinstance(failed, bool) or isinstance(skipped, bool) or not isinstance(failed, int)
            or not isinstance(skipped, int) or failed < 0 or skipped < 0
            or failed + skipped > size):
        raise InvalidArguments(
            f"{where}: BatchCounts(failed={failed!r}, skipped={skipped!r}) must be ints >= 0 "
            f"adding up to at most the batch's {size} items")
    return size - failed - skipped, failed, skipped


def _check_int(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArguments(f"{what} must be an int from {low} to {high}, got {value!r}")
    return value


def _items(source: Callable[[int], Iterable[Any]] | Sequence[Any], start: int
           ) -> Iterable[Any]:
    if callable(source):
        return source(start)
    # By index from start: islice(source, start, None) would step over every item before
    # it, and a resume far into a long list would cost as much as reading it.
    return map(source.__getitem__, range(start, len(source)))


class BatchCalls(WorkflowCalls):
    """``ctx.batches`` and the batch scope of ``ctx.effect`` (see the module docstring)."""

    def _batch_scope(self) -> Any:
        """The context of the batch this thread runs for this task (a
        :class:`~ratchet.worker.context.TaskContext` of its own), or None."""
        scope = getattr(_local, "scope", None)
        return scope[1] if scope is not None and scope[0] is self else None

    _batch_owner: int | None = None
    """While a ``ctx.batches`` run is active: the thread that called it (the only other
    threads that may use the context are the run's own batch threads)."""

    def _boundary(self) -> None:
        if self._batch_scope() is not None:
            raise TransactionMisuse(
                "inside the function of ctx.batches only ctx.effect may be called: steps, "
                "waits, children and nested batches belong to the task's ordered code path, "
                "which batches running side by side do not have")
        owner = self._batch_owner
        if owner is not None and threading.get_ident() != owner:
            raise TransactionMisuse(
                "the task context was used from a thread that ctx.batches did not start, "
                "while a batch run is active: a batch's effects must be called from the "
                "thread its fn runs on (use parallel= for concurrency inside a run)")
        super()._boundary()

    def batches(self, name: str, source: Callable[[int], Iterable[Any]] | Sequence[Any],
                fn: Callable[[list[Any], int], BatchCounts | None], *, size: int,
                parallel: int = 1, total: int | None = None) -> dict[str, Any]:
        """Process ``source``'s items in batches, resumable from a contiguous watermark.

        Args:
            name: the run's name (occurrences as for ``ctx.step``).
            source: ``source(start)`` yields the items from 0-based position ``start`` on
                (a keyset query, a file from an offset...), the same items for the same
                position on every attempt; or a sequence (a list), read from ``start``.
            fn: ``fn(batch, position)`` processes one batch (a list of up to ``size`` items
                starting at item ``position``); returns None (all succeeded) or
                :class:`BatchCounts`. It may call ``ctx.effect`` (keys derived from the
                position), nothing else of ``ctx``. With ``parallel > 1`` it runs on
                threads of its own, up to ``parallel`` at once.
            size: items per batch (1 .. :data:`MAX_BATCH_SIZE`).
            parallel: batches in flight at once (1 .. :data:`MAX_PARALLEL`).
            total: the item count when known (progress and ETA; a sequence's length by
                default).

        Returns:
            ``{"name", "items", "succeeded", "failed", "skipped", "batches"}`` over the
            whole run (every attempt); a checkpoint, so a replay returns the same.

        Raises:
            InvalidArguments: bad arguments, or ``fn`` returned something else than None or
                :class:`BatchCounts`.
            WriteRejected: the source yielded other items for a position than an earlier
                attempt committed (batches that overlap), or a count that does not add up.
            Exception: the first exception ``fn`` raised (the batches in flight finish and
                commit first; the next attempt resumes from the watermark).
        """
        check_checkpoint_name(name, "batches name")
        size = _check_int(size, "size", 1, MAX_BATCH_SIZE)
        parallel = _check_int(parallel, "parallel", 1, MAX_PARALLEL)
        if not callable(fn):
            raise InvalidArguments(f"fn must be callable as fn(batch, position), got {fn!r}")
        if not callable(source) and not isinstance(source, Sequence):
            raise InvalidArguments("source must be callable as source(start) or a sequence, "
                                   f"got {type(source).__name__}")
        if total is None and not callable(source):
            total = len(source)
        if total is not None:
            total = _check_int(total, "total", 0, 2**62)
        self._boundary()
        cp = self._checkpoint("step", f"{BATCH_RUN_PREFIX}{name}")
        stored = self._steps.get(cp.stored_name)
        if stored is not None:
            report: dict[str, Any] = loads(stored, f"stored value of {cp.describe()}")
            return report
        if self.compensating:
            raise HistoryEnd(cp.describe())
        run = cp.stored_name
        if self.unsaved_steps():  # what came before the run is durable before its batches
            self._commit(f"batches_open:{run}")
        ledger = self._writer.ledger
        current, effects = _until_ledger_answers(
            lambda: ledger.batch_open(self.task_id, run), max(1.0, self._lease.remaining_s()))
        runner = _Run(self, run, name, fn, size, parallel, total, current, effects)
        self._batch_owner = threading.get_ident()
        try:
            end = (current.watermark if current is not None and current.done
                   else runner.run(source))
        finally:
            self._batch_owner = None
        report = runner.report()
        self._steps[run] = _json(report)
        self._unsaved.append((run, self._steps[run], cp.seq))
        self._commit(f"batches_done:{run}", batches=[BatchMark(
            run, end, end, total=total, done=True)])
        return report

    def _scoped(self, run: str, start: int, effects: Mapping[str, EffectRecord]
                ) -> BatchCalls:
        """A context for the batch at ``start``: shares the task's lease, writer, stop
        and hooks; its checkpoints are the batch's own (stored under
        :func:`~ratchet.ledger.base.batch_effect_prefix`)."""
        sub = copy.copy(self)
        sub._scope = prefix = batch_effect_prefix(run, start)
        sub._parent = self
        sub._batch_owner = None
        sub._steps = {}
        sub._effects = {n: r for n, r in effects.items() if n.startswith(prefix)}
        sub._history, sub._recorded_seq, sub._occurrences = {}, {}, {}
        sub._next_seq = 0
        sub._unsaved, sub._sent, sub._saved = [], 0, set()
        sub._in_step = sub._in_transaction = sub._flush_inflight = False
        sub._flush_failed = sub._flush_stale = False
        sub._flush_rejected = None
        sub._on_block = None  # the executor counts the task's thread, not a batch's
        sub.downstream_calls = {}
        sub.compensations_found = []
        sub.compensating = sub.compensation_mode = False
        return sub

    def submit_shards(self, name: str, params: Mapping[str, Any], count: int
                      ) -> list[ChildHandle]:
        """A sharded job's fan-out: one child of task ``name`` per shard ``0 .. count - 1``
        (``ctx.shard`` tells each its place), with ``params``; one checkpoint, keys
        derived from this task."""
        count = check_shards(count)
        return self.submit_many(
            name, [dict(params)] * count,
            _reserved=[{SHARD_PARAM: {"index": i, "count": count}} for i in range(count)])


def _json(value: Any) -> str:
    return dumps(value, what="batches report")


class _Run:
    """One ``ctx.batches`` call: reads the source, runs the batches, commits them."""

    def __init__(self, ctx: BatchCalls, run: str, name: str,
                 fn: Callable[[list[Any], int], BatchCounts | None], size: int, parallel: int,
                 total: int | None, current: BatchRun | None,
                 effects: Mapping[str, EffectRecord]) -> None:
        self.ctx, self.run_name, self.name, self.fn = ctx, run, name, fn
        self.size, self.parallel, self.total = size, parallel, total
        self.effects = effects
        self.watermark = current.watermark if current is not None else 0
        self.committed: dict[int, int] = dict(current.above) if current is not None else {}
        # The batches earlier attempts committed above the watermark, to skip: a copy, for
        # the watermark's advance pops from ``committed`` while the source is still read.
        self.earlier: dict[int, int] = dict(self.committed)
        self.succeeded = current.succeeded if current is not None else 0
        self.failed = current.failed if current is not None else 0
        self.skipped = current.skipped if current is not None else 0
        self.batches = current.batches if current is not None else 0
        self._lock = threading.Lock()

    def report(self) -> dict[str, Any]:
        """The run's totals (every attempt's committed batches)."""
        return {"name": self.name, "items": self.succeeded + self.failed + self.skipped,
                "succeeded": self.succeeded, "failed": self.failed, "skipped": self.skipped,
                "batches": self.batches}

    def run(self, source: Callable[[int], Iterable[Any]] | Sequence[Any]) -> int:
        """Process every batch from the watermark on; return the end position."""
        ctx = self.ctx
        items = iter(_items(source, self.watermark))
        position = self.watermark
        window = WINDOW_BATCHES * self.parallel * self.size
        pool = (ThreadPoolExecutor(self.parallel, thread_name_prefix=f"batch-{ctx.task_id}")
                if self.parallel > 1 else None)
        inflight: dict[Future[None], int] = {}
        error: BaseException | None = None
        try:
            while True:
                ctx._boundary()
                batch = list(itertools.islice(items, self.size))
                if not batch:
                    break
                start, end = position, position + len(batch)
                position = end
                done_end = self.earlier.get(start)
                if done_end is not None:
                    if done_end != end:
                        raise NonDeterministicReplay(
                            ctx.task_id, 0, f"batch [{start}, {done_end}) of {self.name!r}",
                            f"batch [{start}, {end}) (the source yields other items now)")
                    continue
                if pool is None:
                    self._one(start, batch)
                    continue
                while inflight and (len(inflight) >= self.parallel
                                    or start - self._low(inflight) >= window):
                    self._reap(inflight, FIRST_COMPLETED)
                inflight[pool.submit(self._one, start, batch)] = start
        except BaseException as exc:
            error = exc
        finally:
            if inflight:  # the batches in flight finish and commit: their progress counts
                try:
                    self._reap(inflight, None)
                except BaseException as exc:
                    error = error or exc
            if pool is not None:
                pool.shutdown(wait=True)
        if error is not None:
            raise error
        return position

    def _low(self, inflight: Mapping[Future[None], int]) -> int:
        """The lowest position not yet committed (at most the lowest batch in flight)."""
        return min(min(inflight.values()), self.watermark_local())

    def watermark_local(self) -> int:
        """The watermark as this attempt knows it (the ledger computes the same)."""
        with self._lock:
            return self.watermark

    def _reap(self, inflight: dict[Future[None], int], how: str | None) -> None:
        """Wait for one batch (``FIRST_COMPLETED``) or all of them (None); raise the first
        exception a finished batch raised."""
        finished, _ = wait(list(inflight), return_when=how or ALL_COMPLETED)
        error: BaseException | None = None
        for future in finished:
            del inflight[future]
            exc = future.exception()
            if exc is not None and error is None:
                error = exc
        if error is not None:
            raise error

    def _one(self, start: int, batch: list[Any]) -> None:
        """Run ``fn`` on one batch in its own scope, then commit it (fenced)."""
        ctx = self.ctx
        sub = ctx._scoped(self.run_name, start, self.effects)
        end = start + len(batch)
        where = f"batch [{start}, {end}) of {self.name!r}"
        _local.scope = (ctx, sub)
        try:
            value = self.fn(batch, start)
        finally:
            _local.scope = None
            for downstream, n in sub.downstream_calls.items():
                with self._lock:
                    ctx.downstream_calls[downstream] = ctx.downstream_calls.get(downstream,
                                                                                0) + n
            if sub.failed_downstream is not None:
                ctx.failed_downstream = sub.failed_downstream
            if sub.ledger_outage is not None:
                ctx.ledger_outage = sub.ledger_outage
        succeeded, failed, skipped = _counts(value, len(batch), where)
        mark = BatchMark(self.run_name, start, end, succeeded, failed, skipped, self.total)
        fault_point("batch.before_commit")
        write = TaskWrite(ctx.task_id, ctx.generation, ctx.holder,
                          f"batch:{self.run_name}@{start}", batches=[mark])
        try:
            outcome = ctx._writer.commit(write)
        except LedgerUnavailable as exc:
            ctx.ledger_outage = exc
            raise
        if outcome.stale:
            raise StaleGeneration(ctx.task_id, ctx.generation, write.operation)
        fault_point("batch.after_commit")
        with self._lock:
            self.committed[start] = end
            self.succeeded += succeeded
            self.failed += failed
            self.skipped += skipped
            self.batches += 1
            while self.watermark in self.committed:
                self.watermark = self.committed.pop(self.watermark)


def run_shard_job(ctx: BatchCalls, name: str, params: Mapping[str, Any], count: int
                  ) -> dict[str, Any]:
    """The body of a sharded job's parent (``App.submit_sharded``): submit one child per
    shard, wait for all of them, and return ``{"shards", "totals", "results"}``, where
    ``totals`` sums the numeric fields the shards' results share (``succeeded``,
    ``failed``, ``skipped``, ``items`` of their ``ctx.batches`` reports, say).

    A job retried by an operator after some of its failed shards were retried waits for
    those shards again (a new ``ctx.gather`` checkpoint for them): shards still ``FAILED``
    (or ``CANCELLED``, ``COMPENSATED``) keep their recorded failure.

    Raises:
        ChildFailed: a shard did not succeed (the first in shard order), once every shard
            has ended: the job is ``FAILED`` and ``ratchet check`` shows what is missing;
            retry the failed shards, then the job.
    """
    handles = ctx.submit_shards(name, params, count)
    results: list[Any] = ctx.gather(handles, return_exceptions=True)
    while True:
        failed = [i for i, r in enumerate(results) if isinstance(r, ChildFailed)]
        if not failed:
            break
        infos = {i.task_id: i for i in ctx.app.ledger.get_many(
            [handles[i].task_id for i in failed])}
        again = [i for i in failed if (info := infos.get(handles[i].task_id)) is not None
                 and info.state not in _FAILED_FOR_GOOD]
        if not again:
            raise results[failed[0]]
        for i, result in zip(again, ctx.gather([handles[i] for i in again],
                                               return_exceptions=True), strict=True):
            results[i] = result
    totals: dict[str, int] = {}
    for result in results:
        parts = [result] if isinstance(result, dict) else []
        for part in parts:
            for key, value in part.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
    return {"shards": count, "totals": totals, "results": results}


_FAILED_FOR_GOOD = frozenset({State.FAILED, State.CANCELLED, State.COMPENSATED})
"""A shard in one of these states keeps its recorded failure when its job is retried."""
