"""Task code that forks, with real ``ratchet worker`` processes (DESIGN §2; both ledgers).

A child forked by a task body has none of the worker's threads: its use of the task
context (``ctx.effect``, ``ctx.step``) fails at once with ``ContextUsedInAnotherProcess``
instead of waiting for ever, a child that returns into the worker's code exits there, and
the parent's attempt goes on and ends normally. Orphans the worker adopted (a shell's
``cmd &``) are reaped while it runs; a task's own child keeps its exit status for it.
Processes left by task code (a forked child sleeping for ever, its own child, one that
ignores SIGTERM, one started during the grace, a double-forked orphan) do not outlive the
worker: it stops them when it exits, after a SIGTERM or at ``--max-stuck-threads``.
A forked child ends on a plain SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from ratchet import App, State, TaskContext
from ratchet.testing import ProcessGroup, wait_for
from ratchet.worker.forks import REAP_EVERY_S
from ratchet.worker.runner import EXIT_STUCK_THREADS

pytestmark = pytest.mark.timeout(120)

APP_SOURCE = textwrap.dedent('''
    """Tasks that fork (tests/test_worker_forks.py)."""
    import json
    import os
    import signal
    import subprocess
    import time

    import ratchet
    from ratchet import ContextUsedInAnotherProcess

    OUT = os.environ["FORK_OUT"]
    TIME_LIMIT_S = float(os.environ["FORK_TIME_LIMIT_S"]) if os.environ.get(
        "FORK_TIME_LIMIT_S") else None
    app = ratchet.App()


    def note(name, **fields):
        with open(os.path.join(OUT, name + ".tmp"), "w") as f:
            json.dump(fields, f)
        os.replace(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name))


    def attempt_context(ctx, what):
        t0 = time.monotonic()
        try:
            what()
        except ContextUsedInAnotherProcess as exc:
            return {"error": type(exc).__name__, "text": str(exc),
                    "owner_pid": exc.owner_pid, "pid": exc.pid,
                    "seconds": time.monotonic() - t0}
        return {"error": None}


    @app.task(name="fork.effect")
    def fork_effect(ctx, returns):
        ctx.step("before", lambda: 1)
        pid = os.fork()
        if pid == 0:
            effect = attempt_context(ctx, lambda: ctx.effect("in_child", lambda k: 1,
                                                             key="child-key"))
            step = attempt_context(ctx, lambda: ctx.step("in_child", lambda: 2))
            note("child", effect=effect, step=step, pid=os.getpid(), ppid=os.getppid())
            if returns:
                return "from the child"  # back into the worker's code: it must exit there
            os._exit(7)
        _, status = os.waitpid(pid, 0)
        charged = ctx.effect("in_parent", lambda k: {"key": k}, key="parent-key")
        return {"child_exit": os.waitstatus_to_exitcode(status), "charged": charged,
                "worker_pid": os.getpid()}


    def sleep_for_ever(ignore_term):
        if ignore_term:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)


    @app.task(name="fork.leave", time_limit_s=TIME_LIMIT_S)
    def fork_leave(ctx, hang):
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                sleep_for_ever(ignore_term=False)
            note("child", pid=os.getpid(), grandchild=grandchild)
            sleep_for_ever(ignore_term=True)  # only SIGKILL ends it
        if hang:
            time.sleep(3600)  # past the time limit: the worker stops at max-stuck-threads
        return {"child": child, "worker_pid": os.getpid()}


    @app.task(name="fork.trap")
    def fork_trap(ctx, marker):
        # On SIGTERM the shell starts a grandchild (during the worker's grace) and exits.
        shell = subprocess.Popen(["bash", "-c", f"trap 'sleep {marker} & exit 0' TERM; "
                                  "while true; do sleep 0.1; done"])
        note("child", pid=shell.pid)
        return {"child": shell.pid}


    @app.task(name="fork.double")
    def fork_double(ctx):
        child = os.fork()
        if child == 0:
            if os.fork() == 0:  # the grandchild: its parent exits at once
                note("child", pid=os.getpid())
                sleep_for_ever(ignore_term=False)
            os._exit(0)
        os.waitpid(child, 0)
        return {"child": child}


    @app.task(name="fork.plain")
    def fork_plain(ctx):
        child = os.fork()
        if child == 0:  # a copy of the worker: plain SIGTERM must end it
            note("child", pid=os.getpid())
            sleep_for_ever(ignore_term=False)
        return {"child": child}


    @app.task(name="fork.background")
    def fork_background(ctx, count):
        # A shell's `cmd &`: the shell exits at once, the sleep is orphaned (adopted by the
        # worker) and ends 0.2 s later.
        pids = []
        for _ in range(count):
            done = subprocess.run("sleep 0.2 >/dev/null 2>&1 & echo $!", shell=True,
                                  capture_output=True, text=True, check=True)
            pids.append(int(done.stdout))
        return {"pids": pids, "worker_pid": os.getpid()}


    @app.task(name="fork.wait")
    def fork_wait(ctx, idle_s):
        # The child ends at once and stays a zombie while the task does something else
        # for longer than two reaper rounds: its status is the task's to take.
        child = subprocess.Popen(["sh", "-c", "exit 3"])
        time.sleep(idle_s)
        return {"returncode": child.wait()}
''')


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    return directory


@pytest.fixture
def marker() -> str:
    """A sleep duration no other process uses (``304.x`` seconds): it names the processes
    the ``fork.trap`` task starts, by their command line."""
    return f"304.{secrets.randbelow(10**6):06d}"


def _marked(marker: str) -> list[psutil.Process]:
    """The live processes (zombies aside) whose command line holds ``marker``."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (any(marker in arg for arg in process.cmdline())
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(process)
    return found


