"""The HTTP API against a hostile or careless client, over real HTTP on loopback, on both
ledgers: bodies far over the payload limit are refused before parsing (also without the
token), error messages say what is wrong (the params fields, a body that is not JSON), and
an Idempotency-Key replay with another body (params, tenant, pinned version) is not
silently taken for the original, and a JSON body with a key twice is refused."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, TOKEN, api_server, bare, token_api

from ratchet import ConfigError, Control
from ratchet.web import WebSettings
from ratchet.web.limits import body_limit_bytes
from ratchet.web.serve import check_bind

MIB = 1024 * 1024


@pytest.fixture
def api(ledger_url: str) -> Iterator[httpx.Client]:
    """See :func:`apisupport.token_api`."""
    with token_api(ledger_url, timeout_s=60) as client:
        yield client


def _chunks(total: int) -> Iterator[bytes]:
    """A JSON submit body of about ``total`` bytes, streamed (no Content-Length)."""
    yield b'{"name": "web.echo", "params": {"text": "'
    sent = 0
    while sent < total:
        yield b"x" * MIB
        sent += MIB
    yield b'"}}'


def test_huge_bodies_are_refused_before_parsing(api: httpx.Client, ledger_url: str) -> None:
    limit = body_limit_bytes(MIB)  # the default payload limit
    over = b'{"name": "web.echo", "params": {"text": "' + b"x" * limit + b'"}}'
    for post in (api.post, partial(bare, api, "POST")):  # refused early, token or not
        sized = post("/tasks", content=over, headers={"Content-Type": "application/json"})
        assert sized.status_code == 413, sized.text
        assert sized.json()["error"] == "payload_too_large"
        assert "request body" in sized.json()["message"]
    streamed = api.post("/tasks", content=_chunks(limit + MIB),
                        headers={**AUTH, "Content-Type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error"] == "payload_too_large"
    # Under the body cap, over the params limit: still the ledger's own 413.
    params_over = api.post("/tasks", json={"name": "web.echo",
                                           "params": {"text": "x" * (MIB + 1)}}, headers=AUTH)
    assert params_over.status_code == 413 and "payload is" in params_over.json()["message"]
    ok = api.post("/tasks", json={"name": "web.echo", "params": {"text": "fine"}},
                  headers=AUTH)
    assert ok.status_code == 201, ok.text
    chunked = api.post("/tasks", content=iter([b'{"name": "web.echo", ', b'"params": ',
                                               b'{"text": "in pieces"}}']),
                       headers={**AUTH, "Content-Type": "application/json"})
    assert chunked.status_code == 201, chunked.text
    assert chunked.json()["task"]["params"] == {"text": "in pieces"}
    assert Control(ledger_url).status().counts == {"web.echo": {"PENDING": 2}}


def test_empty_identifier_is_called_empty(api: httpx.Client) -> None:
    empty = api.post("/resume", json={"scope": "type", "target": "", "reason": "r"},
                     headers=AUTH)
    assert empty.status_code == 422
    assert empty.json()["errors"][0] == {"field": "body.target", "message": "must not be empty"}
    nul = api.post("/resume", json={"scope": "type", "target": "a\x00b", "reason": "r"},
                   headers=AUTH)
    assert nul.status_code == 422 and "NUL" in nul.json()["errors"][0]["message"]


def test_same_key_other_tenant_or_version_is_a_conflict(api: httpx.Client,
                                                        ledger_url: str) -> None:
    """The same key and body answer the original (200); another body is a 409.
    The ledger's digest covers the name and params; the API compares the tenant and a
    pinned version with the stored task too, and names what differs."""
    def submit(key: str, **body: object) -> httpx.Response:
        return api.post("/tasks", json={"name": "web.echo", "params": {"text": "a"}, **body},
                        headers={"Idempotency-Key": key})

    first = submit("t-1")
    assert first.status_code == 201
    task_id, digest = first.json()["task_id"], first.json()["task"]["params_digest"]
    assert submit("t-1").status_code == 200
    other = submit("t-1", tenant="acme")
    assert other.status_code == 409, other.text
    err = other.json()
    assert err["error"] == "idempotency_conflict" and err["task_id"] == task_id
    assert err["existing_digest"] == err["new_digest"] == digest
    assert err["errors"] == [{"field": "body.tenant",
                              "message": "the task has tenant None, this request 'acme'"}]
    assert "tenant" in err["message"] and digest in err["message"]

    with_tenant = submit("t-2", tenant="acme")
    assert with_tenant.status_code == 201
    assert submit("t-2", tenant="acme").status_code == 200
    dropped = submit("t-2")  # the replay left the tenant out: another request
    assert dropped.status_code == 409 and dropped.json()["errors"][0]["field"] == "body.tenant"
    # delay_s cannot be compared (the task stores an absolute run_at): the original.
    later = submit("t-2", tenant="acme", delay_s=3600)
    assert later.status_code == 200
    assert later.json()["task"]["run_at"] == with_tenant.json()["task"]["run_at"]

    def pinned(version: int | None) -> httpx.Response:
        body: dict[str, object] = {"name": "web.pinned", "params": {"text": "v"}}
        if version is not None:
            body["version"] = version
        return api.post("/tasks", json=body, headers={"Idempotency-Key": "v-1"})

    v1 = pinned(1)
    assert v1.status_code == 201 and v1.json()["task"]["version"] == 1
    assert pinned(1).status_code == 200
    assert pinned(None).status_code == 200  # no version: whichever the task pinned
    v2 = pinned(2)
    assert v2.status_code == 409, v2.text
    assert v2.json()["errors"] == [{"field": "body.version",
                                    "message": "the task has version 1, this request 2"}]
    # Nothing was written by the refused requests.
    with Control(ledger_url) as control:
        assert len(control.list_tasks(limit=100).tasks) == 3
        assert control.get(task_id).tenant is None


def test_params_errors_name_the_fields_and_bad_json_says_so(api: httpx.Client) -> None:
    wrong = api.post("/tasks", json={"name": "web.echo", "params": {"text": 5, "x": 1}})
    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["errors"] == [
        {"field": "body.params.text", "message": "Input should be a valid string (got 5)"},
        {"field": "body.params.x", "message": "unknown field"}]
    assert "field 'text'" in wrong.json()["message"]
    missing = api.post("/tasks", json={"name": "web.echo", "params": {}})
    assert missing.status_code == 422
    assert missing.json()["errors"] == [{"field": "body.params.text",
                                         "message": "missing required field"}]
    for broken in (b'{"name": "web.echo", "params": {', b"[1, 2", b"{'name': 1}"):
        bad = api.post("/tasks", content=broken, headers={"Content-Type": "application/json"})
        assert bad.status_code == 422, bad.text
        [field] = bad.json()["errors"]
        assert field["field"] == "body", field
        assert field["message"].startswith("the body is not valid JSON"), field
        assert "not valid JSON" in bad.json()["message"]


DUPLICATED = {
    "/tasks": b'{"name": "web.echo", "params": {"text": "a", "text": "b"}}',
    "/tasks/{task_id}/cancel": b'{"reason": "ok", "reason": ""}',
    "/tasks/{task_id}/retry": b'{"reason": "x", "reason": "y"}',
    "/tasks/{task_id}/compensate": b'{"reason": "x", "reason": "y"}',
    "/tasks/{task_id}/fork": b'{"from_step": "a", "reason": "x", "reason": "y"}',
    "/events": b'{"name": "shipped", "key": "o-1", "payload": {"n": 1, "n": 2}}',
    "/tasks/{task_id}/resolve": b'{"outcome": "done", "result": {"id": 1, "id": 2}, '
                                b'"reason": "r"}',
    "/pauses": b'{"scope": "all", "scope": "type", "target": "web.echo", "reason": "r"}',
    "/resume": b'{"scope": "all", "reason": "r", "reason": "s"}',
    "/quarantine/{fingerprint}/replay": b'{"rate_per_s": 1, "rate_per_s": 1000, '
                                        b'"reason": "r"}',
}
"""A body with a key twice for every POST of the API (nested in params and result too)."""


def test_a_json_key_twice_is_refused_on_every_body(api: httpx.Client,
                                                   ledger_url: str) -> None:
    task_id = api.post("/tasks", json={"name": "web.echo", "params": {"text": "t"}}
                       ).json()["task_id"]
    doc = api.get("/openapi.json").json()
    assert sorted(DUPLICATED) == sorted(p for p, ops in doc["paths"].items() if "post" in ops)
    for path, body in DUPLICATED.items():
        url = path.replace("{task_id}", task_id).replace("{fingerprint}", "0123456789abcdef")
        answer = api.post(url, content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422, (path, answer.text)
        error = answer.json()
        assert error["error"] == "invalid", error
        assert error["errors"][0]["field"] == "body", error
        assert "appears twice in one object" in error["message"], error
    control = Control(ledger_url)
    assert [t.task_id for t in control.list_tasks(limit=10).tasks] == [task_id]
    assert control.pauses() == [] and control.get(task_id).state.value == "PENDING"
    control.close()
    same = api.post("/tasks", content=b'{"name": "web.echo", "params": {"text": "a"}, '
                                      b'"delay_s": 0}',
                    headers={"Content-Type": "application/json"})
    assert same.status_code == 201, same.text


def test_every_mutation_documents_the_body_cap(api: httpx.Client) -> None:
    doc = api.get("/openapi.json").json()
    over = b"{" + b" " * (body_limit_bytes(MIB) + 1) + b"}"
    posts = [path for path, ops in doc["paths"].items() if "post" in ops]
    assert len(posts) >= 7, posts
    for path in posts:
        url = path.replace("{task_id}", "t1").replace("{fingerprint}", "0123456789abcdef")
        answer = api.post(url, content=over, headers={**AUTH, "Content-Type":
                                                      "application/json"})
        assert answer.status_code == 413, (path, answer.text)
        assert "413" in doc["paths"][path]["post"]["responses"], path


@pytest.mark.parametrize("token", [" ", "secret ", "\tsecret", "secret\n"])
def test_a_token_no_client_can_present_is_refused_at_start(token: str) -> None:
    with pytest.raises(ConfigError, match="whitespace"):
        check_bind(WebSettings(api_token=token), "0.0.0.0")
    check_bind(WebSettings(api_token="secret"), "0.0.0.0")  # a usable token: fine


def _raw_post(base: str, path: str, headers: list[tuple[str, bytes]], body: bytes) -> bytes:
    """POST with header values sent as these exact bytes (httpx refuses non-ASCII)."""
    host, port = base.removeprefix("http://").split("/")[0].split(":")
    lines = [f"POST {path} HTTP/1.1".encode(), f"Host: {host}".encode(),
             b"Content-Type: application/json", f"Content-Length: {len(body)}".encode(),
             b"Connection: close", *[name.encode() + b": " + value for name, value in headers]]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_non_ascii_header_values_are_utf8(api: httpx.Client, ledger_url: str) -> None:
    base = str(api.base_url).rstrip("/")
    body = json.dumps({"name": "web.echo", "params": {"text": "u"}}).encode()
    auth = ("Authorization", f"Bearer {TOKEN}".encode())
    answer = _raw_post(base, "/api/tasks", [auth, ("Idempotency-Key",
                                                   "clé-日本".encode())], body)
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
    task_id = json.loads(answer.split(b"\r\n\r\n", 1)[1])["task_id"]
    found = api.get("/tasks", params={"key": "clé-日本"}).json()["tasks"]
    assert [t["task_id"] for t in found] == [task_id]
    # The same key from Python is the same task.
    app = make_app(ledger_url)
    assert app.submit("web.echo", {"text": "u"}, idempotency_key="clé-日本").task_id == task_id
    app.close()
    cancel = _raw_post(base, f"/api/tasks/{task_id}/cancel",
                       [auth, ("X-Ratchet-Operator", "Zoë".encode())], b'{"reason": "r"}')
    assert cancel.startswith(b"HTTP/1.1 200"), cancel[:300]
    [event] = [e for e in Control(ledger_url).inspect(task_id).events
               if e.kind == "operator_cancel"]
    assert event.detail["operator"] == "Zoë"
    not_utf8 = _raw_post(base, "/api/tasks", [auth, ("Idempotency-Key", b"\xff\xfe")], body)
    assert not_utf8.startswith(b"HTTP/1.1 422") and b"UTF-8" in not_utf8, not_utf8[:300]


def test_a_non_ascii_token_can_be_presented(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    token = "pässwörd-日本"
    settings = WebSettings(ledger_url=ledger_url, api_token=token)
    body = json.dumps({"name": "web.echo", "params": {"text": "t"}}).encode()
    with api_server(Control(app=make_app(ledger_url)), settings) as base:
        right = _raw_post(base, "/api/tasks", [("Authorization", b"Bearer " + token.encode())],
                          body)
        assert right.startswith(b"HTTP/1.1 201"), right[:300]
        wrong = _raw_post(base, "/api/tasks", [("Authorization",
                                                b"Bearer " + token.encode("latin-1", "replace"))],
                          body)
        assert wrong.startswith(b"HTTP/1.1 401"), wrong[:300]
