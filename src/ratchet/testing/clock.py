"""A steppable, freezable ledger clock for tests (the seam of :mod:`ratchet.ledger.clock`).

The ledger clock is the database's clock (SQLite: the host's; PostgreSQL: the server's),
read inside each transaction. :func:`inject_clock` puts a :class:`LedgerClock` between that
reading and every statement of one ledger object, so a test can step the clock forward or
back (as NTP would) or freeze it, without touching the machine's clock::

    clock = inject_clock(ledger)
    clock.step(60.0)     # the clock jumps 60 s ahead
    ...
    clock.step(-60.0)    # and back
    clock.freeze(ledger.now())   # stands still until thaw() (or moves only by step())

Only the ledger object it was injected into sees it (another process, or another ledger
object on the same store, reads the database's clock).
"""

from __future__ import annotations

import threading

from ..errors import InvalidArguments
from ..ledger.base import Ledger

__all__ = ["LedgerClock", "inject_clock"]


class LedgerClock:
    """The database's clock reading plus an offset (seconds), or a frozen value.

    Thread-safe; callable as a :data:`ratchet.ledger.clock.ClockFn`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offset_s = 0.0
        self.frozen_at: float | None = None

    def __call__(self, database_now: float) -> float:
        """The ledger clock (epoch seconds) for the database's reading ``database_now``."""
        with self._lock:
            if self.frozen_at is not None:
                return self.frozen_at
            return database_now + self.offset_s

    def step(self, seconds: float) -> None:
        """Step the clock by ``seconds`` (negative: back); a frozen clock moves too."""
        with self._lock:
            self.offset_s += seconds
            if self.frozen_at is not None:
                self.frozen_at += seconds

    def freeze(self, at: float) -> None:
        """Stand still at ``at`` (epoch seconds) until :meth:`thaw` or :meth:`step`."""
        with self._lock:
            self.frozen_at = float(at)

    def thaw(self) -> None:
        """Run again, from the database's clock plus the offset."""
        with self._lock:
            self.frozen_at = None


def inject_clock(ledger: Ledger, clock: LedgerClock | None = None) -> LedgerClock:
    """Make ``clock`` (a new :class:`LedgerClock` by default) the ledger clock of ``ledger``
    (an opened SQLite or PostgreSQL ledger) and return it.

    Raises:
        InvalidArguments: ``ledger`` has no dialect to inject a clock into.
    """
    dialect = getattr(ledger, "dialect", None)
    if dialect is None or not hasattr(dialect, "clock"):
        raise InvalidArguments(f"cannot inject a clock into {ledger!r}: not a SQL ledger")
    clock = clock if clock is not None else LedgerClock()
    dialect.clock = clock
    return clock
