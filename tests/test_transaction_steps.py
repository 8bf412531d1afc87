"""Transaction steps ("fencing for the user's own tables"): ``ctx.transaction``.

The user's writes to tables in the ledger's own database commit in one transaction with
the step's checkpoint and the fence check; a stale holder's transaction never runs its
function and rolls back as a whole. Every test runs on both ledgers (a SQLite file, a
private PostgreSQL schema whose user tables live in the database's default search_path),
and counts what happened in the user's own table, not in Ratchet's records.

Three tiers: the engine (``Ledger.transaction_step``, including a lost ``COMMIT`` reply),
an in-process worker (occurrences, replay, failures), and real worker processes with a
holder frozen by ``RATCHET_PAUSE_AT`` (before its transaction, and on PostgreSQL inside it).
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgsupport import pg_base_url

from ratchet import App, PermanentError, RetryPolicy, State, TaskContext, TransientError
from ratchet.config import parse_ledger_url
from ratchet.errors import PayloadNotSerializable, TransactionMisuse
from ratchet.ledger.base import Ledger, TaskWrite, Transition
from ratchet.ledger.dialect import CommitOutcomeUnknown
from ratchet.testing import ProcessGroup, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(90)

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.02, max_delay_s=0.1, jitter=0.0)


def transaction(ctx: TaskContext, name: str, fn: Callable[..., Any], *args: Any,
                **kwargs: Any) -> Any:
    """``ctx.transaction`` (worker/transaction.py's ``run_transaction``)."""
    return ctx.transaction(name, fn, *args, **kwargs)


# ---------------------------------------------------------------------- the user's table


@dataclass
class UserTable:
    """A table of the user's in the ledger's database: the ledger's SQLite file, or the
    PostgreSQL database's default search_path (``public``), under a unique name."""

    backend: str
    ledger_url: str
    name: str

    @property
    def mark(self) -> str:
        """The driver's parameter marker."""
        return "?" if self.backend == "sqlite" else "%s"

    def insert_sql(self) -> str:
        m = self.mark
        return f"INSERT INTO {self.name} (task_id, item, generation) VALUES ({m}, {m}, {m})"

    def connect(self) -> Any:
        if self.backend == "sqlite":
            return sqlite3.connect(parse_ledger_url(self.ledger_url).path)
        return psycopg.connect(pg_base_url(), autocommit=True)

    def execute(self, statement: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            cur = conn.execute(statement)
            rows = cur.fetchall() if cur.description else []
            conn.commit()
            return list(rows)
        finally:
            conn.close()

    def rows(self) -> list[tuple[str, int, int]]:
        """``(task_id, item, generation)`` of every row, in insertion order."""
        return [(r[0], int(r[1]), int(r[2])) for r in self.execute(
            f"SELECT task_id, item, generation FROM {self.name} ORDER BY seq")]


@pytest.fixture
def user_table(backend: str, ledger_url: str, app: App) -> Iterator[UserTable]:
    """The user's table, created once the ledger exists (the App migrated it)."""
    assert app.ledger.schema_version() > 0  # the ledger exists before the user's tables
    table = UserTable(backend, ledger_url, f"tx_rows_{secrets.token_hex(5)}")
    key = ("seq INTEGER PRIMARY KEY AUTOINCREMENT" if backend == "sqlite"
           else "seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY")
    table.execute(f"CREATE TABLE {table.name} ({key}, task_id TEXT NOT NULL,"
                  " item INTEGER NOT NULL, generation INTEGER NOT NULL)")
    try:
        yield table
    finally:
        if backend == "postgresql":
            table.execute(f"DROP TABLE IF EXISTS {table.name}")


# ---------------------------------------------------------------------- engine tier


def _claimed(app: App, name: str = "t.tx") -> tuple[str, int]:
    """A task of ``name`` claimed by holder ``h1``: ``(task_id, generation)``."""
    try:
        app.definition(name)
    except Exception:
        app.task(name=name)(lambda ctx: None)
    task_id = app.submit(name, {}).task_id
    (claim,) = app.ledger.claim("h1", [name], 1)
    assert claim.task_id == task_id
    return task_id, claim.generation


def _inserting(table: UserTable, task_id: str, generation: int, calls: Counter[str],
               entry: tuple[Any, ...]) -> Callable[[Any], tuple[Any, ...]]:
    def fn(conn: Any) -> tuple[Any, ...]:
        calls["fn"] += 1
        conn.execute(table.insert_sql(), (task_id, 1, generation))
        return entry

    return fn


def test_engine_commits_user_writes_with_the_checkpoint(app: App, user_table: UserTable) -> None:
    task_id, gen = _claimed(app)
    calls: Counter[str] = Counter()
    write = TaskWrite(task_id, gen, "h1", "transaction:book", steps=[("quote", "42", 0)])
    entry = ("book", '{"booked":1}', 1)
    outcome, got = app.ledger.transaction_step(
        write, _inserting(user_table, task_id, gen, calls, entry))
    assert outcome.ok and not outcome.stale and got == entry
    assert calls["fn"] == 1
    assert user_table.rows() == [(task_id, 1, gen)]
    steps = {s.name: s for s in app.ledger.timeline(task_id).steps}
    assert steps["book"].result_json == '{"booked":1}' and steps["book"].generation == gen
    assert steps["quote"].result_json == "42", "carried pipelined steps commit with it"
    assert app.ledger.get(task_id).state is State.RUNNING


def test_engine_stale_holder_never_runs_its_function(app: App, user_table: UserTable) -> None:
    task_id, gen = _claimed(app)
    # The task moves on to a newer claim (as after a takeover).
    (back,) = app.ledger.commit([TaskWrite(task_id, gen, "h1", "retry",
                                           transition=Transition(State.RETRY_WAIT))])
    assert back.ok
    (newer,) = app.ledger.claim("h2", ["t.tx"], 1)
    assert newer.generation == gen + 1
    calls: Counter[str] = Counter()
    outcome, got = app.ledger.transaction_step(
        TaskWrite(task_id, gen, "h1", "transaction:book", steps=[("quote", "1", 0)]),
        _inserting(user_table, task_id, gen, calls, ("book", "1", 1)))
    assert outcome.stale and not outcome.ok and got is None
    assert outcome.current_generation == gen + 1 and outcome.current_state is State.RUNNING
    assert calls["fn"] == 0 and user_table.rows() == []
    timeline = app.ledger.timeline(task_id)
    assert timeline.steps == []
    (stale,) = [e for e in timeline.events if e.kind == "stale_rejected"]
    assert stale.holder == "h1" and stale.generation == gen
    assert stale.detail["operation"] == "transaction:book"
    assert stale.detail["current_generation"] == gen + 1
    assert app.ledger.stats().stale_rejections == 1


def test_engine_function_error_rolls_everything_back(app: App, user_table: UserTable) -> None:
    task_id, gen = _claimed(app)
    boom = ValueError("user code failed after its insert")

    def fn(conn: Any) -> tuple[Any, ...]:
        conn.execute(user_table.insert_sql(), (task_id, 1, gen))
        raise boom

    with pytest.raises(ValueError) as raised:
        app.ledger.transaction_step(
            TaskWrite(task_id, gen, "h1", "transaction:book", steps=[("quote", "1", 0)]), fn)
    assert raised.value is boom, "the function's own exception, unchanged"
    assert user_table.rows() == []
    assert app.ledger.timeline(task_id).steps == [], "carried steps rolled back too"


def test_engine_database_error_of_user_code_is_raised_unchanged(
    app: App, user_table: UserTable, backend: str
) -> None:
    task_id, gen = _claimed(app)

    def fn(conn: Any) -> tuple[Any, ...]:
        conn.execute(user_table.insert_sql(), (task_id, 1, gen))
        conn.execute("INSERT INTO no_such_table_here VALUES (1)")
        return ("book", "1", 1)

    expected = sqlite3.OperationalError if backend == "sqlite" else psycopg.errors.UndefinedTable
    with pytest.raises(expected):
        app.ledger.transaction_step(TaskWrite(task_id, gen, "h1", "transaction:book"), fn)
    assert user_table.rows() == []
    # The ledger connection is usable afterwards.
    outcome, _ = app.ledger.transaction_step(
        TaskWrite(task_id, gen, "h1", "transaction:book"),
        _inserting(user_table, task_id, gen, Counter(), ("book", "1", 1)))
    assert outcome.ok and user_table.rows() == [(task_id, 1, gen)]


@pytest.mark.parametrize("misuse", ["commit", "rollback", "close", "with", "sql_commit",
                                    "set_attribute"])
def test_engine_refuses_a_function_that_ends_the_transaction(
    app: App, user_table: UserTable, misuse: str
) -> None:
    task_id, gen = _claimed(app)

    def fn(conn: Any) -> tuple[Any, ...]:
        conn.execute(user_table.insert_sql(), (task_id, 1, gen))
        if misuse == "with":
            with conn:
                pass
        elif misuse == "sql_commit":
            conn.execute("COMMIT")
        elif misuse == "set_attribute":
            conn.row_factory = None
        else:
            getattr(conn, misuse)()
        return ("book", "1", 1)

    with pytest.raises(TransactionMisuse):
        app.ledger.transaction_step(TaskWrite(task_id, gen, "h1", "transaction:book"), fn)
    assert app.ledger.timeline(task_id).steps == [], "no checkpoint without the guarantee"
    if misuse != "sql_commit":  # a COMMIT sent as SQL cannot be taken back
        assert user_table.rows() == []
    outcome, _ = app.ledger.transaction_step(
        TaskWrite(task_id, gen, "h1", "transaction:again"),
        lambda conn: ("again", "2", 2))
    assert outcome.ok, "the ledger connection is usable afterwards"


def test_engine_postgres_savepoint_recovers_and_search_path_is_the_default(
    app: App, user_table: UserTable, backend: str
) -> None:
    if backend != "postgresql":
        pytest.skip("PostgreSQL: search_path and aborted transactions")
    task_id, gen = _claimed(app)
    schema = parse_ledger_url(app.ledger.config.url).options["schema"]
    seen: list[Any] = []

    def fn(conn: Any) -> tuple[Any, ...]:
        seen.append(conn.execute("SELECT current_schemas(false)").fetchone()[0])
        try:
            with conn.transaction():  # a savepoint inside the ledger's transaction
                conn.execute("INSERT INTO no_such_table_here VALUES (1)")
        except psycopg.errors.UndefinedTable:
            pass
        conn.execute(user_table.insert_sql(), (task_id, 1, gen))
        return ("book", "1", 1)

    outcome, _ = app.ledger.transaction_step(TaskWrite(task_id, gen, "h1", "transaction:b"), fn)
    assert outcome.ok and user_table.rows() == [(task_id, 1, gen)]
    assert schema not in seen[0], "user code sees the database's search_path, not the ledger's"

    def resets_session(conn: Any) -> tuple[Any, ...]:
        conn.execute("SET search_path TO pg_catalog")  # session-level, not LOCAL
        return ("session", "1", 1)

    outcome, _ = app.ledger.transaction_step(
        TaskWrite(task_id, gen, "h1", "transaction:session"), resets_session)
    assert outcome.ok
    for _ in range(4):  # every pooled connection still finds the ledger's tables
        assert app.ledger.get(task_id).state is State.RUNNING

    def aborted(conn: Any) -> tuple[Any, ...]:
        # Swallowed without a savepoint: the transaction is aborted.
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            conn.execute("INSERT INTO no_such_table_here VALUES (1)")
        return ("later", "1", 2)

    with pytest.raises(TransactionMisuse, match="aborted"):
        app.ledger.transaction_step(TaskWrite(task_id, gen, "h1", "transaction:later"), aborted)
    assert [s.name for s in app.ledger.timeline(task_id).steps] == ["book", "session"]


@pytest.mark.parametrize("committed", [True, False], ids=["lost-reply-committed",
                                                            "lost-reply-rolled-back"])
def test_engine_lost_commit_reply_is_settled_by_the_checkpoint(
    app: App, user_table: UserTable, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """The reply to COMMIT is lost (the dialect raises CommitOutcomeUnknown): the step row
    decides. Committed: acknowledged, ``fn`` not run again. Not committed: ``fn`` runs again
    under the fence; either way the user's table holds exactly one row."""
    task_id, gen = _claimed(app)
    dialect = app.ledger.dialect  # type: ignore[attr-defined]
    real_run = dialect.run
    runs: list[int] = []

    class _Abort(Exception):
        pass

    def flaky_run(body: Callable[[Any], Any], *, write: bool = True,
                  **options: Any) -> Any:
        runs.append(1)
        if len(runs) > 1:
            return real_run(body, write=write, **options)
        if committed:
            real_run(body, write=write, **options)
        else:
            def aborting(tx: Any) -> Any:
                body(tx)
                raise _Abort()

            with contextlib.suppress(_Abort):
                real_run(aborting, write=write, **options)
        raise CommitOutcomeUnknown("connection lost during COMMIT (test)")

    monkeypatch.setattr(dialect, "run", flaky_run)
    calls: Counter[str] = Counter()
    entry = ("book", '"ok"', 0)
    outcome, got = app.ledger.transaction_step(
        TaskWrite(task_id, gen, "h1", "transaction:book"),
        _inserting(user_table, task_id, gen, calls, entry))
    monkeypatch.undo()
    assert outcome.ok and got == entry
    assert calls["fn"] == (1 if committed else 2)
    assert user_table.rows() == [(task_id, 1, gen)]
    (step,) = app.ledger.timeline(task_id).steps
    assert (step.name, step.generation) == ("book", gen)


def test_engine_refuses_effects_and_transitions(app: App) -> None:
    task_id, gen = _claimed(app)
    with pytest.raises(ValueError):
        app.ledger.transaction_step(
            TaskWrite(task_id, gen, "h1", "x", transition=Transition(State.SUCCEEDED)),
            lambda conn: ("x", "1", 0))


# ---------------------------------------------------------------------- worker tier


def test_transaction_steps_in_a_loop_run_once_each_and_replay(
    app: App, user_table: UserTable
) -> None:
    """Three occurrences of one name are three checkpoints; a retried attempt replays them
    from the ledger without running the function again (exactly once in the user's table)."""
    calls: Counter[int] = Counter()

    def book(conn: Any, task_id: str, item: int, generation: int) -> dict[str, int]:
        calls[item] += 1
        conn.execute(user_table.insert_sql(), (task_id, item, generation))
        return {"item": item, "generation": generation}

    @app.task(name="t.loop", retry=FAST)
    def loop(ctx: TaskContext) -> list[Any]:
        quote = ctx.step("quote", lambda: 7)  # pipelined: rides on the first transaction
        booked = [transaction(ctx, "book", book, ctx.task_id, i, ctx.generation)
                  for i in range(3)]
        if ctx.attempt == 1:
            raise TransientError("fail after the transactions: the retry replays them")
        return [quote, *booked]

    handle = app.submit("t.loop", {})
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.SUCCEEDED, info
    assert info.result == [7, *({"item": i, "generation": 1} for i in range(3))]
    assert calls == Counter({0: 1, 1: 1, 2: 1})
    assert user_table.rows() == [(handle.task_id, i, 1) for i in range(3)]
    steps = {s.name: s for s in app.ledger.timeline(handle.task_id).steps}
    assert set(steps) == {"quote", "book", "book#2", "book#3"}
    assert all(s.generation == 1 for s in steps.values())


def test_transaction_failure_rolls_back_and_the_task_fails(
    app: App, user_table: UserTable
) -> None:
    def book(conn: Any, task_id: str) -> None:
        conn.execute(user_table.insert_sql(), (task_id, 1, 1))
        raise PermanentError("refused after the insert")

    @app.task(name="t.fail", retry=FAST)
    def fail(ctx: TaskContext) -> None:
        transaction(ctx, "book", book, ctx.task_id)

    handle = app.submit("t.fail", {})
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.FAILED and "refused after the insert" in (info.last_error or "")
    assert user_table.rows() == []
    assert app.ledger.timeline(handle.task_id).steps == []


def test_transaction_result_must_be_json_and_rolls_back(app: App, user_table: UserTable) -> None:
    def book(conn: Any, task_id: str) -> object:
        conn.execute(user_table.insert_sql(), (task_id, 1, 1))
        return object()

    @app.task(name="t.nojson", retry=FAST)
    def nojson(ctx: TaskContext) -> None:
        transaction(ctx, "book", book, ctx.task_id)

    handle = app.submit("t.nojson", {})
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.FAILED
    assert info.error_class is not None
    assert user_table.rows() == []
    assert PayloadNotSerializable.__name__ in (info.last_error or "") or info.last_error


def test_a_checkpoint_inside_the_transaction_is_refused(app: App, user_table: UserTable) -> None:
    def book(conn: Any, ctx: TaskContext) -> int:
        conn.execute(user_table.insert_sql(), (ctx.task_id, 1, 1))
        return int(ctx.step("inner", lambda: 1))

    @app.task(name="t.nested", retry=FAST)
    def nested(ctx: TaskContext) -> None:
        transaction(ctx, "book", book, ctx)

    handle = app.submit("t.nested", {})
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.FAILED, info
    assert info.error_class is not None and "inside" in (info.last_error or "")
    assert user_table.rows() == []
    assert app.ledger.timeline(handle.task_id).steps == []


# ---------------------------------------------------------------------- real processes

LEASE_S = 2.0

APP_SOURCE = textwrap.dedent('''
    """Transaction-step tasks for real worker processes (tests/test_transaction_steps.py)."""
    import os

    import ratchet
    from ratchet import RetryPolicy, faults

    TABLE = os.environ["TX_TABLE"]
    MARK = "?" if os.environ["TX_BACKEND"] == "sqlite" else "%s"
    app = ratchet.App()


    def book(conn, task_id, generation):
        conn.execute(f"INSERT INTO {TABLE} (task_id, item, generation)"
                     f" VALUES ({MARK}, {MARK}, {MARK})", (task_id, 1, generation))
        # A holder frozen here holds the open transaction (PostgreSQL: its row locks).
        faults.point("test.inside_transaction")
        return {"booked_by": generation}


    @app.task(name="tx.book", retry=RetryPolicy(max_attempts=5, base_delay_s=0.05,
                                                 max_delay_s=0.5))
    def book_task(ctx):
        return ctx.transaction("book", book, ctx.task_id, ctx.generation)
''')


@pytest.fixture
def procs(tmp_path: Path, user_table: UserTable) -> Iterator[ProcessGroup]:
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "txapp.py").write_text(APP_SOURCE)
    group = ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path / "app"],
                         env={"TX_TABLE": user_table.name, "TX_BACKEND": user_table.backend})
    try:
        yield group
    finally:
        group.cleanup()


