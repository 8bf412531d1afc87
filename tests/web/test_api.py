"""The JSON HTTP API (``ratchet serve``) over real HTTP on loopback, on both ledgers: submit
with ``Idempotency-Key``, a worker runs the task and GET shows its timeline, every operator
action changes the ledger and is audited with the operator and the reason, the token rule,
and two replicas racing one key."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, TOKEN, api_server, bare, serve_process, token_api

from ratchet import Control, State
from ratchet.testing import running_worker
from ratchet.testing.processes import wait_for
from ratchet.web import WebSettings

OPERATOR = {"X-Ratchet-Operator": "alice"}


@pytest.fixture
def api(ledger_url: str) -> Iterator[httpx.Client]:
    """See :func:`apisupport.token_api`."""
    with token_api(ledger_url, timeout_s=30) as client:
        yield client


def _submit(api: httpx.Client, name: str, params: dict[str, Any] | None = None,
            key: str | None = None, **extra: Any) -> httpx.Response:
    headers = {**AUTH, **({"Idempotency-Key": key} if key else {})}
    return api.post("/tasks", json={"name": name, "params": params or {}, **extra},
                    headers=headers)


def _events(ledger_url: str, task_id: str, kind: str) -> list[dict[str, Any]]:
    with Control(ledger_url) as control:
        return [e.detail for e in control.inspect(task_id).events if e.kind == kind]


def test_submit_idempotency_worker_and_timeline(api: httpx.Client, ledger_url: str) -> None:
    body = {"name": "web.echo", "params": {"text": "hi"}}
    refused = bare(api, "POST", "/tasks", json=body, headers={"Idempotency-Key": "order-1"})
    assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = api.post("/tasks", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["message"]

    first = _submit(api, "web.echo", {"text": "hi"}, key="order-1")
    assert first.status_code == 201, first.text
    task_id = first.json()["task_id"]
    assert first.json()["created"] is True and first.json()["task"]["state"] == "PENDING"
    again = _submit(api, "web.echo", {"text": "hi"}, key="order-1")
    assert again.status_code == 200 and again.json()["task_id"] == task_id
    assert again.json()["created"] is False

    clash = _submit(api, "web.echo", {"text": "other"}, key="order-1")
    assert clash.status_code == 409
    err = clash.json()
    stored = first.json()["task"]["params_digest"]
    assert err["error"] == "idempotency_conflict" and err["task_id"] == task_id
    assert err["existing_digest"] == stored and err["new_digest"].startswith("sha256:")
    assert err["new_digest"] != stored
    assert stored in err["message"] and err["new_digest"] in err["message"]
    assert Control(ledger_url).status().idempotency_conflicts == 1

    with running_worker(make_app(ledger_url)):
        wait_for("the task to succeed", lambda: api.get(f"/tasks/{task_id}").json()
                 ["task"]["state"] == "SUCCEEDED")
    view = api.get(f"/tasks/{task_id}").json()
    assert view["task"]["result"] == {"echo": "hi"}
    assert [s["name"] for s in view["steps"]] == ["echo"]
    kinds = [e["kind"] for e in view["events"]]
    assert "claim" in kinds, kinds

    page = api.get("/tasks", params={"state": "SUCCEEDED", "type": "web.echo"}).json()
    assert [t["task_id"] for t in page["tasks"]] == [task_id]
    assert api.get("/tasks", params={"key": "order-1"}).json()["tasks"][0]["task_id"] == task_id
    assert api.get("/tasks", params={"state": "FAILED"}).json()["tasks"] == []


def test_list_pages_and_errors(api: httpx.Client) -> None:
    ids = [_submit(api, "web.echo", {"text": str(i)}).json()["task_id"] for i in range(3)]
    seen: list[str] = []
    cursor = None
    while True:
        page = api.get("/tasks", params={"limit": 2, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200
        seen += [t["task_id"] for t in page.json()["tasks"]]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)

    missing = api.get("/tasks/no-such-task")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    bad = api.get("/tasks", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.limit"
    bad_state = api.get("/tasks", params={"state": "BOGUS"})
    assert bad_state.status_code == 422 and bad_state.json()["errors"][0]["field"] == \
        "query.state.0"
    cursor_bad = api.get("/tasks", params={"cursor": "nonsense"})
    assert cursor_bad.status_code == 422 and "cursor" in cursor_bad.json()["message"]
    unknown = _submit(api, "web.nope")
    assert unknown.status_code == 422 and unknown.json()["errors"][0]["field"] == "body.name"
    params_bad = _submit(api, "web.echo", {"text": 5})
    assert params_bad.status_code == 422 and "text" in params_bad.json()["message"]
    large = _submit(api, "web.echo", {"text": "x" * (1024 * 1024 + 1)})
    assert large.status_code == 413 and large.json()["error"] == "payload_too_large"
    extra = _submit(api, "web.echo", {"text": "x"}, colour="red")
    assert extra.status_code == 422 and extra.json()["errors"][0]["field"] == "body.colour"
    no_reason = api.post(f"/tasks/{ids[0]}/cancel", json={}, headers=AUTH)
    assert no_reason.status_code == 422
    assert no_reason.json()["errors"][0]["field"] == "body.reason"
    blank = api.post(f"/tasks/{ids[0]}/cancel", json={"reason": "  "}, headers=AUTH)
    assert blank.status_code == 422 and "must say why" in blank.json()["message"]
    not_json = api.post(f"/tasks/{ids[0]}/cancel", content=b"\xff\xfe",
                        headers={**AUTH, "Content-Type": "application/json"})
    assert not_json.status_code == 422
    assert api.post("/tasks/x/cancel", json={"reason": "r"}, headers=AUTH).status_code == 404
    for task_id in ids:  # nothing was cancelled by the refused requests
        assert api.get(f"/tasks/{task_id}").json()["task"]["state"] == "PENDING"


def test_operator_actions_change_the_ledger_and_are_audited(
        api: httpx.Client, ledger_url: str) -> None:
    control = Control(ledger_url)
    # cancel: a task scheduled for later is CANCELLED at once.
    later = _submit(api, "web.echo", {"text": "later"}, delay_s=3600).json()["task_id"]
    unauth = bare(api, "POST", f"/tasks/{later}/cancel", json={"reason": "mistake"})
    assert unauth.status_code == 401
    assert control.get(later).state is State.PENDING
    done = api.post(f"/tasks/{later}/cancel", json={"reason": "mistake"},
                    headers={**AUTH, **OPERATOR})
    assert done.status_code == 200 and done.json()["outcome"] == "done"
    assert control.get(later).state is State.CANCELLED
    assert {"operator": "alice", "reason": "mistake"}.items() <= \
        _events(ledger_url, later, "operator_cancel")[0].items()
    again = api.post(f"/tasks/{later}/cancel", json={"reason": "twice"}, headers=AUTH)
    assert again.status_code == 409 and again.json()["state"] == "CANCELLED"

    # pause a type, then resume it: audited pause records.
    paused = api.post("/pauses", json={"scope": "type", "target": "web.echo",
                                       "reason": "PSP incident"}, headers={**AUTH, **OPERATOR})
    assert paused.status_code == 200 and paused.json()["outcome"] == "done", paused.text
    [record] = control.pauses()
    assert (record.scope, record.target, record.paused_by, record.reason) == (
        "type", "web.echo", "alice", "PSP incident")
    assert api.get("/pauses").json()[0]["paused_by"] == "alice"

    failing = _submit(api, "web.fail").json()["task_id"]
    unknown = _submit(api, "web.unknown", {"order_id": "o-7"}).json()["task_id"]
    poison = [_submit(api, "web.poison").json()["task_id"] for _ in range(2)]
    echo = _submit(api, "web.echo", {"text": "held"}).json()["task_id"]
    with running_worker(make_app(ledger_url)):
        wait_for("web.fail to fail", lambda: control.get(failing).state is State.FAILED)
        wait_for("web.unknown to be UNKNOWN",
                 lambda: control.get(unknown).state is State.UNKNOWN)
        wait_for("both poison tasks quarantined", lambda: control.quarantine_list()
                 and control.quarantine_list()[0].count == 2)
        assert control.get(echo).state is State.PENDING  # its type is paused

        resumed = api.post("/resume", json={"scope": "type", "target": "web.echo",
                                            "reason": "PSP back"},
                           headers={**AUTH, "X-Ratchet-Operator": "bob"})
        assert resumed.status_code == 200 and resumed.json()["outcome"] == "done"
        assert control.pauses() == []
        wait_for("the held task to run", lambda: control.get(echo).state is State.SUCCEEDED)

        # retry: the FAILED task runs again (a fresh attempt, generation + 1), audited.
        before = control.get(failing).generation
        retried = api.post(f"/tasks/{failing}/retry", json={"reason": "downstream fixed"},
                           headers={**AUTH, **OPERATOR})
        assert retried.status_code == 200 and retried.json()["outcome"] == "done"
        assert retried.json()["generation"] > before
        assert _events(ledger_url, failing, "operator_retry")[0]["operator"] == "alice"
        wrong = api.post(f"/tasks/{echo}/retry", json={"reason": "why not"}, headers=AUTH)
        assert wrong.status_code == 409 and wrong.json()["error"] == "wrong_state"

        # resolve: the UNKNOWN task's effect was done; the task resumes and succeeds.
        not_unknown = api.post(f"/tasks/{echo}/resolve",
                               json={"outcome": "done", "reason": "r"}, headers=AUTH)
        assert not_unknown.status_code == 409
        assert (not_unknown.json()["task_id"], not_unknown.json()["state"]) == (echo, "SUCCEEDED")
        resolved = api.post(f"/tasks/{unknown}/resolve",
                            json={"outcome": "done", "result": {"sent": True},
                                  "reason": "seen at the PSP"}, headers={**AUTH, **OPERATOR})
        assert resolved.status_code == 200, resolved.text
        wait_for("the resolved task to succeed",
                 lambda: control.get(unknown).state is State.SUCCEEDED)
        assert control.get(unknown).result == {"sent": True}
        detail = _events(ledger_url, unknown, "operator_resolve")[0]
        assert (detail["operator"], detail["reason"], detail["outcome"]) == (
            "alice", "seen at the PSP", "done")

        # quarantine replay: a dry run changes nothing; the replay re-queues both, audited.
        [group] = api.get("/quarantine").json()
        assert sorted(group["task_ids"]) == sorted(poison)
        fp = group["fingerprint"]
        dry = api.post(f"/quarantine/{fp}/replay", json={"rate_per_s": 100, "dry_run": True},
                       headers=AUTH)
        assert dry.status_code == 200 and len(dry.json()["tasks"]) == 2
        assert all(_events(ledger_url, t, "operator_replay") == [] for t in poison)
        no_why = api.post(f"/quarantine/{fp}/replay", json={"rate_per_s": 100}, headers=AUTH)
        assert no_why.status_code == 422 and "reason" in no_why.json()["message"]
        replay = api.post(f"/quarantine/{fp}/replay",
                          json={"rate_per_s": 100, "reason": "input fixed"},
                          headers={**AUTH, **OPERATOR})
        assert replay.status_code == 200 and replay.json()["operator"] == "alice"
        for task_id in poison:
            [event] = _events(ledger_url, task_id, "operator_replay")
            assert (event["operator"], event["reason"]) == ("alice", "input fixed")
    # A default operator names the peer when the header is absent.
    pause_all = api.post("/pauses", json={"scope": "all", "reason": "maintenance"},
                         headers=AUTH)
    assert pause_all.status_code == 200
    assert control.pauses()[0].paused_by == "api@127.0.0.1"
    control.close()


def test_without_a_token_loopback_mutations_need_none(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base, \
            httpx.Client(base_url=f"{base}/api", timeout=30) as api:
        later = api.post("/pauses", json={"scope": "all", "reason": "loopback"})
        assert later.status_code == 200, later.text
        assert Control(ledger_url).pauses()[0].reason == "loopback"
        # Without --app: submitting is refused, naming the fix; nothing is written.
        refused = api.post("/tasks", json={"name": "web.echo", "params": {"text": "x"}})
        assert refused.status_code == 403 and "--app" in refused.json()["message"]
        assert api.get("/tasks").json()["tasks"] == []
        doc = api.get("/openapi.json").json()
        assert "securitySchemes" not in doc.get("components", {})


def test_two_replicas_racing_one_key_make_one_task(ledger_url: str) -> None:
    """A replica in this process and a ``ratchet serve`` subprocess, on one ledger, each
    sent the same Idempotency-Key by several threads at once: one task, one 201."""
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base_a, \
            serve_process(ledger_url) as base_b:
        bases = [base_a, base_b]
        for base in bases:  # both answer before the race starts
            wait_for(f"{base} to answer", lambda b=base: httpx.get(
                f"{b}/api/health", timeout=10).is_success)
        start = threading.Barrier(8)
        answers: list[httpx.Response] = []
        lock = threading.Lock()

        def post(i: int) -> None:
            start.wait()
            r = httpx.post(f"{bases[i % 2]}/api/tasks", timeout=30,
                           json={"name": "web.echo", "params": {"text": "race"}},
                           headers={**AUTH, "Idempotency-Key": "race-1"})
            with lock:
                answers.append(r)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 8, [a.text for a in answers]
        assert sorted(a.status_code for a in answers) == [200] * 7 + [201], \
            [a.text for a in answers]
        assert len({a.json()["task_id"] for a in answers}) == 1
        assert len(Control(ledger_url).list_tasks(key="race-1").tasks) == 1

        # Concurrent requests on one replica's threadpool: distinct keys, reads between.
        def burst(i: int) -> httpx.Response:
            if i % 3 == 0:
                return httpx.get(f"{base_a}/api/status", headers=AUTH, timeout=30)
            return httpx.post(f"{base_a}/api/tasks", timeout=30,
                              json={"name": "web.echo", "params": {"text": f"b{i}"}},
                              headers={**AUTH, "Idempotency-Key": f"burst-{i}"})

        results: list[httpx.Response] = []
        workers = [threading.Thread(target=lambda i=i: results.append(burst(i)))
                   for i in range(24)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(60)
        assert len(results) == 24 and all(r.is_success for r in results), \
            [r.text for r in results if not r.is_success]
        assert len(Control(ledger_url).list_tasks(limit=100).tasks) == 1 + 16
