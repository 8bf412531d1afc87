"""The PostgreSQL connection pool, with a reconnect backoff that stays short.

psycopg_pool re-adds a broken connection with exponential backoff (1 s, 2 s, 4 s, ...,
uncapped until ``reconnect_timeout``), so the longer the server was down, the longer a
worker waits after it is back: after 45 s of downtime the next attempt comes up to 18 s
after the server accepts connections again, after 90 s up to 35 s. A ledger outage should
cost its own length and no more, so this pool caps the delay between attempts at
:data:`RECONNECT_MAX_DELAY_S` (with jitter, so many workers do not reconnect in lockstep).
A connection attempt to a server that is down is refused at once, so the cap costs a few
cheap attempts a second per pool while the server is down, nothing while it is up.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

__all__ = ["RECONNECT_MAX_DELAY_S", "LedgerPool", "make_pool"]

RECONNECT_MAX_DELAY_S = 0.5
"""Upper bound, in seconds, of the wait between two reconnection attempts of the pool."""

RECONNECT_MIN_DELAY_S = 0.05
"""First wait, in seconds, after a failed connection attempt."""


class _CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's attempt state with the delay doubling from 0.05 s up to
    :data:`RECONNECT_MAX_DELAY_S` (±20 % jitter) instead of growing without bound."""

    def update_delay(self, now: float) -> None:
        first = self.delay == 0.0
        super().update_delay(now)  # sets give_up_at on the first call, clamps to it
        if first:
            self.delay = min(self.delay, RECONNECT_MIN_DELAY_S)
        capped = RECONNECT_MAX_DELAY_S * random.uniform(0.8, 1.2)
        remaining = max(0.0, self.give_up_at - now)
        self.delay = min(self.delay, capped, remaining)


class LedgerPool(ConnectionPool[psycopg.Connection[Any]]):
    """A :class:`psycopg_pool.ConnectionPool` whose reconnection attempts back off to at
    most :data:`RECONNECT_MAX_DELAY_S` seconds apart (see the module docstring).

    The override hooks the one place where psycopg_pool creates the backoff state of a new
    reconnection (``_add_connection`` with no attempt yet); every later attempt of the same
    reconnection reuses that state, so the cap holds for all of them. Pinned by
    ``tests/pg_faults/test_pg_outage_recovery.py``.
    """

    def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        if attempt is None:
            attempt = _CappedBackoff(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing=growing)


def make_pool(
    conninfo: str,
    *,
    min_size: int,
    max_size: int,
    configure: Callable[[psycopg.Connection[Any]], None],
    name: str,
    timeout_s: float = 15.0,
    connect_timeout_s: int = 5,
) -> LedgerPool:
    """Open the ledger's connection pool (autocommit connections).

    Args:
        conninfo: a libpq URL (without Ratchet's own query parameters).
        min_size: connections kept open (≥ 1).
        max_size: connections at most.
        configure: called on every new connection (search_path, session settings).
        name: the pool's name in psycopg's logs.
        timeout_s: how long a caller waits for a connection before ``PoolTimeout``, seconds.
        connect_timeout_s: libpq's ``connect_timeout`` of each connection attempt, seconds.

    Returns:
        An open :class:`LedgerPool`; close it with ``close()``.
    """
    return LedgerPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, "connect_timeout": connect_timeout_s},
        configure=configure,
        open=True,
        timeout=timeout_s,
        name=name,
    )
