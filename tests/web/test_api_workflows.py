"""Workflows over real HTTP on both ledgers: ``POST /api/events`` (the
``Idempotency-Key`` is the event id: 201, then 200 for the same event; the token rule of
every mutation; bad bodies 422, a payload over the limit 413) wakes the task waiting for
it; ``POST /api/tasks/{id}/compensate`` is audited and a 409 outside ``FAILED``; the
dashboard counts ``WAITING`` tasks apart, shows a parent's children tree with their
states and what each waits for, and compensates through its form."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, api_server, bare, token_api

from ratchet import Control, State, TaskInfo
from ratchet.testing import running_worker, wait_for
from ratchet.web import WebSettings
from ratchet.web.present import ChildNode, child_tree

pytestmark = pytest.mark.timeout(120)

OPERATOR = {"X-Ratchet-Operator": "alice"}


@pytest.fixture
def api(ledger_url: str) -> Iterator[httpx.Client]:
    """See :func:`apisupport.token_api`."""
    with token_api(ledger_url, timeout_s=30) as client:
        yield client


def _state(control: Control, task_id: str, state: State) -> TaskInfo:
    def probe() -> TaskInfo | None:
        info = control.get(task_id)
        return info if info.state is state else None

    return wait_for(f"task {task_id} to be {state.value}", probe, timeout_s=30)


def _submit(api: httpx.Client, name: str, params: dict[str, Any]) -> str:
    r = api.post("/tasks", json={"name": name, "params": params})
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


def test_events_wake_the_waiting_task(api: httpx.Client, ledger_url: str) -> None:
    control = Control(ledger_url)
    waiting = _submit(api, "web.await", {"order_id": "o-1"})
    with running_worker(make_app(ledger_url), poll_interval_s=0.02):
        _state(control, waiting, State.WAITING)
        shown = api.get(f"/tasks/{waiting}").json()
        assert shown["task"]["waiting_for"] == "event shipped/o-1"
        assert shown["task"]["parent_id"] is None and shown["children"] == []
        status = api.get("/status").json()
        assert status["totals"]["waiting"] == 1 and status["totals"]["backlog"] == 0

        body = {"name": "shipped", "key": "o-1", "payload": {"box": "M"}}
        anonymous = bare(api, "POST", "/events", json=body,
                         headers={"Idempotency-Key": "ev-1"})
        assert anonymous.status_code == 401
        assert control.get(waiting).state is State.WAITING  # nothing sent
        sent = api.post("/events", json=body,
                        headers={**AUTH, **OPERATOR, "Idempotency-Key": "ev-1"})
        assert sent.status_code == 201, sent.text
        receipt = sent.json()
        assert (receipt["event_id"], receipt["duplicate"], receipt["woken"]) == (
            "ev-1", False, 1)
        done = _state(control, waiting, State.SUCCEEDED)
        assert done.result == {"box": "M"}
        again = api.post("/events", json=body, headers={**AUTH, "Idempotency-Key": "ev-1"})
        assert again.status_code == 200, again.text
        assert again.json()["duplicate"] is True and again.json()["seq"] == receipt["seq"]
        assert again.json()["woken"] == 0
        # the same id for another event: refused, naming it
        other = api.post("/events", json={**body, "payload": {"box": "S"}},
                         headers={"Idempotency-Key": "ev-1"})
        assert other.status_code == 422 and "ev-1" in other.json()["message"]
        # without a key: a new event each time
        first = api.post("/events", json={"name": "shipped", "key": "o-2"})
        second = api.post("/events", json={"name": "shipped", "key": "o-2"})
        assert first.status_code == second.status_code == 201
        assert first.json()["event_id"] != second.json()["event_id"]
    control.close()


@pytest.mark.parametrize(("body", "field"), [
    ({"key": "o-1"}, "body.name"),
    ({"name": "shipped"}, "body.key"),
    ({"name": "", "key": "o-1"}, "body.name"),
    ({"name": "shipped", "key": "o-1", "extra": 1}, "body.extra"),
    ({"name": "a\x00b", "key": "o-1"}, "body.name"),
])
def test_events_refuse_bad_bodies(api: httpx.Client, body: dict[str, Any],
                                  field: str) -> None:
    r = api.post("/events", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid"
    assert field in [e["field"] for e in r.json()["errors"]]


def test_event_payload_over_the_limit(ledger_url: str,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_MAX_PAYLOAD_BYTES", "100")
    Control(ledger_url).migrate()
    with api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base, \
            httpx.Client(base_url=f"{base}/api", timeout=30) as api:
        big = api.post("/events", json={"name": "shipped", "key": "o-1",
                                         "payload": "x" * 200},
                       headers={"Idempotency-Key": "big"})
        assert big.status_code == 413 and big.json()["error"] == "payload_too_large"
        small = api.post("/events", json={"name": "shipped", "key": "o-1"},
                         headers={"Idempotency-Key": "big"})
        assert small.status_code == 201  # the refused one wrote nothing


def test_compensate_over_http(api: httpx.Client, ledger_url: str) -> None:
    control = Control(ledger_url)
    failing = _submit(api, "web.fail", {})
    echo = _submit(api, "web.echo", {"text": "hi"})
    with running_worker(make_app(ledger_url), poll_interval_s=0.02):
        _state(control, failing, State.FAILED)
        _state(control, echo, State.SUCCEEDED)
        anonymous = bare(api, "POST", f"/tasks/{failing}/compensate", json={"reason": "x"})
        assert anonymous.status_code == 401
        no_reason = api.post(f"/tasks/{failing}/compensate", json={"reason": " "})
        assert no_reason.status_code == 422
        wrong = api.post(f"/tasks/{echo}/compensate", json={"reason": "undo"})
        assert wrong.status_code == 409
        assert (wrong.json()["error"], wrong.json()["state"]) == ("wrong_state", "SUCCEEDED")
        missing = api.post("/tasks/nope/compensate", json={"reason": "undo"})
        assert missing.status_code == 404
        done = api.post(f"/tasks/{failing}/compensate", json={"reason": "refund"},
                        headers={**AUTH, **OPERATOR})
        assert done.status_code == 200, done.text
        assert (done.json()["action"], done.json()["outcome"]) == ("compensate", "done")
        _state(control, failing, State.COMPENSATED)
    [event] = [e for e in control.inspect(failing).events if e.kind == "operator_compensate"]
    assert (event.detail["operator"], event.detail["reason"]) == ("alice", "refund")
    control.close()


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_dashboard_children_tree_waiting_and_compensate(ledger_url: str) -> None:
    app = make_app(ledger_url)
    app.ledger.migrate()
    control = Control(ledger_url)
    try:
        with running_worker(app, concurrency=4, poll_interval_s=0.02), \
                api_server(Control(app=make_app(ledger_url)),
                           WebSettings(ledger_url=ledger_url)) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            parent = app.submit("web.fanout", {"n": 2}).task_id
            failing = app.submit("web.fail", {}).task_id
            _state(control, parent, State.WAITING)
            _state(control, failing, State.FAILED)
            def both_waiting() -> list[TaskInfo] | None:
                found = control.children(parent)
                waiting = len(found) == 2 and all(c.state is State.WAITING for c in found)
                return found if waiting else None

            kids = wait_for("both children to wait", both_waiting)
            overview = client.get("/").text
            row = re.search(r'data-type="web.await".*?</tr>', overview, re.S)
            assert row and re.search(r'data-state="WAITING">(<a [^>]*>)?2<', row.group(0))
            page = client.get(f"/tasks/{parent}").text
            assert 'id="children"' in page and "2 WAITING" in page
            assert 'id="task-waiting-for"' in page and "2 children" in page
            for kid in kids:
                assert f'data-task="{kid.task_id}"' in page
                assert f"event shipped/{kid.params['order_id']}" in page
            child_page = client.get(f"/tasks/{kids[0].task_id}").text
            assert f'href="/tasks/{parent}"' in child_page

            page = client.get(f"/tasks/{failing}").text
            assert 'action="/actions/compensate"' not in page  # not logged in: no form
            assert client.post("/login", data={"operator": "gina"}).status_code == 303
            page = client.get(f"/tasks/{failing}").text
            assert 'id="compensate-form"' in page
            r = client.post("/actions/compensate", data={
                "task_id": failing, "reason": "undo it", "csrf": _csrf(page)})
            assert r.status_code == 303 and r.headers["location"] == f"/tasks/{failing}"
            _state(control, failing, State.COMPENSATED)
            [event] = [e for e in control.inspect(failing).events
                       if e.kind == "operator_compensate"]
            assert (event.detail["operator"], event.detail["reason"]) == ("gina", "undo it")
            for i in range(2):
                control.send_event("shipped", key=f"f-{i}", payload=i)
            assert _state(control, parent, State.SUCCEEDED).result == [0, 1]
    finally:
        control.close()
        app.close()


def _task(task_id: str) -> TaskInfo:
    return TaskInfo(task_id=task_id, name="t", version=1, state=State.PENDING, generation=1,
                    attempt=0, max_attempts=1, holder=None, lease_until=None, run_at=0.0,
                    created_at=0.0, updated_at=0.0, idempotency_key=None, params={},
                    params_digest="", result=None, last_error=None, error_class=None)


def test_child_tree_reads_level_by_level_within_its_bounds() -> None:
    """Every child before any grandchild; at most ``max_nodes`` tasks and ``max_depth``
    levels, the rest counted or marked unread."""
    below = {"a": ["a1", "a2"], "b": ["b1"], "a1": ["a11"], "a11": ["a111"]}
    reads: list[str] = []

    def read(task_id: str) -> list[TaskInfo]:
        reads.append(task_id)
        return [_task(t) for t in below.get(task_id, [])]

    def shape(nodes: list[ChildNode]) -> list[Any]:
        return [(n.task.task_id, shape(n.children), n.hidden, n.unread) for n in nodes]

    tree, hidden = child_tree([_task("a"), _task("b")], read, max_depth=3, max_nodes=100)
    assert hidden == 0 and reads[:2] == ["a", "b"]
    assert shape(tree) == [
        ("a", [("a1", [("a11", [], 0, True)], 0, False), ("a2", [], 0, False)], 0, False),
        ("b", [("b1", [], 0, False)], 0, False)]
    tree, hidden = child_tree([_task("a"), _task("b"), _task("c")], read, max_nodes=2)
    assert hidden == 1 and shape(tree) == [("a", [], 0, True), ("b", [], 0, True)]
    tree, hidden = child_tree([_task("a")], read, max_nodes=2)
    assert hidden == 0 and shape(tree) == [("a", [("a1", [], 0, True)], 1, False)]
