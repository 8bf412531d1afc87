"""Replay of the workflow calls a real worker recorded, on both ledgers: a sleep, a wait
for an event, an emit, children submitted and gathered, a transaction step and a batch
run all return their recorded values (a sleep at once, the event's recorded payload, the
children's recorded outcomes, nothing submitted or written); a task waiting for its event
replays to the end of its history; an effect whose outcome the history lacks (its intent
only) ends the replay there; an ``async def`` body is driven by the async replay context."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import replayapp

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.replay.history import RecordedCheckpoint, recorded_history
from ratchet.testing import (
    CountingService,
    ReplayReport,
    replay,
    running_worker,
    start_counting_service,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

ONCE = RetryPolicy(max_attempts=1)


def _flow(ctx: TaskContext, order_id: str, event: str) -> Any:
    ctx.sleep("cool-off", 0.05)
    shipped = ctx.wait_for_event(event, key=order_id, timeout_s=60)
    message_id = ctx.emit("order.shipped", {"order": order_id}, key=order_id)
    handles = ctx.submit_many("flow.child", [{"i": 1}, {"i": 2}])
    handles.append(ctx.submit("flow.child", {"i": 3}))
    results = ctx.gather(handles)
    total = ctx.transaction("total", lambda conn: sum(results))
    run = ctx.batches("items", list(range(5)), lambda batch, position: None, size=2)
    return {"shipped": shipped, "message_id": message_id, "results": results,
            "total": total, "items": run["items"]}


def make_app(url: str) -> App:
    """``flow`` version 1 waits for ``shipped``, version 2 for ``delivered``."""
    app = App(url)

    @app.task(name="flow.child")
    def child(ctx: TaskContext, i: int) -> int:
        return i * 10

    @app.task(name="flow", version=1, retry=ONCE)
    def flow_v1(ctx: TaskContext, order_id: str) -> Any:
        return _flow(ctx, order_id, "shipped")

    @app.task(name="flow", version=2, retry=ONCE)
    def flow_v2(ctx: TaskContext, order_id: str) -> Any:
        return _flow(ctx, order_id, "delivered")

    return app


@pytest.fixture
def flow_app(ledger_url: str) -> Iterator[App]:
    app = make_app(ledger_url)
    yield app
    app.close()


def test_workflow_calls_return_what_was_recorded(flow_app: App) -> None:
    app = flow_app
    task_id = app.submit("flow", {"order_id": "o-5"}, version=1).task_id
    with running_worker(app, concurrency=4):
        wait_for("the flow to wait for its event", lambda: any(
            c.stored_name.startswith("event-deadline:") for c in _history(app, task_id)))
        waiting = replay(app, task_id)
        assert waiting.divergence is None
        assert waiting.history_end == (
            "history ends at position 2; the new code would next call wait_for_event "
            "'shipped' (occurrence 1, its event)")
        app.send_event("shipped", key="o-5", payload={"carrier": "ups"})
        wait_for("the flow to succeed", lambda: app.get(task_id).state is State.SUCCEEDED,
                 timeout_s=60)
    report = replay(app, task_id)
    assert report.reproduced, str(report)
    assert report.result == {"shipped": {"carrier": "ups"}, "message_id": report.result[
        "message_id"], "results": [10, 20, 30], "total": 60, "items": 5}
    assert report.positions == report.recorded_positions == 9
    with Control(app=app) as control:  # the replay submitted no child
        assert len(control.children(task_id)) == 3

    changed = replay(app, task_id, version=2)
    assert changed.divergence is not None
    assert changed.divergence.position == 1
    assert changed.divergence.recorded == "wait_for_event 'shipped' (occurrence 1, its deadline)"
    assert changed.divergence.new == ("calls wait_for_event 'delivered' (occurrence 1, its "
                                      "deadline)")


def _history(app: App, task_id: str) -> list[RecordedCheckpoint]:
    with Control(app=app) as control:
        return recorded_history(control.history(task_id))


@pytest.fixture
def lossy(tmp_path: Path) -> Iterator[CountingService]:
    with start_counting_service(tmp_path / "service.db", honour_keys=False) as svc:
        replayapp.SERVICE_URL = svc.url
        yield svc


def test_an_effect_without_a_recorded_outcome_ends_the_replay(
        ledger_url: str, lossy: CountingService) -> None:
    app = replayapp.make_app(ledger_url)
    try:
        with lossy.client() as client:
            client.set_faults(reply_lost_next=1)  # executes, then the reply is lost
        task_id = app.submit("order", {"order_id": "o-9"}, version=1).task_id
        with running_worker(app, concurrency=1):
            wait_for("the order to go UNKNOWN",
                     lambda: app.get(task_id).state is State.UNKNOWN, timeout_s=60)
        assert lossy.executions() == {"charge:o-9": 1}
        report = replay(app, task_id)
        assert report.divergence is None and not report.reproduced
        assert report.history_end == (
            "history ends at position 1 (effect 'charge' (occurrence 1) key 'charge:o-9' "
            "recorded as 'intent', without a result (its outcome is unknown to the "
            "history)); the new code would next call effect 'charge' (occurrence 1) key "
            "'charge:o-9'")
        assert report.positions == 1
        assert lossy.executions() == {"charge:o-9": 1}  # the replay called nothing
    finally:
        app.close()


async def _order_async(ctx: Any, order_id: str) -> Any:
    """``order`` version 1 as an ``async def`` body (awaitable context methods)."""
    quote = await ctx.step("quote", lambda: {"amount": 10 * len(order_id)})
    amount = int(quote["amount"])
    charge = await ctx.effect("charge", lambda k: None, key=f"charge:{order_id}",
                              params={"amount": amount})
    receipt = await ctx.step("receipt", lambda: None)
    return {"order": order_id, "amount": amount, "charge": charge, "receipt": receipt}


async def _order_async_changed(ctx: Any, order_id: str) -> Any:
    await ctx.step("quote", lambda: None)
    await ctx.sleep("wait-a-bit", 5)
    return None


def _replay_async(app: App, task_id: str, fn: Any, version: int) -> ReplayReport:
    """Replay ``task_id`` with the ``async def`` ``fn`` registered as ``order`` version
    ``version``."""
    app.task(name="order", version=version, retry=ONCE)(fn)
    return replay(app, task_id, version=version)


def test_an_async_body_is_replayed_by_the_async_context(ledger_url: str,
                                                         tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "service.db") as svc:
        replayapp.SERVICE_URL = svc.url
        app = replayapp.make_app(ledger_url)
        try:
            task_id = app.submit("order", {"order_id": "o-4"}, version=1).task_id
            with running_worker(app, concurrency=1):
                wait_for("the order to succeed",
                         lambda: app.get(task_id).state is State.SUCCEEDED, timeout_s=60)
            report = _replay_async(app, task_id, _order_async, 20)
            assert report.reproduced, str(report)
            assert report.result == app.get(task_id).result
            changed = _replay_async(app, task_id, _order_async_changed, 21)
            assert changed.divergence is not None and changed.divergence.position == 1
            assert changed.divergence.new == "calls sleep 'wait-a-bit' (occurrence 1)"
            assert svc.executions() == {"charge:o-4": 1}
        finally:
            app.close()


def test_a_history_an_async_body_recorded_replays(ledger_url: str, tmp_path: Path) -> None:
    """Recorded by the worker's event loop, replayed by the async replay context; a plain
    ``def`` version of the same code path reproduces it too."""
    with start_counting_service(tmp_path / "service.db") as svc:
        replayapp.SERVICE_URL = svc.url
        app = replayapp.make_app(ledger_url)
        try:
            app.task(name="order", version=30, retry=ONCE)(_order_async_recording)
            task_id = app.submit("order", {"order_id": "o-30"}, version=30).task_id
            with running_worker(app, concurrency=1):
                wait_for("the async order to succeed",
                         lambda: app.get(task_id).state is State.SUCCEEDED, timeout_s=60)
            before = svc.executions()
            assert before == {"charge:o-30": 1}
            report = replay(app, task_id)
            assert report.reproduced, str(report)
            assert (report.positions, report.recorded_positions) == (3, 3)
            assert replay(app, task_id, version=1).reproduced  # the sync body, same path
            changed = replay(app, task_id, version=4)
            assert changed.divergence is not None and changed.divergence.position == 1
            assert svc.executions() == before
        finally:
            app.close()


async def _order_async_recording(ctx: Any, order_id: str) -> Any:
    """``order`` version 1 as an ``async def`` body that calls the service."""
    quote = await ctx.step("quote", lambda: {"amount": 10 * len(order_id)})
    amount = int(quote["amount"])
    charge = await ctx.effect("charge", lambda k: replayapp._charge(k, amount),
                              key=f"charge:{order_id}", params={"amount": amount})
    receipt = await ctx.step("receipt", lambda: f"receipt-{order_id}")
    return {"order": order_id, "amount": amount, "charge": charge, "receipt": receipt}
