"""Harness of the flow-control process tests: real worker processes, real signals, marks
counted at the external side.

A :class:`FlowRig` owns one test's world: a ledger (a fresh SQLite file or a private
PostgreSQL schema, by URL), the counting service (its own process and SQLite file; it
executes every request, so each mark a body sends is one row there, in the service's
order), and every subprocess started. What ran, when and where is read from the service's
own file (:meth:`FlowRig.marks`), never from Ratchet's records.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ratchet import App
from ratchet.config import parse_ledger_url
from ratchet.testing import (
    CountingService,
    ProcessGroup,
    WorkerProcess,
    pause_outside_write_lock,
    start_counting_service,
    wait_for,
)

FLOW_DIR = Path(__file__).resolve().parent
if str(FLOW_DIR) not in sys.path:
    sys.path.insert(0, str(FLOW_DIR))

import flowapp  # noqa: E402
from pgsupport import with_params  # noqa: E402

__all__ = ["FlowRig", "Mark", "WorkerProcess", "wait_for"]


@dataclass(frozen=True)
class Mark:
    """One mark a body sent, as the service recorded it.

    Attributes:
        seq: its place in the service's order (0, 1, ...: the order the service executed
            the requests in, under one lock).
        at: the service's wall clock when it executed it, epoch seconds.
        fields: the key's ``|``-separated fields (``("s", "acct3", "17", "1", "4242")``).
    """

    seq: int
    at: float
    fields: tuple[str, ...]

    @property
    def kind(self) -> str:
        return self.fields[0]


class FlowRig:
    """One test's world. Always call :meth:`cleanup` (the fixture does).

    Args:
        tmp: the test's directory (logs, the service's file, a SQLite ledger).
        ledger_url: the ledger.
    """

    def __init__(self, tmp: Path, ledger_url: str) -> None:
        self.tmp = tmp
        self.ledger_url = ledger_url
        self.procs = ProcessGroup(tmp / "procs", pythonpath=[FLOW_DIR], cwd=FLOW_DIR,
                                  drop_prefixes=("RATCHET_", "FLOW_"))
        self.service: CountingService = start_counting_service(
            tmp / "service.db", honour_keys=False, log_path=tmp / "service.log")
        self._app: App | None = None

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return parse_ledger_url(self.ledger_url).scheme

    @property
    def app(self) -> App:
        """The test process's own App on this ledger (submit, read): on PostgreSQL with a
        small pool (the server's connections are shared with other test processes)."""
        if self._app is None:
            url = (with_params(self.ledger_url, pool_size="2")
                   if self.backend == "postgresql" else self.ledger_url)
            self._app = flowapp.build_app(url)
        return self._app

    def worker(self, name: str, *, concurrency: int = 4, prefetch: int | None = None,
               queues: Sequence[str] | None = None) -> WorkerProcess:
        """Start ``ratchet worker flowapp:app`` (fast takeover on: a killed worker's tasks
        are revoked by a live worker of the same host at once)."""
        args: list[str] = []
        if prefetch is not None:
            args += ["--prefetch", str(prefetch)]
        if queues is not None:
            args += ["--queues", ",".join(queues)]
        return self.procs.worker("flowapp:app", self.ledger_url, name=name,
                                 concurrency=concurrency, fast_takeover=True, args=args,
                                 env={"FLOW_URL": self.service.url})

    @staticmethod
    def stop_all(workers: Sequence[WorkerProcess], timeout_s: float = 60.0) -> list[int]:
        """Stop ``workers`` gracefully, all at once (SIGTERM to each, then wait for each):
        on SQLite a worker stopping while the others still claim waits for the write lock
        behind them. Returns their exit statuses."""
        for w in workers:
            if w.alive():
                w.holder()  # its SIGTERM handler is installed: a stop, never a crash
                w.signal(signal.SIGCONT)
                w.signal(signal.SIGTERM)
        return [w.wait(timeout_s) for w in workers]

    def freeze(self, proc: WorkerProcess) -> None:
        """SIGSTOP ``proc`` outside a SQLite write transaction (frozen inside one it would
        hold the single write lock and stall the test's own submit: a SQLite mechanic,
        not what these tests are about; PostgreSQL locks rows, and claims skip locked
        ones). Paused while the test holds the write lock.
        """
        config = parse_ledger_url(self.ledger_url)
        if config.scheme != "sqlite":
            proc.pause()
            return
        # Paused while this test holds the write lock: the worker cannot be inside a
        # write transaction then (retrying pause-and-probe failed on a loaded machine,
        # where a resumed worker barely runs before the next try).
        pause_outside_write_lock(config.path, proc.pause)

    def marks(self, kind: str | None = None) -> list[Mark]:
        """Every mark the service recorded so far (of ``kind`` if given), in its order."""
        out = [Mark(i, at, tuple(key.split("|")))
               for i, (at, key) in enumerate(self.service.records().times)]
        return [m for m in out if kind is None or m.kind == kind]

    def count(self, name: str, state: str) -> int:
        """Tasks of ``name`` in ``state`` (the ledger's exact counts)."""
        return self.app.ledger.stats().counts.get(name, {}).get(state, 0)

    def wait_succeeded(self, name: str, n: int, timeout_s: float) -> None:
        """Wait until ``n`` tasks of ``name`` SUCCEEDED."""
        wait_for(f"{n} {name} tasks to succeed",
                 lambda: self.count(name, "SUCCEEDED") >= n, timeout_s, 0.2)

    def cleanup(self) -> None:
        try:
            self.procs.cleanup()
        finally:
            try:
                self.service.stop()
            finally:
                if self._app is not None:
                    self._app.close()

    def dump(self) -> str:
        """Every process log, and the service's, for a failure report."""
        service_log = self.tmp / "service.log"
        tail = service_log.read_text("utf-8", "replace")[-5000:] if service_log.exists() else ""
        return f"{self.procs.dump()}\n===== counting service\n{tail}"
