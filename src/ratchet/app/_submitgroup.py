"""Group commit of :meth:`ratchet.App.submit`: concurrent callers share one submit
transaction (:class:`SubmitGroup`)."""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque

from ..errors import IdempotencyConflict, LedgerError, LedgerUnavailable
from ..ledger.base import Ledger, NewTask, SubmitResult

__all__ = ["SUBMIT_GROUP_MAX", "SubmitGroup"]

SUBMIT_GROUP_MAX = 256
"""Most tasks one shared submit transaction writes (:class:`SubmitGroup`); callers past
it wait for the next transaction."""


class _PendingSubmit:
    """One :meth:`ratchet.App.submit` call queued for a shared transaction: its task, then its
    outcome (``result`` or ``error``), and whether it was made the next leader."""

    __slots__ = ("error", "lead", "result", "task", "wakeup")

    def __init__(self, task: NewTask) -> None:
        self.task = task
        self.result: SubmitResult | None = None
        self.error: BaseException | None = None
        self.lead = False
        self.wakeup: threading.Event | None = None

    def outcome(self) -> SubmitResult:
        """The result. Raises the error this submit got."""
        if self.error is not None:
            raise self.error
        if self.result is None:  # a bug of the group, never a silent success
            raise LedgerError("submit finished without an outcome (ratchet bug)")
        return self.result


_GROUPS: weakref.WeakSet[SubmitGroup] = weakref.WeakSet()
"""Every live :class:`SubmitGroup`, reset in a forked child (a fork while another
thread led or waited would otherwise leave the child's submits waiting forever)."""


def _reset_groups_after_fork() -> None:
    for group in list(_GROUPS):
        group._after_fork()


os.register_at_fork(after_in_child=_reset_groups_after_fork)


