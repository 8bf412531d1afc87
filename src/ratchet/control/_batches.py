"""Batch progress and the conservation check of :class:`ratchet.Control` (DESIGN §6 row 9,
§8 logical shards): where each ``ctx.batches`` run of a task stands (watermark, total, rate,
ETA), and whether a task's or a sharded job's item counts add up.

Conservation, for a run and for a job: ``expected = succeeded + failed + skipped + in
flight``. The ledger's counts come from the committed batches only; the committed positions
(the watermark plus the batches above it) must cover exactly as many items as the counts
say, or a batch was counted twice or lost. A task that has ended has nothing in flight, so
an ended run whose items do not add up to its total is a difference too (a failed shard
leaves its unprocessed items unaccounted for, and the check says how many). A sharded
job's line sums its shards, and the totals its parent reported must equal that sum.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..app import _checks as opchecks
from ..ledger.base import BATCH_RUN_PREFIX, BatchActivity, BatchRun, StepRecord, TaskInfo
from ..shards import job_shards, task_shard
from ..states import TERMINAL, State
from ._reads import ControlReads
from ._records import BatchProgress

__all__ = ["BatchActivity", "BatchProgress", "ConservationLine", "ConservationReport",
           "ControlBatches"]


@dataclass(frozen=True, slots=True)
class ConservationLine:
    """One line of :class:`ConservationReport`: a run, a shard, or the whole job.

    Attributes:
        task_id: the task (the job's parent for the job line).
        scope: ``"run <name>"``, ``"shard <i>/<n>"`` or ``"job"``.
        expected: items expected (the run's total; the sum over shards), None when unknown.
        succeeded, failed, skipped: items the committed batches counted.
        in_flight: items not yet processed by a task that has not ended (0 once ended);
            None when the total is unknown.
        difference: ``expected - (succeeded + failed + skipped + in_flight)``, or the
            positions-versus-counts difference; 0 when the line adds up.
        ok: the line adds up.
        note: why it does not, in one sentence ("" when it does).
    """

    task_id: str
    scope: str
    expected: int | None
    succeeded: int
    failed: int
    skipped: int
    in_flight: int | None
    difference: int
    ok: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class ConservationReport:
    """What :meth:`ControlBatches.check` found (``ratchet check``; exit status 1 unless
    ``ok``).

    Attributes:
        task_id: the task checked.
        state: its state.
        ok: every line adds up.
        lines: one per batch run, per shard and for the job (a sharded job's parent).
        shards: the job's shard count (None unless the task is a sharded job).
    """

    task_id: str
    state: str
    ok: bool
    lines: list[ConservationLine] = field(default_factory=list)
    shards: int | None = None


def _run_line(task: TaskInfo, run: BatchRun, scope: str) -> ConservationLine:
    ended = task.state in TERMINAL
    processed = run.processed
    common = (task.task_id, scope, run.total, run.succeeded, run.failed, run.skipped)
    if run.committed_items != processed:
        return ConservationLine(
            *common, None if run.total is None else 0 if ended else
            max(0, run.total - processed), processed - run.committed_items, False,
            f"the committed positions cover {run.committed_items} items but the counts say "
            f"{processed}: a batch was counted twice or lost")
    if run.total is None:
        return ConservationLine(*common, None, 0, True,
                                "" if run.done or not ended else "total unknown")
    in_flight = 0 if ended else run.total - processed
    difference = run.total - processed - in_flight
    if ended and processed > run.total:
        return ConservationLine(*common, 0, difference, False,
                                f"{processed - run.total} more items processed than the "
                                f"total of {run.total} the task gave")
    if in_flight < 0:
        return ConservationLine(*common, in_flight, -in_flight, False,
                                f"{-in_flight} more items processed than the total")
    note = "" if difference == 0 else (
        f"the task ended {task.state.value if isinstance(task.state, State) else task.state} "
        f"with {difference} of {run.total} items never processed")
    return ConservationLine(*common, in_flight, difference, difference == 0, note)


MAX_REPORTS_READ = 256
"""A sharded job's check compares each shard's own report with the ledger's counts up to
this many shards (one timeline read each); past it, the ledger's counts only."""

_REPORTED = ("succeeded", "failed", "skipped", "batches")


def _reports(steps: Sequence[StepRecord]) -> dict[str, Any]:
    """The reports ``ctx.batches`` recorded (its run's checkpoint), by run."""
    found: dict[str, Any] = {}
    for step in steps:
        if step.name.startswith(BATCH_RUN_PREFIX):
            try:
                found[step.name] = json.loads(step.result_json)
            except ValueError:
                found[step.name] = None
    return found


def _reported(line: ConservationLine, run: BatchRun,
              reports: Mapping[str, Any]) -> ConservationLine:
    """``line``, not ok when the run's own report (what ``ctx.batches`` returned to the
    task) disagrees with the ledger's committed batches: a batch counted twice by the task
    although committed once."""
    report = reports.get(run.run)
    if not isinstance(report, dict):
        return line
    ledger = {"succeeded": run.succeeded, "failed": run.failed, "skipped": run.skipped,
              "batches": run.batches}
    wrong = [f"{k} {report.get(k)} (ledger {ledger[k]})" for k in _REPORTED
             if report.get(k) != ledger[k]]
    if not wrong:
        return line
    note = "the task's report says " + ", ".join(wrong)
    return dataclasses.replace(
        line, ok=False, difference=line.difference or int(report.get("succeeded") or 0)
        - run.succeeded, note=f"{line.note}; {note}" if line.note else note)


def _pending_line(task: TaskInfo, scope: str) -> ConservationLine:
    """A shard with no committed batch yet: nothing counted, all of it in flight (or, once
    ended, unknown: a shard that ends without a run processed no items)."""
    return ConservationLine(task.task_id, scope, None, 0, 0, 0, None, 0, True,
                            "no batch committed yet")


class ControlBatches(ControlReads):
    """:meth:`batch_progress`, :meth:`batch_activity` and :meth:`check` (see the module
    docstring)."""

    def batch_progress(self, task_id: str) -> list[BatchProgress]:
        """The ``ctx.batches`` runs of a task, in name order (empty when it has none).

        Raises:
            InvalidArguments: a malformed task id. LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        return [BatchProgress.from_run(r)
                for r in led.batch_runs([opchecks.task_id(task_id)])]

    def batch_progress_many(self, task_ids: Sequence[str]) -> list[BatchProgress]:
        """:meth:`batch_progress` of several tasks in one read (a job's shards).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        ids = [opchecks.task_id(t) for t in task_ids]
        return [BatchProgress.from_run(r) for r in self._reader().batch_runs(ids)]

    def batch_activity(self) -> list[BatchActivity]:
        """Per task type, the unfinished ``ctx.batches`` runs of tasks that have not ended
        (for metrics): :class:`~ratchet.control.BatchActivity` ``(name, runs, watermark,
        processed)``, the watermarks and processed items summed over the type's runs
        (items); types without such a run are left out. One read, no history.

        Raises:
            LedgerUnavailable: no ledger there.
        """
        return self._reader().batch_activity()

    def check(self, task_id: str) -> ConservationReport:
        """Check that a task's item counts add up (``ratchet check``): for each of its
        ``ctx.batches`` runs, and for a sharded job (``App.submit_sharded``) per shard and
        for the job; see the module docstring for the rules.

        Raises:
            TaskNotFound: no such task. InvalidArguments: a malformed task id.
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        tid = opchecks.task_id(task_id)
        task = led.get(tid)
        shards = job_shards(task.params)
        state = task.state.value if isinstance(task.state, State) else str(task.state)
        if shards is None:
            mine = led.batch_runs([tid])
            reports = _reports(led.timeline(tid).steps) if mine else {}
            own = [_reported(_run_line(task, r, f"run {r.name}"), r, reports) for r in mine]
            return ConservationReport(tid, state, all(x.ok for x in own), own)
        places = {}
        children = []
        for child in led.children(tid):
            place = task_shard(child.params)
            if place is not None:
                places[child.task_id] = place
                children.append(child)
        runs: dict[str, list[BatchRun]] = {}
        for r in led.batch_runs([c.task_id for c in children]):
            runs.setdefault(r.task_id, []).append(r)
        lines: list[ConservationLine] = []
        for child in sorted(children, key=lambda c: places[c.task_id].index):
            scope = f"shard {places[child.task_id].index}/{shards}"
            mine = runs.get(child.task_id, [])
            reports = (_reports(led.timeline(child.task_id).steps)
                       if mine and len(children) <= MAX_REPORTS_READ else {})
            lines.extend(_reported(_run_line(child, r, f"{scope} run {r.name}"), r, reports)
                         for r in mine)
            if not mine:
                lines.append(_pending_line(child, scope))
        # The job's reported totals are the sums of its shards' results: comparable with
        # the ledger's counts only when each shard's result is its one run's report.
        comparable = bool(children) and all(len(runs.get(c.task_id, [])) == 1
                                            for c in children)
        lines.append(_job_line(task, shards, children, lines, comparable))
        return ConservationReport(tid, state, all(x.ok for x in lines), lines, shards)


def _job_line(task: TaskInfo, shards: int, children: Sequence[TaskInfo],
              lines: Sequence[ConservationLine], comparable: bool) -> ConservationLine:
    counted = [x for x in lines if x.scope != "job"]
    succeeded = sum(x.succeeded for x in counted)
    failed = sum(x.failed for x in counted)
    skipped = sum(x.skipped for x in counted)
    known = all(x.expected is not None for x in counted) and bool(counted)
    expected = sum(x.expected or 0 for x in counted) if known else None
    in_flight = sum(x.in_flight or 0 for x in counted) if known else None
    difference = sum(x.difference for x in counted)
    notes: list[str] = []
    if children and len(children) != shards:
        notes.append(f"{len(children)} shard tasks for a space of {shards}")
    result: Any = task.result
    if comparable and task.state is State.SUCCEEDED and isinstance(result, dict):
        totals = result.get("totals") or {}
        for key, value in (("succeeded", succeeded), ("failed", failed),
                           ("skipped", skipped)):
            if key in totals and totals[key] != value:
                notes.append(f"the job reported {key}={totals[key]}, its shards' ledger "
                             f"counts {value}")
                difference = difference or int(totals[key]) - value
    bad = [x for x in counted if not x.ok]
    if bad:
        notes.append(f"{len(bad)} shard line(s) do not add up")
    ok = not notes
    return ConservationLine(task.task_id, "job", expected, succeeded, failed, skipped,
                            in_flight, difference, ok, "; ".join(notes))
