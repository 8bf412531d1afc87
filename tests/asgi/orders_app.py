"""An orders service on FastAPI with Ratchet: the recipe of docs/how-to/fastapi.md, run
by tests/asgi/test_fastapi_orders.py under a real uvicorn server.

* ``POST /orders`` writes the order row and submits ``ship_order`` in the same
  transaction, on a psycopg ``AsyncConnection`` of the service's pool: both or neither.
  Returns ``{"order_id", "task_id"}`` (201).
* ``GET /orders/{order_id}/result?timeout_s=N`` awaits the task (``wait_async``) and
  returns its state and result, or 504 when it has not settled in time.
* ``GET /healthz``: the event loop answers.

The Ratchet :class:`~ratchet.App` and the connection pool are made on startup and closed on
shutdown (the lifespan). A worker runs the tasks: ``ratchet worker --app orders_app:jobs``
(or ``running_worker(build_ratchet(url))`` in a test).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
import pydantic
from fastapi import FastAPI, HTTPException, Query, Request
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import ratchet
from ratchet import TaskContext, WaitTimeout

MAX_WAIT_S = 30.0
"""The longest a result request may wait, seconds."""


def build_ratchet(ledger_url: str | None = None) -> ratchet.App:
    """The Ratchet app of the service: its tasks, on ``ledger_url`` (None:
    ``RATCHET_LEDGER_URL``). The web service and the worker each build one."""
    app = ratchet.App(ledger_url)

    @app.task(name="ship_order", lease_s=15.0)
    def ship_order(ctx: TaskContext, order_id: str, item: str, quantity: int) -> dict[str, Any]:
        return {"order_id": order_id, "shipped": f"{quantity} x {item}"}

    return app


jobs = build_ratchet()
"""For the worker: ``ratchet worker --app orders_app:jobs`` (``RATCHET_LEDGER_URL``; the
ledger opens at first use, not at import)."""


class NewOrder(pydantic.BaseModel):
    item: str
    quantity: int


def create_app(ledger_url: str | None = None, dsn: str | None = None, *,
               orders_schema: str = "public", pool_size: int = 10) -> FastAPI:
    """The ASGI app. ``ledger_url``: the Ratchet ledger (a ``postgresql://...?schema=``
    URL; None: ``RATCHET_LEDGER_URL``); ``dsn``: the service's own database, the ledger's
    (None: ``ORDERS_DSN``); ``orders_schema``: where the ``orders`` table is."""
    dsn = dsn or os.environ["ORDERS_DSN"]
    orders = sql.Identifier(orders_schema, "orders")

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        ratchet_app = build_ratchet(ledger_url)
        await asyncio.to_thread(lambda: ratchet_app.ledger)  # open (and migrate) off the loop
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=pool_size, open=False)
        await pool.open(wait=True)
        api.state.ratchet, api.state.pool = ratchet_app, pool
        try:
            yield
        finally:
            await pool.close()
            await asyncio.to_thread(ratchet_app.close)

    api = FastAPI(lifespan=lifespan)

    @api.post("/orders", status_code=201)
    async def create_order(order: NewOrder, request: Request) -> dict[str, str]:
        ratchet_app: ratchet.App = request.app.state.ratchet
        order_id = uuid.uuid4().hex
        try:
            # One transaction: the order row and the task commit together, or neither.
            async with request.app.state.pool.connection() as conn, conn.transaction():
                handle = await ratchet_app.submit_async(
                    "ship_order", {"order_id": order_id, "item": order.item,
                                   "quantity": order.quantity},
                    idempotency_key=f"ship:{order_id}", connection=conn)
                await conn.execute(
                    sql.SQL("INSERT INTO {} (id, item, quantity, task_id) "
                            "VALUES (%s, %s, %s, %s)").format(orders),
                    (order_id, order.item, order.quantity, handle.task_id))
        except psycopg.errors.CheckViolation as exc:  # rolled back: no order, no task
            raise HTTPException(422, f"order refused: {exc.diag.message_primary}") from exc
        return {"order_id": order_id, "task_id": handle.task_id}

    @api.get("/orders/{order_id}/result")
    async def order_result(
        order_id: str, request: Request,
        timeout_s: Annotated[float, Query(ge=0.0, le=MAX_WAIT_S)] = 10.0,
    ) -> dict[str, Any]:
        ratchet_app: ratchet.App = request.app.state.ratchet
        async with request.app.state.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL("SELECT task_id FROM {} WHERE id = %s").format(orders), (order_id,))
            row = await cur.fetchone()
        if row is None:
            raise HTTPException(404, f"no order {order_id}")
        try:
            info = await ratchet_app.wait_async(
                row[0], timeout_s=timeout_s)
        except WaitTimeout as exc:
            raise HTTPException(504, f"order {order_id} is not shipped yet") from exc
        return {"order_id": order_id, "task_id": info.task_id, "state": str(info.state),
                "result": info.result}

    @api.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return api


ORDERS_DDL = ("CREATE TABLE {} (id TEXT PRIMARY KEY, item TEXT NOT NULL, "
              "quantity INTEGER NOT NULL CHECK (quantity > 0), task_id TEXT NOT NULL)")
"""The service's table (``sql.SQL(ORDERS_DDL).format(sql.Identifier(schema, "orders"))``)."""
