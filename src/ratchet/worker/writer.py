"""Group commit: one writer thread turns many tasks' writes into one ledger transaction.

Task threads hand their fenced :class:`~ratchet.ledger.base.TaskWrite` to the writer,
either waiting until it is durable (:meth:`LedgerWriter.commit`: effect intents and
results, durable steps) or not (:meth:`LedgerWriter.submit`: completions and pipelined
steps, whose callback runs in the writer thread once the outcome is known). The writer
takes everything queued so far (up to ``max_batch``) and calls :meth:`Ledger.commit`
once: one transaction, one fsync, each task's rows still fenced on its own generation.
The queue is FIFO and a batch keeps its order, so a task's later write always lands in the
same or a later transaction than its earlier ones. No artificial delay is added: under
load batches grow by themselves, when idle each write commits alone at once.

Claims go through the same thread so one process holds one write connection. With a
claim policy installed (:meth:`LedgerWriter.set_claim_policy`), every transaction that
commits writes also claims as many tasks as the policy allows, counting the slots its
own completions free (:meth:`Ledger.commit_and_claim`: one fsync for both).

A write the database refuses for its content (:class:`~ratchet.errors.WriteRejected`, or
any error that is not an outage) fails only that write: the other writes of its batch are
then committed one by one, and only the refused one's callback gets the error. An outage
(:class:`~ratchet.errors.LedgerUnavailable`) fails the whole batch, since a transaction
lost during COMMIT may have been applied and must not be applied again write by write.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import LedgerError, LedgerUnavailable
from ..ledger.base import Claim, CommitOutcome, Ledger, TaskWrite

if TYPE_CHECKING:
    from .hooks import Hooks

__all__ = ["ClaimPolicy", "LedgerWriter", "WriteCallback", "WriterStopped"]

log = logging.getLogger("ratchet.worker.writer")

WriteCallback = Callable[[CommitOutcome | None, BaseException | None], None]
"""Called in the writer thread with ``(outcome, None)`` or ``(None, error)``."""


class WriterStopped(LedgerError):
    """A write was handed to a :class:`LedgerWriter` that has been stopped (the worker is
    shutting down); nothing was written."""


class _Sync:
    """Marker: resolve its callback once everything queued before it was handled."""

    __slots__ = ()


_SYNC = _Sync()


class _Poll:
    """Ask the writer to claim per its policy even without writes to commit."""

    __slots__ = ()


_POLL = _Poll()


class ClaimPolicy(Protocol):
    """How the writer claims on the worker's behalf (implemented by the worker).

    ``limit(freed, forced)`` returns how many tasks to claim now, where ``freed`` is the
    number of final writes (completions) in the transaction being built, whose slots are
    free once it commits; ``forced`` is True for a poll from the main loop (claim even a
    small batch). ``dispatch(claims, t_sent)`` receives what was claimed (``t_sent``:
    monotonic time taken before the transaction started), in the writer thread.
    """

    @property
    def holder(self) -> str:
        """The worker's lease-holder identity."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """Task names to claim."""
        ...

    def limit(self, freed: int, forced: bool) -> int:
        """How many tasks to claim in the transaction being built."""
        ...

    def dispatch(self, claims: list[Claim], t_sent: float) -> None:
        """Hand what was claimed to the worker (writer thread)."""
        ...


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

    def __call__(self, value: object, error: BaseException | None) -> None:
        self._value = value
        self._error = error
        self._done.release()

    def result(self) -> object:
        self._done.acquire()
        if self._error is not None:
            raise self._error
        return self._value


_STOP = object()
_Callback = Callable[[object, BaseException | None], None]
_Item = tuple[TaskWrite | _Sync, _Callback]
_WriteItem = tuple[TaskWrite, _Callback]


