"""The embedded SQLite ledger: one file, WAL mode, many processes on one host.

:class:`SQLiteLedger` is the :class:`~ratchet.ledger.engine.LedgerEngine` over
:class:`SQLiteDialect`. Writes run in ``BEGIN IMMEDIATE`` transactions, so a transaction
holds SQLite's single writer lock from its first statement and the fence check and the
write it guards cannot be interleaved with another writer. The ledger clock is the host
clock read *by SQLite inside the transaction* (``julianday('now')``), never a value passed
in by a worker (a test may map it through :attr:`SQLiteDialect.clock`; what a step of the
host clock does: :mod:`ratchet.ledger.clock`).

Durability levels map to ``PRAGMA synchronous``: ``fsync`` → ``FULL`` (the WAL is synced
on every commit), ``buffered`` → ``NORMAL`` (synced at checkpoints only; survives a
process crash, not power loss).

Stored text whose bytes are not UTF-8 (a damaged or hand-edited file), and a ``BLOB``
where text belongs (the ledger stores none), are read as
:class:`~ratchet.storedtext.UndecodableText`: printable text with ``\\xNN`` escapes that
remembers its bytes, instead of failing every read of the table, so such a row affects
only its own task and every face can show it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from .. import faults
from ..config import Durability, LedgerConfig, redact_url
from ..errors import LedgerError, LedgerUnavailable, SchemaTooNew, WriteRejected
from ..storedtext import decode_stored
from .base import Subscription
from .catalogue import load_catalogue
from .clock import ClockFn
from .engine import LedgerEngine
from .migrations import load_migrations, split_statements

__all__ = ["SQLiteDialect", "SQLiteLedger"]

T = TypeVar("T")

_SYNCHRONOUS = {Durability.FSYNC: "FULL", Durability.BUFFERED: "NORMAL"}
_UNAVAILABLE = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN", "SQLITE_IOERR",
                "SQLITE_READONLY", "SQLITE_FULL", "SQLITE_NOTADB", "SQLITE_CORRUPT",
                "SQLITE_PERM", "SQLITE_PROTOCOL"}
"""Primary result codes of a file that cannot be used now: LedgerUnavailable."""
_REJECTED = {"SQLITE_TOOBIG", "SQLITE_CONSTRAINT", "SQLITE_MISMATCH", "SQLITE_RANGE"}
"""Primary result codes of a write refused for its content: WriteRejected."""


def _row(_cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row as read, except that a ``BLOB`` (bytes; the ledger stores none, a foreign
    writer may) is decoded as stored text (:func:`decode_stored`)."""
    for value in row:
        if type(value) is bytes:
            return tuple(decode_stored(v) if type(v) is bytes else v for v in row)
    return row


def _configure(conn: sqlite3.Connection) -> None:
    """How a connection reads text: UTF-8, and bytes that are not UTF-8 (in ``TEXT`` or a
    ``BLOB``) as :class:`~ratchet.storedtext.UndecodableText`, never an error."""
    conn.text_factory = decode_stored
    conn.row_factory = _row


class _NoSubscription:
    """The subscription of a ledger that cannot notify: nothing to close."""

    def close(self) -> None:
        return None


def _params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """List parameters become JSON arrays (read by ``json_each`` in the statement)."""
    if not params:
        return {}
    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in params.items()}


