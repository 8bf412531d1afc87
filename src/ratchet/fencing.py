"""Fenced writes to tables kept in another database (DESIGN §5, "a frozen sender").

A worker frozen past its lease (SIGSTOP, a GC pause, a VM migration) can wake up and write
after another worker took its task over. Ratchet fences its own ledger, and
``ctx.transaction`` fences tables in the ledger's database; for tables in **another**
database (SQLite or PostgreSQL, on a connection you own) this module makes the database
itself reject the stale holder, Kleppmann-style: every write carries the task's fencing
token (``ctx.fencing_token``, which grows with every claim of the task) and a write whose
token is lower than the highest one the database has seen for the task changes nothing
and raises :class:`StaleFencingToken`.

The convention: two small tables next to yours (create them once with
:func:`create_fence_tables`, or from :func:`fence_tables_ddl` in your migrations)::

    ratchet_fences        (task_id text PRIMARY KEY, token bigint NOT NULL, updated_at)
    ratchet_fenced_steps  (task_id text, name text, token bigint NOT NULL,
                           result text NOT NULL, PRIMARY KEY (task_id, name))

Exactly once, in one transaction of your database::

    from ratchet.fencing import fenced_step

    @app.task(name="billing.credit")
    def credit(ctx, account: str, cents: int):
        conn = connect_to_accounts_db()  # sqlite3 / psycopg, not in a transaction
        def apply(conn):
            conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?",
                         (cents, account))
            return {"credited": cents}
        return fenced_step(conn, ctx, "credit", apply)

:func:`fenced_step` begins a transaction on ``conn``, advances the task's fence to
``ctx.fencing_token`` with a conditional upsert (a stale holder's upsert changes 0 rows:
:class:`StaleFencingToken`, and the transaction is rolled back), returns the stored
result if this step is already done for the task (the stale holder's earlier commit is
not repeated by the new holder), else runs ``fn(conn)``, records its JSON result as the
step's done marker and commits: the writes, the fence and the marker together. Names
follow ``ctx.step``'s occurrences: the N-th call of ``name`` in the task's code path is
stored as ``name#N`` (N > 1), so a loop makes one marker per iteration.

:func:`advance_fence` is the building block for your own transaction (no done marker:
"last writer fenced", not exactly once): call it first in the transaction, then write.

What each database guarantees:

* **PostgreSQL**: the upsert locks the task's fence row until commit, so holders of one
  task are serialised. A holder frozen *inside* the transaction keeps that lock:
  :func:`fenced_step` sets ``idle_in_transaction_session_timeout`` for its transaction
  (``idle_timeout_s``), so the server ends a frozen holder's session, rolling its writes
  back, and the new holder proceeds. :func:`advance_fence` leaves that to you.
* **SQLite**: the transaction takes the file's write lock at ``BEGIN IMMEDIATE``. A holder
  frozen inside it keeps the lock (other writers get ``database is locked`` after their
  busy timeout) until it resumes and commits; its commit then happened before the new
  holder's, whose done-marker check sees it: still exactly once.

Forks (``ratchet fork``): the fence and the done markers are keyed by the task's
*lineage id* (``ctx.lineage_id``: the first task of its chain of forks, the task's own id
when it is not a fork), not by its task id. A fork therefore finds the original's done
markers (a fenced step the original committed, before or after the fork point, returns the
recorded result in the fork and is not run again) and its tokens are compared against the
original's (a fork's generation starts above every task of its lineage). The ``task_id``
columns hold lineage ids. A holder without ``lineage_id`` is keyed by its ``task_id``.

Keep the rows of ``ratchet_fences``: they are what rejects a stale holder. Delete a task's
rows only once no holder of it can still be alive (long after it finished; for a lineage,
once none of its tasks can be forked or retried any more).
"""

from __future__ import annotations

import collections
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from .errors import ConfigError, TokenRejected, TransactionMisuse
from .serde import dumps, loads
from .validation import check_checkpoint_name

__all__ = [
    "FENCED_STEPS_TABLE",
    "FENCES_TABLE",
    "FencingHolder",
    "StaleFencingToken",
    "advance_fence",
    "create_fence_tables",
    "fence_key",
    "fence_tables_ddl",
    "fenced_step",
]

FENCES_TABLE = "ratchet_fences"
"""Highest fencing token seen per task."""
FENCED_STEPS_TABLE = "ratchet_fenced_steps"
"""Done markers (JSON result) of :func:`fenced_step` per task and stored step name."""

