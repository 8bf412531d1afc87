"""The OpenAPI document is accurate: schemathesis (its CLI) drives the running service from
``/api/openapi.json`` and checks every answer (no 5xx, documented status codes, content
types and headers, bodies that conform to the documented schemas, schema-invalid requests
refused, every operation that declares the bearer scheme, reads included, refused without
the token: schemathesis sends it, and leaves it out for ``ignored_auth``).

The ledger holds real tasks in several states first (succeeded, failed, unknown,
quarantined, paused), and schemathesis draws task ids, task names and the quarantine
fingerprint from them part of the time, so the responses it checks carry real records, not
only 404s. Bounded: five examples per operation in schemathesis' deterministic mode (the
same cases every run), a few seconds; the ``fuzz``-marked test, left out of the default
run, goes wide and random for four minutes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, TOKEN, api_server

from ratchet import Control, State
from ratchet.testing import running_worker
from ratchet.testing.processes import clean_env, wait_for
from ratchet.web import WebSettings

CHECKS = ",".join([
    "not_a_server_error", "status_code_conformance", "content_type_conformance",
    "response_headers_conformance", "response_schema_conformance",
    "negative_data_rejection", "ignored_auth",
])


def _populate(base: str, ledger_url: str) -> tuple[list[str], str]:
    """Tasks in several states; returns their ids and the quarantine fingerprint."""
    control = Control(ledger_url)
    with httpx.Client(base_url=f"{base}/api", headers=AUTH, timeout=30) as api:
        def submit(name: str, params: dict[str, object]) -> str:
            r = api.post("/tasks", json={"name": name, "params": params})
            assert r.status_code == 201, r.text
            return str(r.json()["task_id"])

        ids = [submit("web.echo", {"text": "a"}), submit("web.fail", {}),
               submit("web.unknown", {"order_id": "o-1"}), submit("web.poison", {}),
               submit("web.poison", {})]
        with running_worker(make_app(ledger_url)):
            wait_for("tasks to settle", lambda: [t.state for t in control.get_many(ids)
                                                 if t.state in (State.PENDING, State.RUNNING,
                                                                State.RETRY_WAIT)] == [])
        ids.append(submit("web.echo", {"text": "later"}))
        assert api.post("/pauses", json={"scope": "type", "target": "web.echo",
                                         "reason": "schema test"}).status_code == 200
    [group] = control.quarantine_list()
    control.close()
    return ids, group.fingerprint


def _schemathesis(base: str, tmp_path: Path, ids: list[str], fingerprint: str,
                  *options: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """Run schemathesis' CLI against ``base``'s OpenAPI document with ``options``; the
    token is sent (``ignored_auth`` leaves it out), task ids, task names and the
    fingerprint are drawn from the ledger part of the time."""
    config = tmp_path / "schemathesis.toml"
    config.write_text("\n".join([
        "[dictionaries.task_ids]", f"values = {json.dumps(ids)}",
        "[dictionaries.task_names]",
        'values = ["web.echo", "web.fail", "web.unknown", "web.poison"]',
        "[dictionaries.fingerprints]", f"values = {json.dumps([fingerprint])}",
        "[parameters]",
        '"path.task_id" = { dictionary = "task_ids", probability = 0.7 }',
        '"body.name" = { dictionary = "task_names", probability = 0.7 }',
        '"path.fingerprint" = { dictionary = "fingerprints", probability = 0.7 }',
    ]) + "\n")
    st = Path(sys.executable).with_name("schemathesis")
    return subprocess.run(
        [str(st), "--config-file", str(config), "run", f"{base}/api/openapi.json",
         "--checks", CHECKS, "--header", f"Authorization: Bearer {TOKEN}",
         "--request-timeout", "20", "--report-dir", str(tmp_path / "report"), *options],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=timeout_s)


def test_openapi_document_matches_the_service(ledger_url: str, tmp_path: Path) -> None:
    """Deterministic (a fixed seed): the same cases every run, so the verdict is the
    document's, not the draw's; :func:`test_fuzz_the_api_against_its_document` goes
    wider."""
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base:
        doc = httpx.get(f"{base}/api/openapi.json").json()
        assert doc["servers"] == [{"url": "/api"}]
        assert "/tasks/{task_id}/resolve" in doc["paths"]
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        for path, ops in doc["paths"].items():  # reads too; not the health check, the index
            for method, op in ops.items():
                secured = path not in ("/health", "/")
                assert ("security" in op) is secured, (method, path)
                assert ("401" in op["responses"]) is secured, (method, path)

        ids, fingerprint = _populate(base, ledger_url)
        run = _schemathesis(base, tmp_path, ids, fingerprint, "--max-examples", "5",
                            "--phases", "examples,fuzzing", "--generation-deterministic",
                            "--workers", "1")
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        assert "passed" in run.stdout


@pytest.mark.fuzz
@pytest.mark.timeout(480)
def test_fuzz_the_api_against_its_document(ledger_url: str, tmp_path: Path) -> None:
    """Wider and random (``./scripts/test -m fuzz tests/web``): every phase, stateful
    sequences included, many examples per operation, a new seed each run (printed by
    schemathesis: rerun a failure with ``--seed``)."""
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base:
        ids, fingerprint = _populate(base, ledger_url)
        run = _schemathesis(base, tmp_path, ids, fingerprint, "--max-examples", "200",
                            "--phases", "examples,coverage,fuzzing,stateful",
                            "--continue-on-failure", "--workers", "1", "--max-time", "240",
                            timeout_s=420)
        assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-2000:]
        assert "passed" in run.stdout


@pytest.mark.parametrize("backend", ["sqlite"])
def test_answers_outside_the_routes_are_documented(ledger_url: str) -> None:
    """What no route decides is in the document too: the router's 404 for a path
    parameter that is empty or holds '/', the 400 of a Host the service does not answer
    to, the 408 and 413 of the body caps on every POST."""
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(ledger_url), settings) as base, \
            httpx.Client(base_url=f"{base}/api", headers=AUTH, timeout=30) as api:
        doc = api.get("/openapi.json").json()
        for path, ops in doc["paths"].items():
            for method, op in ops.items():
                codes = set(op["responses"])
                assert op["responses"]["400"]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorBody"}, (method, path)
                if "{" in path:
                    assert "404" in codes, (method, path)
                if method == "post":
                    assert {"408", "413", "422"} <= codes, (method, path)
        for url in ("/quarantine//replay", "/quarantine/%2F/replay", "/tasks//cancel"):
            answer = api.post(url, json={"reason": "r", "rate_per_s": 1})
            assert answer.status_code == 404, (url, answer.text)
            assert answer.json()["error"] == "not_found"
        host = api.get("/status", headers={"Host": "elsewhere.example"})
        assert host.status_code == 400 and host.headers["content-type"].startswith(
            "application/json")
        assert host.json()["error"] == "host_not_allowed"
        odd = api.post("/quarantine/..x/replay", json={"reason": "r", "rate_per_s": 1})
        assert odd.status_code == 422
        assert odd.json()["errors"] == [{"field": "path.fingerprint", "message":
                                         "must be the 16 hex digits GET /api/quarantine "
                                         "lists"}]


@pytest.mark.parametrize("backend", ["sqlite"])
def test_openapi_document_without_a_token_declares_no_security(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base:
        doc = httpx.get(f"{base}/api/openapi.json").json()
        assert "securitySchemes" not in doc.get("components", {})
        cancel = doc["paths"]["/tasks/{task_id}/cancel"]["post"]
        assert "security" not in cancel
        assert {p["name"] for p in cancel["parameters"]} == {"task_id", "X-Ratchet-Operator"}
        status = doc["paths"]["/status"]["get"]
        assert "security" not in status and "401" not in status["responses"]
