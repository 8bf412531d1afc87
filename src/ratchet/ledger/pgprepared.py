"""Server-side prepared statements for the PostgreSQL ledger's hot path.

Every statement of a ledger transaction is sent as text, several in one simple-protocol
query string (:class:`~ratchet.ledger.pgtx.PgTx`), so the server parses, analyses and plans
each one every time. For the statements of a claim, a commit and a submit that is most of
the server's own work for a small batch: ``bench/README.md`` (profile of the hot path) found
0.7 ms of planning per commit-and-claim transaction, against ~0.3 ms of fsync.

This module prepares those statements once per pooled connection (``PREPARE
ratchet_<name> AS ...``, outside any transaction) and lets the transaction send ``EXECUTE
ratchet_<name>(...)`` in their place, still grouped in one query string per round trip.
Each argument carries the type the server inferred for its parameter (read back from
``pg_prepared_statements``), so a value psycopg binds with a narrower type (a list of small
integers as ``int2[]``) is cast as the text statement would have cast it.

The connection runs them on their generic plan, planned once (:data:`GENERIC_PLANS`). Left
to itself (``plan_cache_mode = auto``), PostgreSQL plans each execution afresh while the
custom plans look cheaper than the generic one, which on a tasks table without statistics
they do, a sequential scan of a table it thinks small: the expired-lease read was then
planned on every claim (1.5 ms of planning for 0.05 ms of work). ``tests/test_ledger_plans.py``
checks that the generic plans of the claims use their indexes as the text plans do. A table
change (a migration run by another process) makes the server re-plan on next use; a change
of a statement's result columns fails that use, and :meth:`PreparedStatements.forget`
starts the connection over.

Limits: not for a connection pooler in transaction mode (PgBouncer before 1.21 keeps no
prepared statement across transactions): the URL option ``prepared=off`` turns this off.
Statements joined to a caller's transaction (``PgTx.joined``) are always sent as text: the
caller's connection is not the ledger's to prepare on.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["GENERIC_PLANS", "GENERIC_PLANS_LOCAL", "HOT_STATEMENTS", "Prepared",
           "PreparedStatements", "prepare_text"]

log = logging.getLogger("ratchet.ledger.pgprepared")

GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
"""Sent with the ``PREPARE`` statements (session-wide, on the ledger's own pooled
connections): the prepared statements always run their generic plan. The ledger's other
statements are text with their values bound in, planned each time whatever this says."""

GENERIC_PLANS_LOCAL = "SET LOCAL plan_cache_mode = force_generic_plan"
"""The same for the rest of a transaction whose user code ran with the server's default
(``PostgresDialect.user_connection``)."""

HOT_STATEMENTS = (
    # a claim (ops/claims.py): its reads, its walk, what it writes
    "claim_expired", "claim_gate", "pauses_active", "limits_all", "claim_flow",
    "claim_fifo", "claim_ready", "claim_steps", "claim_effects", "wake_due",
    "key_refill_take", "claim_steps_taken", "claim_effects_taken",
    # a commit (ops/commit.py)
    "fence_read", "transition", "steps_upsert", "effects_intent", "effects_outcome",
    "audit_insert", "renew", "renew_held",
    # a submit (ops/submit.py)
    "submit_insert", "submit_queues", "submit_existing",
)
"""The catalogue statements prepared on every pooled connection: those of the drain and
submit paths (each one statement). Others are rare enough to be sent as text."""

_PARAM = re.compile(r"%\((\w+)\)s")
_PREFIX = "ratchet_"


@dataclass(frozen=True)
class Prepared:
    """How to send one prepared statement.

    Attributes:
        name: the server-side name (``ratchet_<catalogue name>``).
        prepare: the ``PREPARE`` statement (the catalogue text, ``%(p)s`` as ``$n``).
        params: the catalogue parameter names, in ``$n`` order.
        execute: ``EXECUTE name(%(p)s::type, ...)``, for psycopg's client-side binding.
        execute_now_sql: the same with the ``now`` argument as the server's clock (for a
            statement sent before the transaction's clock is known), or None when the
            statement takes no ``now``.
    """

    name: str
    prepare: str
    params: tuple[str, ...]
    execute: str
    execute_now_sql: str | None


def prepare_text(name: str, text: str) -> tuple[str, tuple[str, ...]]:
    """``(PREPARE statement, parameter names in $n order)`` of the catalogue statement
    ``text`` (its ``%(p)s`` placeholders numbered in order of first use), prepared as
    ``ratchet_<name>``."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        param = match.group(1)
        if param not in order:
            order.append(param)
        return f"${order.index(param) + 1}"

    body = _PARAM.sub(number, text.replace("%%", "%"))
    return f"PREPARE {_PREFIX}{name} AS {body}", tuple(order)


