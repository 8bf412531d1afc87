"""A counting external service: its own process, real HTTP on loopback, its own SQLite file.

It stands for a system outside Ratchet's trust boundary (DESIGN §2, §5) — a payment API,
a mailer — and keeps its own record of every execution, so a test can count at the
*external* side whether each effect happened exactly once. Nothing Ratchet records
locally can prove that.

Run it as::

    python -m ratchet.testing.services --port 0 --db service.db \\
        [--no-honour-keys] [--check-tokens] [--reply-lost P] [--burst-503 P] [--slow P] \\
        [--slow-s S] [--seed N]

When it listens it prints exactly one line, ``READY <port>``, on stdout.

HTTP API (JSON bodies):

* ``POST /effects`` with header ``Idempotency-Key: K`` and a JSON object body.
  Honouring keys (the default, like Stripe): a key already executed returns ``200`` with
  the stored record and ``"replayed": true`` and executes nothing (a row goes into
  ``replays``); the same key with another body returns ``422``. Otherwise the request
  executes — one SQLite transaction inserts into ``executions`` and upserts ``records`` —
  and ``201 {"id", "key", "body", "created_at", "replayed": false}`` is returned. With
  ``--no-honour-keys`` every POST executes (a legacy API that records keys but does not
  enforce them). A missing key or a body that is not a JSON object returns ``400``.
* ``GET /effects/{key}`` — ``200`` with the stored record, or ``404 {"error": "not found"}``.
* ``GET /executions`` — ``{key: number of executions}``.
* ``GET /stats`` — ``{"executions", "keys", "duplicate_keys", "replays", "lookups",
  "lookups_found", "stale_tokens_rejected", "injected": {...}}``.

Fenced mode (``--check-tokens``; Kleppmann's fencing token checked at the storage side):
``POST /effects`` and ``GET /effects/{key}`` must carry a header ``Fencing-Token: T`` (a
decimal integer >= 0; missing or malformed: ``400``). The service keeps, per key, the
highest token it has seen, from executions *and* lookups alike. A request whose token is
lower than that is refused with ``409 {"error": "stale fencing token", "key", "token",
"highest"}``, executes (or answers) nothing, and is recorded in the ``stale_tokens``
table. Otherwise its token becomes the key's highest and the request proceeds as usual
(dedupe by key with honour_keys, or execute). Check, record and execution are one SQLite
transaction under the store lock, and a POST is checked when it executes (after any
processing delay). So once a lookup with token T has answered "not found", no request
with a lower token can execute for that key: a frozen holder's late request is refused.
Without ``--check-tokens`` the header is ignored.
* ``GET /admin/faults`` / ``POST /admin/faults`` — read or change :class:`FaultSettings`.

Fault injection (probabilities in ``[0, 1]``, drawn from one seeded RNG):

* ``reply_lost`` — the request executes and commits, then the connection is shut down
  without a response (the client sees a dropped reply: an unknown outcome);
* ``burst_503`` — a request starts a burst with this probability: it and the next
  ``burst_len - 1`` requests to ``/effects`` get ``503`` with ``Retry-After: 0.2`` and
  execute nothing;
* ``slow`` — sleep ``slow_s`` seconds *before* executing and replying, so a client with a
  shorter read timeout gives up while the execution is still to come;
* ``latency_s`` — not a fault: every POST takes ``uniform(0.5, 1.5) * latency_s`` seconds
  before executing, like a real API (default 0);
* deterministic counterparts for tests: ``reply_lost_next`` (drop the reply of the next N
  executing requests), ``fail_next_503`` (the next N requests to ``/effects`` — POST or
  GET — get 503), ``slow_next`` (the next N POSTs are slow).

Python side: :func:`start_counting_service` (spawn, wait for ``READY``; returns a
:class:`CountingService` that reads the service's own file), :class:`CountingClient`
(httpx; errors are raised unchanged, so Ratchet's classifier sees them, except a 409
stale-token reply, raised as ``ratchet.TokenRejected``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import random
import secrets
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any, cast
from urllib.parse import quote, unquote, urlsplit

import httpx

from ..errors import RatchetError, TokenRejected
from ..worker.context import NOT_FOUND, NotFound

__all__ = [
    "RETRY_AFTER_S",
    "CountingClient",
    "CountingService",
    "CountingStore",
    "FaultSettings",
    "ServiceError",
    "ServiceRecords",
    "TokenRejected",
    "TokenRejection",
    "main",
    "read_records",
    "read_stored",
    "start_counting_service",
]

RETRY_AFTER_S = 0.2
"""``Retry-After`` sent with every injected 503, in seconds."""

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
CREATE TABLE IF NOT EXISTS stale_tokens (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    key     TEXT NOT NULL,
    token   INTEGER NOT NULL,
    highest INTEGER NOT NULL,
    op      TEXT NOT NULL,
    at      REAL NOT NULL
);
"""

