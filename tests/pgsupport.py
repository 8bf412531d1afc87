"""PostgreSQL for the test suite: where the server is, and a private schema per use.

``RATCHET_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``) names the
server. Tests never touch anything but schemas they create (``rt_<random>``) and drop.
When the server cannot be reached, PostgreSQL tests are skipped with a message that says
so — unless ``CI=true``, where a missing server fails the run (the suite must run in CI).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlencode, urlsplit, urlunsplit

import pytest

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"

_reachable: bool | None = None
_reason = ""


def pg_base_url() -> str:
    """The server the PostgreSQL tests use."""
    return os.environ.get("RATCHET_TEST_PG_URL", DEFAULT_PG_URL)


def require_pg() -> str:
    """Return the base URL, or skip (fail under ``CI=true``) when the server is unreachable."""
    global _reachable, _reason
    if _reachable is None:
        try:
            import psycopg

            with psycopg.connect(pg_base_url(), connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            _reachable = True
        except Exception as exc:
            _reachable = False
            first_line = (str(exc).strip().splitlines() or [""])[0]
            _reason = f"{type(exc).__name__}: {first_line}"
    if not _reachable:
        message = (
            f"PostgreSQL at {pg_base_url()} is not reachable ({_reason}); set "
            "RATCHET_TEST_PG_URL to a server (trust auth) to run the PostgreSQL tests"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    return pg_base_url()


def with_params(base: str, **params: str) -> str:
    """``base`` with query parameters added (replacing any of the same name)."""
    parts = urlsplit(base)
    query = dict(p.split("=", 1) for p in parts.query.split("&") if "=" in p)
    query.update(params)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def drop_schema(base: str, schema: str) -> None:
    """Drop one test schema (and everything in it)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(base, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextmanager
def private_schema(prefix: str = "rt") -> Iterator[tuple[str, str]]:
    """Yield ``(ledger_url, schema)`` of a fresh schema on the test server; drop it after."""
    base = require_pg()
    schema = f"{prefix}_{secrets.token_hex(6)}"
    try:
        yield with_params(base, schema=schema), schema
    finally:
        drop_schema(base, schema)
