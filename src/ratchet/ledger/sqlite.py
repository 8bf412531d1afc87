"""The embedded SQLite ledger: one file, WAL mode, many processes on one host.

Writes run in ``BEGIN IMMEDIATE`` transactions, so a transaction holds SQLite's single
writer lock from its first statement and the fence check and the write it guards cannot be
interleaved with another writer. The ledger clock is the host clock read *by SQLite inside
the transaction* (``julianday('now')``), never a value passed in by a worker.

Durability levels map to ``PRAGMA synchronous``: ``fsync`` → ``FULL`` (the WAL is synced
on every commit), ``buffered`` → ``NORMAL`` (synced at checkpoints only; survives a
process crash, not power loss).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import faults
from ..config import Durability, LedgerConfig
from ..errors import (
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
    WorkerInfo,
)
from .migrations import load_migrations, split_statements
from .rows import (
    EFFECT_COLUMNS,
    TASK_COLUMNS,
    AuditRow,
    effect_record,
    reschedules,
    task_info,
    transition_audit,
)

__all__ = ["SQLiteLedger"]

_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


class _NoSubscription:
    """The subscription of a ledger that cannot notify: nothing to close."""

    def close(self) -> None:
        return None


_SYNCHRONOUS = {Durability.FSYNC: "FULL", Durability.BUFFERED: "NORMAL"}


class SQLiteLedger:
    """A :class:`~ratchet.ledger.base.Ledger` on one SQLite file.

    Each thread uses its own connection (created on first use), so the worker's writer
    thread, its heartbeat thread and API readers never share one.

    Args:
        config: the parsed ledger URL.
        migrate: apply pending migrations on open (the default, "first use").
        must_exist: raise ``LedgerUnavailable`` instead of creating a new file.

    Raises:
        LedgerUnavailable: the file cannot be opened (missing directory, not a database).
        SchemaTooNew: the file has a newer schema; it is not modified.
    """

    def __init__(
        self, config: LedgerConfig, migrate: bool = True, must_exist: bool = False
    ) -> None:
        self.config = config
        # Pinned once: a later chdir must not make a new thread open another file.
        self._path = os.path.abspath(config.path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._conn_lock = threading.Lock()
        self._migrations = load_migrations("sqlite")
        self.latest_version = self._migrations[-1].version
        self._closed = False
        if must_exist and not os.path.isfile(self._path):
            raise LedgerUnavailable(
                f"no ledger at {self._path} (from {config.url!r}; relative paths are relative "
                "to the current directory). Check --ledger / RATCHET_LEDGER_URL, or create it "
                "with `ratchet migrate`."
            )
        current = self.schema_version()
        if current > self.latest_version:
            raise SchemaTooNew(current, self.latest_version, self._path)
        if migrate:
            self.migrate()

    # ------------------------------------------------------------------ plumbing

    def _open(self) -> sqlite3.Connection:
        directory = os.path.dirname(os.path.abspath(self._path))
        if not os.path.isdir(directory):
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self._path!r}: directory {directory!r} does not exist"
            )
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self.config.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            # Read the schema version before anything that could write the file header.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self._path!r}: {exc} "
                "(is it a Ratchet ledger file, and readable?)"
            ) from exc
        if version > self.latest_version:
            conn.close()
            raise SchemaTooNew(version, self.latest_version, self._path)
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise LedgerUnavailable(
                    f"SQLite ledger {self._path!r} could not switch to WAL mode (got {mode})"
                )
            conn.execute(f"PRAGMA synchronous={_SYNCHRONOUS[self.config.durability]}")
            conn.execute("PRAGMA foreign_keys=OFF")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise LedgerUnavailable(
                f"cannot configure SQLite ledger {self._path!r}: {exc}"
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

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[sqlite3.Cursor]:
        """One transaction; ``BEGIN IMMEDIATE`` for writes. Driver errors become LedgerError."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            raise LedgerUnavailable(f"SQLite ledger {self._path!r} is busy or gone: {exc}") from exc
        cur = conn.cursor()
        try:
            yield cur
            if write:
                faults.point("commit.before_commit")
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise LedgerError(f"SQLite ledger {self._path!r}: {exc}") from exc
            raise
        finally:
            cur.close()

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Convert driver errors of a single autocommit read into LedgerError."""
        try:
            yield
        except sqlite3.Error as exc:
            raise LedgerError(f"SQLite ledger {self._path!r}: {exc}") from exc

    @staticmethod
    def _now(cur: sqlite3.Cursor) -> float:
        value: float = cur.execute(f"SELECT {_NOW}").fetchone()[0]
        return value

    @staticmethod
    def _audit(
        cur: sqlite3.Cursor,
        rows: Sequence[AuditRow],
    ) -> None:
        cur.executemany(
            "INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder,"
            " detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    # ------------------------------------------------------------------ schema

    def schema_version(self) -> int:
        """The file's ``PRAGMA user_version`` (0 for a new file)."""
        directory = os.path.dirname(os.path.abspath(self._path))
        if not os.path.isdir(directory):
            raise LedgerUnavailable(
                f"cannot open SQLite ledger {self._path!r}: directory {directory!r} does not exist"
            )
        try:
            # A private read-only look, so that a too-new file is never touched.
            uri = "file:" + urllib.parse.quote(self._path) + "?mode=ro"
            if not os.path.exists(self._path):
                return 0
            conn = sqlite3.connect(uri, uri=True, timeout=self.config.busy_timeout_s)
            try:
                version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise LedgerUnavailable(
                f"cannot read SQLite ledger {self._path!r}: {exc} "
                "(is it a Ratchet ledger file, and readable?)"
            ) from exc
        return version

    def migrate(self) -> int:
        """Apply pending migrations, each in its own ``BEGIN IMMEDIATE`` transaction.

        Raises:
            SchemaTooNew: the file has a newer schema (it is not modified).
        """
        conn = self._conn()
        for migration in self._migrations:
            with self._tx() as cur:
                current = cur.execute("PRAGMA user_version").fetchone()[0]
                if current > self.latest_version:
                    raise SchemaTooNew(current, self.latest_version, self._path)
                if current >= migration.version:
                    continue
                for statement in split_statements(migration.sql):
                    cur.execute(statement)
                cur.execute(f"PRAGMA user_version = {int(migration.version)}")
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        return version

    def now(self) -> float:
        """The ledger clock (host clock as read by SQLite), epoch seconds."""
        with self._errors():
            value: float = self._conn().execute(f"SELECT {_NOW}").fetchone()[0]
        return value

    # ------------------------------------------------------------------ submit

    def submit(self, tasks: Sequence[NewTask]) -> list[SubmitResult]:
        """See :meth:`Ledger.submit`. All-or-nothing; conflicts are counted in the audit log."""
        results: list[SubmitResult] = []
        conflict: IdempotencyConflict | None = None
        with self._tx() as cur:
            now = self._now(cur)
            for task in tasks:
                if task.idempotency_key is not None:
                    row = cur.execute(
                        "SELECT id, params_digest FROM tasks WHERE idempotency_key = ?",
                        (task.idempotency_key,),
                    ).fetchone()
                    if row is not None:
                        if row[1] != task.params_digest:
                            conflict = IdempotencyConflict(
                                task.idempotency_key, row[1], task.params_digest, row[0]
                            )
                            break
                        results.append(SubmitResult(row[0], created=False))
                        continue
                run_at = task.run_at_epoch_s if task.run_at_epoch_s is not None else now + max(
                    0.0, task.delay_s
                )
                cur.execute(
                    "INSERT INTO tasks (id, name, version, params, params_digest, idempotency_key,"
                    " state, max_attempts, lease_s, run_at, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, 'PENDING', ?, ?, ?, ?, ?)",
                    (
                        task.task_id,
                        task.name,
                        task.version,
                        task.params_json,
                        task.params_digest,
                        task.idempotency_key,
                        task.max_attempts,
                        task.lease_s,
                        run_at,
                        now,
                        now,
                    ),
                )
                results.append(SubmitResult(task.task_id, created=True))
            if conflict is not None:
                # Undo everything this batch wrote, then count the conflict alone.
                cur.execute("ROLLBACK")
                cur.execute("BEGIN IMMEDIATE")
                self._audit(
                    cur,
                    [
                        (
                            conflict.task_id,
                            self._now(cur),
                            "idempotency_conflict",
                            None,
                            None,
                            None,
                            None,
                            dumps(
                                {
                                    "key": conflict.key,
                                    "existing_digest": conflict.existing_digest,
                                    "new_digest": conflict.new_digest,
                                }
                            ),
                        )
                    ],
                )
        if conflict is not None:
            raise conflict
        return results

    # ------------------------------------------------------------------ claim / renew

    def claim(self, holder: str, names: Sequence[str], limit: int) -> list[Claim]:
        """See :meth:`Ledger.claim`. Expired leases are taken over before fresh work.

        An expired lease on a task's final attempt is not taken over: the holder died or
        hung on every attempt, so the task is dead-lettered (``FAILED``), or goes to
        ``UNKNOWN`` when an effect intent is open (the call may have happened).
        """
        if limit <= 0 or not names:
            return []
        with self._errors():
            # A lock-free look first, so idle polling does not take SQLite's write lock.
            anything = self._conn().execute(
                f"SELECT EXISTS (SELECT 1 FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')"
                f" AND run_at <= {_NOW}) OR EXISTS (SELECT 1 FROM tasks WHERE state = 'RUNNING'"
                f" AND lease_until < {_NOW})"
            ).fetchone()[0]
        if not anything:
            return []
        with self._tx() as cur:
            return self._claim_in(cur, self._now(cur), holder, names, limit)

    def _claim_in(
        self, cur: sqlite3.Cursor, now: float, holder: str, names: Sequence[str], limit: int
    ) -> list[Claim]:
        """The claim, inside the caller's write transaction (see :meth:`claim`)."""
        if limit <= 0 or not names:
            return []
        marks = ",".join("?" * len(names))
        # "+name": keep the planner on the partial indexes (tasks_ready / tasks_leased), which
        # hold only claimable rows in run_at order, instead of (name, state), which would sort
        # the whole backlog on every claim.
        expired = cur.execute(
            f"SELECT id, holder, generation, attempt, max_attempts FROM tasks"
            f" WHERE state = 'RUNNING' AND lease_until < ? AND +name IN ({marks})"
            f" ORDER BY lease_until LIMIT ?",
            (now, *names, limit),
        ).fetchall()
        audit: list[AuditRow] = []
        exhausted = [row for row in expired if row[3] >= row[4]]
        if exhausted:
            self._dead_letter_expired(cur, exhausted, now, audit)
            expired = [row for row in expired if row[3] < row[4]]
        previous = {row[0]: (row[1], row[2]) for row in expired}
        ready = cur.execute(
            f"SELECT id, state FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')"
            f" AND run_at <= ? AND +name IN ({marks}) ORDER BY run_at LIMIT ?",
            (now, *names, limit - len(expired)),
        ).fetchall() if limit > len(expired) else []
        from_state = {row[0]: row[1] for row in ready}
        ids = [row[0] for row in expired] + [row[0] for row in ready]
        if not ids:
            self._audit(cur, audit)
            return []
        id_marks = ",".join("?" * len(ids))
        rows = cur.execute(
            f"UPDATE tasks SET state = 'RUNNING', holder = ?, generation = generation + 1,"
            f" attempt = attempt + 1, lease_until = ? + lease_s, updated_at = ?"
            f" WHERE id IN ({id_marks})"
            f" RETURNING id, name, version, params, generation, attempt, max_attempts,"
            f" lease_s, lease_until",
            (holder, now, now, *ids),
        ).fetchall()
        for row in rows:
            prev = previous.get(row[0])
            detail: dict[str, Any] = {"attempt": row[5], "lease_s": row[7]}
            if prev is not None:
                detail.update(previous_holder=prev[0], previous_generation=prev[1])
            audit.append(
                (
                    row[0],
                    now,
                    "takeover" if prev is not None else "claim",
                    "RUNNING" if prev is not None else from_state.get(row[0]),
                    "RUNNING",
                    row[4],
                    holder,
                    dumps(detail),
                )
            )
        self._audit(cur, audit)
        # Steps and effects can only exist after an earlier claim: generation > 1.
        # (Not attempt: a release hands its attempt back, the generation never goes back.)
        resumed = [row[0] for row in rows if row[4] > 1]
        steps: dict[str, dict[str, StepRecord]] = {}
        effects: dict[str, dict[str, EffectRecord]] = {}
        if resumed:
            r_marks = ",".join("?" * len(resumed))
            for s in cur.execute(
                f"SELECT task_id, name, result, generation, committed_at FROM steps"
                f" WHERE task_id IN ({r_marks})",
                resumed,
            ):
                steps.setdefault(s[0], {})[s[1]] = StepRecord(s[1], s[2], s[3], s[4])
            for e in cur.execute(
                f"SELECT task_id, {EFFECT_COLUMNS} FROM effects WHERE task_id IN ({r_marks})",
                resumed,
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

    def _dead_letter_expired(
        self,
        cur: sqlite3.Cursor,
        rows: Sequence[tuple[Any, ...]],
        now: float,
        audit: list[AuditRow],
        reason: str = "lease expired on final attempt",
    ) -> None:
        """Retire expired (or revoked) leases of final attempts: FAILED, or UNKNOWN with an
        open intent."""
        for task_id, holder, generation, attempt, max_attempts in rows:
            open_intent = cur.execute(
                "SELECT name, key FROM effects WHERE task_id = ? AND state = 'intent' LIMIT 1",
                (task_id,),
            ).fetchone()
            target = State.UNKNOWN if open_intent else State.FAILED
            check_transition(State.RUNNING, target)
            error = (
                f"lease of holder {holder} expired during attempt {attempt} of {max_attempts}"
                " (the worker died or hung on its final attempt)"
            )
            if open_intent:
                error += f"; effect {open_intent[0]!r} (key {open_intent[1]!r}) has an open intent"
            # The generation moves on too: whatever the old holder still tries is fenced out.
            cur.execute(
                "UPDATE tasks SET state = ?, holder = NULL, lease_until = NULL,"
                " generation = generation + 1, last_error = ?, error_class = 'lease_expired',"
                " updated_at = ? WHERE id = ? AND generation = ? AND state = 'RUNNING'",
                (target.value, error, now, task_id, generation),
            )
            audit.append(
                (task_id, now, "transition", State.RUNNING.value, target.value, generation + 1,
                 None, dumps({"reason": reason, "previous_holder": holder, "error": error}))
            )

    def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> list[RenewResult]:
        """See :meth:`Ledger.renew`. Expired leases are not renewed (the ledger clock decides)."""
        if not leases:
            return []
        results: list[RenewResult] = []
        with self._tx() as cur:
            now = self._now(cur)
            for task_id, generation in leases:
                row = cur.execute(
                    "UPDATE tasks SET lease_until = ? + lease_s WHERE id = ? AND generation = ?"
                    " AND holder = ? AND state = 'RUNNING' AND lease_until >= ?"
                    " RETURNING lease_until",
                    (now, task_id, generation, holder, now),
                ).fetchone()
                results.append(
                    RenewResult(task_id, generation, row is not None, row[0] if row else None, now)
                )
        return results

    # ------------------------------------------------------------------ commit

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """See :meth:`Ledger.commit`: one transaction, fenced per task.

        The batch is applied with a handful of set-wise statements (one fence read, one
        ``executemany`` per kind of row), not a few statements per task: each statement
        costs the writer a GIL round trip, so per-batch statements are what let group
        commit scale. A task that appears twice is handled in order (segments).
        """
        self._check_transitions(writes)
        with self._tx() as cur:
            return self._commit_in(cur, self._now(cur), writes)

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[str], limit: int
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """See :meth:`Ledger.commit_and_claim`: both in one transaction (one fsync)."""
        self._check_transitions(writes)
        with self._tx() as cur:
            now = self._now(cur)
            outcomes = self._commit_in(cur, now, writes)
            return outcomes, self._claim_in(cur, now, holder, names, limit)

    @staticmethod
    def _check_transitions(writes: Sequence[TaskWrite]) -> None:
        for write in writes:
            if write.transition is not None:
                check_transition(State.RUNNING, write.transition.to)

    def _commit_in(
        self, cur: sqlite3.Cursor, now: float, writes: Sequence[TaskWrite]
    ) -> list[CommitOutcome]:
        """The commit, inside the caller's write transaction (see :meth:`commit`)."""
        outcomes: dict[int, CommitOutcome] = {}
        audit: list[AuditRow] = []
        segment: list[tuple[int, TaskWrite]] = []
        seen: set[str] = set()
        for index, write in enumerate(writes):
            if write.task_id in seen:
                self._commit_segment(cur, segment, now, audit, outcomes)
                segment, seen = [], set()
            segment.append((index, write))
            seen.add(write.task_id)
        self._commit_segment(cur, segment, now, audit, outcomes)
        self._audit(cur, audit)
        return [outcomes[i] for i in range(len(writes))]

    def _commit_segment(
        self,
        cur: sqlite3.Cursor,
        segment: Sequence[tuple[int, TaskWrite]],
        now: float,
        audit: list[AuditRow],
        outcomes: dict[int, CommitOutcome],
    ) -> None:
        """Apply writes of distinct tasks; the fence is read once for all of them."""
        if not segment:
            return
        current: dict[str, tuple[str, int, int]] = {}
        ids = [w.task_id for _, w in segment]
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for task_id, state, generation, attempt in cur.execute(
                f"SELECT id, state, generation, attempt FROM tasks"
                f" WHERE id IN ({','.join('?' * len(chunk))})",
                chunk,
            ):
                current[task_id] = (state, generation, attempt)
        steps: list[tuple[str, str, str, int, float]] = []
        intents: list[tuple[str, str, str, str, int, int, float]] = []
        outcomes_rows: list[tuple[str, str, str, str, str, str | None, int, int, int, float]] = []
        by_target: dict[State, list[tuple[Any, ...]]] = {}
        for index, write in segment:
            row = current.get(write.task_id)
            done = write.transition
            if (
                row is not None and done is not None and done.to is not State.RUNNING
                and row[0] == done.to.value and row[1] == write.generation
            ):
                # This transition is already applied at this generation (only its holder
                # writes with a generation): a re-send of a commit whose reply was lost.
                outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
                continue
            if row is None or row[0] != State.RUNNING.value or row[1] != write.generation:
                state = State(row[0]) if row is not None else None
                generation = row[1] if row is not None else None
                audit.append(
                    (write.task_id, now, "stale_rejected", None, None, write.generation,
                     write.holder,
                     dumps({"operation": write.operation, "current_generation": generation,
                            "current_state": state.value if state else None}))
                )
                outcomes[index] = CommitOutcome(write.task_id, False, True, generation, state)
                continue
            attempt = row[2]
            steps.extend((write.task_id, n, r, write.generation, now) for n, r in write.steps)
            for e in write.effects:
                if e.state is EffectState.INTENT:
                    intents.append((write.task_id, e.name, e.key, e.params_digest,
                                    write.generation, attempt, now))
                    continue
                outcomes_rows.append((write.task_id, e.name, e.key, e.params_digest,
                                      e.state.value, e.result_json, write.generation, attempt,
                                      int(e.via_lookup), now))
                if e.via_lookup:
                    audit.append((write.task_id, now, "lookup_hit", None, None,
                                  write.generation, write.holder,
                                  dumps({"effect": e.name, "key": e.key})))
            t = write.transition
            if t is not None:
                new_run_at = (now + max(0.0, t.delay_s),) if reschedules(t.to) else ()
                by_target.setdefault(t.to, []).append(
                    (t.to.value, *new_run_at, t.result_json, t.error, t.error_class, now,
                     write.task_id, write.generation)
                )
                audit.append(transition_audit(write, t, now))
            outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
        if steps:
            cur.executemany(
                "INSERT INTO steps (task_id, name, result, generation, committed_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id, name) DO UPDATE SET"
                " result = excluded.result, generation = excluded.generation,"
                " committed_at = excluded.committed_at",
                steps,
            )
        if intents:
            cur.executemany(
                "INSERT INTO effects (task_id, name, key, params_digest, state, result, generation,"
                " attempt, calls, via_lookup, updated_at) VALUES (?, ?, ?, ?, 'intent', NULL, ?, ?,"
                " 1, 0, ?) ON CONFLICT (task_id, name) DO UPDATE SET state = 'intent',"
                " key = excluded.key, params_digest = excluded.params_digest,"
                " generation = excluded.generation, attempt = excluded.attempt,"
                " calls = effects.calls + 1, updated_at = excluded.updated_at",
                intents,
            )
        if outcomes_rows:
            cur.executemany(
                "INSERT INTO effects (task_id, name, key, params_digest, state, result, generation,"
                " attempt, calls, via_lookup, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?)"
                " ON CONFLICT (task_id, name) DO UPDATE SET state = excluded.state,"
                " result = excluded.result, generation = excluded.generation,"
                " via_lookup = excluded.via_lookup, updated_at = excluded.updated_at",
                outcomes_rows,
            )
        for target, params in by_target.items():
            cur.executemany(self._transition_sql(target), params)
            if cur.rowcount != len(params):  # impossible: fenced above in this transaction
                raise LedgerError(
                    f"fenced transition to {target} matched {cur.rowcount} of {len(params)} rows"
                )

    @staticmethod
    def _transition_sql(target: State) -> str:
        """The fenced UPDATE of a RUNNING task to ``target`` (parameters: state, [run_at
        when ``target`` reschedules], result, error, error_class, now, id, generation)."""
        keep_lease = target is State.RUNNING
        # RETRY_WAIT / PENDING get a new run_at (backoff or release delay); a release
        # (RUNNING -> PENDING: graceful shutdown, unconfirmed lease) hands its attempt back,
        # so only runs that failed or crashed count toward max_attempts.
        run_at = "?" if reschedules(target) else "run_at"
        attempt = "attempt - 1" if target is State.PENDING else "attempt"
        holder = "holder" if keep_lease else "NULL"
        lease = "lease_until" if keep_lease else "NULL"
        return (
            f"UPDATE tasks SET state = ?, run_at = {run_at}, attempt = {attempt},"
            f" holder = {holder}, lease_until = {lease},"
            " result = COALESCE(?, result), last_error = COALESCE(?, last_error),"
            " error_class = COALESCE(?, error_class), updated_at = ?"
            " WHERE id = ? AND generation = ? AND state = 'RUNNING'"
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
        with self._tx() as cur:
            now = self._now(cur)
            row = cur.execute(
                "SELECT state, generation FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            if row[0] != State.UNKNOWN.value:
                raise IllegalTransition(
                    f"task {task_id} is {row[0]}, not UNKNOWN; only UNKNOWN tasks can be resolved"
                )
            check_transition(State.UNKNOWN, State.PENDING)
            open_effects = cur.execute(
                "SELECT name, key FROM effects WHERE task_id = ? AND state = 'intent'", (task_id,)
            ).fetchall()
            new_state = (
                EffectState.DONE if outcome is ResolveOutcome.DONE else EffectState.NOT_DONE
            )
            cur.execute(
                "UPDATE effects SET state = ?, result = ?, updated_at = ?"
                " WHERE task_id = ? AND state = 'intent'",
                (new_state.value, result_json if new_state is EffectState.DONE else None, now,
                 task_id),
            )
            cur.execute(
                "UPDATE tasks SET state = 'PENDING', run_at = ?, updated_at = ?"
                " WHERE id = ? AND state = 'UNKNOWN' AND generation = ?",
                (now, now, task_id, row[1]),
            )
            self._audit(
                cur,
                [
                    (task_id, now, "operator_resolve", State.UNKNOWN.value, State.PENDING.value,
                     row[1], None,
                     dumps({"operator": operator, "reason": reason, "outcome": outcome.value,
                            "effects": [{"name": e[0], "key": e[1]} for e in open_effects]}))
                ],
            )
        return self.get(task_id)

    # ------------------------------------------------------------------ reads

    def get(self, task_id: str) -> TaskInfo:
        """See :meth:`Ledger.get`."""
        with self._errors():
            row = self._conn().execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
        if row is None:
            raise TaskNotFound(f"no task {task_id!r} in the ledger")
        return task_info(row)

    def get_many(self, task_ids: Sequence[str]) -> list[TaskInfo]:
        """See :meth:`Ledger.get_many`."""
        out: list[TaskInfo] = []
        conn = self._conn()
        ids = list(task_ids)
        with self._errors():
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                out.extend(
                    task_info(r)
                    for r in conn.execute(
                        f"SELECT {TASK_COLUMNS} FROM tasks WHERE id IN ({marks})", chunk
                    )
                )
        return out

    def timeline(self, task_id: str) -> Timeline:
        """See :meth:`Ledger.timeline`."""
        with self._tx(write=False) as cur:
            row = cur.execute(
                f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            events = [
                AuditEvent(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], loads(r[8]) or {})
                for r in cur.execute(
                    "SELECT seq, task_id, at, kind, from_state, to_state, generation, holder,"
                    " detail FROM audit WHERE task_id = ? ORDER BY seq",
                    (task_id,),
                )
            ]
            steps = [
                StepRecord(r[0], r[1], r[2], r[3])
                for r in cur.execute(
                    "SELECT name, result, generation, committed_at FROM steps WHERE task_id = ?"
                    " ORDER BY committed_at",
                    (task_id,),
                )
            ]
            effects = [
                effect_record(r)
                for r in cur.execute(
                    f"SELECT {EFFECT_COLUMNS} FROM effects WHERE task_id = ? ORDER BY updated_at",
                    (task_id,),
                )
            ]
        return Timeline(task_info(row), events, steps, effects)

    def stats(self) -> LedgerStats:
        """See :meth:`Ledger.stats`."""
        with self._tx(write=False) as cur:
            now = self._now(cur)
            counts: dict[str, dict[str, int]] = {}
            for name, state, n in cur.execute(
                "SELECT name, state, COUNT(*) FROM tasks GROUP BY name, state"
            ):
                counts.setdefault(name, {})[state] = n
            oldest = cur.execute(
                "SELECT MIN(run_at) FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')"
                " AND run_at <= ?",
                (now,),
            ).fetchone()[0]
            kinds = dict(
                cur.execute(
                    "SELECT kind, COUNT(*) FROM audit WHERE kind IN ('claim', 'takeover',"
                    " 'stale_rejected', 'lookup_hit', 'idempotency_conflict', 'operator_resolve',"
                    " 'revoke')"
                    " GROUP BY kind"
                ).fetchall()
            )
            unknown = cur.execute("SELECT COUNT(*) FROM tasks WHERE state = 'UNKNOWN'").fetchone()[
                0
            ]
            conn = self._conn()
            settings = {
                "journal_mode": str(conn.execute("PRAGMA journal_mode").fetchone()[0]),
                "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
                    conn.execute("PRAGMA synchronous").fetchone()[0], "?"
                ),
                "path": os.path.abspath(self._path),
            }
            version = cur.execute("PRAGMA user_version").fetchone()[0]
        return LedgerStats(
            counts=counts,
            oldest_pending_age_s=(now - oldest) if oldest is not None else None,
            unknown_count=unknown,
            claims=kinds.get("claim", 0) + kinds.get("takeover", 0),
            takeovers=kinds.get("takeover", 0),
            stale_rejections=kinds.get("stale_rejected", 0),
            lookup_hits=kinds.get("lookup_hit", 0),
            idempotency_conflicts=kinds.get("idempotency_conflict", 0),
            operator_actions=kinds.get("operator_resolve", 0),
            revocations=kinds.get("revoke", 0),
            durability=self.config.durability.value,
            backend_settings=settings,
            schema_version=version,
            ledger_now=now,
        )

    # ------------------------------------------------------------------ wake-ups

    def subscribe(self, on_ready: Callable[[], None]) -> Subscription:
        """SQLite has no server to notify: the subscription never calls back and workers
        poll (see :meth:`Ledger.subscribe`)."""
        return _NoSubscription()

    # ------------------------------------------------------------------ worker registry

    def register_worker(self, info: WorkerInfo) -> None:
        """See :meth:`Ledger.register_worker`."""
        with self._tx() as cur:
            now = self._now(cur)
            cur.execute(
                "INSERT INTO workers (holder, host_id, hostname, pid, pid_start, started_at,"
                " last_seen, state) VALUES (?, ?, ?, ?, ?, ?, ?, 'alive')"
                " ON CONFLICT (holder) DO UPDATE SET host_id = excluded.host_id,"
                " hostname = excluded.hostname, pid = excluded.pid,"
                " pid_start = excluded.pid_start, started_at = excluded.started_at,"
                " last_seen = excluded.last_seen, state = 'alive'",
                (info.holder, info.host_id, info.hostname, info.pid, info.pid_start, now, now),
            )

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """See :meth:`Ledger.touch_worker`."""
        with self._tx() as cur:
            cur.execute(
                f"UPDATE workers SET last_seen = {_NOW}, state = ?"
                " WHERE holder = ? AND state <> 'dead'",
                (state, holder),
            )

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """See :meth:`Ledger.list_workers`."""
        query = (
            "SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state"
            " FROM workers"
        )
        with self._errors():
            conn = self._conn()
            if host_id is None:
                rows = conn.execute(query + " ORDER BY started_at").fetchall()
            else:
                rows = conn.execute(
                    query + " WHERE host_id = ? AND state = 'alive' ORDER BY started_at",
                    (host_id,),
                ).fetchall()
        return [WorkerInfo(*r) for r in rows]

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""
        with self._tx() as cur:
            now = self._now(cur)
            rows = cur.execute(
                "SELECT id, holder, generation, attempt, max_attempts FROM tasks"
                " WHERE holder = ? AND state = 'RUNNING'",
                (holder,),
            ).fetchall()
            audit: list[AuditRow] = []
            final = [r for r in rows if r[3] >= r[4]]
            if final:
                self._dead_letter_expired(cur, final, now, audit,
                                          reason=f"holder revoked by {by}: {reason}")
            for task_id, _, generation, attempt, max_attempts in rows:
                if attempt >= max_attempts:
                    continue
                cur.execute(
                    "UPDATE tasks SET state = 'RETRY_WAIT', holder = NULL, lease_until = NULL,"
                    " generation = generation + 1, run_at = MIN(run_at, ?), updated_at = ?,"
                    " last_error = ?,"
                    " error_class = 'holder_gone'"
                    " WHERE id = ? AND generation = ? AND state = 'RUNNING'",
                    (now, now, f"holder {holder} revoked by {by}: {reason}", task_id, generation),
                )
                audit.append(
                    (task_id, now, "revoke", State.RUNNING.value, State.RETRY_WAIT.value,
                     generation + 1, by,
                     dumps({"previous_holder": holder, "previous_generation": generation,
                            "reason": reason}))
                )
            cur.execute(
                "UPDATE workers SET state = 'dead' WHERE holder = ?", (holder,)
            )
            self._audit(cur, audit)
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close every connection opened by this ledger object (all threads)."""
        self._closed = True
        with self._conn_lock:
            for conn in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._connections.clear()
