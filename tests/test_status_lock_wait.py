"""``Ledger.stats`` (``ratchet status``, the dashboard's front page) does not wait on a lock
another process holds: advancing the counts mark is optional, so it waits at most
``MARK_LOCK_WAIT_S`` for its locks and counts what finished since the old mark instead.

The holder here is a connection of the test's own, standing for a process frozen inside a
write transaction (SQLite: the write lock) or inside a prune batch (PostgreSQL: the mark
row ``FOR SHARE``). The ledgers' busy timeout is a minute; stats must answer long before.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pgsupport import private_schema, require_pg
from psycopg import sql

from ratchet import App, open_ledger
from ratchet.ledger.ops.stats import MARK_LOCK_WAIT_S

BUSY_TIMEOUT_S = 60.0
ANSWERED_WITHIN_S = 20.0  # a third of the busy timeout: stats did not wait for it


def _submit(url: str, n: int) -> None:
    app = App(url)

    @app.task(name="lockwait.job")
    def job(ctx: object) -> None:
        return None

    try:
        for _ in range(n):
            app.submit("lockwait.job")
    finally:
        app.close()


def _stats_in_thread(url: str) -> tuple[dict[str, dict[str, int]], float]:
    """The ledger's counts and the seconds ``stats`` took, or a failure after the busy
    timeout's length (the thread is left; it ends when the lock does)."""
    out: dict[str, object] = {}

    def run() -> None:
        led = open_ledger(url)
        try:
            t0 = time.monotonic()
            out["counts"] = led.stats().counts
            out["took"] = time.monotonic() - t0
        finally:
            led.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BUSY_TIMEOUT_S + 10)
    assert not thread.is_alive(), "stats waited for the lock another process holds"
    return out["counts"], out["took"]  # type: ignore[return-value]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'ledger.db'}?busy_timeout_s={BUSY_TIMEOUT_S}"


def test_sqlite_stats_answers_while_another_process_holds_the_write_lock(
        sqlite_url: str, tmp_path: Path) -> None:
    _submit(sqlite_url, 3)
    holder = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held like a frozen writer's
    try:
        counts, took = _stats_in_thread(sqlite_url)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert counts == {"lockwait.job": {"PENDING": 3}}
    assert took < ANSWERED_WITHIN_S
    assert MARK_LOCK_WAIT_S < ANSWERED_WITHIN_S


def test_sqlite_stats_still_advances_the_mark_when_the_lock_is_free(sqlite_url: str,
                                                                     tmp_path: Path) -> None:
    _submit(sqlite_url, 1)
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        (before,) = conn.execute("SELECT upto FROM counts_mark").fetchone()
        counts, _ = _stats_in_thread(sqlite_url)
        (after,) = conn.execute("SELECT upto FROM counts_mark").fetchone()
    finally:
        conn.close()
    assert counts == {"lockwait.job": {"PENDING": 1}}
    assert after > before


def test_postgres_stats_answers_while_a_prune_batch_holds_the_mark() -> None:
    base = require_pg()
    with private_schema("lockwait") as (url, schema):
        _submit(url, 2)
        with psycopg.connect(base) as holder:
            holder.execute(sql.SQL("SELECT upto FROM {}.counts_mark FOR SHARE").format(
                sql.Identifier(schema)))  # as a prune batch does, left open
            counts, took = _stats_in_thread(url)
            holder.rollback()
        assert counts == {"lockwait.job": {"PENDING": 2}}
        assert took < ANSWERED_WITHIN_S
