"""The PostgreSQL ledger: every worker on every host points at one server.

:class:`PostgresLedger` is the :class:`~ratchet.ledger.engine.LedgerEngine` over
:class:`PostgresDialect`. Same contract as the SQLite ledger, different concurrency
control (the SQL is in ``ledger/sql/postgresql.sql``):

* **Claim** takes rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` on the partial
  ``tasks_ready`` index (only claimable rows are in it, so a million finished tasks cost
  nothing) and sets holder, ``lease_until = now + lease_s`` and ``generation + 1`` in the
  same short transaction; concurrent claimers never wait on each other and never get the
  same row.
* **Fenced writes** lock the task rows they guard (``SELECT ... FOR UPDATE``, in id order so
  that two transactions of one worker cannot deadlock) and compare state and generation
  under that lock, then write; a stale write changes nothing and is audited.
* **Batches** pass their rows as one JSON array read with ``json_to_recordset``: one
  statement per batch whatever its size.
* **Round trips**: a statement whose result is not read travels with the next read or with
  ``COMMIT``, independent reads travel together, each group one simple-protocol string
  (:class:`~ratchet.ledger.pgtx.PgTx`): commit + claim is three round trips, a submit
  without keys one. No pipeline mode (after a pipeline, PostgreSQL 15 stops enforcing
  ``idle_in_transaction_session_timeout`` on the session, which is what frees the row locks
  of a frozen worker). Sessions read UTF-8 (parameters travel inside the statement text).
* **The ledger clock** is the server's transaction timestamp, ``now()``, read with the
  transaction's first round trip — never a worker's clock: a step of the *server's* clock
  is a step of the ledger clock (:mod:`ratchet.ledger.clock`). A test may map it through
  :attr:`PostgresDialect.clock` (then the clock is read before any statement that needs
  it, one round trip more).
* **Durability** maps to ``synchronous_commit`` per connection: ``buffered`` → ``off``,
  ``fsync`` → ``on``, ``replicated`` → ``remote_apply`` (refused unless the server has a
  synchronous standby configured).
* **Wake-ups**: every write that makes a task ready sends ``pg_notify`` on the ledger's
  channel at commit; :meth:`PostgresDialect.subscribe` listens on a dedicated connection.
  Polling remains the fallback.
* **Schema**: every table lives in the URL's ``schema`` (default ``ratchet``); migrations
  run in one transaction under an advisory lock, so two hosts running ``ratchet migrate``
  at once are safe; a schema of a newer version is refused, never modified.

Connections come from the ledger pool (:mod:`ratchet.ledger.pgpool`, a capped reconnect
backoff). A connection the server dropped (restart, ``pg_terminate_backend``) is discarded
by the pool; a transaction that failed before its ``COMMIT`` was sent is retried on a fresh
connection (the server rolled it back), one that failed during ``COMMIT`` raises
:class:`~ratchet.ledger.dialect.CommitOutcomeUnknown`, which the engine answers by
re-sending its fenced writes; a ``READ ONLY`` one (``write=False``) has no outcome to lose
and is retried like one that failed before its ``COMMIT``. A server error of SQLSTATE
``XX001`` (data corrupted) or ``XX002`` (index corrupted) is
:class:`~ratchet.errors.LedgerCorrupt`, never retried.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import psycopg
import psycopg.rows
import tenacity
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg_pool import PoolTimeout

from .. import faults
from ..config import Durability, LedgerConfig, redact_url
from ..errors import (
    ConfigError,
    InvalidArguments,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    SchemaTooNew,
    WriteRejected,
)
from .base import Subscription
from .catalogue import load_catalogue
from .clock import ClockFn
from .dialect import CommitOutcomeUnknown
from .engine import LedgerEngine
from .loopbridge import LoopConnection, target_of
from .migrations import load_migrations
from .pgpool import make_pool
from .pgprepared import GENERIC_PLANS_LOCAL, PreparedStatements
from .pgtx import NOW_EXPR, PgTx

__all__ = [
    "CLAIM_READY_SQL",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "PostgresDialect",
    "PostgresLedger",
    "connect_timeout_s",
    "libpq_url",
]

log = logging.getLogger("ratchet.ledger.postgres")

T = TypeVar("T")
Cursor = psycopg.Cursor[tuple[Any, ...]]

_PRELUDES = {
    (False, True): ("BEGIN",),
    (True, True): ("BEGIN ISOLATION LEVEL REPEATABLE READ",),
    (False, False): ("BEGIN READ ONLY",),
    (True, False): ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",),
}
"""A transaction's first statements, by ``(snapshot, write)`` (see
:meth:`PostgresDialect.run`): a transaction that does not write is ``READ ONLY``, so the
server refuses a write in it and a ``COMMIT`` lost with its connection loses nothing."""

_RATCHET_PARAMS = ("durability", "schema", "pool_size", "busy_timeout_s", "prepared")
_SYNCHRONOUS_COMMIT = {
    Durability.BUFFERED: "off",
    Durability.FSYNC: "on",
    Durability.REPLICATED: "remote_apply",
}
IDLE_IN_TRANSACTION_TIMEOUT_MS = 3000
"""Server-side limit on a ledger transaction idling between statements, milliseconds."""

CLAIM_READY_SQL = load_catalogue("postgresql")["claim_ready"][0]
"""The claim of ready tasks (parameters: now, names, limit, holder). ``bench/`` prints its
``EXPLAIN``: it must stay an index scan of ``tasks_ready`` whatever the number of finished
tasks."""

_OPEN = (psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR)
_INERROR = psycopg.pq.TransactionStatus.INERROR

ATTEMPTS = 3
"""Attempts of a transaction the server rolled back (deadlock, connection lost before
COMMIT) before its error is raised."""

_CORRUPT = (pg_errors.DataCorrupted, pg_errors.IndexCorrupted)
"""SQLSTATE XX001 data_corrupted, XX002 index_corrupted (a damaged page or index; not XX000,
an internal error): LedgerCorrupt."""

_REJECTED = (pg_errors.DataError, pg_errors.ProgramLimitExceeded, pg_errors.IntegrityError)
"""Driver errors that refuse a write for its content (a value over an index row's limit, a
character the encoding cannot hold, a NOT NULL or CHECK violation): WriteRejected."""


DEFAULT_CONNECT_TIMEOUT_S = 5
"""libpq's ``connect_timeout`` of a connection attempt when the URL sets none, seconds."""


