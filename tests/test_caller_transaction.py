"""Submit and emit inside the caller's own transaction (DESIGN §6, row 2, the caller's
half): ``App.submit(..., connection=conn)``, ``App.submit_many(..., connection=conn)``
and ``App.emit(..., connection=conn)`` write with the caller's open transaction on the
ledger's database, so the task (and the message) exists if and only if the caller's
transaction commits. Both ledgers; the caller's connection is a real ``sqlite3``
connection on the ledger's file or a real psycopg 3 connection."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from ratchet import App, InvalidArguments, State, SubmitRequest, TaskContext
from ratchet.errors import IdempotencyConflict
from ratchet.ledger import open_ledger
from ratchet.testing import running_worker, wait_for


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&", 1)[0]


def _base(url: str) -> str:
    return url.split("?", 1)[0]


class Caller:
    """The caller's side: its own connection and its own table, ``orders``, in the
    ledger's database (the SQLite file, or the ledger's PostgreSQL schema)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith("postgresql")
        self.table = (sql.Identifier(_schema(url), "orders").as_string(None)
                      if self.pg else "orders")
        with self.connect() as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (id TEXT PRIMARY KEY)")
            conn.commit()

    def connect(self, **kw: Any) -> Any:
        if self.pg:
            return psycopg.connect(_base(self.url), **kw)
        return sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30.0, **kw)

    def orders(self) -> list[str]:
        with self.connect() as conn:
            rows = conn.execute(f"SELECT id FROM {self.table} ORDER BY id").fetchall()
            return [r[0] for r in rows]

    def insert_order(self, conn: Any, order_id: str) -> None:
        mark = "%s" if self.pg else "?"
        conn.execute(f"INSERT INTO {self.table} (id) VALUES ({mark})", (order_id,))


def outbox_rows(app: App) -> list[tuple[Any, ...]]:
    """Every outbox row, read from the database, not through Ratchet's API."""
    url = app.ledger_url or ""
    if url.startswith("postgresql"):
        with psycopg.connect(_base(url)) as conn:
            table = sql.Identifier(_schema(url), "outbox").as_string(None)
            return conn.execute(
                f"SELECT id, message_id, topic, key, payload, task_id FROM {table} "
                "ORDER BY id").fetchall()
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute("SELECT id, message_id, topic, key, payload, task_id FROM outbox "
                            "ORDER BY id").fetchall()


@pytest.fixture
def caller(app: App) -> Iterator[Caller]:
    @app.task(name="ship")
    def ship(ctx: TaskContext, order_id: str) -> str:
        return f"shipped {order_id}"

    app.ledger.migrate()
    yield Caller(app.ledger_url or "")


def test_the_task_exists_if_and_only_if_the_caller_commits(app: App, caller: Caller) -> None:
    with caller.connect() as conn:
        caller.insert_order(conn, "o-1")
        gone = app.submit("ship", {"order_id": "o-1"}, connection=conn)
        app.emit("order.created", {"order_id": "o-1"}, key="o-1", connection=conn)
        conn.rollback()
    assert caller.orders() == []
    assert app.list_tasks().tasks == []
    assert outbox_rows(app) == []

    with caller.connect() as conn:
        caller.insert_order(conn, "o-2")
        kept = app.submit("ship", {"order_id": "o-2"}, connection=conn)
        (other,) = app.submit_many([SubmitRequest("ship", {"order_id": "o-3"})],
                                   connection=conn)
        mid = app.emit("order.created", {"order_id": "o-2"}, key="o-2", connection=conn)
        # Not visible outside the caller's transaction before it commits.
        assert app.list_tasks().tasks == []
        conn.commit()
    assert caller.orders() == ["o-2"]
    assert {t.task_id for t in app.list_tasks().tasks} == {kept.task_id, other.task_id}
    assert kept.task_id != gone.task_id and kept.created
    ((_, message_id, topic, key, payload, task_id),) = outbox_rows(app)
    assert (message_id, topic, key, payload, task_id) == (
        mid, "order.created", "o-2", '{"order_id":"o-2"}', None)
    with running_worker(app):
        assert kept.wait(30).state is State.SUCCEEDED
        assert other.wait(30).state is State.SUCCEEDED


