"""Group commit: one writer thread turns many tasks' writes into one ledger transaction.

Task threads hand their fenced :class:`~ratchet.ledger.base.TaskWrite` to the writer and
block until it is durable. The writer takes everything queued so far (up to
``max_batch``) and calls :meth:`Ledger.commit` once: one transaction, one fsync, each
task's rows still fenced on its own generation. No artificial delay is added: under load
batches grow by themselves, when idle each write commits alone at once.

Claims go through the same thread so one process holds one write connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from ..ledger.base import Claim, CommitOutcome, Ledger, TaskWrite

__all__ = ["LedgerWriter"]

log = logging.getLogger("ratchet.worker.writer")


@dataclass(slots=True)
class _ClaimRequest:
    holder: str
    names: Sequence[str]
    limit: int


class LedgerWriter(threading.Thread):
    """The worker's single writer thread.

    Args:
        ledger: the ledger; this thread's ledger connection is the worker's write connection.
        max_batch: most task writes merged into one transaction.
    """

    def __init__(self, ledger: Ledger, max_batch: int = 256) -> None:
        super().__init__(name="ratchet-writer", daemon=True)
        self._ledger = ledger
        self._max_batch = max_batch
        self._queue: list[tuple[TaskWrite | _ClaimRequest, Future[object]]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self.transactions = 0
        self.writes = 0

    def commit(self, write: TaskWrite) -> CommitOutcome:
        """Make ``write`` durable (fenced); block until its transaction committed.

        Raises:
            LedgerError: the transaction failed; nothing of it was written.
            IllegalTransition: the transition is not allowed.
        """
        fut: Future[object] = Future()
        with self._cond:
            if self._stopping:
                raise RuntimeError("ledger writer is stopped")
            self._queue.append((write, fut))
            self._cond.notify()
        result = fut.result()
        assert isinstance(result, CommitOutcome)
        return result

    def claim(self, holder: str, names: Sequence[str], limit: int) -> list[Claim]:
        """Run :meth:`Ledger.claim` on the writer's connection and wait for it."""
        fut: Future[object] = Future()
        with self._cond:
            self._queue.append((_ClaimRequest(holder, names, limit), fut))
            self._cond.notify()
        result = fut.result()
        assert isinstance(result, list)
        return result

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue and self._stopping:
                    return
                batch = self._queue
                self._queue = []
            self._drain(batch)

    def _drain(self, batch: list[tuple[TaskWrite | _ClaimRequest, Future[object]]]) -> None:
        writes = [(item, fut) for item, fut in batch if isinstance(item, TaskWrite)]
        for start in range(0, len(writes), self._max_batch):
            chunk = writes[start : start + self._max_batch]
            try:
                outcomes = self._ledger.commit([w for w, _ in chunk])
            except Exception as exc:
                if len(chunk) == 1:
                    chunk[0][1].set_exception(exc)
                    continue
                # One bad write must not fail its neighbours: commit them one by one, so
                # only the write that fails on its own gets the error.
                log.warning("group commit of %d writes failed (%s); retrying singly",
                            len(chunk), exc)
                for write, fut in chunk:
                    try:
                        fut.set_result(self._ledger.commit([write])[0])
                    except Exception as single:
                        fut.set_exception(single)
                    else:
                        self.transactions += 1
                        self.writes += 1
            else:
                self.transactions += 1
                self.writes += len(chunk)
                for (_, fut), outcome in zip(chunk, outcomes, strict=True):
                    fut.set_result(outcome)
        for item, fut in batch:
            if isinstance(item, _ClaimRequest):
                try:
                    fut.set_result(self._ledger.claim(item.holder, item.names, item.limit))
                except BaseException as exc:
                    fut.set_exception(exc)
