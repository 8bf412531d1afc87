"""The fencing helper for tables kept in another database: ``ratchet.fencing``.

A write to the user's own database (SQLite file, or PostgreSQL) carries the task's fencing
token; a stale holder's write changes nothing and raises ``StaleFencingToken``, and the done
marker keeps the new holder from repeating what the stale one already committed. Counts
are read in the user's tables (``credits``: one row per applied credit), never in
Ratchet's records.

Two tiers: the helper on a connection (both kinds of user database), and real worker
processes on both ledgers with a holder frozen by ``RATCHET_PAUSE_AT`` before its write,
after it, and (PostgreSQL) inside it.
"""

from __future__ import annotations

import secrets
import sqlite3
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgsupport import pg_base_url, require_pg
from psycopg import sql

from ratchet import App, State, TaskContext, fencing
from ratchet.errors import (
    ConfigError,
    FenceError,
    InvalidArguments,
    PayloadNotSerializable,
    TokenRejected,
    TransactionMisuse,
)
from ratchet.fencing import (
    FENCED_STEPS_TABLE,
    FENCES_TABLE,
    StaleFencingToken,
    advance_fence,
    create_fence_tables,
    fence_tables_ddl,
    fenced_step,
)
from ratchet.ledger.base import Ledger
from ratchet.testing import ProcessGroup, wait_for

pytestmark = pytest.mark.timeout(90)


# ---------------------------------------------------------------------- the user's database


@dataclass
class UserDb:
    """The user's own database: a SQLite file, or a private schema on the test server."""

    kind: str
    where: str  # SQLite path, or the PostgreSQL schema

    @property
    def mark(self) -> str:
        return "?" if self.kind == "sqlite" else "%s"

    def connect(self) -> Any:
        """A fresh connection in the driver's default (transactional) mode."""
        if self.kind == "sqlite":
            return sqlite3.connect(self.where)
        conn = psycopg.connect(pg_base_url())
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.where)))
        conn.commit()
        return conn

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            rows = list(conn.execute(statement).fetchall())
            conn.commit()
            return rows
        finally:
            conn.close()

    def credits(self) -> list[tuple[str, int, int]]:
        """``(task_id, token, cents)`` of every credit applied, in order."""
        return [(r[0], int(r[1]), int(r[2])) for r in self.query(
            "SELECT task_id, token, cents FROM credits ORDER BY seq")]

    def balance(self) -> int:
        return int(self.query("SELECT balance FROM accounts WHERE id = 'acc-1'")[0][0])


def _make_user_db(kind: str, tmp_path: Path) -> Iterator[UserDb]:
    if kind == "sqlite":
        db = UserDb("sqlite", str(tmp_path / "accounts.db"))
        key = "seq INTEGER PRIMARY KEY AUTOINCREMENT"
    else:
        base = require_pg()
        db = UserDb("postgresql", f"rt_fx_{secrets.token_hex(5)}")
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(db.where)))
        key = "seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    conn = db.connect()
    try:
        conn.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL)")
        conn.execute("INSERT INTO accounts VALUES ('acc-1', 0)")
        conn.execute(f"CREATE TABLE credits ({key}, task_id TEXT NOT NULL,"
                     " token INTEGER NOT NULL, cents INTEGER NOT NULL)")
        conn.commit()
        create_fence_tables(conn)
    finally:
        conn.close()
    try:
        yield db
    finally:
        if kind == "postgresql":
            with psycopg.connect(pg_base_url(), autocommit=True) as admin:
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(db.where)))


@pytest.fixture(autouse=True)
def _fresh_occurrence_counts() -> Iterator[None]:
    """The tests reuse task ids ("t-1") with hand-made holders, whose fenced-step
    occurrences are counted per (task id, token) for the process: start each test afresh
    (real task ids are unique)."""
    fencing._occurrences.clear()
    yield
    fencing._occurrences.clear()


@pytest.fixture(params=["sqlite", "postgresql"])
def user_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UserDb]:
    """The user's database, each kind in turn."""
    yield from _make_user_db(str(request.param), tmp_path)


