"""Workflows with a real worker on both ledgers (DESIGN §3, waits; §5, compensation):
durable sleep, events, child tasks with fan-out and fan-in, compensation, and how they
meet cancel, pause, replay and bad input. Crash tests with killed processes live in
tests/workflows/."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from ratchet import (
    NOT_FOUND,
    App,
    ChildFailed,
    ChildHandle,
    EventTimeout,
    InvalidArguments,
    OutcomeUnknownError,
    PayloadTooLarge,
    State,
    TaskContext,
    TransientError,
)
from ratchet.control import ResolveOutcome
from ratchet.testing import wait_for
from ratchet.testing.doubles import fast_retry_policy
from ratchet.testing.worker import running_worker


def _state(app: App, task_id: str, state: State) -> bool:
    return app.get(task_id).state is state


def _kinds(app: App, task_id: str) -> list[str]:
    return [e.kind for e in app.ledger.timeline(task_id).events]


# ---------------------------------------------------------------------- durable sleep


def test_sleep_parks_the_task_and_each_side_runs_once_across_a_worker_restart(
        app: App) -> None:
    runs: Counter[str] = Counter()

    @app.task(name="wf.sleepy")
    def sleepy(ctx: TaskContext) -> dict[str, float]:
        before = ctx.step("before", lambda: runs.update(["before"]) or time.time())
        ctx.sleep("nap", 1.5)
        after = ctx.step("after", lambda: runs.update(["after"]) or time.time())
        return {"slept": after - before}

    handle = app.submit("wf.sleepy")
    with running_worker(app):
        wait_for("the task to park", lambda: _state(app, handle.task_id, State.WAITING))
        info = app.get(handle.task_id)
        assert info.holder is None and info.lease_until is None  # no lease held
        [wait] = app.ledger.waits([handle.task_id])
        assert wait.kind == "sleep" and wait.until is not None
    # A new worker: the recorded deadline stands (not recomputed from the restart).
    with running_worker(app):
        done = app.wait(handle.task_id, timeout_s=20)
    assert done.state is State.SUCCEEDED
    assert done.result["slept"] >= 1.4
    assert runs == {"before": 1, "after": 1}
    assert done.attempt == 1  # a wait hands its attempt back
    assert "wake" in _kinds(app, handle.task_id)


def test_sleep_until_in_the_past_returns_and_a_naive_datetime_is_refused(app: App) -> None:
    @app.task(name="wf.until")
    def until(ctx: TaskContext, naive: bool) -> str:
        if naive:
            ctx.sleep_until("x", datetime(2030, 1, 1))  # naive: the bad input
        ctx.sleep_until("past", datetime.now().astimezone() - timedelta(hours=1))
        ctx.sleep_until("epoch", time.time() - 5)
        return "ok"

    good = app.submit("wf.until", {"naive": False})
    bad = app.submit("wf.until", {"naive": True})
    with running_worker(app):
        assert app.wait(good.task_id, timeout_s=20).result == "ok"
        failed = app.wait(bad.task_id, timeout_s=20)
    assert failed.state is State.FAILED
    assert "tzinfo" in (failed.last_error or "")


# ---------------------------------------------------------------------- events


def test_event_sent_before_the_wait_is_kept_in_the_mailbox(app: App) -> None:
    @app.task(name="wf.waiter")
    def waiter(ctx: TaskContext, order: str) -> Any:
        return ctx.wait_for_event("shipped", key=order, timeout_s=30)

    handle = app.submit("wf.waiter", {"order": "o-1"})
    receipt = app.send_event("shipped", key="o-1", payload={"tracking": 7}, event_id="ev-1")
    assert receipt.woken == 0 and not receipt.duplicate  # nobody waits yet
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.result == {"tracking": 7}


def test_event_wakes_every_waiter_once_and_an_event_id_is_one_event(app: App) -> None:
    @app.task(name="wf.waiter2")
    def waiter(ctx: TaskContext, order: str) -> Any:
        return ctx.wait_for_event("shipped", key=order)

    handles = [app.submit("wf.waiter2", {"order": "o-2"}) for _ in range(3)]
    with running_worker(app, concurrency=4):
        for h in handles:
            wait_for("the waiters to park", lambda h=h: _state(app, h.task_id, State.WAITING))
        first = app.send_event("shipped", key="o-2", payload=1, event_id="ev-2")
        again = app.send_event("shipped", key="o-2", payload=1, event_id="ev-2")
        results = [app.wait(h.task_id, timeout_s=20).result for h in handles]
    assert first.woken == 3 and not first.duplicate
    assert again.duplicate and again.woken == 0 and again.seq == first.seq
    assert results == [1, 1, 1]
    with pytest.raises(InvalidArguments, match="already sent"):
        app.send_event("shipped", key="o-2", payload=2, event_id="ev-2")


def test_a_second_wait_on_the_same_pair_gets_a_later_event_and_replays_see_the_same(
        app: App) -> None:
    calls: Counter[str] = Counter()

    @app.task(name="wf.twice", retry=fast_retry_policy())
    def twice(ctx: TaskContext) -> list[Any]:
        a = ctx.wait_for_event("tick", key="k")
        b = ctx.wait_for_event("tick", key="k")
        calls.update(["end"])
        if calls["end"] == 1:
            raise TransientError("once more: the replay must see the same payloads")
        return [a, b]

    handle = app.submit("wf.twice")
    app.send_event("tick", key="k", payload="first")
    with running_worker(app):
        wait_for("the second wait", lambda: _state(app, handle.task_id, State.WAITING)
                 and app.ledger.waits([handle.task_id])[0].kind == "event")
        app.send_event("tick", key="k", payload="second")
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.result == ["first", "second"]


def test_event_timeout_is_a_checkpoint_and_fails_the_task_when_not_caught(app: App) -> None:
    @app.task(name="wf.timeout")
    def timeout(ctx: TaskContext, catch: bool) -> str:
        try:
            ctx.wait_for_event("never", key="k", timeout_s=0.5)
        except EventTimeout as exc:
            if catch:
                return f"timed out after {exc.timeout_s}"
            raise
        return "got it"

    caught = app.submit("wf.timeout", {"catch": True})
    thrown = app.submit("wf.timeout", {"catch": False})
    with running_worker(app):
        assert app.wait(caught.task_id, timeout_s=20).result == "timed out after 0.5"
        failed = app.wait(thrown.task_id, timeout_s=20)
    assert failed.state is State.FAILED and "EventTimeout" in (failed.last_error or "")
    # An event sent after the timeout stays in the mailbox and changes nothing.
    assert app.send_event("never", key="k").woken == 0


def test_signal_reaches_one_task_and_payload_limits_hold(app: App) -> None:
    @app.task(name="wf.signalled")
    def signalled(ctx: TaskContext) -> Any:
        return ctx.wait_for_event("approve", key=ctx.task_id)

    handle = app.submit("wf.signalled")
    with running_worker(app):
        wait_for("the task to park", lambda: _state(app, handle.task_id, State.WAITING))
        assert app.signal(handle.task_id, "approve", {"by": "ann"}).woken == 1
        assert app.wait(handle.task_id, timeout_s=20).result == {"by": "ann"}
    with pytest.raises(PayloadTooLarge):
        app.send_event("big", key="k", payload="x" * (app.max_payload_bytes + 1))
    with pytest.raises(InvalidArguments):
        app.send_event("", key="k")


# ---------------------------------------------------------------------- children


def test_fan_out_and_fan_in_return_results_in_order_and_hold_no_thread(app: App) -> None:
    @app.task(name="wf.square")
    def square(ctx: TaskContext, i: int) -> int:
        return i * i

    @app.task(name="wf.fan")
    def fan(ctx: TaskContext, n: int) -> dict[str, Any]:
        handles = ctx.submit_many("wf.square", [{"i": i} for i in range(n)])
        squares = ctx.gather(handles)
        seven = ctx.wait(ctx.submit("wf.square", {"i": 7}))
        return {"squares": squares, "seven": seven}

    handle = app.submit("wf.fan", {"n": 60})
    with running_worker(app, concurrency=1):  # one thread: the parent must not hold it
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.SUCCEEDED
    assert info.result == {"squares": [i * i for i in range(60)], "seven": 49}
    children = app.ledger.children(handle.task_id)
    assert len(children) == 61
    assert all(c.parent_id == handle.task_id and c.state is State.SUCCEEDED for c in children)
    assert info.attempt == 1


def test_a_replay_finds_the_same_children_and_a_failed_child_raises(app: App) -> None:
    attempts: Counter[str] = Counter()

    @app.task(name="wf.maybe")
    def maybe(ctx: TaskContext, i: int) -> int:
        if i == 3:
            raise ValueError("child three is broken")
        return i

    @app.task(name="wf.parent", retry=fast_retry_policy())
    def parent(ctx: TaskContext, strict: bool) -> Any:
        handles = [ctx.submit("wf.maybe", {"i": i}) for i in range(5)]
        attempts.update(["submitted"])
        if attempts["submitted"] == 1:
            raise TransientError("crash after the submits: the replay must not submit again")
        if strict:
            return ctx.gather(handles)
        got = ctx.gather(handles, return_exceptions=True)
        return [g if not isinstance(g, ChildFailed) else g.state for g in got]

    strict = app.submit("wf.parent", {"strict": True})
    lenient = app.submit("wf.parent", {"strict": False})
    with running_worker(app, concurrency=4):
        failed = app.wait(strict.task_id, timeout_s=60)
        done = app.wait(lenient.task_id, timeout_s=60)
    assert failed.state is State.FAILED and "ChildFailed" in (failed.last_error or "")
    assert done.result == [0, 1, 2, "FAILED", 4]
    assert len(app.ledger.children(strict.task_id)) == 5
    assert len(app.ledger.children(lenient.task_id)) == 5


def test_gather_refuses_a_handle_that_is_not_a_child(app: App) -> None:
    @app.task(name="wf.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    @app.task(name="wf.stranger")
    def stranger(ctx: TaskContext, other: str) -> Any:
        return ctx.gather([ChildHandle(other, "wf.noop", "someone-else")])

    other = app.submit("wf.noop")
    handle = app.submit("wf.stranger", {"other": other.task_id})
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.FAILED and "children" in (info.last_error or "")


def test_cancelling_a_parent_cancels_its_unfinished_children(app: App) -> None:
    @app.task(name="wf.slow_child")
    def slow_child(ctx: TaskContext, i: int) -> int:
        ctx.sleep("long", 3600)
        return i

    @app.task(name="wf.slow_parent")
    def slow_parent(ctx: TaskContext) -> Any:
        return ctx.gather(ctx.submit_many("wf.slow_child", [{"i": i} for i in range(3)]))

    handle = app.submit("wf.slow_parent")
    with running_worker(app):
        wait_for("the children to park", lambda: len(app.ledger.children(handle.task_id)) == 3
                 and all(c.state is State.WAITING for c in app.ledger.children(handle.task_id)))
        wait_for("the parent to park", lambda: _state(app, handle.task_id, State.WAITING))
        outcome = app.ledger.cancel(handle.task_id, "customer left", "tester")
    assert outcome.state is State.CANCELLED
    children = app.ledger.children(handle.task_id)
    assert [c.state for c in children] == [State.CANCELLED] * 3
    reasons = [e.detail.get("reason") for c in children
               for e in app.ledger.timeline(c.task_id).events if e.kind == "operator_cancel"]
    assert all(r and r.startswith(f"parent {handle.task_id} cancelled") for r in reasons)


def test_a_paused_waiting_task_parks_again_on_resume(app: App) -> None:
    @app.task(name="wf.pausable")
    def pausable(ctx: TaskContext) -> Any:
        return ctx.wait_for_event("go", key="p")

    handle = app.submit("wf.pausable")
    with running_worker(app):
        wait_for("the task to park", lambda: _state(app, handle.task_id, State.WAITING))
        app.ledger.pause("task", handle.task_id, "look at it", "tester")
        assert app.get(handle.task_id).state is State.PAUSED
        app.send_event("go", key="p", payload="later")  # not delivered: it does not wait
        app.ledger.resume("task", handle.task_id, "go on", "tester")
        # The replay reaches the wait again, which finds the event in the mailbox.
        assert app.wait(handle.task_id, timeout_s=20).result == "later"


def test_a_replay_that_reaches_a_sleep_where_a_step_was_recorded_is_non_deterministic(
        app: App) -> None:
    seen: Counter[str] = Counter()

    @app.task(name="wf.drift", retry=fast_retry_policy())
    def drift(ctx: TaskContext) -> None:
        seen.update(["run"])
        if seen["run"] == 1:
            ctx.step("first", lambda: 1)
            raise TransientError("again")
        ctx.sleep("first", 0)

    handle = app.submit("wf.drift")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.FAILED and "NonDeterministicReplay" in (info.last_error or "")


# ---------------------------------------------------------------------- compensation


def test_compensations_run_once_each_in_reverse_order_and_survive_a_failing_one(
        app: App) -> None:
    done: list[str] = []
    lock = threading.Lock()
    flaky: Counter[str] = Counter()

    def record(what: str) -> str:
        with lock:
            done.append(what)
        return what

    def release(key: str, result: Any) -> str:
        flaky.update(["release"])
        if flaky["release"] == 1:
            raise TransientError("the warehouse is busy; the compensation is retried")
        return record(f"release {key} of {result}")

    def released(key: str) -> Any:
        # The warehouse answers whether the release with this key happened.
        found = [d for d in done if d.startswith(f"release {key} ")]
        return found[0] if found else NOT_FOUND

    @app.task(name="wf.saga", retry=fast_retry_policy())
    def saga(ctx: TaskContext, order: str) -> None:
        ctx.effect("charge", lambda k: record(f"charge {k}"), key=f"charge:{order}",
                   idempotent=True, compensate=lambda k, r: record(f"refund {k} of {r}"))
        ctx.effect("reserve", lambda k: record(f"reserve {k}"), key=f"reserve:{order}",
                   idempotent=True, compensate=release, compensate_lookup=released)
        raise ValueError("the card was declined downstream")

    handle = app.submit("wf.saga", {"order": "o-9"})
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.COMPENSATED
    assert done == ["charge charge:o-9", "reserve reserve:o-9",
                    "release compensate:reserve:o-9 of reserve reserve:o-9",
                    "refund compensate:charge:o-9 of charge charge:o-9"]
    effects = {e.name: e for e in app.ledger.timeline(handle.task_id).effects}
    assert effects["compensate:charge"].key == "compensate:charge:o-9"
    assert "COMPENSATING" in {e.to_state for e in app.ledger.timeline(handle.task_id).events}


def test_operator_compensate_moves_only_a_failed_task(app: App) -> None:
    @app.task(name="wf.plain_fail")
    def plain_fail(ctx: TaskContext) -> None:
        ctx.step("work", lambda: 1)
        raise ValueError("broken")

    handle = app.submit("wf.plain_fail")
    with running_worker(app):
        assert app.wait(handle.task_id, timeout_s=20).state is State.FAILED
        outcome = app.ledger.compensate(handle.task_id, "undo it", "tester")
        assert outcome.outcome == "done" and outcome.state is State.COMPENSATING
        info = wait_for("the compensation to end",
                        lambda: (i := app.get(handle.task_id)).terminal and i)
    assert info.state is State.COMPENSATED and info.result == {"compensated": []}
    again = app.ledger.compensate(handle.task_id, "twice", "tester")
    assert again.outcome == "unchanged" and again.state is State.COMPENSATED
    assert "operator_compensate" in _kinds(app, handle.task_id)


def test_an_operators_give_up_compensates_what_the_task_completed(app: App) -> None:
    undone: list[str] = []

    def lost_reply(key: str) -> None:
        raise OutcomeUnknownError("the reply was lost")

    @app.task(name="wf.give_up")
    def give_up(ctx: TaskContext) -> None:
        ctx.effect("charge", lambda k: "charged", key="charge:g", idempotent=True,
                   compensate=lambda k, r: undone.append(f"{k}/{r}"))
        ctx.effect("ship", lost_reply, key="ship:g")  # no lookup, not idempotent: UNKNOWN

    handle = app.submit("wf.give_up")
    with running_worker(app):
        wait_for("UNKNOWN", lambda: _state(app, handle.task_id, State.UNKNOWN))
        app.ledger.resolve(handle.task_id, ResolveOutcome.GIVE_UP, "never shipped", "tester")
        info = wait_for("the compensation", lambda: (i := app.get(handle.task_id)).terminal
                        and i)
    assert info.state is State.COMPENSATED
    assert undone == ["compensate:charge:g/charged"]
