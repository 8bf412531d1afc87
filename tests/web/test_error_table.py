"""The API and the dashboard answer the same error with the same status and code (the row of
:data:`ratchet.errors.ERROR_TABLE`: the API's ``ErrorBody.error``, the dashboard's
``X-Ratchet-Error`` header), over real HTTP on real ledgers: an unknown task id, a bad
cursor, a resolve of a task that is not ``UNKNOWN``, a ledger whose schema is too old, a
corrupt ledger. An unknown task name or version is told apart by ``UnknownTask.version``,
not by its message."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from api_app import make_app
from apisupport import api_server
from corruptsupport import damage_task_pages

from ratchet import Control
from ratchet.config import parse_ledger_url
from ratchet.errors import ERROR_TABLE, LedgerCorrupt, SchemaTooOld, TaskNotFound
from ratchet.ledger.migrations import load_migrations, split_statements
from ratchet.web import WebSettings
from ratchet.web.dashboard import ERROR_HEADER

pytestmark = pytest.mark.timeout(120)

MISSING = "0" * 32
"""A task id no ledger holds."""


@contextmanager
def _service(control: Control, url: str) -> Iterator[httpx.Client]:
    """A loopback service (no token: reads open, loopback mutates) around ``control``."""
    with api_server(control, WebSettings(ledger_url=url)) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        yield client


def _api(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]


def _page(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.headers.get(ERROR_HEADER, "")


def _login(client: httpx.Client) -> str:
    """Log in as ``op``; the CSRF token of the session."""
    assert client.post("/login", data={"operator": "op"}).status_code == 303
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/pauses").text)
    assert found
    return found.group(1)


def test_request_errors_answer_alike(ledger_url: str) -> None:
    """Unknown task (404 ``not_found``), bad cursor (422 ``invalid``), resolve of a
    ``PENDING`` task (409 ``wrong_state``): the same on both faces."""
    app = make_app(ledger_url)
    tid = app.submit("web.echo", {"text": "x"}).task_id  # no worker: stays PENDING
    with _service(Control(app=app), ledger_url) as client:
        expected = ERROR_TABLE[TaskNotFound]
        assert _api(client.get(f"/api/tasks/{MISSING}")) == \
            _page(client.get(f"/tasks/{MISSING}")) == (expected.http_status, expected.code)
        assert _api(client.get("/api/tasks", params={"cursor": "nonsense"})) == \
            _page(client.get("/tasks", params={"cursor": "nonsense"})) == (422, "invalid")
        api = client.post(f"/api/tasks/{tid}/resolve",
                          json={"outcome": "done", "reason": "check"})
        csrf = _login(client)
        page = client.post("/actions/resolve", data={
            "task_id": tid, "outcome": "done", "reason": "check", "back": "task",
            "csrf": csrf})
        assert _api(api) == _page(page) == (409, "wrong_state"), (api.text, page.text)
    app.close()


def test_unknown_name_and_unknown_version_name_their_field(ledger_url: str) -> None:
    app = make_app(ledger_url)
    with _service(Control(app=app), ledger_url) as client:
        name = client.post("/api/tasks", json={"name": "web.nope", "params": {}})
        version = client.post("/api/tasks", json={"name": "web.pinned", "version": 9,
                                                  "params": {"text": "x"}})
        assert _api(name) == _api(version) == (422, "invalid")
        assert [e["field"] for e in name.json()["errors"]] == ["body.name"]
        assert [e["field"] for e in version.json()["errors"]] == ["body.version"]
    app.close()


def _old_sqlite_ledger(path: Path) -> str:
    """A SQLite ledger at the schema before the definitions migration (a ledger only the
    previous release has used)."""
    url = f"sqlite:///{path}"
    migrations = load_migrations("sqlite")
    cut = next(i for i, m in enumerate(migrations) if m.name.endswith("_definitions.sql"))
    conn = sqlite3.connect(parse_ledger_url(url).path)
    for migration in migrations[:cut]:
        for statement in split_statements(migration.sql):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {migration.version}")
    conn.commit()
    conn.close()
    return url


def test_a_schema_too_old_answers_alike(tmp_path: Path) -> None:
    url = _old_sqlite_ledger(tmp_path / "old.db")
    expected = ERROR_TABLE[SchemaTooOld]
    assert (expected.http_status, expected.code) == (503, "schema_too_old")
    with _service(Control(url), url) as client:
        api, page = client.get("/api/status"), client.get("/")
        assert _api(api) == _page(page) == (503, "schema_too_old"), (api.text, page.text)
        assert "ratchet migrate" in api.json()["message"] and "ratchet migrate" in page.text


def test_a_corrupt_ledger_answers_alike(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    app = make_app(url)
    for i in range(5):
        app.submit("web.echo", {"text": str(i)})
    app.close()
    expected = ERROR_TABLE[LedgerCorrupt]
    assert (expected.http_status, expected.code) == (503, "ledger_corrupt")
    with _service(Control(url), url) as client:
        assert client.get("/api/status").status_code == 200
        damage_task_pages(path)
        api, page = client.get("/api/status"), client.get("/")
        assert _api(api) == _page(page) == (503, "ledger_corrupt"), (api.text, page.text)
        assert "Ledger corrupt" in page.text
