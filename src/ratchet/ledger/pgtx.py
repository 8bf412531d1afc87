"""One ledger transaction on PostgreSQL (:class:`PgTx`): statements kept and sent in as few
round trips as the engine's reads allow, on a pooled connection of the ledger's own, or
inside a caller's open transaction (:meth:`PgTx.joined`: a savepoint, the ledger's
``search_path`` set for its statements and put back after them)."""

from __future__ import annotations

import select
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import psycopg.rows
import psycopg.sql

from .. import faults
from ..errors import WriteRejected
from ..serde import dumps_rows
from .catalogue import load_catalogue
from .clock import ClockFn
from .loopbridge import LoopConnection, LoopCursor
from .pgprepared import Prepared

__all__ = ["NOW_EXPR", "SAVEPOINT", "PgTx"]

SAVEPOINT = "ratchet_join"
"""The savepoint a joined transaction's statements run under (:meth:`PgTx.joined`)."""

Cursor = psycopg.Cursor[tuple[Any, ...]] | LoopCursor

NOW_EXPR = "(" + load_catalogue("postgresql")["now"][0].removeprefix("SELECT ") + ")"
"""The ledger clock as an SQL expression (the catalogue's ``now`` statement): the
transaction's timestamp, the same value in every statement of a transaction."""


BOUND_AGAIN = frozenset({"claim_expired", "claim_gate", "pauses_active", "limits_all",
                         "claim_flow", "claim_fifo", "claim_steps_taken",
                         "claim_effects_taken"})
"""Prepared statements a worker sends with the same arguments claim after claim (its
names, versions, queues, holder, limit): their bound ``EXECUTE`` strings are kept
(:data:`_BOUND`), as binding them (psycopg's ``mogrify`` of arrays) was most of a claim's
Python before its round trip."""

_BOUND: dict[tuple[Any, ...], str] = {}
_BOUND_MAX = 1024  # entries; the cache starts over when full


