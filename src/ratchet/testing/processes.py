"""Process control for tests and demos: real ``ratchet worker`` subprocesses, real signals.

:class:`ProcessGroup` starts every subprocess of one test (or one demo run) with a clean
environment and a log file each, and kills whatever is left on :meth:`ProcessGroup.cleanup`.
:class:`WorkerProcess` is one ``ratchet worker`` process: learn its lease-holder name from
its start-up log line, SIGKILL / SIGSTOP / SIGCONT / SIGTERM it, wait for it, read its log.
:func:`wait_for` polls a condition with a deadline (never a fixed sleep before an assertion).

Process state (stopped, zombie) comes from psutil. Nothing here touches the ledger.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import psutil

from ..errors import RatchetError

__all__ = [
    "ConditionTimeout",
    "ManagedProcess",
    "ProcessGroup",
    "WorkerProcess",
    "clean_env",
    "wait_for",
]

T = TypeVar("T")

_HOLDER_LINE = re.compile(r"worker (\S+): tasks")
"""The start-up line ``ratchet worker`` logs once its signal handlers are installed."""


class ConditionTimeout(RatchetError, AssertionError):
    """:func:`wait_for` (or a process wait) gave up: the condition did not hold in time.

    An ``AssertionError`` too, so pytest reports it as a failed expectation."""


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 20.0,
    interval_s: float = 0.05,
) -> T:
    """Call ``probe()`` until it returns something truthy and return that value.

    Args:
        what: what is awaited, for the error message ("task X to succeed").
        probe: the condition; a falsy result means "not yet". Exceptions propagate.
        timeout_s: deadline, seconds (monotonic clock).
        interval_s: pause between probes, seconds.

    Raises:
        ConditionTimeout: still falsy after ``timeout_s`` seconds (the probe runs once more
            at the deadline, so a slow machine never fails on a condition that just held).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ConditionTimeout(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def clean_env(
    extra: Mapping[str, str | None] | None = None,
    *,
    drop_prefixes: Sequence[str] = ("RATCHET_",),
    pythonpath: Iterable[str | Path] = (),
) -> dict[str, str]:
    """``os.environ`` without variables starting with ``drop_prefixes``, plus ``extra``.

    A developer's shell (``RATCHET_LEDGER_URL``, fault points) must not change what a test's
    subprocess sees. ``PYTHONUNBUFFERED=1`` is set so logs arrive as they are written.

    Args:
        extra: variables to set (a ``None`` value leaves the variable unset).
        drop_prefixes: prefixes of inherited variables to drop.
        pythonpath: directories put in front of ``PYTHONPATH``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop_prefixes))}
    paths = [str(p) for p in pythonpath]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(
            [*paths, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
        )
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in (extra or {}).items():
        if value is not None:
            env[key] = value
    return env


class ManagedProcess:
    """A subprocess whose stdout and stderr go to one log file.

    Args:
        name: for messages and the log file name.
        cmd: the command line.
        env: its complete environment.
        log_path: file receiving stdout+stderr (created, appended to).
        cwd: working directory (None: this process's).
        new_session: run it in a session (and process group) of its own; signals then go
            to the whole group, so children of the process are signalled too.
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        cwd: Path | str | None = None,
        new_session: bool = False,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = Path(log_path)
        self.new_session = new_session
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(
                self.cmd,
                env=dict(env),
                cwd=None if cwd is None else str(cwd),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
        self.pid = self.popen.pid
        self.started_at = time.monotonic()

    @property
    def returncode(self) -> int | None:
        """Exit status once it ended (negative: killed by that signal), else None."""
        return self.popen.poll()

    def alive(self) -> bool:
        """True while the process has not been reaped (a stopped process is alive)."""
        return self.popen.poll() is None

    def log(self) -> str:
        """Everything the process wrote so far (stdout and stderr, decoded leniently)."""
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def status(self) -> str | None:
        """psutil's process status (``"stopped"``, ``"running"``, ``"sleeping"``, ...), or
        None once the process has ended."""
        if self.popen.poll() is not None:
            return None
        try:
            return str(psutil.Process(self.pid).status())
        except psutil.NoSuchProcess:
            return None

    def signal(self, signum: int) -> None:
        """Send ``signum`` (to the process group with ``new_session``); a no-op once the
        process was reaped, so a recycled pid is never hit."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.new_session:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    def wait(self, timeout_s: float = 20.0) -> int:
        """Wait for the process to end; return its exit status.

        Raises:
            ConditionTimeout: still running after ``timeout_s`` seconds.
        """
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConditionTimeout(
                f"{self.name} (pid {self.pid}) still running after {timeout_s} s"
            ) from None

    def kill(self, timeout_s: float = 30.0) -> int:
        """SIGKILL (after SIGCONT, harmless) and reap; return the exit status."""
        self.signal(signal.SIGKILL)
        return self.wait(timeout_s)

    def pause(self, timeout_s: float = 20.0) -> None:
        """SIGSTOP, then wait until the kernel reports the process stopped.

        Raises:
            ConditionTimeout: not stopped within ``timeout_s`` seconds.
        """
        self.signal(signal.SIGSTOP)
        self.wait_stopped(timeout_s)

    def resume(self) -> None:
        """SIGCONT."""
        self.signal(signal.SIGCONT)

    def wait_stopped(self, timeout_s: float = 20.0) -> None:
        """Wait until the process is stopped (by SIGSTOP from anyone, itself included).

        Raises:
            ConditionTimeout: not stopped within ``timeout_s`` seconds.
        """
        wait_for(
            f"{self.name} (pid {self.pid}) to be stopped",
            lambda: self.status() == psutil.STATUS_STOPPED,
            timeout_s,
            0.02,
        )

    def stop(self, timeout_s: float = 15.0) -> int:
        """Graceful stop: SIGCONT, SIGTERM, wait; SIGKILL if it hangs.

        Returns:
            The exit status.

        Raises:
            ConditionTimeout: it ignored SIGTERM for ``timeout_s`` seconds (it is killed).
        """
        if self.popen.poll() is not None:
            return self.popen.returncode
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ConditionTimeout(f"{self.name} ignored SIGTERM for {timeout_s} s") from None

    def describe(self) -> str:
        """A header line and the whole log, for a failure report."""
        return (
            f"===== {self.name} pid={self.pid} rc={self.returncode} cmd={' '.join(self.cmd)}\n"
            f"{self.log()}"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.pid} rc={self.returncode}>"


class WorkerProcess(ManagedProcess):
    """A ``ratchet worker`` subprocess (see :meth:`ProcessGroup.worker`)."""

    def holder(self, timeout_s: float = 20.0) -> str:
        """The worker's lease-holder name (``host:pid:random``), from its start-up log line.

        The line is logged after the worker installed its signal handlers, so once this
        returns a SIGTERM is a graceful stop, never a crash.

        Raises:
            ConditionTimeout: no start-up line within ``timeout_s`` seconds (or the process
                exited first; its log is in the message).
        """

        def probe() -> str | None:
            m = _HOLDER_LINE.search(self.log())
            if m:
                return m.group(1)
            if self.popen.poll() is not None:
                raise ConditionTimeout(
                    f"{self.name} exited with status {self.popen.returncode} before its "
                    f"start-up line; its log:\n{self.log()[-3000:]}"
                )
            return None

        return wait_for(f"{self.name} to log its start-up line", probe, timeout_s)

    def started(self) -> bool:
        """True once the start-up line is in the log (the worker is claiming)."""
        return _HOLDER_LINE.search(self.log()) is not None

    def stop(self, timeout_s: float = 35.0) -> int:
        """Graceful stop (SIGCONT, SIGTERM, wait; SIGKILL if it hangs). The default wait
        covers the worker's default ``--shutdown-grace-s`` (25 s) and its exit.

        A worker that has not logged its start-up line yet is first given time to install
        its SIGTERM handler, so a stop is never mistaken for a crash.

        Raises:
            ConditionTimeout: no start-up line, or SIGTERM ignored for ``timeout_s`` seconds.
        """
        if self.popen.poll() is None:
            self.signal(signal.SIGCONT)
            self.holder()
        return super().stop(timeout_s)


class ProcessGroup:
    """Every subprocess of one test or demo run; :meth:`cleanup` kills what is left.

    Args:
        directory: where log files go (``NN-name.log``).
        env: variables every process gets on top of :func:`clean_env`.
        pythonpath: directories put in front of ``PYTHONPATH`` (where the app module is).
        cwd: working directory of every process (default ``directory``).
        drop_prefixes: inherited variables with these prefixes are dropped.

    Use as a context manager, or call :meth:`cleanup` in a ``finally``.
    """

    def __init__(
        self,
        directory: Path | str,
        *,
        env: Mapping[str, str | None] | None = None,
        pythonpath: Iterable[str | Path] = (),
        cwd: Path | str | None = None,
        drop_prefixes: Sequence[str] = ("RATCHET_",),
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.env: dict[str, str | None] = dict(env or {})
        self.pythonpath = [str(p) for p in pythonpath]
        self.cwd = Path(cwd) if cwd is not None else self.directory
        self.drop_prefixes = tuple(drop_prefixes)
        self.procs: list[ManagedProcess] = []
        self._n = 0

    def environment(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment a process of this group gets (``extra`` last)."""
        return clean_env(
            {**self.env, **(extra or {})},
            drop_prefixes=self.drop_prefixes,
            pythonpath=self.pythonpath,
        )

    def _log_path(self, name: str) -> Path:
        self._n += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        return self.directory / f"{self._n:02d}-{safe}.log"

    def spawn(
        self,
        name: str,
        cmd: Sequence[str],
        env: Mapping[str, str | None] | None = None,
        *,
        new_session: bool = False,
    ) -> ManagedProcess:
        """Start any command as a member of the group."""
        proc = ManagedProcess(
            name,
            cmd,
            self.environment(env),
            self._log_path(name),
            cwd=self.cwd,
            new_session=new_session,
        )
        self.procs.append(proc)
        return proc

    def python(
        self, name: str, code: str, *args: str, env: Mapping[str, str | None] | None = None
    ) -> ManagedProcess:
        """Run ``python -c code args...`` (this interpreter) as a member of the group."""
        return self.spawn(name, [sys.executable, "-c", code, *args], env)

    def worker(
        self,
        app: str,
        ledger_url: str,
        *,
        name: str = "worker",
        concurrency: int = 1,
        poll_interval_s: float | None = 0.05,
        log_level: str = "INFO",
        fast_takeover: bool | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str | None] | None = None,
        new_session: bool = False,
    ) -> WorkerProcess:
        """Start ``python -m ratchet.cli.main worker APP --ledger URL ...``.

        Args:
            app: ``module:attribute`` of the App (its module importable via ``pythonpath``).
            ledger_url: the ledger (also exported as ``RATCHET_LEDGER_URL``).
            name: for messages and the log file.
            concurrency: task threads.
            poll_interval_s: claim poll interval, seconds (None: the CLI's default).
            log_level: ``DEBUG``, ``INFO`` (needed for :meth:`WorkerProcess.holder`), ...
            fast_takeover: ``--fast-takeover`` / ``--no-fast-takeover`` (None: default).
            args: more CLI arguments.
            env: more environment variables (``None`` values: unset).
            new_session: run in its own process group (signals reach its children too).
        """
        cmd = [
            sys.executable, "-m", "ratchet.cli.main", "worker", app,
            "--concurrency", str(concurrency), "--ledger", ledger_url,
            "--log-level", log_level,
        ]  # fmt: skip
        if poll_interval_s is not None:
            cmd += ["--poll-interval-s", repr(float(poll_interval_s))]
        if fast_takeover is not None:
            cmd.append("--fast-takeover" if fast_takeover else "--no-fast-takeover")
        cmd += list(args)
        proc = WorkerProcess(
            name,
            cmd,
            self.environment({"RATCHET_LEDGER_URL": ledger_url, **(env or {})}),
            self._log_path(name),
            cwd=self.cwd,
            new_session=new_session,
        )
        self.procs.append(proc)
        return proc

    def workers(self) -> list[WorkerProcess]:
        """The worker processes started so far (ended ones included)."""
        return [p for p in self.procs if isinstance(p, WorkerProcess)]

    def dump(self) -> str:
        """Every process's header and log, for a failure report."""
        return "\n".join(p.describe() for p in self.procs)

    def cleanup(self) -> None:
        """SIGCONT + SIGKILL every process still running, and reap it."""
        for proc in self.procs:
            if proc.alive():
                proc.signal(signal.SIGCONT)
                with contextlib.suppress(ConditionTimeout):
                    proc.kill()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
