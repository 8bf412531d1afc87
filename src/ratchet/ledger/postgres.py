"""The PostgreSQL ledger: every worker on every host points at one server.

Same contract as the SQLite ledger (:mod:`ratchet.ledger.base`), different concurrency
control:

* **Claim** takes rows with ``SELECT ... FOR UPDATE SKIP LOCKED`` on the partial
  ``tasks_ready`` index (only claimable rows are in it, so a million finished tasks cost
  nothing) and sets holder, ``lease_until = now + lease_s`` and ``generation + 1`` in the
  same short transaction; concurrent claimers never wait on each other and never get the
  same row.
* **Fenced writes** lock the task rows they guard (``SELECT ... FOR UPDATE``, in id order so
  that two transactions of one worker cannot deadlock) and compare state and generation
  under that lock, then write; a stale write changes nothing and is audited.
* **The ledger clock** is the server's transaction timestamp, ``now()``, read inside the
  transaction — never a worker's clock.
* **Durability** maps to ``synchronous_commit`` per connection: ``buffered`` → ``off``,
  ``fsync`` → ``on``, ``replicated`` → ``remote_apply`` (refused unless the server has a
  synchronous standby configured).
* **Wake-ups**: every write that makes a task ready sends ``pg_notify`` on the ledger's
  channel at commit; :meth:`PostgresLedger.subscribe` listens on a dedicated connection.
  Polling remains the fallback.
* **Schema**: every table lives in the URL's ``schema`` (default ``ratchet``); migrations
  run in one transaction under an advisory lock, so two hosts running ``ratchet migrate``
  at once are safe; a schema of a newer version is refused, never modified.

Connections come from a :class:`psycopg_pool.ConnectionPool`. A connection the server
dropped (restart, ``pg_terminate_backend``) is discarded by the pool; an operation that
failed before its ``COMMIT`` was sent is retried once on a fresh connection (the server
rolled it back), one that failed during ``COMMIT`` raises :class:`LedgerUnavailable`
because its outcome is unknown to us.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import faults
from ..config import Durability, LedgerConfig, redact_url
from ..errors import (
    ConfigError,
    IdempotencyConflict,
    IllegalTransition,
    LedgerError,
    LedgerUnavailable,
    SchemaTooNew,
    TaskNotFound,
)
from ..serde import dumps, loads
from ..states import State, check_transition
from .base import (
    AuditEvent,
    Claim,
    CommitOutcome,
    EffectRecord,
    EffectState,
    LedgerStats,
    NewTask,
    RenewResult,
    ResolveOutcome,
    StepRecord,
    SubmitResult,
    Subscription,
    TaskInfo,
    TaskWrite,
    Timeline,
    Transition,
    WorkerInfo,
)
from .migrations import load_migrations
from .rows import (
    EFFECT_COLUMNS,
    TASK_COLUMNS,
    AuditRow,
    effect_record,
    reschedules,
    task_info,
    transition_audit,
)

__all__ = ["CLAIM_READY_SQL", "PostgresLedger"]

log = logging.getLogger("ratchet.ledger.postgres")

T = TypeVar("T")
Cursor = psycopg.Cursor[tuple[Any, ...]]

_RATCHET_PARAMS = ("durability", "schema", "pool_size", "busy_timeout_s")
_SYNCHRONOUS_COMMIT = {
    Durability.BUFFERED: "off",
    Durability.FSYNC: "on",
    Durability.REPLICATED: "remote_apply",
}
_NOW_SQL = "SELECT extract(epoch FROM now())::float8"
IDLE_IN_TRANSACTION_TIMEOUT_MS = 3000
"""Server-side limit on a ledger transaction idling between statements, milliseconds."""

CLAIM_READY_SQL = (
    "WITH picked AS ("
    " SELECT id, state FROM tasks"
    " WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s AND name = ANY(%(names)s)"
    " ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
    " UPDATE tasks t SET state = 'RUNNING', holder = %(holder)s, generation = t.generation + 1,"
    " attempt = t.attempt + 1, lease_until = %(now)s + t.lease_s, updated_at = %(now)s"
    " FROM picked WHERE t.id = picked.id"
    " RETURNING t.id, t.name, t.version, t.params, t.generation, t.attempt, t.max_attempts,"
    " t.lease_s, t.lease_until, picked.state"
)
"""The claim of ready tasks (parameters: now, names, limit, holder). ``bench/`` prints its
``EXPLAIN``: it must stay an index scan of ``tasks_ready`` whatever the number of finished
tasks."""


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows to ``width`` column lists, the parameters of an ``unnest(...)`` insert."""
    return [[row[i] for row in rows] for i in range(width)]


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

    def __init__(self, conninfo: str, channel: str, on_ready: Callable[[], None]) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._on_ready = on_ready
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ratchet-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = 0.05
        while not self._closed.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
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


