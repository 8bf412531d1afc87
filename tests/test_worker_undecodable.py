"""Undecodable stored data affects only its own task.

A task whose params (or stored step value, or recorded effect result) cannot be decoded —
bytes that are not valid UTF-8 in a SQLite file, ``{oops``, JSON nested 60,000 deep —
fails once, permanently, with ``error_class`` ``"undecodable"`` and a message naming the
value (never its bytes); the next task runs. The corruption is written directly into the
store (SQLite file / private PostgreSQL schema), as a damaged row or a foreign writer
would leave it.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from pgsupport import pg_base_url
from psycopg import sql

from ratchet import App, RetryPolicy, State, TaskContext, TransientError
from ratchet.testing.worker import running_worker
from ratchet.worker import Worker

pytestmark = pytest.mark.timeout(60)

INVALID_UTF8 = "CAST(X'7B226E223AFF7D' AS TEXT)"
"""SQLite: ``{"n":`` + the byte 0xFF + ``}`` stored as TEXT (not valid UTF-8)."""

DEEP = "[" * 60_000 + "]" * 60_000
"""Valid JSON that Python's decoder cannot decode (RecursionError)."""


def corrupt(url: str, table: str, column: str, where: dict[str, str], value: str | None,
            sqlite_expr: str | None = None) -> None:
    """Overwrite ``table.column`` of the rows matching ``where`` directly in the store:
    with ``value`` (bound as text), or on SQLite with the SQL expression ``sqlite_expr``."""
    if url.startswith("sqlite:///"):
        path = urlsplit(url).path
        conditions = " AND ".join(f"{k} = ?" for k in where)
        expr = sqlite_expr if sqlite_expr is not None else "?"
        args: list[Any] = [] if sqlite_expr is not None else [value]
        with closing(sqlite3.connect(path)) as db:
            changed = db.execute(
                f"UPDATE {table} SET {column} = {expr} WHERE {conditions}",
                [*args, *where.values()],
            ).rowcount
            db.commit()
    else:
        assert sqlite_expr is None, "SQL expressions are for SQLite only"
        schema = parse_qs(urlsplit(url).query)["schema"][0]
        with psycopg.connect(pg_base_url(), autocommit=True) as conn:
            conditions_sql = sql.SQL(" AND ").join(
                sql.SQL("{} = %s").format(sql.Identifier(k)) for k in where
            )
            changed = conn.execute(
                sql.SQL("UPDATE {}.{} SET {} = %s WHERE {}").format(
                    sql.Identifier(schema), sql.Identifier(table), sql.Identifier(column),
                    conditions_sql,
                ),
                [value, *where.values()],
            ).rowcount
    assert changed == 1, f"no {table} row matched {where}"


def register(app: App, seen: list[Any]) -> None:
    @app.task(name="t.add")
    def add(ctx: TaskContext, n: int) -> int:
        seen.append(n)
        return n + 1


PARAMS_CASES = [
    pytest.param(None, INVALID_UTF8, "params is not valid UTF-8", id="invalid-utf8"),
    pytest.param("{oops", None, "params is not valid JSON", id="invalid-json"),
    pytest.param(DEEP, None, "params is nested too deeply", id="deep-nesting"),
    pytest.param("[1, 2]", None, "params are a JSON list, not an object", id="not-an-object"),
]


@pytest.mark.parametrize(("value", "sqlite_expr", "message"), PARAMS_CASES)
def test_undecodable_params_fail_only_their_task(
    app: App, backend: str, ledger_url: str, value: str | None, sqlite_expr: str | None,
    message: str,
) -> None:
    if sqlite_expr is not None and backend != "sqlite":
        pytest.skip("PostgreSQL text columns cannot hold invalid UTF-8")
    seen: list[Any] = []
    register(app, seen)
    first = app.submit("t.add", {"n": 1})
    second = app.submit("t.add", {"n": 2})
    corrupt(ledger_url, "tasks", "params", {"id": first.task_id}, value, sqlite_expr)
    with running_worker(app, concurrency=1) as worker:
        bad = app.wait(first.task_id, timeout_s=20)
        good = app.wait(second.task_id, timeout_s=20)
    assert good.state is State.SUCCEEDED and good.result == 3
    assert seen == [2], "the task body must not run with undecodable params"
    assert bad.state is State.FAILED
    assert bad.attempt == 1, "an undecodable task fails once, it does not burn its attempts"
    assert bad.error_class == "undecodable"
    assert message in (bad.last_error or "")
    assert "oops" not in (bad.last_error or "") and "[[[" not in (bad.last_error or "")
    assert worker.stats.failed == 1 and worker.stats.succeeded == 1


@pytest.mark.parametrize(
    "value", [pytest.param("{oops", id="invalid-json"), pytest.param(DEEP, id="deep-nesting")]
)
def test_undecodable_stored_step_value_fails_on_replay(
    app: App, ledger_url: str, value: str
) -> None:
    runs: list[int] = []

    @app.task(name="t.step", retry=RetryPolicy(max_attempts=3, base_delay_s=0.01, jitter=0.0))
    def stepper(ctx: TaskContext) -> Any:
        runs.append(ctx.attempt)
        quote = ctx.step("quote", lambda: {"amount": 42}, durable=True)
        if ctx.attempt == 1:
            raise TransientError("after the step")
        return quote

    @app.task(name="t.after")
    def after(ctx: TaskContext) -> str:
        return "ran"

    handle = app.submit("t.step")
    Worker(app, concurrency=1, poll_interval_s=0.01, fast_takeover=False).run(max_tasks=1)
    assert handle.get().state is State.RETRY_WAIT
    corrupt(ledger_url, "steps", "result", {"task_id": handle.task_id, "name": "quote"}, value)
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
        nxt = app.wait(app.submit("t.after").task_id, timeout_s=20)
    assert runs == [1, 2]
    assert info.state is State.FAILED and info.attempt == 2
    assert info.error_class == "undecodable"
    assert "stored value of step 'quote'" in (info.last_error or "")
    assert nxt.state is State.SUCCEEDED


def test_undecodable_effect_result_fails_on_replay(app: App, ledger_url: str) -> None:
    calls: list[str] = []

    @app.task(name="t.effect", retry=RetryPolicy(max_attempts=3, base_delay_s=0.01, jitter=0.0))
    def effect(ctx: TaskContext) -> Any:
        result = ctx.effect("charge", lambda key: calls.append(key) or {"id": "ch_1"},
                            key="charge:1")
        if ctx.attempt == 1:
            raise TransientError("after the effect")
        return result

    handle = app.submit("t.effect")
    Worker(app, concurrency=1, poll_interval_s=0.01, fast_takeover=False).run(max_tasks=1)
    assert handle.get().state is State.RETRY_WAIT
    corrupt(ledger_url, "effects", "result", {"task_id": handle.task_id, "name": "charge"},
            "{oops")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert calls == ["charge:1"], "a done effect is never called again"
    assert info.state is State.FAILED and info.attempt == 2
    assert info.error_class == "undecodable"
    assert "recorded result of effect 'charge'" in (info.last_error or "")