TOKEN_HEADER = "Fencing-Token"
"""The request header that carries a fencing token (a decimal integer >= 0)."""

STALE_TOKEN_ERROR = "stale fencing token"
"""The ``error`` of a 409 reply to a request whose fencing token is stale."""


class ServiceError(RatchetError):
    """The counting service could not be started, did not become ready, or its file is
    missing."""


# ---------------------------------------------------------------------------- faults


@dataclass
class FaultSettings:
    """Fault-injection settings of a running service (all changeable at runtime).

    Attributes:
        honour_keys: deduplicate on ``Idempotency-Key`` (False: every POST executes).
        check_tokens: fenced mode: every ``/effects`` request must carry a
            ``Fencing-Token``; one lower than the highest token seen for its key (by an
            execution or a lookup) is refused with 409 and executes nothing (False: the
            header is ignored).
        reply_lost: probability that an executed request's reply is dropped, in [0, 1].
        burst_503: probability that a request to ``/effects`` starts a 503 burst, in [0, 1].
        burst_len: requests answered 503 per burst (the starting one included).
        slow: probability that a POST sleeps ``slow_s`` before executing, in [0, 1].
        slow_s: the sleep of a slow request, seconds.
        latency_s: mean processing time of every POST before it executes, seconds
            (drawn uniformly from ``[0.5, 1.5] * latency_s``; 0 for none).
        reply_lost_next: drop the replies of the next N executing requests.
        fail_next_503: answer the next N requests to ``/effects`` with 503.
        slow_next: make the next N POSTs slow.
    """

    honour_keys: bool = True
    check_tokens: bool = False
    reply_lost: float = 0.0
    burst_503: float = 0.0
    burst_len: int = 5
    slow: float = 0.0
    slow_s: float = 2.0
    latency_s: float = 0.0
    reply_lost_next: int = 0
    fail_next_503: int = 0
    slow_next: int = 0

    def update(self, changes: dict[str, Any]) -> None:
        """Apply ``changes`` (field name → value), validating every value first.

        Raises:
            ValueError: an unknown field or a value out of range; nothing is changed (the
                HTTP layer answers 400 with the message).
        """
        known = {f.name for f in fields(self)}
        staged: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in known:
                raise ValueError(f"unknown fault setting {name!r}; known: {sorted(known)}")
            staged[name] = _validated(name, value)
        for name, value in staged.items():
            setattr(self, name, value)


def _validated(name: str, value: Any) -> Any:
    if name in ("honour_keys", "check_tokens"):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false")
        return value
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if name in ("reply_lost", "burst_503", "slow"):
        if not number or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")
        return float(value)
    if name in ("slow_s", "latency_s"):
        if not number or not (float(value) >= 0.0 and math.isfinite(float(value))):
            raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if name == "burst_len" and value < 1:
        raise ValueError("burst_len must be >= 1")
    return value


# ---------------------------------------------------------------------------- store