class SubmitGroup:
    """Group commit for :meth:`ratchet.App.submit`: concurrent callers share one transaction.

    Leader/follower, no thread of its own and no added delay. A caller that finds no
    submit transaction in flight runs one at once with its own task (the uncontended case:
    one lock taken twice, nothing else). Callers that arrive while one is in flight queue
    their task and sleep; when the transaction ends, its leader hands leadership to the
    first queued caller, which takes everything queued (up to :data:`SUBMIT_GROUP_MAX`,
    FIFO) into one ``ledger.submit(batch)`` and answers each caller with its own
    :class:`~ratchet.ledger.base.SubmitResult` or error once the batch has committed.

    The same outcome per caller as the calls run one after the other:

    * the same idempotency key twice in a batch with the same params: the first creates
      the task, the second gets ``created=False`` and the same id (the engine's dedupe);
      with *different* params the later caller is left for a later batch (FIFO per key),
      where it meets the committed row and gets its own ``IdempotencyConflict``;
    * :class:`~ratchet.errors.IdempotencyConflict` rolls the whole batch back (the ledger
      is all-or-nothing); the engine has audited it once, so it goes to one caller whose
      key and params digest it names and the rest of the batch is sent again;
    * :class:`~ratchet.errors.LedgerUnavailable` goes to every caller of the batch (a
      transaction lost during ``COMMIT`` may have been applied: it is not re-sent task by
      task, as the worker's writer does);
    * any other error (:class:`~ratchet.errors.WriteRejected`, ...) makes the leader
      submit the batch's tasks one by one, so only the task that fails alone gets it.
    """

    def __init__(self, max_batch: int = SUBMIT_GROUP_MAX) -> None:
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: deque[_PendingSubmit] = deque()  # waiting, in no transaction yet
        self._busy = False  # a leader is running; False implies an empty queue
        self.transactions = 0
        """Batches sent (a batch re-sent after a conflict or split counts once)."""
        _GROUPS.add(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's in-flight submits are not this process's."""
        self._lock = threading.Lock()
        self._queue = deque()
        self._busy = False

    @property
    def waiting(self) -> int:
        """Callers queued for the next transaction."""
        return len(self._queue)

    def submit(self, ledger: Ledger, task: NewTask) -> SubmitResult:
        """Write ``task`` (in a transaction shared with concurrent callers) and return its
        result once committed.

        Raises:
            IdempotencyConflict, LedgerError: as ``ledger.submit([task])`` would.
        """
        me = _PendingSubmit(task)
        with self._lock:
            if self._busy:
                wakeup = me.wakeup = threading.Event()
                self._queue.append(me)
            else:
                self._busy = True
                wakeup = None
        if wakeup is None:
            batch = [me]
        else:
            try:
                wakeup.wait()
            except BaseException:  # interrupted while queued: leave the queue cleanly
                self._abandon(me)
                raise
            if not me.lead:
                return me.outcome()
            batch = self._take()
        try:
            self._send(ledger, batch)
        except BaseException as exc:  # KeyboardInterrupt in the leader: nobody hangs
            for p in batch:
                if p is not me and p.result is None and p.error is None:
                    p.error = LedgerUnavailable(
                        f"the shared submit transaction was interrupted in another thread "
                        f"({type(exc).__name__}); the outcome is unknown: submit again "
                        "with the same idempotency key"
                    )
            raise
        finally:
            self._hand_off()
            for p in batch:
                if p.wakeup is not None and p is not me:
                    p.wakeup.set()
        return me.outcome()

    def _take(self) -> list[_PendingSubmit]:
        """The next batch, FIFO from the queue (the new leader is its head). A task whose
        idempotency key is already in the batch with other params waits for a later batch,
        and so does every later task with that key (their order is kept)."""
        batch: list[_PendingSubmit] = []
        deferred: list[_PendingSubmit] = []
        digests: dict[str, str] = {}
        blocked: set[str] = set()
        with self._lock:
            queue = self._queue
            while queue and len(batch) < self.max_batch:
                p = queue.popleft()
                key = p.task.idempotency_key
                if key is not None and (
                    key in blocked
                    or digests.setdefault(key, p.task.params_digest) != p.task.params_digest
                ):
                    blocked.add(key)
                    deferred.append(p)
                    continue
                batch.append(p)
            queue.extendleft(reversed(deferred))
        return batch

    def _abandon(self, me: _PendingSubmit) -> None:
        """A queued caller leaves (interrupted): out of the queue, and if it had just been
        made leader, leadership passes on. Taken into a batch already, its task may still
        be written (an outcome unknown to it, as for any interrupted submit)."""
        with self._lock:
            if me in self._queue:
                self._queue.remove(me)
            lead = me.lead
        if lead:
            self._hand_off()

    def _hand_off(self) -> None:
        """End this leader's turn: wake the first queued caller as the next leader, or
        mark the group idle."""
        with self._lock:
            if not self._queue:
                self._busy = False
                return
            head = self._queue[0]
            head.lead = True
        assert head.wakeup is not None
        head.wakeup.set()

    def _send(self, ledger: Ledger, batch: list[_PendingSubmit]) -> None:
        """Submit ``batch`` and set each entry's result or error (see the class)."""
        self.transactions += 1
        pending = list(batch)
        while pending:
            try:
                results = ledger.submit([p.task for p in pending])
            except IdempotencyConflict as exc:
                culprit = next((p for p in pending
                                if p.task.idempotency_key == exc.key
                                and p.task.params_digest == exc.new_digest), None)
                if culprit is None:  # not one of ours (a ledger of another kind)
                    if len(pending) == 1:
                        pending[0].error = exc
                    else:
                        self._one_by_one(ledger, pending)
                    return
                culprit.error = exc  # audited once by the ledger: one caller gets it
                pending.remove(culprit)
            except LedgerUnavailable as exc:
                for p in pending:
                    p.error = exc
                return
            except Exception as exc:
                if len(pending) == 1:
                    pending[0].error = exc
                else:
                    self._one_by_one(ledger, pending)
                return
            else:
                for p, result in zip(pending, results, strict=True):
                    p.result = result
                return

    @staticmethod
    def _one_by_one(ledger: Ledger, pending: list[_PendingSubmit]) -> None:
        """Submit each task in its own transaction, so only a task that fails alone gets
        an error. Once the ledger is unavailable, the rest get that error untried."""
        down: LedgerUnavailable | None = None
        for p in pending:
            if down is not None:
                p.error = down
                continue
            try:
                [p.result] = ledger.submit([p.task])
            except LedgerUnavailable as exc:
                p.error = down = exc
            except Exception as exc:
                p.error = exc