class Holder:
    """What a TaskContext gives the helper: a task id and a fencing token."""

    def __init__(self, task_id: str, fencing_token: int) -> None:
        self.task_id = task_id
        self.fencing_token = fencing_token


def _credit(db: UserDb, calls: Counter[str], cents: int = 100) -> Any:
    def apply(conn: Any, holder: Holder) -> dict[str, int]:
        calls["apply"] += 1
        m = db.mark
        conn.execute(f"UPDATE accounts SET balance = balance + {m} WHERE id = 'acc-1'", (cents,))
        conn.execute(f"INSERT INTO credits (task_id, token, cents) VALUES ({m}, {m}, {m})",
                     (holder.task_id, holder.fencing_token, cents))
        return {"credited": cents, "token": holder.fencing_token}

    return apply


# ---------------------------------------------------------------------- helper tier


def test_stale_holder_changes_nothing_and_says_so(user_db: UserDb) -> None:
    calls: Counter[str] = Counter()
    conn = user_db.connect()
    try:
        new = Holder("t-1", 2)
        assert fenced_step(conn, new, "credit", _credit(user_db, calls), new) == {
            "credited": 100, "token": 2}
        old = Holder("t-1", 1)
        with pytest.raises(StaleFencingToken) as raised:
            fenced_step(conn, old, "other", _credit(user_db, calls), old)
        assert isinstance(raised.value, TokenRejected) and isinstance(raised.value, FenceError)
        assert raised.value.key == "t-1"
        assert (raised.value.task_id, raised.value.token, raised.value.highest) == ("t-1", 1, 2)
        assert "stale fencing token 1" in str(raised.value)
        assert calls["apply"] == 1, "the stale holder's function never ran"
    finally:
        conn.close()
    assert user_db.credits() == [("t-1", 2, 100)] and user_db.balance() == 100
    assert user_db.query(f"SELECT task_id, token FROM {FENCES_TABLE}") == [("t-1", 2)]


def test_new_holder_does_not_repeat_what_the_stale_one_committed(user_db: UserDb) -> None:
    """Exactly once, not only "last writer fenced": the old holder committed the step, then
    lost its claim; the new holder gets the stored result and changes nothing."""
    calls: Counter[str] = Counter()
    conn = user_db.connect()
    try:
        old, new = Holder("t-1", 1), Holder("t-1", 2)
        first = fenced_step(conn, old, "credit", _credit(user_db, calls), old)
        again = fenced_step(conn, new, "credit", _credit(user_db, calls), new)
        assert again == first == {"credited": 100, "token": 1}
        assert calls["apply"] == 1
        # The fence moved on all the same: the old holder is out now.
        with pytest.raises(StaleFencingToken):
            fenced_step(conn, Holder("t-1", 1), "credit", _credit(user_db, calls), old)
    finally:
        conn.close()
    assert user_db.credits() == [("t-1", 1, 100)] and user_db.balance() == 100


def test_occurrences_make_one_marker_per_call_and_replay_in_order(user_db: UserDb) -> None:
    calls: Counter[str] = Counter()
    conn = user_db.connect()
    try:
        first = Holder("t-1", 1)
        got = [fenced_step(conn, first, "credit", _credit(user_db, calls, cents), first)
               for cents in (1, 2, 3)]
        replay = Holder("t-1", 2)  # the next attempt: a new context, counted afresh
        again = [fenced_step(conn, replay, "credit", _credit(user_db, calls, cents), replay)
                 for cents in (1, 2, 3)]
    finally:
        conn.close()
    assert got == again == [{"credited": c, "token": 1} for c in (1, 2, 3)]
    assert calls["apply"] == 3
    assert user_db.balance() == 6
    names = sorted(r[0] for r in user_db.query(f"SELECT name FROM {FENCED_STEPS_TABLE}"))
    assert names == ["credit", "credit#2", "credit#3"]