def _frozen(values: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """``values`` as a hashable key (lists as tuples), or None when a value is neither a
    scalar nor a list of scalars."""
    key: list[Any] = []
    for name in sorted(values):
        value = values[name]
        if isinstance(value, list):
            if not all(v is None or isinstance(v, str | int | float) for v in value):
                return None
            # The element types are part of the key: 1 and 1.0 and True bind differently.
            value = (tuple(value), tuple(type(v) for v in value))
        elif not (value is None or isinstance(value, str | int | float)):
            return None
        key.append((name, value, type(value)))
    return tuple(key)


def _check_alive(conn: psycopg.Connection[Any]) -> None:
    """Close ``conn`` and raise :class:`psycopg.OperationalError` if something waits on it
    before anything was sent: the server does not speak to an idle session of ours (the
    pooled connections LISTEN to nothing) unless it is ending it (a restart, a terminated
    backend), and its last message may come before the end of the stream does. Sent with
    ``COMMIT`` in the same string, a statement failing on such a connection would read as
    a lost ``COMMIT`` (outcome unknown) instead of a transaction that never began (retried
    on another connection; the pool discards this one)."""
    try:
        poller = select.poll()  # no limit on the descriptor's number, as select() has
        poller.register(conn.pgconn.socket, select.POLLIN)
        waiting = poller.poll(0)
    except (OSError, ValueError, AttributeError):
        return  # cannot tell here: the string goes, as any other would
    if waiting:
        conn.close()
        raise psycopg.OperationalError(
            "connection lost before sending: the server spoke to an idle session (ending it)")


class PgTx:
    """A transaction on one pooled connection (see :class:`~ratchet.ledger.dialect.Tx`),
    sent in as few round trips as the engine's reads allow.

    Nothing is sent until a result is needed. Statements whose result the engine does not
    read (:meth:`batch`) are kept and sent in front of the next statement that returns
    rows, or with ``COMMIT``; ``BEGIN`` and the clock read go in front of the first of
    them, and reads that do not depend on each other go together (:meth:`rows_many`). Each
    such group is one simple-protocol query string (parameters bound on the client by
    psycopg, one message, one round trip): a commit of many tasks' writes plus a claim is
    three round trips instead of nine. Not psycopg's pipeline mode: after a
    pipeline, PostgreSQL 15 stops enforcing ``idle_in_transaction_session_timeout`` until
    the next plain statement, and that timeout is what frees the row locks of a frozen
    worker (tests/pg_faults).

    ``now`` is known once the first group has run. A statement sent before that gets the
    clock as SQL (``now()``, the same transaction timestamp), so a submit is one round trip.

    ``prelude``: the statements the first group starts with instead of ``BEGIN`` (a joined
    transaction's savepoint and ``search_path``, :meth:`joined`).

    ``prepared``: the statements prepared on ``conn``
    (:class:`~ratchet.ledger.pgprepared.PreparedStatements`), sent as ``EXECUTE`` in the
    same query strings instead of their text.

    ``conn`` may also be a caller's ``AsyncConnection`` seen from a worker thread
    (:class:`~ratchet.ledger.loopbridge.LoopConnection`, joined transactions only): the
    same statements, each sent on the caller's event loop.
    """

    def __init__(self, conn: psycopg.Connection[Any] | LoopConnection,
                 catalogue: Mapping[str, tuple[str, ...]], clock: ClockFn | None = None,
                 prelude: Sequence[str] = ("BEGIN",),
                 prepared: Mapping[str, Prepared] | None = None) -> None:
        self._prelude = list(prelude)
        self._prepared: Mapping[str, Prepared] = prepared or {}
        self._conn = conn
        self._clock = clock
        # Tuples whatever row factory a caller's joined connection has.
        self._raw: Cursor = conn.cursor(row_factory=psycopg.rows.tuple_row)
        self._binder: psycopg.ClientCursor[Any] | psycopg.AsyncClientCursor[Any] = (
            psycopg.AsyncClientCursor(conn.target) if isinstance(conn, LoopConnection)
            else psycopg.ClientCursor(conn))
        self.catalogue = catalogue
        self._now: float | None = None
        self._deferred: list[str] = []
        self._names: list[str] = []
        self.started = False
        self.statement = "begin"
        self.woken: set[str] = set()
        """The wake-up channels (:meth:`wake`) this transaction's commit notifies."""
        self.commit_sent = False
        """``COMMIT`` went with the last statements (:meth:`rows_last`)."""

    @classmethod
    def joined(cls, conn: psycopg.Connection[Any] | LoopConnection,
               catalogue: Mapping[str, tuple[str, ...]], schema: str,
               clock: ClockFn | None = None) -> PgTx:
        """A transaction inside the caller's open transaction on ``conn``: its statements
        run under :data:`SAVEPOINT` with ``search_path`` set to the ledger's ``schema``
        (``SET LOCAL``). End it with :meth:`release` (the caller's ``search_path`` put
        back; nothing commits until the caller commits) or :meth:`rollback_joined`."""
        ident = psycopg.sql.Identifier(schema).as_string(
            conn.target if isinstance(conn, LoopConnection) else conn)
        # pg_temp named last: else it is searched first, and a caller's temporary table
        # named like a ledger table would take the rows instead of the ledger.
        return cls(conn, catalogue, clock, prelude=(
            f"SAVEPOINT {SAVEPOINT}", f"SET LOCAL search_path TO {ident}, pg_temp"))

    # -- the clock and the raw cursor (migrations, settings) force BEGIN out

    @property
    def now(self) -> float:
        if self._now is None:
            self._send(None)
        assert self._now is not None
        return self._now

    @property
    def conn(self) -> psycopg.Connection[Any]:
        """The connection this transaction runs on (transaction steps' user code)."""
        assert isinstance(self._conn, psycopg.Connection), "a caller's async connection"
        return self._conn

    @property
    def cur(self) -> Cursor:
        """The raw cursor, with BEGIN and every kept statement sent first."""
        if not self.started or self._deferred:
            self._send(None)
        return self._raw

    # -- statements

    def _bind(self, name: str, params: Mapping[str, Any] | None) -> list[str]:
        values = dict(params or {})
        prepared = self._prepared.get(name)
        if prepared is not None:  # EXECUTE of the connection's prepared statement
            execute = prepared.execute
            if prepared.execute_now_sql is not None and "now" not in values:
                if self._now is not None:
                    values["now"] = self._now
                else:
                    execute = prepared.execute_now_sql
            if name not in BOUND_AGAIN or "now" in values:  # a clock never comes again
                return [self._binder.mogrify(execute, values)]
            frozen = _frozen(values)
            if frozen is None:
                return [self._binder.mogrify(execute, values)]
            key = (execute, frozen)
            bound = _BOUND.get(key)
            if bound is None:
                bound = self._binder.mogrify(execute, values)
                if len(_BOUND) >= _BOUND_MAX:
                    _BOUND.clear()
                _BOUND[key] = bound
            return [bound]
        texts = self.catalogue[name]
        if "now" not in values:
            if self._now is not None:
                values["now"] = self._now
            else:
                texts = tuple(t.replace("%(now)s", NOW_EXPR) for t in texts)
        return [self._binder.mogrify(t, values) for t in texts]

    def _send(self, name: str | None, params: Mapping[str, Any] | None = None,
              tail: str | None = None,
              more: Sequence[tuple[str, Mapping[str, Any] | None]] = ()) -> Cursor:
        """Send BEGIN (first time), the kept statements, then ``name`` and ``more`` (or
        ``tail``) as one query string; return the cursor positioned on the result of
        ``name`` (its last statement), followed by those of ``more``."""
        if not self.started and self._clock is not None and name is not None:
            self._send(None)  # an injected clock is not SQL: read it before binding
        parts: list[str] = []
        names = list(self._names)
        if not self.started:
            parts += [*self._prelude, "SELECT " + NOW_EXPR]
        parts += self._deferred
        later: list[str] = []
        if name is not None:
            names.append(name)
            parts += self._bind(name, params)
            for other, other_params in more:
                names.append(other)
                later += self._bind(other, other_params)
        if tail is not None:  # after ``more``: the string's last statement
            names.append(tail)
            later.append(tail)
        self.statement = "+".join(names) or ("begin" if not self.started else self.statement)
        self._deferred, self._names = [], []
        cur = self._raw
        # Never server-prepared: every string differs (its parameters are bound in it).
        cur.execute("; ".join(parts + later).encode("utf-8"), prepare=False)
        skip = len(parts) - 1
        if not self.started:
            self.started = True
            for _ in self._prelude:  # BEGIN (or the savepoint and search_path) -> the clock
                cur.nextset()
            clock = cur.fetchone()
            assert clock is not None
            self._now = float(clock[0])
            if self._clock is not None:
                self._now = self._clock(self._now)
            skip -= len(self._prelude)
        for _ in range(skip):  # to the result of the last part
            cur.nextset()
        return cur

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return self._send(name, params).fetchall()

    def rows_many(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        if not reads:
            return []
        return self._rows_of(reads)

    def _rows_of(self, reads: Sequence[tuple[str, Mapping[str, Any] | None]],
                 tail: str | None = None) -> list[list[tuple[Any, ...]]]:
        """Send ``reads`` (then ``tail``) in one string; each read's rows."""
        (name, params), *more = reads
        # Each catalogue entry here is one statement: one result set per read.
        assert all(len(self.catalogue[n]) == 1 for n, _ in more), "multi-statement read"
        cur = self._send(name, params, more=more, tail=tail)
        results = [cur.fetchall()]
        for _ in more:
            cur.nextset()
            results.append(cur.fetchall())
        return results

    def rows_last(
        self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
    ) -> list[list[tuple[Any, ...]]]:
        """:meth:`rows_many` with ``COMMIT`` at the end of the same string: one round trip
        for a whole transaction. :attr:`commit_sent` is set before it goes (the dialect
        then treats a lost connection as a lost ``COMMIT``), and :meth:`commit` sends
        nothing more."""
        assert not self.woken, "a transaction that wakes someone commits through commit()"
        assert reads, "no statements to end the transaction with"
        faults.point("commit.before_commit")
        if not self.started and isinstance(self._conn, psycopg.Connection):
            _check_alive(self._conn)
        self.commit_sent = True
        return self._rows_of(reads, tail="COMMIT")

    def one(self, name: str, params: Mapping[str, Any] | None = None) -> tuple[Any, ...] | None:
        return self._send(name, params).fetchone()

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        return self._send(name, params).rowcount

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None:
        """All rows as one JSON parameter (``%(rows)s``, read with ``json_to_recordset``),
        kept and sent with the next statement that returns rows or with ``COMMIT``. Text
        the encoding cannot hold (NUL, a lone surrogate) is refused by the server as a
        DataError: WriteRejected."""
        if not rows:
            return
        if not self.started and self._clock is not None:
            self._send(None)  # an injected clock is not SQL: read it before binding
        try:
            encoded = dumps_rows(rows)
        except ValueError as exc:  # NaN / Infinity: no JSON, no column can hold it
            raise WriteRejected(f"refused write {name!r}: {exc}") from exc
        self._deferred += self._bind(name, {"rows": encoded, **scalars})
        self._names.append(name)

    def commit(self, notify: Sequence[str] = ()) -> None:
        """Send what is kept, the NOTIFYs (statements) and COMMIT; nothing if nothing
        began."""
        self._finish(notify, "COMMIT")

    def release(self, notify: Sequence[str], search_path: str) -> None:
        """End a joined transaction (:meth:`joined`): send what is kept, the NOTIFYs
        (delivered when the caller commits), the caller's ``search_path`` back (as it
        read, ``SET LOCAL``) and ``RELEASE SAVEPOINT``."""
        if not self.started and not self._deferred:
            return
        restore = self._binder.mogrify("SELECT set_config('search_path', %s, true)",
                                       (search_path,))
        self._finish([*notify, restore], f"RELEASE SAVEPOINT {SAVEPOINT}")

    def rollback_joined(self) -> None:
        """Undo a joined transaction's statements (the savepoint's: the ``search_path``
        too); the caller's transaction goes on as before it. Nothing if nothing was
        sent."""
        self._deferred, self._names = [], []
        if self.started:
            self._raw.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}; "
                              f"RELEASE SAVEPOINT {SAVEPOINT}", prepare=False)

    def _finish(self, before: Sequence[str], tail: str) -> None:
        if self.commit_sent:  # rows_last sent COMMIT
            assert not self._deferred and not before, "statements after COMMIT"
            return
        if not self.started and not self._deferred:
            return
        for statement in before:
            self._deferred.append(statement)
            self._names.append("notify")
        self._send(None, tail=tail)

    def wake(self, channel: str = "ready") -> None:
        self.woken.add(channel)