def connect_timeout_s(config: LedgerConfig) -> int:
    """libpq's ``connect_timeout`` for every connection of this ledger, in seconds: the
    URL's ``connect_timeout`` when it has one, else :data:`DEFAULT_CONNECT_TIMEOUT_S`.

    Every connect passes it explicitly, and psycopg's keyword wins over the URL's value, so
    the URL's must be read here or it would be ignored. A shorter one matters in a
    failover: on a multi-host URL each connection waits this long on a host that vanished
    from the network before it tries the next host.

    Raises:
        ConfigError: the URL's ``connect_timeout`` is not an integer.
    """
    raw = config.options.get("connect_timeout")
    if raw is None:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(
            f"connect_timeout must be a whole number of seconds, got {raw!r}"
        ) from None


def libpq_url(config: LedgerConfig) -> str:
    """The URL without Ratchet's own query parameters: what libpq gets."""
    parts = urlsplit(config.url)
    rest = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k not in _RATCHET_PARAMS]
    # quote (%20), not quote_plus (+): libpq does not decode '+' as a space. Built by hand
    # because urlunsplit drops the '//' of an empty host (postgresql:///db = local socket).
    query = urlencode(rest, quote_via=quote)
    return f"postgresql://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


class _PgSubscription:
    """A LISTEN loop on its own connection, calling ``on_ready`` for every notification
    (and once after every reconnect, since notifications sent meanwhile were missed)."""

    def __init__(
        self, conninfo: str, channel: str, on_ready: Callable[[], None], connect_timeout_s: int
    ) -> None:
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._channel = channel
        self._on_ready = on_ready
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ratchet-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.05
        while not self._closed.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True,
                                     connect_timeout=self._connect_timeout_s) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
                    backoff = 0.05
                    self._on_ready()
                    while not self._closed.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self._on_ready()
            except psycopg.Error as exc:
                if self._closed.is_set():
                    return
                log.debug("LISTEN connection lost (%s); reconnecting", exc)
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2.0)


