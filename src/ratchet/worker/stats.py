"""The counters of one worker process (:class:`WorkerStats`), shared by its threads."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["WorkerStats"]


@dataclass
class WorkerStats:
    """Counters of one worker process (since start).

    Task threads, the writer thread and the heartbeat all count, so every update goes
    through :meth:`add` / :meth:`add_outcome`, which hold one lock (a ``+=`` on an
    attribute is not atomic). Reading one counter needs no lock; :meth:`snapshot` reads
    them all consistently.
    """

    claimed: int = 0
    takeovers: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    released: int = 0
    cancelled: int = 0
    paused: int = 0
    stale: int = 0
    lease_lost: int = 0
    time_limited: int = 0
    """Attempts ended at their task type's time limit (``time_limit_s``)."""
    handed_back: int = 0
    """Leases handed back (released to ``PENDING``) when the shutdown grace ended or a
    second signal came, their task threads still in task code."""
    stuck_threads: int = 0
    """Task threads now inside the code of an attempt that was ended without them (time
    limit, shutdown grace): a gauge, not a counter (DESIGN §7, time limits)."""
    by_outcome: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Not a dataclass field: asdict(), repr and == see only the counters.
        self._lock = threading.Lock()

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the integer counter named ``counter`` (e.g. ``"succeeded"``)."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + n)

    def add_outcome(self, outcome: str) -> None:
        """Count one attempt that ended with ``outcome`` in :attr:`by_outcome`."""
        with self._lock:
            self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """Every counter at one instant (``dataclasses.asdict``): ``{name: int}`` plus
        ``by_outcome`` (a copy)."""
        with self._lock:
            return asdict(self)

