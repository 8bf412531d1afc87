"""The operator faces of workflows on both ledgers: ``Control.send_event`` /
``ratchet send-event`` (a receipt, a duplicate id delivered once, a payload that is not
JSON refused), ``Control.compensate`` / ``ratchet compensate`` (audited, ``unchanged``
outside ``FAILED``), and what ``status``, the ledger metrics and ``inspect`` show of
``WAITING`` tasks, parents and children."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import (
    App,
    Control,
    InvalidArguments,
    PayloadNotSerializable,
    PayloadTooLarge,
    PermanentError,
    RetryPolicy,
    State,
    TaskContext,
)
from ratchet.cli.main import cli
from ratchet.control import EventReceipt, TaskInfo, TaskTimeline
from ratchet.observe.ledger_metrics import render_ledger_metrics
from ratchet.testing import running_worker, wait_for


def make_app(url: str) -> App:
    """``wf.wait`` waits for the event ``shipped`` of its order and returns its payload;
    ``wf.parent`` submits ``n`` ``wf.child`` tasks (each waits for ``go`` of its own key)
    and gathers them; ``wf.fail`` fails at once."""
    app = App(url)

    @app.task(name="wf.wait")
    def wait(ctx: TaskContext, order_id: str) -> Any:
        return ctx.wait_for_event("shipped", key=order_id)

    @app.task(name="wf.child")
    def child(ctx: TaskContext, i: int) -> Any:
        return ctx.wait_for_event("go", key=f"c-{i}")

    @app.task(name="wf.parent")
    def parent(ctx: TaskContext, n: int) -> list[Any]:
        handles = ctx.submit_many("wf.child", [{"i": i} for i in range(n)])
        return ctx.gather(handles)

    @app.task(name="wf.fail", retry=RetryPolicy(max_attempts=1))
    def fail(ctx: TaskContext) -> None:
        raise PermanentError("wf.fail always fails")

    return app


@pytest.fixture
def wf_app(ledger_url: str) -> Iterator[App]:
    app = make_app(ledger_url)
    app.ledger.migrate()
    yield app
    app.close()


def _state(app: App, task_id: str, state: State) -> Any:
    def probe() -> Any:
        info = app.get(task_id)
        return info if info.state is state else None

    return wait_for(f"task {task_id} to be {state.value}", probe, timeout_s=30)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def test_send_event_receipt_duplicate_and_refusals(ledger_url: str, wf_app: App) -> None:
    with Control(ledger_url) as control:
        first = control.send_event("shipped", key="o-0", payload={"n": 1}, event_id="e-1",
                                   by="carol")
        assert isinstance(first, EventReceipt)
        assert (first.event_id, first.duplicate, first.woken) == ("e-1", False, 0)
        again = control.send_event("shipped", key="o-0", payload={"n": 1}, event_id="e-1")
        assert again.duplicate and again.seq == first.seq and again.woken == 0
        fresh = control.send_event("shipped", key="o-0")  # no id: a new one each time
        assert fresh.event_id not in ("", "e-1") and fresh.seq > first.seq
        for bad in ({"name": ""}, {"name": "a\x00b"}, {"key": ""}, {"event_id": ""},
                    {"by": ""}):
            args: dict[str, Any] = {"name": "shipped", "key": "o-0", **bad}
            name = args.pop("name")
            with pytest.raises(InvalidArguments):
                control.send_event(name, **args)
        with pytest.raises(PayloadNotSerializable):
            control.send_event("shipped", key="o-0", payload={1, 2})


def test_send_event_payload_limit(ledger_url: str, wf_app: App,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_MAX_PAYLOAD_BYTES", "64")
    with Control(ledger_url) as control:
        with pytest.raises(PayloadTooLarge):
            control.send_event("shipped", key="o-0", payload="x" * 100, event_id="big")
        # nothing was written: the id is free
        assert not control.send_event("shipped", key="o-0", event_id="big").duplicate


def test_cli_send_event(ledger_url: str, wf_app: App) -> None:
    shown = _cli("send-event", "shipped", "--key", "o-1", "--payload", '{"box": "M"}',
                 "--event-id", "ev-1", "--operator", "dave", "--ledger", ledger_url)
    assert shown.exit_code == 0, shown.output
    assert "ev-1" in shown.stdout and "woke 0 waiting task(s)" in shown.stdout
    dup = _cli("send-event", "shipped", "--key", "o-1", "--event-id", "ev-1",
               "--payload", '{"box": "M"}', "--ledger", ledger_url, "--json")
    assert dup.exit_code == 0, dup.output
    receipt = json.loads(dup.stdout)
    assert list(receipt) == [f.name for f in dataclasses.fields(EventReceipt)]
    assert receipt["event_id"] == "ev-1" and receipt["duplicate"] is True
    other = _cli("send-event", "shipped", "--key", "o-1", "--event-id", "ev-1",
                 "--payload", '{"box": "S"}', "--ledger", ledger_url)
    assert other.exit_code == 2 and "ev-1" in other.stderr
    # a payload that is not JSON: one line naming the option, status 2, nothing sent
    bad = _cli("send-event", "shipped", "--key", "o-1", "--payload", "{box: M}",
               "--event-id", "ev-2", "--ledger", ledger_url)
    assert bad.exit_code == 2
    assert bad.stderr.startswith("error: InvalidArguments: --payload is not valid JSON")
    assert "Traceback" not in bad.output
    with Control(ledger_url) as control:
        assert not control.send_event("shipped", key="o-1", event_id="ev-2").duplicate
    missing = _cli("send-event", "shipped", "--ledger", ledger_url)
    assert missing.exit_code == 2 and "--key" in missing.output


def test_an_event_wakes_a_waiting_task(ledger_url: str, wf_app: App) -> None:
    """A task WAITING for its event: status, metrics and inspect show it apart from the
    backlog and the running; ``ratchet send-event`` wakes it and its wait returns the
    payload."""
    task_id = wf_app.submit("wf.wait", {"order_id": "o-7"}).task_id
    with running_worker(wf_app, poll_interval_s=0.02):
        _state(wf_app, task_id, State.WAITING)
        with Control(ledger_url) as control:
            report = control.status()
            [view] = report.types
            assert (view.waiting, view.backlog, view.running) == (1, 0, 0)
            assert report.totals is not None and report.totals.waiting == 1
            assert control.get(task_id).waiting_for == "event shipped/o-7"
            body, _ = render_ledger_metrics(control)
        assert 'ratchet_ledger_waiting_tasks{type="wf.wait"} 1.0' in body.decode()
        assert 'ratchet_ledger_tasks{state="waiting",type="wf.wait"} 1.0' in body.decode()
        status = _cli("status", "--ledger", ledger_url)
        assert status.exit_code == 0, status.output
        assert "waiting" in status.stdout and "WAITING" in status.stdout
        inspect = _cli("inspect", task_id, "--ledger", ledger_url)
        assert inspect.exit_code == 0, inspect.output
        assert "waiting for: event shipped/o-7" in inspect.stdout
        sent = _cli("send-event", "shipped", "--key", "o-7", "--payload", '{"box": "L"}',
                    "--ledger", ledger_url, "--json")
        assert sent.exit_code == 0, sent.output
        assert json.loads(sent.stdout)["woken"] == 1
        done = _state(wf_app, task_id, State.SUCCEEDED)
    assert done.result == {"box": "L"} and done.waiting_for is None


def test_inspect_shows_parent_and_children(ledger_url: str, wf_app: App) -> None:
    parent = wf_app.submit("wf.parent", {"n": 2}).task_id
    with running_worker(wf_app, concurrency=4, poll_interval_s=0.02):
        _state(wf_app, parent, State.WAITING)
        with Control(ledger_url) as control:
            def both_waiting() -> list[TaskInfo] | None:
                kids = control.children(parent)
                waiting = len(kids) == 2 and all(c.state is State.WAITING for c in kids)
                return kids if waiting else None

            children = wait_for("both children to wait", both_waiting)
            assert [c.parent_id for c in children] == [parent, parent]
            assert sorted(c.waiting_for or "" for c in children) == [
                "event go/c-0", "event go/c-1"]
            assert control.get(parent).waiting_for == "2 children"
            view = control.inspect(parent)
            assert [c.task_id for c in view.children] == [c.task_id for c in children]
        text = _cli("inspect", parent, "--ledger", ledger_url)
        assert text.exit_code == 0, text.output
        assert "waiting for: 2 children" in text.stdout
        assert "children (2: 2 WAITING)" in text.stdout
        assert all(c.task_id in text.stdout for c in children)
        shown = json.loads(_cli("inspect", parent, "--ledger", ledger_url, "--json").stdout)
        assert list(shown) == [f.name for f in dataclasses.fields(TaskTimeline)]
        assert [c["parent_id"] for c in shown["children"]] == [parent, parent]
        child = _cli("inspect", children[0].task_id, "--ledger", ledger_url)
        assert f"parent: {parent} (wf.parent, WAITING)" in child.stdout
        for i in range(2):
            assert _cli("send-event", "go", "--key", f"c-{i}", "--payload", str(i),
                        "--ledger", ledger_url).exit_code == 0
        done = _state(wf_app, parent, State.SUCCEEDED)
    assert done.result == [0, 1]


def test_compensate_is_audited_and_refused_outside_failed(ledger_url: str,
                                                         wf_app: App) -> None:
    failed = wf_app.submit("wf.fail", {}).task_id
    later = wf_app.submit("wf.wait", {"order_id": "o-9"}, delay_s=3600).task_id
    with running_worker(wf_app, poll_interval_s=0.02):
        _state(wf_app, failed, State.FAILED)
    # not FAILED: unchanged, exit status 1, nothing moved
    result = _cli("compensate", later, "--reason", "undo", "--ledger", ledger_url)
    assert result.exit_code == 1, result.output
    assert "unchanged" in result.stdout
    with Control(ledger_url) as control:
        assert control.get(later).state is State.PENDING
        with pytest.raises(InvalidArguments):
            control.compensate(failed, reason="  ")
    result = _cli("compensate", failed, "--reason", "refund the order", "--operator",
                  "erin", "--ledger", ledger_url, "--json")
    assert result.exit_code == 0, result.output
    outcome = json.loads(result.stdout)
    assert (outcome["action"], outcome["outcome"], outcome["previous_state"]) == (
        "compensate", "done", "FAILED")
    with Control(ledger_url) as control:
        events = [e for e in control.inspect(failed).events
                  if e.kind == "operator_compensate"]
        assert [(e.detail.get("operator"), e.detail.get("reason")) for e in events] == [
            ("erin", "refund the order")]
    with running_worker(wf_app, poll_interval_s=0.02):
        _state(wf_app, failed, State.COMPENSATED)
    gone = _cli("compensate", "no-such-task", "--reason", "r", "--ledger", ledger_url)
    assert gone.exit_code == 2 and "TaskNotFound" in gone.stderr
