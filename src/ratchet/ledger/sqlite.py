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

The WAL is kept within the volume's free space: before a write, when the volume has less
than twice the WAL file's size free, the dialect checkpoints the WAL into the database file
and truncates it (``wal_checkpoint(TRUNCATE)``, :meth:`SQLiteDialect._make_room`).
SQLite's own checkpoint runs only once the WAL holds ``wal_autocheckpoint`` pages (about 4
MiB), so on a volume with less room than that the WAL would otherwise fill it, and then no
checkpoint could run (it needs room for the database file to grow) and every write would
fail until the volume was enlarged. A full disk (``SQLITE_FULL``) still rolls the
transaction back, nothing committed is lost, and is ``LedgerUnavailable``; once space is
freed, the next write checkpoints first, before new WAL frames could take that space.
A write that would leave less room than the WAL's size (what its checkpoint needs) is
refused as a full disk when the checkpoint cannot complete. ``journal_size_limit`` cuts
the WAL file back after any checkpoint has emptied it. A file
SQLite calls damaged (``SQLITE_CORRUPT``, or ``SQLITE_NOTADB`` for a
file that was a database) is :class:`~ratchet.errors.LedgerCorrupt`.

Stored text whose bytes are not UTF-8 (a damaged or hand-edited file), and a ``BLOB``
where text belongs (the ledger stores none), are read as
:class:`~ratchet.storedtext.UndecodableText`: printable text with ``\\xNN`` escapes that
remembers its bytes, instead of failing every read of the table, so such a row affects
only its own task and every face can show it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .. import faults
from ..config import Durability, LedgerConfig, redact_url
from ..errors import (
    InvalidArguments,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    SchemaTooNew,
    WriteRejected,
)
from ..storedtext import decode_stored
from .base import Subscription
from .catalogue import load_catalogue
from .clock import ClockFn
from .engine import LedgerEngine
from .loopbridge import target_of
from .migrations import load_migrations, split_statements
from .sqlitefile import EMPTY_DETAIL, FILE_CHECK_S, MAGIC, create_whole, file_identity, file_problem
from .sqlitetx import SQLiteTx

__all__ = ["SQLiteDialect", "SQLiteLedger"]

T = TypeVar("T")

log = logging.getLogger("ratchet.ledger.sqlite")

_SYNCHRONOUS = {Durability.FSYNC: "FULL", Durability.BUFFERED: "NORMAL"}
_UNAVAILABLE = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN", "SQLITE_IOERR",
                "SQLITE_READONLY", "SQLITE_FULL", "SQLITE_PERM", "SQLITE_PROTOCOL"}
"""Primary result codes of a file that cannot be used now: LedgerUnavailable."""
_CORRUPT = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}
"""Primary result codes of a damaged file: LedgerCorrupt (``SQLITE_NOTADB`` only for a file
that was a database: see :meth:`SQLiteDialect._is_corruption`)."""
JOURNAL_SIZE_LIMIT_BYTES = 4 * 1024 * 1024
"""``PRAGMA journal_size_limit``: a WAL file that grew past this (a long transaction, a
checkpoint held back by readers) is cut back to it once a checkpoint has emptied it, so
its space goes back to the volume. About the size SQLite's automatic checkpoint
(1000 pages of 4 KiB) lets the WAL reach."""
RECLAIM_BUSY_TIMEOUT_S = 0.25
"""Longest wait (seconds) of a room-making checkpoint for readers and another process's
writer (it blocks this thread's write meanwhile)."""
RECLAIM_RETRY_S = 1.0
"""After a room-making checkpoint that did not complete (a reader in the way), seconds
before writes try another while the volume is merely short of room (a write after a full
disk, or on a volume too full to write, always tries)."""
WAL_HEADROOM_BYTES = 256 * 1024
"""Room kept free beyond the WAL's size for the next write's own WAL frames, bytes (see
:meth:`SQLiteDialect._make_room`)."""


