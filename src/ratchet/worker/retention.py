"""Periodic retention in the worker: prune finished tasks in the background (DESIGN §10.2).

``Worker(app, prune_older_than_s=30 * 86400, prune_every_s=3600)`` (``ratchet worker
--prune-older-than 30d --prune-every 1h``) starts a :class:`Pruner` thread that calls
:meth:`~ratchet.ledger.base.Ledger.prune` about every ``every_s`` seconds on its own ledger
connection (finished tasks with their history, sent events and sent outbox messages older
than the age; never an unsent outbox message). The prune runs in small batches, each its
own short transaction, so the worker's claims and commits are never held up by it; on
PostgreSQL its batches skip rows that other transactions hold (``FOR UPDATE SKIP
LOCKED``). It pauses after each batch as
long as the batch took (``pace=1``): on SQLite so the writers get the single write lock
in between, on PostgreSQL so that it takes at most about half of what one connection
can do of the server's CPU and disk (an operator's ``ratchet prune`` does not pause
there).

Many workers may have it on at once: the first run waits a random part of the interval
(at most a minute) and every later one a jittered interval, so they do not all prune at
the same instant; two prunes at once share the work (PostgreSQL) or take turns (SQLite);
when there is nothing to delete a run is a few index probes, and it is audited only when
it deleted something.
"""

from __future__ import annotations

import logging
import random
import threading

from ..errors import RatchetError
from ..ledger.base import Ledger, PruneReport

__all__ = ["Pruner"]

log = logging.getLogger("ratchet.worker")


class Pruner(threading.Thread):
    """Prunes the ledger every ``every_s`` seconds (jittered) until stopped.

    Args:
        ledger: the worker's ledger.
        holder: the worker's identity, recorded as who pruned.
        older_than_s: prune tasks finished longer ago than this, seconds (>= 0).
        every_s: seconds between prunes (> 0); each wait is drawn from 90-110 % of it, the
            first from up to ``min(every_s, 60)``.
        batch_size: tasks per transaction.

    Raises:
        ConfigError: (by :class:`~ratchet.worker.Worker`) a negative age or an interval
            that is not positive.
    """

    def __init__(self, ledger: Ledger, holder: str, older_than_s: float, every_s: float,
                 batch_size: int = 500) -> None:
        super().__init__(name="ratchet-pruner", daemon=True)
        self.ledger = ledger
        self.holder = holder
        self.older_than_s = older_than_s
        self.every_s = every_s
        self.batch_size = batch_size
        self.runs = 0
        self.last: PruneReport | None = None
        self._stop_event = threading.Event()

    def prune_once(self) -> PruneReport:
        """One prune now (audited only if it deleted something)."""
        report = self.ledger.prune(self.older_than_s, by=self.holder,
                                   batch_size=self.batch_size, audit_empty=False, pace=1.0)
        self.runs += 1
        self.last = report
        if report.tasks or report.audit or report.outbox:
            log.info("pruned %d finished task(s) older than %.0f s (%d audit rows, %d sent "
                     "outbox messages) in %d batch(es), %.2f s", report.tasks,
                     self.older_than_s, report.audit, report.outbox, report.batches,
                     report.elapsed_s)
        return report

    def run(self) -> None:
        wait_s = random.uniform(0.0, min(self.every_s, 60.0))
        while not self._stop_event.wait(wait_s):
            try:
                self.prune_once()
            except RatchetError as exc:
                log.warning("prune: %s", exc)
            wait_s = self.every_s * random.uniform(0.9, 1.1)

    def stop(self) -> None:
        """Stop the thread (a batch in flight finishes first; the rest is left for later)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=30)
