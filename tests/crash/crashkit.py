"""Harness for the crash-point tests: real worker processes, real signals, external counts.

A :class:`Rig` owns one test's world: a fresh ledger file, the external payment service
(its own process and SQLite file), the external step log, and every subprocess started.
Nothing here trusts Ratchet's own records for "how often did it happen": executions are
read from the payment service's file, step runs from the append-only step log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratchet import App, State, TaskInfo
from ratchet.demo.payments import (
    PaymentClient,
    PaymentService,
    read_charges,
    read_executions,
    start_payment_service,
)
from ratchet.demo.runner import sqlite_write_locked
from ratchet.ledger import open_ledger
from ratchet.ledger.base import Ledger

CRASH_DIR = Path(__file__).resolve().parent
if str(CRASH_DIR) not in sys.path:
    sys.path.insert(0, str(CRASH_DIR))

import crashapp  # noqa: E402

SIGKILLED = -signal.SIGKILL
PARAMS: dict[str, Any] = {"order_id": "o-1", "amount_cents": 1234}
KEY = "charge:o-1"
TERMINAL = (State.SUCCEEDED, State.FAILED, State.CANCELLED)


def migration_count() -> int:
    """Write transactions a process runs when it opens the ledger (one per migration)."""
    from ratchet.ledger.migrations import load_migrations

    return len(load_migrations("sqlite"))


def wait_for(
    what: str, probe: Callable[[], Any], timeout_s: float = 20.0, interval_s: float = 0.05
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


class Proc:
    """A subprocess whose stdout+stderr go to a file under the test's tmp dir."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.cmd = cmd
        self.log_path = log_path
        with open(log_path, "wb") as out:
            self.popen = subprocess.Popen(
                cmd,
                env=env,
                cwd=str(CRASH_DIR),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.pid = self.popen.pid
        self.is_worker = "worker" in cmd

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def proc_state(self) -> str | None:
        """Kernel state letter from /proc (``T`` = stopped), or None once reaped."""
        if self.popen.poll() is not None:
            return None
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except FileNotFoundError:
            return None
        return stat.rsplit(")", 1)[1].split()[0]

    def wait(self, timeout_s: float = 20.0) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} (pid {self.pid}) still running after {timeout_s} s"
            ) from None

    def wait_stopped(self, timeout_s: float = 20.0) -> None:
        wait_for(
            f"{self.name} to be stopped (SIGSTOP)",
            lambda: self.proc_state() == "T",
            timeout_s,
            0.02,
        )

    def holder(self, timeout_s: float = 20.0) -> str:
        """The worker's holder id, from its start-up log line."""

        def probe() -> str | None:
            m = re.search(r"worker (\S+): tasks", self.log())
            return m.group(1) if m else None

        return str(wait_for(f"{self.name} to log its start-up line", probe, timeout_s))

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, timeout_s: float = 15.0) -> int:
        """Graceful stop (SIGCONT first if paused, then SIGTERM); SIGKILL if it hangs.

        A worker is first given time to install its SIGTERM handler (it logs its start-up
        line right after), so a stop is never mistaken for a crash."""
        if self.popen.poll() is None:
            if self.is_worker:
                self.signal(signal.SIGCONT)
                self.holder()
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.name} ignored SIGTERM for {timeout_s} s") from None
        return self.popen.returncode

    def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return self.popen.wait(timeout=30)


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
    """One test's world. Always call :meth:`cleanup` (the fixture does)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.lease_s: float | None = None  # lease of submitted tasks; set before submitting
        self.ledger_path = tmp / "ledger.db"
        self.ledger_url = f"sqlite:///{self.ledger_path}"
        self.step_log = tmp / "steps.jsonl"
        self.procs: list[Proc] = []
        self.service: PaymentService | None = None
        self._app: App | None = None
        self._ledger: Ledger | None = None
        self._client: PaymentClient | None = None
        self._n = 0

    # ------------------------------------------------------------------ parts

    def start_service(self, honour_keys: bool = True) -> PaymentService:
        assert self.service is None
        self.service = start_payment_service(
            self.tmp / "payments.db", honour_keys=honour_keys, log_path=self.tmp / "payments.log"
        )
        return self.service

    @property
    def client(self) -> PaymentClient:
        assert self.service is not None
        if self._client is None:
            self._client = PaymentClient(self.service.url)
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

    def env(self, **extra: str | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "CRASH_"))}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(CRASH_DIR), os.environ.get("PYTHONPATH")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        env["RATCHET_LEDGER_URL"] = self.ledger_url
        env["CRASH_STEP_LOG"] = str(self.step_log)
        if self.service is not None:
            env["CRASH_PAY_URL"] = self.service.url
        for k, v in extra.items():
            if v is not None:
                env[k] = v
        return env

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        self._n += 1
        proc = Proc(name, cmd, env, self.tmp / f"{self._n:02d}-{name}.log")
        self.procs.append(proc)
        return proc

    def worker(
        self,
        name: str = "worker",
        *,
        crash_at: str | None = None,
        skip: int | None = None,
        pause_at: str | None = None,
        concurrency: int = 1,
        env: dict[str, str] | None = None,
        fast_takeover: bool = False,
    ) -> Proc:
        """Start ``python -m ratchet.cli.main worker crashapp:app`` as a subprocess.

        ``fast_takeover`` is off by default here: the crash-point matrix rows (DESIGN §6)
        exercise recovery by lease expiry, the path every host relies on; revocation of a
        dead same-host holder is exercised by the many-kills test and tests/takeover/.
        """
        cmd = [
            sys.executable,
            "-m",
            "ratchet.cli.main",
            "worker",
            "crashapp:app",
            "--concurrency",
            str(concurrency),
            "--ledger",
            self.ledger_url,
            "--poll-interval-s",
            "0.05",
            "--log-level",
            "INFO",
            "--fast-takeover" if fast_takeover else "--no-fast-takeover",
        ]
        full_env = self.env(
            RATCHET_CRASH_AT=crash_at,
            RATCHET_PAUSE_AT=pause_at,
            RATCHET_CRASH_SKIP=None if skip is None else str(skip),
            **(env or {}),
        )
        return self._spawn(name, cmd, full_env)

    def python(self, name: str, code: str, *args: str, **extra: str | None) -> Proc:
        """Run ``python -c code args...`` with the rig's environment."""
        return self._spawn(name, [sys.executable, "-c", code, *args], self.env(**extra))

    # ------------------------------------------------------------------ reads

    def submit(self, params: dict[str, Any] | None = None, key: str | None = None) -> str:
        handle = self.app.submit(crashapp.CHARGE, params or PARAMS, idempotency_key=key)
        return handle.task_id

    def get(self, task_id: str) -> TaskInfo:
        return self.ledger.get(task_id)

    def wait_state(
        self, task_id: str, states: Iterable[State] = TERMINAL, timeout_s: float = 30.0
    ) -> TaskInfo:
        wanted = tuple(states)

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            return info if info.state in wanted else None

        try:
            return wait_for(f"task {task_id} to reach {wanted}", probe, timeout_s)
        except AssertionError as exc:
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
        """Executions per key, read from the payment service's own SQLite file."""
        assert self.service is not None
        return read_executions(self.service.db_path)

    def charges(self) -> dict[str, dict[str, Any]]:
        assert self.service is not None
        return read_charges(self.service.db_path)

    def outcome(self, task_id: str) -> Outcome:
        return Outcome(self.get(task_id), self.step_counts(task_id), self.executions())

    def ledger_locked(self) -> bool:
        """True if some process holds the ledger's write lock right now."""
        return sqlite_write_locked(self.ledger_path, timeout_s=0.05)

    def wait_lease_expired(self, task_id: str, timeout_s: float = 20.0) -> TaskInfo:
        """Wait until the ledger clock is past the task's lease (a takeover is now allowed)."""

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            assert info.lease_until is not None, info
            return info if self.ledger.now() > info.lease_until else None

        return wait_for(f"lease of {task_id} to expire", probe, timeout_s)

    # ------------------------------------------------------------------ teardown

    def dump(self) -> str:
        parts = []
        for proc in self.procs:
            parts.append(
                f"===== {proc.name} pid={proc.pid} rc={proc.returncode} cmd={' '.join(proc.cmd)}\n"
                f"{proc.log()}"
            )
        if self.step_log.exists():
            parts.append(f"===== step log\n{self.step_log.read_text()}")
        svc_log = self.tmp / "payments.log"
        if svc_log.exists():
            parts.append(f"===== payment service log\n{svc_log.read_text('utf-8', 'replace')}")
        return "\n".join(parts)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.signal(signal.SIGCONT)
                proc.kill()
        if self._client is not None:
            self._client.close()
        if self.service is not None:
            self.service.stop()
        if self._app is not None:
            self._app.close()
        if self._ledger is not None:
            self._ledger.close()


