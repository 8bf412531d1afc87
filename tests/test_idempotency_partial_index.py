"""Submits work against a partial idempotency-key index too (PostgreSQL).

The submit names its conflict target as the keyed rows (``ON CONFLICT (idempotency_key)
WHERE idempotency_key IS NOT NULL``), which matches today's full unique index and a partial
one without entries for key-less tasks. A later schema can then swap the index while
processes of this release still run (a rolling upgrade); a conflict target without the
predicate fails against a partial index, which is checked here too.
"""

from __future__ import annotations

import psycopg
import pytest
from pgsupport import private_schema, require_pg
from psycopg import sql

from ratchet import App


def _swap_to_partial(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        tasks = sql.Identifier(schema, "tasks")
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT tasks_idempotency_key_key")
                     .format(tasks))
        conn.execute(sql.SQL("CREATE UNIQUE INDEX tasks_idempotency_key_key ON {} "
                             "(idempotency_key) WHERE idempotency_key IS NOT NULL")
                     .format(tasks))
        with pytest.raises(psycopg.errors.InvalidColumnReference):
            # What a conflict target without the predicate meets then.
            conn.execute(sql.SQL("INSERT INTO {} (id, name, version, params, params_digest, "
                                 "idempotency_key, state, max_attempts, lease_s, run_at, "
                                 "created_at, updated_at) VALUES ('x', 'n', 1, '{{}}', 'd', "
                                 "'k', 'PENDING', 1, 1, 0, 0, 0) "
                                 "ON CONFLICT (idempotency_key) DO NOTHING").format(tasks))


def test_submits_dedupe_by_key_on_a_partial_idempotency_index() -> None:
    base = require_pg()
    with private_schema("idemp") as (url, schema):
        app = App(url)

        @app.task(name="idemp.job")
        def job(ctx: object, n: int) -> int:
            return n

        try:
            first = app.submit("idemp.job", {"n": 1}, idempotency_key="order-1").task_id
            _swap_to_partial(base, schema)
            again = app.submit("idemp.job", {"n": 1}, idempotency_key="order-1").task_id
            other = app.submit("idemp.job", {"n": 2}, idempotency_key="order-2").task_id
            loose = [app.submit("idemp.job", {"n": 3}).task_id for _ in range(3)]
        finally:
            app.close()
        assert again == first
        assert other != first
        assert len({first, other, *loose}) == 5
        with psycopg.connect(base) as conn:
            (count,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(schema, "tasks"))).fetchone() or (0,)
        assert count == 5