_DDL = {
    "sqlite": [
        f"CREATE TABLE IF NOT EXISTS {FENCES_TABLE} ("
        " task_id TEXT PRIMARY KEY,"
        " token INTEGER NOT NULL,"
        " updated_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        f"CREATE TABLE IF NOT EXISTS {FENCED_STEPS_TABLE} ("
        " task_id TEXT NOT NULL,"
        " name TEXT NOT NULL,"
        " token INTEGER NOT NULL,"
        " result TEXT NOT NULL,"
        " PRIMARY KEY (task_id, name))",
    ],
    "postgresql": [
        f"CREATE TABLE IF NOT EXISTS {FENCES_TABLE} ("
        " task_id text PRIMARY KEY,"
        " token bigint NOT NULL,"
        " updated_at timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP)",
        f"CREATE TABLE IF NOT EXISTS {FENCED_STEPS_TABLE} ("
        " task_id text NOT NULL,"
        " name text NOT NULL,"
        " token bigint NOT NULL,"
        " result text NOT NULL,"
        " PRIMARY KEY (task_id, name))",
    ],
}

_ADVANCE = (
    f"INSERT INTO {FENCES_TABLE} (task_id, token) VALUES (?, ?)"
    " ON CONFLICT (task_id) DO UPDATE SET token = excluded.token,"
    " updated_at = CURRENT_TIMESTAMP"
    f" WHERE {FENCES_TABLE}.token <= excluded.token"
)
"""The fence: insert, or raise the token; a lower token than the stored one changes 0 rows."""
_HIGHEST = f"SELECT token FROM {FENCES_TABLE} WHERE task_id = ?"
_DONE = f"SELECT result FROM {FENCED_STEPS_TABLE} WHERE task_id = ? AND name = ?"
_RECORD = (f"INSERT INTO {FENCED_STEPS_TABLE} (task_id, name, token, result)"
           " VALUES (?, ?, ?, ?)")


class StaleFencingToken(TokenRejected):
    """A fenced write carried a token lower than the highest the database has seen for
    the task: another worker took the task over (a newer claim wrote there). Nothing of
    the transaction may commit (:func:`fenced_step` rolled it back).

    A :class:`~ratchet.errors.TokenRejected` (the user's database is the fenced target,
    the task id its key): raised in the stale worker, which abandons the attempt like a
    stale ledger write (counted as stale; nothing more is written for it).

    Attributes:
        task_id: the task (also ``key``).
        token: the stale token (this worker's ``ctx.fencing_token``).
        highest: the highest token stored for the task.
    """

    def __init__(self, task_id: str, token: int, highest: int | None) -> None:
        super().__init__(task_id, token, highest)
        self.task_id = task_id
        self.args = (
            f"stale fencing token {token} for task {task_id}: the database has seen token "
            f"{highest} (another worker holds a newer claim); the write was not applied",
        )


class FencingHolder(Protocol):
    """What the fence needs from its caller: a :class:`~ratchet.TaskContext` has both (and
    ``lineage_id``, read with ``getattr``: the fence's key when present, else
    ``task_id``)."""

    @property
    def task_id(self) -> str: ...

    @property
    def fencing_token(self) -> int: ...


def _dialect(conn: Any) -> str:
    """``"sqlite"`` for a ``sqlite3.Connection``, else ``"postgresql"`` (psycopg 3)."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite"
    module = type(conn).__module__
    if module.startswith("psycopg"):
        return "postgresql"
    raise TypeError(
        f"ratchet.fencing needs a sqlite3 or psycopg (3) connection, got {type(conn).__name__}"
    )


def _sql(conn: Any, statement: str) -> str:
    """``statement`` (``?`` placeholders) in ``conn``'s parameter style."""
    return statement if _dialect(conn) == "sqlite" else statement.replace("?", "%s")


def _run(conn: Any, statement: str, params: tuple[Any, ...]) -> Any:
    """Execute on a fresh cursor of ``conn`` and return it."""
    cur = conn.cursor()
    cur.execute(_sql(conn, statement), params)
    return cur


def _in_transaction(conn: Any) -> bool:
    if _dialect(conn) == "sqlite":
        return bool(conn.in_transaction)
    import psycopg

    return bool(conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS)


def _missing_table(exc: BaseException) -> bool:
    """True for "no such table" (sqlite3) / undefined table (psycopg, SQLSTATE 42P01)."""
    if isinstance(exc, sqlite3.OperationalError):
        return "no such table" in str(exc)
    return getattr(exc, "sqlstate", None) == "42P01"


def fence_tables_ddl(dialect: str) -> list[str]:
    """The ``CREATE TABLE IF NOT EXISTS`` statements of the convention.

    Args:
        dialect: ``"sqlite"`` or ``"postgresql"``.

    Raises:
        ValueError: another dialect.
    """
    try:
        return list(_DDL[dialect])
    except KeyError:
        raise ValueError(f"dialect must be 'sqlite' or 'postgresql', got {dialect!r}") from None


def create_fence_tables(conn: Any) -> None:
    """Create the convention's tables on ``conn`` if they do not exist, and commit.

    Args:
        conn: a ``sqlite3.Connection`` or a ``psycopg.Connection`` not inside a
            transaction (the tables land where its ``search_path`` creates them).

    Raises:
        TypeError: another kind of connection.
        ValueError: ``conn`` is inside a transaction.
    """
    with _transaction(conn, None):
        for statement in _DDL[_dialect(conn)]:
            _run(conn, statement, ())


def fence_key(holder: FencingHolder) -> str:
    """The key of ``holder``'s fence and done markers: its ``lineage_id`` (a fork shares
    its original's), or its ``task_id`` when it has none."""
    lineage = getattr(holder, "lineage_id", None)
    return str(lineage) if lineage else str(holder.task_id)


def advance_fence(conn: Any, holder: FencingHolder) -> int:
    """Advance the fence of ``holder``'s lineage (:func:`fence_key`: ``holder.task_id``
    unless it is a fork) to ``holder.fencing_token``, inside the caller's
    open transaction on ``conn``; call it before the transaction's other writes.

    The conditional upsert changes 0 rows when the stored token is higher: a stale holder
    gets :class:`StaleFencingToken` and must roll its transaction back (a ``with conn:``
    block on sqlite3, ``with conn.transaction():`` on psycopg do). On PostgreSQL the
    task's fence row stays locked until the transaction ends, so holders of one task never
    interleave; on SQLite the write lock does the same.

    Args:
        conn: ``sqlite3.Connection`` or ``psycopg.Connection``, with a transaction open
            (or opened by this statement: sqlite3's and psycopg's default, non-autocommit
            modes do that).
        holder: the task's context (``task_id``, ``fencing_token``).

    Returns:
        The token now stored (``holder.fencing_token``).

    Raises:
        StaleFencingToken: the database has seen a higher token for the task.
        ConfigError: the fence tables do not exist (:func:`create_fence_tables`).
        ValueError: ``conn`` is in autocommit mode (the fence would not be part of the
            transaction that writes).
        TypeError: another kind of connection.
    """
    task_id = fence_key(holder)
    token = int(holder.fencing_token)
    try:
        changed = _run(conn, _ADVANCE, (task_id, token)).rowcount
    except Exception as exc:
        if _missing_table(exc):
            raise ConfigError(
                f"the fence tables are missing in this database ({exc}); create them once "
                "with ratchet.fencing.create_fence_tables(conn), or from "
                "fence_tables_ddl(...) in your migrations") from exc
        raise
    if not _in_transaction(conn):
        raise ValueError(
            "advance_fence needs a transaction on conn (the connection is in autocommit "
            "mode: the fence was not tied to any write); begin one first")
    if changed == 0:
        row = _run(conn, _HIGHEST, (task_id,)).fetchone()
        raise StaleFencingToken(task_id, token, int(row[0]) if row else None)
    return token


_OCCURRENCES_KEPT = 10_000
"""Claims whose fenced-step occurrence counts are remembered (least recently used go)."""
_occurrences: collections.OrderedDict[tuple[str, int], dict[str, int]] = (
    collections.OrderedDict())
_occurrences_lock = threading.Lock()


def _stored_name(holder: Any, name: str) -> tuple[str, Callable[[], None]]:
    """The stored name of the next call of ``name`` in this claim of the task (``name``,
    then ``name#2``...), and a function that consumes that occurrence (called on success).

    Counted per claim (task id and fencing token: a TaskContext is one claim), not per
    holder object, so a holder built afresh for every call counts the same; only calls
    that returned count, so a call that raised and is tried again keeps its name."""
    claim = (str(holder.task_id), int(holder.fencing_token))
    with _occurrences_lock:
        counts = _occurrences.get(claim)
        if counts is None:
            counts = _occurrences[claim] = {}
            while len(_occurrences) > _OCCURRENCES_KEPT:
                _occurrences.popitem(last=False)
        else:
            _occurrences.move_to_end(claim)
        occurrence = counts.get(name, 0) + 1

    def consume() -> None:
        with _occurrences_lock:
            counts[name] = occurrence

    return (name if occurrence == 1 else f"{name}#{occurrence}"), consume


@contextlib.contextmanager
def _transaction(conn: Any, idle_timeout_s: float | None) -> Iterator[None]:
    """One transaction on ``conn``: begun here, committed on success, rolled back on
    error. SQLite: ``BEGIN IMMEDIATE`` (the write lock first, no lock upgrade later)."""
    if _in_transaction(conn):
        raise ValueError(
            "conn is inside a transaction: fenced_step runs its own (commit or roll back "
            "first, or use advance_fence inside yours)")
    if _dialect(conn) == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        conn.commit()
        return
    with conn.transaction():
        if idle_timeout_s is not None:
            _run(conn, "SELECT set_config('idle_in_transaction_session_timeout', ?, true)",
                 (f"{max(1, round(idle_timeout_s * 1000))}ms",))
        yield


def fenced_step(
    conn: Any,
    holder: FencingHolder,
    name: str,
    fn: Callable[..., Any],
    *args: Any,
    idle_timeout_s: float | None = 10.0,
    **kwargs: Any,
) -> Any:
    """Run ``fn(conn, *args, **kwargs)`` at most once per task (per fork lineage:
    :func:`fence_key`) and step, fenced, in one transaction of ``conn``'s database; return
    its JSON result (the stored one if an earlier holder of the task, or of a task of its
    lineage, already committed this step).

    In one transaction (begun and committed here; rolled back if anything raises):
    :func:`advance_fence`, then the done-marker lookup for ``(fence key, stored name)``;
    found: its stored result is returned and ``fn`` is not called; else ``fn`` runs and its
    result is recorded as the marker with the writes it made.

    Args:
        conn: a ``sqlite3.Connection`` or ``psycopg.Connection`` to the database holding
            your tables and the convention's (:func:`create_fence_tables`), not inside a
            transaction. ``fn`` must not commit or roll it back.
        holder: the task's context (``task_id``, ``fencing_token``).
        name: the step name (unique with its occurrence: the N-th call of ``name`` in the
            task's code path is stored as ``name#N``, counted per claim of the task, only
            for calls that returned); no ``#<digits>`` suffix. Call it from the task's
            code path, not inside a ``ctx.step`` function (refused: a replay returns the
            step's stored value without running it, so the numbering would shift).
        fn: ``fn(conn, *args, **kwargs) -> JSON value``; it writes with ``conn``.
        idle_timeout_s: PostgreSQL only: ``idle_in_transaction_session_timeout`` of this
            transaction, seconds (a holder frozen inside it is disconnected and rolled
            back by the server after that long, freeing the fence row's lock for the new
            holder); None leaves the session's setting.

    Returns:
        The JSON round-trip of ``fn``'s result, or the stored result.

    Raises:
        StaleFencingToken: another worker holds a newer claim of the task; nothing was
            written (a :class:`~ratchet.errors.TokenRejected`: the worker abandons the
            attempt like a stale ledger write).
        InvalidArguments: ``name`` is not a storable step name.
        TransactionMisuse: ``fn`` committed or rolled back the transaction (what it
            committed stays; the done marker was not written), or ``fenced_step`` was
            called inside a ``ctx.step`` / ``ctx.transaction`` function.
        ConfigError: the fence tables do not exist (:func:`create_fence_tables`).
        ValueError: ``conn`` is inside a transaction.
        TypeError: another kind of connection.
        PayloadNotSerializable: ``fn``'s result is not plain JSON (rolled back).
        UndecodableData: the stored result cannot be decoded.
        Exception: what ``fn`` or the database raised (rolled back).
    """
    check_checkpoint_name(name, "fenced step name")
    boundary = getattr(holder, "_boundary", None)
    if callable(boundary):
        boundary()  # a TaskContext: refused inside a step's or transaction's function
    stored_name, consume = _stored_name(holder, name)
    with _transaction(conn, idle_timeout_s):
        token = advance_fence(conn, holder)
        key = fence_key(holder)
        done = _run(conn, _DONE, (key, stored_name)).fetchone()
        if done is not None:
            result_json = str(done[0])
        else:
            result_json = dumps(fn(conn, *args, **kwargs),
                                what=f"result of fenced step {stored_name!r}")
            if not _in_transaction(conn):
                raise TransactionMisuse(
                    f"fenced step {stored_name!r}: its function committed or rolled back "
                    "the transaction it was given, so its writes and the step's done marker "
                    "can no longer commit together (what it committed stays; nothing of "
                    "the step was recorded); do not commit or roll back in fn")
            _run(conn, _RECORD, (key, stored_name, token, result_json))
    consume()
    return loads(result_json, f"stored result of fenced step {stored_name!r}")
