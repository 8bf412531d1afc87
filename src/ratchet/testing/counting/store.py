"""The counting service's state inside its process: its SQLite file, fault settings and
counters, the fencing check, and the execute / lookup transactions."""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .protocol import ITEMS_ERROR, STALE_TOKEN_ERROR, TOKEN_HEADER, FaultSettings, valid_items
from .records import record_reply

__all__ = ["CountingStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    key   TEXT NOT NULL,
    body  TEXT NOT NULL,
    at    REAL NOT NULL,
    token INTEGER
);
CREATE INDEX IF NOT EXISTS executions_key ON executions (key);
CREATE TABLE IF NOT EXISTS records (
    key        TEXT PRIMARY KEY,
    record_id  TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS replays (
    id  INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lookups (
    id    INTEGER PRIMARY KEY AUTOINCREMENT,
    key   TEXT NOT NULL,
    found INTEGER NOT NULL,
    at    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
    key     TEXT PRIMARY KEY,
    highest INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS items (
    id   INTEGER PRIMARY KEY AUTOINCREMENT,
    item TEXT NOT NULL,
    key  TEXT NOT NULL,
    at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS stale_tokens (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    key     TEXT NOT NULL,
    token   INTEGER NOT NULL,
    highest INTEGER NOT NULL,
    op      TEXT NOT NULL,
    at      REAL NOT NULL
);
"""


class CountingStore:
    """The service's state: its SQLite file, fault settings and counters. Thread-safe.

    All database access goes through one connection under one lock, so "check the key,
    then execute" is atomic with respect to concurrent requests.

    Args:
        db_path: the service's own SQLite file (created if missing).
        faults: initial fault settings.
        seed: seed of the fault RNG (None: random).
        id_prefix: prefix of record ids (``"ch_"`` for charges).
    """

    def __init__(
        self,
        db_path: str | Path,
        faults: FaultSettings,
        seed: int | None = None,
        id_prefix: str = "ex_",
    ) -> None:
        self.faults = faults
        self.id_prefix = id_prefix
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._burst_left = 0
        self.injected = {"reply_lost": 0, "503": 0, "slow": 0, "conflicts_422": 0}
        self._conn = sqlite3.connect(
            str(db_path), check_same_thread=False, isolation_level=None, timeout=30.0
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(_SCHEMA)
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(executions)")}
        if "token" not in columns:  # a file written before fenced mode existed
            self._conn.execute("ALTER TABLE executions ADD COLUMN token INTEGER")

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    # -- fault decisions (each one draw from the seeded RNG, under the lock)

    def gate_503(self) -> bool:
        """True when this request to ``/effects`` must be answered 503 (executes nothing)."""
        with self._lock:
            f = self.faults
            hit = False
            if f.fail_next_503 > 0:
                f.fail_next_503 -= 1
                hit = True
            elif self._burst_left > 0:
                self._burst_left -= 1
                hit = True
            elif f.burst_503 > 0 and self._rng.random() < f.burst_503:
                self._burst_left = max(0, f.burst_len - 1)
                hit = True
            if hit:
                self.injected["503"] += 1
            return hit

    def _draw(self, next_field: str, probability: float, counter: str) -> bool:
        """One fault decision (under the lock): a deterministic ``*_next`` count first,
        else a seeded draw with ``probability``; a hit is counted in ``injected[counter]``."""
        pending = getattr(self.faults, next_field)
        if pending > 0:
            setattr(self.faults, next_field, pending - 1)
            hit = True
        else:
            hit = probability > 0 and self._rng.random() < probability
        if hit:
            self.injected[counter] += 1
        return hit

    def delay_s(self) -> float:
        """Seconds this POST sleeps before executing: its latency, or ``slow_s`` if slow."""
        with self._lock:
            f = self.faults
            if self._draw("slow_next", f.slow, "slow"):
                return f.slow_s
            if f.latency_s > 0:
                return f.latency_s * self._rng.uniform(0.5, 1.5)
            return 0.0

    def drop_reply(self) -> bool:
        """True when the reply of the request just executed must be dropped."""
        with self._lock:
            return self._draw("reply_lost_next", self.faults.reply_lost, "reply_lost")

    def set_faults(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change fault settings; return all of them. Raises ``ValueError`` (nothing changed)."""
        with self._lock:
            self.faults.update(changes)
            if changes.get("burst_503") == 0:
                self._burst_left = 0
            return asdict(self.faults)

    def get_faults(self) -> dict[str, Any]:
        """The current fault settings."""
        with self._lock:
            return asdict(self.faults)

    # -- the API

    def _fence(
        self, key: str, token: int | None, op: str, now: float
    ) -> tuple[int, dict[str, Any]] | None:
        """The fencing check of one request (under the lock, inside its transaction).

        Without ``check_tokens`` nothing is checked or recorded. Otherwise a missing token
        is a 400; a token lower than the highest seen for ``key`` is a 409 whose rejection
        is recorded in ``stale_tokens``; an accepted token is recorded as the key's highest
        (an equal one is accepted: the same holder asking again).

        Returns:
            None when the request may proceed, else ``(http status, reply)``.
        """
        if not self.faults.check_tokens:
            return None
        if token is None:
            return 400, {"error": f"missing {TOKEN_HEADER} header (the service checks tokens)",
                         "key": key}
        row = self._conn.execute("SELECT highest FROM tokens WHERE key = ?", (key,)).fetchone()
        highest = None if row is None else int(row[0])
        if highest is not None and token < highest:
            self._conn.execute(
                "INSERT INTO stale_tokens (key, token, highest, op, at) VALUES (?, ?, ?, ?, ?)",
                (key, token, highest, op, now),
            )
            return 409, {"error": STALE_TOKEN_ERROR, "key": key, "token": token,
                         "highest": highest}
        if highest is None or token > highest:
            self._conn.execute(
                "INSERT INTO tokens (key, highest) VALUES (?, ?) ON CONFLICT (key)"
                " DO UPDATE SET highest = excluded.highest",
                (key, token),
            )
        return None

    def execute(
        self, key: str, body: dict[str, Any], token: int | None = None
    ) -> tuple[int, dict[str, Any], bool]:
        """Execute (or replay) one request.

        Args:
            key: the idempotency key.
            body: the request body (a JSON object).
            token: the request's fencing token (checked only with ``check_tokens``).

        Returns:
            ``(http status, reply, executed)``: 201 and executed=True for a new execution
            (which applies the body's ``items``, if any: one row per item in ``items``),
            200 for a replay, 422 for a key reused with another body, 409 for a stale
            fencing token (``{"error", "key", "token", "highest"}``), 400 for a missing
            token in fenced mode or an ``items`` that is not a list of strings and
            integers. The token check, its record and the execution are one
            transaction under the store lock.
        """
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        items = body.get("items")
        if items is not None and not valid_items(items):
            return 400, {"error": ITEMS_ERROR, "key": key}, False
        with self._lock:
            now = time.time()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                answer = self._execute(key, canonical, token, now, items)
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            return answer

    def _execute(
        self, key: str, canonical: str, token: int | None, now: float,
        items: list[Any] | None = None,
    ) -> tuple[int, dict[str, Any], bool]:
        """:meth:`execute` inside its transaction (lock held); an execution applies the
        body's ``items`` (one row each in ``items``)."""
        refused = self._fence(key, token, "execute", now)
        if refused is not None:
            return refused[0], refused[1], False
        if self.faults.honour_keys:
            row = self._conn.execute(
                "SELECT record_id, body, created_at FROM records WHERE key = ?", (key,)
            ).fetchone()
            if row is not None:
                if row[1] != canonical:
                    self.injected["conflicts_422"] += 1
                    return (
                        422,
                        {
                            "error": "idempotency key reused with a different body",
                            "key": key,
                            "stored": json.loads(row[1]),
                        },
                        False,
                    )
                self._conn.execute("INSERT INTO replays (key, at) VALUES (?, ?)", (key, now))
                return 200, {**record_reply(key, row[0], row[1], row[2]), "replayed": True}, False
        record_id = self.id_prefix + secrets.token_hex(8)
        self._conn.execute(
            "INSERT INTO executions (key, body, at, token) VALUES (?, ?, ?, ?)",
            (key, canonical, now, token if self.faults.check_tokens else None),
        )
        if items:
            self._conn.executemany(
                "INSERT INTO items (item, key, at) VALUES (?, ?, ?)",
                [(json.dumps(item), key, now) for item in items],
            )
        self._conn.execute(
            "INSERT INTO records (key, record_id, body, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET record_id = excluded.record_id,"
            " body = excluded.body, created_at = excluded.created_at",
            (key, record_id, canonical, now),
        )
        return 201, {**record_reply(key, record_id, canonical, now), "replayed": False}, True

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The stored record for ``key`` (None if never executed); the lookup is counted.

        Unfenced: no token is checked or recorded (see :meth:`fenced_lookup`).
        """
        status, reply = self.fenced_lookup(key, None, check=False)
        return reply if status == 200 else None

    def fenced_lookup(
        self, key: str, token: int | None, check: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """Look ``key`` up, checking and recording ``token`` first (with ``check_tokens``).

        The token check, its record and the read are one transaction under the store
        lock, so once a lookup with token T answered "not found", no request with a token
        below T can execute for that key.

        Args:
            key: the idempotency key.
            token: the request's fencing token.
            check: False skips the fencing check (the unfenced :meth:`lookup`).

        Returns:
            ``(http status, reply)``: 200 and the stored record, 404 ``{"error": "not
            found", "key"}``, 409 for a stale token, 400 for a missing one in fenced mode.
        """
        with self._lock:
            now = time.time()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                refused = self._fence(key, token, "lookup", now) if check else None
                if refused is None:
                    row = self._conn.execute(
                        "SELECT record_id, body, created_at FROM records WHERE key = ?", (key,)
                    ).fetchone()
                    self._conn.execute(
                        "INSERT INTO lookups (key, found, at) VALUES (?, ?, ?)",
                        (key, int(row is not None), now),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
        if refused is not None:
            return refused
        if row is None:
            return 404, {"error": "not found", "key": key}
        return 200, record_reply(key, row[0], row[1], row[2])

    def executions(self) -> dict[str, int]:
        """Executions per key."""
        with self._lock:
            rows = self._conn.execute("SELECT key, COUNT(*) FROM executions GROUP BY key")
            return {k: int(n) for k, n in rows}

    def stats(self) -> dict[str, Any]:
        """Counts read from the database (plus the in-memory fault counters): executions,
        keys, duplicate_keys, replays, lookups, lookups_found, stale_tokens_rejected,
        items_applied, injected."""
        with self._lock:
            c = self._conn
            executions = c.execute("SELECT COUNT(*) FROM executions").fetchone()[0]
            keys = c.execute("SELECT COUNT(DISTINCT key) FROM executions").fetchone()[0]
            dups = c.execute(
                "SELECT COUNT(*) FROM (SELECT key FROM executions GROUP BY key HAVING COUNT(*) > 1)"
            ).fetchone()[0]
            replays = c.execute("SELECT COUNT(*) FROM replays").fetchone()[0]
            lookups, found = c.execute(
                "SELECT COUNT(*), COALESCE(SUM(found), 0) FROM lookups"
            ).fetchone()
            stale = c.execute("SELECT COUNT(*) FROM stale_tokens").fetchone()[0]
            applied = c.execute("SELECT COUNT(*) FROM items").fetchone()[0]
            injected = dict(self.injected)
        return {
            "executions": executions,
            "keys": keys,
            "duplicate_keys": dups,
            "replays": replays,
            "lookups": lookups,
            "lookups_found": found,
            "stale_tokens_rejected": stale,
            "items_applied": applied,
            "injected": injected,
        }