class PreparedStatements:
    """The prepared hot statements of one PostgreSQL ledger, per pooled connection.

    Args:
        catalogue: the dialect's statements (``{name: (sql, ...)}``).
        now_sql: the ledger clock as an SQL expression (``pgtx.NOW_EXPR``).
        names: the statements to prepare (default :data:`HOT_STATEMENTS`).

    Thread-safe: connections are prepared by whichever thread first runs a transaction on
    them; the pool hands a connection to one thread at a time.
    """

    def __init__(self, catalogue: Mapping[str, tuple[str, ...]], now_sql: str,
                 names: Collection[str] = HOT_STATEMENTS) -> None:
        self._now_sql = now_sql
        self._types_sql = catalogue["prepared_types"][0]
        self._texts = {n: prepare_text(n, catalogue[n][0]) for n in names
                       if n in catalogue and len(catalogue[n]) == 1}
        self._enabled = False
        self._lock = threading.Lock()
        self._statements: dict[str, Prepared] | None = None  # same on every connection
        self._done: weakref.WeakKeyDictionary[psycopg.Connection[Any], Mapping[str, Prepared]]
        self._done = weakref.WeakKeyDictionary()
        self._stale: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        self._warned = False

    def enable(self) -> None:
        """Start preparing (called once the ledger's schema is current: the statements name
        its tables)."""
        self._enabled = True

    def forget(self, conn: psycopg.Connection[Any]) -> None:
        """Prepare ``conn``'s statements again, and every other pooled connection's, after
        ``DEALLOCATE ALL``, at their next :meth:`on`: a use failed because the server's
        view of a statement changed (its result columns, after a migration by another
        process) or it was deallocated. Safe from any thread: nothing is sent here."""
        with self._lock:
            # Every connection: a migration changed the statements for all of them, and
            # the retry may come on any.
            for known in list(self._done):
                self._stale.add(known)
            self._done.clear()
            self._stale.add(conn)
            self._statements = None  # the parameter types are read again too

    def on(self, conn: psycopg.Connection[Any]) -> Mapping[str, Prepared]:
        """The statements prepared on ``conn`` (preparing them first if need be, one round
        trip, outside any transaction), or an empty mapping (not enabled, or the server
        refused: the transaction sends text, as without this module).

        Raises:
            psycopg.OperationalError: the connection failed while preparing (the caller's
                transaction fails as it would have on its first statement).
        """
        if not self._enabled:
            return {}
        done = self._done.get(conn)
        if done is not None:
            return done
        with self._lock:
            stale = conn in self._stale
            self._stale.discard(conn)
        try:
            conn.execute("; ".join(["DEALLOCATE ALL"] * stale + [GENERIC_PLANS]
                                   + [p for p, _ in self._texts.values()]))
            types = dict(conn.execute(self._types_sql).fetchall())
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            if not self._warned:
                self._warned = True
                log.warning("PostgreSQL ledger: statements not prepared, sent as text (%s)",
                            str(exc).strip().splitlines()[0] if str(exc).strip() else exc)
            with self._lock:
                self._done[conn] = {}
            return {}
        statements = self._build(types)
        with self._lock:
            self._done[conn] = statements
        return statements

    def _build(self, types: Mapping[str, list[str]]) -> dict[str, Prepared]:
        with self._lock:
            if self._statements is not None:
                return self._statements
        out: dict[str, Prepared] = {}
        for name, (prepare, params) in self._texts.items():
            server = _PREFIX + name
            kinds = types.get(server)
            if kinds is None or len(kinds) != len(params):
                continue
            args = [f"%({p})s::{t}" for p, t in zip(params, kinds, strict=True)]
            execute = f"EXECUTE {server}({', '.join(args)})" if args else f"EXECUTE {server}"
            now_sql = None
            if "now" in params:
                now_sql = execute.replace("%(now)s", self._now_sql)
            out[name] = Prepared(server, prepare, params, execute, now_sql)
        with self._lock:
            self._statements = out
        return out