def _resolve(callback: Callable[[object, BaseException | None], None], value: object,
             error: BaseException | None) -> None:
    try:
        callback(value, error)
    except BaseException:  # a callback must never kill the writer (not even SystemExit)
        log.exception("ledger writer: write callback failed")


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
        self._queue: queue.SimpleQueue[_Item | _Poll | object] = queue.SimpleQueue()
        self._stopping = False
        self._policy: ClaimPolicy | None = None
        self.hooks: Hooks | None = None
        """Lifecycle hooks (claim and commit events), or None when no middleware is set."""
        self.transactions = 0
        self.writes = 0
        self.last_claim_at = float("-inf")
        """Monotonic time of the last claim attempt (any outcome) made by this writer."""

    def set_claim_policy(self, policy: ClaimPolicy | None) -> None:
        """Claim on ``policy``'s behalf with every commit (and on :meth:`poll`)."""
        self._policy = policy

    def commit(self, write: TaskWrite) -> CommitOutcome:
        """Make ``write`` durable (fenced); block until its transaction committed.

        Raises:
            LedgerError: the transaction failed; nothing of it was written.
            WriteRejected: the database refused this write (the batch's other writes
                were committed without it).
            IllegalTransition: the transition is not allowed.
            WriterStopped: the writer was stopped.
        """
        if self._stopping:
            raise WriterStopped("ledger writer is stopped")
        pending = _Pending()
        self._queue.put((write, pending))
        result = pending.result()
        assert isinstance(result, CommitOutcome)
        return result

    def submit(self, write: TaskWrite, callback: WriteCallback) -> None:
        """Queue ``write`` without waiting; ``callback(outcome, error)`` runs in the writer
        thread once its transaction committed (or failed). Writes are applied in the order
        they were queued.

        Raises:
            WriterStopped: the writer was stopped.
        """
        if self._stopping:
            raise WriterStopped("ledger writer is stopped")
        self._queue.put((write, callback))

    def poll(self) -> None:
        """Ask the writer to claim per its policy now (without waiting for the result)."""
        self._queue.put(_POLL)

    def sync(self) -> None:
        """Wait until everything queued before this call has been handled."""
        pending = _Pending()
        self._queue.put((_SYNC, pending))
        pending.result()

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self._stopping = True
        self._queue.put(_STOP)

    def run(self) -> None:
        stop = False
        get_nowait = self._queue.get_nowait
        while not stop:
            batch: list[_Item] = []
            poll = False
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stop = True
                elif item is _POLL:
                    poll = True
                else:
                    batch.append(item)  # type: ignore[arg-type]
                try:
                    item = get_nowait()
                except queue.Empty:
                    break
            if batch or poll:
                self._drain(batch, poll)

    def _policy_limit(self, freed: int, forced: bool) -> int:
        policy = self._policy
        if policy is None:
            return 0
        try:
            return policy.limit(freed, forced)
        except Exception:
            log.exception("ledger writer: claim policy failed")
            return 0

    def _dispatch(self, claims: list[Claim], t_sent: float) -> None:
        policy = self._policy
        if policy is None:
            return
        hooks = self.hooks
        if hooks is not None:
            hooks.after_claim(claims)
        if not claims:
            return
        try:
            policy.dispatch(claims, t_sent)
        except Exception:
            log.exception("ledger writer: dispatch of %d claims failed", len(claims))

    def _drain(self, batch: list[_Item], poll: bool) -> None:
        writes: list[_WriteItem] = [
            (item, cb) for item, cb in batch if isinstance(item, TaskWrite)
        ]
        syncs = [cb for item, cb in batch if isinstance(item, _Sync)]
        policy = self._policy
        hooks = self.hooks
        claimed_here = False
        while writes:
            chunk, writes = writes[: self._max_batch], writes[self._max_batch :]
            limit = 0
            if policy is not None:
                freed = sum(1 for w, _ in chunk if w.transition is not None)
                limit = self._policy_limit(freed, forced=poll and not claimed_here)
            if limit > 0:
                if hooks is not None:
                    hooks.before_claim(limit)
                    hooks.before_commit(len(chunk))
                t_sent = time.monotonic()
                self.last_claim_at = t_sent
                claimed_here = True
                assert policy is not None
                try:
                    outcomes, claimed = self._ledger.commit_and_claim(
                        [w for w, _ in chunk], policy.holder, policy.names, limit
                    )
                except LedgerUnavailable as exc:
                    # Unreachable, or lost during COMMIT (outcome unknown): never apply
                    # these writes a second time; each task handles the failure.
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, exc)
                    for _, cb in chunk:
                        _resolve(cb, None, exc)
                    continue
                except Exception as exc:
                    # Commit alone (below), so errors land where they belong.
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, exc)
                    log.debug("commit_and_claim failed; committing without the claim",
                              exc_info=True)
                else:
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, None)
                    self.transactions += 1
                    self.writes += len(chunk)
                    self._dispatch(claimed, t_sent)
                    for (_, cb), outcome in zip(chunk, outcomes, strict=True):
                        _resolve(cb, outcome, None)
                    continue
            self._commit_chunk(chunk)
        if poll and not claimed_here:
            limit = self._policy_limit(0, forced=True)
            if limit > 0 and policy is not None:
                if hooks is not None:
                    hooks.before_claim(limit)
                t_sent = time.monotonic()
                self.last_claim_at = t_sent
                try:
                    claimed = self._ledger.claim(policy.holder, policy.names, limit)
                except Exception as exc:  # keep the worker alive; the main loop polls again
                    log.error("claim failed: %s", exc)
                else:
                    self._dispatch(claimed, t_sent)
        for cb in syncs:
            _resolve(cb, [], None)

    def _ledger_commit(self, writes: list[TaskWrite]) -> list[CommitOutcome]:
        """One :meth:`Ledger.commit` transaction, between the commit hooks."""
        hooks = self.hooks
        if hooks is None:
            return self._ledger.commit(writes)
        hooks.before_commit(len(writes))
        t0 = time.monotonic()
        try:
            outcomes = self._ledger.commit(writes)
        except Exception as exc:
            hooks.after_commit(len(writes), time.monotonic() - t0, exc)
            raise
        hooks.after_commit(len(writes), time.monotonic() - t0, None)
        return outcomes

    def _commit_chunk(self, chunk: list[_WriteItem]) -> None:
        try:
            outcomes = self._ledger_commit([w for w, _ in chunk])
        except Exception as exc:
            if len(chunk) == 1 or isinstance(exc, LedgerUnavailable):
                # Unavailable: the outcome may be unknown (lost during COMMIT), so the
                # writes are not applied a second time one by one.
                for _, cb in chunk:
                    _resolve(cb, None, exc)
                return
            # One bad write must not fail its neighbours: commit them one by one, so
            # only the write that fails on its own gets the error.
            log.warning("group commit of %d writes failed (%s); committing them one by one",
                        len(chunk), exc)
            for write, cb in chunk:
                try:
                    outcome = self._ledger_commit([write])[0]
                except Exception as single:
                    _resolve(cb, None, single)
                else:
                    self.transactions += 1
                    self.writes += 1
                    _resolve(cb, outcome, None)
        else:
            self.transactions += 1
            self.writes += len(chunk)
            for (_, cb), outcome in zip(chunk, outcomes, strict=True):
                _resolve(cb, outcome, None)
