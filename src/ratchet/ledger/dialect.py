"""The dialect contract: what a SQL database supplies to the ledger engine.

The engine (:mod:`ratchet.ledger.engine`) owns every rule of the ledger — fencing,
transitions, audit, retire / revoke / resolve, submit dedupe, stats — once. A dialect
supplies only what differs between databases:

* **connections, transactions and locks** (:meth:`Dialect.run`): SQLite runs each write in
  ``BEGIN IMMEDIATE`` on a per-thread connection; PostgreSQL takes pooled connections and
  locks rows in its SQL (``FOR UPDATE [SKIP LOCKED]``, id order);
* **the ledger clock**, read inside the transaction (:attr:`Tx.now`), mapped through
  :attr:`Dialect.clock` when a test injects one (:mod:`ratchet.ledger.clock`);
* **its SQL**, a catalogue of named statements (``ledger/sql/<dialect>.sql``), and how
  list parameters and batches are passed (SQLite: JSON arrays read with ``json_each`` and
  ``executemany``; PostgreSQL: arrays and ``unnest``, one round trip per batch);
* **wake-ups** (:meth:`Tx.wake`, :meth:`Dialect.subscribe`): PostgreSQL LISTEN/NOTIFY,
  none on SQLite;
* **retries and error mapping**: deadlock / serialization failures and a connection lost
  before ``COMMIT`` are retried by the dialect; a connection lost *during* ``COMMIT``
  raises :class:`CommitOutcomeUnknown` (the engine re-sends, see
  :meth:`LedgerEngine.commit`); driver errors become :class:`LedgerUnavailable`
  (connection problems), :class:`WriteRejected` (the database refused a write for what it
  holds, naming the statement and the constraint or index) or :class:`LedgerError`;
* **schema migrations** (:meth:`Dialect.migrate`).

A third dialect is done when it passes :mod:`ratchet.testing.contract` with the engine unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from ..errors import LedgerCorrupt, LedgerUnavailable
from .base import Subscription
from .clock import ClockFn

__all__ = ["CommitOutcomeUnknown", "Dialect", "Tx"]

T = TypeVar("T")


class CommitOutcomeUnknown(LedgerUnavailable):
    """The connection was lost while ``COMMIT`` was in flight: the transaction may or may
    not have committed. Raised by a dialect's :meth:`Dialect.run`; the engine re-sends
    fenced writes (which are idempotent at their generation) and acknowledges what had
    been applied."""


class Tx(Protocol):
    """One open transaction of a dialect, handed to the engine's transaction bodies.

    Attributes:
        now: the ledger clock read inside this transaction, epoch seconds. Every statement
            gets it as its ``now`` parameter unless the caller passes one. A dialect may
            send statements before it has read the clock (PostgreSQL sends ``BEGIN``,
            the clock read and the first statements in one round trip), so read ``now``
            only where its value is needed in Python.
    """

    now: float

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Run catalogue statement ``name`` and return its rows. A ``list`` value in
        ``params`` is a list parameter (PostgreSQL array, SQLite JSON array)."""
        ...

    def rows_many(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        """Run several catalogue statements in order and return each one's rows (a
        dialect with a server sends them in one round trip)."""
        ...

    def rows_last(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        """:meth:`rows_many` for the transaction's last statements: nothing is sent in it
        after them. A dialect with a server sends them with ``COMMIT`` in one round trip
        (the transaction commits before the body returns; a connection lost meanwhile
        leaves its outcome unknown, :class:`CommitOutcomeUnknown`, as during ``COMMIT``).
        Only for a transaction that wakes no one (:meth:`wake`)."""
        ...

    def one(self, name: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        """Run ``name`` and return its first row, or ``None``."""
        ...

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        """Run ``name`` for its effect; return the number of rows it changed."""
        ...

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None:
        """Run ``name`` over many rows (same keys in every row) plus ``scalars`` shared by
        all rows, as one multi-row statement where the dialect can (no rows: nothing)."""
        ...

    def wake(self, channel: str = "ready") -> None:
        """Wake subscribers of ``channel`` at commit: ``"ready"`` (tasks became ready:
        workers) or ``"outbox"`` (outbox rows were written: relays)."""
        ...


class Dialect(Protocol):
    """A database under the ledger engine (see the module docstring).

    Attributes:
        name: the catalogue name, ``"sqlite"`` or ``"postgresql"``.
        where: where the ledger is, for messages (never a password).
        probe_before_claim: run the lock-free ``claim_probe`` statement before a claim
            transaction (SQLite: idle polling must not take the single write lock).
        walks_queue_pairs: the claim statements walk the ready set per (name, queue)
            pair (PostgreSQL); else per served queue, ``claim_ready_queues`` (SQLite).
        speculative_claims: a claim sends its walk with its reads (``claim_fifo``
            checked, one round trip less; PostgreSQL), taken only while its previous
            picture holds
            (:class:`~ratchet.ledger.ops.claims.Claims`).
        single_writer: one write transaction at a time for the whole database (SQLite):
            background work in several transactions (prune batches) pauses between them
            so that waiting writers get the lock.
        clock: the testing seam of the ledger clock: ``None`` (the database's clock is the
            ledger clock), or a function of the database's reading (epoch seconds) that
            returns the ledger clock every transaction and statement of this dialect
            object then uses (a stepped or frozen clock, :mod:`ratchet.testing.clock`).
        corruption: the last :class:`~ratchet.errors.LedgerCorrupt` the dialect raised
            (None while it raised none).
    """

    name: str
    where: str
    probe_before_claim: bool
    walks_queue_pairs: bool
    speculative_claims: bool
    single_writer: bool
    clock: ClockFn | None
    corruption: LedgerCorrupt | None

    def run(self, body: Callable[[Tx], T], *, write: bool = True,
            lock_wait_s: float | None = None, snapshot: bool = False) -> T:
        """Run ``body`` in one transaction and commit (roll back if it raises).

        ``write``: the transaction writes (SQLite takes the write lock at BEGIN); False:
        it only reads (PostgreSQL: ``READ ONLY``, so a write in it is refused, and a
        connection lost during its COMMIT is retried: there is no outcome to lose).
        ``lock_wait_s``: the longest wait for a lock, seconds (SQLite: the write lock at
        BEGIN; PostgreSQL: ``lock_timeout``); None: the ledger's own (``busy_timeout_s``,
        or no limit). Work that may be skipped passes a short one, so that a process
        frozen inside a write transaction cannot hold it up (``ratchet status``).
        ``snapshot``: every statement of ``body`` sees the same snapshot of the ledger
        (PostgreSQL: ``REPEATABLE READ`` instead of ``READ COMMITTED``, for reads that
        must agree with each other, such as a mark and the counts since it; a SQLite
        transaction always reads one snapshot).

        Raises:
            CommitOutcomeUnknown: the connection was lost during the COMMIT of a
                transaction that writes.
            LedgerUnavailable: the database cannot be reached (after the dialect's retries).
            WriteRejected: the database refused a write for its content.
            LedgerError: any other database error; exceptions of ``body`` pass through.
        """
        ...

    def probe(self) -> tuple[bool, float | None]:
        """Run ``claim_probe`` outside any write transaction: ``(may anything be
        claimable?, the ledger clock it read, epoch seconds, or None if it read none)``."""
        ...

    def schema_version(self) -> int:
        """The ledger's schema version (0 for none)."""
        ...

    def migrate(self) -> int:
        """Apply pending migrations; return the version. Raises ``SchemaTooNew``."""
        ...

    def backend_settings(self, tx: Tx) -> dict[str, str]:
        """Backend facts for ``ratchet status`` (journal mode, synchronous_commit, ...)."""
        ...

    def subscribe(self, on_ready: Callable[[], None], channel: str = "ready") -> Subscription:
        """Call ``on_ready`` when tasks may have become ready (``channel="ready"``) or
        outbox rows were committed (``"outbox"``): a hint; may never call."""
        ...

    def join(self, connection: Any, body: Callable[[Tx], T], *, what: str = "the task") -> T:
        """Run ``body`` inside the caller's own open transaction on ``connection`` (a
        DB-API connection on the ledger's database), under a savepoint, and commit
        nothing: the rows exist if and only if the caller's transaction commits, and
        wake-ups go out with that commit. On any error the savepoint is rolled back and
        the caller's transaction is as it was before the call. ``what`` names the rows in
        messages (``"the task"``, ``"the message"``).

        Raises:
            InvalidArguments: a connection of the wrong kind, on another database, or one
                that cannot hold a transaction the caller commits (autocommit).
            LedgerUnavailable, WriteRejected, LedgerError: as :meth:`run`, never retried.
        """
        ...

    def close(self) -> None:
        """Close every connection the dialect opened."""
        ...

    # -- transaction steps (ctx.transaction): the user's code inside a ledger transaction

    def user_connection(self, tx: Tx) -> AbstractContextManager[Any]:
        """The DB-API connection of ``tx``'s open transaction, for a transaction step's
        user code (``sqlite3.Connection`` / ``psycopg.Connection``), as a context manager.

        On entry every statement ``tx`` kept back is sent (the fence read and its lock
        come first), and the session looks like a plain one to the database (PostgreSQL:
        ``search_path`` at the database's default, not the ledger's schema); on a normal
        exit with the transaction still open, the ledger's settings are put back for the
        engine's statements that follow. The engine owns the transaction: user code must
        not commit or roll it back.
        """
        ...

    def user_transaction_slots(self) -> int | None:
        """How many transaction steps may hold a connection at once (PostgreSQL: the pool's
        size less two, at least one, so the writer and the heartbeat always get a
        connection); None: no limit (SQLite: a connection per thread)."""
        ...

    def transaction_status(self, tx: Tx) -> str:
        """State of ``tx``'s transaction after user code ran on :meth:`user_connection`:
        ``"open"``, ``"aborted"`` (a statement failed; PostgreSQL accepts nothing more
        until a rollback), ``"ended"`` (committed or rolled back behind the engine) or
        ``"lost"`` (the connection broke; the engine goes on and its next statement fails
        the way a lost connection does in this dialect)."""
        ...