# ---------------------------------------------------------------------- ledger invariants


def check_ledger_consistent(ledger_path: Path) -> None:
    """Structural invariants of the ledger file, read with plain SQL (no Ratchet code).

    * the file passes ``PRAGMA integrity_check``;
    * a task's generation equals its number of claim/takeover/revoke audit rows, and those
      rows carry generations 1..g in order (each claim or revocation bumps the fence once);
    * every step and effect row was written by a generation that was claimed, never a
      newer one than the task's;
    * SUCCEEDED tasks hold no lease and have a result; RUNNING tasks have holder and lease;
    * every stale_rejected audit row names an older generation than the task's current one.
    """
    conn = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True, timeout=30)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        tasks = conn.execute(
            "SELECT id, state, generation, holder, lease_until, result FROM tasks"
        ).fetchall()
        for task_id, state, generation, holder, lease_until, result in tasks:
            claims = [
                g
                for (g,) in conn.execute(
                    "SELECT generation FROM audit WHERE task_id = ? AND kind IN"
                    " ('claim', 'takeover', 'revoke') ORDER BY seq",
                    (task_id,),
                )
            ]
            assert claims == list(range(1, generation + 1)), (task_id, generation, claims)
            for table in ("steps", "effects"):
                for name, g in conn.execute(
                    f"SELECT name, generation FROM {table} WHERE task_id = ?", (task_id,)
                ):
                    assert 1 <= g <= generation, (table, task_id, name, g, generation)
            if state == "SUCCEEDED":
                assert holder is None and lease_until is None and result is not None, task_id
            if state == "RUNNING":
                assert holder is not None and lease_until is not None, task_id
            for (g,) in conn.execute(
                "SELECT generation FROM audit WHERE task_id = ? AND kind = 'stale_rejected'",
                (task_id,),
            ):
                assert g < generation, (task_id, g, generation)
        orphans = conn.execute(
            "SELECT COUNT(*) FROM steps WHERE task_id NOT IN (SELECT id FROM tasks)"
        ).fetchone()[0]
        assert orphans == 0
    finally:
        conn.close()
