"""Stored text that is not valid UTF-8 never blinds monitoring.

A SQLite file can hold bytes that are not UTF-8 in any text column (``CAST(X'ff6f6f' AS
TEXT)``) or a BLOB where text belongs, as a damaged file or a foreign writer leaves them.
The SQLite connection reads both as an ``UndecodableText`` (the bytes, invalid ones as
``\\xNN`` escapes), so every read path works and shows the value as stored with a note: the
status rollup (written once, keyed by the stored bytes), ``ratchet status`` / ``tasks`` /
``inspect`` / ``workers`` / ``late-effects``, ``/api/status``, ``/api/tasks``, ``/metrics``,
the dashboard and the worker log. The rows are damaged directly in the file.

PostgreSQL ``text`` holds only valid UTF-8 without NUL (the server refuses other bytes), so
the case cannot arise there; what can (a ``\\u0000`` escape inside stored JSON, which is
valid text) is shown on both ledgers.
"""

from __future__ import annotations

import copy
import json
import logging
import operator
import pickle
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
import pytest
from dashsupport import serve
from pgsupport import pg_base_url
from psycopg import sql
from typer.testing import CliRunner

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.cli.main import cli
from ratchet.errors import UndecodableData
from ratchet.observe.logs import JsonFormatter
from ratchet.serde import loads
from ratchet.storedtext import NOTE, UndecodableText
from ratchet.testing.processes import clean_env
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings
from ratchet.worker import Worker

pytestmark = pytest.mark.timeout(180)


def bad(hex_bytes: str) -> str:
    """SQL for the bytes ``hex_bytes`` stored as TEXT (not valid UTF-8)."""
    return f"CAST(X'{hex_bytes}' AS TEXT)"


def damage(path: Path, statement: str, *args: Any) -> None:
    """Run one UPDATE/INSERT on the file directly; it must change a row."""
    with closing(sqlite3.connect(path)) as db:
        assert db.execute(statement, args).rowcount >= 1, statement
        db.commit()


