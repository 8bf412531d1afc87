"""One ledger transaction on SQLite (:class:`SQLiteTx`): catalogue statements on one
connection's cursor, list parameters as JSON arrays."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["SQLiteTx"]


def _params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """List parameters become JSON arrays (read by ``json_each`` in the statement)."""
    if not params:
        return {}
    return {k: json.dumps(v) if isinstance(v, list | tuple) else v for k, v in params.items()}


class SQLiteTx:
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

    def rows_last(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        # SQLite has no round trips to save: the dialect commits once the body returns.
        return self.rows_many(reads)

    def one(self, name: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._run(name, params).fetchone()
        return row

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return self._run(name, params).rowcount

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None:
        if not rows:
            return
        self.statement = name
        shared = {"now": self.now, **scalars}
        args = [{**shared, **row} for row in rows]
        for sql in self.catalogue[name]:  # a multi-statement entry: each over every row
            self.cur.executemany(sql, args)

    def wake(self, channel: str = "ready") -> None:
        """SQLite has no server to notify; workers and relays poll."""