def test_failure_rolls_back_writes_fence_and_marker(user_db: UserDb) -> None:
    conn = user_db.connect()
    holder = Holder("t-1", 5)
    try:
        def failing(conn: Any) -> None:
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'acc-1'")
            raise RuntimeError("after the write")

        with pytest.raises(RuntimeError):
            fenced_step(conn, holder, "credit", failing)
        with pytest.raises(PayloadNotSerializable):
            fenced_step(conn, holder, "credit", lambda conn: object())
        # The failed calls consumed no occurrence: the retry is "credit" again.
        calls: Counter[str] = Counter()
        fenced_step(conn, holder, "credit", _credit(user_db, calls), holder)
    finally:
        conn.close()
    assert user_db.balance() == 100
    assert user_db.query(f"SELECT name, token FROM {FENCED_STEPS_TABLE}") == [("credit", 5)]


def test_misuse_is_refused(user_db: UserDb) -> None:
    conn = user_db.connect()
    holder = Holder("t-1", 1)
    try:
        conn.execute("UPDATE accounts SET balance = 0")  # opens a transaction
        with pytest.raises(ValueError, match="inside a transaction"):
            fenced_step(conn, holder, "credit", lambda conn: 1)
        conn.rollback()
        with pytest.raises(InvalidArguments):
            fenced_step(conn, holder, "credit#2", lambda conn: 1)
        with pytest.raises(TypeError):
            fenced_step(object(), holder, "credit", lambda conn: 1)
        with pytest.raises(ValueError):
            fence_tables_ddl("mysql")
    finally:
        conn.close()
    if user_db.kind == "sqlite":
        auto = sqlite3.connect(user_db.where, isolation_level=None)
    else:
        auto = user_db.connect()
        auto.autocommit = True
    try:
        with pytest.raises(ValueError, match="autocommit"):
            advance_fence(auto, holder)
    finally:
        auto.close()


def test_advance_fence_inside_the_users_own_transaction(user_db: UserDb) -> None:
    """The building block: the fence first, then the caller's writes, one transaction."""
    conn = user_db.connect()
    try:
        for token in (3, 3, 4):  # the same holder writes twice; then a newer claim
            assert advance_fence(conn, Holder("t-9", token)) == token
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'acc-1'")
            conn.commit()
        with pytest.raises(StaleFencingToken) as raised:
            advance_fence(conn, Holder("t-9", 3))
        assert raised.value.highest == 4
        conn.rollback()
        create_fence_tables(conn)  # idempotent
    finally:
        conn.close()
    assert user_db.balance() == 3


# ---------------------------------------------------------------------- real processes

LEASE_S = 2.0

APP_SOURCE = textwrap.dedent('''
    """A task crediting an account in the user's own database, fenced
    (tests/test_fencing_helper.py)."""
    import os
    import sqlite3

    import psycopg
    from psycopg import sql

    import ratchet
    from ratchet import RetryPolicy, faults
    from ratchet.fencing import StaleFencingToken, fenced_step

    KIND = os.environ["FX_KIND"]
    WHERE = os.environ["FX_WHERE"]
    MARK = "?" if KIND == "sqlite" else "%s"
    app = ratchet.App()


    def connect():
        if KIND == "sqlite":
            return sqlite3.connect(WHERE, timeout=30)
        conn = psycopg.connect(os.environ["FX_PG"])
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(WHERE)))
        conn.commit()
        return conn


    def apply(conn, task_id, token, cents):
        conn.execute(f"UPDATE accounts SET balance = balance + {MARK} WHERE id = 'acc-1'",
                     (cents,))
        conn.execute(f"INSERT INTO credits (task_id, token, cents) VALUES"
                     f" ({MARK}, {MARK}, {MARK})", (task_id, token, cents))
        faults.point("test.inside_fenced")
        return {"credited": cents, "token": token}


    def note(line):
        with open(os.environ["FX_NOTES"], "a") as f:
            f.write(line + "\\n")


    @app.task(name="fx.credit", retry=RetryPolicy(max_attempts=5, base_delay_s=0.05,
                                                   max_delay_s=0.5))
    def credit(ctx, cents):
        conn = connect()
        try:
            faults.point("test.before_fenced")
            try:
                result = fenced_step(conn, ctx, "credit", apply, ctx.task_id,
                                     ctx.fencing_token, cents, idle_timeout_s=1.0)
            except StaleFencingToken as exc:
                note(f"stale {exc.token} {exc.highest}")
                raise
            faults.point("test.after_fenced")
            return result
        finally:
            conn.close()
''')