class PostgresLedger:
    """A :class:`~ratchet.ledger.base.Ledger` on a PostgreSQL server (psycopg 3 + pool).

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
        self.config = config
        self.schema = config.options.get("schema", "ratchet")
        # NOTIFY channel names are identifiers (at most 63 bytes): hash the schema in.
        self.channel = "ratchet_ready_" + hashlib.sha256(self.schema.encode()).hexdigest()[:32]
        self._conninfo = libpq_url(config)
        self._migrations = load_migrations("postgresql")
        self.latest_version = self._migrations[-1].version
        parts = urlsplit(config.url)
        host = parts.netloc.rsplit("@", 1)[-1] or "localhost"
        self._where = f"postgresql://{host}{parts.path} schema {self.schema}"
        self._closed = False
        self._tx = threading.local()
        try:
            psycopg.conninfo.conninfo_to_dict(self._conninfo)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(
                f"malformed PostgreSQL ledger URL {redact_url(config.url)!r}: {exc}"
            ) from None
        self._check_server()
        self._pool = ConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=int(config.options.get("pool_size", "4")),
            kwargs={"autocommit": True, "connect_timeout": 5},
            configure=self._configure,
            open=True,
            timeout=15.0,
            name=f"ratchet-{self.schema}",
        )
        try:
            current = self.schema_version()
            if current > self.latest_version:
                raise SchemaTooNew(current, self.latest_version, self._where)
            if must_exist and current == 0:
                raise LedgerUnavailable(
                    f"no Ratchet ledger in {self._where} (from {redact_url(config.url)!r}). Check"
                    " --ledger / "
                    "RATCHET_LEDGER_URL, or create it with `ratchet migrate`."
                )
            if migrate:
                self.migrate()
        except BaseException:
            self._pool.close()
            raise

    # ------------------------------------------------------------------ plumbing

    def _check_server(self) -> None:
        """Connect once directly: a clear error now instead of a pool timeout later."""
        try:
            with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
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
                f"cannot connect to PostgreSQL ledger {self._where}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
            ) from exc

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema))
        )
        # A worker frozen inside a ledger transaction (SIGSTOP, VM pause) keeps the row
        # locks of the tasks it was writing, and SKIP LOCKED claims would skip those tasks
        # even after their leases expire. Ledger transactions last milliseconds; the server
        # ends one that sits idle longer than this, which releases its locks.
        conn.execute(
            "SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
            (f"{IDLE_IN_TRANSACTION_TIMEOUT_MS}ms",),
        )
        # Every ledger statement touches a handful of rows by key. With statistics the
        # planner may hash-join a completion batch against every running task instead of
        # one primary-key lookup per row; these knobs only penalise the other plans. (The
        # claim's own knob, enable_sort, is set per transaction: see _run(claims=True).)
        for knob in ("enable_hashjoin", "enable_mergejoin"):
            conn.execute("SELECT set_config(%s, 'off', false)", (knob,))
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
                f"PostgreSQL ledger {self._where}: no connection available ({exc})"
            ) from exc

    def _run(
        self,
        body: Callable[[Cursor], T],
        write: bool = True,
        retry: bool = True,
        claims: bool = False,
    ) -> T:
        """Run ``body`` in one transaction; retry once if the connection died before COMMIT
        was sent, and on deadlock / serialization failure (the server rolled it back).

        ``claims``: the transaction claims; the planner must walk ``tasks_ready`` in
        ``run_at`` order and stop at the limit. Without statistics (a new ledger, a burst of
        submissions before autovacuum's ANALYZE) it would fetch and sort the whole ready
        set instead (46 ms with 20,000 ready tasks), so sorting is off for the transaction.
        """
        attempts = 3 if retry else 1
        for attempt in range(1, attempts + 1):
            committing = False
            try:
                with self._connection() as conn, conn.cursor() as cur:
                    # BEGIN and the transaction's clock in one round trip.
                    if claims:
                        cur.execute("BEGIN; SET LOCAL enable_sort = off; " + _NOW_SQL)
                        cur.nextset()
                    else:
                        cur.execute("BEGIN; " + _NOW_SQL)
                    cur.nextset()
                    clock = cur.fetchone()
                    assert clock is not None
                    self._tx.now = float(clock[0])
                    try:
                        result = body(cur)
                        if write:
                            faults.point("commit.before_commit")
                        committing = True
                        cur.execute("COMMIT")
                        return result
                    except BaseException:
                        if not committing and not conn.closed:
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                        raise
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
                if attempt == attempts:
                    raise LedgerError(f"PostgreSQL ledger {self._where}: {exc}") from exc
                time.sleep(random.uniform(0.005, 0.05) * attempt)
            except psycopg.OperationalError as exc:
                if committing:
                    raise _CommitLost(
                        f"PostgreSQL ledger {self._where}: connection lost during COMMIT; the "
                        f"outcome of this transaction is unknown ({exc})"
                    ) from exc
                if attempt == attempts:
                    raise LedgerUnavailable(
                        f"PostgreSQL ledger {self._where} is unreachable: {exc}"
                    ) from exc
                # The server dropped this connection, so it likely dropped its idle
                # siblings too (restart, pg_terminate_backend): test them all before
                # retrying, so the retry gets a live connection, not the next dead one.
                with contextlib.suppress(Exception):
                    self._pool.check()
                time.sleep(0.05 * attempt)
            except psycopg.Error as exc:
                raise LedgerError(f"PostgreSQL ledger {self._where}: {exc}") from exc
        raise AssertionError("unreachable")

    def _now(self, cur: Cursor) -> float:
        """The ledger clock of the running transaction (read with its BEGIN)."""
        now: float = self._tx.now
        return now

    @staticmethod
    def _audit(cur: Cursor, rows: Sequence[AuditRow]) -> None:
        if rows:
            cur.execute(
                "INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder,"
                " detail) SELECT u.task_id, u.at, u.kind, u.from_state, u.to_state, u.generation,"
                " u.holder, u.detail FROM unnest(%s::text[], %s::float8[], %s::text[], %s::text[],"
                " %s::text[], %s::bigint[], %s::text[], %s::text[]) WITH ORDINALITY"
                " AS u(task_id, at, kind, from_state, to_state, generation, holder, detail, n)"
                " ORDER BY n",
                _columns(rows, 8),
            )

    def _notify(self, cur: Cursor, names: Sequence[str]) -> None:
        """Wake listening workers at commit (one notification: the payload is not used)."""
        if names:
            cur.execute("SELECT pg_notify(%s, '')", (self.channel,))

    # ------------------------------------------------------------------ schema

    def schema_version(self) -> int:
        """The schema's version (0 when the schema or its version table does not exist)."""

        def body(cur: Cursor) -> int:
            row = cur.execute(
                "SELECT to_regclass(format('%%I.schema_version', %s::text))", (self.schema,)
            ).fetchone()
            if row is None or row[0] is None:
                return 0
            got = cur.execute(
                sql.SQL("SELECT max(version) FROM {}.schema_version").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
            return int(got[0]) if got and got[0] is not None else 0

        return self._run(body, write=False)

    def migrate(self) -> int:
        """Apply pending migrations in one transaction under an advisory lock.

        Two processes migrating at once serialise on the lock; the second finds the work
        done. Raises :class:`SchemaTooNew` (without writing) for a newer schema.
        """

        def body(cur: Cursor) -> int:
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
                raise SchemaTooNew(current, self.latest_version, self._where)
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
            return self._run(body)
        except LedgerError as exc:
            if isinstance(exc.__cause__, pg_errors.UniqueViolation):
                # Two first-ever migrations raced on CREATE SCHEMA; the lock now exists.
                return self._run(body)
            raise

    def now(self) -> float:
        """The ledger clock (the server's ``now()``), epoch seconds."""
        return self._run(self._now, write=False)

    # ------------------------------------------------------------------ submit

    def submit(self, tasks: Sequence[NewTask]) -> list[SubmitResult]:
        """See :meth:`Ledger.submit`. All-or-nothing; conflicts are counted in the audit log."""
        if not tasks:
            return []
        conflict: list[IdempotencyConflict] = []

        def body(cur: Cursor) -> list[SubmitResult]:
            now = self._now(cur)
            rows = [
                (
                    t.task_id, t.name, t.version, t.params_json, t.params_digest,
                    t.idempotency_key, t.max_attempts, t.lease_s,
                    t.run_at_epoch_s if t.run_at_epoch_s is not None
                    else now + max(0.0, t.delay_s),
                    now, now,
                )
                for t in tasks
            ]
            created = {
                r[0]
                for r in cur.execute(
                    "INSERT INTO tasks (id, name, version, params, params_digest, idempotency_key,"
                    " state, max_attempts, lease_s, run_at, created_at, updated_at)"
                    " SELECT u.id, u.name, u.version, u.params, u.digest, u.key, 'PENDING',"
                    " u.max_attempts, u.lease_s, u.run_at, u.created_at, u.created_at"
                    " FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[], %s::text[],"
                    " %s::text[], %s::int[], %s::float8[], %s::float8[], %s::float8[])"
                    " AS u(id, name, version, params, digest, key, max_attempts,"
                    " lease_s, run_at, created_at)"
                    " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
                    # Rows go in idempotency-key order (unnest keeps array order), so two
                    # batches sharing keys lock them in the same order: no deadlock.
                    _columns(sorted(rows, key=lambda r: (r[5] is None, r[5] or "")), 10),
                ).fetchall()
            }
            results: list[SubmitResult] = []
            missing = [t for t in tasks if t.task_id not in created]
            existing: dict[str, tuple[str, str]] = {}
            if missing:
                keys = [t.idempotency_key for t in missing if t.idempotency_key is not None]
                if len(keys) != len(missing):
                    raise LedgerError("task id collision on submit (ids must be unique)")
                existing = {
                    r[0]: (r[1], r[2])
                    for r in cur.execute(
                        "SELECT idempotency_key, id, params_digest FROM tasks"
                        " WHERE idempotency_key = ANY(%s)",
                        (keys,),
                    )
                }
            for t in tasks:
                if t.task_id in created:
                    results.append(SubmitResult(t.task_id, created=True))
                    continue
                assert t.idempotency_key is not None
                task_id, digest = existing[t.idempotency_key]
                if digest != t.params_digest:
                    conflict.append(
                        IdempotencyConflict(t.idempotency_key, digest, t.params_digest, task_id)
                    )
                    raise _Rollback
                results.append(SubmitResult(task_id, created=False))
            ready_names = [t.name for t in tasks
                           if t.task_id in created and t.run_at_epoch_s is None
                           and t.delay_s <= 0]
            self._notify(cur, ready_names)
            return results

        try:
            return self._run(body)
        except _Rollback:
            pass
        found = conflict[0]

        def count(cur: Cursor) -> None:
            self._audit(cur, [(
                found.task_id, self._now(cur), "idempotency_conflict", None, None, None, None,
                dumps({"key": found.key, "existing_digest": found.existing_digest,
                       "new_digest": found.new_digest}),
            )])

        self._run(count)
        raise found

    # ------------------------------------------------------------------ claim / renew

    def claim(self, holder: str, names: Sequence[str], limit: int) -> list[Claim]:
        """See :meth:`Ledger.claim`. Expired leases are taken over before fresh work.

        An expired lease on a task's final attempt is not taken over: the task is
        dead-lettered (``FAILED``), or goes to ``UNKNOWN`` when an effect intent is open.
        """
        if limit <= 0 or not names:
            return []
        return self._run(
            lambda cur: self._claim_in(cur, self._now(cur), holder, names, limit), claims=True
        )

    def _claim_in(
        self, cur: Cursor, now: float, holder: str, names: Sequence[str], limit: int
    ) -> list[Claim]:
        """The claim, inside the caller's transaction (see :meth:`claim`)."""
        if limit <= 0 or not names:
            return []
        name_list = list(names)
        expired = cur.execute(
            "SELECT id, holder, generation, attempt, max_attempts FROM tasks"
            " WHERE state = 'RUNNING' AND lease_until < %s AND name = ANY(%s)"
            " ORDER BY lease_until LIMIT %s FOR UPDATE SKIP LOCKED",
            (now, name_list, limit),
        ).fetchall()
        audit: list[AuditRow] = []
        exhausted = [row for row in expired if row[3] >= row[4]]
        if exhausted:
            self._retire(cur, exhausted, now, audit, "lease expired on final attempt")
            expired = [row for row in expired if row[3] < row[4]]
        previous = {row[0]: (row[1], row[2]) for row in expired}
        rows: list[tuple[Any, ...]] = []
        if expired:
            rows.extend(
                (*r, "RUNNING")
                for r in cur.execute(
                    "UPDATE tasks SET holder = %s, generation = generation + 1,"
                    " attempt = attempt + 1, lease_until = %s + lease_s, updated_at = %s"
                    " WHERE id = ANY(%s) AND state = 'RUNNING'"
                    " RETURNING id, name, version, params, generation, attempt, max_attempts,"
                    " lease_s, lease_until",
                    (holder, now, now, list(previous)),
                ).fetchall()
            )
        if limit > len(expired):
            rows.extend(
                cur.execute(
                    CLAIM_READY_SQL,
                    {"now": now, "names": name_list, "limit": limit - len(expired),
                     "holder": holder},
                ).fetchall()
            )
        for row in rows:
            prev = previous.get(row[0])
            detail: dict[str, Any] = {"attempt": row[5], "lease_s": row[7]}
            if prev is not None:
                detail.update(previous_holder=prev[0], previous_generation=prev[1])
            audit.append((
                row[0], now, "takeover" if prev is not None else "claim", row[9], "RUNNING",
                row[4], holder, dumps(detail),
            ))
        self._audit(cur, audit)
        resumed = [row[0] for row in rows if row[4] > 1]
        steps: dict[str, dict[str, StepRecord]] = {}
        effects: dict[str, dict[str, EffectRecord]] = {}
        if resumed:
            for s in cur.execute(
                "SELECT task_id, name, result, generation, committed_at FROM steps"
                " WHERE task_id = ANY(%s)",
                (resumed,),
            ):
                steps.setdefault(s[0], {})[s[1]] = StepRecord(s[1], s[2], s[3], s[4])
            for e in cur.execute(
                f"SELECT task_id, {EFFECT_COLUMNS} FROM effects WHERE task_id = ANY(%s)",
                (resumed,),
            ):
                effects.setdefault(e[0], {})[e[1]] = effect_record(e[1:])
        return [
            Claim(
                task_id=row[0],
                name=row[1],
                version=row[2],
                params_json=row[3],
                generation=row[4],
                attempt=row[5],
                max_attempts=row[6],
                lease_s=row[7],
                lease_until=row[8],
                ledger_now=now,
                takeover=row[0] in previous,
                previous_holder=previous[row[0]][0] if row[0] in previous else None,
                steps=steps.get(row[0], {}),
                effects=effects.get(row[0], {}),
            )
            for row in rows
        ]

    def _retire(
        self,
        cur: Cursor,
        rows: Sequence[tuple[Any, ...]],
        now: float,
        audit: list[AuditRow],
        reason: str,
    ) -> None:
        """Retire locked RUNNING rows ``(id, holder, generation, attempt, max_attempts)``
        whose holder is gone on the final attempt: FAILED, or UNKNOWN with an open intent."""
        ids = [row[0] for row in rows]
        open_intents: dict[str, tuple[str, str]] = {}
        for task_id, name, key in cur.execute(
            "SELECT DISTINCT ON (task_id) task_id, name, key FROM effects"
            " WHERE task_id = ANY(%s) AND state = 'intent' ORDER BY task_id, name",
            (ids,),
        ):
            open_intents[task_id] = (name, key)
        for task_id, holder, generation, attempt, max_attempts in rows:
            intent = open_intents.get(task_id)
            target = State.UNKNOWN if intent else State.FAILED
            check_transition(State.RUNNING, target)
            error = (
                f"holder {holder} is gone ({reason}) during attempt {attempt} of {max_attempts}"
            )
            if intent:
                error += f"; effect {intent[0]!r} (key {intent[1]!r}) has an open intent"
            cur.execute(
                "UPDATE tasks SET state = %s, holder = NULL, lease_until = NULL,"
                " generation = generation + 1, last_error = %s, error_class = 'lease_expired',"
                " updated_at = %s WHERE id = %s AND generation = %s AND state = 'RUNNING'",
                (target.value, error, now, task_id, generation),
            )
            audit.append((
                task_id, now, "transition", State.RUNNING.value, target.value, generation + 1,
                None, dumps({"reason": reason, "previous_holder": holder, "error": error}),
            ))

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """See :meth:`Ledger.renew`. Expired leases are not renewed (the ledger clock decides).

        Rows are locked in id order first, like every fenced write, so a renewal and a commit
        of the same worker never deadlock.
        """
        if not leases:
            return []

        def body(cur: Cursor) -> list[RenewResult]:
            now = self._now(cur)
            ids = [task_id for task_id, _ in leases]
            gens = [generation for _, generation in leases]
            renewed = {
                (r[0], r[1]): r[2]
                for r in cur.execute(
                    "WITH wanted AS (SELECT * FROM unnest(%s::text[], %s::bigint[]) AS w(id, gen)),"
                    " locked AS (SELECT t.id FROM tasks t JOIN wanted w ON t.id = w.id"
                    "  AND t.generation = w.gen WHERE t.holder = %s AND t.state = 'RUNNING'"
                    "  AND t.lease_until >= %s ORDER BY t.id FOR UPDATE OF t)"
                    " UPDATE tasks t SET lease_until = %s + t.lease_s FROM locked"
                    " WHERE t.id = locked.id RETURNING t.id, t.generation, t.lease_until",
                    (ids, gens, holder, now, now),
                )
            }
            cur.execute(
                "UPDATE workers SET last_seen = %s WHERE holder = %s", (now, holder)
            )
            return [
                RenewResult(task_id, generation, (task_id, generation) in renewed,
                            renewed.get((task_id, generation)), now)
                for task_id, generation in leases
            ]

        return self._run(body)

    # ------------------------------------------------------------------ commit

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """See :meth:`Ledger.commit`: one transaction, fenced per task under row locks."""
        self._check_transitions(writes)
        if not writes:
            return []
        try:
            return self._run(lambda cur: self._commit_in(cur, self._now(cur), writes))
        except _CommitLost:
            # Applied or not, we cannot tell: apply again. Fenced writes are idempotent here
            # (a transition already applied at this generation is acknowledged, not stale).
            return self._run(
                lambda cur: self._commit_in(cur, self._now(cur), writes, resend=True)
            )

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[str], limit: int
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """See :meth:`Ledger.commit_and_claim`: both in one transaction (one WAL flush)."""
        self._check_transitions(writes)

        def body(cur: Cursor) -> tuple[list[CommitOutcome], list[Claim]]:
            now = self._now(cur)
            outcomes = self._commit_in(cur, now, writes)
            return outcomes, self._claim_in(cur, now, holder, names, limit)

        try:
            return self._run(body, claims=True)
        except _CommitLost:
            # Re-apply the writes only. If the lost transaction did commit, the tasks it
            # claimed stay leased to us unseen until their leases expire (then taken over).
            return self._run(
                lambda cur: self._commit_in(cur, self._now(cur), writes, resend=True)
            ), []

    @staticmethod
    def _check_transitions(writes: Sequence[TaskWrite]) -> None:
        for write in writes:
            if write.transition is not None:
                check_transition(State.RUNNING, write.transition.to)

    def _commit_in(
        self, cur: Cursor, now: float, writes: Sequence[TaskWrite], resend: bool = False
    ) -> list[CommitOutcome]:
        """The commit, inside the caller's transaction (see :meth:`commit`).

        ``resend``: these writes were sent before in a transaction whose COMMIT reply was
        lost. A write at the task's current generation whose task has already moved on
        (a later write of the same lost batch changed its state) was applied then: it is
        acknowledged, and re-sent effect intents are not counted as new calls.
        """
        outcomes: dict[int, CommitOutcome] = {}
        audit: list[AuditRow] = []
        if not writes:
            return []
        # Lock every task row this batch writes, in id order, and read the fence under it.
        current: dict[str, tuple[str, int, int, str]] = {
            r[0]: (r[1], r[2], r[3], r[4])
            for r in cur.execute(
                "SELECT id, state, generation, attempt, name FROM tasks WHERE id = ANY(%s)"
                " ORDER BY id FOR UPDATE",
                (sorted({w.task_id for w in writes}),),
            )
        }
        steps: list[tuple[str, str, str, int, float]] = []
        intents: list[tuple[str, str, str, str, int, int, float]] = []
        outcome_rows: list[tuple[Any, ...]] = []
        transitions: list[tuple[TaskWrite, Transition]] = []
        ready_names: list[str] = []
        seen: set[str] = set()
        for index, write in enumerate(writes):
            if write.task_id in seen:
                # A task written twice in one batch: apply what came before first, so the
                # second write sees the first (as if committed one after the other).
                self._apply(cur, now, steps, intents, outcome_rows, transitions, resend)
                steps, intents, outcome_rows, transitions = [], [], [], []
                seen = set()
            seen.add(write.task_id)
            row = current.get(write.task_id)
            t = write.transition
            if (
                row is not None and t is not None and t.to is not State.RUNNING
                and row[0] == t.to.value and row[1] == write.generation
            ) or (
                resend and row is not None and row[1] == write.generation
                and row[0] != State.RUNNING.value
            ):
                # This very transition was already applied at this generation (only the
                # holder of a generation writes with it): a re-send after a connection lost
                # during COMMIT. Acknowledge it; write nothing twice.
                outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
                continue
            if row is None or row[0] != State.RUNNING.value or row[1] != write.generation:
                state = State(row[0]) if row is not None else None
                generation = row[1] if row is not None else None
                audit.append((
                    write.task_id, now, "stale_rejected", None, None, write.generation,
                    write.holder,
                    dumps({"operation": write.operation, "current_generation": generation,
                           "current_state": state.value if state else None}),
                ))
                outcomes[index] = CommitOutcome(write.task_id, False, True, generation, state)
                continue
            attempt = row[2]
            steps.extend((write.task_id, n, r, write.generation, now) for n, r in write.steps)
            for e in write.effects:
                if e.state is EffectState.INTENT:
                    intents.append((write.task_id, e.name, e.key, e.params_digest,
                                    write.generation, attempt, now))
                    continue
                outcome_rows.append((write.task_id, e.name, e.key, e.params_digest,
                                     e.state.value, e.result_json, write.generation, attempt,
                                     e.via_lookup, now))
                if e.via_lookup:
                    audit.append((write.task_id, now, "lookup_hit", None, None,
                                  write.generation, write.holder,
                                  dumps({"effect": e.name, "key": e.key})))
            t = write.transition
            if t is not None:
                transitions.append((write, t))
                audit.append(transition_audit(write, t, now))
                # Later writes of this batch for the same task see the new state.
                current[write.task_id] = (t.to.value, row[1], row[2], row[3])
                if reschedules(t.to) and t.delay_s <= 0:
                    ready_names.append(row[3])
            outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
        self._apply(cur, now, steps, intents, outcome_rows, transitions, resend)
        self._audit(cur, audit)
        if ready_names:
            self._notify(cur, ready_names)
        return [outcomes[i] for i in range(len(writes))]

    def _apply(
        self,
        cur: Cursor,
        now: float,
        steps: list[tuple[str, str, str, int, float]],
        intents: list[tuple[str, str, str, str, int, int, float]],
        outcome_rows: list[tuple[Any, ...]],
        transitions: list[tuple[TaskWrite, Transition]],
        resend: bool,
    ) -> None:
        """Write one segment of fenced rows (each task at most once in a segment)."""
        # One statement per kind of row, the rows passed as arrays (unnest): a round trip
        # per kind, not per row, and no pipeline mode (after a pipelined executemany,
        # PostgreSQL 15 stops enforcing idle_in_transaction_session_timeout on the
        # session, which is what frees the row locks of a frozen worker).
        if steps:
            last_step = {(r[0], r[1]): r for r in steps}  # one row per (task, step)
            cur.execute(
                "INSERT INTO steps (task_id, name, result, generation, committed_at)"
                " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[],"
                " %s::float8[]) ON CONFLICT (task_id, name) DO UPDATE SET"
                " result = excluded.result, generation = excluded.generation,"
                " committed_at = excluded.committed_at",
                _columns(list(last_step.values()), 5),
            )
        if intents:
            last_intent = {(r[0], r[1]): r for r in intents}
            cur.execute(
                "INSERT INTO effects (task_id, name, key, params_digest, state, result,"
                " generation, attempt, calls, via_lookup, updated_at)"
                " SELECT u.task_id, u.name, u.key, u.digest, 'intent', NULL, u.generation,"
                " u.attempt, 1, false, u.at FROM unnest(%s::text[], %s::text[], %s::text[],"
                " %s::text[], %s::bigint[], %s::int[], %s::float8[])"
                " AS u(task_id, name, key, digest, generation, attempt, at)"
                " ON CONFLICT (task_id, name) DO UPDATE SET state = 'intent',"
                " key = excluded.key, params_digest = excluded.params_digest,"
                " generation = excluded.generation, attempt = excluded.attempt,"
                " calls = effects.calls + CASE WHEN %s AND effects.state = 'intent'"
                " AND effects.generation = excluded.generation AND effects.key = excluded.key"
                " THEN 0 ELSE 1 END, updated_at = excluded.updated_at",
                [*_columns(list(last_intent.values()), 7), resend],
            )
        if outcome_rows:
            last_outcome = {(r[0], r[1]): r for r in outcome_rows}
            cur.execute(
                "INSERT INTO effects (task_id, name, key, params_digest, state, result,"
                " generation, attempt, calls, via_lookup, updated_at)"
                " SELECT u.task_id, u.name, u.key, u.digest, u.state, u.result, u.generation,"
                " u.attempt, 0, u.via_lookup, u.at FROM unnest(%s::text[], %s::text[],"
                " %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[], %s::int[],"
                " %s::bool[], %s::float8[]) AS u(task_id, name, key, digest, state, result,"
                " generation, attempt, via_lookup, at)"
                " ON CONFLICT (task_id, name) DO UPDATE SET state = excluded.state,"
                " result = excluded.result, generation = excluded.generation,"
                " via_lookup = excluded.via_lookup, updated_at = excluded.updated_at",
                _columns(list(last_outcome.values()), 10),
            )
        if transitions:
            rows = [
                (
                    w.task_id, w.generation, t.to.value,
                    now + max(0.0, t.delay_s) if reschedules(t.to) else None,
                    t.to is State.PENDING, t.to is State.RUNNING,
                    t.result_json, t.error, t.error_class,
                )
                for w, t in transitions
            ]
            cur.execute(
                "UPDATE tasks t SET state = u.state, run_at = COALESCE(u.run_at, t.run_at),"
                " attempt = CASE WHEN u.release THEN t.attempt - 1 ELSE t.attempt END,"
                " holder = CASE WHEN u.keep THEN t.holder ELSE NULL END,"
                " lease_until = CASE WHEN u.keep THEN t.lease_until ELSE NULL END,"
                " result = COALESCE(u.result, t.result),"
                " last_error = COALESCE(u.error, t.last_error),"
                " error_class = COALESCE(u.error_class, t.error_class), updated_at = %s"
                " FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[], %s::bool[],"
                " %s::bool[], %s::text[], %s::text[], %s::text[])"
                " AS u(id, generation, state, run_at, release, keep, result, error, error_class)"
                # "state || ''": the condition must not match the partial index
                # tasks_holder (WHERE state = 'RUNNING'). With statistics taken while few
                # tasks ran, the planner would scan that index (and its dead entries of
                # finished tasks) for every row of the batch instead of one primary-key
                # lookup per row: 6,000 instead of 10,800 tasks/s in the benchmark.
                " WHERE t.id = u.id AND t.generation = u.generation"
                " AND (t.state || '') = 'RUNNING'",
                [now, *_columns(rows, 9)],
            )

    # ------------------------------------------------------------------ operator

    def resolve(
        self,
        task_id: str,
        outcome: ResolveOutcome,
        reason: str,
        operator: str,
        result_json: str | None = None,
    ) -> TaskInfo:
        """See :meth:`Ledger.resolve`."""

        def body(cur: Cursor) -> None:
            now = self._now(cur)
            row = cur.execute(
                "SELECT state, generation, name FROM tasks WHERE id = %s FOR UPDATE", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            if row[0] != State.UNKNOWN.value:
                raise IllegalTransition(
                    f"task {task_id} is {row[0]}, not UNKNOWN; only UNKNOWN tasks can be resolved"
                )
            check_transition(State.UNKNOWN, State.PENDING)
            open_effects = cur.execute(
                "SELECT name, key FROM effects WHERE task_id = %s AND state = 'intent'",
                (task_id,),
            ).fetchall()
            new_state = (
                EffectState.DONE if outcome is ResolveOutcome.DONE else EffectState.NOT_DONE
            )
            cur.execute(
                "UPDATE effects SET state = %s, result = %s, updated_at = %s"
                " WHERE task_id = %s AND state = 'intent'",
                (new_state.value, result_json if new_state is EffectState.DONE else None, now,
                 task_id),
            )
            cur.execute(
                "UPDATE tasks SET state = 'PENDING', run_at = %s, updated_at = %s"
                " WHERE id = %s AND state = 'UNKNOWN' AND generation = %s",
                (now, now, task_id, row[1]),
            )
            self._audit(cur, [(
                task_id, now, "operator_resolve", State.UNKNOWN.value, State.PENDING.value,
                row[1], None,
                dumps({"operator": operator, "reason": reason, "outcome": outcome.value,
                       "effects": [{"name": e[0], "key": e[1]} for e in open_effects]}),
            )])
            self._notify(cur, [row[2]])

        self._run(body)  # a conditional update (UNKNOWN at a generation): safe to retry
        return self.get(task_id)

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskInfo:
        """See :meth:`Ledger.get`."""
        row = self._run(
            lambda cur: cur.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s", (task_id,)
            ).fetchone(),
            write=False,
        )
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in the ledger")
        return task_info(row)

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """See :meth:`Ledger.get_many`."""
        ids = list(task_ids)
        if not ids:
            return []
        rows = self._run(
            lambda cur: cur.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ANY(%s)", (ids,)
            ).fetchall(),
            write=False,
        )
        return [task_info(r) for r in rows]

    def timeline(self, task_id: str) -> Timeline:
        """See :meth:`Ledger.timeline`."""

        def body(cur: Cursor) -> Timeline:
            row = cur.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            events = [
                AuditEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], loads(r[8]) or {})
                for r in cur.execute(
                    "SELECT seq, task_id, at, kind, from_state, to_state, generation, holder,"
                    " detail FROM audit WHERE task_id = %s ORDER BY seq",
                    (task_id,),
                )
            ]
            steps = [
                StepRecord(r[0], r[1], r[2], r[3])
                for r in cur.execute(
                    "SELECT name, result, generation, committed_at FROM steps"
                    " WHERE task_id = %s ORDER BY committed_at",
                    (task_id,),
                )
            ]
            effects = [
                effect_record(r)
                for r in cur.execute(
                    f"SELECT {EFFECT_COLUMNS} FROM effects WHERE task_id = %s"
                    " ORDER BY updated_at",
                    (task_id,),
                )
            ]
            return Timeline(task_info(row), events, steps, effects)

        return self._run(body, write=False)

    def stats(self) -> LedgerStats:
        """See :meth:`Ledger.stats`."""

        def body(cur: Cursor) -> LedgerStats:
            now = self._now(cur)
            counts: dict[str, dict[str, int]] = {}
            for name, state, n in cur.execute(
                "SELECT name, state, count(*) FROM tasks GROUP BY name, state"
            ):
                counts.setdefault(name, {})[state] = int(n)
            oldest_row = cur.execute(
                "SELECT min(run_at) FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')"
                " AND run_at <= %s",
                (now,),
            ).fetchone()
            oldest = oldest_row[0] if oldest_row else None
            kinds = {
                k: int(n)
                for k, n in cur.execute(
                    "SELECT kind, count(*) FROM audit WHERE kind IN ('claim', 'takeover',"
                    " 'stale_rejected', 'lookup_hit', 'idempotency_conflict', 'operator_resolve',"
                    " 'revoke') GROUP BY kind"
                )
            }
            unknown_row = cur.execute(
                "SELECT count(*) FROM tasks WHERE state = 'UNKNOWN'"
            ).fetchone()
            settings = {
                "synchronous_commit": str(
                    (cur.execute("SHOW synchronous_commit").fetchone() or ("?",))[0]
                ),
                "server_version": str(
                    (cur.execute("SHOW server_version").fetchone() or ("?",))[0]
                ),
                "schema": self.schema,
                "where": self._where,
            }
            version_row = cur.execute("SELECT max(version) FROM schema_version").fetchone()
            return LedgerStats(
                counts=counts,
                oldest_pending_age_s=(now - oldest) if oldest is not None else None,
                unknown_count=int(unknown_row[0]) if unknown_row else 0,
                claims=kinds.get("claim", 0) + kinds.get("takeover", 0),
                takeovers=kinds.get("takeover", 0),
                stale_rejections=kinds.get("stale_rejected", 0),
                lookup_hits=kinds.get("lookup_hit", 0),
                idempotency_conflicts=kinds.get("idempotency_conflict", 0),
                operator_actions=kinds.get("operator_resolve", 0),
                durability=self.config.durability.value,
                backend_settings=settings,
                schema_version=int(version_row[0]) if version_row and version_row[0] else 0,
                ledger_now=now,
                revocations=kinds.get("revoke", 0),
            )

        return self._run(body, write=False)

    # ------------------------------------------------------------------ wake-ups

    def subscribe(self, on_ready: Callable[[], None]) -> Subscription:
        """Call ``on_ready()`` (from a listener thread) whenever a task may have become
        ready: LISTEN on this ledger's channel, on a dedicated connection that reconnects
        by itself. Close the returned subscription to stop."""
        return _PgSubscription(self._conninfo, self.channel, on_ready)

    # ------------------------------------------------------------------ worker registry

    def register_worker(self, info: WorkerInfo) -> None:
        """See :meth:`Ledger.register_worker`."""

        def body(cur: Cursor) -> None:
            now = self._now(cur)
            cur.execute(
                "INSERT INTO workers (holder, host_id, hostname, pid, pid_start, started_at,"
                " last_seen, state) VALUES (%s, %s, %s, %s, %s, %s, %s, 'alive')"
                " ON CONFLICT (holder) DO UPDATE SET host_id = excluded.host_id,"
                " hostname = excluded.hostname, pid = excluded.pid,"
                " pid_start = excluded.pid_start, started_at = excluded.started_at,"
                " last_seen = excluded.last_seen, state = 'alive'",
                (info.holder, info.host_id, info.hostname, info.pid, info.pid_start, now, now),
            )

        self._run(body)

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """See :meth:`Ledger.touch_worker`."""
        self._run(lambda cur: cur.execute(
            "UPDATE workers SET last_seen = extract(epoch FROM now())::float8, state = %s"
            " WHERE holder = %s AND state <> 'dead'",
            (state, holder),
        ) and None)

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """See :meth:`Ledger.list_workers`."""

        def body(cur: Cursor) -> list[WorkerInfo]:
            query = (
                "SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state"
                " FROM workers"
            )
            if host_id is None:
                rows = cur.execute(query + " ORDER BY started_at").fetchall()
            else:
                rows = cur.execute(
                    query + " WHERE host_id = %s AND state = 'alive' ORDER BY started_at",
                    (host_id,),
                ).fetchall()
            return [WorkerInfo(*r) for r in rows]

        return self._run(body, write=False)

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""

        def body(cur: Cursor) -> list[str]:
            now = self._now(cur)
            rows = cur.execute(
                "SELECT id, holder, generation, attempt, max_attempts, name FROM tasks"
                " WHERE holder = %s AND state = 'RUNNING' ORDER BY id FOR UPDATE",
                (holder,),
            ).fetchall()
            audit: list[AuditRow] = []
            final = [r[:5] for r in rows if r[3] >= r[4]]
            retry = [r for r in rows if r[3] < r[4]]
            if final:
                self._retire(cur, final, now, audit, f"holder revoked by {by}: {reason}")
            if retry:
                cur.execute(
                    "UPDATE tasks SET state = 'RETRY_WAIT', holder = NULL, lease_until = NULL,"
                    " generation = generation + 1, run_at = LEAST(run_at, %s), updated_at = %s,"
                    " last_error = %s, error_class = 'holder_gone'"
                    " WHERE id = ANY(%s) AND state = 'RUNNING' AND holder = %s",
                    (now, now, f"holder {holder} revoked by {by}: {reason}",
                     [r[0] for r in retry], holder),
                )
                for r in retry:
                    audit.append((
                        r[0], now, "revoke", State.RUNNING.value, State.RETRY_WAIT.value,
                        r[2] + 1, by,
                        dumps({"previous_holder": holder, "previous_generation": r[2],
                               "reason": reason}),
                    ))
            cur.execute(
                "UPDATE workers SET state = 'dead' WHERE holder = %s", (holder,)
            )
            self._audit(cur, audit)
            if retry:
                self._notify(cur, [r[5] for r in retry])
            return [r[0] for r in rows]

        return self._run(body)

    def close(self) -> None:
        """Close the pool (every connection this object opened)."""
        if not self._closed:
            self._closed = True
            self._pool.close()


class _CommitLost(LedgerUnavailable):
    """The connection was lost while COMMIT was in flight: the outcome is unknown."""


class _Rollback(Exception):
    """Internal: abort the submit transaction (an idempotency conflict)."""
