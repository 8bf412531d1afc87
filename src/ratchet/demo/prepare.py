"""Preparing where a demo run writes: its work dir (wiped on every run, only if it is the
demo's) and, on PostgreSQL, its own schema (dropped and recreated, only if the demo made
it)."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .. import ConfigError, LedgerUnavailable
from ..config import parse_ledger_url
from .settings import DEMO_PG_SCHEMA, PG_SCHEMA_COMMENT, WORKDIR_MARKER

__all__ = ["demo_pg_url", "display_url", "first_line", "prepare_workdir", "reset_pg_schema"]


def demo_pg_url(url: str) -> tuple[str, str, bool]:
    """The URL the demo runs on for a PostgreSQL ledger: ``(url, schema, defaulted)``.

    A URL that names a ``schema=`` is used as it is. Otherwise ``schema=ratchet_demo``
    (:data:`DEMO_PG_SCHEMA`) is added and ``defaulted`` is True, so the demo never runs in,
    and never drops, the ``ratchet`` schema that workers use by default.

    Raises:
        ConfigError: the URL is malformed.
    """
    config = parse_ledger_url(url)
    schema = config.options.get("schema")
    if schema is not None:
        return config.url, schema, False
    parts = urlsplit(config.url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), ("schema", DEMO_PG_SCHEMA)]
    rebuilt = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
    return rebuilt, DEMO_PG_SCHEMA, True


def reset_pg_schema(url: str, schema: str, lock_timeout_s: float = 5.0) -> bool:
    """Make ``schema`` exist and be empty: ``DROP SCHEMA ... CASCADE``, then ``CREATE SCHEMA``.

    Only that schema is touched, and only if it is absent or was created by an earlier
    demo run (its comment says so, see
    :data:`~ratchet.demo.settings.PG_SCHEMA_COMMENT`); the new schema gets that comment.
    Any other existing schema — even an empty one, such as ``public`` — is refused, never
    dropped. Waits at most ``lock_timeout_s`` seconds for locks (a worker of
    an earlier run still holding a table), then gives up.

    Returns:
        True when there was a schema to drop.

    Raises:
        ConfigError: the schema exists and was not created by the demo, it is a system
            schema, or psycopg is missing.
        LedgerUnavailable: no connection, or the schema is in use.
    """
    try:
        import psycopg
        from psycopg import sql

        from ..ledger.postgres import libpq_url
    except ImportError as exc:
        raise ConfigError(
            f"the PostgreSQL demo needs psycopg 3 and psycopg_pool ({exc}); "
            "install them with: pip install 'ratchet[demo]'"
        ) from exc
    config = parse_ledger_url(url)
    ident = sql.Identifier(schema)
    where = f"schema {schema!r} of {display_url(libpq_url(config))}"
    if schema in ("public", "information_schema") or schema.startswith("pg_"):
        raise ConfigError(
            f"the demo drops and recreates its schema on every run; it will not do that to "
            f"{where}: name a schema of its own with ?schema=<name> (default {DEMO_PG_SCHEMA})"
        )
    try:
        with psycopg.connect(libpq_url(config), autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("SET lock_timeout = {}").format(
                    sql.Literal(f"{max(1, int(lock_timeout_s * 1000))}ms")
                )
            )
            row = conn.execute(
                "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
                (schema,),
            ).fetchone()
            if row is not None and row[0] != PG_SCHEMA_COMMENT:
                raise ConfigError(
                    f"{where} exists and was not created by `ratchet demo`, which drops its "
                    "schema on every run; name a new one with ?schema=<name> in the URL "
                    f"(default {DEMO_PG_SCHEMA}), or drop this one yourself if it is a "
                    "leftover of an older demo"
                )
            with conn.transaction():
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
                conn.execute(
                    sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                        ident, sql.Literal(PG_SCHEMA_COMMENT)
                    )
                )
    except psycopg.errors.LockNotAvailable as exc:
        raise LedgerUnavailable(
            f"could not drop {where} within {lock_timeout_s:.0f} s: it is in use (is a worker "
            f"of an earlier demo still running?): {first_line(exc)}"
        ) from exc
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"could not reset {where}: {first_line(exc)}") from exc
    return row is not None


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when it has none)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def display_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for printing)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if netloc == parts.netloc and all(k != "password" for k, _ in pairs):
        return url
    query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def prepare_workdir(workdir: Path) -> Path:
    """Create ``workdir`` empty; wipe it only if it is empty or an earlier demo's directory.

    Raises:
        ConfigError: it exists, is not empty and was not made by the demo.
    """
    workdir = workdir.resolve()
    if workdir.exists():
        if not workdir.is_dir():
            raise ConfigError(f"demo work dir {workdir} exists and is not a directory")
        if any(workdir.iterdir()) and not (workdir / WORKDIR_MARKER).exists():
            raise ConfigError(
                f"demo work dir {workdir} is not empty and was not created by `ratchet demo`; "
                "choose another directory (it is wiped on every run)"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / WORKDIR_MARKER).write_text("created by ratchet demo; wiped on every run\n")
    return workdir
