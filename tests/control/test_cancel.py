"""``ratchet cancel`` / ``Control.cancel`` (DESIGN §3 arbitration), on both
ledgers: cancel before start wins (pending, scheduled); a success committed first stays a
success; a running task stops at its next step boundary with a fenced move (an effect in
flight executed exactly once, counted at the counting service); a task whose holder was
SIGKILLed still ends CANCELLED; UNKNOWN waits for the resolution; a stale write after the
cancel changes nothing. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, State, TaskContext
from ratchet.cli.main import cli
from ratchet.ledger.base import EffectState, EffectWrite, TaskWrite, Transition
from ratchet.serde import digest, dumps
from ratchet.testing import (
    ProcessGroup,
    check_ledger_consistent,
    fast_retry_policy,
    running_worker,
    start_counting_service,
    wait_for,
)

pytestmark = pytest.mark.timeout(90)

HERE = Path(__file__).resolve().parent
FAST = fast_retry_policy()


def _events(control: Control, task_id: str, kind: str) -> list[Any]:
    return [e for e in control.inspect(task_id).events if e.kind == kind]


def _register_noop(app: App) -> None:
    @app.task(name="c.noop", retry=FAST)
    def noop(ctx: TaskContext) -> int:
        return 1


def test_cancel_before_start_wins_pending_and_scheduled(ledger_url: str) -> None:
    """A pending and a scheduled task (``delay_s=3600``) are CANCELLED at once, generation
    + 1, audited with operator and reason; no worker ever runs them."""
    app = App(ledger_url)
    ran: list[str] = []

    @app.task(name="c.body", retry=FAST)
    def body(ctx: TaskContext) -> int:
        ran.append(ctx.task_id)
        return 1

    try:
        now = app.submit("c.body", {})
        later = app.submit("c.body", {}, delay_s=3600)
        with Control(app=app) as control:
            for handle in (now, later):
                before = control.get(handle.task_id)
                out = control.cancel(handle.task_id, reason="submitted by mistake", by="alice")
                assert (out.outcome, out.previous_state, out.state) == (
                    "done", State.PENDING, State.CANCELLED)
                info = control.get(handle.task_id)
                assert info.state is State.CANCELLED
                assert info.generation == before.generation + 1 == out.generation
                [event] = _events(control, handle.task_id, "operator_cancel")
                assert event.detail["operator"] == "alice"
                assert event.detail["reason"] == "submitted by mistake"
                assert (event.from_state, event.to_state) == ("PENDING", "CANCELLED")
            with running_worker(app, concurrency=2) as worker:
                probe = app.submit("c.body", {})
                assert app.wait(probe.task_id, timeout_s=20).state is State.SUCCEEDED
                assert worker.stats.claimed == 1
            assert ran == [probe.task_id]
            assert control.status().operator_actions == 2
        check_ledger_consistent(ledger_url)
    finally:
        app.close()


def test_a_finished_task_is_unchanged_and_the_caller_told(ledger_url: str) -> None:
    """A success committed first stays a success: cancel says ``unchanged`` (CLI exit 1),
    changes nothing and writes no audit row; an unknown task is an error (exit 2)."""
    app = App(ledger_url)
    _register_noop(app)
    try:
        handle = app.submit("c.noop", {})
        with running_worker(app):
            assert app.wait(handle.task_id, timeout_s=20).state is State.SUCCEEDED
        with Control(app=app) as control:
            before = control.get(handle.task_id)
            out = control.cancel(handle.task_id, reason="too late", by="bob")
            assert (out.outcome, out.state) == ("unchanged", State.SUCCEEDED)
            assert "SUCCEEDED" in out.message
            assert control.get(handle.task_id) == before
            assert _events(control, handle.task_id, "operator_cancel") == []
        result = CliRunner().invoke(cli, ["cancel", handle.task_id, "--reason", "again",
                                          "--ledger", ledger_url])
        assert result.exit_code == 1, result.output
        assert "unchanged" in result.output
        result = CliRunner().invoke(cli, ["cancel", "no-such-task", "--reason", "x",
                                          "--ledger", ledger_url])
        assert result.exit_code == 2
        via_app = app.submit("c.noop", {}, delay_s=3600)
        assert app.cancel(via_app.task_id, reason="from Python", by="eve").outcome == "done"
        fresh = app.submit("c.noop", {}, delay_s=3600)
        result = CliRunner().invoke(cli, ["cancel", fresh.task_id, "--reason", "mistake",
                                          "--operator", "carol", "--json",
                                          "--ledger", ledger_url])
        assert result.exit_code == 0, result.output
        assert '"outcome": "done"' in result.output
        assert app.get(fresh.task_id).state is State.CANCELLED
    finally:
        app.close()


def test_blank_reason_is_refused(ledger_url: str) -> None:
    app = App(ledger_url)
    _register_noop(app)
    try:
        handle = app.submit("c.noop", {}, delay_s=3600)
        with Control(app=app) as control:
            from ratchet.errors import InvalidArguments
            with pytest.raises(InvalidArguments):
                control.cancel(handle.task_id, reason="  ")
            assert control.get(handle.task_id).state is State.PENDING
    finally:
        app.close()


def test_arbitration_at_the_ledger(ledger_url: str) -> None:
    """The request on a RUNNING task against the holder's next fenced write: a failure
    (RETRY_WAIT) becomes CANCELLED; a success committed first stays; a stale write after
    the cancel changes nothing; an UNKNOWN task keeps the request until it is resolved."""
    app = App(ledger_url)
    _register_noop(app)

    @app.task(name="c.short", lease_s=1.0)
    def short(ctx: TaskContext) -> int:
        return 1

    led = app.ledger
    try:
        with Control(app=app) as control:
            # 1. running, then the holder's attempt fails: cancelled, not retried
            a = app.submit("c.noop", {}).task_id
            [claim] = led.claim("w1", ["c.noop"], 1)
            out = control.cancel(a, reason="stop it", by="op")
            assert (out.outcome, out.state) == ("requested", State.RUNNING)
            assert led.control_requests("w1") == [(a, claim.generation, "cancel")]
            [ok] = led.commit([TaskWrite(a, claim.generation, "w1", "finish",
                                         steps=[("s", dumps(1))],
                                         transition=Transition(State.RETRY_WAIT, error="x"))])
            assert ok.ok and ok.current_state is State.CANCELLED  # the state applied
            info = led.get(a)
            assert info.state is State.CANCELLED and info.holder is None
            assert [s.name for s in led.timeline(a).steps] == ["s"]
            assert led.control_requests("w1") == []
            # a late write of the same (now finished) attempt changes nothing
            [late] = led.commit([TaskWrite(a, claim.generation, "w1", "late",
                                           transition=Transition(State.SUCCEEDED,
                                                                 result_json="1"))])
            assert late.stale and led.get(a).state is State.CANCELLED
            # 2. running, the holder's success commits first: the success stands
            b = app.submit("c.noop", {}).task_id
            [claim] = led.claim("w1", ["c.noop"], 1)
            assert control.cancel(b, reason="stop", by="op").outcome == "requested"
            [ok] = led.commit([TaskWrite(b, claim.generation, "w1", "finish",
                                         transition=Transition(State.SUCCEEDED,
                                                               result_json="1"))])
            assert ok.ok and led.get(b).state is State.SUCCEEDED
            assert control.cancel(b, reason="stop", by="op").outcome == "unchanged"
            # 3. an effect's outcome unknown: the cancel waits for the resolution
            c = app.submit("c.noop", {}).task_id
            [claim] = led.claim("w1", ["c.noop"], 1)
            intent = EffectWrite("charge", "k-c", "d", EffectState.INTENT)
            [ok] = led.commit([TaskWrite(c, claim.generation, "w1", "unknown",
                                         effects=[intent],
                                         transition=Transition(State.UNKNOWN, error="?"))])
            out = control.cancel(c, reason="customer left", by="op")
            assert (out.outcome, out.state) == ("requested", State.UNKNOWN)
            assert "resolve" in out.message
            info = control.resolve(c, "not-done", reason="not at the PSP", by="op")
            assert info.state is State.CANCELLED
            [effect] = control.inspect(c).effects
            assert effect.state == "not_done"
            # 4. running with the lease already expired and no open intent: at once
            d = app.submit("c.short", {}).task_id
            [claim] = led.claim("w9", ["c.short"], 1)
            wait_for("the lease to expire", lambda: led.now() > claim.lease_until + 0.01,
                     timeout_s=10)
            out = control.cancel(d, reason="holder gone", by="op")
            assert (out.outcome, out.state) == ("done", State.CANCELLED)
            assert led.get(d).generation == claim.generation + 1
            [stale] = led.commit([TaskWrite(d, claim.generation, "w9", "late",
                                            transition=Transition(State.SUCCEEDED,
                                                                  result_json="1"))])
            assert stale.stale and led.get(d).state is State.CANCELLED
        check_ledger_consistent(ledger_url, task_ids=[b, c, d])
    finally:
        app.close()


def test_a_running_task_stops_at_its_next_step(ledger_url: str) -> None:
    """A task looping on steps is cancelled while it runs: it stops at a step boundary
    within a few seconds, its pipelined checkpoints are committed (a contiguous prefix),
    and it never runs again."""
    app = App(ledger_url)
    progress: list[int] = []
    started = threading.Event()

    @app.task(name="c.loop", retry=FAST, lease_s=5.0)
    def loop(ctx: TaskContext, n: int) -> int:
        def one(i: int) -> int:
            progress.append(i)
            started.set()
            threading.Event().wait(0.02)
            return i

        return sum(ctx.step("tick", one, i) for i in range(n))

    try:
        handle = app.submit("c.loop", {"n": 100000})
        with running_worker(app, concurrency=2) as worker, Control(app=app) as control:
            assert started.wait(20)
            out = control.cancel(handle.task_id, reason="runaway", by="op")
            assert out.outcome == "requested"
            info = app.wait(handle.task_id, timeout_s=10)
            assert info.state is State.CANCELLED
            # The worker counts the cancel once its commit's callback ran, which may be
            # after the row reads CANCELLED.
            wait_for("the worker to count the cancel", lambda: worker.stats.cancelled == 1, 10)
        ran = len(progress)
        assert 0 < ran < 100000
        steps = control_steps(ledger_url, handle.task_id)
        assert steps == list(range(len(steps)))  # contiguous from the first
        assert len(steps) >= ran - 1  # the boundary's pipelined steps committed with it
        with running_worker(app):
            probe = app.submit("c.loop", {"n": 1})
            assert app.wait(probe.task_id, timeout_s=20).state is State.SUCCEEDED
        assert len(progress) == ran + 1
    finally:
        app.close()


def control_steps(ledger_url: str, task_id: str) -> list[int]:
    with Control(ledger_url) as control:
        return [s.result for s in control.inspect(task_id).steps]


def test_an_effect_in_flight_is_settled_once_then_cancelled(
    ledger_url: str, tmp_path: Path
) -> None:
    """The cancel arrives while the effect's call is in flight: the call completes (the
    counting service executed it exactly once), its result is recorded, and the task stops
    at the next boundary, CANCELLED, without its later step."""
    app = App(ledger_url)
    entered, release = threading.Event(), threading.Event()
    after: list[int] = []
    with start_counting_service(tmp_path / "svc.db") as svc:
        client = svc.client()

        @app.task(name="c.pay", retry=FAST, lease_s=5.0)
        def pay(ctx: TaskContext, order: str) -> Any:
            ctx.step("quote", lambda: 10)

            def call(key: str) -> Any:
                entered.set()
                assert release.wait(20)
                return client.execute(key, {"order": order})

            charged = ctx.effect("charge", call, key=f"charge:{order}", lookup=client.lookup)
            ctx.step("after", lambda: after.append(1))
            return charged

        try:
            handle = app.submit("c.pay", {"order": "o1"})
            with running_worker(app) as worker, Control(app=app) as control:
                assert entered.wait(20)
                assert control.cancel(handle.task_id, reason="customer called",
                                      by="op").outcome == "requested"
                wait_for("the holder to learn of the request", lambda: any(
                    h.request == "cancel" for h in worker.heartbeat.held()), timeout_s=5)
                release.set()
                assert app.wait(handle.task_id, timeout_s=20).state is State.CANCELLED
                [effect] = control.inspect(handle.task_id).effects
                assert effect.state == "done" and effect.calls == 1
            assert svc.executions() == {"charge:o1": 1}
            assert after == []
            check_ledger_consistent(ledger_url)
        finally:
            client.close()
            app.close()


def test_cancel_of_a_task_whose_holder_was_sigkilled(ledger_url: str, tmp_path: Path) -> None:
    """A real worker process runs a long task and is SIGKILLed; the cancel is recorded,
    and the task ends CANCELLED (revoked by a same-host worker, or its lease expired)
    without running again."""
    log = tmp_path / "steps.log"
    env = {"CONTROL_LOG": str(log), "CONTROL_LEASE_S": "2"}
    with ProcessGroup(tmp_path / "procs", pythonpath=[HERE], cwd=HERE, env=env) as group:
        app = App(ledger_url)

        @app.task(name="control.loop", lease_s=2.0)  # its definition: control_app.py
        def stub(ctx: TaskContext, n: int) -> int:
            raise AssertionError("run by the worker processes only")

        try:
            handle = app.submit("control.loop", {"n": 100000})
            proc = group.worker("control_app:app", ledger_url, concurrency=1)
            wait_for("the task to run", lambda: log.exists() and log.read_text().count("\n") > 3,
                     timeout_s=30)
            proc.kill()
            ran = log.read_text().count("\n")
            with Control(ledger_url) as control:
                out = control.cancel(handle.task_id, reason="holder died", by="op")
                assert out.outcome in ("requested", "done")
                assert out.previous_state is State.RUNNING
                group.worker("control_app:app", ledger_url, name="second", concurrency=1)
                wait_for("the task to end CANCELLED",
                         lambda: control.get(handle.task_id).state is State.CANCELLED,
                         timeout_s=30)
            assert log.read_text().count("\n") == ran  # it never ran again
            check_ledger_consistent(ledger_url)
        finally:
            app.close()


@pytest.mark.parametrize("executed", [False, True])
def test_a_dead_holders_open_effect_is_settled_by_lookup_before_the_cancel(
    ledger_url: str, tmp_path: Path, executed: bool
) -> None:
    """A holder died with an effect intent open and a cancel was asked for: the ledger does
    not cancel on lease expiry; the next holder replays to the effect, asks the lookup and
    records what it says (done: the result; not found: not done), and only then cancels.
    The effect is never called again (counted at the service)."""
    app = App(ledger_url)
    with start_counting_service(tmp_path / "svc.db", honour_keys=False) as svc:
        client = svc.client()
        calls: list[str] = []

        @app.task(name="c.open", retry=FAST, lease_s=1.0)
        def open_effect(ctx: TaskContext, order: str) -> Any:
            ctx.step("quote", lambda: 10)

            def call(key: str) -> Any:
                calls.append(key)
                return client.execute(key, {"order": order})

            charged = ctx.effect("charge", call, key=f"charge:{order}",
                                 lookup=client.lookup)
            ctx.step("receipt", lambda: 1)  # the boundary where the cancel applies
            return charged

        led = app.ledger
        try:
            tid = app.submit("c.open", {"order": "o1"}).task_id
            [claim] = led.claim("dead-holder", ["c.open"], 1)
            [ok] = led.commit([TaskWrite(tid, claim.generation, "dead-holder", "intent",
                                         steps=[("quote", dumps(10), 0)],
                                         effects=[EffectWrite(
                                             "charge", "charge:o1",
                                             digest("charge", "charge:o1", dumps(None)),
                                             EffectState.INTENT, seq=1)])])
            assert ok.ok
            if executed:  # the dead holder's request had reached the target
                client.execute("charge:o1", {"order": "o1"})
            with Control(app=app) as control:
                out = control.cancel(tid, reason="customer left", by="op")
                assert out.outcome == "requested" and "lookup" in out.message
                wait_for("the lease to expire", lambda: led.now() > claim.lease_until + 0.01,
                         timeout_s=10)
                with running_worker(app):
                    info = app.wait(tid, timeout_s=20)
                assert info.state is State.CANCELLED
                [effect] = control.inspect(tid).effects
                assert effect.state == ("done" if executed else "not_done")
            assert calls == []
            assert svc.executions() == ({"charge:o1": 1} if executed else {})
        finally:
            client.close()
            app.close()