def _submit_book(app: App) -> str:
    @app.task(name="tx.book", lease_s=LEASE_S)
    def _stub(ctx: TaskContext) -> None:  # runs in the worker processes only
        raise AssertionError("not run here")

    return app.submit("tx.book", {}).task_id


def _wait_lease_expired(ledger: Ledger, task_id: str) -> None:
    def expired() -> bool:
        info = ledger.get(task_id)
        return info.lease_until is not None and ledger.now() > info.lease_until

    wait_for(f"the lease of {task_id} to expire", expired, timeout_s=20)


def _stale_rejections(ledger: Ledger, task_id: str) -> list[Any]:
    return [e for e in ledger.timeline(task_id).events if e.kind == "stale_rejected"]


@pytest.mark.parametrize("frozen", ["before", "inside"])
def test_frozen_holders_transaction_is_rejected_and_the_new_holder_stands(
    app: App, ledger_url: str, user_table: UserTable, procs: ProcessGroup, backend: str,
    frozen: str,
) -> None:
    """Worker A freezes (SIGSTOP) before its transaction, or (PostgreSQL) inside it after
    its insert; its lease expires; worker B takes over and commits the transaction step; A
    is resumed. A's transaction is rejected by the fence (or was rolled back by the server)
    and B's stands: exactly one row in the user's table, written at B's generation."""
    if frozen == "inside" and backend == "sqlite":
        pytest.skip("SQLite: a holder frozen inside a transaction holds the file's write "
                    "lock, every writer waits until it resumes (documented)")
    task_id = _submit_book(app)
    point = "transaction.before_begin" if frozen == "before" else "test.inside_transaction"
    a = procs.worker("txapp:app", ledger_url, name="A", fast_takeover=False,
                     env={"RATCHET_PAUSE_AT": point})
    a_holder = a.holder()
    a.wait_stopped()
    held = app.ledger.get(task_id)
    assert held.state is State.RUNNING and held.holder == a_holder and held.generation == 1
    assert user_table.rows() == [], "nothing of A's transaction is visible"
    _wait_lease_expired(app.ledger, task_id)

    b = procs.worker("txapp:app", ledger_url, name="B", fast_takeover=False)
    b.holder()
    info = app.wait(task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.generation == 2, info
    assert info.result == {"booked_by": 2}
    assert user_table.rows() == [(task_id, 1, 2)]

    a.resume()
    wait_for("A's transaction step to be rejected",
             lambda: _stale_rejections(app.ledger, task_id), timeout_s=20)
    assert a.returncode is None, "the stale holder survives its rejected transaction"
    assert a.stop() == 0 and b.stop() == 0
    (stale,) = _stale_rejections(app.ledger, task_id)
    assert stale.holder == a_holder and stale.generation == 1
    # "inside": the server ended A's session while A was frozen (idle_in_transaction_
    # session_timeout) and rolled its insert back; the dialect takes that as a lost
    # connection (certain rollback) and runs the transaction step again, whose fence read
    # rejects it: fn never runs a second time under a stale claim.
    assert stale.detail["operation"] == "transaction:book", stale
    assert stale.detail["current_generation"] == 2
    # Counted in the user's table: B's row only.
    assert user_table.rows() == [(task_id, 1, 2)]
    after = app.ledger.get(task_id)
    assert (after.state, after.generation, after.result) == (State.SUCCEEDED, 2, {"booked_by": 2})
    (step,) = app.ledger.timeline(task_id).steps
    assert (step.name, step.generation) == ("book", 2)
