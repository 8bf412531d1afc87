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
* :func:`install_signal_handler`: the worker's graceful SIGTERM/SIGINT handlers are put
  back to what they were before (SIGTERM: default, SIGINT: ``KeyboardInterrupt``) in a
  child forked from the worker (``os.register_at_fork``), so that a plain ``kill`` ends
  that child as it ends any process (the worker's handler would only start a shutdown of
  threads the child does not have).
* :class:`Descendants`: the processes that appeared below the worker process while it ran
  (forked children, ``subprocess.Popen`` never waited for, their children), which the
  worker stops when it exits (``ratchet worker`` always; ``Worker(stop_descendants=True)``
  in process): SIGTERM, then SIGKILL for those still alive after
  :data:`DESCENDANT_GRACE_S`; each is logged. The list is taken again and again until
  none is left, so a process started during the grace (a shell trapping SIGTERM to start
  one more) is stopped too. On Linux the worker is made a *child subreaper*
  (``prctl(PR_SET_CHILD_SUBREAPER)``): a process whose parent exits (a double fork, a
  shell's ``cmd &``) is reparented to the worker instead of init, so it stays below the
  worker and is found; the worker reaps (``waitpid``) those it stopped. Elsewhere such an
  orphan is reparented to init and escapes. A worker killed with SIGKILL stops nothing.
* Adopted orphans that end while the worker runs are reaped every :data:`REAP_EVERY_S`
  seconds (a thread; Linux, when :meth:`Descendants` was made on the main thread). Only
  those: a zombie child a task thread started may be one its ``Popen`` is about to
  ``wait()`` for, and its exit status must not be taken from it. Linux lists a child
  under the thread that created it (``/proc/self/task/<tid>/children``) and an adopted
  orphan under the main thread (the first live thread of the process). The main thread
  runs the worker's loop and starts no process, so a zombie listed under it is an adopted
  orphan (or the child of a task thread that has exited, which nothing waits for any
  more): it is reaped. Limit: a child the main thread started itself (a ``worker_start``
  hook, or the application's main thread when the worker runs on another thread: then
  nothing is reaped while it runs) must not be waited for by task code; a zombie of a
  task thread that is still alive is reaped only when the worker exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

import psutil

from ..errors import ContextUsedInAnotherProcess

__all__ = [
    "DESCENDANT_GRACE_S",
    "DESCENDANT_KILL_S",
    "REAP_EVERY_S",
    "Descendants",
    "check_process",
    "exit_forked_child",
    "install_signal_handler",
    "set_child_subreaper",
]

log = logging.getLogger("ratchet.worker")

DESCENDANT_GRACE_S = 3.0
"""Seconds the processes left by task code get between SIGTERM and SIGKILL when the worker
exits (the tasks' own shutdown grace has already run by then)."""

DESCENDANT_KILL_S = 5.0
"""Seconds the worker goes on listing and SIGKILLing the processes left by task code, once
their grace ended, until none is left (a process can still start one before its SIGKILL)."""

REAP_EVERY_S = 2.0
"""Seconds between two reaps of the adopted orphans that ended while the worker runs
(one small ``/proc`` read each time)."""

_SCAN_S = 0.05  # seconds between two listings of the descendants while they stop

_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
_PR_GET_CHILD_SUBREAPER = 37

SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

# signum -> (the handler before the worker's, the worker's)
_worker_handlers: dict[int, tuple[SignalHandler, SignalHandler]] = {}


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


def install_signal_handler(signum: int, handler: Callable[[int, FrameType | None], Any]
                           ) -> None:
    """``signal.signal(signum, handler)`` for the worker (main thread only), remembering
    the handler it replaces: in a child forked from this process that one is put back
    (see :func:`_restore_signals_in_child`). Raises ``ValueError`` off the main thread."""
    previous = signal.signal(signum, handler)
    if signum in _worker_handlers:  # a second worker in this process: keep the first one
        previous = _worker_handlers[signum][0]
    _worker_handlers[signum] = (previous, handler)


def _restore_signals_in_child() -> None:
    """In a child just forked: each signal still handled by the worker's handler gets back
    the one it replaced (SIG_DFL if that was not set from Python): a copy of the worker is
    a plain process."""
    for signum, (previous, installed) in _worker_handlers.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(signum) == installed:
                signal.signal(signum, signal.SIG_DFL if previous is None else previous)


os.register_at_fork(after_in_child=_restore_signals_in_child)


def set_child_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (``on``) or not: on Linux,
    ``prctl(PR_SET_CHILD_SUBREAPER)``, so that a process below this one whose parent exits
    is reparented to this process instead of init (and this process reaps it).

    Returns:
        The setting before the call, or None where it is not supported (not Linux, or
        the call failed: logged), and nothing changed.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("could not make the worker a child subreaper (%s): a process left by "
                    "task code whose parent exits is reparented to init, not stopped", exc)
        return None
    return bool(was.value)


class Descendants:
    """The processes started below this one after the instance was made.

    Processes are known by pid and start time (a pid reused by an unrelated process later
    is not mistaken for one seen at the start).

    Args:
        subreaper: make this process a child subreaper until :meth:`stop` (Linux; see
            :func:`set_child_subreaper`), so that orphans stay below it; made on the main
            thread, also reap the adopted orphans that end, every :data:`REAP_EVERY_S`
            seconds until :meth:`stop` (:meth:`reap_adopted`).
    """

    def __init__(self, subreaper: bool = False) -> None:
        self._me = psutil.Process()
        self._before = {self._key(p) for p in self._below()}
        self._subreaper_was = set_child_subreaper(True) if subreaper else None
        self._reaping = threading.Event()
        self._reaper: threading.Thread | None = None
        if (self._subreaper_was is not None
                and threading.current_thread() is threading.main_thread()
                and _main_thread_children() is not None):
            self._reaper = threading.Thread(target=self._reap_every, name="ratchet-reaper",
                                            daemon=True)
            self._reaper.start()

    def _reap_every(self) -> None:
        while not self._reaping.wait(REAP_EVERY_S):
            try:
                self.reap_adopted()
            except Exception:  # never let the reaper die: log and go on
                log.exception("reaping the orphans adopted by the worker")

    def reap_adopted(self) -> list[int]:
        """``waitpid`` (WNOHANG) the zombie children listed under the main thread that
        were not there when this instance was made: adopted orphans that ended (see the
        module docstring for why only those). Returns the pids reaped."""
        reaped = []
        for pid in _main_thread_children() or []:
            with contextlib.suppress(psutil.Error, ChildProcessError):
                process = psutil.Process(pid)
                if (process.status() == psutil.STATUS_ZOMBIE
                        and self._key(process) not in self._before
                        and os.waitpid(pid, os.WNOHANG)[0] == pid):
                    reaped.append(pid)
        return reaped

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
        """SIGTERM every new descendant, listing them again every few milliseconds (those
        that appear meanwhile get SIGTERM too) until none is alive or ``grace_s`` seconds
        passed; then SIGKILL those alive, listing again until none is left (at most
        :data:`DESCENDANT_KILL_S` seconds). New zombie children are reaped throughout.
        Each is logged. Ends the subreaper setting taken by the constructor.

        Returns:
            The pids signalled, in the order found.
        """
        signalled: dict[tuple[int, float], psutil.Process] = {}
        self._reaping.set()
        if self._reaper is not None and self._reaper is not threading.current_thread():
            self._reaper.join(timeout=5)
        try:
            self._signal_all(signalled, grace_s, kill=False)
            self._signal_all(signalled, DESCENDANT_KILL_S, kill=True)
            self._reap()  # the last ones killed
        finally:
            if self._subreaper_was is not None:
                set_child_subreaper(self._subreaper_was)
                self._subreaper_was = None
        return [p.pid for p in signalled.values()]

    def _signal_all(self, signalled: dict[tuple[int, float], psutil.Process],
                    for_s: float, kill: bool) -> None:
        """Until no new descendant is alive or ``for_s`` seconds passed: list them, reap
        the zombie children, signal those not signalled yet in this phase (SIGKILL:
        each time found). Adds to ``signalled``."""
        deadline = time.monotonic() + for_s
        first = not signalled
        done: set[tuple[int, float]] = set() if kill else set(signalled)
        while True:
            self._reap()
            alive = self.new()
            if not alive:
                return
            fresh = [p for p in alive if self._key(p) not in done]
            if fresh:
                self._log(fresh, kill, first, for_s)
                first = False
            for process in fresh if not kill else alive:  # SIGKILL again: a stopped one
                key = self._key(process)
                signalled.setdefault(key, process)
                done.add(key)
                with contextlib.suppress(psutil.Error):
                    if kill:
                        process.kill()
                    else:
                        process.terminate()
            if time.monotonic() >= deadline:
                if kill:
                    log.error("%d process(es) left by task code still alive after %g s of "
                              "SIGKILL: %s", len(alive), for_s,
                              ", ".join(str(p.pid) for p in alive))
                return
            time.sleep(_SCAN_S)

    @staticmethod
    def _log(found: list[psutil.Process], kill: bool, first: bool, for_s: float) -> None:
        names = ", ".join(f"{p.pid} ({_describe(p)})" for p in found)
        if kill:
            log.warning("killing %d process(es) left by task code still alive after "
                        "SIGTERM: %s", len(found), names)
        elif first:
            log.warning("stopping %d process(es) left by task code (SIGTERM, SIGKILL after "
                        "%g s): %s", len(found), for_s, names)
        else:
            log.warning("stopping %d more process(es) left by task code, started since: %s",
                        len(found), names)

    def _reap(self) -> None:
        """``waitpid`` the zombie children of this process that are new (ours to reap:
        task code is done with them, or they are orphans this subreaper adopted)."""
        try:
            children = self._me.children()
        except psutil.Error:
            return
        for process in children:
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if (self._key(process) not in self._before
                        and process.status() == psutil.STATUS_ZOMBIE):
                    os.waitpid(process.pid, os.WNOHANG)


def _main_thread_children() -> list[int] | None:
    """The pids Linux lists under this process's main thread
    (``/proc/self/task/<pid>/children``: the children it created and the orphans adopted),
    or None where that file is not there (not Linux, kernel without it)."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        return None


def _describe(process: psutil.Process) -> str:
    """``python -c ...``: the command line, short, for the log."""
    try:
        cmdline = " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        return "?"
    return cmdline if len(cmdline) <= 80 else cmdline[:77] + "..."
