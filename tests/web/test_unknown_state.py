"""A state column holding a value that is not a known state affects only its own row.

``tasks.state`` or ``effects.state`` may hold something Ratchet never writes: bytes that
are not valid UTF-8, a BLOB (SQLite only: a damaged file or a foreign writer), or any
unknown string such as ``'BOGUS'`` (both ledgers: neither schema has a CHECK constraint on
the state columns, so PostgreSQL holds one too). Such a value is read as a ``StoredState``,
shown as stored with a note and ``"state"`` in ``undecodable``; every face still answers,
the other rows are unaffected, no worker claims or moves the row, and operator commands on
it refuse with a clear error. The rows are damaged directly in the store.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
import pytest
from apisupport import AUTH, TOKEN
from dashsupport import serve
from pgsupport import pg_base_url
from psycopg import sql
from typer.testing import CliRunner

from ratchet import App, Control, State, TaskContext
from ratchet.cli.main import cli
from ratchet.errors import IllegalTransition
from ratchet.storedtext import NOTE, STATE_NOTE, StoredState, UndecodableText
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings
from ratchet.worker import Worker

pytestmark = pytest.mark.timeout(180)

BAD_STATES = {"utf8": "CAST(X'ff41fe' AS TEXT)", "blob": "X'ff42'", "bogus": "'BOGUS'"}
"""SQLite expressions of the bad ``tasks.state`` values."""


def set_state(url: str, table: str, value_sql: str, where: str, *args: Any) -> None:
    """``UPDATE table SET state = value_sql WHERE where`` directly in the store; it must
    change a row."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        with closing(sqlite3.connect(parts.path)) as db:
            assert db.execute(f"UPDATE {table} SET state = {value_sql} WHERE {where}",
                              args).rowcount >= 1
            db.commit()
        return
    schema = parse_qs(parts.query)["schema"][0]
    with psycopg.connect(pg_base_url(), autocommit=True) as conn:
        done = conn.execute(sql.SQL("UPDATE {} SET state = " + value_sql + " WHERE "
                                    + where.replace("?", "%s"))
                            .format(sql.Identifier(schema, table)), list(args))
        assert done.rowcount >= 1


def stored_state(url: str, task_id: str) -> Any:
    with closing(Control(url)) as control:
        return control.get(task_id).state


def make_app(url: str) -> App:
    app = App(url)

    @app.task(name="t.add")
    def add(ctx: TaskContext, n: int) -> int:
        return n + 1

    @app.task(name="t.eff")
    def eff(ctx: TaskContext) -> Any:
        return ctx.effect("charge", lambda key: {"id": 1}, key="charge:1")

    return app


