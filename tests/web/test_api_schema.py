"""The OpenAPI document is accurate: schemathesis (its CLI) drives the running service from
``/api/openapi.json`` and checks every answer (no 5xx, documented status codes, content
types and headers, bodies that conform to the documented schemas, schema-invalid requests
refused, every operation that declares the bearer scheme, reads included, refused without
the token: schemathesis sends it, and leaves it out for ``ignored_auth``).

The ledger holds real tasks in several states first (succeeded, failed, unknown,
quarantined, paused), and schemathesis draws task ids, task names and the quarantine
fingerprint from them part of the time, so the responses it checks carry real records, not
only 404s. Bounded: a few examples per operation, a few seconds.
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


def test_openapi_document_matches_the_service(ledger_url: str, tmp_path: Path) -> None:
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
        run = subprocess.run(
            [str(st), "--config-file", str(config), "run", f"{base}/api/openapi.json",
             "--checks", CHECKS, "--max-examples", "5", "--phases", "examples,fuzzing",
             "--header", f"Authorization: Bearer {TOKEN}", "--workers", "2",
             "--request-timeout", "20", "--report-dir", str(tmp_path / "report")],
            cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        assert "passed" in run.stdout


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
