"""Task code that starts processes (DESIGN §2): forked children and leftover descendants.

A worker is threads around one interpreter: a writer, a heartbeat, a watchdog, task
threads, their locks and ledger connections. ``os.fork()`` in a task body copies only the
calling thread, so in the child the context's calls would wait for threads that do not
exist (or on locks held at the fork by threads that are gone), for ever. Two things here:

* :func:`check_process`: the context (and the writer) remember the pid that owns them and
  refuse at once, with :class:`~ratchet.errors.ContextUsedInAnotherProcess`, any use from
  another pid (one ``os.getpid()`` per checkpoint, before any lock is taken).
  :func:`exit_forked_child`: a child whose task function returns or raises into the
  worker's code leaves with ``os._exit`` (0, its ``SystemExit`` code, or 1 after printing
  the traceback) instead of running the worker's machinery as a copy of it.
* :class:`Descendants`: the processes that appeared below the worker process while it ran
  (forked children, ``subprocess.Popen`` never waited for, their children), which the
  worker stops when it exits (``ratchet worker`` always; ``Worker(stop_descendants=True)``
  in process): SIGTERM, then SIGKILL for those still alive after
  :data:`DESCENDANT_GRACE_S`; each is logged. Limits: a descendant that detached itself
  (double fork, ``setsid`` + reparenting to init) is no longer below the worker and is not
  found; a worker killed with SIGKILL stops nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from typing import NoReturn

import psutil

from ..errors import ContextUsedInAnotherProcess

__all__ = ["DESCENDANT_GRACE_S", "Descendants", "check_process", "exit_forked_child"]

log = logging.getLogger("ratchet.worker")

DESCENDANT_GRACE_S = 3.0
"""Seconds the processes left by task code get between SIGTERM and SIGKILL when the worker
exits (the tasks' own shutdown grace has already run by then)."""


def check_process(owner_pid: int, what: str) -> None:
    """Return if this is process ``owner_pid``; else raise.

    Raises:
        ContextUsedInAnotherProcess: called in another process (a child forked by task
            code), naming ``what`` and both pids.
    """
    pid = os.getpid()
    if pid != owner_pid:
        raise ContextUsedInAnotherProcess(what, owner_pid, pid)


def exit_forked_child(task_id: str, exc: BaseException | None) -> NoReturn:
    """End a process forked by task code whose task function came back into the worker's
    code (``exc``: what it raised, None if it returned): ``os._exit`` with status 0 for a
    return, the code of a ``SystemExit``, else 1 after printing the traceback to stderr.
    Nothing of the worker (its writes, hooks, threads) runs in the child."""
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    elif exc is not None:
        code = 1
        print(f"process {os.getpid()} forked by task {task_id}: its task function raised "
              f"(exiting; the worker process records the attempt):", file=sys.stderr)
        traceback.print_exception(exc, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class Descendants:
    """The processes started below this one after the instance was made.

    Processes are known by pid and start time (a pid reused by an unrelated process later
    is not mistaken for one seen at the start).
    """

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._before = {self._key(p) for p in self._below()}

    def _below(self) -> list[psutil.Process]:
        try:
            return self._me.children(recursive=True)
        except psutil.Error:
            return []

    @staticmethod
    def _key(process: psutil.Process) -> tuple[int, float]:
        try:
            return process.pid, process.create_time()
        except psutil.Error:
            return process.pid, 0.0

    def new(self) -> list[psutil.Process]:
        """The descendants alive now that were not there when this instance was made
        (zombies excepted: they have ended)."""
        out = []
        for process in self._below():
            if self._key(process) in self._before:
                continue
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            out.append(process)
        return out

    def stop(self, grace_s: float = DESCENDANT_GRACE_S) -> list[int]:
        """SIGTERM every new descendant, SIGKILL those still alive ``grace_s`` seconds
        later, reap the direct children; log each. Returns the pids signalled."""
        found = self.new()
        if not found:
            return []
        names = ", ".join(f"{p.pid} ({_describe(p)})" for p in found)
        log.warning("stopping %d process(es) left by task code (SIGTERM, SIGKILL after "
                    "%g s): %s", len(found), grace_s, names)
        for process in found:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, alive = psutil.wait_procs(found, timeout=grace_s)
        if alive:
            log.warning("killing %d process(es) left by task code still alive after "
                        "SIGTERM: %s", len(alive), ", ".join(str(p.pid) for p in alive))
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(alive, timeout=grace_s)
        return [p.pid for p in found]


def _describe(process: psutil.Process) -> str:
    """``python -c ...``: the command line, short, for the log."""
    try:
        cmdline = " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return "?"
    return cmdline if len(cmdline) <= 80 else cmdline[:77] + "..."
