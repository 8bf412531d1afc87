"""``ratchet fork``: a new task from a task's history up to one of its steps, pinned to a
version, linked to the original and audited (:meth:`ratchet.Control.fork`)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..control import Control, default_operator
from ..loading import load_app
from .guard import guard
from .options import JsonOpt, LedgerOpt, OperatorOpt, ReasonOpt, TaskArg, require_reason
from .render import console, echo_json, line

__all__ = ["fork"]


def fork(
    task_id: TaskArg,
    from_step: Annotated[
        str,
        typer.Option("--from-step", metavar="NAME",
                     help="The checkpoint to run again from, as ratchet inspect lists it "
                          "(name: its first occurrence; name#N: the N-th; a step, an "
                          "effect, or an emit ratchet:emit:TOPIC), or ratchet:end for after "
                          "the last recorded one (a step that failed is not recorded)."),
    ],
    version: Annotated[
        int | None,
        typer.Option("--version", metavar="N", min=1,
                     help="The definition version the new task pins (default: the "
                          "original's); one a worker has registered."),
    ] = None,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", metavar="MODULE:APP",
                     help="The application: its versions count as known, and the "
                          "original's params are checked against the pinned version's "
                          "signature as submit checks them."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fork an ended task from a step: a new task whose history is the original's up to,
    not including, that step's first occurrence (audited with --reason and --operator).

    The original must have ended SUCCEEDED, FAILED or CANCELLED; it is not changed. The
    new task copies its params, queue, priority and attempts, pins --version (default: the
    original's) and is PENDING: steps and effects before the fork point replay their
    recorded results (not executed again); the rest runs with the pinned version, effects
    with the keys the code gives. Both tasks' inspect show the link. Prints the new task
    id; exit status 0 when forked, 2 on an error (an unknown step lists the recorded ones;
    another task of the original's fork lineage has not ended; with --app, params the
    pinned version refuses).
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        app = None
        if app_spec is not None:
            app = load_app(app_spec)
            if ledger is not None:
                app.configure(ledger=ledger)
        with (Control(app=app) if app is not None else Control(ledger)) as control:
            new_id = control.fork(task_id, from_step, version=version,
                                  reason=require_reason(reason), by=who)
            record = control.fork_links(new_id).forked_from
        if as_json:
            echo_json(record)
            return
        pinned = f" version {record.version}" if record is not None else ""
        console().print(line((new_id, "bold"), " forked from ", (task_id, ""), " at step ",
                             (from_step, ""), pinned, " by ", (who, ""), ": PENDING"))

    guard(run)
