"""Harness of the batch crash tests: real worker processes, real signals, external counts.

A :class:`BatchRig` owns one test's world: a ledger (a fresh SQLite file or a private
PostgreSQL schema, by URL), the counting service (its own process and SQLite file; it
never deduplicates keys, so a batch delivered twice shows its items applied twice), the
external call log of the batch functions, a gate file, and every subprocess started.
Process control, the service and the checks are :mod:`ratchet.testing`'s. "How often did
it happen" is read from the service's own file (items, executions) and the append-only
call log (batch function calls), never from Ratchet's records.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ratchet import App, State, TaskInfo
from ratchet.config import parse_ledger_url
from ratchet.ledger import open_ledger
from ratchet.ledger.base import BatchRun, Ledger
from ratchet.testing import (
    ConditionTimeout,
    CountingService,
    ProcessGroup,
    ServiceRecords,
    WorkerProcess,
    check_ledger_consistent,
    clean_env,
    sqlite_write_locked,
    start_counting_service,
    wait_for,
)

BATCH_DIR = Path(__file__).resolve().parent
if str(BATCH_DIR) not in sys.path:
    sys.path.insert(0, str(BATCH_DIR))

import batchapp  # noqa: E402
from pgsupport import with_params  # noqa: E402

__all__ = ["DONE", "BatchRig", "Call", "WatermarkSampler", "WorkerProcess", "held_by",
           "wait_for"]

DONE = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.UNKNOWN)
"""The end states a test waits for."""


def held_by(workers: Iterable[WorkerProcess], holder: str | None) -> WorkerProcess | None:
    """The live worker among ``workers`` whose lease-holder name is ``holder``
    (``host:pid:random``: matched by process id, so a worker counts from its start, before
    its start-up line is read)."""
    parts = (holder or "").split(":")
    if len(parts) < 3 or not parts[-2].isdigit():
        return None
    pid = int(parts[-2])
    for worker in workers:
        if worker.pid == pid and worker.alive():
            return worker
    return None


@dataclass(frozen=True)
class Call:
    """One call of a batch function, from the external call log."""

    task: str
    pos: int
    pid: int
    generation: int
    attempt: int


class BatchRig:
    """One test's world. Always call :meth:`cleanup` (the fixture does).

    Args:
        tmp: the test's directory (logs, call log, gate, the service's file, a SQLite
            ledger).
        ledger_url: the ledger.
    """

    def __init__(self, tmp: Path, ledger_url: str) -> None:
        self.tmp = tmp
        self.ledger_url = ledger_url
        self.lease_s: float | None = None  # lease of submitted tasks; set before submitting
        self.in_flight_s: float | None = None  # BATCH_IN_FLIGHT_S of the workers
        self.call_log = tmp / "calls.jsonl"
        self.gate = tmp / "gate"
        self.procs = ProcessGroup(tmp / "procs", pythonpath=[BATCH_DIR], cwd=BATCH_DIR,
                                  drop_prefixes=("RATCHET_", "BATCH_"))  # fmt: skip
        self.service: CountingService | None = None
        self._app: App | None = None
        self._ledger: Ledger | None = None

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return parse_ledger_url(self.ledger_url).scheme

    @property
    def reader_url(self) -> str:
        """The ledger URL of the test's own readers: on PostgreSQL with a small pool (the
        server's connections are shared with other test processes)."""
        if self.backend == "postgresql":
            return with_params(self.ledger_url, pool_size="2")
        return self.ledger_url

    # ------------------------------------------------------------------ parts

    def start_service(self, latency_s: float = 0.0) -> CountingService:
        """Start the counting service; it executes (and counts) every request, duplicates
        included (``honour_keys=False``). ``latency_s``: the mean time each request takes
        before it executes (a real API's)."""
        assert self.service is None
        self.service = start_counting_service(
            self.tmp / "service.db", honour_keys=False, latency_s=latency_s,
            log_path=self.tmp / "service.log")
        return self.service

    @property
    def app(self) -> App:
        """The test process's own App on this ledger (submit)."""
        if self._app is None:
            self._app = batchapp.build_app(self.reader_url, lease_s=self.lease_s)
        return self._app

    @property
    def ledger(self) -> Ledger:
        """A read handle on the ledger (the test's, not a worker's)."""
        if self._ledger is None:
            self._ledger = open_ledger(self.reader_url)
        return self._ledger

    def env(self, **extra: str | None) -> dict[str, str | None]:
        env: dict[str, str | None] = {
            "RATCHET_LEDGER_URL": self.ledger_url,
            "BATCH_LOG": str(self.call_log),
            "BATCH_GATE": str(self.gate),
            "BATCH_PAY_URL": self.service.url if self.service is not None else None,
            "BATCH_IN_FLIGHT_S": None if self.in_flight_s is None else repr(self.in_flight_s),
        }
        env.update(extra)
        return env

    def worker(self, name: str = "worker", *, crash_at: str | None = None,
               pause_at: str | None = None, skip: int | None = None, concurrency: int = 1,
               fast_takeover: bool | None = True) -> WorkerProcess:
        """Start ``python -m ratchet.cli.main worker batchapp:app`` as a subprocess.

        ``fast_takeover`` is on by default: a killed worker's tasks are revoked by a live
        worker of the same host at once (DESIGN §4), so a test spends its time on batches,
        not on lease expiry. A frozen (SIGSTOPped) worker is alive: its tasks are taken
        over by lease expiry only.
        """
        env = self.env(RATCHET_CRASH_AT=crash_at, RATCHET_PAUSE_AT=pause_at,
                       RATCHET_CRASH_SKIP=None if skip is None else str(skip))
        return self.procs.worker("batchapp:app", self.ledger_url, name=name,
                                 concurrency=concurrency, fast_takeover=fast_takeover,
                                 env=env)  # fmt: skip

    def cli(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the real ``ratchet`` command line (``python -m ratchet.cli.main ARGS
        --ledger URL``) in a subprocess; its output and exit status."""
        cmd = [sys.executable, "-m", "ratchet.cli.main", *args, "--ledger", self.ledger_url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              env=clean_env(drop_prefixes=("RATCHET_", "BATCH_")),
                              cwd=BATCH_DIR, check=False)  # fmt: skip

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskInfo:
        return self.ledger.get(task_id)

    def wait_state(self, task_id: str, states: Iterable[State] = DONE,
                   timeout_s: float = 60.0) -> TaskInfo:
        """Wait until the task is in one of ``states`` (default: an end state)."""
        wanted = tuple(states)

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            return info if info.state in wanted else None

        try:
            return wait_for(f"task {task_id} to reach {wanted}", probe, timeout_s, 0.1)
        except ConditionTimeout as exc:
            raise AssertionError(f"{exc}; task is {self.get(task_id)}") from None

    def run(self, task_id: str) -> BatchRun | None:
        """The task's one batch run in the ledger (None before its first commit)."""
        runs = self.ledger.batch_runs([task_id])
        assert len(runs) <= 1, runs
        return runs[0] if runs else None

    def wait_lease_expired(self, task_id: str, timeout_s: float = 30.0) -> TaskInfo:
        """Wait until the ledger clock is past the task's lease (a takeover is allowed)."""

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            assert info.lease_until is not None, info
            return info if self.ledger.now() > info.lease_until else None

        return wait_for(f"lease of {task_id} to expire", probe, timeout_s)

    def calls(self, task_id: str | None = None) -> list[Call]:
        """Every batch function call the external log holds (of ``task_id`` if given)."""
        if not self.call_log.exists():
            return []
        calls = [Call(**json.loads(line)) for line in self.call_log.read_text().splitlines()]
        return [c for c in calls if task_id is None or c.task == task_id]

    def call_counts(self, task_id: str | None = None) -> Counter[int]:
        """Batch function calls per position."""
        return Counter(c.pos for c in self.calls(task_id))

    def records(self) -> ServiceRecords:
        assert self.service is not None
        return self.service.records()

    def ledger_locked(self) -> bool:
        """True if a process frozen inside a ledger transaction holds locks that stall the
        others (SQLite's write lock; on PostgreSQL, an idle-in-transaction session holding
        row locks on this schema)."""
        config = parse_ledger_url(self.ledger_url)
        if self.backend == "sqlite":
            return sqlite_write_locked(config.path, timeout_s=0.05)
        import psycopg

        with psycopg.connect(self.ledger_url.split("?")[0], autocommit=True) as pg:
            rows = pg.execute(
                "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE n.nspname = %s AND a.state LIKE 'idle in transaction%%'"
                " AND l.mode IN ('RowShareLock', 'RowExclusiveLock')",
                (config.options.get("schema", "ratchet"),),
            ).fetchall()
        return bool(rows)

    def check_consistent(self) -> None:
        check_ledger_consistent(self.ledger_url)

    # ------------------------------------------------------------------ teardown

    def dump(self) -> str:
        parts = [self.procs.dump()]
        if self.call_log.exists():
            parts.append(f"===== call log (tail)\n{self.call_log.read_text()[-4000:]}")
        if self.service is not None:
            parts.append(f"===== counting service log\n{self.service.log()[-4000:]}")
        return "\n".join(parts)

    def cleanup(self) -> None:
        self.procs.cleanup()
        if self.service is not None:
            self.service.stop()
        if self._app is not None:
            self._app.close()
        if self._ledger is not None:
            self._ledger.close()


class WatermarkSampler:
    """Samples the batch runs of some tasks from the ledger on a thread of its own, every
    ``interval_s``, until :meth:`stop`; :attr:`backwards` lists every sample whose
    watermark or committed counts were lower than the previous sample of the same run.

    It opens its own ledger handle (the test's stays on the test's thread).
    """

    def __init__(self, ledger_url: str, task_ids: Iterable[str],
                 interval_s: float = 0.02) -> None:
        self.task_ids = list(task_ids)
        self.interval_s = interval_s
        self.samples = 0
        self.errors: list[str] = []
        self.backwards: list[tuple[str, str, int, int]] = []
        self.last: dict[tuple[str, str], BatchRun] = {}
        self._ledger = open_ledger(ledger_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watermark-sampler",
                                        daemon=True)

    def start(self) -> WatermarkSampler:
        self._thread.start()
        return self

    def sample(self) -> None:
        """Take one sample now."""
        for run in self._ledger.batch_runs(self.task_ids):
            key = (run.task_id, run.run)
            before = self.last.get(key)
            if before is not None:
                if run.watermark < before.watermark:
                    self.backwards.append((run.task_id, "watermark", before.watermark,
                                           run.watermark))
                if run.processed < before.processed:
                    self.backwards.append((run.task_id, "processed", before.processed,
                                           run.processed))
                if run.batches < before.batches:
                    self.backwards.append((run.task_id, "batches", before.batches,
                                           run.batches))
            self.last[key] = run
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # a ledger hiccup must not end the sampling
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)
        self.sample()
        self._ledger.close()
