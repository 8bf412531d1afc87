"""Running the crash-point matrix: each selected row in fresh worlds, timed, its checks
turned into a :class:`RowResult`; the whole run into a :class:`MatrixReport`."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ...config import redact_url
from ...errors import InvalidArguments
from ..processes import ConditionTimeout
from .brokers import check_broker_url
from .context import Controls, RowContext, Worlds
from .registry import ROWS, parse_rows
from .rig import RowFailed, RowSkipped

__all__ = ["PASS", "FAIL", "SKIP", "MatrixReport", "RowResult", "run_matrix"]

PASS, FAIL, SKIP = "pass", "fail", "skip"
"""A row's status."""


@dataclass
class RowResult:
    """The outcome of one row.

    Attributes:
        row: its number in DESIGN §6's table.
        point: the crash point.
        mechanism: the mechanism it proves.
        status: :data:`PASS`, :data:`FAIL` or :data:`SKIP` (not runnable in this build, or
            in this run: row 10 without a broker).
        detail: one line: what was shown, or the first check that failed and what was seen.
        counts: what the external side counted (executions per key, step runs, items).
        duration_s: wall-clock time the row took, control run included when it ran first,
            seconds.
        faults: the fault points (or signals) it used.
        logs: on failure, the tail of every process log of the row.
    """

    row: int
    point: str
    mechanism: str
    status: str
    detail: str
    counts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    faults: list[str] = field(default_factory=list)
    logs: str = ""

    @property
    def passed(self) -> bool:
        """True when the row ran and every check held."""
        return self.status == PASS


@dataclass
class MatrixReport:
    """The whole run.

    Attributes:
        dialect: ``sqlite`` or ``postgresql``.
        ledger: where it ran (the URL the user gave, password redacted; a temporary
            directory when none was given).
        rows: one result per selected row, in order.
        explicit: the rows were named (``--rows``): an unavailable row then fails the run.
        duration_s: the whole run, seconds.
    """

    dialect: str
    ledger: str
    rows: list[RowResult]
    explicit: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        """True when every row passed; a skipped row counts only when it was not named."""
        return all(r.status == PASS or (r.status == SKIP and not self.explicit)
                   for r in self.rows)


def _run_row(number: int, worlds: Worlds, controls: Controls,
             broker: str | None) -> RowResult:
    row = ROWS[number]
    result = RowResult(row.number, row.point, row.mechanism, SKIP, row.unavailable,
                       faults=list(row.faults))
    if row.run is None:
        return result
    ctx = RowContext(worlds, controls, broker)
    started = time.monotonic()
    try:
        result.detail = row.run(ctx)
        result.status = PASS
    except RowSkipped as exc:
        result.status, result.detail = SKIP, str(exc)
    except (RowFailed, ConditionTimeout) as exc:
        result.status, result.detail = FAIL, str(exc)
    except Exception as exc:  # a row must end as a result, whatever broke
        result.status = FAIL
        result.detail = f"{type(exc).__name__}: {exc}"
        result.logs = traceback.format_exc()
    finally:
        result.duration_s = time.monotonic() - started
        result.counts = ctx.counts
        if result.status == FAIL:
            result.logs += "\n".join(rig.dump() for rig in ctx.opened)
        for rig in ctx.opened:
            worlds.release(rig)
    return result


ASYNC_LEASE_S = 3.0
"""The shortest lease of the charge tasks with ``async_bodies``, seconds. Row 7 kills the
worker in its N-th write transaction, and a lease renewal is one too: an async body's
first charge (the event loop's executor threads starting, the HTTP pool's first
connection) on a loaded machine can outlast a third of a 1 s lease, when the heartbeat
renews, and shift the count. A 3 s lease renews after 1 s; the rows wait 2 s longer for
the dead holder's lease to expire."""


def run_matrix(ledger_url: str | None = None, rows: str | Sequence[int] | None = None, *,
               broker: str | None = None, lease_s: float = 1.0, parallel: int = 2,
               on_row: Callable[[RowResult], None] | None = None,
               async_bodies: bool = False) -> MatrixReport:
    """Run the selected rows of the crash-point matrix with real worker processes.

    Args:
        ledger_url: the dialect and server to run on (``None``: SQLite files in a temporary
            directory). Every row gets fresh ledgers of its own: SQLite files in a new
            directory next to the URL's file, or private PostgreSQL schemas
            ``ratchet_matrix_*``; all removed at the end. The URL's own file or schema is
            never touched.
        rows: ``--rows`` text (``"1-10"``, ``"3"``, ``"1-3,5"``) or row numbers; ``None``:
            every row.
        broker: the broker of row 10 (the outbox relay): ``amqp://user:pass@host:5672/vhost``
            (RabbitMQ) or ``nats://host:4222`` (NATS JetStream); each run publishes to an
            exchange and queue, or a stream, of its own (``ratchet-matrix-*``), deleted at
            the end. ``None``: row 10 is a skip. A broker that cannot be reached fails
            row 10.
        lease_s: lease of the charge tasks, seconds (row 9 uses at least 2 s).
        parallel: rows run at the same time (each in worlds of its own; 1: one by one).
        on_row: called with each row's result as soon as it is known.
        async_bodies: the workers run the charge task (rows 1-8) as an ``async def`` body
            on their event loop (``ratchet crash-matrix --async``); rows 9 (``ctx.batches``)
            and 10 (emits) keep their plain def bodies. The lease is then at least
            :data:`ASYNC_LEASE_S`.

    Raises:
        InvalidArguments: ``rows`` is malformed or outside 1-10, ``parallel`` < 1, or
            ``broker`` is not an amqp:// or nats:// URL.
        ConfigError: a malformed ledger URL, or neither SQLite nor PostgreSQL.
        LedgerUnavailable: the PostgreSQL server or the SQLite directory cannot be used.
    """
    numbers = parse_rows(rows) if isinstance(rows, str) or rows is None else sorted(set(rows))
    if not isinstance(rows, str) and rows is not None:
        parse_rows(",".join(str(n) for n in numbers) or "0")
    if parallel < 1:
        raise InvalidArguments(f"parallel must be at least 1 (rows at a time), got {parallel}")
    if broker is not None:
        check_broker_url(broker)
    started = time.monotonic()
    if async_bodies:
        lease_s = max(lease_s, ASYNC_LEASE_S)
    worlds = Worlds(ledger_url, lease_s=lease_s, async_bodies=async_bodies)
    report = MatrixReport(worlds.dialect, redact_url(ledger_url) if ledger_url else
                          "a temporary directory", [],
                          explicit=rows is not None)
    controls = Controls()
    lock = threading.Lock()

    def one(number: int) -> RowResult:
        result = _run_row(number, worlds, controls, broker)
        if on_row is not None:
            with lock:
                on_row(result)
        return result

    pool = ThreadPoolExecutor(parallel, thread_name_prefix="matrix-row")
    try:
        report.rows = list(pool.map(one, numbers))
    except BaseException:
        # Interrupted (Ctrl-C): kill every process now, so the running rows end at once.
        worlds.kill_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        worlds.close()
        report.duration_s = time.monotonic() - started
    return report
