"""The SQLAlchemy recipe of docs/how-to/your-transaction.md, run as written: a session's
transaction, its DB-API connection handed to ``App.submit(connection=...)``; the task
commits and rolls back with the session (both ledgers)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from ratchet import App, TaskContext


def _engine_url(ledger_url: str) -> str:
    if ledger_url.startswith("sqlite:///"):
        return "sqlite:///" + ledger_url.removeprefix("sqlite:///")
    return "postgresql+psycopg://" + ledger_url.split("://", 1)[1].split("?", 1)[0]


@pytest.mark.parametrize("commit", [True, False])
def test_a_session_transaction_carries_the_task(app: App, ledger_url: str,
                                                commit: bool) -> None:
    @app.task(name="ship")
    def ship(ctx: TaskContext, order_id: str) -> str:
        return order_id

    app.ledger.migrate()
    engine = create_engine(_engine_url(ledger_url))
    schema = ledger_url.rsplit("schema=", 1)[1] + "." if "schema=" in ledger_url else ""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE {schema}orders (id TEXT PRIMARY KEY)"))
        with Session(engine) as session:
            session.begin()
            session.execute(text(f"INSERT INTO {schema}orders (id) VALUES ('o-17')"))
            raw = session.connection().connection.driver_connection
            handle = app.submit("ship", {"order_id": "o-17"}, connection=raw)
            if commit:
                session.commit()
            else:
                session.rollback()
        with engine.connect() as conn:
            orders = conn.execute(text(f"SELECT id FROM {schema}orders")).scalars().all()
    finally:
        engine.dispose()
    tasks = [t.task_id for t in app.list_tasks().tasks]
    if commit:
        assert (orders, tasks) == (["o-17"], [handle.task_id])
    else:
        assert (orders, tasks) == ([], [])
