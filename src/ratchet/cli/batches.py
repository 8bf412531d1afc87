"""Batches and sharded jobs on the command line: ``ratchet check`` (do a task's item
counts add up) and the batch part of ``ratchet inspect`` (each ``ctx.batches`` run's
watermark, counts, rate and ETA; a shard's place; a sharded job's shards).

Everything here reads :class:`~ratchet.control.Control` records only:
:class:`~ratchet.control.ConservationReport` and :class:`~ratchet.control.BatchProgress`
(on :class:`~ratchet.control.TaskTimeline`).
"""

from __future__ import annotations

from collections.abc import Sequence

import typer
from rich.table import Table

from ..capacity import span
from ..control import (
    BatchProgress,
    ConservationLine,
    ConservationReport,
    Control,
    TaskInfo,
    TaskTimeline,
)
from ..shards import task_shard
from ..states import TERMINAL
from .guard import guard
from .options import JsonOpt, LedgerOpt, TaskArg
from .render import console, echo_json, field, line

__all__ = [
    "EXIT_DOES_NOT_ADD_UP",
    "MAX_ABOVE_SHOWN",
    "MAX_SHARD_ROWS",
    "above_text",
    "check",
    "eta_text",
    "print_batches",
    "progress_text",
    "rate_text",
    "run_summary",
    "shard_place",
]

EXIT_DOES_NOT_ADD_UP = 1
"""The exit status of ``ratchet check`` when a line does not add up (a Ratchet error, such
as no such task or no ledger, exits with the error table's status as every command does)."""

MAX_SHARD_ROWS = 100
"""The most shards ``ratchet inspect`` lists as text, in shard order (``--json`` has every
one)."""

MAX_ABOVE_SHOWN = 4
"""Committed batches above the watermark listed by position in ``ratchet inspect`` (the
rest are counted; ``--json`` lists every one)."""


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def progress_text(p: BatchProgress) -> str:
    """A run's position for people: ``"400 / 1000 (40.0%)"``, ``"400 (total unknown)"``;
    `` done`` appended once it finished."""
    if p.total is None:
        text = f"{p.watermark} (total unknown)"
    else:
        percent = 100.0 * p.watermark / p.total if p.total else 100.0
        text = f"{p.watermark} / {p.total} ({percent:.1f}%)"
    return f"{text} done" if p.done else text


def rate_text(p: BatchProgress) -> str:
    """Items per second, ``"12.5 items/s"`` (three significant digits; whole items from
    100 up, ``"4,290 items/s"``), ``-`` before there is a rate."""
    if p.rate_per_s is None:
        return "-"
    rate = p.rate_per_s
    return f"{rate:,.0f} items/s" if rate >= 100 else f"{rate:.3g} items/s"


def eta_text(p: BatchProgress) -> str:
    """Time left at the current rate (``12.3s``, ``4m05s``), ``done``, or ``-`` without a
    total or a rate."""
    if p.done:
        return "done"
    return span(p.eta_s)


def above_text(p: BatchProgress) -> str:
    """The committed batches past the watermark: ``"2: 50-60, 70-80"`` (positions, end
    exclusive; at most :data:`MAX_ABOVE_SHOWN` listed), ``-`` when none."""
    if not p.above:
        return "-"
    shown = ", ".join(f"{start}-{end}" for start, end in p.above[:MAX_ABOVE_SHOWN])
    more = len(p.above) - MAX_ABOVE_SHOWN
    return f"{len(p.above)}: {shown}" + (f", ... {more} more" if more > 0 else "")


def run_summary(p: BatchProgress, ended: bool = False) -> str:
    """One run on one line: ``"mine 40 / 100 (40.0%), 3 failed, 12.5 items/s, ETA 5.0s"``
    (failed and skipped only when not 0; ``ended``: its task has ended, so an unfinished
    run says ``stopped`` instead of a rate and an ETA)."""
    parts = [f"{p.name} {progress_text(p)}"]
    if p.failed:
        parts.append(f"{p.failed} failed")
    if p.skipped:
        parts.append(f"{p.skipped} skipped")
    if not p.done and ended:
        parts.append("stopped")
    elif not p.done:
        parts.append(rate_text(p))
        if p.eta_s is not None:
            parts.append(f"ETA {eta_text(p)}")
    return ", ".join(parts)


def shard_place(task: TaskInfo) -> tuple[int, int] | None:
    """``(index, count)`` of a shard task (its stored params, key ``"ratchet:shard"``),
    else None."""
    shard = task_shard(task.params)
    return None if shard is None else (shard.index, shard.count)