def raw(path: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as db:
        return db.execute(query, args).fetchall()


def damaged_ledger(tmp_path: Path) -> tuple[str, Path, dict[str, str]]:
    """A SQLite ledger whose rows hold undecodable bytes in every text column Ratchet
    shows: task name (TEXT and BLOB), key, tenant, holder, error, error class, params, an
    effect key, an audit holder, a pause's operator and reason, a worker's host, a late
    effect's name, key and holder."""
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    app = App(url)

    @app.task(name="t.add")
    def add(ctx: TaskContext, n: int) -> int:
        return n + 1

    @app.task(name="t.fail", retry=RetryPolicy(max_attempts=1))
    def fail(ctx: TaskContext) -> None:
        raise RuntimeError("boom")

    @app.task(name="t.eff")
    def eff(ctx: TaskContext) -> Any:
        return ctx.effect("charge", lambda key: {"id": 1}, key="charge:1")

    ids = {"name": app.submit("t.add", {"n": 1}, idempotency_key="k1", tenant="ten").task_id,
           "error": app.submit("t.fail").task_id,
           "effect": app.submit("t.eff").task_id,
           "blob": app.submit("t.add", {"n": 5}).task_id}
    Worker(app, concurrency=1, poll_interval_s=0.01).run(max_tasks=4)
    ids["params"] = app.submit("t.add", {"n": 2}, delay_s=3600).task_id
    app.close()
    with closing(Control(url)) as control:
        control.pause("type", "t.eff", reason="maintenance", by="alice")
    damage(path, f"UPDATE tasks SET name = {bad('ff6f6f')}, idempotency_key = {bad('6bff')},"
                 f" tenant = {bad('74ff')}, holder = {bad('68ff')} WHERE id = ?", ids["name"])
    damage(path, f"UPDATE tasks SET last_error = X'626f6f6dff', error_class = {bad('65ff')}"
                 " WHERE id = ?", ids["error"])
    damage(path, "UPDATE tasks SET name = X'ff626172' WHERE id = ?", ids["blob"])
    damage(path, f"UPDATE tasks SET params = {bad('7b226e223aff7d')} WHERE id = ?",
           ids["params"])
    damage(path, f"UPDATE effects SET key = {bad('6bff')} WHERE task_id = ?", ids["effect"])
    damage(path, f"UPDATE audit SET holder = {bad('77ff')} WHERE task_id = ? AND kind = 'claim'",
           ids["effect"])
    damage(path, f"UPDATE pauses SET paused_by = {bad('6f70ff')}, reason = {bad('72ff')}")
    damage(path, f"UPDATE workers SET hostname = {bad('68ff')}")
    damage(path, "INSERT INTO late_effects (task_id, effect, key, generation, holder, at,"
                 f" outcome) VALUES (?, {bad('65ff')}, {bad('6bff')}, 1, {bad('77ff')}, ?,"
                 " 'sent')", ids["effect"], time.time())
    return url, path, ids


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: raised {result.exception!r}\n{result.output}")
    assert result.exit_code == 0, (args, result.output, result.stderr)
    return result.stdout


def test_undecodable_text_is_one_safe_value() -> None:
    text = UndecodableText(b"\xffoo")
    assert str(text) == "\\xffoo" and text.stored == b"\xffoo" and text.bad_offset == 0
    assert text.encode("utf-8") == b"\\xffoo"
    assert text != "\\xffoo" and operator.ne("\\xffoo", text), "never equal to a real name"
    assert len({text, "\\xffoo", UndecodableText(b"\xffoo")}) == 2
    for copied in (copy.deepcopy(text), pickle.loads(pickle.dumps(text))):
        assert isinstance(copied, UndecodableText) and copied == text
    with pytest.raises(UndecodableData, match="params is not valid UTF-8 text"):
        loads(UndecodableText(b'{"n":\xff}'), "params")


def test_ratchet_status_subprocess_shows_the_name_as_stored(tmp_path: Path) -> None:
    url, path, _ = damaged_ledger(tmp_path)
    done = subprocess.run([sys.executable, "-m", "ratchet.cli.main", "status", "--ledger", url],
                          capture_output=True, text=True, timeout=120, env=clean_env({}),
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    row = next(ln for ln in done.stdout.splitlines() if "\\xffoo" in ln)
    assert NOTE in row
    assert f"by op\\xff ({NOTE})" in done.stdout, "the pause's operator"
    # The rollup holds the stored bytes once, as TEXT, like the task rows it counts.
    assert raw(path, "SELECT hex(name), typeof(name), n FROM finished_counts"
                     " WHERE hex(name) LIKE 'FF%' ORDER BY 1") == [
        ("FF626172", "text", 1), ("FF6F6F", "text", 1)]


def test_the_rollup_is_written_once_and_pruned_by_the_stored_bytes(tmp_path: Path) -> None:
    url, path, ids = damaged_ledger(tmp_path)
    with closing(Control(url)) as control:
        first = control.status()
        mark = raw(path, "SELECT upto FROM counts_mark")[0][0]
        assert mark > 0, "the rollup advanced the counts mark"
        rolled = raw(path, "SELECT hex(name), state, n FROM finished_counts ORDER BY 1, 2")
        again = control.status()
        assert raw(path, "SELECT hex(name), state, n FROM finished_counts ORDER BY 1, 2") == rolled
        for report in (first, again):
            counts = report.counts
            assert counts[UndecodableText(b"\xffoo")] == {"SUCCEEDED": 1}
            assert counts[UndecodableText(b"\xffbar")] == {"SUCCEEDED": 1}
            assert "\\xffoo" not in counts, "the damaged name is not a plain name"
        # Pruning subtracts from the same rollup rows (the name binds its stored bytes).
        report = control.prune(0.0, by="test")
        assert report.tasks == 4
        counts = control.status().counts
        assert UndecodableText(b"\xffoo") not in counts
        assert UndecodableText(b"\xffbar") not in counts
        assert counts["t.add"] == {"PENDING": 1}
        assert control.get(ids["params"]).undecodable == ("params",)


def test_control_and_every_command_read_the_damaged_rows(tmp_path: Path) -> None:
    url, _, ids = damaged_ledger(tmp_path)
    with closing(Control(url)) as control:
        task = control.get(ids["name"])
        assert isinstance(task.name, UndecodableText) and task.name.stored == b"\xffoo"
        assert task.undecodable == ("name", "holder", "idempotency_key", "tenant")
        assert control.get(ids["error"]).undecodable == ("last_error", "error_class")
        assert control.get(ids["blob"]).name == UndecodableText(b"\xffbar")
        listed = {t.task_id: t for t in control.list_tasks(limit=10).tasks}
        assert listed[ids["name"]].name == task.name
        assert control.workers()[0].hostname == UndecodableText(b"h\xff")
        [late] = control.late_effects()
        assert (late.effect, late.key, late.holder) == (
            UndecodableText(b"e\xff"), UndecodableText(b"k\xff"), UndecodableText(b"w\xff"))
        assert control.pauses()[0].reason == UndecodableText(b"r\xff")
    noted = f"\\xffoo ({NOTE})"
    assert noted in invoke("tasks", "--ledger", url)
    out = invoke("inspect", ids["name"], "--ledger", url)
    assert noted in out and f"key=k\\xff ({NOTE})" in out and f"t\\xff ({NOTE})" in out
    out = invoke("inspect", ids["error"], "--ledger", url)
    assert "undecodable: last_error, error_class" in out and "boom\\xff" in out
    assert f"w\\xff ({NOTE})" in invoke("inspect", ids["effect"], "--ledger", url)
    assert "not decodable" in invoke("inspect", ids["params"], "--ledger", url)
    assert f"h\\xff ({NOTE})" in invoke("workers", "--ledger", url)
    assert f"k\\xff ({NOTE})" in invoke("late-effects", "--ledger", url)
    status = json.loads(invoke("status", "--ledger", url, "--json"))
    assert status["counts"]["\\xffoo"] == {"SUCCEEDED": 1}
    tasks = json.loads(invoke("tasks", "--ledger", url, "--json"))["tasks"]
    assert {t["task_id"]: t["undecodable"] for t in tasks}[ids["blob"]] == ["name"]


def test_api_metrics_and_dashboard_answer_over_http(tmp_path: Path) -> None:
    url, _, ids = damaged_ledger(tmp_path)
    with closing(Control(url)) as control, \
            serve(WebSettings(ledger_url=url), control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        status = client.get("/api/status")
        assert status.status_code == 200, status.text
        assert {"\\xffoo", "\\xffbar"} <= set(status.json()["counts"])
        listed = client.get("/api/tasks")
        assert listed.status_code == 200, listed.text
        by_id = {t["task_id"]: t for t in listed.json()["tasks"]}
        assert by_id[ids["name"]]["name"] == "\\xffoo"
        assert by_id[ids["name"]]["undecodable"] == ["name", "holder", "idempotency_key",
                                                     "tenant"]
        one = client.get(f"/api/tasks/{ids['error']}")
        assert one.status_code == 200 and one.json()["task"]["last_error"] == "boom\\xff"
        metrics = client.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        assert 'type="\\\\xffoo"' in metrics.text, "the label value, escaped for Prometheus"
        pages = {"/": NOTE, "/tasks": NOTE, "/pauses": NOTE, f"/tasks/{ids['name']}": NOTE,
                 f"/tasks/{ids['effect']}": NOTE,
                 f"/tasks/{ids['params']}": "(undecodable: value is not valid UTF-8 text"}
        for page, note in pages.items():
            answer = client.get(page)
            assert answer.status_code == 200, (page, answer.text[:500])
            assert note in answer.text, page
        assert "\\xffoo" in client.get("/").text


def test_the_worker_runs_next_to_damaged_rows_and_logs_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "l.db"
    app = App(f"sqlite:///{path}")

    @app.task(name="t.add", lease_s=1)
    def add(ctx: TaskContext, n: int) -> int:
        return n + 1

    tenant = app.submit("t.add", {"n": 1}, tenant="ten", idempotency_key="k").task_id
    params = app.submit("t.add", {"n": 2}).task_id
    taken = app.submit("t.add", {"n": 3}).task_id
    damage(path, f"UPDATE tasks SET tenant = {bad('74ff')}, idempotency_key = {bad('6bff')}"
                 " WHERE id = ?", tenant)
    damage(path, "UPDATE tasks SET params = X'7b226e223aff7d' WHERE id = ?", params)
    damage(path, f"UPDATE tasks SET state = 'RUNNING', generation = 1, attempt = 1,"
                 f" holder = {bad('68ff')}, lease_until = 0 WHERE id = ?", taken)
    caplog.set_level(logging.DEBUG, logger="ratchet")
    try:
        with running_worker(app, concurrency=1):
            assert app.wait(tenant, timeout_s=30).state is State.SUCCEEDED
            failed = app.wait(params, timeout_s=30)
            assert app.wait(taken, timeout_s=30).state is State.SUCCEEDED
    finally:
        app.close()
    assert failed.state is State.FAILED and failed.error_class == "undecodable"
    assert "params is not valid UTF-8" in (failed.last_error or "")
    lines = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert any("takeover from h\\xff" in ln["message"] for ln in lines), lines


def test_postgresql_text_refuses_the_bytes_and_a_nul_escape_in_json_is_shown(
    backend: str, ledger_url: str
) -> None:
    """What applies on PostgreSQL: no text column can hold invalid UTF-8 or NUL (refused by
    the server), but stored JSON may escape a NUL (``\\u0000``), valid text on both
    ledgers, decoded to a string holding NUL."""
    app = App(ledger_url)

    @app.task(name="t.echo")
    def echo(ctx: TaskContext, text: str) -> str:
        return text

    task_id = app.submit("t.echo", {"text": "a"}).task_id
    app.close()
    stored = '{"text":"a\\u0000b"}'
    if backend == "postgresql":
        schema = parse_qs(urlsplit(ledger_url).query)["schema"][0]
        table = sql.Identifier(schema, "tasks")
        with psycopg.connect(pg_base_url(), autocommit=True) as conn:
            for expr in ("convert_from('\\xff6f6f'::bytea, 'UTF8')", "chr(0)"):
                with pytest.raises(psycopg.Error,
                                   match=r"invalid byte sequence|null character not permitted"):
                    conn.execute(sql.SQL("UPDATE {} SET name = " + expr + " WHERE id = %s")
                                 .format(table), [task_id])
            conn.execute(sql.SQL("UPDATE {} SET params = %s WHERE id = %s").format(table),
                         [stored, task_id])
    else:
        damage(Path(urlsplit(ledger_url).path), "UPDATE tasks SET params = ? WHERE id = ?",
               stored, task_id)
    with closing(Control(ledger_url)) as control:
        task = control.get(task_id)
        assert task.params == {"text": "a\x00b"} and task.undecodable == ()
        assert control.status().counts["t.echo"] == {"PENDING": 1}
    assert '"a\\u0000b"' in invoke("inspect", task_id, "--ledger", ledger_url)
