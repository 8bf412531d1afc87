"""Reading a counting service's own SQLite file from outside its process (safe while it
runs: WAL mode): the executions, record ids, stored records and fencing refusals a test
counts at the *external* side."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .protocol import ServiceError

__all__ = ["ServiceRecords", "TokenRejection", "read_records", "read_stored", "record_reply"]


def record_reply(key: str, record_id: str, body: str, created_at: float) -> dict[str, Any]:
    """The JSON shape of one stored record: ``{"id", "key", "body", "created_at"}``
    (``body`` is the canonical JSON text decoded; ``created_at`` epoch seconds)."""
    return {"id": record_id, "key": key, "body": json.loads(body), "created_at": created_at}



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
        items: how often each item was applied: every execution applies the items of its
            request body's ``items`` list (strings and integers), so an item applied
            twice shows 2 here even when the two requests had different keys.
    """

    executions: dict[str, int]
    ids: dict[str, str]
    times: list[tuple[float, str]]
    rejections: list[TokenRejection] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)
    execution_tokens: list[int | None] = field(default_factory=list)
    items: dict[str | int, int] = field(default_factory=dict)


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
        items: dict[str | int, int] = {}
        try:
            for text, n in conn.execute("SELECT item, COUNT(*) FROM items GROUP BY item"):
                items[json.loads(text)] = int(n)
        except sqlite3.OperationalError:  # a file written before items existed
            pass
    finally:
        conn.close()
    executions: dict[str, int] = {}
    for _, key in times:
        executions[key] = executions.get(key, 0) + 1
    return ServiceRecords(executions, ids, times, rejections, tokens, execution_tokens, items)


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
            str(k): record_reply(str(k), str(i), str(b), float(c))
            for k, i, b, c in conn.execute(
                "SELECT key, record_id, body, created_at FROM records"
            )
        }
    finally:
        conn.close()
