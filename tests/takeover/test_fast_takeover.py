"""Fast takeover of a dead holder (DESIGN: worker registry), on both ledgers.

A worker on the same host that sees a registered holder's process gone revokes its leases
(generation + 1), so the tasks run again at once instead of after the lease (60 s here).
Holders of another host are never judged; a stopped (SIGSTOP) process is not dead; a
revoked holder that was alive is fenced.

Real ``ratchet worker`` processes (``ratchet.testing.ProcessGroup``), real SIGKILL and
SIGSTOP; every wait is on a condition with a deadline (``ratchet.testing.wait_for``).
Executions are counted outside the ledger, in the file the task appends to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from takeover_app import app as template

from ratchet import App, State, TaskInfo, open_ledger
from ratchet.config import parse_ledger_url
from ratchet.ledger.base import Ledger, TaskWrite, Transition, WorkerInfo
from ratchet.testing import (
    ProcessGroup,
    WorkerProcess,
    check_ledger_consistent,
    pause_outside_write_lock,
    wait_for,
)
from ratchet.worker.registry import (
    Registrar,
    host_identity,
    process_gone,
    process_start_time,
)

HERE = Path(__file__).resolve().parent
LEASE_S = 60.0
"""The task's lease: a rerun sooner than this comes from revocation, not expiry."""
DEADLINE_S = 45.0
"""Generous deadline for waits on a loaded machine (well under the lease)."""


class Rig:
    """Worker processes, the execution log and the gate file of one test."""

    def __init__(self, directory: Path, ledger_url: str) -> None:
        self.ledger_url = ledger_url
        self.log = directory / "executions.jsonl"
        self.gate = directory / "gate"
        self.group = ProcessGroup(
            directory / "procs",
            pythonpath=[HERE],
            cwd=HERE,
            env={
                "TAKEOVER_LOG": str(self.log),
                "TAKEOVER_GATE": str(self.gate),
                "TAKEOVER_LEASE_S": str(LEASE_S),
            },
        )

    def worker(self, name: str) -> WorkerProcess:
        """A started ``ratchet worker`` (its start-up line seen: it is claiming)."""
        proc = self.group.worker("takeover_app:app", self.ledger_url, name=name, concurrency=2)
        proc.holder(DEADLINE_S)
        return proc

    def freeze(self, proc: WorkerProcess) -> None:
        """SIGSTOP ``proc`` outside a SQLite write transaction (frozen inside one, it would
        hold the single write lock and stall every other writer: a SQLite mechanic, not
        what these tests are about; PostgreSQL locks rows). Paused while the test holds
        the write lock.
        """
        config = parse_ledger_url(self.ledger_url)
        if config.scheme != "sqlite":
            proc.pause()
            return
        # Paused while this test holds the write lock: the worker cannot be inside a
        # write transaction then (retrying pause-and-probe failed on a loaded machine,
        # where a resumed worker barely runs before the next try).
        pause_outside_write_lock(config.path, proc.pause)

    def runs(self) -> list[dict[str, int]]:
        """Executions so far, in order: ``{"task", "pid", "generation", "attempt"}``."""
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x.strip()]


@pytest.fixture
def app(ledger_url: str) -> Iterator[App]:
    """An App on this test's ledger with the takeover app's tasks (for submit / get)."""
    opened = App(ledger=ledger_url)
    opened.tasks.update(template.tasks)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ledger_url: str) -> Iterator[Rig]:
    """The test's worker processes; their logs are printed when the test fails."""
    made = Rig(tmp_path, ledger_url)
    try:
        yield made
    finally:
        made.group.cleanup()
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(made.group.dump())


def _state(app: App, task_id: str, state: State) -> TaskInfo | None:
    info = app.get(task_id)
    return info if info.state is state else None


