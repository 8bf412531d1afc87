"""``ratchet pause`` / ``resume`` (DESIGN §8), on both ledgers: everything, a
task type, one task; versioned, audited records; no new attempt in a paused scope once
the pause returned (enforced in the claim transaction); running tasks stop at their next
step boundary (checkpoint committed, lease released, attempt handed back) and become
PAUSED, an effect in flight settled first (counted at the counting service); resume
re-admits at a rate. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.cli.main import cli
from ratchet.testing import (
    check_ledger_consistent,
    running_worker,
    start_counting_service,
    wait_for,
)
from ratchet.worker.startcheck import START_CHECK_S

pytestmark = pytest.mark.timeout(90)

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.02, max_delay_s=0.1, jitter=0.0)


def _app(url: str) -> App:
    app = App(url)
    for name in ("p.a", "p.b"):
        @app.task(name=name, retry=FAST)
        def noop(ctx: TaskContext) -> int:
            return 1
    return app


def test_claims_respect_the_three_scopes(ledger_url: str) -> None:
    """A paused type is not claimed (the other type is); a pause of everything claims
    nothing; a paused task is PAUSED at once (generation + 1); records are versioned and
    audited; pausing twice changes nothing; resume makes the work claimable again."""
    app = _app(ledger_url)
    led = app.ledger
    try:
        with Control(app=app) as control:
            a1 = app.submit("p.a", {}).task_id
            b1 = app.submit("p.b", {}).task_id
            out = control.pause("type", "p.a", reason="PSP incident", by="alice")
            assert out.outcome == "done"
            [record] = out.pauses
            assert (record.scope, record.target, record.version, record.paused_by,
                    record.reason) == ("type", "p.a", 1, "alice", "PSP incident")
            assert control.pause("type", "p.a", reason="again", by="bob").outcome == \
                "unchanged"
            assert [c.task_id for c in led.claim("w1", ["p.a", "p.b"], 10)] == [b1]
            assert led.claim("w1", ["p.a"], 10) == []
            out = control.pause("all", reason="maintenance", by="alice")
            assert out.pauses[0].version == 2
            b2 = app.submit("p.b", {}).task_id
            assert led.claim("w1", ["p.a", "p.b"], 10) == []
            status = control.status()
            assert [(p.scope, p.target, p.version) for p in status.pauses] == [
                ("type", "p.a", 1), ("all", "", 2)]
            assert status.pauses[0].running == 0
            out = control.resume("all", reason="done", by="alice")
            assert out.outcome == "done" and out.pauses[0].resumed_version == 3
            assert [c.task_id for c in led.claim("w1", ["p.a", "p.b"], 10)] == [b2]
            again = control.resume("all", reason="again", by="alice")
            assert (again.outcome, again.message) == (
                "unchanged", "there is no pause of everything to resume; 1 pause(s) of a "
                "task type or a task stay active (resume each in its own scope)")
            # one task: PAUSED at once, not claimable, back to PENDING on resume
            a2 = app.submit("p.a", {}).task_id
            before = control.get(a2)
            control.resume("type", "p.a", reason="PSP fine", by="alice")
            out = control.pause("task", a2, reason="look at it first", by="carol")
            assert (out.outcome, out.tasks) == ("done", 1)
            info = control.get(a2)
            assert (info.state, info.generation) == (State.PAUSED, before.generation + 1)
            assert [c.task_id for c in led.claim("w1", ["p.a"], 10)] == [a1]
            assert led.claim("w1", ["p.a"], 10) == []
            out = control.resume("task", a2, reason="ok", by="carol")
            assert out.tasks == 1 and control.get(a2).state is State.PENDING
            assert [c.task_id for c in led.claim("w1", ["p.a"], 10)] == [a2]
            again = control.resume("all", reason="again", by="alice")
            assert (again.outcome, again.message) == ("unchanged", "nothing is paused")
            kinds = [e.kind for e in control.inspect(a2).events]
            assert "operator_pause" in kinds and "operator_resume" in kinds
            done = app.submit("p.a", {}).task_id
            [claim] = led.claim("w2", ["p.a"], 1)
            from ratchet.ledger.base import TaskWrite, Transition
            led.commit([TaskWrite(done, claim.generation, "w2", "finish",
                                  transition=Transition(State.SUCCEEDED, result_json="1"))])
            assert control.pause("task", done, reason="x", by="c").outcome == "unchanged"
        result = CliRunner().invoke(cli, ["pause", "--type", "p.b", "--reason", "cli",
                                          "--operator", "dave", "--ledger", ledger_url])
        assert result.exit_code == 0, result.output
        result = CliRunner().invoke(cli, ["status", "--ledger", ledger_url])
        assert result.exit_code == 0 and "PAUSED" in result.output and "dave" in result.output
        result = CliRunner().invoke(cli, ["pause", "--type", "p.b", "--all", "--reason", "x",
                                          "--ledger", ledger_url])
        assert result.exit_code == 2
        result = CliRunner().invoke(cli, ["resume", "--type", "p.b", "--reason", "cli",
                                          "--json", "--ledger", ledger_url])
        assert result.exit_code == 0 and '"outcome": "done"' in result.output
        result = CliRunner().invoke(cli, ["resume", "--type", "p.b", "--reason", "cli",
                                          "--ledger", ledger_url])
        assert result.exit_code == 1
    finally:
        app.close()


def test_resume_readmits_at_a_rate(ledger_url: str) -> None:
    """Paused tasks come back PENDING with run_at staggered by 1 / rate seconds; a task
    paused on its own stays PAUSED when its type is resumed."""
    app = _app(ledger_url)
    try:
        with Control(app=app) as control:
            ids = [app.submit("p.a", {}).task_id for _ in range(5)]
            for tid in ids:
                control.pause("task", tid, reason="hold", by="op")
            control.pause("type", "p.a", reason="hold all", by="op")
            for tid in ids[:4]:
                control.resume("task", tid, reason="type still paused", by="op")
            assert all(control.get(t).state is State.PAUSED for t in ids)
            out = control.resume("type", "p.a", reason="go", by="op", rate_per_s=10)
            assert out.tasks == 4 and "1 stay paused" in out.message
            run_ats = sorted(control.get(t).run_at for t in ids[:4])
            gaps = [b - a for a, b in itertools.pairwise(run_ats)]
            assert all(abs(g - 0.1) < 1e-6 for g in gaps), gaps
            assert control.get(ids[4]).state is State.PAUSED
    finally:
        app.close()


def test_running_tasks_stop_at_a_boundary_and_resume_from_their_checkpoint(
    ledger_url: str, tmp_path: Path
) -> None:
    """A pause of the type reaches a running task within a few seconds: it stops at its
    next step boundary, PAUSED, lease released and attempt handed back; no new attempt
    starts while paused (the claim count stays put while the worker keeps polling); the
    effect that was in flight executed once; resume runs it on from its checkpoint."""
    app = App(ledger_url)
    progress: list[int] = []
    entered, release = threading.Event(), threading.Event()
    with start_counting_service(tmp_path / "svc.db") as svc:
        client = svc.client()

        @app.task(name="p.work", retry=FAST, lease_s=5.0)
        def work(ctx: TaskContext, n: int) -> Any:
            def call(key: str) -> Any:
                entered.set()
                assert release.wait(20)
                return client.execute(key, {})

            ctx.effect("charge", call, key=f"charge:{ctx.task_id}", lookup=client.lookup)

            def one(i: int) -> int:
                progress.append(i)
                threading.Event().wait(0.01)
                return i

            return sum(ctx.step("tick", one, i) for i in range(n))

        try:
            handle = app.submit("p.work", {"n": 1000})
            queued = [app.submit("p.work", {"n": 1}, delay_s=0.5) for _ in range(3)]
            with running_worker(app, concurrency=1) as worker, Control(app=app) as control:
                assert entered.wait(20)
                out = control.pause("type", "p.work", reason="downstream slow", by="op")
                assert out.running == 1
                claims = worker.stats.claimed
                assert control.status().pauses[0].running == 1
                release.set()
                info = wait_for("the task to pause", lambda: (
                    i if (i := control.get(handle.task_id)).state is State.PAUSED else None),
                    timeout_s=10)
                assert info.holder is None and info.attempt == 0
                assert control.status().pauses[0].running == 0
                ran = len(progress)
                assert ran < 1000
                polls = worker.writer.last_claim_at
                wait_for("the worker to poll for work a few times",
                         lambda: worker.writer.last_claim_at > polls + 0.5, timeout_s=10)
                assert worker.stats.claimed == claims  # nothing started while paused
                assert all(control.get(q.task_id).state is State.PENDING for q in queued)
                control.resume("type", "p.work", reason="ok again", by="op")
                assert app.wait(handle.task_id, timeout_s=20).state is State.SUCCEEDED
                for q in queued:
                    assert app.wait(q.task_id, timeout_s=20).state is State.SUCCEEDED
            assert progress[:ran] == list(range(ran))
            # Every step ran exactly once (the three queued tasks run step 0 each): the
            # steps done before the pause stayed done.
            assert sorted(progress) == sorted([*range(1000), 0, 0, 0])
            assert svc.executions()[f"charge:{handle.task_id}"] == 1
            check_ledger_consistent(ledger_url)
        finally:
            client.close()
            app.close()


def test_a_worker_process_pauses_and_resumes(ledger_url: str, tmp_path: Path) -> None:
    """A real worker process runs a long task; ``ratchet pause --type`` stops it at a step
    boundary (PAUSED, lease released), the process keeps running and starts nothing of the
    type; ``ratchet resume`` lets it finish from its checkpoint, every step run once."""
    from ratchet.testing import ProcessGroup

    here = Path(__file__).resolve().parent
    log = tmp_path / "steps.log"
    env = {"CONTROL_LOG": str(log), "CONTROL_LEASE_S": "5", "CONTROL_STEP_S": "0.02"}
    app = App(ledger_url)

    @app.task(name="control.loop", lease_s=5.0)  # its definition: control_app.py
    def stub(ctx: TaskContext, n: int) -> int:
        raise AssertionError("run by the worker process only")

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    try:
        with ProcessGroup(tmp_path / "procs", pythonpath=[here], cwd=here, env=env) as group:
            handle = app.submit("control.loop", {"n": 400})
            proc = group.worker("control_app:app", ledger_url, concurrency=2)
            wait_for("the task to run", lambda: len(lines()) > 5, timeout_s=30)
            result = CliRunner().invoke(cli, ["pause", "--type", "control.loop", "--reason",
                                              "incident", "--ledger", ledger_url])
            assert result.exit_code == 0, result.output
            other = app.submit("control.loop", {"n": 1})
            with Control(ledger_url) as control:
                info = wait_for("the task to pause", lambda: (
                    i if (i := control.get(handle.task_id)).state is State.PAUSED else None),
                    timeout_s=15)
                assert info.holder is None
                ran = len(lines())
                assert ran < 400
                wait_for("the worker to be polling", lambda: proc.alive, timeout_s=5)
                assert control.get(other.task_id).state is State.PENDING
                assert control.status().pauses[0].running == 0
                result = CliRunner().invoke(cli, ["resume", "--type", "control.loop",
                                                  "--reason", "over", "--rate", "5/s",
                                                  "--ledger", ledger_url])
                assert result.exit_code == 0, result.output
                wait_for("both tasks to succeed", lambda: all(
                    control.get(t).state is State.SUCCEEDED
                    for t in (handle.task_id, other.task_id)), timeout_s=60)
            steps = [int(line.split()[3]) for line in lines()
                     if line.startswith(handle.task_id)]
            assert sorted(steps) == list(range(400))  # each step once, resumed from its checkpoint
            check_ledger_consistent(ledger_url)
    finally:
        app.close()


def test_pausing_a_type_nothing_knows_says_so(ledger_url: str) -> None:
    """A type no worker registered and no task has is paused (a type may be paused before
    its workers deploy), but the answer says the name is unknown: a typo is visible."""
    app = _app(ledger_url)
    try:
        with Control(app=app) as control:
            app.submit("p.a", {})
            known = control.pause("type", "p.a", reason="incident", by="alice")
            assert known.outcome == "done" and "note:" not in known.message
            typo = control.pause("type", "p.aa", reason="incident", by="alice")
            assert typo.outcome == "done"
            assert "no worker has registered task type 'p.aa'" in typo.message
            assert [(p.target, p.paused_by) for p in control.pauses()] == [
                ("p.a", "alice"), ("p.aa", "alice")]
    finally:
        app.close()


def test_a_delayed_task_keeps_its_schedule_through_a_pause(ledger_url: str) -> None:
    """Pausing then resuming a task submitted with a delay hands it back at its own
    ``run_at``, not at once (a dashboard test saw it claimed right after the resume)."""
    app = _app(ledger_url)
    try:
        with Control(app=app) as control:
            later = app.submit("p.a", {}, delay_s=3600).task_id
            before = control.get(later).run_at
            assert control.pause("task", later, reason="hold", by="op").outcome == "done"
            assert control.get(later).state is State.PAUSED
            assert control.resume("task", later, reason="go", by="op").outcome == "done"
            after = control.get(later)
            assert after.state is State.PENDING and after.run_at == pytest.approx(before)
            assert app.ledger.claim("w1", ["p.a"], 10) == []  # not ready before its time
    finally:
        app.close()


@pytest.mark.parametrize("scope", ["type", "all"])
def test_a_prefetched_task_does_not_start_after_the_pause_returned(
    ledger_url: str, scope: str
) -> None:
    """A worker (one thread, prefetch) holds tasks claimed before the pause, leased and not
    started, behind a running one. Once the pause has returned and the start check's
    window (START_CHECK_S) has passed, none of them starts when the thread frees up,
    whatever the heartbeat knows by then (its own read comes every 0.5 s, NOTIFY on
    PostgreSQL ~50 ms later): each goes PAUSED unstarted, attempt handed back."""
    app = App(ledger_url)
    gate = threading.Event()
    started: list[int] = []

    @app.task(name="p.first", retry=FAST)
    def first(ctx: TaskContext) -> int:
        gate.wait(30)
        return 0

    @app.task(name="p.later", retry=FAST)
    def later(ctx: TaskContext, i: int) -> int:
        started.append(i)
        return i

    try:
        with Control(app=app) as control:
            head = app.submit("p.first", {}).task_id
            held = [app.submit("p.later", {"i": i}).task_id for i in range(3)]
            with running_worker(app, concurrency=1, prefetch=4) as worker:
                wait_for("the worker to hold every task", lambda: all(
                    control.get(t).state is State.RUNNING for t in [head, *held]), 20)
                target = "p.later" if scope == "type" else ""
                control.pause(scope, target, reason="incident", by="alice")
                returned = time.monotonic()
                # A start more than START_CHECK_S after the pause returned must see it.
                wait_for("the start check's window to pass",
                         lambda: time.monotonic() - returned > START_CHECK_S, 5,
                         interval_s=0.001)
                gate.set()
                wait_for("the held tasks to be PAUSED", lambda: all(
                    control.get(t).state is State.PAUSED for t in held), 20)
                assert started == [], started
                assert control.get(head).state is State.SUCCEEDED
                assert worker.stats.paused == len(held)
            for task_id in held:
                info = control.get(task_id)
                assert info.attempt == 0 and info.holder is None, info  # handed back
            control.resume(scope, target, reason="fine", by="alice")
            with running_worker(app, concurrency=1):
                for task_id in held:
                    assert app.wait(task_id, timeout_s=20).state is State.SUCCEEDED
            assert sorted(started) == [0, 1, 2]
        check_ledger_consistent(ledger_url)
    finally:
        gate.set()
        app.close()
