"""``ratchet demo`` on a PostgreSQL ledger: the schema it runs in.

The demo drops and recreates its schema on every run; these tests check that the reset
(``DROP SCHEMA ... CASCADE``) touches only a schema the demo made, and that a URL without
``schema=`` never runs in the workers' default schema. The shortened chaos run itself (four
kinds of payment target, SIGKILLs, a sender per kind frozen mid-call, each kind's guarantee
checked at its service; order workflows whose ``shipped`` events the warehouse sends into
the demo's schema, counted at the warehouse and their payment service) and the warehouse's
sender are in tests/test_demo.py, on both ledgers.
"""

from __future__ import annotations

import psycopg
import pytest
from pgsupport import private_schema, require_pg, with_params
from psycopg import sql

from ratchet.demo.runner import DEMO_PG_SCHEMA, demo_pg_url, reset_pg_schema
from ratchet.errors import ConfigError


def _raw(url: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(url.split("?")[0], autocommit=True, connect_timeout=5)


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