def test_killed_holder_is_revoked_and_its_task_runs_again_before_its_lease_ends(
    app: App, rig: Rig, ledger_url: str
) -> None:
    """SIGKILL the worker holding a task: the other worker on the host sees the process gone,
    revokes its lease (one audited ``revoke``, generation + 1) and runs the task again long
    before the 60 s lease would have expired — two executions in all, counted outside."""
    first_worker, second_worker = rig.worker("w1"), rig.worker("w2")
    handle = app.submit("takeover.hold", {"n": 7})
    first = wait_for("the first execution", lambda: rig.runs()[:1], DEADLINE_S)[0]
    killed = first_worker if first_worker.pid == first["pid"] else second_worker
    other = second_worker if killed is first_worker else first_worker
    held = app.get(handle.task_id)
    assert held.state is State.RUNNING and held.lease_until is not None
    killed.kill()

    info = wait_for("the task to succeed on the other worker",
                    lambda: _state(app, handle.task_id, State.SUCCEEDED), DEADLINE_S)
    # Exactly two executions, counted outside the ledger: the killed one and the rerun.
    assert [r["pid"] for r in rig.runs()] == [killed.pid, other.pid]
    assert info.result == {"n": 7, "pid": other.pid}
    events = app.ledger.timeline(handle.task_id).events
    revokes = [e for e in events if e.kind == "revoke"]
    assert len(revokes) == 1
    assert revokes[0].detail["previous_generation"] == first["generation"]
    # The rerun was claimed by the ledger's clock before the killed holder's lease ended:
    # revocation, not expiry (which the claim audit would show as a "takeover").
    rerun = [e for e in events if e.kind in ("claim", "takeover")][-1]
    assert rerun.kind == "claim" and rerun.generation == first["generation"] + 2
    assert rerun.at < held.lease_until
    assert app.ledger.stats().revocations == 1
    check_ledger_consistent(ledger_url)


def test_stopped_worker_is_not_revoked_and_a_killed_one_is(
    app: App, rig: Rig, ledger_url: str
) -> None:
    """A worker frozen with SIGSTOP while it holds a task is alive: the judge on the host
    revokes nothing and the lease stays with it. Once SIGKILLed it is gone: the judge
    revokes it and the task is ready again at the next generation."""
    worker = rig.worker("w1")
    holder = worker.holder()
    handle = app.submit("takeover.hold", {"n": 1})
    wait_for("the first execution", rig.runs, DEADLINE_S)
    rig.freeze(worker)
    judge = Registrar(app.ledger, "judge")
    assert judge.scan_once() == {}
    held = app.get(handle.task_id)
    assert (held.state, held.holder, held.generation) == (State.RUNNING, holder, 1)
    assert [w.holder for w in app.ledger.list_workers(host_identity())] == [holder]

    worker.kill()
    assert judge.scan_once() == {holder: [handle.task_id]}
    info = app.get(handle.task_id)
    assert (info.state, info.holder, info.generation) == (State.RETRY_WAIT, None, 2)
    assert app.ledger.list_workers(host_identity()) == []
    check_ledger_consistent(ledger_url)


def test_frozen_holder_revoked_by_an_operator_is_fenced_when_it_resumes(
    app: App, rig: Rig, ledger_url: str
) -> None:
    """An operator revokes a holder that is only frozen (SIGSTOP). Another worker runs the
    task to the end; when the frozen worker resumes and finishes its own run, nothing it
    writes reaches the ledger: the result, the steps and the generation stay the second
    worker's."""
    frozen = rig.worker("frozen")
    frozen_holder = frozen.holder()
    handle = app.submit("takeover.hold", {"n": 3})
    wait_for("the first execution", rig.runs, DEADLINE_S)
    rig.freeze(frozen)
    assert app.ledger.revoke_holder(frozen_holder, by="operator", reason="test") == [
        handle.task_id
    ]

    rescuer = rig.worker("rescuer")
    done = wait_for("the task to succeed on the second worker",
                    lambda: _state(app, handle.task_id, State.SUCCEEDED), DEADLINE_S)
    assert done.result == {"n": 3, "pid": rescuer.pid}
    rescuer.stop()
    timeline = app.ledger.timeline(handle.task_id)

    rig.gate.touch()  # the frozen run may go on past its gate and write a step
    frozen.resume()
    frozen.stop()
    after = app.ledger.timeline(handle.task_id)
    assert after.task == timeline.task
    assert after.steps == timeline.steps == []
    assert [r["pid"] for r in rig.runs()] == [frozen.pid, rescuer.pid]
    stale = [e for e in after.events if e.kind == "stale_rejected"]
    assert all(e.holder == frozen_holder and e.generation == 1 for e in stale)
    check_ledger_consistent(ledger_url)


def test_registrar_does_not_revoke_a_stopped_process(ledger_url: str, tmp_path: Path) -> None:
    """SIGSTOP is not death: nobody on the host may revoke a paused holder (its lease still
    protects it; only expiry by the ledger clock ends it)."""
    ledger = open_ledger(ledger_url)
    with ProcessGroup(tmp_path) as group:
        child = group.python("paused", "import time; time.sleep(120)")
        child.pause()
        try:
            ledger.register_worker(WorkerInfo("paused", host_identity(), "h", child.pid,
                                              process_start_time(child.pid)))
            assert Registrar(ledger, "judge").scan_once() == {}
            assert [w.holder for w in ledger.list_workers(host_identity())] == ["paused"]
        finally:
            ledger.close()


