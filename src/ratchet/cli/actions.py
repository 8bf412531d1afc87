"""Operator actions on one task, audited with ``--reason`` and ``--operator``: ``resolve``
(an UNKNOWN task's open effect), ``cancel``, ``retry`` and ``compensate``."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import (
    InvalidArguments,
)
from ..control import (
    Control,
    ControlOutcome,
    default_operator,
)
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
    OperatorOpt,
    ReasonOpt,
    TaskArg,
    json_arg,
    require_reason,
)
from .render import (
    console,
    echo_json,
    err_console,
    line,
)

__all__ = ["cancel", "compensate", "resolve", "retry"]


def resolve(
    task_id: TaskArg,
    outcome: Annotated[
        str,
        typer.Option("--outcome", metavar="done|not-done|give-up",
                     help="done: the effect happened; not-done: it did not; give-up: nobody "
                          "can tell, end the task FAILED."),
    ],
    reason: ReasonOpt = None,
    result: Annotated[
        str | None,
        typer.Option("--result", metavar="JSON",
                     help="For done only: the effect's result as JSON."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who decided (default: $USER / the login name)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Settle an UNKNOWN task's open effect.

    The verdict is audited with --reason and --operator; the task then resumes (done: the
    effect returns --result; not-done: the call is made again with the same key), or
    give-up: it ends FAILED with the reason and its open effects are marked given up
    (ratchet retry can run it again, lookup first). A cancel or pause waiting for the
    resolution is applied instead of resuming. --result goes with done only.
    """

    def run() -> None:
        why = require_reason(reason)
        if result is not None and outcome != "done":
            raise InvalidArguments(
                f"--result goes with --outcome done only, not {outcome!r} (nothing changed)")
        value = json_arg(result, "--result") if result is not None else None
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            info = control.resolve(task_id, outcome, value, reason=why, by=who)
        if outcome == "done" and result is None:  # only once the resolve was accepted
            err_console().print(line(
                ("warning: ", "yellow"),
                "no --result given: the effect's result was recorded as null, and the task "
                "resumes with None as the effect's return value",
            ))
        if as_json:
            echo_json(info)
            return
        console().print(line((info.task_id, ""), " resolved (", (outcome, ""), ") by ",
                             (who, ""), " now ", (info.state, "")))

    guard(run)

def _print_control(outcome: ControlOutcome, who: str, as_json: bool) -> None:
    """Print what an operator command did; exit 1 when it changed nothing."""
    if as_json:
        echo_json(outcome)
    else:
        style = "yellow" if outcome.outcome == "unchanged" else ""
        console().print(line((outcome.task_id, ""), f" {outcome.action} ",
                             (outcome.outcome, style or "bold"), " by ", (who, ""), ": ",
                             (outcome.message, "")))
    if outcome.outcome == "unchanged":
        raise typer.Exit(1)


def cancel(
    task_id: TaskArg,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a task (audited with --reason and --operator).

    Not running (pending, scheduled, retry wait, paused): cancelled at once. Running: its
    holder stops at its next step boundary (an effect in flight is settled first). With an
    open effect or UNKNOWN: cancelled once the effect is settled (lookup, or ratchet
    resolve). Exit status 0 when cancelled or requested; 1 when nothing changed (the task
    had already finished: a success committed first stays a success); 2 on an error.
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            outcome = control.cancel(task_id, reason=require_reason(reason), by=who)
        _print_control(outcome, who, as_json)

    guard(run)

def retry(
    task_id: TaskArg,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a FAILED task again (audited with --reason and --operator).

    A fresh set of attempts; its history is kept (done steps stay done: it resumes from its
    checkpoint). Exit status 0 when queued again; 1 when nothing changed (the task is not
    FAILED: SUCCEEDED and CANCELLED never move); 2 on an error.
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            outcome = control.retry(task_id, reason=require_reason(reason), by=who)
        _print_control(outcome, who, as_json)

    guard(run)


def compensate(
    task_id: TaskArg,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Undo a FAILED task's completed effects (audited with --reason and --operator).

    The task goes COMPENSATING; a worker runs the compensation of each completed effect,
    newest first, each once (an effect of its own), and the task ends COMPENSATED (UNKNOWN
    if a compensation's outcome cannot be known). Exit status 0 when sent to compensate;
    1 when nothing changed (the task is not FAILED); 2 on an error.
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            outcome = control.compensate(task_id, reason=require_reason(reason), by=who)
        _print_control(outcome, who, as_json)

    guard(run)
