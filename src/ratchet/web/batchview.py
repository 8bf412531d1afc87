"""The batch progress bars of the dashboard's task page: one per ``ctx.batches`` run of the
task, and for a sharded job (``App.submit_sharded``) one per run of each of its shards.

Pure functions over :class:`~ratchet.control.TaskTimeline` (its ``batches``, ``shards``,
``shard_batches`` and ``children``); the template ``batches.html`` draws them with the
HTML ``<progress>`` element (the pages' content security policy allows no inline style).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..control import BatchProgress, TaskInfo, TaskTimeline
from ..shards import task_shard
from ..states import TERMINAL
from .present import duration, rate

__all__ = ["MAX_SHARD_BARS", "BatchBar", "BatchBars", "batch_bars", "shard_place"]

MAX_SHARD_BARS = 200
"""The most shard runs a sharded job's page draws (in shard order; the rest are counted,
and ``GET /api/tasks/{id}/batches`` lists every one)."""


@dataclass(frozen=True, slots=True)
class BatchBar:
    """One run as the task page draws it.

    Attributes:
        task_id: the task whose run it is (a shard's, on a job's page).
        run: the run's name.
        shard: ``"i/n"`` for a shard's run on its job's page, else None.
        state: the state of the run's task (a shard's, on a job's page).
        watermark: every position below it is committed (items).
        total: the item count, None when unknown (the bar then has no end).
        percent: ``watermark / total`` in percent (one decimal), None without a total.
        position: ``"400 / 1000 (40.0%)"``, or ``"400 (total unknown)"``.
        succeeded, failed, skipped, batches: counts of the committed batches.
        above: committed batches past the watermark.
        rate: ``"12.5 items/s"``, ``-`` before there is one.
        eta: ``"4 min 05 s"``, ``done``, ``stopped`` (its task ended before the run
            finished), or ``-`` (no total or no rate).
        done: the run finished.
    """

    task_id: str
    run: str
    shard: str | None
    state: str
    watermark: int
    total: int | None
    percent: float | None
    position: str
    succeeded: int
    failed: int
    skipped: int
    batches: int
    above: int
    rate: str
    eta: str
    done: bool


@dataclass(frozen=True, slots=True)
class BatchBars:
    """What the task page's batch section shows.

    Attributes:
        own: the task's own runs.
        shards: a sharded job's shard count, else None.
        shard_bars: a sharded job's shards' runs, by shard index then run name.
        pending: shard places (``"i/n"``) with no batch committed yet.
        shard: the task's own place ``"i/n"`` when it is a shard, else None.
        hidden: shard runs past :data:`MAX_SHARD_BARS`, not drawn.
    """

    own: list[BatchBar]
    shards: int | None
    shard_bars: list[BatchBar]
    pending: list[str]
    shard: str | None
    hidden: int = 0


def shard_place(task: TaskInfo) -> tuple[int, int] | None:
    """``(index, count)`` of a shard task (its stored params, key ``"ratchet:shard"``),
    else None."""
    shard = task_shard(task.params)
    return None if shard is None else (shard.index, shard.count)


def _bar(p: BatchProgress, task: TaskInfo, shard: str | None) -> BatchBar:
    percent = None
    if p.total is not None:
        percent = round(100.0 * p.watermark / p.total, 1) if p.total else 100.0
        position = f"{p.watermark} / {p.total} ({percent:.1f}%)"
    else:
        position = f"{p.watermark} (total unknown)"
    if p.done:
        eta = "done"
    elif task.state in TERMINAL:
        eta = "stopped"
    else:
        eta = duration(p.eta_s)
    return BatchBar(p.task_id, p.name, shard, str(task.state), p.watermark, p.total, percent,
                    position, p.succeeded, p.failed, p.skipped, p.batches, len(p.above),
                    rate(p.rate_per_s, " items/s"), eta, p.done)


def batch_bars(tl: TaskTimeline) -> BatchBars:
    """The bars of ``tl``'s task page (see :class:`BatchBars`)."""
    own = [_bar(p, tl.task, None) for p in tl.batches]
    places = {c.task_id: (place, c) for c in tl.children
              if (place := shard_place(c)) is not None}
    shard_bars: list[tuple[int, BatchBar]] = []
    started: set[str] = set()
    for p in tl.shard_batches:
        if p.task_id not in places:
            continue
        (index, count), child = places[p.task_id]
        started.add(p.task_id)
        shard_bars.append((index, _bar(p, child, f"{index}/{count}")))
    shard_bars.sort(key=lambda ib: (ib[0], ib[1].run))
    pending = [f"{i}/{n}" for tid, ((i, n), _c) in sorted(places.items(),
                                                           key=lambda kv: kv[1][0][0])
               if tid not in started] if tl.shards is not None else []
    mine = shard_place(tl.task)
    return BatchBars(own, tl.shards, [b for _, b in shard_bars[:MAX_SHARD_BARS]], pending,
                     f"{mine[0]}/{mine[1]}" if mine else None,
                     max(0, len(shard_bars) - MAX_SHARD_BARS))
