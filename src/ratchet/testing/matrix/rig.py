"""One world of a crash-point matrix row: a ledger, the counting service, the external step
log and every subprocess started (real ``ratchet worker`` processes of
:mod:`ratchet.testing.matrix.app`, real signals).

"How often did it happen" is always read outside Ratchet: executions (and applied items)
from the counting service's own SQLite file, step runs from the append-only step log. The
ledger is read only for *where* a crash left things (a task's state, its audit events).
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...app import App
from ...config import parse_ledger_url
from ...errors import RatchetError
from ...ledger import open_ledger
from ...ledger.base import Ledger, TaskInfo
from ...states import State
from ..counting.process import CountingService, start_counting_service
from ..counting.records import ServiceRecords
from ..processes import ConditionTimeout, ManagedProcess, ProcessGroup, WorkerProcess, wait_for
from . import app as matrix_app

__all__ = ["APP", "DONE", "SIGKILLED", "MatrixRig", "RowFailed", "RowSkipped", "StepRun",
           "expect"]

APP = "ratchet.testing.matrix.app:app"
"""What the matrix's workers run."""

SIGKILLED = -signal.SIGKILL
"""The exit status of a process killed with SIGKILL."""

DONE = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.UNKNOWN)
"""The end states a row waits for."""


class RowFailed(RatchetError):
    """A row's check did not hold; the message says which and what was seen."""


class RowSkipped(RatchetError):
    """A row cannot run in this run (something it needs was not given); the message says
    what. The runner reports it as ``skip``, which fails the run only when ``--rows`` named
    the row."""


def expect(ok: bool, what: str) -> None:
    """Raise :class:`RowFailed` with ``what`` unless ``ok``.

    Raises:
        RowFailed: ``ok`` is false.
    """
    if not ok:
        raise RowFailed(what)


@dataclass(frozen=True)
class StepRun:
    """One execution of a step function (or batch function), from the external step log."""

    task: str
    step: str
    pid: int
    generation: int
    attempt: int
    body: str = "def"
    """``"async"`` when an ``async def`` task body ran it (``MATRIX_ASYNC=1``)."""