def _record(key: str, record_id: str, body: str, created_at: float) -> dict[str, Any]:
    return {"id": record_id, "key": key, "body": json.loads(body), "created_at": created_at}


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
            ``(http status, reply, executed)``: 201 and executed=True for a new execution,
            200 for a replay, 422 for a key reused with another body, 409 for a stale
            fencing token (``{"error", "key", "token", "highest"}``), 400 for a missing
            token in fenced mode. The token check, its record and the execution are one
            transaction under the store lock.
        """
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        with self._lock:
            now = time.time()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                answer = self._execute(key, canonical, token, now)
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                raise
            return answer

    def _execute(
        self, key: str, canonical: str, token: int | None, now: float
    ) -> tuple[int, dict[str, Any], bool]:
        """:meth:`execute` inside its transaction (lock held)."""
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
                return 200, {**_record(key, row[0], row[1], row[2]), "replayed": True}, False
        record_id = self.id_prefix + secrets.token_hex(8)
        self._conn.execute(
            "INSERT INTO executions (key, body, at, token) VALUES (?, ?, ?, ?)",
            (key, canonical, now, token if self.faults.check_tokens else None),
        )
        self._conn.execute(
            "INSERT INTO records (key, record_id, body, created_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET record_id = excluded.record_id,"
            " body = excluded.body, created_at = excluded.created_at",
            (key, record_id, canonical, now),
        )
        return 201, {**_record(key, record_id, canonical, now), "replayed": False}, True

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
        return 200, _record(key, row[0], row[1], row[2])

    def executions(self) -> dict[str, int]:
        """Executions per key."""
        with self._lock:
            rows = self._conn.execute("SELECT key, COUNT(*) FROM executions GROUP BY key")
            return {k: int(n) for k, n in rows}

    def stats(self) -> dict[str, Any]:
        """Counts read from the database (plus the in-memory fault counters): executions,
        keys, duplicate_keys, replays, lookups, lookups_found, stale_tokens_rejected,
        injected."""
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
            injected = dict(self.injected)
        return {
            "executions": executions,
            "keys": keys,
            "duplicate_keys": dups,
            "replays": replays,
            "lookups": lookups,
            "lookups_found": found,
            "stale_tokens_rejected": stale,
            "injected": injected,
        }


# ---------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], store: CountingStore) -> None:
        super().__init__(address, _Handler)
        self.store = store

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout) or a connection we dropped on purpose is normal.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "RatchetCountingService/1.0"

    @property
    def store(self) -> CountingStore:
        return cast(_Server, self.server).store

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging (the caller's console is not ours)."""

    def _send(
        self, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _drop(self) -> None:
        """Close the connection without sending anything: the reply is lost."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        return json.loads(raw) if raw else None

    def _path(self) -> str:
        return urlsplit(self.path).path

    def _token(self) -> tuple[bool, int | None]:
        """The request's ``Fencing-Token`` (None if absent). A malformed one is answered
        400 here and ``(False, None)`` returned."""
        raw = self.headers.get(TOKEN_HEADER)
        if raw is None:
            return True, None
        text = raw.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 19:
            self._send(400, {"error": f"{TOKEN_HEADER} must be an integer >= 0, got {raw!r}"})
            return False, None
        return True, int(text)

    def _overloaded(self) -> None:
        self._send(503, {"error": "overloaded, retry later"}, {"Retry-After": str(RETRY_AFTER_S)})

    def do_POST(self) -> None:
        path = self._path()
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError):
            self._send(400, {"error": "body is not valid JSON"})
            return
        if path == "/effects":
            self._post_effect(body)
        elif path == "/admin/faults":
            if not isinstance(body, dict):
                self._send(400, {"error": "expected a JSON object of fault settings"})
                return
            try:
                self._send(200, self.store.set_faults(body))
            except ValueError as exc:
                self._send(400, {"error": str(exc)})
        else:
            self._send(404, {"error": "no such route", "path": path})

    def do_GET(self) -> None:
        path = self._path()
        if path.startswith("/effects/"):
            key = unquote(path[len("/effects/") :])
            ok, token = self._token()
            if not ok:
                return
            if self.store.gate_503():
                self._overloaded()
                return
            self._send(*self.store.fenced_lookup(key, token))
        elif path == "/executions":
            self._send(200, self.store.executions())
        elif path == "/stats":
            self._send(200, self.store.stats())
        elif path == "/admin/faults":
            self._send(200, self.store.get_faults())
        else:
            self._send(404, {"error": "no such route", "path": path})

    def _post_effect(self, body: Any) -> None:
        key = self.headers.get("Idempotency-Key")
        if not key:
            self._send(400, {"error": "missing Idempotency-Key header"})
            return
        if not isinstance(body, dict):
            self._send(400, {"error": "expected a JSON object body"})
            return
        ok, token = self._token()
        if not ok:
            return
        if self.store.gate_503():
            self._overloaded()
            return
        delay = self.store.delay_s()
        if delay > 0:
            time.sleep(delay)
        # The token is checked when the request executes (after its processing delay), as
        # a storage-side fence does: a request that waited past a newer holder is refused.
        status, reply, executed = self.store.execute(key, body, token)
        if executed and self.store.drop_reply():
            self._drop()
            return
        self._send(status, reply)


# ---------------------------------------------------------------------------- process entry


def _parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Counting external service with fault injection (prints 'READY <port>').",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    p.add_argument("--db", required=True, help="the service's own SQLite file")
    p.add_argument(
        "--no-honour-keys",
        action="store_true",
        help="execute every POST even when its Idempotency-Key was seen (legacy API)",
    )
    p.add_argument(
        "--check-tokens",
        action="store_true",
        help=f"fenced mode: require a {TOKEN_HEADER} header on /effects requests and refuse "
        "(409) one lower than the highest token seen for its key",
    )
    p.add_argument("--reply-lost", type=float, default=0.0, metavar="P",
                   help="probability that an executed request's reply is dropped")
    p.add_argument("--burst-503", type=float, default=0.0, metavar="P",
                   help="probability that a request starts a burst of 503s")
    p.add_argument("--burst-len", type=int, default=5, metavar="N",
                   help="requests answered 503 per burst (default 5)")
    p.add_argument("--slow", type=float, default=0.0, metavar="P",
                   help="probability that a request sleeps --slow-s before executing")
    p.add_argument("--slow-s", type=float, default=2.0, metavar="S",
                   help="sleep of a slow request, seconds (default 2.0)")
    p.add_argument("--latency-s", type=float, default=0.0, metavar="S",
                   help="mean processing time of every request, seconds (default 0)")
    p.add_argument("--id-prefix", default="ex_", help="prefix of record ids (default ex_)")
    p.add_argument("--seed", type=int, default=None, help="seed of the fault RNG")
    p.add_argument("--exit-on-stdin-eof", action="store_true",
                   help="stop when stdin closes (the parent that started us is gone)")
    return p.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None, prog: str = "python -m ratchet.testing.services") -> int:
    """Run the service until SIGTERM/SIGINT (or stdin EOF with ``--exit-on-stdin-eof``).

    Returns:
        The process exit status (0 on a clean stop, 2 on bad arguments).
    """
    args = _parse_args(argv, prog)
    faults = FaultSettings()
    try:
        faults.update(
            {
                "honour_keys": not args.no_honour_keys,
                "check_tokens": args.check_tokens,
                "reply_lost": args.reply_lost,
                "burst_503": args.burst_503,
                "burst_len": args.burst_len,
                "slow": args.slow,
                "slow_s": args.slow_s,
                "latency_s": args.latency_s,
            }
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = CountingStore(args.db, faults, args.seed, args.id_prefix)
    server = _Server((args.host, args.port), store)
    stopping = threading.Event()

    def stop() -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watcher: threading.Thread | None = None
    if args.exit_on_stdin_eof:

        def watch_stdin() -> None:
            fd = sys.stdin.fileno()
            with contextlib.suppress(OSError, ValueError):
                while not stopping.is_set():
                    readable, _, _ = select.select([fd], [], [], 0.2)
                    if readable and not os.read(fd, 4096):
                        break
            stop()

        watcher = threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True)
        watcher.start()
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stopping.set()
        if watcher is not None:
            watcher.join(timeout=1.0)
        server.server_close()
        store.close()
    return 0


# ---------------------------------------------------------------------------- reading the file


@dataclass(frozen=True, slots=True)
class TokenRejection:
    """One request the fenced service refused for a stale fencing token.

    Attributes:
        at: wall-clock time of the refusal, epoch seconds.
        key: the idempotency key.
        token: the request's token.
        highest: the highest token seen for ``key`` then (> ``token``).
        op: ``"execute"`` (a POST) or ``"lookup"`` (a GET).
    """

    at: float
    key: str
    token: int
    highest: int
    op: str


@dataclass(frozen=True, slots=True)
class ServiceRecords:
    """What the service's own file says happened (the external truth of a test).

    Attributes:
        executions: executions per key (keys never executed are absent).
        ids: the stored record id per key (the latest execution's).
        times: ``(wall-clock time, key)`` of every execution, in order, epoch seconds.
        rejections: requests refused for a stale fencing token, in order (fenced mode).
        tokens: the highest fencing token accepted per key (fenced mode).
        execution_tokens: the fencing token of every execution, in the order of ``times``
            (None for an execution outside fenced mode).
    """

    executions: dict[str, int]
    ids: dict[str, str]
    times: list[tuple[float, str]]
    rejections: list[TokenRejection] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    execution_tokens: list[int | None] = field(default_factory=list)


def read_records(db_path: str | Path) -> ServiceRecords:
    """Read a counting service's SQLite file (safe while the service runs: WAL mode).

    Raises:
        ServiceError: there is no such file.
    """
    path = Path(db_path)
    if not path.exists():
        raise ServiceError(f"counting service database {str(path)!r} does not exist")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(executions)")}
        token_col = "token" if "token" in columns else "NULL"
        rows = conn.execute(f"SELECT key, at, {token_col} FROM executions ORDER BY id").fetchall()
        times = [(float(at), str(k)) for k, at, _ in rows]
        execution_tokens = [None if t is None else int(t) for _, _, t in rows]
        ids = {str(k): str(i) for k, i in conn.execute("SELECT key, record_id FROM records")}
        try:
            rejections = [
                TokenRejection(float(at), str(k), int(t), int(h), str(op))
                for at, k, t, h, op in conn.execute(
                    "SELECT at, key, token, highest, op FROM stale_tokens ORDER BY id"
                )
            ]
            tokens = {str(k): int(h) for k, h in conn.execute("SELECT key, highest FROM tokens")}
        except sqlite3.OperationalError:  # a file written before fenced mode existed
            rejections, tokens = [], {}
    finally:
        conn.close()
    executions: dict[str, int] = {}
    for _, key in times:
        executions[key] = executions.get(key, 0) + 1
    return ServiceRecords(executions, ids, times, rejections, tokens, execution_tokens)


def read_stored(db_path: str | Path) -> dict[str, dict[str, Any]]:
    """The stored record per key (``{"id", "key", "body", "created_at"}``, the latest
    execution's), read from a counting service's SQLite file.

    Raises:
        ServiceError: there is no such file.
    """
    if not Path(db_path).exists():
        raise ServiceError(f"counting service database {str(db_path)!r} does not exist")
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30.0)
    try:
        return {
            str(k): _record(str(k), str(i), str(b), float(c))
            for k, i, b, c in conn.execute(
                "SELECT key, record_id, body, created_at FROM records"
            )
        }
    finally:
        conn.close()


# ---------------------------------------------------------------------------- handles


class CountingService:
    """A running counting service process (see :func:`start_counting_service`).

    Attributes:
        port: the TCP port it listens on (loopback).
        db_path: its SQLite file.
        log_path: where its stderr goes.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, db_path: Path, log_path: Path
    ) -> None:
        self._proc = proc
        self.port = port
        self.db_path = db_path
        self.log_path = log_path

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The service's process id."""
        return self._proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc.poll() is None

    def client(self, timeout_s: float = 1.0) -> CountingClient:
        """A new client of this service (close it, or use it as a context manager)."""
        return CountingClient(self.url, timeout_s=timeout_s)

    def records(self) -> ServiceRecords:
        """Executions, record ids and execution times, from the service's own file."""
        return read_records(self.db_path)

    def executions(self) -> dict[str, int]:
        """Executions per key, from the service's own file."""
        return read_records(self.db_path).executions

    def rejections(self) -> list[TokenRejection]:
        """Requests refused for a stale fencing token, in order, from the service's own file."""
        return read_records(self.db_path).rejections

    def stored(self) -> dict[str, dict[str, Any]]:
        """The stored record per key (``{"id", "key", "body", "created_at"}``)."""
        return read_stored(self.db_path)

    def log(self) -> str:
        """The service's stderr so far."""
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Stop the service: SIGTERM, wait up to ``timeout_s`` seconds, then SIGKILL.

        Returns:
            The exit status (negative: killed by that signal), or None if it cannot be reaped.
        """
        proc = self._proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout_s)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return proc.poll()

    def __enter__(self) -> CountingService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self.pid} url={self.url} db={str(self.db_path)!r}>"


def start_counting_service(
    db_path: str | Path,
    *,
    honour_keys: bool = True,
    check_tokens: bool = False,
    reply_lost: float = 0.0,
    burst_503: float = 0.0,
    burst_len: int = 5,
    slow: float = 0.0,
    slow_s: float = 2.0,
    latency_s: float = 0.0,
    seed: int | None = None,
    port: int = 0,
    id_prefix: str = "ex_",
    ready_timeout_s: float = 30.0,
    log_path: str | Path | None = None,
    module: str = "ratchet.testing.services",
) -> CountingService:
    """Spawn the service (``python -m <module>``) and wait until it prints ``READY <port>``.

    The child stops by itself when this process goes away (its stdin is a pipe from us).

    Args:
        db_path: the service's own SQLite file.
        honour_keys: deduplicate on ``Idempotency-Key`` (False: legacy, every POST executes).
        check_tokens: fenced mode (``--check-tokens``): refuse a stale ``Fencing-Token``.
        reply_lost, burst_503, slow: fault probabilities in [0, 1].
        burst_len: 503 answers per burst.
        slow_s: sleep of a slow request, seconds.
        latency_s: mean processing time of every request, seconds.
        seed: fault RNG seed (None: random).
        port: TCP port (0: a free one).
        id_prefix: prefix of record ids.
        ready_timeout_s: how long to wait for ``READY``, seconds.
        log_path: file for the service's stderr (default ``<db_path>.log``).
        module: the module to run (one whose ``main`` accepts these options).

    Returns:
        The running :class:`CountingService`.

    Raises:
        ServiceError: it exited or did not print ``READY`` in time (it is killed).
    """
    db = Path(db_path).resolve()
    log = Path(log_path) if log_path is not None else db.with_name(db.name + ".log")
    cmd = [
        sys.executable, "-m", module, "--port", str(port), "--db", str(db),
        "--reply-lost", repr(float(reply_lost)), "--burst-503", repr(float(burst_503)),
        "--burst-len", str(burst_len), "--slow", repr(float(slow)),
        "--slow-s", repr(float(slow_s)), "--latency-s", repr(float(latency_s)),
        "--id-prefix", id_prefix, "--exit-on-stdin-eof",
    ]  # fmt: skip
    if not honour_keys:
        cmd.append("--no-honour-keys")
    if check_tokens:
        cmd.append("--check-tokens")
    if seed is not None:
        cmd += ["--seed", str(seed)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, env=env
        )
    lines: queue.Queue[bytes] = queue.Queue()
    stdout = cast(IO[bytes], proc.stdout)
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=ready_timeout_s)
    except queue.Empty:
        line = b""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("READY "):
        proc.kill()
        proc.wait()
        tail = log.read_text("utf-8", "replace")[-2000:] if log.exists() else ""
        raise ServiceError(
            f"counting service did not become ready within {ready_timeout_s} s "
            f"(first line {text!r}, exit status {proc.poll()}); its stderr ({log}):\n{tail}"
        )
    return CountingService(proc, int(text.split()[1]), db, log)


def _raise_if_stale(r: httpx.Response, key: str, token: int | None) -> None:
    """Raise ``TokenRejected`` for a 409 stale-token reply (any other reply: nothing)."""
    if r.status_code != 409:
        return
    try:
        body = r.json()
    except ValueError:
        return
    if isinstance(body, dict) and body.get("error") == STALE_TOKEN_ERROR:
        highest = body.get("highest")
        raise TokenRejected(
            str(body.get("key", key)),
            int(body.get("token", token if token is not None else -1)),
            highest if isinstance(highest, int) else None,
        )


class CountingClient:
    """An httpx client of the counting service. Thread-safe (one pooled ``httpx.Client``).

    Errors are raised unchanged so Ratchet's classifier sees them: ``HTTPStatusError`` 503
    is overload, 4xx permanent; ``ReadTimeout`` / ``RemoteProtocolError`` (dropped reply)
    are unknown outcomes; connect errors are transient.

    Args:
        base_url: e.g. ``http://127.0.0.1:54321``.
        timeout_s: read/write/pool timeout per request, seconds.
        connect_timeout_s: TCP connect timeout, seconds.
    """

    def __init__(
        self, base_url: str, timeout_s: float = 1.0, connect_timeout_s: float = 2.0
    ) -> None:
        self.base_url = base_url
        self._http = httpx.Client(
            base_url=base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    def execute(
        self, key: str, body: dict[str, Any], token: int | None = None
    ) -> dict[str, Any]:
        """``POST /effects`` with ``Idempotency-Key: key``: the effect.

        Args:
            key: the idempotency key.
            body: the request (a JSON object).
            token: fencing token sent as ``Fencing-Token`` (with ``ctx.effect(...,
                fenced=True)`` the call gets it: ``lambda k, t: client.execute(k, body, t)``).
                None sends no header.

        Returns:
            The record: ``{"id", "key", "body", "created_at", "replayed"}``.

        Raises:
            ratchet.TokenRejected: the service (fenced mode) refused ``token`` as stale;
                nothing executed.
            httpx.HTTPStatusError: other 4xx/5xx (503 carries ``Retry-After``).
            httpx.TransportError: timeouts, dropped replies, refused connections.
        """
        headers = {"Idempotency-Key": key}
        if token is not None:
            headers[TOKEN_HEADER] = str(token)
        r = self._http.post("/effects", json=body, headers=headers)
        _raise_if_stale(r, key, token)
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def lookup(self, key: str, token: int | None = None) -> dict[str, Any] | NotFound:
        """``GET /effects/{key}``: the stored record, or ``ratchet.NOT_FOUND`` when the
        service confirms the key never executed (pass it as ``ctx.effect(lookup=...)``;
        with ``fenced=True`` it is called as ``lookup(key, token)``).

        Args:
            key: the idempotency key.
            token: fencing token sent as ``Fencing-Token``; a fenced service records it as
                seen before answering, so no request with a lower token executes after.

        Raises:
            ratchet.TokenRejected: the service (fenced mode) refused ``token`` as stale.
            httpx.HTTPStatusError: any other error status (the lookup is inconclusive).
            httpx.TransportError: the service could not answer.
        """
        headers = {TOKEN_HEADER: str(token)} if token is not None else None
        r = self._http.get(f"/effects/{quote(key, safe='')}", headers=headers)
        _raise_if_stale(r, key, token)
        if r.status_code == 404:
            try:
                body = r.json()
            except ValueError:
                body = None
            if isinstance(body, dict) and body.get("error") == "not found":
                return NOT_FOUND
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def executions(self) -> dict[str, int]:
        """``GET /executions``: executions per key."""
        r = self._http.get("/executions")
        r.raise_for_status()
        return {str(k): int(v) for k, v in r.json().items()}

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: executions, keys, duplicate_keys, replays, lookups, lookups_found,
        stale_tokens_rejected, injected (fault counts)."""
        r = self._http.get("/stats")
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """``POST /admin/faults``: change fault settings; returns all of them.

        Keyword args are :class:`FaultSettings` fields, e.g. ``reply_lost_next=1``.

        Raises:
            httpx.HTTPStatusError: 400 for an unknown setting or a value out of range.
        """
        r = self._http.post("/admin/faults", json=changes)
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> CountingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


if __name__ == "__main__":
    raise SystemExit(main())