def damaged(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A SQLite ledger with one PENDING task per bad state, a good PENDING task, and a
    finished task whose effect's state is ``'weird'``."""
    url = f"sqlite:///{tmp_path}/l.db"
    app = make_app(url)
    ids = {"effect": app.submit("t.eff").task_id}
    Worker(app, concurrency=1, poll_interval_s=0.01).run(max_tasks=1)
    ids |= {kind: app.submit("t.add", {"n": 1}).task_id for kind in [*BAD_STATES, "good"]}
    app.close()
    for kind, value in BAD_STATES.items():
        set_state(url, "tasks", value, "id = ?", ids[kind])
    set_state(url, "effects", "'weird'", "task_id = ?", ids["effect"])
    return url, ids


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def invoke(*args: str) -> str:
    result = run(*args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: raised {result.exception!r}\n{result.output}")
    assert result.exit_code == 0, (args, result.output)
    return str(result.stdout)


def test_control_reads_every_bad_state_as_stored(tmp_path: Path) -> None:
    url, ids = damaged(tmp_path)
    with closing(Control(url)) as control:
        utf8, blob, bogus = (control.get(ids[k]) for k in BAD_STATES)
        assert isinstance(utf8.state, StoredState) and utf8.state.stored == UndecodableText(
            b"\xffA\xfe")
        assert str(utf8.state) == "\\xffA\\xfe" and str(blob.state) == "\\xffB"
        assert bogus.state == StoredState("BOGUS") and bogus.state.value == "BOGUS"
        assert all(t.undecodable == ("state",) and not t.terminal for t in (utf8, blob, bogus))
        assert control.get(ids["good"]).state is State.PENDING
        listed = {t.task_id: t.state for t in control.list_tasks(limit=10).tasks}
        assert listed[ids["bogus"]] == "BOGUS" and listed[ids["good"]] is State.PENDING
        [effect] = control.inspect(ids["effect"]).effects
        assert effect.state == "weird" and effect.undecodable == ("state",)


def test_every_cli_command_answers_and_notes_the_state(tmp_path: Path) -> None:
    url, ids = damaged(tmp_path)
    for args in (("tasks",), ("tasks", "--type", "t.add")):
        out = invoke(*args, "--ledger", url)
        assert f"BOGUS ({STATE_NOTE})" in out, args
        assert f"\\xffA\\xfe ({STATE_NOTE}; {NOTE})" in out and f"\\xffB ({STATE_NOTE}" in out
    listed = json.loads(invoke("tasks", "--json", "--ledger", url))["tasks"]
    by_id = {t["task_id"]: t for t in listed}
    assert by_id[ids["bogus"]]["state"] == "BOGUS"
    assert by_id[ids["utf8"]]["undecodable"] == ["state"]
    assert by_id[ids["good"]]["state"] == "PENDING" and by_id[ids["good"]]["undecodable"] == []
    for kind in BAD_STATES:
        out = invoke("inspect", ids[kind], "--ledger", url)
        assert STATE_NOTE in out and "undecodable: state" in out, kind
    shown = json.loads(invoke("inspect", ids["bogus"], "--json", "--ledger", url))
    assert shown["task"]["state"] == "BOGUS" and shown["task"]["undecodable"] == ["state"]
    for extra in ((), ("--traceback",)):
        out = invoke("inspect", ids["effect"], *extra, "--ledger", url)
        assert f"effect charge weird ({STATE_NOTE})" in out, extra
    shown = json.loads(invoke("inspect", ids["effect"], "--json", "--ledger", url))
    assert shown["effects"][0]["state"] == "weird"
    assert shown["effects"][0]["undecodable"] == ["state"]
    assert "t.add" in invoke("status", "--ledger", url)
    for command in ("cancel", "retry"):
        result = run(command, ids["bogus"], "--reason", "test", "--ledger", url)
        assert result.exit_code == 2, (result.output, result.exception)
        assert "holds state 'BOGUS' (not a known state" in result.output, result.output
        assert "Traceback" not in result.output


def test_api_and_dashboard_answer_and_note_the_state(tmp_path: Path) -> None:
    url, ids = damaged(tmp_path)
    with closing(Control(url)) as control, \
            serve(WebSettings(ledger_url=url), control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        for query in ("/api/tasks", "/api/tasks?type=t.add"):
            listed = client.get(query)
            assert listed.status_code == 200, listed.text
            by_id = {t["task_id"]: t for t in listed.json()["tasks"]}
            assert by_id[ids["utf8"]]["state"] == "\\xffA\\xfe"
            assert by_id[ids["blob"]]["undecodable"] == ["state"]
            assert by_id[ids["good"]]["state"] == "PENDING"
        for kind in BAD_STATES:
            one = client.get(f"/api/tasks/{ids[kind]}")
            assert one.status_code == 200, one.text
            assert one.json()["task"]["undecodable"] == ["state"]
        one = client.get(f"/api/tasks/{ids['effect']}")
        assert one.status_code == 200, one.text
        for page in ("/tasks", "/tasks?type=t.add", f"/tasks/{ids['bogus']}",
                     f"/tasks/{ids['utf8']}", f"/tasks/{ids['effect']}", "/"):
            answer = client.get(page)
            assert answer.status_code == 200, (page, answer.text[:500])
            assert STATE_NOTE in answer.text or page == "/", page
    with closing(Control(url)) as control, \
            serve(WebSettings(ledger_url=url, api_token=TOKEN), control) as base, \
            httpx.Client(base_url=base, timeout=30, headers=AUTH) as client:
        refused = client.post(f"/api/tasks/{ids['bogus']}/cancel", json={"reason": "r"})
        assert refused.status_code == 409, refused.text
        assert "holds state 'BOGUS'" in refused.json()["message"]


def test_operator_commands_refuse_a_bad_state(backend: str, ledger_url: str) -> None:
    app = make_app(ledger_url)
    task_id = app.submit("t.add", {"n": 1}).task_id
    app.close()
    set_state(ledger_url, "tasks", "'BOGUS'", "id = ?", task_id)
    with closing(Control(ledger_url)) as control:
        assert control.get(task_id).state == StoredState("BOGUS")
        for act in (lambda: control.cancel(task_id, reason="r", by="op"),
                    lambda: control.retry(task_id, reason="r", by="op"),
                    lambda: control.pause("task", task_id, reason="r", by="op")):
            with pytest.raises(IllegalTransition, match="holds state 'BOGUS'"):
                act()
    assert stored_state(ledger_url, task_id) == "BOGUS"


def test_a_worker_runs_the_other_tasks_and_leaves_the_bad_rows(
    backend: str, ledger_url: str
) -> None:
    """Bad-state rows that look ready (run_at passed) or expired (a lease in the past) are
    never claimed; a task whose state is damaged while it runs gets its commit rejected as
    stale (the state found is recorded as stored), and the worker goes on."""
    app = make_app(ledger_url)
    started, go = threading.Event(), threading.Event()

    @app.task(name="t.hold")
    def hold(ctx: TaskContext) -> str:
        started.set()
        assert go.wait(60)
        return "done"

    ready = app.submit("t.add", {"n": 1}).task_id
    expired = app.submit("t.add", {"n": 2}).task_id
    held = app.submit("t.hold").task_id
    set_state(ledger_url, "tasks", "'BOGUS'", "id = ?", ready)
    set_state(ledger_url, "tasks", "'BOGUS', holder = 'gone', generation = 1,"
              " lease_until = 0", "id = ?", expired)
    try:
        with running_worker(app, concurrency=2):
            assert started.wait(60)
            set_state(ledger_url, "tasks", "'HELD?'", "id = ?", held)
            go.set()
            after = [app.submit("t.add", {"n": n}).task_id for n in range(3)]
            for task_id in after:
                assert app.wait(task_id, timeout_s=60).state is State.SUCCEEDED
            with closing(Control(ledger_url)) as control:
                wait_for("the held task's commit to be rejected as stale", lambda: any(
                    e.kind == "stale_rejected" and e.detail.get("current_state") == "HELD?"
                    for e in control.inspect(held).events))
    finally:
        app.close()
    assert stored_state(ledger_url, ready) == "BOGUS"
    assert stored_state(ledger_url, expired) == "BOGUS"
    assert stored_state(ledger_url, held) == StoredState("HELD?")


def test_a_bad_effect_state_is_shown_on_both_ledgers(backend: str, ledger_url: str) -> None:
    app = make_app(ledger_url)
    task_id = app.submit("t.eff").task_id
    Worker(app, concurrency=1, poll_interval_s=0.01).run(max_tasks=1)
    app.close()
    set_state(ledger_url, "effects", "'weird'", "task_id = ?", task_id)
    out = invoke("inspect", task_id, "--ledger", ledger_url)
    assert f"effect charge weird ({STATE_NOTE})" in out
