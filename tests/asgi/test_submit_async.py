"""``await app.submit_async``, ``submit_many_async``, ``emit_async``, ``wait_async`` and
``handle.wait_async``: the sync calls' checks and errors, run off the event loop (the loop
goes on while the ledger write waits), and inside the caller's transaction on a psycopg
``AsyncConnection`` (PostgreSQL) or a ``sqlite3`` connection through a thread. Real
ledgers, a real worker."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from ratchet import (
    App,
    InvalidArguments,
    State,
    SubmitRequest,
    TaskContext,
    UnknownTask,
    WaitTimeout,
)
from ratchet.errors import IdempotencyConflict
from ratchet.testing import running_worker, wait_for


def _schema(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&", 1)[0]


def _base(url: str) -> str:
    return url.split("?", 1)[0]


@pytest.fixture
def shipping(app: App) -> Iterator[App]:
    @app.task(name="ship")
    def ship(ctx: TaskContext, order_id: str) -> str:
        return f"shipped {order_id}"

    app.ledger.migrate()
    yield app


def _orders_table(app: App) -> str:
    url = app.ledger_url or ""
    if url.startswith("postgresql"):
        table = sql.Identifier(_schema(url), "orders").as_string(None)
        with psycopg.connect(_base(url)) as conn:
            conn.execute(f"CREATE TABLE {table} (id TEXT PRIMARY KEY)")
        return table
    with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
        lite.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
    lite.close()
    return "orders"


def _orders(app: App, table: str) -> list[str]:
    url = app.ledger_url or ""
    if url.startswith("postgresql"):
        with psycopg.connect(_base(url)) as conn:
            return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]
    lite = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return [r[0] for r in lite.execute(f"SELECT id FROM {table} ORDER BY id")]
    finally:
        lite.close()


def test_submit_async_and_wait_async_run_a_task(shipping: App) -> None:
    app = shipping

    async def main() -> tuple[Any, ...]:
        one = await app.submit_async("ship", {"order_id": "o-1"}, idempotency_key="o-1")
        again = await app.submit_async("ship", {"order_id": "o-1"}, idempotency_key="o-1")
        many = await app.submit_many_async([SubmitRequest("ship", {"order_id": "o-2"}),
                                            SubmitRequest("ship", {"order_id": "o-3"})])
        mid = await app.emit_async("order.created", {"order_id": "o-1"}, key="o-1")
        first = await one.wait_async(timeout_s=60)
        rest = [await app.wait_async(h.task_id, timeout_s=60) for h in many]
        return one, again, first, rest, mid

    with running_worker(app):
        one, again, first, rest, mid = asyncio.run(main())
    assert one.created and not again.created and again.task_id == one.task_id
    assert first.state is State.SUCCEEDED and first.result == "shipped o-1"
    assert [i.result for i in rest] == ["shipped o-2", "shipped o-3"]
    assert isinstance(mid, str) and mid


def test_the_async_calls_raise_what_the_sync_calls_raise(shipping: App) -> None:
    app = shipping

    async def main() -> None:
        with pytest.raises(UnknownTask):
            await app.submit_async("nope", {})
        with pytest.raises(InvalidArguments):
            await app.submit_async("ship", {"order_id": 1, "extra": True})
        with pytest.raises(InvalidArguments):
            await app.submit_many_async("ship")  # type: ignore[arg-type]
        handle = await app.submit_async("ship", {"order_id": "o-1"})
        with pytest.raises(WaitTimeout):
            await handle.wait_async(timeout_s=0.1)
        with pytest.raises(InvalidArguments, match="timeout_s"):
            await app.wait_async(handle.task_id, timeout_s=-1)

    asyncio.run(main())
    assert len(app.list_tasks().tasks) == 1


def test_the_loop_goes_on_while_the_ledger_write_waits(shipping: App) -> None:
    """Another connection holds the lock the submit needs (SQLite's write lock, or an
    exclusive lock on PostgreSQL's task table); the submit waits for it in its thread,
    and the loop, free, runs the coroutine that lets the lock go. Were the loop blocked by
    the write, the lock would never be let go and the submit would fail."""
    app = shipping
    url = app.ledger_url or ""
    if url.startswith("postgresql"):
        holder: Any = psycopg.connect(_base(url))
        tasks = sql.Identifier(_schema(url), "tasks").as_string(None)
        holder.execute(f"LOCK TABLE {tasks} IN EXCLUSIVE MODE")
    else:
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None,
                                 check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")

    async def main() -> Any:
        submit = asyncio.create_task(app.submit_async("ship", {"order_id": "o-1"}))
        ticks = 0
        while ticks < 20:  # the loop runs other coroutines meanwhile
            await asyncio.sleep(0)
            ticks += 1
        assert not submit.done()
        holder.rollback() if url.startswith("postgresql") else holder.execute("ROLLBACK")
        return await submit

    try:
        handle = asyncio.run(main())
    finally:
        holder.close()
    assert handle.created and app.get(handle.task_id).state is State.PENDING


# ---------------------------------------------------------------- the caller's transaction


@pytest.mark.parametrize("backend", ["postgresql"])
def test_an_async_connection_holds_the_task_in_its_transaction(shipping: App,
                                                              backend: str) -> None:
    app = shipping
    url = app.ledger_url or ""
    table = _orders_table(app)

    async def main() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(_base(url)) as conn:
            await conn.execute("SET search_path TO public")
            async with conn.transaction():
                await conn.execute(f"INSERT INTO {table} (id) VALUES ('o-1')")
                kept = await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)
                (other,) = await app.submit_many_async(
                    [SubmitRequest("ship", {"order_id": "o-2"})], connection=conn)
                await app.emit_async("order.created", {"order_id": "o-1"}, connection=conn)
                # The caller's session is as it was: its search_path, its statements.
                cur = await conn.execute("SHOW search_path")
                assert await cur.fetchone() == ("public",)
                assert app.list_tasks().tasks == []  # not committed yet
            try:
                async with conn.transaction():
                    await conn.execute(f"INSERT INTO {table} (id) VALUES ('o-9')")
                    await app.submit_async("ship", {"order_id": "o-9"}, connection=conn)
                    raise RuntimeError("the handler fails after the submit")
            except RuntimeError:
                pass
            return kept.task_id, other.task_id

    kept, other = asyncio.run(main())
    assert _orders(app, table) == ["o-1"]
    assert {t.task_id for t in app.list_tasks().tasks} == {kept, other}
    with running_worker(app):
        assert app.wait(kept, timeout_s=60).state is State.SUCCEEDED


@pytest.mark.parametrize("backend", ["postgresql"])
def test_async_connections_that_cannot_hold_the_task_are_refused(shipping: App,
                                                                backend: str) -> None:
    app = shipping
    url = app.ledger_url or ""

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(_base(url), autocommit=True) as conn:
            with pytest.raises(InvalidArguments, match="autocommit"):
                await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)
        async with await psycopg.AsyncConnection.connect(_base(url)) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await conn.execute("SELECT 1 / 0")
            with pytest.raises(InvalidArguments, match="already failed"):
                await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)
            await conn.rollback()
            # The sync call cannot join it, and says which call can.
            with pytest.raises(InvalidArguments, match="submit_async"):
                app.submit("ship", {"order_id": "o-1"}, connection=conn)
            # Pipeline mode is refused as for a sync connection.
            async with conn.pipeline():
                with pytest.raises(InvalidArguments, match="pipeline"):
                    await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)

    asyncio.run(main())
    assert app.list_tasks().tasks == []


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_sqlite_connection_is_used_through_a_thread(shipping: App, backend: str) -> None:
    app = shipping
    table = _orders_table(app)
    path = (app.ledger_url or "").removeprefix("sqlite:///")

    async def main() -> str:
        bound = sqlite3.connect(path)
        try:
            with pytest.raises(InvalidArguments, match="check_same_thread=False"):
                await app.submit_async("ship", {"order_id": "o-0"}, connection=bound)
        finally:
            bound.close()
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        try:
            conn.execute(f"INSERT INTO {table} (id) VALUES ('o-1')")
            kept = await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)
            conn.commit()
            conn.execute(f"INSERT INTO {table} (id) VALUES ('o-2')")
            await app.submit_async("ship", {"order_id": "o-2"}, connection=conn)
            conn.rollback()
        finally:
            conn.close()
        return kept.task_id

    kept = asyncio.run(main())
    assert _orders(app, table) == ["o-1"]
    assert [t.task_id for t in app.list_tasks().tasks] == [kept]


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_conflict_leaves_the_async_transaction_usable(shipping: App, backend: str) -> None:
    app = shipping
    url = app.ledger_url or ""
    table = _orders_table(app)
    app.submit("ship", {"order_id": "o-1"}, idempotency_key="k")

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(_base(url)) as conn, \
                conn.transaction():
            await conn.execute(f"INSERT INTO {table} (id) VALUES ('o-9')")
            with pytest.raises(IdempotencyConflict):
                await app.submit_async("ship", {"order_id": "o-2"}, idempotency_key="k",
                                       connection=conn)
            await conn.execute(f"INSERT INTO {table} (id) VALUES ('o-10')")

    asyncio.run(main())
    assert _orders(app, table) == ["o-10", "o-9"]
    assert len(app.list_tasks().tasks) == 1


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_cancelled_submit_ends_its_write_before_the_caller_goes_on(shipping: App,
                                                                     backend: str) -> None:
    """The submit waits on a locked task table when its coroutine is cancelled: the
    cancellation goes on only once the write in flight has ended, so nothing of Ratchet's
    runs on the caller's connection afterwards; the caller's transaction, rolled back by
    the cancellation, takes the task with it."""
    app = shipping
    url = app.ledger_url or ""
    schema = _schema(url)
    table = _orders_table(app)
    holder = psycopg.connect(_base(url))
    holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
        sql.Identifier(schema, "tasks")))

    def waiting() -> bool:
        with psycopg.connect(_base(url)) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE NOT l.granted AND c.relname = 'tasks' AND n.nspname = %s",
                (schema,)).fetchone()
            return bool(row and row[0])

    async def order(conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn.transaction():
            await conn.execute(f"INSERT INTO {table} (id) VALUES ('o-1')")
            await app.submit_async("ship", {"order_id": "o-1"}, connection=conn)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(_base(url)) as conn:
            call = asyncio.create_task(order(conn))
            await asyncio.to_thread(wait_for, "the submit to wait on the lock", waiting, 30)
            call.cancel()
            for _ in range(20):
                await asyncio.sleep(0)
            assert not call.done()  # still ending the write in flight
            holder.rollback()
            with pytest.raises(asyncio.CancelledError):
                await call
            cur = await conn.execute("SELECT 1")  # the connection is the caller's again
            assert await cur.fetchone() == (1,)

    try:
        asyncio.run(main())
    finally:
        holder.close()
    assert _orders(app, table) == []
    assert app.list_tasks().tasks == []


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_sqlalchemy_async_session_gives_its_driver_connection(shipping: App,
                                                                backend: str) -> None:
    app = shipping
    url = app.ledger_url or ""
    table = _orders_table(app)
    engine = create_async_engine(_base(url).replace("postgresql://", "postgresql+psycopg://"))

    async def main() -> str:
        try:
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(text(f"INSERT INTO {table} (id) VALUES ('o-1')"))
                with pytest.raises(InvalidArguments, match="driver_connection"):
                    await app.submit_async("ship", {"order_id": "o-1"},
                                           connection=await session.connection())
                raw = await (await session.connection()).get_raw_connection()
                handle = await app.submit_async("ship", {"order_id": "o-1"},
                                                connection=raw.driver_connection)
            return handle.task_id
        finally:
            await engine.dispose()

    task_id = asyncio.run(main())
    assert _orders(app, table) == ["o-1"]
    assert [t.task_id for t in app.list_tasks().tasks] == [task_id]
