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
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..ledger.base import Claim, CommitOutcome, Ledger, TaskWrite

__all__ = ["LedgerWriter"]

log = logging.getLogger("ratchet.worker.writer")


@dataclass(slots=True)
class _ClaimRequest:
    holder: str
    names: Sequence[str]
    limit: int


class _Pending:
    """A write (or claim) waiting for the writer: a result slot on a pre-acquired lock.

    Cheaper than ``concurrent.futures.Future`` (no condition variable, no callbacks): the
    writer releases the lock once, the waiting task thread's ``acquire`` returns.
    """

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._value: object = None
        self._error: BaseException | None = None

    def set_result(self, value: object) -> None:
        self._value = value
        self._done.release()

    def set_exception(self, error: BaseException) -> None:
        self._error = error
        self._done.release()

    def result(self) -> object:
        self._done.acquire()
        if self._error is not None:
            raise self._error
        return self._value


_STOP = object()


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
        self._queue: queue.SimpleQueue[tuple[TaskWrite | _ClaimRequest, _Pending] | object]
        self._queue = queue.SimpleQueue()
        self._stopping = False
        self.transactions = 0
        self.writes = 0

    def commit(self, write: TaskWrite) -> CommitOutcome:
        """Make ``write`` durable (fenced); block until its transaction committed.

        Raises:
            LedgerError: the transaction failed; nothing of it was written.
            IllegalTransition: the transition is not allowed.
            RuntimeError: the writer was stopped.
        """
        if self._stopping:
            raise RuntimeError("ledger writer is stopped")
        pending = _Pending()
        self._queue.put((write, pending))
        result = pending.result()
        assert isinstance(result, CommitOutcome)
        return result

    def claim(self, holder: str, names: Sequence[str], limit: int) -> list[Claim]:
        """Run :meth:`Ledger.claim` on the writer's connection and wait for it."""
        pending = _Pending()
        self._queue.put((_ClaimRequest(holder, names, limit), pending))
        result = pending.result()
        assert isinstance(result, list)
        return result

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self._stopping = True
        self._queue.put(_STOP)

    def run(self) -> None:
        stop = False
        while not stop:
            batch: list[tuple[TaskWrite | _ClaimRequest, _Pending]] = []
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stop = True
                else:
                    assert isinstance(item, tuple)
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._drain(batch)

    def _drain(self, batch: list[tuple[TaskWrite | _ClaimRequest, _Pending]]) -> None:
        writes = [(item, fut) for item, fut in batch if isinstance(item, TaskWrite)]
        claims = [(item, fut) for item, fut in batch if isinstance(item, _ClaimRequest)]
        if writes and claims:
            # Finished tasks' writes and the claim of their successors: one transaction.
            (request, claim_fut), claims = claims[0], claims[1:]
            chunk, writes = writes[: self._max_batch], writes[self._max_batch :]
            try:
                outcomes, claimed = self._ledger.commit_and_claim(
                    [w for w, _ in chunk], request.holder, request.names, request.limit
                )
            except Exception:
                # Fall back to separate transactions, so errors land where they belong.
                writes = chunk + writes
                claims = [(request, claim_fut), *claims]
            else:
                self.transactions += 1
                self.writes += len(chunk)
                for (_, fut), outcome in zip(chunk, outcomes, strict=True):
                    fut.set_result(outcome)
                claim_fut.set_result(claimed)
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
        for item, fut in claims:
            try:
                fut.set_result(self._ledger.claim(item.holder, item.names, item.limit))
            except BaseException as exc:
                fut.set_exception(exc)
