"""The read rule of ``ratchet serve`` (:mod:`ratchet.web.auth`) over real HTTP on loopback,
on both ledgers: with a token every ``/api`` read needs it (401 without, or with a wrong
one) but the health check, the index and the OpenAPI document, and every dashboard page
needs a login (303 to ``/login``, which comes back to the page); static assets and
``/metrics`` stay open unless ``--metrics-auth``; without a token reads stay open. The
health check answers 503 while the ledger is missing and 200 once it is there."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, TOKEN, api_server, serve_process

from ratchet import ConfigError, Control
from ratchet.web import WebSettings
from ratchet.web.serve import check_bind, start_line

OPEN_API = {"/health", "/"}
"""API paths (relative to /api) that never need the token."""


@pytest.fixture
def token_service(ledger_url: str) -> Iterator[str]:
    """A service with a token and the test app on a migrated ledger; yields its base URL."""
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base:
        yield base


def _read_paths(doc: dict[str, object], task_id: str) -> list[str]:
    """Every GET path of the OpenAPI document, its path parameters filled in."""
    paths = doc["paths"]
    assert isinstance(paths, dict)
    return [path.replace("{task_id}", task_id) for path, ops in paths.items() if "get" in ops]


def test_with_a_token_every_read_needs_it(token_service: str, ledger_url: str) -> None:
    base = token_service
    doc = httpx.get(f"{base}/api/openapi.json", timeout=30).json()  # open
    created = httpx.post(f"{base}/api/tasks", headers={**AUTH, "Idempotency-Key": "sec-k1"},
                         json={"name": "web.echo", "params": {"text": "secret"}}, timeout=30)
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    reads = _read_paths(doc, task_id)
    assert {"/status", f"/tasks/{task_id}", "/tasks", "/workers", "/health"} <= set(reads)
    for path in reads:
        op = doc["paths"][path.replace(task_id, "{task_id}")]["get"]
        url = f"{base}/api{path}"
        if path in OPEN_API:
            assert "security" not in op and "401" not in op["responses"], path
            assert httpx.get(url, timeout=30).status_code == 200, path
            continue
        assert op["security"] == [{"bearer": []}] and "401" in op["responses"], path
        anonymous = httpx.get(url, timeout=30)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert anonymous.headers["www-authenticate"] == "Bearer"
        assert anonymous.json()["error"] == "unauthorized"
        assert "reads need" in anonymous.json()["message"]
        assert "secret" not in anonymous.text and task_id not in anonymous.text
        wrong = httpx.get(url, headers={"Authorization": "Bearer nope"}, timeout=30)
        assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["message"]
        assert httpx.get(url, headers=AUTH, timeout=30).status_code == 200, path
    # Unknown ids and bad queries say nothing to a client without the token either.
    assert httpx.get(f"{base}/api/tasks/nope", timeout=30).status_code == 401
    assert httpx.get(f"{base}/api/tasks?limit=0", timeout=30).status_code == 401

    index = httpx.get(f"{base}/api", timeout=30)  # no redirect, no token
    assert index.status_code == 200, index.text
    assert httpx.get(f"{base}/api/", timeout=30).json() == index.json()
    body = index.json()
    assert (body["openapi"], body["health"]) == ("/api/openapi.json", "/api/health")
    listed = {(e["method"], e["path"]): e["needs_token"] for e in body["endpoints"]}
    assert listed[("GET", "/api/health")] is False
    assert listed[("GET", "/api/tasks/{task_id}")] is True
    assert listed[("POST", "/api/tasks/{task_id}/cancel")] is True
    assert "RATCHET_API_TOKEN" in body["auth"]

    # /metrics is open by default, and carries no task id, key or params.
    metrics = httpx.get(f"{base}/metrics", timeout=30)
    assert metrics.status_code == 200 and "ratchet_ledger_tasks" in metrics.text
    for secret in (task_id, "sec-k1", "secret"):
        assert secret not in metrics.text


def test_health_says_whether_the_ledger_answers(ledger_url: str) -> None:
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(ledger_url), settings) as base:
        down = httpx.get(f"{base}/api/health", timeout=30)  # nothing migrated yet
        assert down.status_code == 503, down.text
        body = down.json()
        assert (body["status"], body["ledger"], body["schema_version"]) == (
            "error", "down", None)
        assert body["error"] == ("LedgerUnavailable (send the bearer token for the "
                                 "message)")
        detailed = httpx.get(f"{base}/api/health", headers=AUTH, timeout=30)
        assert detailed.status_code == 503
        assert detailed.json()["error"].startswith("LedgerUnavailable: no ")
        assert "ratchet migrate" in detailed.json()["error"]
        version = Control(ledger_url).migrate()
        up = httpx.get(f"{base}/api/health", timeout=30)
        assert up.status_code == 200, up.text
        body = up.json()
        assert (body["status"], body["ledger"], body["schema_version"]) == ("ok", "up",
                                                                            version)
        assert body["ledger_now"] > 0 and body["error"] is None
        assert up.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("backend", ["sqlite"])
def test_without_a_token_reads_stay_open(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base:
        doc = httpx.get(f"{base}/api/openapi.json", timeout=30).json()
        for path in _read_paths(doc, "t-none"):
            op = doc["paths"][path.replace("t-none", "{task_id}")]["get"]
            assert "security" not in op and "401" not in op["responses"], path
        assert httpx.get(f"{base}/api/status", timeout=30).status_code == 200
        assert httpx.get(f"{base}/api/health", timeout=30).json()["ledger"] == "up"
        assert "loopback" in httpx.get(f"{base}/api", timeout=30).json()["auth"]
        assert httpx.get(f"{base}/", timeout=30).status_code == 200
        assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200


def _login_target(response: httpx.Response) -> str:
    """The ``next`` of a redirect to the login page."""
    assert response.status_code == 303, response.text
    where = urlsplit(response.headers["location"])
    assert where.path == "/login", response.headers["location"]
    return parse_qs(where.query)["next"][0]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_with_a_token_every_dashboard_page_needs_a_login(token_service: str) -> None:
    base = token_service
    with httpx.Client(base_url=base, timeout=30) as client:
        created = client.post("/api/tasks", headers=AUTH,
                              json={"name": "web.echo", "params": {"text": "hidden"}})
        task_id = created.json()["task_id"]
        pages = ["/", "/tasks", f"/tasks/{task_id}", "/unknown", "/quarantine", "/pauses"]
        for page in pages:
            r = client.get(page)
            assert _login_target(r) == page, page
            assert "hidden" not in r.text and task_id not in r.text
        assert _login_target(client.get("/tasks?state=PENDING&name=web.echo")) == \
            "/tasks?state=PENDING&name=web.echo"
        assert client.get("/static/dashboard.css").status_code == 200
        login = client.get("/login")
        assert login.status_code == 200 and 'name="token"' in login.text
        assert "every page needs a login" in login.text
        # A forged session cookie is no session.
        with httpx.Client(base_url=base, timeout=30,
                          cookies={"ratchet_session": "e30." + "0" * 64}) as forger:
            assert _login_target(forger.get("/")) == "/"
        r = client.post("/login", data={"operator": "ann", "token": "wrong", "next": "/"})
        assert r.status_code == 401
        r = client.post("/login", data={"operator": "ann", "token": TOKEN,
                                        "next": f"/tasks/{task_id}"})
        assert r.status_code == 303 and r.headers["location"] == f"/tasks/{task_id}"
        for page in pages:
            shown = client.get(page)
            assert shown.status_code == 200, (page, shown.text[:300])
        assert "hidden" in client.get(f"/tasks/{task_id}").text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/").text)
        assert csrf is not None
        assert client.post("/logout", data={"csrf": csrf.group(1)}).status_code == 303
        client.cookies.clear()
        assert _login_target(client.get("/pauses")) == "/pauses"


@pytest.mark.parametrize("backend", ["sqlite"])
def test_metrics_auth_asks_for_the_token(ledger_url: str) -> None:
    with pytest.raises(ConfigError, match="--metrics-auth needs RATCHET_API_TOKEN"):
        check_bind(WebSettings(metrics_auth=True), "127.0.0.1")
    line = start_line(WebSettings(api_token="t", metrics_auth=True), "0.0.0.0", 80, "x")
    assert "/metrics needs it too" in line
    assert "reads and mutations need" in start_line(WebSettings(api_token="t"), "::", 1, "x")
    Control(ledger_url).migrate()
    with serve_process(ledger_url, "--metrics-auth") as base:
        refused = httpx.get(f"{base}/metrics", timeout=30)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "--metrics-auth" in refused.text
        wrong = httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer x"}, timeout=30)
        assert wrong.status_code == 401
        scraped = httpx.get(f"{base}/metrics", headers=AUTH, timeout=30)
        assert scraped.status_code == 200 and "ratchet_ledger_tasks" in scraped.text
        assert httpx.get(f"{base}/api/health", timeout=30).status_code == 200