def _runs_table(runs: Sequence[BatchProgress]) -> Table:
    table = Table(title=f"batch runs ({len(runs)})")
    for column in ("run", "watermark / total", "succeeded", "failed", "skipped", "batches",
                   "committed above the watermark", "rate", "ETA"):
        table.add_column(column, overflow="fold")
    for p in runs:
        table.add_row(field(p.name), field(progress_text(p)), field(p.succeeded),
                      field(p.failed), field(p.skipped), field(p.batches),
                      field(above_text(p)), field(rate_text(p)), field(eta_text(p)))
    return table


def _shards_table(tl: TaskTimeline) -> Table:
    shards = sorted(((s, c) for c in tl.children if (s := shard_place(c)) is not None),
                    key=lambda sc: sc[0][0])
    runs: dict[str, list[BatchProgress]] = {}
    for p in tl.shard_batches:
        runs.setdefault(p.task_id, []).append(p)
    table = Table(title=f"shards ({len(shards)} of {tl.shards})")
    for column in ("shard", "task", "state", "progress"):
        table.add_column(column, overflow="fold")
    for (index, count), child in shards[:MAX_SHARD_ROWS]:
        mine = runs.get(child.task_id, [])
        table.add_row(field(f"{index}/{count}"), field(child.task_id), field(child.state),
                      field("; ".join(run_summary(p, child.state in TERMINAL)
                                      for p in mine)
                            if mine else "no batch committed yet"))
    if len(shards) > MAX_SHARD_ROWS:
        table.add_row(f"... and {len(shards) - MAX_SHARD_ROWS} more (--json lists every "
                      "one)", "", "", "")
    if not shards:
        table.add_row("(no shard task yet)", "", "", "")
    return table


def print_batches(tl: TaskTimeline) -> None:
    """The batch part of ``ratchet inspect``'s text: a shard's place in its job, a sharded
    job's shard count and one line per shard, and a table of the task's own runs (nothing
    for a task with none of these)."""
    out = console()
    shard = shard_place(tl.task)
    if shard is not None:
        out.print(line("shard: ", (f"{shard[0]}/{shard[1]}", "bold"),
                       f" (index {shard[0]} of a job of {shard[1]} shards)"))
    if tl.shards is not None:
        out.print(line("sharded job: ", (str(tl.shards), "bold"), " shards (ratchet check ",
                       (tl.task.task_id, ""), ": do its counts add up)"))
        out.print(_shards_table(tl))
    if tl.batches:
        out.print(_runs_table(tl.batches))


def _not_adding_up(report: ConservationReport) -> list[ConservationLine]:
    return [x for x in report.lines if not x.ok]


def check(
    task_id: TaskArg,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check that a task's item counts add up: expected = succeeded + failed + skipped +
    in flight.

    One line per ctx.batches run; for a sharded job (App.submit_sharded) one per shard
    run and one for the whole job (the shards summed, and the totals the job reported).
    A task that ended has nothing in flight: items never processed (a shard that FAILED
    midway) are a difference. Exit status 0 when every line adds up, 1 when one does not
    (the difference is printed; --json prints the report and exits the same way), 2 for
    no such task or no ledger there.
    """

    def run() -> ConservationReport:
        with Control(ledger) as control:
            report = control.check(task_id)
        if as_json:
            echo_json(report)
            return report
        out = console()
        title = f"conservation of {report.task_id} ({report.state}"
        title += f", {report.shards} shards)" if report.shards is not None else ")"
        table = Table(title=title)
        for column in ("scope", "expected", "succeeded", "failed", "skipped", "in flight",
                       "difference", "note"):
            table.add_column(column, overflow="fold")
        for x in report.lines:
            table.add_row(field(x.scope), field(_count(x.expected)), field(x.succeeded),
                          field(x.failed), field(x.skipped), field(_count(x.in_flight)),
                          field(x.difference, "" if x.ok else "bold red"), field(x.note))
        if not report.lines:
            table.add_row("(no batch run)", "", "", "", "", "", "", "")
        out.print(table)
        bad = _not_adding_up(report)
        if not bad:
            out.print(line(("ok", "bold green"), ": every line adds up"))
        for x in bad:
            out.print(line(("does not add up", "bold red"), ": ", (x.scope, ""),
                           f" difference {x.difference}", *((": ", (x.note, ""))
                                                            if x.note else ())))
        return report

    report = guard(run)
    if not report.ok:
        raise typer.Exit(EXIT_DOES_NOT_ADD_UP)
