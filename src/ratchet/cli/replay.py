"""``ratchet replay``: run a task's function locally against its recorded history
(:func:`ratchet.replay.replay`), or a new definition version against a sample of recorded
histories of its type (:func:`ratchet.replay.replay_sample`).

Exit status: 0 when nothing diverged (the history reproduced, or it ended before the
body did), :data:`EXIT_DIVERGED` (1) when a task's replay diverged, 2 on bad input (an
unknown task id, an app that cannot be loaded, a version the app does not define or
below 1). A body that does not end within ``--timeout`` seconds is a divergence (1).
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import InvalidArguments
from ..loading import load_app
from ..replay import DEFAULT_TIMEOUT_S, MAX_SAMPLE, ReplayReport, replay_sample
from ..replay import replay as replay_task
from .guard import guard
from .options import JsonOpt, LedgerOpt
from .render import console, echo_json, line

__all__ = ["EXIT_DIVERGED", "replay"]

EXIT_DIVERGED = 1
"""The exit status of ``ratchet replay`` when a replayed task diverged from its history."""

AppOpt = Annotated[
    str,
    typer.Option("--app", metavar="MODULE:APP",
                 help="The application whose definition is replayed, e.g. myproj.tasks:app."),
]


def _outcome(report: ReplayReport) -> tuple[str, str]:
    """A one-word outcome and its style."""
    if report.divergence is not None:
        return "DIVERGES", "bold red"
    if report.history_end is not None:
        return "history ends", "yellow"
    if report.reproduced:
        return "reproduces", "green"
    return "new outcome", "yellow"


def _show(report: ReplayReport) -> None:
    """One task's replay for people: the task, the positions, and where it ended."""
    out = console()
    word, style = _outcome(report)
    versions = f"version {report.version}"
    if report.version != report.recorded_version:
        versions += f" (recorded with version {report.recorded_version})"
    out.print(line(("replay ", ""), (report.name, "bold"), " ", (report.task_id, ""), ", ",
                   (versions, ""), ", recorded state ", (report.state, "")))
    out.print(line("  positions: ", (f"{report.positions} of {report.recorded_positions}", ""),
                   " recorded checkpoints matched"))
    d = report.divergence
    if d is not None:
        out.print(line("  ", (f"{word} at position {d.position}", style)))
        out.print(line("    recorded: ", (d.recorded, "")))
        out.print(line("    new code: ", (d.new, "")))
    else:
        out.print(line("  ", (report.summary, style)))


def replay(
    task_id: Annotated[str | None, typer.Argument(
        metavar="TASK", help="The task to replay (or --type with --sample).")] = None,
    app_spec: AppOpt = "",
    ledger: LedgerOpt = None,
    version: Annotated[int | None, typer.Option(
        "--version", metavar="N",
        help="The definition version to run (default: the task's own; with --type: the "
             "newest the app defines).")] = None,
    task_type: Annotated[str | None, typer.Option(
        "--type", metavar="TYPE",
        help="Replay the most recent tasks of this type that have a history.")] = None,
    sample: Annotated[int, typer.Option(
        "--sample", metavar="N", help=f"With --type: how many tasks (1-{MAX_SAMPLE}).")] = 100,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS",
        help="How long a replayed body may run before it is reported as not stopping "
             "(a divergence).")] = DEFAULT_TIMEOUT_S,
    as_json: JsonOpt = False,
) -> None:
    """Run a task's function locally against its recorded history.

    Steps return their recorded values and effects their recorded results without being
    called; sleeps and waits return at once; nothing is written and nothing external is
    called. Prints where the run diverges from the history (the position, the recorded
    call, the new call), where the history ends before the code does (and what the code
    would call next), or that it reproduces it. With --type T --version N --sample S:
    checks definition N against the S most recent recorded histories of type T before it
    is deployed. A body that does not end within --timeout seconds (it caught the
    replay's stop and loops) is reported as a divergence. Exit status 1 when a task
    diverges, 2 on bad input.
    """

    def run() -> list[ReplayReport]:
        if not app_spec:
            raise InvalidArguments("--app MODULE:APP is required (the application whose "
                                   "task function is replayed)")
        if task_id is None and task_type is None:
            raise InvalidArguments("give a TASK id or --type TYPE (with --sample N)")
        if task_id is not None and task_type is not None:
            raise InvalidArguments("give a TASK id or --type TYPE (with --sample N), not "
                                   "both")
        if version is not None and version < 1:
            raise InvalidArguments(f"--version {version}: versions are integers >= 1")
        if not 0 < timeout < float("inf"):
            raise InvalidArguments(f"--timeout {timeout:g}: give a positive number of "
                                   "seconds")
        app = load_app(app_spec)
        app.configure(ledger=ledger)
        if task_id is not None:
            return [replay_task(app, task_id, version=version, timeout_s=timeout)]
        assert task_type is not None
        return replay_sample(app, task_type, version=version, sample=sample,
                             timeout_s=timeout)

    reports = guard(run)
    diverged = sum(1 for r in reports if r.divergence is not None)
    if as_json:
        echo_json(reports[0] if task_id is not None else reports)
    elif task_id is not None:
        _show(reports[0])
    else:
        out = console()
        for r in reports:
            word, style = _outcome(r)
            detail = f"{r.positions} of {r.recorded_positions} positions; {r.summary}"
            out.print(line((f"{word:<13}", style), (r.task_id, ""), "  ", (detail, "")))
        ended = sum(1 for r in reports if r.history_end is not None)
        same = sum(1 for r in reports if r.reproduced)
        out.print(line(
            (f"{len(reports)}", "bold"), f" {task_type} tasks replayed: ",
            (f"{same} reproduce", "green"), ", ",
            (f"{diverged} diverge", "bold red" if diverged else ""), ", ",
            f"{ended} reach the end of their history",
            f", {len(reports) - same - diverged - ended} end otherwise"))
    if diverged:
        raise typer.Exit(EXIT_DIVERGED)
