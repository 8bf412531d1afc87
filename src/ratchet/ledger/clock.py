"""The ledger clock and what a step of it does (DESIGN §4, "the ledger clock").

The ledger clock is the database's clock read inside each transaction: SQLite's
``julianday('now')`` (the host's real-time clock, the same one ``time.time()`` reads) and
PostgreSQL's ``now()`` (the *server's* clock at the transaction's start). Every ``run_at``,
``lease_until`` and ``updated_at`` is written on it. When that clock is stepped (NTP, a VM
resumed, an operator's ``date``), the rows written before the step carry times of the old
clock. A forward step makes waits and leases end early (fencing keeps a lease taken over
early safe). A backward step would make them last longer by the step's length, so:

* a write that makes a task ready now never moves its ``run_at`` later:
  ``MIN(run_at, now)`` (release, hand-back, a retry without delay, resolve, operator
  retry, revocation of a dead holder); a delayed write sets ``now + delay`` on the clock it
  reads, so its delay is counted from the clock as it is then;
* a row's own wait is ``run_at - updated_at`` (both written by the same statement, on the
  same clock). Each process watches the ledger clock against its monotonic clock
  (:class:`ClockWatch`); when the ledger clock falls behind by more than
  :data:`STEP_TOLERANCE_S`, the next claim first re-anchors every ready row whose
  ``updated_at`` lies ahead of the clock: ``run_at = MIN(run_at, now + MAX(run_at -
  updated_at, 0))``, ``updated_at = now`` (a delayed retry waits at most its delay from
  then; a release is ready at once), and caps every lease at ``now + lease_s`` (a dead
  holder's lease does not outlast the step; a live holder's own deadline, kept on its
  monotonic clock, ends before the capped one). The operator's pause and resume run the
  same repair. A resume caps a paused task's kept ``run_at`` by the same rule;
* so that ``run_at - updated_at`` stays the row's own wait, every statement that rewrites
  ``updated_at`` of a row whose ``run_at`` it keeps (a takeover, a retirement, a fenced
  transition to ``PAUSED`` or an end, an operator's move) re-anchors that ``run_at`` by
  the same expression (the identity unless ``updated_at > now``): a pause written after a
  step back on a row written before it then keeps the row's wait, not the step's.

The clock is injectable for tests through :attr:`ClockFn` on the dialect
(``Dialect.clock``; :mod:`ratchet.testing.clock` has a steppable and a frozen one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..serde import dumps

__all__ = ["STEP_TOLERANCE_S", "ClockFn", "ClockWatch", "repair"]

log = logging.getLogger("ratchet.ledger")

ClockFn = Callable[[float], float]
"""Maps the database's clock reading (epoch seconds) to the ledger clock (epoch seconds).
``None`` on a dialect (production): the database's reading is the ledger clock."""



class Tx(Protocol):
    """What the repair needs of a transaction (:class:`ratchet.ledger.dialect.Tx`, which
    imports :data:`ClockFn` from here: the dialect module is not imported back)."""

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int: ...

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None: ...


STEP_TOLERANCE_S = 2.0
"""A fall of the ledger clock against the monotonic clock smaller than this many seconds is
not a step (a transaction's first round trip on a loaded host can take that long after the
clock it reports was read); a smaller backward step leaves rows idle at most this long."""


class ClockWatch:
    """Notices backward steps of the ledger clock, from one process.

    Each observation pairs a ledger-clock reading with ``monotonic()`` taken after it: their
    difference stays constant while the ledger clock does not step (the monotonic clock
    never does) and is lowered only by the lag between the reading and the observation.
    A difference more than ``tolerance_s`` below the highest seen is a backward step: the
    watch is then :attr:`pending` until :meth:`repaired` is called (the caller re-anchors
    the ledger's rows, see the module docstring). A new watch starts pending: a process
    that starts after a step has not seen the clock before it, and the repair finds nothing
    to do on a ledger whose clock never stepped.

    Thread-safe.

    Args:
        tolerance_s: seconds; see :data:`STEP_TOLERANCE_S`.
        monotonic: the process clock, seconds (``time.monotonic``; injectable for tests).
    """

    def __init__(self, tolerance_s: float = STEP_TOLERANCE_S,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.tolerance_s = tolerance_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._offset: float | None = None  # highest (ledger clock - monotonic) seen
        self._pending = True
        self.steps_seen = 0  # backward steps noticed (for tests and logs)
        self.last_step_s = 0.0  # the size of the last one, seconds

    @property
    def pending(self) -> bool:
        """A backward step was seen (or this watch is new) and no repair committed yet."""
        return self._pending

    def observe(self, now: float) -> bool:
        """Record a ledger-clock reading ``now`` (epoch seconds) just taken; return
        :attr:`pending` (True: the caller should repair in this transaction)."""
        offset = now - self._monotonic()
        with self._lock:
            if self._offset is None or offset > self._offset:
                self._offset = offset
            elif offset < self._offset - self.tolerance_s:
                self.steps_seen += 1
                self.last_step_s = self._offset - offset
                self._offset = offset
                self._pending = True
            return self._pending

    def repaired(self) -> None:
        """A repair was committed: nothing pending until the clock steps back again."""
        with self._lock:
            self._pending = False


def repair(tx: Tx, now: float, watch: ClockWatch) -> tuple[int, int]:
    """Re-anchor the rows written ahead of the ledger clock ``now`` (epoch seconds), in the
    caller's write transaction (see the module docstring): ready rows wait at most their own
    wait from ``now``, leases end at most ``lease_s`` after it. Audited (kind
    ``clock_step``) and logged when any row changed. Returns ``(ready rows, leases)``
    changed."""
    ready = tx.execute("clock_repair_ready", {"now": now})
    leases = tx.execute("clock_repair_leases", {"now": now})
    # A rate bucket's clock never goes back (ratchet.ratelimit): one written ahead would
    # refill nothing until the clock caught up.
    tx.execute("clock_repair_buckets", {"now": now})
    if ready or leases:
        detail = {"ready_rows": ready, "leases": leases,
                  "step_s": round(watch.last_step_s, 3) if watch.steps_seen else None}
        tx.batch("audit_insert", [{
            "task_id": "", "at": now, "kind": "clock_step", "from_state": None,
            "to_state": None, "generation": None, "holder": None, "detail": dumps(detail)}])
        log.warning("the ledger clock is behind rows written before (a backward step): "
                    "%d ready task(s) re-anchored at their own wait, %d lease(s) capped",
                    ready, leases)
    return ready, leases
