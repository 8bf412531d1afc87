"""``ratchet demo``: the billing and order workflow demo (:mod:`ratchet.demo`)."""

from __future__ import annotations

from typing import Annotated

import typer

from .guard import guard
from .options import MAX_WAIT_S
from .render import report_console

__all__ = ["demo"]


def demo(
    ledger: Annotated[
        str | None,
        typer.Option(
            "--ledger", metavar="URL",
            help="Ledger URL (default: a fresh ./ratchet-demo/ledger.db). A postgresql:// URL "
            "runs in its schema= (default ratchet_demo), which is dropped and recreated first.",
        ),
    ] = None,
    tasks: Annotated[
        int, typer.Option("--tasks", min=1, metavar="N", help="Billing tasks to submit.")
    ] = 500,
    orders: Annotated[
        int,
        typer.Option("--orders", min=0, metavar="N",
                     help="Order workflows to submit (reserve, charge, wait for 'shipped', "
                     "compensated when it does not come)."),
    ] = 100,
    ship_timeout_s: Annotated[
        float,
        typer.Option("--ship-timeout-s", min=0.5, max=MAX_WAIT_S, metavar="SECONDS",
                     help="How long an order waits for the warehouse's 'shipped' event "
                     "(the warehouse ships 1-3 s after the reservation, or never)."),
    ] = 6.0,
    workers: Annotated[
        int, typer.Option("--workers", min=1, metavar="N",
                          help="Worker processes (the frozen senders come on top).")
    ] = 2,
    kills: Annotated[
        int,
        typer.Option("--kills", min=0, metavar="N",
                     help="Worker processes killed with SIGKILL at random moments."),
    ] = 5,
    seed: Annotated[
        int | None,
        typer.Option("--seed", metavar="N", help="Random seed (default: a fresh one)."),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, metavar="N",
                     help="Task threads per worker process."),
    ] = 8,
    stall_s: Annotated[
        float,
        typer.Option("--stall-s", min=1.0, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Once every task is submitted, fail when no task changed state for "
                     "this long (the deadline follows the workload)."),
    ] = 30.0,
    deadline_s: Annotated[
        float | None,
        typer.Option("--deadline-s", min=1.0, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Optional hard cap on the whole run (default: none)."),
    ] = None,
) -> None:
    """Billing and order demo: workers killed at random, senders frozen mid-call.

    Billing tasks against four kinds of payment target (key dedupe, fencing tokens, lookup
    only, neither), each its own faulty service process, and order workflows (reserve at a
    warehouse, charge, wait for its 'shipped' event; refund and release when it never
    comes); worker processes killed with SIGKILL and one sender per kind frozen mid-call
    past its lease; a report counted at the services' own files (non-zero exit status when
    a guarantee is broken).
    """
    # The demo (its app, services and display) is loaded when this command runs, not with
    # the CLI (tests/test_structure.py lists this late import).
    from ..demo.runner import DemoSettings, run_demo

    settings = DemoSettings(concurrency=concurrency, stall_s=stall_s, deadline_s=deadline_s,
                            ship_timeout_s=ship_timeout_s)
    code = guard(lambda: run_demo(ledger, tasks=tasks, workers=workers, kills=kills, seed=seed,
                                   orders=orders, settings=settings,
                                   console=report_console()))
    raise typer.Exit(int(code))
