"""Shared by the outbox view tests: an outbox with unsent, sent and failing messages and
a relay's lease, written with ``App.emit`` and, for what a relay does (not part of these
tests), direct SQL on the ledger's own tables."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
from psycopg import sql

from ratchet import App
from ratchet.config import parse_ledger_url
from ratchet.ledger.postgres import libpq_url


def sql_run(url: str, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``query`` (``?`` placeholders on SQLite, ``%s`` on PostgreSQL: write it with
    ``{p}``) on the ledger's tables, committed; its rows (none for a write)."""
    config = parse_ledger_url(url)
    if config.scheme == "sqlite":
        conn = sqlite3.connect(config.path)
        try:
            cur = conn.execute(query.format(p="?"), params)
            rows = cur.fetchall()
            conn.commit()
            return rows
        finally:
            conn.close()
    with psycopg.connect(libpq_url(config)) as pg:
        pg.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(config.options.get("schema", "ratchet"))))
        cur = pg.execute(query.format(p="%s"), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def fill_outbox(app: App) -> dict[str, str]:
    """Six messages: two on key ``k1`` (the first sent long ago), two on ``k2`` (the
    second failing), one sent recently, one without key. A relay ``relay-a`` holds
    partitions 0-3 with a lease for a minute, ``relay-old`` one with an expired lease.
    Returns the message ids by role."""
    ids = {
        "old_sent": app.emit("order.paid", {"n": 1}, key="k1"),
        "unsent_k1": app.emit("order.paid", {"n": 2}, key="k1"),
        "unsent_k2": app.emit("order.paid", {"n": 3}, key="k2"),
        "failing": app.emit("order.paid", {"n": 4}, key="k2"),
        "new_sent": app.emit("order.shipped", {"n": 5}, key="k3"),
        "nokey": app.emit("order.shipped", {"n": 6}),
    }
    url = app.ledger_url
    assert url is not None
    day = 86400.0
    sql_run(url, "UPDATE outbox SET sent_at = created_at - {p}, sent_by = 'relay-a', "
                 "created_at = created_at - {p} WHERE message_id = {p}",
            (3 * day, 4 * day, ids["old_sent"]))
    sql_run(url, "UPDATE outbox SET sent_at = created_at, sent_by = 'relay-a' "
                 "WHERE message_id = {p}", (ids["new_sent"],))
    sql_run(url, "UPDATE outbox SET attempts = 3, last_error = 'broker refused: no route' "
                 "WHERE message_id = {p}", (ids["failing"],))
    now = app.ledger.now()
    sql_run(url, "UPDATE outbox_leases SET holder = 'relay-a', generation = 1, "
                 "lease_until = {p} WHERE part < 4", (now + 60,))
    sql_run(url, "UPDATE outbox_leases SET holder = 'relay-old', generation = 1, "
                 "lease_until = {p} WHERE part = 10", (now - 60,))
    return ids