def test_the_caller_connection_is_left_as_it_was(app: App, caller: Caller) -> None:
    """The savepoint is released and (PostgreSQL) the caller's search_path and row factory
    are untouched: the caller's own statements after the submit work as before."""
    if caller.pg:
        with psycopg.connect(_base(caller.url), row_factory=dict_row) as conn:
            conn.execute("SET search_path TO public")
            app.submit("ship", {"order_id": "o-1"}, connection=conn)
            row = conn.execute("SHOW search_path").fetchone()
            assert row == {"search_path": "public"}
            caller.insert_order(conn, "o-1")
            conn.commit()
    else:
        with caller.connect() as conn:
            app.submit("ship", {"order_id": "o-1"}, connection=conn)
            assert conn.in_transaction
            caller.insert_order(conn, "o-1")
            conn.commit()
    assert caller.orders() == ["o-1"]
    assert len(app.list_tasks().tasks) == 1


def test_a_conflict_leaves_the_caller_transaction_usable(app: App, caller: Caller) -> None:
    app.submit("ship", {"order_id": "o-1"}, idempotency_key="k")
    with caller.connect() as conn:
        caller.insert_order(conn, "o-9")
        with pytest.raises(IdempotencyConflict):
            app.submit("ship", {"order_id": "o-2"}, idempotency_key="k", connection=conn)
        conn.commit()
    assert caller.orders() == ["o-9"]
    assert len(app.list_tasks().tasks) == 1
    assert app.ledger.audit_kind_counts().get("idempotency_conflict") == 1


