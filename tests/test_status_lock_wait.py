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
from typing import Any

import psycopg
import pytest
from pgsupport import private_schema, require_pg
from psycopg import sql

from ratchet import App, Worker, open_ledger
from ratchet.errors import LedgerUnavailable
from ratchet.ledger.ops import stats as stats_module
from ratchet.ledger.ops.counts import advance_counts
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


def test_postgres_stats_counts_once_when_an_advance_commits_between_its_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another caller's advance of the counts mark (here a session of the test's own doing
    what ``advance_counts`` does) commits between stats' read of the mark and its read of
    the counts: stats reads one snapshot, so the finished tasks and claims are counted
    once, not once in the rollup and again as finished since the old mark."""
    base = require_pg()
    with private_schema("lockwait") as (url, schema):
        app = App(url)

        @app.task(name="lockwait.job")
        def job(ctx: object) -> None:
            return None

        try:
            for _ in range(12):
                app.submit("lockwait.job")
            Worker(app, concurrency=4).run(max_tasks=12, idle_exit_s=5.0)
        finally:
            app.close()
        # The rollup counts up to now - 1 s: wait until the finishes are before that.
        deadline = time.time() + 30
        while time.time() < deadline:
            with psycopg.connect(base) as conn:
                (last,) = conn.execute(sql.SQL("SELECT max(updated_at) FROM {}").format(
                    sql.Identifier(schema, "tasks"))).fetchone() or (None,)
            if last is not None and time.time() > float(last) + 1.1:
                break
            time.sleep(0.05)

        with psycopg.connect(base) as other:
            other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            row = other.execute("SELECT upto FROM counts_mark FOR UPDATE").fetchone()
            assert row is not None
            horizon = time.time() - 1.0
            other.execute(
                "INSERT INTO finished_counts (name, state, n) SELECT name, state, count(*)"
                " FROM tasks WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
                " AND updated_at >= %s AND updated_at < %s GROUP BY name, state"
                " ON CONFLICT (name, state) DO UPDATE SET n = finished_counts.n + excluded.n",
                (row[0], horizon))
            other.execute(
                "INSERT INTO audit_counts (kind, n) SELECT kind, count(*) FROM audit"
                " WHERE at >= %s AND at < %s GROUP BY kind"
                " ON CONFLICT (kind) DO UPDATE SET n = audit_counts.n + excluded.n",
                (row[0], horizon))
            other.execute("UPDATE counts_mark SET upto = %s", (horizon,))

            real = stats_module.COUNTS_READ_MARK

            class CommitAfterMarkRead:
                def first(self, tx: Any, *args: Any, **kwargs: Any) -> Any:
                    mark = real.first(tx, *args, **kwargs)
                    if not other.closed and other.info.transaction_status != 0:
                        other.commit()  # between this read and the counts' read
                    return mark

                def __getattr__(self, name: str) -> Any:
                    return getattr(real, name)

            monkeypatch.setattr(stats_module, "COUNTS_READ_MARK", CommitAfterMarkRead())
            led = open_ledger(url)
            try:
                stats = led.stats()
            finally:
                led.close()
            assert other.info.transaction_status == 0, "the advance never committed"
        assert stats.counts == {"lockwait.job": {"SUCCEEDED": 12}}
        assert stats.claims == 12


def test_postgres_a_lock_not_had_in_time_fails_once_not_as_a_lost_connection() -> None:
    """A transaction's ``lock_wait_s`` passing is the caller's choice not to wait: one
    attempt, reported as the lock not had, with no retry and no check of the pool (which
    are for a lost connection)."""
    base = require_pg()
    with private_schema("lockwait") as (url, schema):
        _submit(url, 1)
        led = open_ledger(url)
        dialect: Any = led.dialect
        attempts: list[int] = []
        real_attempt = dialect._attempt

        def counted(*args: Any, **kwargs: Any) -> Any:
            attempts.append(1)
            return real_attempt(*args, **kwargs)

        dialect._attempt = counted
        try:
            with psycopg.connect(base) as holder:
                holder.execute(sql.SQL("SELECT upto FROM {}.counts_mark FOR SHARE").format(
                    sql.Identifier(schema)))
                with pytest.raises(LedgerUnavailable, match="lock_timeout"):
                    advance_counts(dialect, lock_wait_s=0.05)
                holder.rollback()
            assert len(attempts) == 1
            advance_counts(dialect, lock_wait_s=0.05)  # the lock free: it goes through
        finally:
            led.close()
