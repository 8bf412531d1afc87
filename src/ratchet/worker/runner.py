"""The worker: claim → execute → fenced commit, with the whole lifecycle in one place.

Lifecycle of one task (each hook is a method on :class:`Worker` that does nothing but log
by default; subclasses add metrics or tracing there, not branches in the loop):

``on_claimed`` → task function runs (``ctx.step`` / ``ctx.effect``) → one of
``SUCCEEDED`` | ``RETRY_WAIT`` (transient/overload, attempts left) | ``FAILED``
(permanent, or attempts exhausted: dead-letter) | ``UNKNOWN`` (effect outcome not
established) | released to ``PENDING`` (graceful shutdown) | abandoned (lease lost or stale
generation: no write, another worker owns it) → ``on_finished``.

Execution model: all writes go through one :class:`~ratchet.worker.writer.LedgerWriter`
(group commit), which also claims: every transaction that commits writes claims as many
tasks as the worker has room for, counting the slots its own completions free (one fsync
for both). Claimed tasks go to a local queue served by long-lived task threads
(:class:`~ratchet.worker.executor.Executor`): a thread that finishes a task takes the next
one without sleeping, and more threads are woken only when work waits. A task's
completion is handed to the writer without waiting; the task keeps its lease (the
heartbeat renews it) and its slot in the concurrency limit until the completion has
committed, and ``on_finished`` fires once the outcome is known. The calling thread only
polls for work when idle, watches for stalled task threads and decides when to stop.
Leases are renewed by one :class:`~ratchet.worker.heartbeat.Heartbeat`. An ``async def``
runner would replace only :meth:`Worker._run_body` with an event loop; the ledger, writer,
heartbeat and context protocol stay as they are.

Signals: the first SIGTERM/SIGINT stops claiming; running tasks finish their current
step, then are released at the next step/effect boundary (their committed steps stay).
A second Ctrl-C (SIGINT) exits at once; repeated SIGTERMs (process managers, ``timeout``
signalling the whole group) change nothing. SIGKILL loses nothing: leases expire and are
taken over.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from .. import faults
from ..app import App, TaskDefinition
from ..errors import (
    EffectOutcomeUnknown,
    FenceError,
    LeaseLost,
    LedgerUnavailable,
    RatchetError,
    StaleGeneration,
)
from ..ledger.base import Claim, CommitOutcome, TaskWrite, Transition
from ..retry import FailureClass, classify, retry_after_s
from ..serde import dumps
from ..states import State
from .context import Shutdown, TaskContext
from .executor import Executor
from .heartbeat import Heartbeat, LeaseHandle
from .registry import Registrar
from .writer import LedgerWriter

__all__ = ["Worker", "WorkerStats", "default_holder"]

log = logging.getLogger("ratchet.worker")


def _printable(text: str) -> str:
    """``text`` with anything UTF-8 cannot encode (lone surrogates) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def default_holder() -> str:
    """``host:pid:random`` — unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


_STALL_S = 0.005
"""Queued tasks not picked up for this long (s) while task threads are busy: wake another."""


class _Policy:
    """The worker's claim policy as the writer sees it."""

    def __init__(self, worker: Worker) -> None:
        self.holder = worker.holder
        self.names = worker.names
        self._worker = worker

    def limit(self, freed: int, forced: bool) -> int:
        return self._worker._claim_limit(freed, forced)

    def dispatch(self, claims: list[Claim], t_sent: float) -> None:
        self._worker._dispatch(claims, t_sent)


@dataclass
class WorkerStats:
    """Counters of one worker process (since start)."""

    claimed: int = 0
    takeovers: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    released: int = 0
    stale: int = 0
    lease_lost: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