@pytest.fixture
def procs(tmp_path: Path, out: Path, marker: str) -> Iterator[ProcessGroup]:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "forkapp.py").write_text(APP_SOURCE)
    group = ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path / "app"],
                         env={"FORK_OUT": str(out)})
    try:
        yield group
    finally:
        # Whatever a failed test left (a child blocked in the context, a sleeper): never
        # let it outlive the test run.
        left = [c for proc in group.procs if proc.alive()
                for c in _children(proc.pid)]
        group.cleanup()
        path = out / "child"
        if path.exists():
            fields = json.loads(path.read_text())
            for pid in (fields.get("pid"), fields.get("grandchild")):
                if isinstance(pid, int) and pid > 0:  # Process(None) would be this one
                    with contextlib.suppress(psutil.Error):
                        left.append(psutil.Process(pid))
        for process in left:
            with contextlib.suppress(psutil.Error):
                if "forkapp:app" in process.cmdline():  # not a recycled pid: one of ours
                    process.kill()
        for process in _marked(marker):
            with contextlib.suppress(psutil.Error):
                process.kill()


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _stubs(app: App) -> None:
    for name in ("fork.effect", "fork.leave", "fork.trap", "fork.double", "fork.plain",
                 "fork.background", "fork.wait"):
        def stub(ctx: TaskContext, **params: Any) -> None:  # runs in the workers only
            raise AssertionError("not run here")

        app.task(name=name)(stub)