class PostgresDialect:
    """PostgreSQL under the ledger engine (see :class:`~ratchet.ledger.dialect.Dialect`).

    Args:
        config: the parsed ledger URL (``postgresql://...?schema=...&durability=...``).

    Raises:
        ConfigError: ``replicated`` durability without a synchronous standby, or a URL
            libpq refuses.
        LedgerUnavailable: the server cannot be reached.
    """

    name = "postgresql"
    probe_before_claim = False
    walks_queue_pairs = True
    speculative_claims = True
    single_writer = False

    def __init__(self, config: LedgerConfig) -> None:
        self.config = config
        self.schema = config.options.get("schema", "ratchet")
        # NOTIFY channel names are identifiers (at most 63 bytes): hash the schema in.
        digest = hashlib.sha256(self.schema.encode()).hexdigest()[:32]
        self.channel = "ratchet_ready_" + digest
        self.channels = {"ready": self.channel, "outbox": "ratchet_outbox_" + digest}
        """Wake-up channels by name (:meth:`Tx.wake`): tasks ready, outbox rows written."""
        self._conninfo = libpq_url(config)
        self._connect_timeout_s = connect_timeout_s(config)
        self._catalogue = load_catalogue("postgresql")
        self._migrations = load_migrations("postgresql")
        self.latest_version = self._migrations[-1].version
        parts = urlsplit(config.url)
        host = parts.netloc.rsplit("@", 1)[-1] or "localhost"
        self.where = f"postgresql://{host}{parts.path} schema {self.schema}"
        self._closed = False
        self._ledger_id: str | None = None
        self.clock: ClockFn | None = None  # testing seam (Dialect.clock)
        self.corruption: LedgerCorrupt | None = None
        """The last :class:`LedgerCorrupt` this dialect raised, if any (kept until closed)."""
        self._notify = {name: "SELECT pg_notify(" + sql.Literal(ch).as_string(None) + ", '')"
                        for name, ch in self.channels.items()}
        try:
            psycopg.conninfo.conninfo_to_dict(self._conninfo)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(
                f"malformed PostgreSQL ledger URL {redact_url(config.url)!r}: {exc}"
            ) from None
        prepared = config.options.get("prepared", "on")
        if prepared not in ("on", "off"):
            raise ConfigError(f"ledger URL option prepared={prepared!r}: use 'on' or 'off'")
        self._prepared = PreparedStatements(self._catalogue, NOW_EXPR)
        self._prepare = prepared == "on"
        self._check_server()
        self._pool = make_pool(
            self._conninfo,
            min_size=1,
            max_size=int(config.options.get("pool_size", "4")),
            configure=self._configure,
            name=f"ratchet-{self.schema}",
            connect_timeout_s=self._connect_timeout_s,
        )

    def schema_current(self) -> None:
        """The schema is at this Ratchet's version: its hot statements are prepared on each
        pooled connection from now on (unless the URL says ``prepared=off``;
        :mod:`~ratchet.ledger.pgprepared`)."""
        if self._prepare:
            self._prepared.enable()

    def _check_server(self) -> None:
        """Connect once directly: a clear error now instead of a pool timeout later."""
        try:
            with psycopg.connect(self._conninfo, autocommit=True,
                                 connect_timeout=self._connect_timeout_s) as conn:
                if self.config.durability is Durability.REPLICATED:
                    row = conn.execute("SHOW synchronous_standby_names").fetchone()
                    if not row or not str(row[0]).strip():
                        raise ConfigError(
                            "durability 'replicated' needs a synchronous standby, but this "
                            "PostgreSQL server has synchronous_standby_names = '' (a commit "
                            "would be acknowledged before any standby has it); configure a "
                            "synchronous standby or use durability=fsync"
                        )
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(
                f"cannot connect to PostgreSQL ledger {self.where}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
            ) from exc

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema))
        )
        # Statements travel as UTF-8 text with their parameters bound in (PgTx), so the
        # session must read UTF-8 whatever the database's or the URL's client_encoding
        # (the server converts to the database's encoding, or refuses what it cannot hold).
        conn.execute("SET client_encoding TO 'UTF8'")
        # A worker frozen inside a ledger transaction (SIGSTOP, VM pause) keeps the row
        # locks of the tasks it was writing, and SKIP LOCKED claims would skip those tasks
        # even after their leases expire. Ledger transactions last milliseconds; the server
        # ends one that sits idle longer than this, which releases its locks.
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (f"{IDLE_IN_TRANSACTION_TIMEOUT_MS}ms",),
        )
        conn.execute(
            "SELECT set_config('synchronous_commit', %s, false)",
            (_SYNCHRONOUS_COMMIT[self.config.durability],),
        )

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed:
            raise LedgerError("ledger is closed")
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise LedgerUnavailable(
                f"PostgreSQL ledger {self.where}: no connection available ({exc})"
            ) from exc

    def run(self, body: Callable[[Any], T], *, write: bool = True,
            lock_wait_s: float | None = None, snapshot: bool = False) -> T:
        """Run ``body`` in one transaction (see ``Dialect.run``; ``lock_wait_s``: the
        transaction's ``lock_timeout``, sent with its ``BEGIN``, and a lock not had within
        it fails the transaction at once, not retried; ``snapshot``: ``BEGIN ISOLATION
        LEVEL REPEATABLE READ``; ``write=False``: ``READ ONLY``, a write in it is refused).

        Up to :data:`ATTEMPTS` attempts (tenacity, jittered exponential wait) when the
        server rolled the transaction back for us: a deadlock or serialization failure, or
        a connection that died before ``COMMIT`` was sent (then the pool is checked first,
        since the server likely dropped the idle siblings of that connection too), or
        during the ``COMMIT`` of a read-only transaction (nothing was written to lose).
        """
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_RolledBack),
            stop=tenacity.stop_after_attempt(ATTEMPTS),
            wait=tenacity.wait_random_exponential(multiplier=0.02, max=0.2),
            before_sleep=self._before_retry,
            reraise=True,
        )
        try:
            result: T = retrying(self._attempt, body, write, lock_wait_s, snapshot)
            return result
        except _RolledBack as gave_up:
            raise gave_up.final from gave_up.__cause__

    def _before_retry(self, state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        failed = outcome.exception() if outcome is not None else None
        if isinstance(failed, _RolledBack) and failed.connection_lost:
            with contextlib.suppress(Exception):
                self._pool.check()

    def _attempt(self, body: Callable[[Any], T], write: bool,
                 lock_wait_s: float | None = None, snapshot: bool = False) -> T:
        """One attempt of :meth:`run`; driver errors mapped (see the module docstring)."""
        committing = False
        aborted = False  # the server failed a statement of a string sent with COMMIT
        tx: PgTx | None = None
        used: psycopg.Connection[Any] | None = None
        try:
            with self._connection() as conn:
                used = conn
                prelude = _PRELUDES[snapshot, write] if lock_wait_s is None else (
                    *_PRELUDES[snapshot, write],
                    f"SET LOCAL lock_timeout = {int(max(1.0, lock_wait_s * 1000))}")
                tx = PgTx(conn, self._catalogue, self.clock, prelude=prelude,
                          prepared=self._prepared.on(conn))
                try:
                    result = body(tx)
                    if write and not tx.commit_sent:  # else fired before rows_last sent it
                        faults.point("commit.before_commit")
                    committing = True
                    # What is kept, the wake-up (NOTIFY, delivered at commit) and COMMIT:
                    # one round trip.
                    tx.commit([self._notify[c] for c in sorted(tx.woken)])
                    return result
                except BaseException:
                    # A string with COMMIT (PgTx.rows_last) that failed on a statement,
                    # on a live connection, stopped there: rolled back, COMMIT not run.
                    aborted = (tx.commit_sent and not conn.closed and not conn.broken
                               and conn.info.transaction_status == _INERROR)
                    # Also after a failed final group (a refused write): the server aborted
                    # the transaction; roll it back before the pool takes the connection.
                    if not conn.closed and conn.info.transaction_status in _OPEN:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("ROLLBACK")
                    raise
        except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
            raise _RolledBack(
                LedgerError(f"PostgreSQL ledger {self.where}: {exc}"), connection_lost=False
            ) from exc
        except (pg_errors.InvalidSqlStatementName, pg_errors.FeatureNotSupported) as exc:
            # A prepared statement gone (deallocated) or changed under us (its result
            # columns, after another process migrated): prepare again and retry.
            if used is None:
                raise LedgerError(f"PostgreSQL ledger {self.where}: {exc}") from exc
            self._prepared.forget(used)
            raise _RolledBack(LedgerError(f"PostgreSQL ledger {self.where}: {exc}"),
                              connection_lost=False) from exc
        except _CORRUPT as exc:
            raise self._corrupt(exc) from exc
        except _REJECTED as exc:
            raise self._rejected(exc, tx.statement if tx else "begin") from exc
        except pg_errors.IdleInTransactionSessionTimeout as exc:
            # The server ended the session (this process was frozen inside the transaction
            # past idle_in_transaction_session_timeout) before it read anything we sent
            # after: the transaction is rolled back for certain, COMMIT included.
            raise _RolledBack(
                LedgerUnavailable(f"PostgreSQL ledger {self.where}: the server ended this "
                                  f"session inside a transaction (rolled back): {exc}"),
                connection_lost=True,
            ) from exc
        except pg_errors.LockNotAvailable as exc:
            # The transaction's lock_timeout (lock_wait_s) passed: the caller asked not to
            # wait longer, so no retry (the connection is fine).
            raise LedgerUnavailable(f"PostgreSQL ledger {self.where}: a lock was not had "
                                    f"within the transaction's lock_timeout: {exc}") from exc
        except psycopg.OperationalError as exc:
            if write and (committing or (tx is not None and tx.commit_sent and not aborted)):
                raise CommitOutcomeUnknown(
                    f"PostgreSQL ledger {self.where}: connection lost during COMMIT; the "
                    f"outcome of this transaction is unknown ({exc})"
                ) from exc
            raise _RolledBack(
                LedgerUnavailable(f"PostgreSQL ledger {self.where} is unreachable: {exc}"),
                connection_lost=True,
            ) from exc
        except psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger {self.where}: {exc}") from exc

    def _identity(self) -> str:
        """This ledger's random id (``ledger_identity``, schema 16), read once."""
        if self._ledger_id is None:
            row = self.run(lambda tx: tx.one("ledger_identity"), write=False)
            self._ledger_id = str(row[0]) if row else ""
        return self._ledger_id

    def join(self, connection: Any, body: Callable[[Any], T], *,
             what: str = "the task") -> T:
        """Run ``body`` inside the caller's open transaction on ``connection``, a psycopg 3
        connection to the ledger's database (see ``Dialect.join``): under a savepoint,
        with ``search_path`` set to the ledger's schema for its statements and put back
        after them; its NOTIFYs are delivered when the caller commits (PostgreSQL sends
        them at commit, and drops them on rollback). A connection outside a transaction
        (not autocommit) begins one, as its next statement would. A psycopg
        ``AsyncConnection`` comes bridged from its event loop
        (:class:`~ratchet.ledger.loopbridge.LoopConnection`, ``App.submit_async``): the
        same checks and statements, each sent on the caller's loop.

        Raises:
            InvalidArguments: not a psycopg 3 ``Connection`` (or a bridged
                ``AsyncConnection``), a closed one, one in
                autocommit mode outside a transaction, in pipeline mode, one whose
                transaction already failed, or one on another database or server (its
                schema holds no ledger, or another one: ``ledger_identity`` differs).
            psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected: raised
                as they are, for the caller's own retry of its transaction; so are
                psycopg.errors.LockNotAvailable and QueryCanceled (the caller's
                ``lock_timeout`` or ``statement_timeout`` passed; the savepoint is rolled
                back and the caller's transaction goes on).
            LedgerUnavailable, WriteRejected, LedgerError: as :meth:`run` (never retried:
                the transaction is the caller's); the savepoint is rolled back.
        """
        bridged = (isinstance(connection, LoopConnection)
                   and isinstance(connection.target, psycopg.AsyncConnection))
        if not bridged and not isinstance(connection, psycopg.Connection):
            given = target_of(connection)
            hint = ("; an AsyncConnection is joined by `await app.submit_async(...)` (or "
                    "`submit_many_async`, `emit_async`)"
                    if isinstance(given, psycopg.AsyncConnection) else
                    "; from an AsyncSession: (await (await session.connection())"
                    ".get_raw_connection()).driver_connection, a psycopg AsyncConnection"
                    if isinstance(connection, LoopConnection) else "")
            raise InvalidArguments(
                "connection= on a PostgreSQL ledger takes a psycopg 3 Connection on the "
                "ledger's database, got "
                f"{type(given).__module__}.{type(given).__qualname__} (from "
                f"SQLAlchemy: session.connection().connection.driver_connection){hint}")
        status = connection.info.transaction_status
        if connection.closed or connection.broken:
            raise InvalidArguments("connection= is closed")
        if status == psycopg.pq.TransactionStatus.INERROR:
            raise InvalidArguments(
                "connection='s transaction has already failed (a statement raised): roll it "
                "back before submitting")
        if status == psycopg.pq.TransactionStatus.IDLE and connection.autocommit:
            raise InvalidArguments(
                f"connection= is in autocommit mode and outside a transaction: {what} "
                "would commit at once, not with your work. Open one (with "
                "conn.transaction(): ...) or use autocommit=False")
        if connection.info.pipeline_status != psycopg.pq.PipelineStatus.OFF:
            raise InvalidArguments(
                "connection= is in pipeline mode: submit or emit outside the "
                "conn.pipeline() block (Ratchet's statements need their results)")
        identity = sql.Identifier(self.schema, "ledger_identity").as_string(
            target_of(connection))
        try:
            with connection.cursor(row_factory=psycopg.rows.tuple_row) as cur:
                found = cur.execute("SELECT current_setting('search_path'), to_regclass(%s)",
                                    (identity,)).fetchone()
        except psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger {self.where}: connection= could not be "
                              f"read: {exc}") from exc
        assert found is not None
        search_path, has_identity = found
        mismatch = (f"connection= is not on this ledger's database: its schema "
                    f"{self.schema!r} holds {{}}, not the ledger at {self.where}")
        if has_identity is None:
            raise InvalidArguments(mismatch.format("no ledger (of schema 16 or later)"))
        tx = PgTx.joined(connection, self._catalogue, self.schema, self.clock)
        try:
            try:
                theirs = tx.one("ledger_identity")  # first, under the savepoint
                if theirs is None or theirs[0] != self._identity():
                    raise InvalidArguments(mismatch.format("another ledger"))
                result = body(tx)
                tx.release([self._notify[c] for c in sorted(tx.woken)], str(search_path))
                return result
            except BaseException:
                if not connection.closed and connection.info.transaction_status in _OPEN:
                    with contextlib.suppress(psycopg.Error):
                        tx.rollback_joined()
                raise
        except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure,
                pg_errors.LockNotAvailable, pg_errors.QueryCanceled):
            raise
        except _CORRUPT as exc:
            raise self._corrupt(exc) from exc
        except _REJECTED as exc:
            raise self._rejected(exc, tx.statement) from exc
        except psycopg.OperationalError as exc:
            raise LedgerUnavailable(
                f"PostgreSQL ledger {self.where}: connection= was lost ({exc}); your "
                "transaction did not commit") from exc
        except psycopg.Error as exc:
            raise LedgerError(f"PostgreSQL ledger {self.where}: {exc}") from exc

    def _corrupt(self, exc: psycopg.Error) -> LedgerCorrupt:
        """The :class:`LedgerCorrupt` for a server error of SQLSTATE class XX (data or index
        corrupted), remembered in :attr:`corruption`."""
        diag = exc.diag
        primary = diag.message_primary or str(exc).splitlines()[0]
        remedy = ("rebuild the index with REINDEX, as the server's message names it"
                  if isinstance(exc, pg_errors.IndexCorrupted) else None)
        error = LedgerCorrupt(self.where, f"{primary} [{diag.sqlstate}]", remedy=remedy)
        self.corruption = error
        return error

    def _rejected(self, exc: psycopg.Error, statement: str) -> WriteRejected:
        """WriteRejected naming the statement and the constraint or index refused."""
        diag = exc.diag
        where = [f"{label} {value}" for label, value in (
            ("table", diag.table_name), ("column", diag.column_name),
            ("constraint", diag.constraint_name)) if value]
        primary = diag.message_primary or str(exc).splitlines()[0]
        return WriteRejected(
            f"PostgreSQL ledger {self.where} refused write {statement!r}"
            + (f" ({', '.join(where)})" if where else "")
            + f": {primary} [{diag.sqlstate}]"
        )

    def probe(self) -> tuple[bool, float | None]:
        """Not used on PostgreSQL (claims never block each other)."""
        return True, None

    # ------------------------------------------------------------------ schema

    def schema_version(self) -> int:
        """The schema's version (0 when the schema or its version table does not exist)."""

        def body(tx: PgTx) -> int:
            row = tx.cur.execute(
                "SELECT to_regclass(format('%%I.schema_version', %s::text))", (self.schema,)
            ).fetchone()
            if row is None or row[0] is None:
                return 0
            got = tx.cur.execute(
                sql.SQL("SELECT max(version) FROM {}.schema_version").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
            return int(got[0]) if got and got[0] is not None else 0

        return self.run(body, write=False)

    def migrate(self) -> int:
        """Apply pending migrations in one transaction under an advisory lock.

        Two processes migrating at once serialise on the lock; the second finds the work
        done. Raises :class:`SchemaTooNew` (without writing) for a newer schema.
        """

        def body(tx: PgTx) -> int:
            cur = tx.cur
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"ratchet.migrate:{self.schema}",),
            )
            cur.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema))
            )
            row = cur.execute(
                "SELECT to_regclass(format('%%I.schema_version', %s::text))", (self.schema,)
            ).fetchone()
            current = 0
            if row is not None and row[0] is not None:
                got = cur.execute("SELECT max(version) FROM schema_version").fetchone()
                current = int(got[0]) if got and got[0] is not None else 0
            if current > self.latest_version:
                raise SchemaTooNew(current, self.latest_version, self.where)
            for migration in self._migrations:
                if migration.version <= current:
                    continue
                cur.execute(migration.sql.encode("utf-8"))
                cur.execute("DELETE FROM schema_version")
                cur.execute(
                    "INSERT INTO schema_version (version) VALUES (%s)", (migration.version,)
                )
                current = migration.version
            return current

        try:
            return self.run(body)
        except LedgerError as exc:
            if isinstance(exc.__cause__, pg_errors.UniqueViolation):
                # Two first-ever migrations raced on CREATE SCHEMA; the lock now exists.
                return self.run(body)
            raise

    def backend_settings(self, tx: Any) -> dict[str, str]:
        """synchronous_commit, server version, schema and where."""
        cur: Cursor = tx.cur
        return {
            "synchronous_commit": str(
                (cur.execute("SHOW synchronous_commit").fetchone() or ("?",))[0]
            ),
            "server_version": str((cur.execute("SHOW server_version").fetchone() or ("?",))[0]),
            "schema": self.schema,
            "where": self.where,
        }

    def subscribe(self, on_ready: Callable[[], None], channel: str = "ready") -> Subscription:
        """Call ``on_ready()`` (from a listener thread) whenever a task may have become
        ready (``channel="ready"``) or outbox rows were committed (``"outbox"``): LISTEN
        on this ledger's channel, on a dedicated connection that reconnects by itself.
        Close the returned subscription to stop."""
        return _PgSubscription(self._conninfo, self.channels[channel], on_ready,
                               self._connect_timeout_s)

    def close(self) -> None:
        """Close the pool (every connection this object opened)."""
        if not self._closed:
            self._closed = True
            self._pool.close()

    # ------------------------------------------------------------------ transaction steps

    def user_transaction_slots(self) -> int:
        """See :meth:`Dialect.user_transaction_slots`: ``pool_size - 2``, at least 1."""
        return max(1, int(self.config.options.get("pool_size", "4")) - 2)

    @contextlib.contextmanager
    def user_connection(self, tx: Any) -> Iterator[psycopg.Connection[Any]]:
        """The pooled connection of ``tx`` (see ``Dialect.user_connection``): the kept
        statements are sent first, and ``search_path`` is the database's default for the
        user's code (``SET LOCAL ... TO DEFAULT``: the value without the ledger's session
        setting), then the ledger's schema again; so is ``plan_cache_mode`` (the ledger's
        sessions run their prepared statements on generic plans). User code must not change
        other session settings (``SET LOCAL`` is fine: it ends with the transaction).

        The transaction holds the task's row lock while the user's code runs; a session
        idle inside it longer than :data:`IDLE_IN_TRANSACTION_TIMEOUT_MS` (a frozen or
        slow holder) is ended by the server, which rolls everything back.
        """
        tx.cur  # noqa: B018 - sends BEGIN and every kept statement
        conn = tx.conn
        # The prepared statements' generic plans (pgprepared.GENERIC_PLANS) are the
        # ledger's: the user's statements, planned with their values, get the default.
        conn.execute("SET LOCAL search_path TO DEFAULT; SET LOCAL plan_cache_mode TO DEFAULT")
        yield conn
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            # Session-level, not LOCAL: it also undoes a session-level SET search_path of
            # the user's code, which would otherwise outlive the commit on this pooled
            # connection.
            conn.execute(
                sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
            conn.execute(GENERIC_PLANS_LOCAL)

    def transaction_status(self, tx: Any) -> str:
        """``"open"``, ``"aborted"`` (a failed statement), ``"ended"``, or ``"lost"`` (the
        connection broke: the server rolled back; the engine's next statement fails like
        any lost connection, and the transaction is retried)."""
        conn = tx.conn
        status = conn.info.transaction_status
        if conn.closed or conn.broken or status == psycopg.pq.TransactionStatus.UNKNOWN:
            return "lost"
        if status == psycopg.pq.TransactionStatus.INTRANS:
            return "open"
        if status == psycopg.pq.TransactionStatus.INERROR:
            return "aborted"
        return "ended"


class PostgresLedger(LedgerEngine):
    """A :class:`~ratchet.ledger.base.Ledger` on a PostgreSQL server (engine + dialect).

    Args:
        config: the parsed ledger URL (``postgresql://...?schema=...&durability=...``).
        migrate: apply pending migrations on open (the default, "first use").
        must_exist: raise ``LedgerUnavailable`` if the schema holds no ledger yet.

    Raises:
        ConfigError: ``replicated`` durability without a synchronous standby, or a URL
            libpq refuses.
        LedgerUnavailable: the server cannot be reached.
        SchemaTooNew: the schema was written by a newer Ratchet; it is not modified.
    """

    def __init__(
        self, config: LedgerConfig, migrate: bool = True, must_exist: bool = False
    ) -> None:
        dialect = PostgresDialect(config)
        super().__init__(config, dialect)
        self.schema = dialect.schema
        self.channel = dialect.channel
        self.latest_version = dialect.latest_version
        try:
            current = self.schema_version()
            if current > self.latest_version:
                raise SchemaTooNew(current, self.latest_version, dialect.where)
            if must_exist and current == 0:
                raise LedgerUnavailable(
                    f"no Ratchet ledger in {dialect.where} (from {redact_url(config.url)!r}). "
                    "Check --ledger / RATCHET_LEDGER_URL, or create it with `ratchet migrate`."
                )
            if migrate:
                self.migrate()
                current = self.latest_version
            if current == self.latest_version:
                dialect.schema_current()
        except BaseException:
            dialect.close()
            raise


class _RolledBack(Exception):
    """Internal: the server rolled this attempt back; retry, or raise ``final``."""

    def __init__(self, final: LedgerError, connection_lost: bool) -> None:
        super().__init__(str(final))
        self.final = final
        self.connection_lost = connection_lost
