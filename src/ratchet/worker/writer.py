"""Group commit: writer threads turn many tasks' writes into few ledger transactions.

Task threads hand their fenced :class:`~ratchet.ledger.base.TaskWrite` to the writer,
either waiting until it is durable (:meth:`LedgerWriter.commit`: effect intents and
results, durable steps) or not (:meth:`LedgerWriter.submit`: completions and pipelined
steps, whose callback runs in a writer thread once the outcome is known). A writer thread
takes everything queued to it so far (up to ``max_batch``) and calls
:meth:`Ledger.commit` once: one transaction, one fsync, each task's rows still fenced on
its own generation. When idle each write commits alone at once; under load batches grow by
themselves, and the one bounded wait below keeps them whole.

A :class:`LedgerWriter` runs ``writers`` such threads ("lanes"), each with a queue of its
own; their transactions run at once, each on its own ledger connection (PostgreSQL: one
pooled connection per transaction in flight). A task's writes always go to the same lane
(chosen from its task id), whose queue is FIFO and whose batches keep their order, so a
task's later write always lands in the same or a later transaction than its earlier ones.
Two lanes never write the same task row; their fence reads lock rows in id order and
claims skip locked rows, so they do not wait on each other. One lane (the default) is
the right choice for SQLite, which has one write lock.

Claims go through the same threads. With a claim policy installed
(:meth:`LedgerWriter.set_claim_policy`), every transaction that commits writes also
claims as many tasks as the policy allows, counting the slots its own completions free
(:meth:`Ledger.commit_and_claim`: one fsync for both). The policy reserves the slots a
claim asks for until its outcome is known, so two lanes claiming at once never take more
than the worker has room for.

One wait is added, bounded and only under load: a single writer thread whose last
transaction carried at least :data:`LINGER_MIN_FINALS` final writes, and which finds final
writes queued while tasks it claimed are still running, waits up to
:data:`LINGER_FRACTION` of its last transaction's time (never more than
:data:`LINGER_MAX_S`) for those tasks' final writes, and stops waiting as soon as every one
is queued. Without it a busy worker's transactions settle into two "waves" (a task claimed
by one transaction completes in the one after next, so each carries half the tasks in
flight) or one, by thread timing; one wave costs the ledger about half as much per task
(bench/README.md, "Bimodal C=8"). A lone write, and the writes of long tasks (small
batches), commit at once as before.

A poll's claim that fails (the ledger unavailable: a full disk, a database restart) is
retried with exponential backoff and logged once, then summarised
(:class:`~ratchet.worker.backoff.RepeatedFailure`); every failed claim, alone or riding on a
commit, is also reported to the policy (``claim_failed``: the worker stops on a corrupt
ledger), and so is a corruption any other call of the ledger found
(:attr:`Ledger.corruption <ratchet.ledger.base.Ledger.corruption>`).

A write the database refuses for its content (:class:`~ratchet.errors.WriteRejected`, or
any error that is not an outage) fails only that write: the other writes of its batch are
then committed one by one, and only the refused one's callback gets the error. An outage
(:class:`~ratchet.errors.LedgerUnavailable`) fails the whole batch, since a transaction
lost during COMMIT may have been applied and must not be applied again write by write.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import LedgerCorrupt, LedgerError, LedgerUnavailable
from ..ledger.base import Claim, ClaimKind, ClaimScope, CommitOutcome, Ledger, TaskWrite
from .backoff import RepeatedFailure
from .events import CommitEvents
from .forks import check_process

__all__ = ["LINGER_FRACTION", "LINGER_MAX_S", "LINGER_MIN_FINALS", "ClaimPolicy",
           "LedgerWriter", "WriteCallback", "WriterStopped"]

log = logging.getLogger("ratchet.worker.writer")

LINGER_FRACTION = 0.25
"""The longest wait for expected final writes, as a fraction of the writer thread's last
transaction (seconds measured around it)."""

LINGER_MAX_S = 0.002
"""The longest wait for expected final writes, seconds, whatever the last transaction took."""

LINGER_MIN_FINALS = 8
"""Final writes the writer thread's last transaction must have carried for it to wait at
all: a busy worker with short tasks (a small batch means long tasks or little work)."""

WriteCallback = Callable[[CommitOutcome | None, BaseException | None], None]
"""Called in a writer thread (the write's lane) with ``(outcome, None)`` or ``(None, error)``."""


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

    Called from any writer thread, possibly from several at once.

    ``limit(freed, forced)`` returns how many tasks to claim now and reserves that many
    slots, where ``freed`` is the number of final writes (completions) in the transaction
    being built, whose slots are free once it commits; ``forced`` is True for a poll from
    the main loop (claim even a small batch). Every positive limit is followed by exactly
    one ``dispatch(claims, t_sent, reserved, freed)`` (something was claimed; ``t_sent``:
    monotonic time taken before the transaction started) or ``release(reserved, freed)``
    (nothing was claimed, or the claim failed), with ``reserved`` the limit returned and
    ``freed`` the value it was asked with.
    """

    @property
    def scope(self) -> ClaimScope:
        """The queues served and the fair types (flow control, DESIGN §8)."""
        ...

    @property
    def holder(self) -> str:
        """The worker's lease-holder identity."""
        ...

    @property
    def names(self) -> Sequence[ClaimKind]:
        """What to claim: ``(name, version)`` pairs (DESIGN §8), or bare names."""
        ...

    def limit(self, freed: int, forced: bool) -> int:
        """How many tasks to claim in the transaction being built (slots reserved)."""
        ...

    def dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        """Hand what was claimed (non-empty) to the worker; the reservation ends."""
        ...

    def release(self, reserved: int, freed: int) -> None:
        """Nothing was claimed for a reservation of ``reserved`` slots: free them."""
        ...

    def claim_failed(self, error: BaseException) -> None:
        """A claim (a poll's, or riding on a commit) failed with ``error``; its reservation
        was released already."""
        ...

    def unfinished(self) -> int:
        """Tasks claimed and handed to the worker whose final write is not committed yet
        (queued to the writer, in a transaction, or still running)."""
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


class LedgerWriter:
    """The worker's writer: ``writers`` threads, each committing (and claiming) in
    transactions of its own. Started with :meth:`start`, ended with :meth:`stop` then
    :meth:`join`.

    Args:
        ledger: the ledger; each writer thread's transactions take a ledger connection of
            their own (PostgreSQL: from the ledger's pool, ``pool_size`` URL option).
        max_batch: most task writes merged into one transaction.
        writers: writer threads (>= 1). A task's writes always go to the same one.

    Raises:
        ValueError: ``writers`` is below 1.
    """

    def __init__(self, ledger: Ledger, max_batch: int = 256, writers: int = 1) -> None:
        if writers < 1:
            raise ValueError(f"LedgerWriter writers must be >= 1, got {writers!r}")
        self._ledger = ledger
        self._max_batch = max_batch
        self._stopping = False
        self._pid = os.getpid()  # the process whose threads serve the queues (start())
        self._policy: ClaimPolicy | None = None
        self.hooks: CommitEvents | None = None
        """Lifecycle hooks (claim and commit events), or None when no middleware is set."""
        self._lanes = [_Lane(self, i) for i in range(writers)]
        self._next_poll = 0
        self.claim_failures = RepeatedFailure("claim", log)
        """Backoff and log throttling of failing poll claims (all writer threads)."""

    @property
    def ledger(self) -> Ledger:
        """The ledger this writer commits to (for unfenced appends such as late effects)."""
        return self._ledger

    @property
    def writers(self) -> int:
        """Number of writer threads."""
        return len(self._lanes)

    @property
    def transactions(self) -> int:
        """Transactions committed so far, all writer threads together."""
        return sum(lane.transactions for lane in self._lanes)

    @property
    def writes(self) -> int:
        """Task writes committed so far, all writer threads together."""
        return sum(lane.writes for lane in self._lanes)

    @property
    def last_claim_at(self) -> float:
        """Monotonic time (seconds) of the last claim attempt (any outcome) made by any
        writer thread; ``-inf`` before the first."""
        return max(lane.last_claim_at for lane in self._lanes)

    def set_claim_policy(self, policy: ClaimPolicy | None) -> None:
        """Claim on ``policy``'s behalf with every commit (and on :meth:`poll`)."""
        self._policy = policy

    def start(self) -> None:
        """Start the writer threads (in this process: a forked child cannot use them)."""
        self._pid = os.getpid()
        for lane in self._lanes:
            lane.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for every writer thread to end (after :meth:`stop`), at most ``timeout``
        seconds in all (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for lane in self._lanes:
            lane.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def is_alive(self) -> bool:
        """True while any writer thread runs."""
        return any(lane.is_alive() for lane in self._lanes)

    def _lane(self, task_id: str) -> _Lane:
        lanes = self._lanes
        return lanes[0] if len(lanes) == 1 else lanes[hash(task_id) % len(lanes)]

    def commit(self, write: TaskWrite) -> CommitOutcome:
        """Make ``write`` durable (fenced); block until its transaction committed.

        Raises:
            LedgerError: the transaction failed; nothing of it was written.
            WriteRejected: the database refused this write (the batch's other writes
                were committed without it).
            IllegalTransition: the transition is not allowed.
            WriterStopped: the writer was stopped.
            ContextUsedInAnotherProcess: called in a process forked after start (its
                writer threads are not there: the write would wait for ever).
        """
        if os.getpid() != self._pid:
            check_process(self._pid, "the ledger writer")
        if self._stopping:
            raise WriterStopped("ledger writer is stopped")
        pending = _Pending()
        self._lane(write.task_id).queue.put((write, pending))
        result = pending.result()
        assert isinstance(result, CommitOutcome)
        return result

    def submit(self, write: TaskWrite, callback: WriteCallback) -> None:
        """Queue ``write`` without waiting; ``callback(outcome, error)`` runs in a writer
        thread once its transaction committed (or failed). A task's writes are applied in
        the order they were queued.

        Raises:
            WriterStopped: the writer was stopped.
            ContextUsedInAnotherProcess: called in a process forked after start.
        """
        if os.getpid() != self._pid:
            check_process(self._pid, "the ledger writer")
        if self._stopping:
            raise WriterStopped("ledger writer is stopped")
        self._lane(write.task_id).queue.put((write, callback))

    def poll(self) -> None:
        """Ask the writer to claim per its policy now (without waiting for the result):
        an idle writer thread if there is one."""
        lanes = self._lanes
        n = len(lanes)
        first = self._next_poll % n
        self._next_poll = first + 1
        for k in range(n):
            lane = lanes[(first + k) % n]
            if not lane.busy and lane.queue.empty():
                lane.queue.put(_POLL)
                return
        lanes[first].queue.put(_POLL)

    def sync(self) -> None:
        """Wait until everything queued (to any writer thread) before this call has been
        handled."""
        pendings = []
        for lane in self._lanes:
            pending = _Pending()
            lane.queue.put((_SYNC, pending))
            pendings.append(pending)
        for pending in pendings:
            pending.result()

    def stop(self) -> None:
        """Finish what is queued, then end the threads. A write queued after this call
        fails with :class:`WriterStopped`."""
        self._stopping = True
        for lane in self._lanes:
            lane.queue.put(_STOP)


class _Lane(threading.Thread):
    """One writer thread: its own queue, its own transactions."""

    def __init__(self, owner: LedgerWriter, index: int) -> None:
        # One name for every lane: hooks and profilers know "the writer thread" by it.
        super().__init__(name="ratchet-writer", daemon=True)
        self.index = index
        self._owner = owner
        self._ledger = owner._ledger
        self._max_batch = owner._max_batch
        self.queue: queue.SimpleQueue[_Item | _Poll | object] = queue.SimpleQueue()
        self.busy = False
        self.transactions = 0
        self.writes = 0
        self.last_claim_at = float("-inf")
        self._last_tx_s = 0.0  # seconds the last batch's transaction took
        self._last_finals = 0  # final writes it carried

    def run(self) -> None:
        stop = False
        get_nowait = self.queue.get_nowait
        while not stop:
            batch: list[_Item] = []
            poll = False
            item = self.queue.get()
            self.busy = True
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
            if batch and not stop:
                stop, polled = self._linger(batch)
                poll = poll or polled
            if batch or poll:
                t0 = time.monotonic()
                self._drain(batch, poll)
                writes = [w for w, _ in batch if isinstance(w, TaskWrite)]
                if writes:  # a sync or a poll alone says nothing about the load
                    self._last_tx_s = time.monotonic() - t0
                    self._last_finals = sum(1 for w in writes if w.transition is not None)
            self.busy = False
        # Queued after stop() (a race with its flag): never left waiting.
        while True:
            try:
                item = get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                what, cb = item
                if isinstance(what, _Sync):
                    _resolve(cb, [], None)
                else:
                    _resolve(cb, None, WriterStopped("ledger writer is stopped"))

    def _linger(self, batch: list[_Item]) -> tuple[bool, bool]:
        """Wait, bounded, for the final writes of tasks still running (see the module
        docstring), appending what arrives to ``batch``. Returns ``(stop, poll)``:
        :meth:`LedgerWriter.stop` was queued meanwhile (the batch is still committed), a
        poll was (the batch's claim is then forced, as the poll's own would be)."""
        policy = self._owner._policy
        if (policy is None or len(self._owner._lanes) != 1
                or self._last_finals < LINGER_MIN_FINALS):
            return False, False
        if any(isinstance(w, _Sync) for w, _ in batch):
            return False, False  # someone waits for what is queued: commit now
        finals = sum(1 for w, _ in batch if isinstance(w, TaskWrite) and w.transition)
        if finals == 0:
            return False, False
        try:
            expected = policy.unfinished() - finals
        except Exception:
            log.exception("ledger writer: claim policy failed")
            return False, False
        deadline = time.monotonic() + min(LINGER_MAX_S, LINGER_FRACTION * self._last_tx_s)
        polled = False
        while expected > 0:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            try:
                item = self.queue.get(timeout=wait)
            except queue.Empty:
                break
            if item is _STOP:
                return True, polled
            if item is _POLL:
                polled = True
                continue
            batch.append(item)  # type: ignore[arg-type]
            what = item[0]  # type: ignore[index]
            if isinstance(what, _Sync):
                break  # someone waits for what is queued: commit now
            if isinstance(what, TaskWrite) and what.transition is not None:
                expected -= 1
        return False, polled

    def _policy_limit(self, policy: ClaimPolicy, freed: int, forced: bool) -> int:
        try:
            return policy.limit(freed, forced)
        except Exception:
            log.exception("ledger writer: claim policy failed")
            return 0

    @staticmethod
    def _release(policy: ClaimPolicy, reserved: int, freed: int) -> None:
        try:
            policy.release(reserved, freed)
        except Exception:
            log.exception("ledger writer: claim policy release failed")

    @staticmethod
    def _claim_failed(policy: ClaimPolicy, error: BaseException) -> None:
        try:
            policy.claim_failed(error)
        except Exception:
            log.exception("ledger writer: claim policy claim_failed failed")

    def _dispatch(self, policy: ClaimPolicy, claims: list[Claim], t_sent: float,
                  reserved: int, freed: int) -> None:
        """Hand ``claims`` to the policy; end the reservation of ``reserved`` slots."""
        try:
            hooks = self._owner.hooks
            if hooks is not None:
                hooks.after_claim(claims)
        finally:
            if not claims:
                self._release(policy, reserved, freed)
            else:
                try:
                    policy.dispatch(claims, t_sent, reserved, freed)
                except Exception:
                    log.exception("ledger writer: dispatch of %d claims failed", len(claims))

    def _drain(self, batch: list[_Item], poll: bool) -> None:
        writes: list[_WriteItem] = [
            (item, cb) for item, cb in batch if isinstance(item, TaskWrite)
        ]
        syncs = [cb for item, cb in batch if isinstance(item, _Sync)]
        policy = self._owner._policy
        hooks = self._owner.hooks
        claimed_here = False
        corrupt = self._ledger.corruption
        if corrupt is not None and policy is not None:
            # Found by another call of this ledger (the registry, a renewal, a commit):
            # the claims here may read only pages that are still whole, but the ledger is
            # damaged all the same.
            self._claim_failed(policy, corrupt)
        while writes:
            chunk, writes = writes[: self._max_batch], writes[self._max_batch :]
            limit = freed = 0
            if policy is not None:
                freed = sum(1 for w, _ in chunk if w.transition is not None)
                limit = self._policy_limit(policy, freed, forced=poll and not claimed_here)
            if limit > 0:
                assert policy is not None
                t_sent = time.monotonic()
                self.last_claim_at = t_sent
                claimed_here = True
                try:
                    if hooks is not None:
                        hooks.before_claim(limit)
                        hooks.before_commit(len(chunk))
                    outcomes, claimed = self._ledger.commit_and_claim(
                        [w for w, _ in chunk], policy.holder, policy.names, limit,
                        policy.scope)
                except LedgerUnavailable as exc:
                    # Unreachable, or lost during COMMIT (outcome unknown): never apply
                    # these writes a second time; each task handles the failure.
                    self._release(policy, limit, freed)
                    self._claim_failed(policy, exc)
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, exc)
                    for _, cb in chunk:
                        _resolve(cb, None, exc)
                    continue
                except Exception as exc:
                    # Commit alone (below), so errors land where they belong.
                    self._release(policy, limit, freed)
                    self._claim_failed(policy, exc)
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, exc)
                    log.debug("commit_and_claim failed; committing without the claim",
                              exc_info=True)
                else:
                    if hooks is not None:
                        hooks.after_commit(len(chunk), time.monotonic() - t_sent, None)
                    self.transactions += 1
                    self.writes += len(chunk)
                    self._owner.claim_failures.succeeded()
                    self._dispatch(policy, claimed, t_sent, limit, freed)
                    for (_, cb), outcome in zip(chunk, outcomes, strict=True):
                        _resolve(cb, outcome, None)
                    continue
            self._commit_chunk(chunk)
        failures = self._owner.claim_failures
        if poll and not claimed_here and policy is not None and failures.ready():
            limit = self._policy_limit(policy, 0, forced=True)
            if limit > 0:
                t_sent = time.monotonic()
                self.last_claim_at = t_sent
                try:
                    if hooks is not None:
                        hooks.before_claim(limit)
                    claimed = self._ledger.claim(policy.holder, policy.names, limit,
                                                 policy.scope)
                except Exception as exc:  # keep the worker alive; the main loop polls again
                    self._release(policy, limit, 0)
                    if not isinstance(exc, LedgerCorrupt):  # never retried: the policy's
                        failures.failed(exc)  # polls skipped until the backoff has passed
                    self._claim_failed(policy, exc)
                else:
                    failures.succeeded()
                    self._dispatch(policy, claimed, t_sent, limit, 0)
        for cb in syncs:
            _resolve(cb, [], None)

    def _ledger_commit(self, writes: list[TaskWrite]) -> list[CommitOutcome]:
        """One :meth:`Ledger.commit` transaction, between the commit hooks."""
        hooks = self._owner.hooks
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
