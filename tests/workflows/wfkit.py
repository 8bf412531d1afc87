"""Harness of the workflow crash tests: real worker processes, real signals, external counts.

A :class:`WfRig` owns one test's world: a ledger (a fresh SQLite file or a private
PostgreSQL schema, by URL), the counting service (its own process and SQLite file), the
external step log, and every subprocess started. Process control, the service and the
checks are :mod:`ratchet.testing`'s. "How often did it happen" is read from the service's
own file (effects) and the append-only step log (steps), never from Ratchet's records.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ratchet import App, State, TaskInfo
from ratchet.config import parse_ledger_url
from ratchet.ledger import open_ledger
from ratchet.ledger.base import Ledger
from ratchet.testing import (
    ConditionTimeout,
    CountingClient,
    CountingService,
    ProcessGroup,
    ServiceRecords,
    WorkerProcess,
    check_ledger_consistent,
    list_task_ids,
    sqlite_write_locked,
    start_counting_service,
    wait_for,
)

WF_DIR = Path(__file__).resolve().parent
if str(WF_DIR) not in sys.path:
    sys.path.insert(0, str(WF_DIR))

import wfapp  # noqa: E402

__all__ = ["DONE", "WfRig", "WorkerProcess", "wait_for"]

DONE = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATED, State.UNKNOWN)
"""States a test waits for when it waits for "the end" (UNKNOWN: a person's turn)."""


class WfRig:
    """One test's world. Always call :meth:`cleanup` (the fixture does).

    Args:
        tmp: the test's directory (logs, step log, the service's file, a SQLite ledger).
        ledger_url: the ledger (default: a fresh SQLite file under ``tmp``).
    """

    def __init__(self, tmp: Path, ledger_url: str | None = None) -> None:
        self.tmp = tmp
        self.lease_s: float | None = None  # lease of submitted tasks; set before submitting
        self.ledger_url = ledger_url or f"sqlite:///{tmp / 'ledger.db'}"
        self.step_log = tmp / "steps.jsonl"
        self.marks = tmp / "marks"
        self.procs = ProcessGroup(tmp / "procs", pythonpath=[WF_DIR], cwd=WF_DIR,
                                  drop_prefixes=("RATCHET_", "WF_"))  # fmt: skip
        self.service: CountingService | None = None
        self._app: App | None = None
        self._ledger: Ledger | None = None
        self._client: CountingClient | None = None

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return parse_ledger_url(self.ledger_url).scheme

    # ------------------------------------------------------------------ parts

    def start_service(self, check_tokens: bool = False) -> CountingService:
        """Start the counting service. It never deduplicates keys (``honour_keys=False``):
        every request executes and is counted, so a duplicate shows as 2."""
        assert self.service is None
        self.service = start_counting_service(
            self.tmp / "service.db", honour_keys=False, check_tokens=check_tokens,
            log_path=self.tmp / "service.log",
        )  # fmt: skip
        return self.service

    @property
    def client(self) -> CountingClient:
        assert self.service is not None
        if self._client is None:
            self._client = self.service.client(timeout_s=5.0)
        return self._client

    @property
    def app(self) -> App:
        """The test process's own App on this ledger (submit, send events)."""
        if self._app is None:
            self._app = wfapp.build_app(self.ledger_url, lease_s=self.lease_s)
        return self._app

    @property
    def ledger(self) -> Ledger:
        """A read handle on the ledger (the test's, not a worker's)."""
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_url)
        return self._ledger

    def env(self, **extra: str | None) -> dict[str, str | None]:
        env: dict[str, str | None] = {
            "RATCHET_LEDGER_URL": self.ledger_url,
            "WF_STEP_LOG": str(self.step_log),
            "WF_PAY_URL": self.service.url if self.service is not None else None,
        }
        env.update(extra)
        return env

    def worker(
        self,
        name: str = "worker",
        *,
        crash_at: str | None = None,
        pause_at: str | None = None,
        skip: int | None = None,
        concurrency: int = 1,
        prefetch: int | None = None,
        fast_takeover: bool | None = True,
    ) -> WorkerProcess:
        """Start ``python -m ratchet.cli.main worker wfapp:app`` as a subprocess.

        ``fast_takeover`` is on by default here: a killed worker's tasks are revoked by a
        live worker of the same host at once (DESIGN §4), so a test spends its time on
        the workflow, not on lease expiry. A frozen (SIGSTOPped) worker is alive: its
        tasks are taken over by lease expiry only.
        """
        env = self.env(
            RATCHET_CRASH_AT=crash_at,
            RATCHET_PAUSE_AT=pause_at,
            RATCHET_CRASH_SKIP=None if skip is None else str(skip),
        )
        args = [] if prefetch is None else ["--prefetch", str(prefetch)]
        return self.procs.worker(
            "wfapp:app", self.ledger_url, name=name, concurrency=concurrency,
            fast_takeover=fast_takeover, env=env, args=args,
        )  # fmt: skip

    # ------------------------------------------------------------------ reads

    def submit(self, name: str, params: dict[str, Any], key: str | None = None) -> str:
        return self.app.submit(name, params, idempotency_key=key).task_id

    def get(self, task_id: str) -> TaskInfo:
        return self.ledger.get(task_id)

    def wait_state(
        self, task_id: str, states: Iterable[State] | None = None, timeout_s: float = 45.0
    ) -> TaskInfo:
        """Wait until the task is in one of ``states`` (default: any end state)."""
        wanted = tuple(states) if states is not None else DONE

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            return info if info.state in wanted else None

        try:
            return wait_for(f"task {task_id} to reach {wanted}", probe, timeout_s)
        except ConditionTimeout as exc:
            raise AssertionError(f"{exc}; task is {self.get(task_id)}") from None

    def wait_waiting(self, task_id: str, timeout_s: float = 30.0) -> TaskInfo:
        """Wait until the task is parked (``WAITING``: no lease, no holder)."""
        return self.wait_state(task_id, (State.WAITING,), timeout_s)

    def tasks(self) -> list[TaskInfo]:
        """Every task of the ledger (oldest first)."""
        ids = list_task_ids(self.ledger_url)
        out: list[TaskInfo] = []
        for start in range(0, len(ids), 500):
            out.extend(self.ledger.get_many(ids[start:start + 500]))
        return out

    def children(self, parent_id: str, name: str | None = None) -> list[TaskInfo]:
        """The tasks whose ``parent_id`` is ``parent_id`` (of type ``name`` if given)."""
        return [
            t for t in self.tasks()
            if t.parent_id == parent_id and (name is None or t.name == name)
        ]  # fmt: skip

    def records(self) -> ServiceRecords:
        assert self.service is not None
        return self.service.records()

    def executions(self) -> dict[str, int]:
        """Executions per key, read from the counting service's own SQLite file."""
        assert self.service is not None
        return self.service.executions()

    def times(self, key: str) -> list[float]:
        """Wall-clock times (epoch s) of every execution of ``key`` at the service."""
        return [at for at, k in self.records().times if k == key]

    def step_counts(self, task_id: str | None = None) -> Counter[str]:
        """Step executions per step name, from the external step log."""
        if not self.step_log.exists():
            return Counter()
        runs = [json.loads(line) for line in self.step_log.read_text().splitlines()]
        return Counter(r["step"] for r in runs if task_id is None or r["task"] == task_id)

    def ledger_locked(self) -> bool:
        """True if a process frozen inside a ledger transaction holds locks that stall the
        others (SQLite's write lock; on PostgreSQL, an idle-in-transaction session holding
        row locks on this schema)."""
        if self.backend == "sqlite":
            return sqlite_write_locked(parse_ledger_url(self.ledger_url).path, timeout_s=0.05)
        import psycopg

        config = parse_ledger_url(self.ledger_url)
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

    def wait_lease_expired(self, task_id: str, timeout_s: float = 20.0) -> TaskInfo:
        """Wait until the ledger clock is past the task's lease (a takeover is allowed)."""

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            assert info.lease_until is not None, info
            return info if self.ledger.now() > info.lease_until else None

        return wait_for(f"lease of {task_id} to expire", probe, timeout_s)

    def events(self, task_id: str, kind: str) -> list[Any]:
        """The task's audit events of ``kind``."""
        return [e for e in self.ledger.timeline(task_id).events if e.kind == kind]

    def check_consistent(self) -> None:
        check_ledger_consistent(self.ledger_url)

    # ------------------------------------------------------------------ helpers

    def kill_when(
        self, what: str, proc: WorkerProcess, probe: Callable[[], Any], timeout_s: float = 30.0
    ) -> int:
        """SIGKILL ``proc`` as soon as ``probe()`` holds; return its exit status."""
        wait_for(what, probe, timeout_s, 0.005)
        return proc.kill()

    def standby(self, name: str = "standby", **options: Any) -> WorkerProcess:
        """A worker started now and frozen (SIGSTOP) outside any ledger transaction, so a
        test can resume it the moment it is needed (:meth:`WorkerProcess.resume`) without
        waiting for a Python process to start on a loaded machine, and it claims nothing
        meanwhile."""
        proc = self.worker(name, **options)
        proc.holder()
        for _ in range(100):
            proc.pause()
            if not self.ledger_locked():
                return proc
            proc.resume()
            time.sleep(0.01)
        raise AssertionError(f"could not stop {name} outside a ledger transaction")

    def stop_all(self, procs: Sequence[WorkerProcess]) -> None:
        """Stop the workers gracefully (SIGTERM); each must exit 0."""
        for p in procs:
            if p.alive():
                assert p.stop() == 0, p.describe()

    # ------------------------------------------------------------------ teardown

    def dump(self) -> str:
        parts = [self.procs.dump()]
        if self.step_log.exists():
            parts.append(f"===== step log\n{self.step_log.read_text()[-5000:]}")
        if self.service is not None:
            parts.append(f"===== counting service log\n{self.service.log()[-5000:]}")
        return "\n".join(parts)

    def cleanup(self) -> None:
        self.procs.cleanup()
        if self._client is not None:
            self._client.close()
        if self.service is not None:
            self.service.stop()
        if self._app is not None:
            self._app.close()
        if self._ledger is not None:
            self._ledger.close()

