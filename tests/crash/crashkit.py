"""Harness for the crash-point tests: real worker processes, real signals, external counts.

A :class:`Rig` owns one test's world: a ledger (a fresh SQLite file or a private PostgreSQL
schema, by URL), the external counting service (its own process and SQLite file), the
external step log, and every subprocess started. Process control, the service and the
checks are :mod:`ratchet.testing`'s, the same ones users get. Nothing here trusts Ratchet's
own records for "how often did it happen": executions are read from the service's file,
step runs from the append-only step log.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
    ManagedProcess,
    ProcessGroup,
    WorkerProcess,
    check_ledger_consistent,
    sqlite_write_locked,
    start_counting_service,
    wait_for,
)

CRASH_DIR = Path(__file__).resolve().parent
if str(CRASH_DIR) not in sys.path:
    sys.path.insert(0, str(CRASH_DIR))

import crashapp  # noqa: E402

__all__ = [
    "KEY",
    "PARAMS",
    "SIGKILLED",
    "TERMINAL",
    "ConditionTimeout",
    "Outcome",
    "Rig",
    "StepRun",
    "WorkerProcess",
    "check_ledger_consistent",
    "wait_for",
]

SIGKILLED = -signal.SIGKILL
PARAMS: dict[str, Any] = {"order_id": "o-1", "amount_cents": 1234}
KEY = "charge:o-1"
TERMINAL = (State.SUCCEEDED, State.FAILED, State.CANCELLED)

Proc = ManagedProcess  # the name the tests used before ratchet.testing


@dataclass
class StepRun:
    task: str
    step: str
    pid: int
    generation: int
    attempt: int


@dataclass
class Outcome:
    """What a finished run looks like from outside: final task, step runs, executions."""

    info: TaskInfo
    steps: Counter[str]
    executions: dict[str, int]


class Rig:
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
        self.procs = ProcessGroup(tmp / "procs", pythonpath=[CRASH_DIR], cwd=CRASH_DIR,
                                  drop_prefixes=("RATCHET_", "CRASH_"))  # fmt: skip
        self.service: CountingService | None = None
        self._app: App | None = None
        self._ledger: Ledger | None = None
        self._client: CountingClient | None = None

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return parse_ledger_url(self.ledger_url).scheme

    @property
    def ledger_path(self) -> Path:
        """The SQLite ledger file (SQLite only)."""
        config = parse_ledger_url(self.ledger_url)
        assert config.scheme == "sqlite", "no ledger file on PostgreSQL"
        return Path(config.path)

    # ------------------------------------------------------------------ parts

    def start_service(
        self, honour_keys: bool = True, check_tokens: bool = False
    ) -> CountingService:
        """Start the counting service (``check_tokens``: fenced mode, ``--check-tokens``)."""
        assert self.service is None
        self.service = start_counting_service(
            self.tmp / "service.db", honour_keys=honour_keys, check_tokens=check_tokens,
            log_path=self.tmp / "service.log",
        )  # fmt: skip
        return self.service

    @property
    def client(self) -> CountingClient:
        assert self.service is not None
        if self._client is None:
            self._client = self.service.client()
        return self._client

    @property
    def app(self) -> App:
        """The test process's own App on this ledger (for submit)."""
        if self._app is None:
            self._app = crashapp.build_app(self.ledger_url, lease_s=self.lease_s)
        return self._app

    @property
    def ledger(self) -> Ledger:
        """A read handle on the ledger (the test's, not a worker's)."""
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_url)
        return self._ledger

    def env(self, **extra: str | None) -> dict[str, str | None]:
        """The variables a process of this rig gets on top of the clean environment."""
        env: dict[str, str | None] = {
            "RATCHET_LEDGER_URL": self.ledger_url,
            "CRASH_STEP_LOG": str(self.step_log),
            "CRASH_PAY_URL": self.service.url if self.service is not None else None,
        }
        env.update(extra)
        return env

    def worker(
        self,
        name: str = "worker",
        *,
        crash_at: str | None = None,
        skip: int | None = None,
        pause_at: str | None = None,
        thread: str | None = None,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        fast_takeover: bool | None = False,
        url: str | None = None,
        log_level: str = "INFO",
        args: Sequence[str] = (),
    ) -> WorkerProcess:
        """Start ``python -m ratchet.cli.main worker crashapp:app`` as a subprocess.

        ``fast_takeover`` is off by default here: the crash-point matrix rows (DESIGN §6)
        exercise recovery by lease expiry, the path every host relies on; revocation of a
        dead same-host holder is exercised by the many-kills test and tests/takeover/.
        ``None`` leaves the CLI's default. ``url`` overrides the rig's ledger URL for this
        worker only; ``args`` are more CLI arguments.
        """
        full_env = self.env(
            RATCHET_CRASH_AT=crash_at,
            RATCHET_PAUSE_AT=pause_at,
            RATCHET_CRASH_SKIP=None if skip is None else str(skip),
            RATCHET_CRASH_THREAD=thread,
            **(env or {}),
        )
        ledger = url or self.ledger_url
        full_env["RATCHET_LEDGER_URL"] = ledger
        return self.procs.worker(
            "crashapp:app", ledger, name=name, concurrency=concurrency,
            fast_takeover=fast_takeover, env=full_env, log_level=log_level, args=args,
        )  # fmt: skip

    def python(self, name: str, code: str, *args: str, **extra: str | None) -> ManagedProcess:
        """Run ``python -c code args...`` with the rig's environment."""
        return self.procs.python(name, code, *args, env=self.env(**extra))

    # ------------------------------------------------------------------ reads

    def submit(self, params: dict[str, Any] | None = None, key: str | None = None) -> str:
        handle = self.app.submit(crashapp.CHARGE, params or PARAMS, idempotency_key=key)
        return handle.task_id

    def get(self, task_id: str) -> TaskInfo:
        return self.ledger.get(task_id)

    def wait_state(
        self, task_id: str, states: Iterable[State] = TERMINAL, timeout_s: float = 45.0
    ) -> TaskInfo:
        wanted = tuple(states)

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            return info if info.state in wanted else None

        try:
            return wait_for(f"task {task_id} to reach {wanted}", probe, timeout_s)
        except ConditionTimeout as exc:
            raise AssertionError(f"{exc}; task is {self.get(task_id)}") from None

    def step_runs(self, task_id: str | None = None) -> list[StepRun]:
        """Every step execution the step functions wrote to the external log."""
        if not self.step_log.exists():
            return []
        runs = [StepRun(**json.loads(line)) for line in self.step_log.read_text().splitlines()]
        return [r for r in runs if task_id is None or r.task == task_id]

    def step_counts(self, task_id: str | None = None) -> Counter[str]:
        return Counter(r.step for r in self.step_runs(task_id))

    def executions(self) -> dict[str, int]:
        """Executions per key, read from the counting service's own SQLite file."""
        assert self.service is not None
        return self.service.executions()

    def record_ids(self) -> dict[str, str]:
        """The service's record id per key (what a recorded effect result must name)."""
        assert self.service is not None
        return self.service.records().ids

    def outcome(self, task_id: str) -> Outcome:
        return Outcome(self.get(task_id), self.step_counts(task_id), self.executions())

    def ledger_locked(self) -> bool:
        """True if a process frozen (or stuck) inside a ledger transaction holds locks
        that stall the others: SQLite's single write lock; on PostgreSQL, a session idle
        inside a transaction holding row locks on this schema's tables."""
        if self.backend == "sqlite":
            return sqlite_write_locked(self.ledger_path, timeout_s=0.05)
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
        """Wait until the ledger clock is past the task's lease (a takeover is now allowed)."""

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            assert info.lease_until is not None, info
            return info if self.ledger.now() > info.lease_until else None

        return wait_for(f"lease of {task_id} to expire", probe, timeout_s)

    def check_consistent(self) -> None:
        """The ledger's structural invariants (:func:`ratchet.testing.check_ledger_consistent`)."""
        check_ledger_consistent(self.ledger_url)

    # ------------------------------------------------------------------ teardown

    def dump(self) -> str:
        parts = [self.procs.dump()]
        if self.step_log.exists():
            parts.append(f"===== step log\n{self.step_log.read_text()}")
        if self.service is not None:
            parts.append(f"===== counting service log\n{self.service.log()}")
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
