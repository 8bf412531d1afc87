"""``ratchet crash-matrix``: the crash-point matrix (DESIGN §6) run against a ledger of the
user's choosing, with real worker processes and real signals
(:func:`ratchet.testing.matrix.run_matrix`).

Prints one table row per matrix row (number, crash point, mechanism, pass / fail / skip,
what the external side counted, time), or with ``--json`` the whole report. Exit status 0
when every selected row passed (a row not available in this build or run, such as row 10
without ``--broker``, is a skip, and fails the run only when ``--rows`` named it), 1
otherwise (a broker that cannot be reached fails row 10), 2 for bad usage (a malformed or
out-of-range ``--rows``, a malformed or unreachable ledger, a malformed ``--broker``).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer
from rich.table import Table

from .guard import guard
from .render import console, echo_json, err_console, field, line

__all__ = ["EXIT_ROW_FAILED", "crash_matrix"]

EXIT_ROW_FAILED = 1
"""The exit status when a selected row failed (or a named row cannot run in this build)."""

_STATUS_STYLE = {"pass": ("PASS", "bold green"), "fail": ("FAIL", "bold red"),
                 "skip": ("SKIP", "yellow")}


def _counts(counts: dict[str, Any]) -> str:
    """The external counts as short text: ``executions charge:o-1=1; step_runs prepare=1``."""
    parts = []
    for name, value in counts.items():
        if isinstance(value, dict):
            inner = _counts(value) if any(isinstance(v, dict) for v in value.values()) else \
                " ".join(f"{k}={v}" for k, v in value.items())
            parts.append(f"{name}: {inner or '-'}")
        else:
            parts.append(f"{name}={value}")
    return "; ".join(parts)


def crash_matrix(
    ledger: Annotated[
        str | None,
        typer.Option("--ledger", metavar="URL",
                     help="Where to run: a sqlite:/// URL (fresh files in a new directory "
                     "next to that file) or a postgresql:// URL (private schemas "
                     "ratchet_matrix_*, created and dropped). Default: SQLite in a "
                     "temporary directory. The URL's own file or schema is never touched."),
    ] = None,
    rows: Annotated[
        str | None,
        typer.Option("--rows", metavar="ROWS",
                     help="Rows to run: N, A-B or a comma list (1-3,5); default every row "
                     "(1-10)."),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option("--broker", metavar="URL",
                     help="The broker of row 10 (the outbox relay): amqp://user:pass@host:5672/"
                     " (RabbitMQ) or nats://host:4222 (NATS JetStream). The run publishes to"
                     " an exchange and queue, or a stream, of its own (ratchet-matrix-*),"
                     " deleted at the end. Without it row 10 is a skip."),
    ] = None,
    parallel: Annotated[
        int, typer.Option("--parallel", min=1, max=10, metavar="N",
                          help="Rows run at the same time, each in worlds of its own.")
    ] = 2,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON instead of a table.")
    ] = False,
    async_bodies: Annotated[
        bool, typer.Option("--async", help="Run the charge task of rows 1-8 as an async def "
                           "body on the workers' event loop (rows 9 and 10 stay plain def).")
    ] = False,
) -> None:
    """Run the crash-point matrix (DESIGN §6) against a ledger: real workers, SIGKILL at
    each crash point, executions counted by an external service.

    Exit status 0 when every selected row passed, 1 when one failed, 2 for bad usage.
    """
    # The matrix (worker processes, the counting service's client) is loaded when this
    # command runs, not with the CLI (tests/test_structure.py lists this late import).
    from ..testing.matrix import run_matrix

    progress = err_console()

    def shown(result: Any) -> None:
        if not as_json:
            label, style = _STATUS_STYLE[result.status]
            progress.print(line(f"row {result.row:>2} ", (label, style),
                                f" {result.duration_s:.1f} s  {result.detail}"))

    report = guard(lambda: run_matrix(ledger, rows, broker=broker, parallel=parallel,
                                      on_row=shown, async_bodies=async_bodies))
    if as_json:
        data = dataclasses.asdict(report)
        data["ok"] = report.ok
        for entry, result in zip(data["rows"], report.rows, strict=True):
            entry["passed"] = result.passed
        echo_json(data)
    else:
        table = Table(title=f"crash-point matrix on {report.dialect} ({report.ledger})")
        for column in ("#", "crash point", "mechanism", "result", "counted at the external "
                       "side", "time"):
            table.add_column(column, overflow="fold")
        for r in report.rows:
            label, style = _STATUS_STYLE[r.status]
            table.add_row(field(r.row), field(r.point), field(r.mechanism),
                          field(label, style), field(_counts(r.counts) or r.detail),
                          field(f"{r.duration_s:.1f} s"))
        out = console()
        out.print(table)
        for r in report.rows:
            if r.status != "pass":
                out.print(line((f"row {r.row} {r.status}: ", "bold"), r.detail))
        passed = sum(r.passed for r in report.rows)
        out.print(line(f"{passed} of {len(report.rows)} rows passed in "
                       f"{report.duration_s:.1f} s: ",
                       ("OK", "bold green") if report.ok else ("FAILED", "bold red")))
    raise typer.Exit(0 if report.ok else EXIT_ROW_FAILED)