def test_registrar_judges_only_its_own_host_and_detects_pid_reuse(
    ledger_url: str, tmp_path: Path
) -> None:
    ledger = open_ledger(ledger_url)
    try:
        here = host_identity()
        with ProcessGroup(tmp_path) as group:
            gone = group.python("gone", "pass")
            gone.wait()
        me = os.getpid()
        ledger.register_worker(WorkerInfo("other-host-dead", "elsewhere/boot/ns", "x",
                                          gone.pid, None))
        ledger.register_worker(WorkerInfo("same-host-dead", here, "h", gone.pid, None))
        ledger.register_worker(WorkerInfo("same-host-alive", here, "h", me,
                                          process_start_time(me)))
        ledger.register_worker(WorkerInfo("recycled-pid", here, "h", me, "1"))
        revoked = Registrar(ledger, "judge").scan_once()
        assert sorted(revoked) == ["recycled-pid", "same-host-dead"]
        alive = {w.holder for w in ledger.list_workers(None) if w.state == "alive"}
        assert alive == {"other-host-dead", "same-host-alive"}
    finally:
        ledger.close()


def test_revoked_holder_that_was_alive_is_fenced(app: App) -> None:
    handle = app.submit("takeover.hold", {"n": 1})
    ledger: Ledger = app.ledger
    claim = ledger.claim("alive-but-revoked", ["takeover.hold"], 1)[0]
    assert ledger.revoke_holder("alive-but-revoked", by="op", reason="test") == [handle.task_id]
    late = ledger.commit([TaskWrite(handle.task_id, claim.generation, "alive-but-revoked",
                                    "complete", steps=[("s", "1")],
                                    transition=Transition(State.SUCCEEDED, result_json="1"))])
    assert late[0].stale and not late[0].ok
    info = app.get(handle.task_id)
    assert info.state is State.RETRY_WAIT
    assert info.generation == claim.generation + 1
    assert ledger.timeline(handle.task_id).steps == []
    assert ledger.stats().stale_rejections == 1


def test_process_gone_basics(tmp_path: Path) -> None:
    assert not process_gone(os.getpid(), process_start_time(os.getpid()))
    assert process_gone(os.getpid(), "not-my-start-time")
    with ProcessGroup(tmp_path) as group:
        child = group.python("gone", "pass")
        child.wait()
    assert process_gone(child.pid, None)


def test_cli_workers_lists_the_registry(ledger_url: str) -> None:
    from typer.testing import CliRunner

    from ratchet.cli.main import cli

    ledger = open_ledger(ledger_url)
    try:
        ledger.register_worker(WorkerInfo("w-cli", host_identity(), "h1", 4242, None))
        result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url, "--json"])
        assert result.exit_code == 0, result.output
        listed = json.loads(result.output)
        assert [(w["holder"], w["pid"], w["state"]) for w in listed] == [("w-cli", 4242, "alive")]
        ledger.revoke_holder("w-cli", by="op", reason="test")
        result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url, "--json"])
        assert json.loads(result.output)[0]["state"] == "dead"
        status = CliRunner().invoke(cli, ["status", "--ledger", ledger_url, "--json"])
        assert json.loads(status.output)["revocations"] == 0  # no task was held
    finally:
        ledger.close()


def test_reregistering_a_holder_name_updates_its_process(
    ledger_url: str, tmp_path: Path
) -> None:
    """A restarted worker reusing its holder name (e.g. ``pod-0``) must not be judged by
    the dead predecessor's pid."""
    ledger = open_ledger(ledger_url)
    try:
        with ProcessGroup(tmp_path) as group:
            gone = group.python("gone", "pass")
            gone.wait()
        ledger.register_worker(WorkerInfo("pod-0", host_identity(), "h", gone.pid, None))
        me = os.getpid()
        ledger.register_worker(WorkerInfo("pod-0", host_identity(), "h", me,
                                          process_start_time(me)))
        [entry] = ledger.list_workers(host_identity())
        assert (entry.pid, entry.pid_start) == (me, process_start_time(me))
        assert Registrar(ledger, "judge").scan_once() == {}
    finally:
        ledger.close()