def _primary(exc: sqlite3.Error) -> tuple[str, str]:
    """``(primary result code, extended code)`` of a driver error, e.g. ``("SQLITE_IOERR",
    "SQLITE_IOERR_SHORT_READ")``; empty strings when the driver gives none."""
    code = getattr(exc, "sqlite_errorname", None) or ""
    primary = "_".join(code.split("_")[:2]) if code.count("_") else code
    return primary, code
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


class SQLiteDialect:
    """SQLite under the ledger engine (see :class:`~ratchet.ledger.dialect.Dialect`).

    Each thread uses its own connection (created on first use), so the worker's writer
    thread, its heartbeat thread and API readers never share one.

    Opening is lazy: nothing touches the file until the first transaction (or
    :meth:`create`, :meth:`tables`, :meth:`schema_version`), so
    :class:`SQLiteLedger` can look at a file before deciding to use it.

    Args:
        config: the parsed ledger URL.

    Raises (from the first use):
        LedgerUnavailable: the file cannot be opened (missing directory, not a database).
        SchemaTooNew: the file has a newer schema.
    """

    name = "sqlite"
    probe_before_claim = True
    walks_queue_pairs = False
    speculative_claims = False
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
        self._wal_path = self.path + "-wal"
        self._room_check_at = float("-inf")  # monotonic: _make_room may checkpoint again
        self._full = False  # a write failed on a full disk and no checkpoint completed since
        self.corruption: LedgerCorrupt | None = None
        """The last :class:`LedgerCorrupt` this dialect raised, if any (kept until it is
        closed: a damaged page stays damaged, and a restored file is a new file, which
        every process must open anew)."""
        self._opened: tuple[int, int] | None = None  # file_identity when first opened
        self._file_check_at = float("-inf")  # monotonic: next look at the file
        self._file_lost: LedgerCorrupt | None = None  # the file is gone from under us

    # ------------------------------------------------------------------ files

    def _check_directory(self) -> None:
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self.path!r}: directory {directory!r} does not exist"
            )

    def create(self) -> bool:
        """Create a new ledger at the latest schema version unless a file is at the path.

        The schema is built in a temporary file (mode 0600; SQLite gives its -wal and
        -shm files the same mode) in the same directory and linked into place only once
        complete (:func:`~ratchet.ledger.sqlitefile.create_whole`), so the path never
        holds an empty or half-made ledger, and of two processes creating it at once one
        links its file and the other opens that one.

        Returns:
            True when this call created the file; False when a file was already there.

        Raises:
            LedgerUnavailable: the directory is missing, or the file could not be made
                (a full disk, no permission); nothing appears at the path.
        """
        self._check_directory()

        def build(temp: str) -> None:
            builder = SQLiteDialect(dataclasses.replace(self.config, path=temp))
            try:
                builder.migrate()
                # Everything into the file itself: only the file is linked into place.
                busy, _, _ = builder._conn().execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if busy:
                    raise LedgerUnavailable(
                        f"could not checkpoint the new SQLite ledger {temp!r}")
            finally:
                builder.close()

        try:
            return create_whole(self.path, build)
        except (OSError, sqlite3.Error) as exc:
            raise LedgerUnavailable(
                f"cannot create SQLite ledger {self.path!r}: {exc}") from exc

    def check_not_empty(self) -> None:
        """Refuse an existing file that is empty: a ledger Ratchet created never is
        (:meth:`create`), so it was truncated, and migrating it would silently start a new
        ledger in place of the lost one.

        Raises:
            LedgerCorrupt: the file is empty (remembered in :attr:`corruption`).
        """
        try:
            empty = os.stat(self.path).st_size == 0
        except OSError:
            return
        if empty:
            raise self._file_corrupt(EMPTY_DETAIL)

    def _file_corrupt(self, detail: str) -> LedgerCorrupt:
        """The :class:`LedgerCorrupt` of a file truncated, replaced or removed (``detail``),
        remembered in :attr:`corruption`."""
        error = LedgerCorrupt(
            self.path, detail, remedy="delete the file (and its -wal and -shm files) to "
                                      "start a new, empty ledger")
        self.corruption = error
        return error

    def _check_file(self, now_too: bool = False) -> None:
        """At most every :data:`FILE_CHECK_S` (or at once, ``now_too``): is the open file
        still whole at its path? SQLite's open connections go on with what they cached
        when the file is truncated, replaced or removed, so this dialect looks
        (:func:`file_problem`). Once it found such a problem every later call raises it
        again.

        Raises:
            LedgerCorrupt: the file is gone, another one, empty or overwritten.
        """
        if self._file_lost is not None:
            raise self._file_lost
        now = time.monotonic()
        if self._opened is None or (now < self._file_check_at and not now_too):
            return
        self._file_check_at = now + FILE_CHECK_S
        problem = file_problem(self.path, self._opened)
        if problem is not None:
            self._file_lost = self._file_corrupt(problem)
            raise self._file_lost

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
            if self._is_corruption(exc):
                raise self._corrupt(exc) from exc
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
            if self._is_corruption(exc):
                raise self._corrupt(exc) from exc
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
            conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS claim_pick"
                         " (id TEXT PRIMARY KEY, from_state TEXT) WITHOUT ROWID")
        except sqlite3.DatabaseError as exc:
            conn.close()
            if self._is_corruption(exc):
                raise self._corrupt(exc) from exc
            raise LedgerUnavailable(
                f"cannot configure SQLite ledger {self.path!r}: {exc}"
            ) from exc
        if self._opened is None:
            with contextlib.suppress(OSError):
                self._opened = file_identity(self.path)
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise LedgerError("ledger is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # A new connection to a file truncated under the open ones would wait for their
            # locks (the busy timeout) to write a new, empty database into it.
            self._check_file(now_too=True)
            conn = self._open()
            self._local.conn = conn
            with self._conn_lock:
                self._connections.append(conn)
        return conn

    def _is_corruption(self, exc: sqlite3.Error) -> bool:
        """True when ``exc`` says the file is damaged: ``SQLITE_CORRUPT``, or
        ``SQLITE_NOTADB`` for a file that starts like a SQLite database or that this dialect
        already had open (a file that never was one, e.g. a wrong path, is not corrupt)."""
        primary, _ = _primary(exc)
        if primary not in _CORRUPT:
            return False
        if primary == "SQLITE_CORRUPT":
            return True
        with self._conn_lock:
            if self._connections:
                return True
        try:
            with open(self.path, "rb") as f:
                return f.read(len(MAGIC)) == MAGIC
        except OSError:
            return False

    def _corrupt(self, exc: sqlite3.Error) -> LedgerCorrupt:
        """The :class:`LedgerCorrupt` for ``exc``, remembered in :attr:`corruption`."""
        _, code = _primary(exc)
        error = LedgerCorrupt(
            self.path, f"{exc} [{code}]",
            remedy="salvage what is readable into a new file with "
                   f"`sqlite3 {self.path} .recover | sqlite3 NEW.db`")
        self.corruption = error
        return error

    def _error(self, exc: sqlite3.Error, statement: str) -> LedgerError:
        """Map a driver error: content refused → WriteRejected, a damaged file →
        LedgerCorrupt, a full disk or file trouble → LedgerUnavailable, anything else →
        LedgerError."""
        text = str(exc)
        primary, code = _primary(exc)
        if primary in _REJECTED or isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError):
            return WriteRejected(
                f"SQLite ledger {self.path!r} refused write {statement!r}: {text} [{code}]")
        if self._is_corruption(exc):
            return self._corrupt(exc)
        if primary == "SQLITE_FULL":
            return LedgerUnavailable(
                f"SQLite ledger {self.path!r}: the disk is full ({text} [{code}]); the "
                f"transaction ({statement}) was rolled back, nothing committed is lost. Free "
                f"space on the volume of {os.path.dirname(self.path)!r}: the ledger then "
                "checkpoints its WAL and carries on by itself")
        if primary in _UNAVAILABLE:
            return LedgerUnavailable(
                f"SQLite ledger {self.path!r} is busy or gone: {text} [{code}]")
        return LedgerError(f"SQLite ledger {self.path!r} ({statement}): {text} [{code}]")

    def _clock(self, conn_or_tx: Any) -> float:
        """The ledger clock: SQLite's ``julianday('now')``, through :attr:`clock`."""
        (sql,) = self._catalogue["now"]
        now = float(conn_or_tx.execute(sql).fetchone()[0])
        return self.clock(now) if self.clock is not None else now

    def _make_room(self, conn: sqlite3.Connection) -> None:
        """Before a write: keep the WAL within the volume's free space.

        When the volume has less than twice the WAL file's size free (or a write failed on
        a full disk), checkpoint the WAL into the database file and truncate it
        (:meth:`_reclaim`; one that did not complete is tried again after
        :data:`RECLAIM_RETRY_S`). When the free space is also below the WAL's size plus
        :data:`WAL_HEADROOM_BYTES` and the checkpoint did not complete, the write is
        refused: the checkpoint needs that room for the database file to grow into, and
        once a write had taken it no checkpoint could run until space was freed by hand.
        Two ``stat`` calls when there is room.

        Raises:
            LedgerUnavailable: the volume is too full to write and keep a checkpoint
                possible (nothing was written).
        """
        if self._full:
            self._reclaim(conn)
            return
        try:
            wal_bytes = os.stat(self._wal_path).st_size
            if not wal_bytes:
                return
            volume = os.statvfs(os.path.dirname(self.path))
        except OSError:
            return
        free = volume.f_bavail * volume.f_frsize
        if free >= 2 * wal_bytes:
            return
        critical = free < wal_bytes + WAL_HEADROOM_BYTES
        now = time.monotonic()
        if critical or now >= self._room_check_at:
            if self._reclaim(conn):
                return
            self._room_check_at = now + RECLAIM_RETRY_S
        if critical:
            raise LedgerUnavailable(
                f"SQLite ledger {self.path!r}: the disk is full: {free} bytes free on its "
                f"volume, not enough for the {wal_bytes}-byte WAL to be checkpointed after "
                "one more write; the write was refused, nothing committed is lost. Free "
                f"space on the volume of {os.path.dirname(self.path)!r}: the ledger then "
                "checkpoints its WAL and carries on by itself")

    def _reclaim(self, conn: sqlite3.Connection) -> bool:
        """``PRAGMA wal_checkpoint(TRUNCATE)`` on ``conn`` (outside any transaction),
        waiting at most :data:`RECLAIM_BUSY_TIMEOUT_S` for readers and writers. Copies the
        WAL into the database file (which grows into the room there is) and truncates the
        WAL to 0 bytes, giving its space back. Ends the full-disk state when it completes;
        a failure (no room yet, a reader in the way) is left for a later write to try
        again.

        Returns:
            True when the checkpoint completed.
        """
        try:
            with self._waiting_at_most(
                    conn, min(RECLAIM_BUSY_TIMEOUT_S, self.config.busy_timeout_s)):
                busy, wal_frames, moved = conn.execute(
                    "PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            log.debug("SQLite ledger %s: checkpoint to make room failed: %s", self.path, exc)
            return False
        if busy:
            log.debug("SQLite ledger %s: checkpoint to make room did not complete (%d of %d "
                      "WAL frames moved)", self.path, moved, wal_frames)
            return False
        if self._full:
            self._full = False
            log.info("SQLite ledger %s: the WAL was checkpointed and truncated after a full "
                     "disk", self.path)
        return True

    @contextlib.contextmanager
    def _waiting_at_most(self, conn: sqlite3.Connection, seconds: float) -> Iterator[None]:
        """``conn``'s busy timeout is ``seconds`` inside the block, ``busy_timeout_s``
        again after it."""
        conn.execute(f"PRAGMA busy_timeout={int(max(0.0, seconds) * 1000)}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self.config.busy_timeout_s * 1000)}")

    def run(self, body: Callable[[Any], T], *, write: bool = True,
            lock_wait_s: float | None = None, snapshot: bool = False) -> T:
        """One transaction; ``BEGIN IMMEDIATE`` for writes (see ``Dialect.run``), which
        first make room for the WAL if the volume is short of it (:meth:`_make_room`).
        ``lock_wait_s``: the busy timeout of that ``BEGIN`` instead of ``busy_timeout_s``
        (the write lock is taken there and nowhere later). ``snapshot`` changes nothing:
        a SQLite transaction reads one snapshot (WAL mode)."""
        self._check_file()
        conn = self._conn()
        if write:
            self._make_room(conn)
        try:
            begin = "BEGIN IMMEDIATE" if write else "BEGIN"
            if lock_wait_s is None:
                conn.execute(begin)
            else:
                with self._waiting_at_most(conn, lock_wait_s):
                    conn.execute(begin)
        except sqlite3.Error as exc:
            if self._is_corruption(exc):
                raise self._corrupt(exc) from exc
            raise LedgerUnavailable(
                f"SQLite ledger {self.path!r} is busy or gone: {exc}") from exc
        cur = conn.cursor()
        tx = SQLiteTx(cur, self._catalogue)
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
                if _primary(exc)[0] == "SQLITE_FULL":
                    self._full = True
                    self._reclaim(conn)
                raise self._error(exc, tx.statement) from exc
            raise
        finally:
            cur.close()

    def join(self, connection: Any, body: Callable[[Any], T], *,
             what: str = "the task") -> T:
        """Run ``body`` inside the caller's open transaction on ``connection``, a
        ``sqlite3.Connection`` on the ledger's file (see ``Dialect.join``): under a
        savepoint, nothing committed until the caller commits. A connection outside a
        transaction gets the ``BEGIN`` its module would send before the caller's next
        write (``BEGIN`` + its ``isolation_level``).

        Raises:
            InvalidArguments: not a ``sqlite3.Connection``, one on another file, one with
                temporary tables named like the ledger's, or one in autocommit mode
                (``isolation_level=None``) outside a transaction: the task would commit at
                once, not with the caller's work.
            LedgerUnavailable, WriteRejected, LedgerError: as :meth:`run`; the caller's
                transaction is as before the call (the savepoint rolled back).
        """
        if not isinstance(connection, sqlite3.Connection):
            given = target_of(connection)
            raise InvalidArguments(
                f"connection= on a SQLite ledger takes the sqlite3.Connection of your "
                f"transaction on the ledger's file {self.path!r}, got "
                f"{type(given).__module__}.{type(given).__qualname__} (from "
                "SQLAlchemy: session.connection().connection.driver_connection)")
        try:
            files = {name: path for _, name, path in
                     connection.execute("PRAGMA database_list").fetchall()}
        except sqlite3.ProgrammingError as exc:
            if "thread" in str(exc):
                raise InvalidArguments(
                    "connection= was opened in another thread, and sqlite3 connections are "
                    "bound to theirs (submit_async writes in a worker thread): open it with "
                    "sqlite3.connect(..., check_same_thread=False) and use it from one "
                    "task at a time") from None
            raise InvalidArguments(f"connection= cannot be read: {exc}") from None
        except sqlite3.Error as exc:
            raise InvalidArguments(f"connection= cannot be read: {exc}") from None
        main = files.get("main") or ""
        if not main or not os.path.exists(main) or not os.path.samefile(main, self.path):
            raise InvalidArguments(
                f"connection= is on {main or 'an in-memory database'!r}, not on the "
                f"ledger's file {self.path!r}: a task must be written in the ledger's "
                "database to commit with your transaction")
        try:
            shadows = sorted(name for (name,) in connection.execute(
                "SELECT name FROM temp.sqlite_master WHERE type IN ('table', 'view') AND "
                "name IN (SELECT name FROM main.sqlite_master)").fetchall())
        except sqlite3.Error as exc:
            raise InvalidArguments(f"connection= cannot be read: {exc}") from None
        if shadows:
            # SQLite resolves an unqualified name in temp first: the task would be written
            # to the caller's temporary table, not to the ledger.
            raise InvalidArguments(
                f"connection= has temporary tables named like the ledger's ({', '.join(shadows)}"
                "): Ratchet's rows would land in them; drop or rename them first")
        if not connection.in_transaction:
            if connection.isolation_level is None:
                raise InvalidArguments(
                    "connection= is in autocommit mode (isolation_level=None) and outside a "
                    f"transaction: {what} would commit at once, not with your work. "
                    "Run BEGIN first (or use the default isolation_level)")
            connection.execute(f"BEGIN {connection.isolation_level}".strip())
        cur = connection.cursor()
        tx = SQLiteTx(cur, self._catalogue)
        try:
            cur.execute("SAVEPOINT ratchet_join")
            tx.statement = "now"
            tx.now = self._clock(cur)
            result = body(tx)
            cur.execute("RELEASE SAVEPOINT ratchet_join")
            return result
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                cur.execute("ROLLBACK TO SAVEPOINT ratchet_join")
                cur.execute("RELEASE SAVEPOINT ratchet_join")
            if isinstance(exc, sqlite3.Error):
                raise self._error(exc, tx.statement) from exc
            raise
        finally:
            cur.close()

    def probe(self) -> tuple[bool, float | None]:
        """Lock-free look: may anything be claimable? Also returns the clock it read."""
        self._check_file()
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
        if conn.execute("PRAGMA user_version").fetchone()[0] == self.latest_version:
            # Nothing to apply: no write lock taken (a first use of the ledger inside a
            # caller's open transaction on the file, App.submit(connection=...), would
            # otherwise wait for the lock that very transaction holds).
            return self.latest_version
        for migration in self._migrations:

            def body(tx: SQLiteTx, migration: Any = migration) -> None:
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

    def subscribe(self, on_ready: Callable[[], None], channel: str = "ready") -> Subscription:
        """SQLite has no server to notify: the subscription never calls back and workers
        (and relays) poll."""
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

    A missing file is created whole, at the latest schema version
    (:meth:`SQLiteDialect.create`), unless ``must_exist`` is set. A file that exists but
    holds no Ratchet ledger (``user_version`` 0: an application's own database, a typo in
    the path) is refused untouched, also by ``migrate``; so is a file whose
    ``user_version`` is one Ratchet knows but which lacks Ratchet's tables (an application
    numbering its own schema). An existing empty file is corrupt: Ratchet never leaves one
    (it was truncated), and making a new ledger of it would hide the loss.

    Raises:
        LedgerUnavailable: the file cannot be opened or created (missing directory, not a
            database, no ledger in it).
        LedgerCorrupt: the file is empty.
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
        if not exists:
            dialect.create()  # or another process just did: its file is checked below
        dialect.check_not_empty()
        current = dialect.schema_version()
        if current > self.latest_version:
            raise SchemaTooNew(current, self.latest_version, dialect.path)
        # Applications number their own schemas with user_version too: a version we know
        # is only ours if our tables are there (checked read-only, before anything could
        # switch the file to WAL).
        tables = dialect.tables()
        foreign = current == 0 or not _LEDGER_TABLES.issubset(tables)
        if foreign:
            listed = ", ".join(tables) if tables else "none"
            raise LedgerUnavailable(
                f"{dialect.path} (from {shown!r}) holds no Ratchet ledger (tables: "
                f"{listed}); it was left untouched. Point --ledger / RATCHET_LEDGER_URL "
                "at a Ratchet ledger file, or at a new path to create one (to keep your own "
                "tables in the ledger's file, create the ledger first, then add them)."
            )
        if migrate:
            self.migrate()