def test_wrong_connections_are_refused_with_the_reason(app: App, caller: Caller,
                                                       tmp_path: Path) -> None:
    with pytest.raises(InvalidArguments, match="connection="):
        app.submit("ship", {"order_id": "o-1"}, connection="not a connection")
    if caller.pg:
        with psycopg.connect(_base(caller.url), autocommit=True) as conn:
            with pytest.raises(InvalidArguments, match=r"autocommit.*: the task would"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
            with pytest.raises(InvalidArguments, match=r"autocommit.*: the message would"):
                app.emit("order.created", {}, connection=conn)
        with psycopg.connect(_base(caller.url)) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
            with pytest.raises(InvalidArguments, match="already failed"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
        with sqlite3.connect(tmp_path / "other.db") as lite, pytest.raises(
                InvalidArguments, match="psycopg"):
            app.submit("ship", {"order_id": "o-1"}, connection=lite)
    else:
        with sqlite3.connect(tmp_path / "other.db") as conn, pytest.raises(
                InvalidArguments, match="not on the ledger's file"):
            app.submit("ship", {"order_id": "o-1"}, connection=conn)
        conn = caller.connect(isolation_level=None)
        try:
            with pytest.raises(InvalidArguments, match=r"autocommit.*: the message would"):
                app.emit("order.created", {}, connection=conn)
            with pytest.raises(InvalidArguments, match=r"autocommit.*: the task would"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
        finally:
            conn.close()
    assert app.list_tasks().tasks == [] and outbox_rows(app) == []


def test_concurrent_callers_with_one_key_get_one_task(app: App, caller: Caller) -> None:
    """Eight callers, each in its own transaction, submit with the same idempotency key
    and commit: one task, one ``created``, the same id for all. On PostgreSQL all eight
    transactions are open at once (each holds its own order row before the submits);
    SQLite has one writer, so there they take turns."""
    results: list[tuple[str, bool]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def call(n: int) -> None:
        try:
            with caller.connect() as conn:
                if caller.pg:
                    caller.insert_order(conn, f"o-{n}")
                barrier.wait(timeout=30)
                if not caller.pg:
                    caller.insert_order(conn, f"o-{n}")
                handle = app.submit("ship", {"order_id": "same"}, idempotency_key="one",
                                    connection=conn)
                conn.commit()
                results.append((handle.task_id, handle.created))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(results) == 8
    assert len({task_id for task_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert len(app.list_tasks().tasks) == 1
    assert len(caller.orders()) == 8


CALLER = textwrap.dedent("""
    import sqlite3, sys
    import psycopg
    from psycopg import sql
    from ratchet import App
    url, schema = sys.argv[1], sys.argv[2]
    app = App(url)

    @app.task(name="ship")
    def ship(ctx, order_id: str) -> str:
        return order_id

    if url.startswith("postgresql"):
        conn = psycopg.connect(url.split("?", 1)[0])
        table = sql.Identifier(schema, "orders").as_string(None)
        conn.execute(f"INSERT INTO {table} (id) VALUES ('o-1')")
    else:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute("INSERT INTO orders (id) VALUES ('o-1')")
    app.submit("ship", {"order_id": "o-1"}, connection=conn)
    app.emit("order.created", {"order_id": "o-1"}, key="o-1", connection=conn)
    print("WRITTEN", flush=True)
    sys.stdin.read()  # until killed: the caller never commits
""")


def test_sigkill_between_the_caller_insert_and_its_commit_leaves_neither_row(
        app: App, caller: Caller) -> None:
    schema = _schema(caller.url) if caller.pg else ""
    proc = subprocess.Popen([sys.executable, "-c", CALLER, caller.url, schema],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "WRITTEN", line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)  # reaps it and closes its pipes
    assert proc.returncode == -signal.SIGKILL
    # The server rolls the dead session back (PostgreSQL); the next writer of the file
    # rolls the dead transaction back (SQLite).
    wait_for("the killed caller's transaction to be rolled back",
             lambda: caller.orders() == [], timeout_s=30)
    assert app.list_tasks().tasks == []
    assert outbox_rows(app) == []
    # The ledger goes on: a later submit commits.
    handle = app.submit("ship", {"order_id": "o-2"})
    assert app.get(handle.task_id).state is State.PENDING


def test_temporary_tables_named_like_the_ledger_cannot_take_the_rows(
        app: App, caller: Caller) -> None:
    """A caller's temporary ``tasks`` / ``outbox`` table is searched before the ledger's
    schema (PostgreSQL's ``pg_temp``, SQLite's ``temp``): the rows must still land in the
    ledger (PostgreSQL: ``pg_temp`` is put last) or the join is refused (SQLite)."""
    with caller.connect() as conn:
        if caller.pg:
            schema = _schema(caller.url)
            for table in ("tasks", "outbox"):
                source = sql.Identifier(schema, table).as_string(None)
                conn.execute(f"CREATE TEMP TABLE {table} (LIKE {source} INCLUDING ALL)")
            handle = app.submit("ship", {"order_id": "o-1"}, connection=conn)
            app.emit("order.created", {}, key="o-1", connection=conn)
            conn.commit()
            assert [t.task_id for t in app.list_tasks().tasks] == [handle.task_id]
            assert len(outbox_rows(app)) == 1
        else:
            conn.execute("CREATE TEMP TABLE tasks AS SELECT * FROM main.tasks WHERE 0")
            with pytest.raises(InvalidArguments, match="temporary tables"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
            conn.commit()
            assert app.list_tasks().tasks == []


def test_another_database_with_a_ledger_of_the_same_schema_is_refused(
        app: App, caller: Caller) -> None:
    if not caller.pg:
        pytest.skip("PostgreSQL only: on SQLite the connection's file is compared")
    schema = _schema(caller.url)
    other = f"{schema}_other"
    base = _base(caller.url)
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(other)))
    try:
        other_base = base.rsplit("/", 1)[0] + "/" + other
        open_ledger(f"{other_base}?schema={schema}").close()  # a ledger there, same schema
        with psycopg.connect(other_base) as conn:
            with pytest.raises(InvalidArguments, match="another ledger"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
            with pytest.raises(InvalidArguments, match="pipeline"), conn.pipeline():
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(other)))
    assert app.list_tasks().tasks == []