@pytest.fixture
def ext_db(backend: str, tmp_path: Path) -> Iterator[UserDb]:
    """The user's database of the process tests: the same kind as the ledger."""
    yield from _make_user_db(backend, tmp_path)


@pytest.fixture
def procs(tmp_path: Path, ext_db: UserDb) -> Iterator[ProcessGroup]:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "fxapp.py").write_text(APP_SOURCE)
    group = ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path / "app"], env={
        "FX_KIND": ext_db.kind, "FX_WHERE": ext_db.where, "FX_PG": pg_base_url(),
        "FX_NOTES": str(tmp_path / "notes.txt")})
    try:
        yield group
    finally:
        group.cleanup()


def _notes(tmp_path: Path) -> list[str]:
    path = tmp_path / "notes.txt"
    return path.read_text().splitlines() if path.exists() else []


def _wait_lease_expired(ledger: Ledger, task_id: str) -> None:
    def expired() -> bool:
        info = ledger.get(task_id)
        return info.lease_until is not None and ledger.now() > info.lease_until

    wait_for(f"the lease of {task_id} to expire", expired, timeout_s=20)


@pytest.mark.parametrize("frozen", ["before", "after", "inside"])
def test_frozen_holders_fenced_write_is_rejected_and_the_new_holder_stands(
    app: App, ledger_url: str, ext_db: UserDb, procs: ProcessGroup, tmp_path: Path,
    backend: str, frozen: str,
) -> None:
    """Worker A freezes (SIGSTOP) before its fenced write, after it committed, or
    (PostgreSQL) inside it; A's lease expires, worker B takes the task over; A is resumed.

    * before: B credits with token 2; A's write is rejected (StaleFencingToken).
    * after: A's credit (token 1) had committed; B finds its done marker and does not
      credit again; A's ledger write is rejected.
    * inside: the server ends A's session (idle_timeout_s) and rolls A's credit back; B
      credits with token 2; A's ledger write is rejected.

    Whichever: exactly one credit in the user's tables."""
    if frozen == "inside" and backend == "sqlite":
        pytest.skip("SQLite: a holder frozen inside its transaction holds the write lock "
                    "(documented); B waits for it")

    @app.task(name="fx.credit", lease_s=LEASE_S)
    def _stub(ctx: TaskContext, cents: int) -> None:  # runs in the worker processes only
        raise AssertionError("not run here")

    task_id = app.submit("fx.credit", {"cents": 250}).task_id
    a = procs.worker("fxapp:app", ledger_url, name="A", fast_takeover=False,
                     env={"RATCHET_PAUSE_AT": f"test.{frozen}_fenced"})
    a_holder = a.holder()
    a.wait_stopped()
    held = app.ledger.get(task_id)
    assert held.state is State.RUNNING and held.holder == a_holder and held.generation == 1
    committed_by_a = frozen == "after"
    assert ext_db.credits() == ([(task_id, 1, 250)] if committed_by_a else [])
    _wait_lease_expired(app.ledger, task_id)

    b = procs.worker("fxapp:app", ledger_url, name="B", fast_takeover=False)
    b.holder()
    info = app.wait(task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.generation == 2, info
    token = 1 if committed_by_a else 2
    assert info.result == {"credited": 250, "token": token}
    assert ext_db.credits() == [(task_id, token, 250)] and ext_db.balance() == 250

    a.resume()
    if frozen == "before":
        wait_for("A's fenced write to be rejected", lambda: _notes(tmp_path), timeout_s=20)
        assert _notes(tmp_path) == ["stale 1 2"]
    else:
        wait_for("A's ledger write to be rejected", lambda: [
            e for e in app.ledger.timeline(task_id).events if e.kind == "stale_rejected"],
            timeout_s=20)
    assert a.returncode is None, "the stale holder survives"
    assert a.stop() == 0 and b.stop() == 0
    # Counted in the user's tables: one credit, by the holder that committed it.
    assert ext_db.credits() == [(task_id, token, 250)] and ext_db.balance() == 250
    assert ext_db.query(f"SELECT token FROM {FENCES_TABLE} WHERE task_id = '{task_id}'") == [
        (2,)]
    after = app.ledger.get(task_id)
    assert (after.state, after.generation, after.result) == (
        State.SUCCEEDED, 2, {"credited": 250, "token": token})


# ---------------------------------------------------------------------- review fixes


def test_a_holder_built_afresh_per_call_still_counts_occurrences(user_db: UserDb) -> None:
    """Occurrences are counted per claim (task id and token), not per holder object: a loop
    that builds its holder anew on every call still gets one marker per iteration."""
    calls: Counter[str] = Counter()
    conn = user_db.connect()
    try:
        got = [fenced_step(conn, Holder("t-9", 1), "credit",
                           _credit(user_db, calls, cents), Holder("t-9", 1))
               for cents in (1, 2, 3)]
    finally:
        conn.close()
    assert [g["credited"] for g in got] == [1, 2, 3]
    assert calls["apply"] == 3 and user_db.balance() == 6


def test_a_function_that_commits_is_refused(user_db: UserDb) -> None:
    """fn must not end the transaction: its writes and the done marker would no longer
    commit together. Refused with TransactionMisuse; no done marker is written."""
    conn = user_db.connect()
    holder = Holder("t-10", 1)

    def sneaky(conn: Any) -> int:
        conn.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 'acc-1'")
        if user_db.kind == "sqlite":
            conn.commit()
        else:
            conn.execute("COMMIT")
        return 1

    try:
        with pytest.raises((TransactionMisuse, psycopg.Error)):
            fenced_step(conn, holder, "sneaky", sneaky)
        if user_db.kind == "postgresql" and not conn.closed:
            conn.rollback()
    finally:
        conn.close()
    assert user_db.query("SELECT count(*) FROM ratchet_fenced_steps") == [(0,)]


def test_missing_fence_tables_say_how_to_create_them(tmp_path: Path) -> None:
    conn = sqlite3.connect(str(tmp_path / "bare.db"))
    try:
        with pytest.raises(ConfigError, match="create_fence_tables"):
            fenced_step(conn, Holder("t-11", 1), "x", lambda conn: 1)
    finally:
        conn.close()


def test_fenced_step_inside_a_step_is_refused(tmp_path: Path) -> None:
    """A replay returns a step's stored value without running its function, so a fenced
    step (or any checkpoint) inside it would vanish from the replayed code path and shift
    the numbering: refused, the task fails with TransactionMisuse."""
    app = App(f"sqlite:///{tmp_path}/l.db")
    accounts = str(tmp_path / "accounts.db")
    setup = sqlite3.connect(accounts)
    create_fence_tables(setup)
    setup.close()

    @app.task(name="t.nested")
    def nested(ctx: TaskContext) -> Any:
        conn = sqlite3.connect(accounts)
        try:
            return ctx.step("outer", lambda: fenced_step(conn, ctx, "inner", lambda c: 1))
        finally:
            conn.close()

    try:
        handle = app.submit("t.nested", {})
        from ratchet import Worker

        Worker(app, concurrency=1, poll_interval_s=0.01).run(idle_exit_s=0.4)
        info = handle.get()
        assert info.state is State.FAILED and info.error_class == "permanent"
        assert "cannot be called inside a step's function" in (info.last_error or "")
    finally:
        app.close()