class MatrixRig:
    """One world: call :meth:`cleanup` when done (the runner does).

    Args:
        directory: its directory (process logs, step log, the service's file, the gate).
        ledger_url: a fresh, empty ledger (a SQLite file, or a private PostgreSQL schema).
        lease_s: lease of the tasks it submits, seconds.
        service: a counting service shared with other worlds (``None``: the world starts
            its own on :meth:`start_service`).
        world: this world's prefix of the keys and items its processes send to the
            service; the reads here see only those, the prefix stripped.
        async_bodies: its processes run the charge task as an ``async def`` body
            (``MATRIX_ASYNC=1``, :mod:`ratchet.testing.matrix.app`).
    """

    def __init__(self, directory: Path, ledger_url: str, lease_s: float = 1.0,
                 service: CountingService | None = None, world: str = "",
                 async_bodies: bool = False) -> None:
        self.directory = directory
        self.async_bodies = async_bodies
        self.ledger_url = ledger_url
        self.lease_s = lease_s
        self.world = world
        self._own_service = service is None
        self.step_log = directory / "steps.jsonl"
        self.gate = directory / "gate"
        self.procs = ProcessGroup(directory / "procs", cwd=directory,
                                  drop_prefixes=("RATCHET_", "MATRIX_"))
        self.service: CountingService | None = service
        self._app: App | None = None
        self._ledger: Ledger | None = None

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return parse_ledger_url(self.ledger_url).scheme

    @property
    def reader_url(self) -> str:
        """The URL of this process's own handles (a small pool on PostgreSQL)."""
        if self.backend != "postgresql":
            return self.ledger_url
        return self.ledger_url + ("&" if "?" in self.ledger_url else "?") + "pool_size=2"

    # ------------------------------------------------------------------ parts

    def start_service(self) -> CountingService:
        """Start the counting service: it executes and counts every request, a repeated key
        included (it does not dedupe), so only Ratchet's protocol prevents a duplicate."""
        if self.service is None:
            self.service = start_counting_service(
                self.directory / "service.db", honour_keys=False,
                log_path=self.directory / "service.log")
        return self.service

    @property
    def app(self) -> App:
        """This process's own App on the ledger (submit)."""
        if self._app is None:
            self._app = matrix_app.build_app(self.reader_url, lease_s=self.lease_s)
        return self._app

    @property
    def ledger(self) -> Ledger:
        """A read handle on the ledger."""
        if self._ledger is None:
            self._ledger = open_ledger(self.reader_url)
        return self._ledger

    def env(self, **extra: str | None) -> dict[str, str | None]:
        """The variables a process of this world gets on top of the clean environment."""
        env: dict[str, str | None] = {
            "RATCHET_LEDGER_URL": self.ledger_url,
            "MATRIX_STEP_LOG": str(self.step_log),
            "MATRIX_GATE": str(self.gate),
            "MATRIX_LEASE_S": repr(self.lease_s),
            "MATRIX_PAY_URL": self.service.url if self.service is not None else None,
            "MATRIX_WORLD": self.world,
            "MATRIX_ASYNC": "1" if self.async_bodies else None,
        }
        env.update(extra)
        return env

    def worker(self, name: str, *, crash_at: str | None = None, pause_at: str | None = None,
               skip: int | None = None, fast_takeover: bool = False,
               thread: str | None = None, after: str | None = None) -> WorkerProcess:
        """Start ``ratchet worker ratchet.testing.matrix.app:app`` as a subprocess, armed
        to SIGKILL itself at fault point ``crash_at`` (or SIGSTOP at ``pause_at``) the
        ``skip`` + 1-th time it gets there (with ``thread``, a thread name: the ``skip`` +
        1-th time that thread does; with ``after``, a point: counted from when that point
        was reached, :mod:`ratchet.faults`). ``fast_takeover`` is off by
        default: the rows exercise recovery by lease expiry, the path every host relies
        on."""
        env = self.env(RATCHET_CRASH_AT=crash_at, RATCHET_PAUSE_AT=pause_at,
                       RATCHET_CRASH_SKIP=None if skip is None else str(skip),
                       RATCHET_CRASH_THREAD=thread, RATCHET_CRASH_AFTER=after)
        return self.procs.worker(APP, self.ledger_url, name=name,
                                 fast_takeover=fast_takeover, env=env)

    def python(self, name: str, code: str, *args: str, **extra: str | None) -> ManagedProcess:
        """Run ``python -c code args...`` with this world's environment."""
        return self.procs.python(name, code, *args, env=self.env(**extra))

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskInfo:
        """The task's row."""
        return self.ledger.get(task_id)

    def wait_state(self, task_id: str, states: Iterable[State] = DONE,
                   timeout_s: float = 45.0) -> TaskInfo:
        """Wait until the task is in one of ``states`` (default: an end state).

        Raises:
            RowFailed: not within ``timeout_s`` seconds (the task's row is in the message).
        """
        wanted = tuple(states)

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            return info if info.state in wanted else None

        try:
            return wait_for(f"task {task_id} to reach {'/'.join(s.value for s in wanted)}",
                            probe, timeout_s)
        except ConditionTimeout as exc:
            raise RowFailed(f"{exc}; the task is {self.get(task_id).state.value}") from None

    def wait_lease_expired(self, task_id: str, timeout_s: float = 20.0) -> TaskInfo:
        """Wait until the ledger clock is past the task's lease (a takeover is allowed)."""

        def probe() -> TaskInfo | None:
            info = self.get(task_id)
            expect(info.lease_until is not None, f"task {task_id} has no lease: {info.state}")
            return info if self.ledger.now() > (info.lease_until or 0.0) else None

        return wait_for(f"the lease of {task_id} to expire", probe, timeout_s)

    def step_runs(self, task_id: str | None = None) -> list[StepRun]:
        """Every step execution the step functions wrote to the external log."""
        if not self.step_log.exists():
            return []
        runs = [StepRun(**json.loads(line)) for line in self.step_log.read_text().splitlines()]
        return [r for r in runs if task_id is None or r.task == task_id]

    def step_counts(self, task_id: str | None = None) -> dict[str, int]:
        """Step executions per step name (from the external log)."""
        return dict(Counter(r.step for r in self.step_runs(task_id)))

    def executions(self) -> dict[str, int]:
        """This world's executions per key (its prefix stripped), read from the counting
        service's own SQLite file."""
        return self._mine(self.start_service().executions())

    def items(self) -> dict[str, int]:
        """How often each of this world's items was applied at the service (its prefix
        stripped)."""
        return self._mine({str(k): v for k, v in self.records().items.items()})

    def _mine(self, counts: dict[str, int]) -> dict[str, int]:
        n = len(self.world)
        return {k[n:]: v for k, v in counts.items() if k.startswith(self.world)}

    def records(self) -> ServiceRecords:
        """Everything the counting service recorded (every world's, when it is shared)."""
        return self.start_service().records()

    def counts(self, task_id: str | None = None) -> dict[str, Any]:
        """What the external side counted: executions per key, step runs per step."""
        return {"executions": self.executions(), "step_runs": self.step_counts(task_id)}

    # ------------------------------------------------------------------ teardown

    def dump(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of every process log (for a failure's detail)."""
        parts = [f"===== {p.name} pid={p.pid} rc={p.returncode}\n{p.log()[-tail:]}"
                 for p in self.procs.procs]
        if self.service is not None and self._own_service:
            parts.append(f"===== counting service\n{self.service.log()[-tail:]}")
        return "\n".join(parts)

    def cleanup(self) -> None:
        """Kill every process still running, stop the service, close the handles."""
        self.procs.cleanup()
        if self.service is not None and self._own_service:
            self.service.stop()
        if self._app is not None:
            self._app.close()
        if self._ledger is not None:
            self._ledger.close()
