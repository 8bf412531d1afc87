"""``ratchet demo`` on a PostgreSQL ledger: a shortened run in a private schema.

The full chaos (real worker processes, SIGKILLs with restarts, a SIGSTOP past the lease),
cut to about 20 seconds. The proof is the payment service's own SQLite file: one charge per
succeeded task, no key charged twice. The schema reset (``DROP SCHEMA ... CASCADE``) is
checked to touch only a schema the demo made.
"""

from __future__ import annotations

import io
from pathlib import Path

import psycopg
import pytest
from pgsupport import private_schema, require_pg, with_params
from psycopg import sql
from rich.console import Console

from ratchet.demo.payments import read_executions
from ratchet.demo.runner import DEMO_PG_SCHEMA, DemoSettings, demo_pg_url, reset_pg_schema, run_demo
from ratchet.errors import ConfigError
from ratchet.serde import loads

TASKS = 120
KILLS = 2

SHORT = DemoSettings(
    arrival_s=2.0,
    batches=4,
    chaos_from=0.1,
    chaos_to=0.8,
    min_kill_gap_s=0.5,
    deadline_s=50.0,
)


def _raw(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url.split("?")[0], autocommit=True, connect_timeout=5)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_on_postgres_charges_each_succeeded_task_once(tmp_path: Path) -> None:
    with private_schema("rt_demo") as (url, schema):
        out = io.StringIO()
        code = run_demo(
            url,
            tasks=TASKS,
            workers=2,
            kills=KILLS,
            seed=7,
            workdir=tmp_path / "demo",
            settings=SHORT,
            console=Console(file=out, width=140, color_system=None),
        )
        report = out.getvalue()
        assert code == 0, report
        assert f"schema {schema}" in report  # the reset is announced
        assert "revocations (fast takeover of dead holders)" in report

        # The ledger: every task of the run is in *this* schema, and succeeded.
        with _raw(url) as conn:
            rows = conn.execute(
                sql.SQL("SELECT params, state FROM {}.tasks").format(sql.Identifier(schema))
            ).fetchall()
        assert len(rows) == TASKS, report
        states = {str(state) for _, state in rows}
        assert states == {"SUCCEEDED"}, report
        keys = [f"charge:{loads(str(params))['order_id']}" for params, _ in rows]

        # The payment service's own file: one charge per succeeded task, zero duplicates.
        executions = read_executions(tmp_path / "demo" / "payments.db")
        assert {k: n for k, n in executions.items() if n != 1} == {}, report
        assert sorted(executions) == sorted(keys), report


def test_demo_pg_url_defaults_to_its_own_schema() -> None:
    url, schema, defaulted = demo_pg_url("postgresql://u@h:5432/db?durability=buffered")
    assert (schema, defaulted) == (DEMO_PG_SCHEMA, True)
    assert "schema=ratchet_demo" in url and "durability=buffered" in url
    same, schema2, defaulted2 = demo_pg_url("postgresql://u@h:5432/db?schema=mine")
    assert (same, schema2, defaulted2) == ("postgresql://u@h:5432/db?schema=mine", "mine", False)


def test_reset_drops_only_a_schema_the_demo_made() -> None:
    require_pg()
    with private_schema("rt_demo") as (url, schema), private_schema("rt_keep") as (_, keep):
        ident, keep_ident = sql.Identifier(schema), sql.Identifier(keep)
        assert reset_pg_schema(url, schema) is False  # absent: created, marked
        with _raw(url) as conn:
            conn.execute(sql.SQL("CREATE TABLE {}.t (x int)").format(ident))
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(keep_ident))
            conn.execute(sql.SQL("CREATE TABLE {}.t (x int)").format(keep_ident))
        assert reset_pg_schema(url, schema) is True  # made by the demo: dropped, recreated
        with _raw(url) as conn:
            assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.t",)).fetchone() == (None,)
            assert conn.execute("SELECT to_regclass(%s)", (f"{keep}.t",)).fetchone() != (None,)
        # A schema the demo did not make (even an empty one, like public) is refused.
        with pytest.raises(ConfigError, match="not created by `ratchet demo`"):
            reset_pg_schema(with_params(url, schema=keep), keep)
        with pytest.raises(ConfigError, match="will not do that"):
            reset_pg_schema(with_params(url, schema="public"), "public")
        with _raw(url) as conn:
            assert conn.execute("SELECT to_regclass(%s)", (f"{keep}.t",)).fetchone() != (None,)