def _gone(pid: int) -> bool:
    """True when no process ``pid`` runs (a zombie waiting for init counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("returns", [False, True], ids=["child_exits", "child_returns"])
def test_a_forked_child_using_the_context_fails_at_once_and_the_parent_finishes(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path, returns: bool
) -> None:
    _stubs(app)
    handle = app.submit("fork.effect", {"returns": returns})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(handle.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    child = json.loads((out / "child").read_text())
    worker_pid = info.result["worker_pid"]
    assert worker_pid == worker.pid and child["ppid"] == worker_pid
    for call in ("effect", "step"):
        seen = child[call]
        assert seen["error"] == "ContextUsedInAnotherProcess", child
        assert seen["owner_pid"] == worker_pid and seen["pid"] == child["pid"], child
        assert f"pid {worker_pid}" in seen["text"], seen
        assert seen["seconds"] < 5, seen  # at once: no wait on the worker's threads
    # A child returning into the worker's code exits there (0); else its own status.
    assert info.result["child_exit"] == (0 if returns else 7), info.result
    assert info.result["charged"] == {"key": "parent-key"}
    effects = app.ledger.timeline(handle.task_id).effects
    assert [e.name for e in effects] == ["in_parent"], effects
    assert worker.stop() == 0, worker.log()
    assert "Traceback" not in worker.log(), worker.log()


def _started_children(out: Path) -> tuple[int, int]:
    fields = wait_for("the forked child to start", lambda: (
        json.loads((out / "child").read_text()) if (out / "child").exists() else None), 30)
    return int(fields["pid"]), int(fields["grandchild"])


def test_processes_left_by_a_task_are_stopped_when_the_worker_stops(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path
) -> None:
    _stubs(app)
    handle = app.submit("fork.leave", {"hang": False})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(handle.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    child, grandchild = _started_children(out)
    assert info.result["child"] == child
    assert not _gone(child) and not _gone(grandchild)  # they outlive the task
    assert worker.stop() == 0, worker.log()
    assert _gone(child) and _gone(grandchild), worker.log()
    log = worker.log()
    assert "stopping 2 process(es) left by task code" in log, log
    assert str(child) in log and str(grandchild) in log
    assert "still alive after SIGTERM" in log  # the child ignores SIGTERM: killed


def test_processes_left_by_a_task_are_stopped_at_max_stuck_threads(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path
) -> None:
    _stubs(app)
    app.submit("fork.leave", {"hang": True})
    worker = procs.worker("forkapp:app", ledger_url, env={"FORK_TIME_LIMIT_S": "1"},
                          args=["--max-stuck-threads", "1", "--shutdown-grace-s", "1"])
    child, grandchild = _started_children(out)
    assert worker.wait(timeout_s=60) == EXIT_STUCK_THREADS, worker.log()
    assert _gone(child) and _gone(grandchild), worker.log()
    # Two per attempt: another attempt may start (and hang) in the second the worker
    # waits before it counts its threads stuck (STUCK_CONFIRM_S).
    stopped = re.search(r"stopping (\d+) process\(es\) left by task code", worker.log())
    assert stopped and int(stopped.group(1)) >= 2, worker.log()


linux_only = pytest.mark.skipif(sys.platform != "linux",
                                reason="a child subreaper (prctl) is Linux-only")


@linux_only
def test_a_process_started_during_the_grace_is_stopped_too(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path, marker: str
) -> None:
    # The shell traps the worker's SIGTERM: it starts `sleep <marker>` and exits, so the
    # sleep appears after the worker listed its descendants, and its parent is gone.
    _stubs(app)
    handle = app.submit("fork.trap", {"marker": marker})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(handle.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    shell = info.result["child"]
    assert not _gone(shell)
    assert worker.stop() == 0, worker.log()
    assert _gone(shell), worker.log()
    assert _marked(marker) == [], worker.log()  # the trap's sleep did not escape
    log = worker.log()
    assert f"(sleep {marker})" in log, log  # found after the SIGTERM, logged


@linux_only
def test_a_double_forked_process_is_stopped_when_the_worker_stops(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path
) -> None:
    # fork, fork, the middle one exits: the grandchild is no longer below the worker
    # unless the worker is its subreaper (Linux).
    _stubs(app)
    handle = app.submit("fork.double", {})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(handle.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    grandchild = int(wait_for("the grandchild to start", lambda: (
        json.loads((out / "child").read_text()) if (out / "child").exists() else None),
        30)["pid"])
    assert not _gone(grandchild)
    assert psutil.Process(grandchild).ppid() == worker.pid  # adopted by the worker
    assert worker.stop() == 0, worker.log()
    assert _gone(grandchild), worker.log()
    assert str(grandchild) in worker.log()


def test_a_forked_child_of_a_task_ends_on_a_plain_sigterm(
    app: App, ledger_url: str, procs: ProcessGroup, out: Path
) -> None:
    # The child is a copy of the worker: it must not keep the worker's graceful SIGTERM
    # handler (which would only start a "shutdown" of threads the child does not have).
    _stubs(app)
    handle = app.submit("fork.plain", {})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(handle.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    child = info.result["child"]
    wait_for("the child to start", lambda: (out / "child").exists(), 30)
    psutil.Process(child).terminate()
    wait_for("the child to end on SIGTERM", lambda: _gone(child), 15)
    assert worker.alive()
    assert worker.stop() == 0, worker.log()
    assert "left by task code" not in worker.log()  # nothing left to stop


@linux_only
def test_adopted_orphans_are_reaped_while_the_worker_runs_and_a_tasks_child_is_not(
    app: App, ledger_url: str, procs: ProcessGroup
) -> None:
    # Without reaping, each orphan that ended stays a zombie of a long-running worker (a
    # pid-table entry) until it exits; reaping blindly would take the status of a child a
    # task is about to wait() for.
    _stubs(app)
    waiting = app.submit("fork.wait", {"idle_s": 2.5 * REAP_EVERY_S})
    background = app.submit("fork.background", {"count": 20})
    worker = procs.worker("forkapp:app", ledger_url)
    info = app.wait(background.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    assert info.result["worker_pid"] == worker.pid
    orphans = set(info.result["pids"])
    assert len(orphans) == 20

    def left() -> list[int]:
        return [c.pid for c in _children(worker.pid) if c.pid in orphans]  # zombies too

    wait_for("the ended orphans to be reaped", lambda: not left(), 30)
    assert worker.alive(), worker.log()
    info = app.wait(waiting.task_id, timeout_s=45)
    assert info.state is State.SUCCEEDED, (info, procs.dump())
    assert info.result["returncode"] == 3  # not stolen by the reaper (0 if it had been)
    assert worker.stop() == 0, worker.log()
