"""``ratchet pause`` and ``ratchet resume``: versioned, audited pauses of everything, a
task type or one task."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import (
    InvalidArguments,
)
from ..control import (
    Control,
    PauseResult,
    default_operator,
)
from ..validation import parse_rate_per_s
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
    OperatorOpt,
    ReasonOpt,
    require_reason,
)
from .render import (
    console,
    echo_json,
    line,
)

__all__ = ["pause", "resume"]

AllOpt = Annotated[bool, typer.Option("--all", help="Everything.")]
TypeOpt = Annotated[
    str | None, typer.Option("--type", metavar="TASK_TYPE", help="One task type.")
]
TaskOpt = Annotated[str | None, typer.Option("--task", metavar="TASK_ID", help="One task.")]


def _selector(everything: bool, task_type: str | None, task: str | None) -> tuple[str, str | None]:
    """``(scope, target)`` from exactly one of --all / --type / --task."""
    given = [(flag, scope, target) for flag, scope, target in (
        (everything, "all", None), (task_type is not None, "type", task_type),
        (task is not None, "task", task)) if flag]
    if len(given) != 1:
        raise InvalidArguments("give exactly one of --all, --type TASK_TYPE, --task TASK_ID")
    return given[0][1], given[0][2]


def _parse_rate(text: str | None) -> float | None:
    """``--rate N/s`` (or ``N``) as tasks per second."""
    return None if text is None else parse_rate_per_s(text, "--rate")


def _print_pause(result: PauseResult, who: str, as_json: bool) -> None:
    """Print what a pause / resume did; exit 1 when it changed nothing."""
    if as_json:
        echo_json(result)
    else:
        style = "yellow" if result.outcome == "unchanged" else "bold"
        console().print(line(f"{result.action} ", (result.outcome, style), " by ", (who, ""),
                             ": ", (result.message, "")))
    if result.outcome == "unchanged":
        raise typer.Exit(1)


def pause(
    reason: ReasonOpt = None,
    everything: AllOpt = False,
    task_type: TypeOpt = None,
    task: TaskOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause everything, a task type or one task (a versioned, audited record).

    Once it returns, no new attempt starts in the scope until resume. Running tasks stop
    at their next step boundary (checkpoint committed, lease released, attempt handed
    back) and become PAUSED; an effect in flight is settled first. ratchet status shows
    each pause and its running tasks still short of a boundary. Exit status 0 when paused,
    1 when nothing changed (already paused, or the task had finished), 2 on an error.
    """

    def run() -> None:
        scope, target = _selector(everything, task_type, task)
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            result = control.pause(scope, target, reason=require_reason(reason), by=who)
        _print_pause(result, who, as_json)

    guard(run)


def resume(
    reason: ReasonOpt = None,
    everything: AllOpt = False,
    task_type: TypeOpt = None,
    task: TaskOpt = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", metavar="N/s",
                     help="Re-admit paused tasks at N per second (default: all at once)."),
    ] = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """End a pause (same selectors as pause; audited).

    Its PAUSED tasks not covered by another pause are ready again, at --rate per second.
    Exit status 0 when resumed, 1 when that scope was not paused, 2 on an error.
    """

    def run() -> None:
        scope, target = _selector(everything, task_type, task)
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            result = control.resume(scope, target, reason=require_reason(reason), by=who,
                                    rate_per_s=_parse_rate(rate))
        _print_pause(result, who, as_json)

    guard(run)