class _SQLiteTx:
    """A transaction on one connection (see :class:`~ratchet.ledger.dialect.Tx`)."""

    def __init__(self, cur: sqlite3.Cursor, catalogue: Mapping[str, tuple[str, ...]]) -> None:
        self.cur = cur
        self.catalogue = catalogue
        self.statement = "begin"
        self.now = 0.0

    def _run(self, name: str, params: Mapping[str, Any] | None) -> sqlite3.Cursor:
        self.statement = name
        args = _params(params)
        args.setdefault("now", self.now)
        *first, last = self.catalogue[name]
        for sql in first:
            self.cur.execute(sql, args)
        return self.cur.execute(last, args)

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self._run(name, params).fetchall()

    def rows_many(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        return [self.rows(name, params) for name, params in reads]

    def one(self, name: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._run(name, params).fetchone()
        return row

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return self._run(name, params).rowcount

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None:
        if not rows:
            return
        self.statement = name
        (sql,) = self.catalogue[name]
        shared = {"now": self.now, **scalars}
        self.cur.executemany(sql, [{**shared, **row} for row in rows])

    def wake(self) -> None:
        """SQLite has no server to notify; workers poll."""


class SQLiteDialect:
    """SQLite under the ledger engine (see :class:`~ratchet.ledger.dialect.Dialect`).

    Each thread uses its own connection (created on first use), so the worker's writer
    thread, its heartbeat thread and API readers never share one.

    Opening is lazy: nothing touches the file until the first transaction (or
    :meth:`create_private`, :meth:`tables`, :meth:`schema_version`), so
    :class:`SQLiteLedger` can look at a file before deciding to use it.

    Args:
        config: the parsed ledger URL.

    Raises (from the first use):
        LedgerUnavailable: the file cannot be opened (missing directory, not a database).
        SchemaTooNew: the file has a newer schema.
    """

    name = "sqlite"
    probe_before_claim = True
    single_writer = True

    def __init__(self, config: LedgerConfig) -> None:
        self.config = config
        # Pinned once: a later chdir must not make a new thread open another file.
        self.path = os.path.abspath(config.path)
        self.where = self.path
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_lock = threading.Lock()
        self._catalogue = load_catalogue("sqlite")
        self._migrations = load_migrations("sqlite")
        self.latest_version = self._migrations[-1].version
        self._closed = False
        self.clock: ClockFn | None = None  # testing seam (Dialect.clock)

    # ------------------------------------------------------------------ files

    def _check_directory(self) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self.path!r}: directory {directory!r} does not exist"
            )

    def create_private(self) -> None:
        """Create the ledger file readable by its owner only (0600) if it does not exist;
        SQLite gives its -wal and -shm files the same mode."""
        self._check_directory()
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))

    def tables(self) -> list[str]:
        """Names of the tables in the file (read-only look; [] for a missing file)."""
        if not os.path.exists(self.path):
            return []
        return [r[0] for r in self._peek(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite_%' ORDER BY name")]

    def _peek(self, sql: str) -> list[tuple[Any, ...]]:
        """A private read-only query, so that a too-new or foreign file is never touched."""
        self._check_directory()
        try:
            uri = "file:" + urllib.parse.quote(self.path) + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=self.config.busy_timeout_s)
            try:
                _configure(conn)
                return conn.execute(sql).fetchall()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise LedgerUnavailable(
                f"cannot read SQLite ledger {self.path!r}: {exc} "
                "(is it a Ratchet ledger file, and readable?)"
            ) from exc

    # ------------------------------------------------------------------ connections

    def _open(self) -> sqlite3.Connection:
        self._check_directory()
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.config.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            _configure(conn)
            # Read the schema version before anything that could write the file header.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self.path!r}: {exc} "
                "(is it a Ratchet ledger file, and readable?)"
            ) from exc
        if version > self.latest_version:
            conn.close()
            raise SchemaTooNew(version, self.latest_version, self.path)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerUnavailable(
                    f"SQLite ledger {self.path!r} could not switch to WAL mode (got {mode})"
                )
            conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.config.durability]}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS claim_pick"
                         " (id TEXT PRIMARY KEY, from_state TEXT) WITHOUT ROWID")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise LedgerUnavailable(
                f"cannot configure SQLite ledger {self.path!r}: {exc}"
            ) from exc
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise LedgerError("ledger is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._open()
            self._local.conn = conn
            with self._conn_lock:
                self._connections.append(conn)
        return conn

    def _error(self, exc: sqlite3.Error, statement: str) -> LedgerError:
        """Map a driver error: content refused → WriteRejected, file trouble →
        LedgerUnavailable, anything else → LedgerError."""
        text = str(exc)
        code = getattr(exc, "sqlite_errorname", None) or ""
        primary = code.split("_")[0] + "_" + code.split("_")[1] if code.count("_") else code
        if primary in _REJECTED or isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError):
            return WriteRejected(
                f"SQLite ledger {self.path!r} refused write {statement!r}: {text} [{code}]")
        if primary in _UNAVAILABLE:
            return LedgerUnavailable(
                f"SQLite ledger {self.path!r} is busy or gone: {text} [{code}]")
        return LedgerError(f"SQLite ledger {self.path!r} ({statement}): {text} [{code}]")

    def _clock(self, conn_or_tx: Any) -> float:
        """The ledger clock: SQLite's ``julianday('now')``, through :attr:`clock`."""
        (sql,) = self._catalogue["now"]
        now = float(conn_or_tx.execute(sql).fetchone()[0])
        return self.clock(now) if self.clock is not None else now

    def run(self, body: Callable[[Any], T], *, write: bool = True) -> T:
        """One transaction; ``BEGIN IMMEDIATE`` for writes (see ``Dialect.run``)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise LedgerUnavailable(
                f"SQLite ledger {self.path!r} is busy or gone: {exc}") from exc
        cur = conn.cursor()
        tx = _SQLiteTx(cur, self._catalogue)
        try:
            tx.statement = "now"
            tx.now = self._clock(cur)
            result = body(tx)
            if write:
                faults.point("commit.before_commit")
            tx.statement = "commit"
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, tx.statement) from exc
            raise
        finally:
            cur.close()

    def probe(self) -> tuple[bool, float | None]:
        """Lock-free look: may anything be claimable? Also returns the clock it read."""
        try:
            conn = self._conn()
            now = self._clock(conn)
            (sql,) = self._catalogue["claim_probe"]
            return bool(conn.execute(sql, {"now": now}).fetchone()[0]), now
        except sqlite3.Error as exc:
            raise self._error(exc, "claim_probe") from exc

    # ------------------------------------------------------------------ schema

    def schema_version(self) -> int:
        """The file's ``PRAGMA user_version`` (0 for a new file).

        Raises:
            LedgerUnavailable: the file was removed while this ledger had it open (its
                connections would go on reading and writing the deleted file).
        """
        if not os.path.exists(self.path):
            self._check_directory()
            with self._conn_lock:
                opened = bool(self._connections)
            if opened:
                raise LedgerUnavailable(
                    f"SQLite ledger {self.path!r} was removed while open: its open "
                    "connections see only the deleted file")
            return 0
        version: int = self._peek("PRAGMA user_version")[0][0]
        return version

    def migrate(self) -> int:
        """Apply pending migrations, each in its own ``BEGIN IMMEDIATE`` transaction.

        Raises:
            SchemaTooNew: the file has a newer schema (it is not modified).
        """
        conn = self._conn()
        for migration in self._migrations:

            def body(tx: _SQLiteTx, migration: Any = migration) -> None:
                current = tx.cur.execute("PRAGMA user_version").fetchone()[0]
                if current > self.latest_version:
                    raise SchemaTooNew(current, self.latest_version, self.path)
                if current >= migration.version:
                    return
                for statement in split_statements(migration.sql):
                    tx.cur.execute(statement)
                tx.cur.execute(f"PRAGMA user_version = {int(migration.version)}")

            self.run(body)
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        return version

    def backend_settings(self, tx: Any) -> dict[str, str]:
        """Journal mode, synchronous level and path."""
        conn = self._conn()
        return {
            "journal_mode": str(conn.execute("PRAGMA journal_mode").fetchone()[0]),
            "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                conn.execute("PRAGMA synchronous").fetchone()[0], "?"
            ),
            "path": self.path,
        }

    def subscribe(self, on_ready: Callable[[], None]) -> Subscription:
        """SQLite has no server to notify: the subscription never calls back and workers
        poll."""
        return _NoSubscription()

    def close(self) -> None:
        """Close every connection opened by this dialect (all threads)."""
        self._closed = True
        with self._conn_lock:
            for conn in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._connections.clear()

    # ------------------------------------------------------------------ transaction steps

    def user_transaction_slots(self) -> None:
        """See :meth:`Dialect.user_transaction_slots`: no limit (a connection per thread)."""
        return None

    @contextlib.contextmanager
    def user_connection(self, tx: Any) -> Iterator[sqlite3.Connection]:
        """This thread's ledger connection, inside ``tx``'s ``BEGIN IMMEDIATE`` (see
        ``Dialect.user_connection``). The user's code holds SQLite's single write lock
        while it runs: every other writer of the file waits (keep it short)."""
        yield tx.cur.connection

    def transaction_status(self, tx: Any) -> str:
        """``"open"`` or ``"ended"`` (SQLite has no aborted state: a failed statement
        leaves the transaction usable, or rolls it back)."""
        return "open" if tx.cur.connection.in_transaction else "ended"


_LEDGER_TABLES = frozenset({"tasks", "steps", "effects", "audit"})
"""Tables every Ratchet SQLite ledger has, whatever its schema version."""


class SQLiteLedger(LedgerEngine):
    """A :class:`~ratchet.ledger.base.Ledger` on one SQLite file (engine + SQLite dialect).

    Args:
        config: the parsed ledger URL.
        migrate: apply pending migrations on open (the default, "first use").
        must_exist: raise ``LedgerUnavailable`` instead of creating a new file (read-only
            commands).

    A file that exists but holds no Ratchet ledger (``user_version`` 0: an application's
    own database, a typo in the path) is refused untouched when ``must_exist`` is set or
    ``migrate`` is not, and also by ``migrate`` unless it is empty (no tables); so is a file
    whose ``user_version`` is one Ratchet knows but which lacks Ratchet's tables (an
    application numbering its own schema).

    Raises:
        LedgerUnavailable: the file cannot be opened (missing directory, not a database,
            no ledger in it).
        SchemaTooNew: the file has a newer schema; it is not modified.
    """

    def __init__(
        self, config: LedgerConfig, migrate: bool = True, must_exist: bool = False
    ) -> None:
        dialect = SQLiteDialect(config)
        super().__init__(config, dialect)
        self._path = dialect.path
        self.latest_version = dialect.latest_version
        shown = redact_url(config.url)
        exists = os.path.isfile(dialect.path)
        if must_exist and not exists:
            raise LedgerUnavailable(
                f"no ledger at {dialect.path} (from {shown!r}; relative paths are relative "
                "to the current directory). Check --ledger / RATCHET_LEDGER_URL, or create it "
                "with `ratchet migrate`."
            )
        current = dialect.schema_version()
        if current > self.latest_version:
            raise SchemaTooNew(current, self.latest_version, dialect.path)
        if exists and current == 0:
            tables = dialect.tables()
            foreign = must_exist or not migrate or bool(tables)
        elif exists:
            # Applications number their own schemas with user_version too: a version we
            # know is only ours if our tables are there (checked read-only, before anything
            # could switch the file to WAL).
            tables = dialect.tables()
            foreign = not _LEDGER_TABLES.issubset(tables)
        else:
            tables, foreign = [], False
        if foreign:
            listed = ", ".join(tables) if tables else "none"
            raise LedgerUnavailable(
                f"{dialect.path} (from {shown!r}) holds no Ratchet ledger (tables: "
                f"{listed}); it was left untouched. Point --ledger / RATCHET_LEDGER_URL "
                "at a Ratchet ledger file, or at a new path to create one."
            )
        if not exists:
            dialect.create_private()
        if migrate:
            self.migrate()
