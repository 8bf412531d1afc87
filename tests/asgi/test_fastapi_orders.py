"""The FastAPI recipe (docs/how-to/fastapi.md, tests/asgi/orders_app.py) under a real uvicorn
server on a loopback port, real HTTP (httpx), a real worker and the real PostgreSQL: the
order row and its task commit together or not at all, results are awaited with a timeout,
and requests whose ledger writes wait do not hold up the event loop."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest
import uvicorn
from psycopg import sql

from ratchet import App, State
from ratchet.testing import running_worker, wait_for

from .orders_app import ORDERS_DDL, build_ratchet, create_app


@dataclass
class Service:
    base: str  # http://127.0.0.1:PORT
    ledger_url: str
    dsn: str
    schema: str
    jobs: App  # the test's own Ratchet app on the same ledger (reads, the worker)

    def orders(self) -> list[tuple[str, str]]:
        with psycopg.connect(self.dsn) as conn:
            table = sql.Identifier(self.schema, "orders")
            return [(r[0], r[1]) for r in conn.execute(
                sql.SQL("SELECT id, task_id FROM {} ORDER BY id").format(table))]


@pytest.fixture
def service(ledger_url: str) -> Iterator[Service]:
    schema = ledger_url.rsplit("schema=", 1)[1].split("&", 1)[0]
    dsn = ledger_url.split("?", 1)[0]
    jobs = build_ratchet(ledger_url)
    jobs.ledger.migrate()
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL(ORDERS_DDL).format(sql.Identifier(schema, "orders")))
    api = create_app(ledger_url, dsn, orders_schema=schema, pool_size=25)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(api, log_level="warning", access_log=False,
                                           ws="none", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn to start", lambda: server.started, timeout_s=30)
        yield Service(f"http://127.0.0.1:{sock.getsockname()[1]}", ledger_url, dsn, schema,
                      jobs)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
        jobs.close()
    assert not thread.is_alive(), "uvicorn did not stop"


@pytest.mark.parametrize("backend", ["postgresql"])
def test_an_order_and_its_task_commit_together_and_the_result_is_awaited(
        service: Service) -> None:
    with httpx.Client(base_url=service.base, timeout=60) as http:
        made = http.post("/orders", json={"item": "book", "quantity": 2})
        assert made.status_code == 201, made.text
        order_id, task_id = made.json()["order_id"], made.json()["task_id"]
        assert service.orders() == [(order_id, task_id)]
        assert service.jobs.get(task_id).state is State.PENDING

        # No worker yet: the wait times out, 504.
        late = http.get(f"/orders/{order_id}/result", params={"timeout_s": 0.2})
        assert late.status_code == 504, late.text

        # The handler's own row fails after the submit: the transaction rolls back, and
        # the task goes with it.
        refused = http.post("/orders", json={"item": "book", "quantity": 0})
        assert refused.status_code == 422, refused.text
        assert service.orders() == [(order_id, task_id)]
        assert [t.task_id for t in service.jobs.list_tasks().tasks] == [task_id]

        with running_worker(service.jobs):
            done = http.get(f"/orders/{order_id}/result", params={"timeout_s": 30})
        assert done.status_code == 200, done.text
        assert done.json() == {"order_id": order_id, "task_id": task_id,
                               "state": "SUCCEEDED",
                               "result": {"order_id": order_id, "shipped": "2 x book"}}
        assert http.get("/orders/nope/result").status_code == 404


@pytest.mark.parametrize("backend", ["postgresql"])
def test_requests_waiting_on_the_ledger_do_not_block_the_loop(service: Service) -> None:
    """Another session holds an exclusive lock on the task table: 20 order requests, each
    in its own transaction, wait for it inside their submits. Meanwhile the server answers
    a health check, which it could not with its event loop blocked. Once the lock goes,
    all 20 commit, each with its task."""
    tasks = sql.Identifier(service.schema, "tasks")

    def waiting_on_the_lock() -> int:
        with psycopg.connect(service.dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE NOT l.granted AND c.relname = 'tasks' AND n.nspname = %s",
                (service.schema,)).fetchone()
            return int(row[0]) if row else 0

    async def main(holder: psycopg.Connection[object]) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=service.base, timeout=120) as http:
            posts = [asyncio.create_task(http.post("/orders", json={"item": f"i{n}",
                                                                     "quantity": 1}))
                     for n in range(20)]
            await asyncio.to_thread(wait_for, "a submit to wait for the lock",
                                    waiting_on_the_lock, 30)
            health = await http.get("/healthz", timeout=10)
            assert health.json() == {"ok": True}
            assert not any(p.done() for p in posts)
            holder.rollback()
            return await asyncio.gather(*posts)

    with psycopg.connect(service.dsn) as holder:
        holder.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(tasks))
        answers = asyncio.run(main(holder))
    assert [a.status_code for a in answers] == [201] * 20, [a.text for a in answers]
    made = {(a.json()["order_id"], a.json()["task_id"]) for a in answers}
    assert set(service.orders()) == made
    assert {t.task_id for t in service.jobs.list_tasks().tasks} == {t for _, t in made}