class Worker:
    """Runs tasks of an :class:`~ratchet.app.App` from its ledger.

    Args:
        app: the application (its registered tasks are the ones claimed).
        concurrency: task threads (>= 1).
        names: task names to claim; default all registered.
        poll_interval_s: sleep between claim attempts when idle, seconds.
        holder: worker identity; default ``host:pid:random``.
        max_batch: most task writes merged into one group commit.
        claim_linger_s: when fewer than a quarter of the slots are free but tasks are still
            running, claims wait for more slots to free (they ride on the commit of the
            completions that free them); after this long (seconds) without a claim the
            free slots are claimed anyway.
        fast_takeover: register in the ledger's worker registry and revoke the leases of
            same-host workers whose process is gone (:mod:`ratchet.worker.registry`).
    """

    def __init__(
        self,
        app: App,
        concurrency: int = 8,
        names: Sequence[str] | None = None,
        poll_interval_s: float = 0.1,
        holder: str | None = None,
        max_batch: int = 256,
        claim_linger_s: float = 0.002,
        fast_takeover: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.app = app
        self.concurrency = concurrency
        self.names = list(names) if names is not None else sorted(app.tasks)
        for name in self.names:
            app.definition(name)
        self.poll_interval_s = poll_interval_s
        self.claim_linger_s = claim_linger_s
        self.fast_takeover = fast_takeover
        self._claim_batch = max(1, concurrency // 4)
        self.holder = holder or default_holder()
        self.ledger = app.ledger
        self.writer = LedgerWriter(self.ledger, max_batch=max_batch)
        self.heartbeat = Heartbeat(self.ledger, self.holder)
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._inflight = 0  # claimed and not finished (incl. completions not yet committed)
        self._lock = threading.Lock()
        self._signals = 0
        self._max_tasks: int | None = None
        self._last_claimed_at = float("-inf")  # monotonic: last claim that returned work
        self._notified = False  # the ledger said work may be ready: poll now
        self._executor: Executor[tuple[Claim, LeaseHandle]] = Executor(
            concurrency, self._execute
        )

    # ------------------------------------------------------------------ hooks

    def on_claimed(self, claim: Claim) -> None:
        """Hook: a task was claimed (before its body runs)."""
        log.debug(
            "claimed %s %s gen=%d attempt=%d%s", claim.name, claim.task_id, claim.generation,
            claim.attempt, f" takeover from {claim.previous_holder}" if claim.takeover else "",
        )

    def on_finished(self, claim: Claim, outcome: str) -> None:
        """Hook: the worker is done with a claim; ``outcome`` is the state written or
        ``"stale"`` / ``"lease_lost"`` / ``"abandoned"``."""
        log.debug("finished %s %s gen=%d: %s", claim.name, claim.task_id, claim.generation, outcome)

    def on_failure(self, claim: Claim, transition: Transition) -> None:
        """Hook: a task is about to be retried, dead-lettered or parked as UNKNOWN.

        Logs one WARNING line (ERROR for FAILED / UNKNOWN) with the task, the attempt and
        the last line of the error; the full traceback at DEBUG.
        """
        error = (transition.error or "").strip()
        last = error.splitlines()[-1] if error else ""
        level = logging.WARNING if transition.to is State.RETRY_WAIT else logging.ERROR
        extra = f" in {transition.delay_s:.2f} s" if transition.to is State.RETRY_WAIT else ""
        log.log(
            level, "task %s %s gen=%d attempt %d/%d -> %s%s (%s): %s", claim.name,
            claim.task_id, claim.generation, claim.attempt, claim.max_attempts,
            transition.to.value, extra, transition.reason or transition.error_class, last,
        )
        if error and log.isEnabledFor(logging.DEBUG):
            log.debug("task %s traceback:\n%s", claim.task_id, error)

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running tasks are released at their next boundary."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            if signum == signal.SIGINT:
                log.warning("second Ctrl-C: exiting now (leases will expire and be taken over)")
                os._exit(1)
            log.info("signal %d: already stopping", signum)
            return
        log.info("signal %d: stop claiming, release running tasks at their next step", signum)
        # Only the stopping flag, never self._wake: the handler runs on the main thread,
        # which may be inside self._wake.wait()/clear() holding the Event's (non-reentrant)
        # lock; setting _wake here would deadlock the worker on its own SIGTERM. Nothing
        # waits on _stopping, and every wait of the main loop is bounded (poll interval).
        self._stopping.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully (main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    # ------------------------------------------------------------------ main loop

    def run(self, max_tasks: int | None = None, idle_exit_s: float | None = None) -> WorkerStats:
        """Claim and run tasks until stopped.

        Args:
            max_tasks: stop after this many claims (tests, benchmarks).
            idle_exit_s: stop after this many seconds without claimable work.

        Returns:
            The worker's counters.
        """
        self._max_tasks = max_tasks
        self.writer.set_claim_policy(_Policy(self))
        self.writer.start()
        self.heartbeat.start()
        registrar: Registrar | None = None
        if self.fast_takeover:
            registrar = Registrar(self.ledger, self.holder)
            try:
                registrar.register()
            except RatchetError as exc:  # the registrar thread tries again
                log.warning("worker registry: %s", exc)
            registrar.start()
        # Wake the claim loop as soon as the ledger says work may be ready (PostgreSQL
        # LISTEN/NOTIFY); the poll interval stays the fallback.
        subscription = self.ledger.subscribe(self._on_notify)
        idle_since = time.monotonic()
        last_poll = float("-inf")
        linger = max(self.claim_linger_s, 0.0)
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                inflight = self._inflight
                if max_tasks is not None and self.stats.claimed >= max_tasks and inflight == 0:
                    break
                idle_since = max(idle_since, self._last_claimed_at)
                if idle_exit_s is not None and inflight == 0 and now - idle_since >= idle_exit_s:
                    break
                # Busy: claims ride on the writer's commits. Poll only when nothing was
                # tried for a while (idle, or a few slots free while long tasks run).
                wait_s = self.poll_interval_s
                if self._claim_limit(0, forced=True) > 0:
                    last_try = max(self.writer.last_claim_at, last_poll)
                    due = last_try + (
                        linger if 0 < inflight < self.concurrency else self.poll_interval_s
                    )
                    if self._notified or now >= due:
                        self._notified = False
                        self.writer.poll()
                        last_poll = now
                    else:
                        wait_s = min(wait_s, due - now)
                if self._executor.check_stalled(_STALL_S):
                    wait_s = min(wait_s, _STALL_S)
                self._wake.wait(max(wait_s, 0.0005))
                self._wake.clear()
        finally:
            self._stopping.set()
            subscription.close()
            try:
                self.writer.sync()  # a claim in progress has been handed to the executor
            finally:
                self._executor.shutdown()  # every body ran; final writes are queued
                self.writer.stop()
                self.writer.join()  # final writes committed, on_finished fired
                if registrar is not None:
                    registrar.stop(clean=True)
                self.heartbeat.stop()
                self.heartbeat.join(timeout=5)
        return self.stats

    def _on_notify(self) -> None:
        """The ledger says work may be ready (e.g. PostgreSQL NOTIFY): poll now."""
        self._notified = True
        self._wake.set()

    # ------------------------------------------------------------------ claims

    def _claim_limit(self, freed: int, forced: bool) -> int:
        """How many tasks to claim now (writer thread); ``freed``: completions in the
        transaction being built, whose slots are free once it commits."""
        if self._stopping.is_set():
            return 0
        inflight = self._inflight
        free = self.concurrency - inflight + freed
        if self._max_tasks is not None:
            free = min(free, self._max_tasks - self.stats.claimed)
        if free <= 0:
            return 0
        if not forced and free < self._claim_batch and inflight > freed:
            return 0  # let more finish: one bigger claim instead of many small ones
        return free

    def _dispatch(self, claims: list[Claim], t_sent: float) -> None:
        """Claims committed (writer thread): track their leases, queue them for threads."""
        faults.point("claim.after_commit")
        handles = self.heartbeat.add_many(
            [
                (c.task_id, c.generation, c.lease_s, t_sent, c.lease_until - c.ledger_now)
                for c in claims
            ]
        )
        with self._lock:
            self._inflight += len(claims)
        self.stats.claimed += len(claims)
        self.stats.takeovers += sum(1 for c in claims if c.takeover)
        self._last_claimed_at = time.monotonic()
        self._executor.push(zip(claims, handles, strict=True))

    # ------------------------------------------------------------------ one task

    def _execute(self, item: tuple[Claim, LeaseHandle]) -> None:
        claim, lease = item
        outcome: str | None = "abandoned"
        try:
            self.on_claimed(claim)
            definition = self.app.definition(claim.name)
            ctx = TaskContext(
                claim, self.holder, self.writer, lease, self._stopping,
                on_block=self._executor.blocking,
            )
            outcome = self._run_body(definition, claim, ctx)
        except Exception:  # never let one task kill the worker
            log.exception("internal error while running task %s", claim.task_id)
            outcome = "abandoned"
        if outcome is not None:  # None: a final write is on its way to the ledger
            self._done(claim, lease, outcome)

    def _done(self, claim: Claim, lease: LeaseHandle, outcome: str) -> None:
        """The worker is done with ``claim``: free its lease and slot, fire on_finished."""
        try:
            self.heartbeat.remove(lease)
            with self._lock:
                self.stats.by_outcome[outcome] = self.stats.by_outcome.get(outcome, 0) + 1
                self._inflight -= 1
                idle = self._inflight == 0
            if idle:
                self._wake.set()
        finally:
            self.on_finished(claim, outcome)

    def _run_body(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext) -> str | None:
        """Run the task function; return its outcome, or None when the final write was
        handed to the writer (the outcome is reported when it commits)."""
        try:
            result = definition.fn(ctx, **ctx.params)
            transition = Transition(
                State.SUCCEEDED, result_json=dumps(result, what=f"result of task {claim.name!r}")
            )
        except Shutdown:
            transition = Transition(State.PENDING, reason="shutdown")
        except StaleGeneration:
            self.stats.stale += 1
            return "stale"
        except LeaseLost as exc:
            self.stats.lease_lost += 1
            log.warning("task %s: %s", claim.task_id, exc)
            # A fenced release is still safe: if our generation is current it frees the task
            # now instead of after expiry; if not, the ledger rejects it.
            return self._finish(
                claim, ctx, Transition(State.PENDING, reason="lease_unconfirmed"), "lease_lost"
            )
        except FenceError:
            return "abandoned"
        except EffectOutcomeUnknown as exc:
            transition = Transition(
                State.UNKNOWN, error=_printable(str(exc)),
                error_class=FailureClass.UNKNOWN_OUTCOME.value, reason="effect outcome unknown",
            )
            self.on_failure(claim, transition)
        except LedgerUnavailable as exc:
            # Not the task's fault: hand the attempt back (release to PENDING, after a
            # pause) instead of spending the retry budget on a database outage.
            transition = Transition(
                State.PENDING, delay_s=1.0, error=_printable(str(exc)),
                error_class="ledger_unavailable", reason="ledger unavailable",
            )
            self.on_failure(claim, transition)
        except Exception as exc:
            transition = self._failure_transition(definition, claim, exc, ctx.open_intents())
            self.on_failure(claim, transition)
        return self._finish(claim, ctx, transition)

    def _failure_transition(
        self, definition: TaskDefinition, claim: Claim, exc: Exception, open_intents: list[str]
    ) -> Transition:
        failure = classify(exc)
        error = _printable("".join(traceback.format_exception(exc, limit=-6))[-4000:])
        if failure is FailureClass.PERMANENT or claim.attempt >= claim.max_attempts:
            reason = "permanent" if failure is FailureClass.PERMANENT else "attempts exhausted"
            if open_intents:
                # The call may have happened: a dead-letter would hide a possible charge.
                return Transition(
                    State.UNKNOWN, error=error, error_class=failure.value,
                    reason=f"{reason} with open effect intent(s) {', '.join(open_intents)}",
                )
            return Transition(State.FAILED, error=error, error_class=failure.value, reason=reason)
        delay = definition.retry.backoff_s(claim.attempt, failure, retry_after_s(exc))
        return Transition(
            State.RETRY_WAIT, delay_s=delay, error=error, error_class=failure.value, reason="retry"
        )

    def _finish(
        self, claim: Claim, ctx: TaskContext, transition: Transition, label: str | None = None
    ) -> str | None:
        """Hand the final write (with the steps not yet durable) to the writer, without
        waiting. The lease and the slot stay held until it commits; then
        :meth:`_finished` reports the outcome (``label`` overrides its name)."""
        steps = ctx.unsaved_steps()
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{transition.to.value}",
            steps=steps, transition=transition,
        )
        lease = ctx.lease
        first_failure: list[float] = []

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is None and isinstance(error, LedgerUnavailable) and not lease.lost:
                # The ledger is unreachable (or the reply to COMMIT was lost): send the same
                # write again while the lease lasts. Re-sending is safe — every write is
                # fenced, and a transition already applied at this generation is
                # acknowledged, not applied twice. Once the lease is gone, the write will
                # be stale anyway and the task belongs to its next holder.
                now = time.monotonic()
                first_failure.append(now)
                if now - first_failure[0] < claim.lease_s:
                    delay = min(1.0, 0.05 * 2 ** min(len(first_failure), 5))
                    log.warning("task %s: final commit failed (%s); sending it again in %.2f s",
                                claim.task_id, error, delay)
                    timer = threading.Timer(delay, self._resend, (write, done))
                    timer.daemon = True
                    timer.start()
                    return
            self._finished(claim, lease, ctx, steps, transition, label, outcome, error)

        try:
            self.writer.submit(write, done)
        except Exception as exc:
            log.error("task %s: final commit failed (%s); lease will expire", claim.task_id, exc)
            return "abandoned"
        return None

    def _resend(
        self, write: TaskWrite,
        done: Callable[[CommitOutcome | None, BaseException | None], None],
    ) -> None:
        try:
            self.writer.submit(write, done)
        except Exception as exc:  # writer stopped: report the failure as it is
            done(None, exc)

    def _finished(
        self,
        claim: Claim,
        lease: LeaseHandle,
        ctx: TaskContext,
        steps: list[tuple[str, str]],
        transition: Transition,
        label: str | None,
        outcome: CommitOutcome | None,
        error: BaseException | None,
    ) -> None:
        """The final write's outcome is known (writer thread)."""
        result = "abandoned"
        try:
            if outcome is None:
                log.error("task %s: final commit failed (%s); lease will expire",
                          claim.task_id, error)
            elif outcome.stale:
                self.stats.stale += 1
                result = "stale"
            else:
                ctx.steps_saved(steps)
                faults.point("task.after_complete")
                attr = _COUNTERS.get(transition.to)
                if attr is not None:
                    setattr(self.stats, attr, getattr(self.stats, attr) + 1)
                result = transition.to.value
        finally:
            self._done(claim, lease, label or result)


_COUNTERS = {
    State.SUCCEEDED: "succeeded",
    State.RETRY_WAIT: "retried",
    State.FAILED: "failed",
    State.UNKNOWN: "unknown",
    State.PENDING: "released",
}
