"""The SQL catalogues and the schema: both dialects name the same statements, the engine
names only statements that exist, and a ledger migrated step by step from any older
version has exactly the schema of a new one (tables, columns, indexes), on both dialects.
"""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgsupport import private_schema
from psycopg import sql

import ratchet.ledger.budgets as budgets_module
import ratchet.ledger.clock as clock_module
import ratchet.ledger.engine as engine_module
import ratchet.ledger.ops as ops_package
import ratchet.ledger.rows as rows_module
from ratchet import open_ledger
from ratchet.ledger.catalogue import load_catalogue, parse_catalogue
from ratchet.ledger.migrations import ALIGNED_VERSION, load_migrations, split_statements

DIALECTS = ("sqlite", "postgresql")


def _engine_statement_names() -> set[str]:
    """Every statement name the engine (its concerns in ratchet.ledger.ops, and the modules
    it runs statements through: the retry budgets, the clock repair, the row shapes of
    ``ratchet.ledger.rows``, ``Read.rows("name", ...)``) passes to a transaction (first
    string argument of ``tx.rows / one / execute / batch``)."""
    names: set[str] = set()
    ops = sorted(Path(ops_package.__file__).parent.glob("*.py"))
    files = [Path(m.__file__) for m in (engine_module, budgets_module, clock_module,
                                        rows_module)] + ops
    nodes = [node for path in files
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))]
    for node in nodes:
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"rows", "one", "execute", "batch"} and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
        # Reads sent together (Tx.rows_many) are ("name", {params}) pairs.
        if (
            isinstance(node, ast.Tuple) and len(node.elts) == 2
            and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)
            and isinstance(node.elts[1], ast.Dict)
        ):
            names.add(node.elts[0].value)
    return names


def test_both_catalogues_name_the_same_statements() -> None:
    sqlite_names = set(load_catalogue("sqlite"))
    pg_names = set(load_catalogue("postgresql"))
    assert sqlite_names == pg_names, sqlite_names ^ pg_names


def test_the_engine_names_only_catalogued_statements_and_uses_them_all() -> None:
    used = _engine_statement_names()
    assert len(used) > 30
    catalogued = set(load_catalogue("sqlite"))
    # The dialects run "now", "claim_probe", "ledger_identity" (PostgreSQL's check of a
    # joined connection) and "prepared_types" (its prepared statements) themselves.
    assert used == catalogued - {"now", "claim_probe", "ledger_identity",
                                 "prepared_types"}, used ^ catalogued


def test_catalogue_parser_refuses_a_duplicate_name() -> None:
    with pytest.raises(RuntimeError, match="twice"):
        parse_catalogue("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    assert parse_catalogue("-- name: b\n-- comment\nSELECT 1;\nSELECT 2;\n") == {
        "b": ("SELECT 1", "SELECT 2")
    }


# ---------------------------------------------------------------------- SQLite schema


def _sqlite_schema(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master"
            " WHERE name NOT LIKE 'sqlite_stat%' ORDER BY type, name"
        ).fetchall()
        columns = [
            (table, *col)
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            for col in conn.execute(f"PRAGMA table_info({table})")
        ]
        version = conn.execute("PRAGMA user_version").fetchone()
    finally:
        conn.close()
    return [*rows, *sorted(columns), version]


def test_sqlite_schema_replayed_from_every_version_equals_a_new_one(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    open_ledger(f"sqlite:///{fresh}").close()
    expected = _sqlite_schema(fresh)
    migrations = load_migrations("sqlite")
    for start in range(1, len(migrations)):
        path = tmp_path / f"from{start}.db"
        conn = sqlite3.connect(path)
        for migration in migrations[:start]:
            for statement in split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {migration.version}")
        conn.commit()
        conn.close()
        open_ledger(f"sqlite:///{path}").close()  # migrates the rest
        assert _sqlite_schema(path) == expected, f"replayed from version {start}"


# ---------------------------------------------------------------------- PostgreSQL schema


def _pg_schema(conn: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    columns = conn.execute(
        "SELECT table_name, column_name, data_type, is_nullable, column_default,"
        " is_identity FROM information_schema.columns WHERE table_schema = %s"
        " ORDER BY table_name, column_name", (schema,)
    ).fetchall()
    indexes = conn.execute(
        "SELECT tablename, indexname, replace(indexdef, %s, 'S') FROM pg_indexes"
        " WHERE schemaname = %s ORDER BY indexname", (schema, schema)
    ).fetchall()
    constraints = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE connamespace = %s::regnamespace ORDER BY conname", (schema,)
    ).fetchall()
    version = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.schema_version").format(sql.Identifier(schema))
    ).fetchall()
    return [*columns, *indexes, *[(c[0].split(".")[-1], *c[1:]) for c in constraints],
            *version]


def test_postgresql_schema_replayed_from_every_version_equals_a_new_one() -> None:
    migrations = load_migrations("postgresql")
    with private_schema("rt_fresh") as (url, schema):
        open_ledger(url).close()
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            expected = _pg_schema(conn, schema)
    for start in range(1, len(migrations)):
        with private_schema("rt_replay") as (url, schema):
            with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                for migration in migrations[:start]:
                    conn.execute(migration.sql.encode("utf-8"))
                conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (start,))
            open_ledger(url).close()  # migrates the rest
            with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
                assert _pg_schema(conn, schema) == expected, f"replayed from version {start}"


# ------------------------------------------------------------- one numbering, both dialects


def test_from_the_aligned_version_a_number_names_the_same_migration_on_both_dialects() -> None:
    sqlite_steps = {m.version: m.name for m in load_migrations("sqlite")}
    pg_steps = {m.version: m.name for m in load_migrations("postgresql")}
    assert max(sqlite_steps) == max(pg_steps) >= ALIGNED_VERSION
    later = range(ALIGNED_VERSION, max(sqlite_steps) + 1)
    assert [sqlite_steps[v] for v in later] == [pg_steps[v] for v in later]


def test_the_latest_schema_has_the_same_tables_and_columns_on_both_dialects(
        tmp_path: Path) -> None:
    path = tmp_path / "same.db"
    open_ledger(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    try:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%'")]
        on_sqlite = {(table, col[1]) for table in tables
                     for col in conn.execute(f"PRAGMA table_info({table})")}
        sqlite_version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    with private_schema("rt_same") as (url, schema):
        ledger = open_ledger(url)
        pg_version = ledger.schema_version()
        ledger.close()
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as pg:
            on_pg = {(t, c) for t, c in pg.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name <> 'schema_version'", (schema,))}
    assert sqlite_version == pg_version
    assert on_sqlite == on_pg
