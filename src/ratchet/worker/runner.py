"""The worker: claim → execute → fenced commit, with the whole lifecycle in one place.

Lifecycle of one task (each hook is a method on :class:`Worker` that does nothing but log
by default; subclasses add metrics or tracing there, not branches in the loop):

``on_claimed`` → task function runs (``ctx.step`` / ``ctx.effect``) → one of
``SUCCEEDED`` | ``RETRY_WAIT`` (transient/overload, attempts left) | ``FAILED``
(permanent, or attempts exhausted: dead-letter) | ``UNKNOWN`` (effect outcome not
established) | released to ``PENDING`` (graceful shutdown) | abandoned (lease lost or stale
generation: no write, another worker owns it) → ``on_finished``.

Execution model: a claim loop in the calling thread, task bodies in a thread pool, all
writes through one :class:`~ratchet.worker.writer.LedgerWriter` (group commit), leases
renewed by one :class:`~ratchet.worker.heartbeat.Heartbeat`. An ``async def`` runner would
replace only :meth:`Worker._run_body` with an event loop; the ledger, writer, heartbeat
and context protocol stay as they are.

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
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType

from .. import faults
from ..app import App, TaskDefinition
from ..errors import (
    EffectOutcomeUnknown,
    FenceError,
    LeaseLost,
    RatchetError,
    StaleGeneration,
)
from ..ledger.base import Claim, TaskWrite, Transition
from ..retry import FailureClass, classify, retry_after_s
from ..serde import dumps
from ..states import State
from .context import Shutdown, TaskContext
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
            running, wait this long (seconds) for more to finish before claiming.
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
        self._inflight = 0
        self._lock = threading.Lock()
        self._signals = 0

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
        subscription = self.ledger.subscribe(self._wake.set)
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="ratchet-task")
        idle_since = time.monotonic()
        try:
            while not self._stopping.is_set():
                with self._lock:
                    free = self.concurrency - self._inflight
                if 0 < free < self._claim_batch and free < self.concurrency:
                    # A few slots free while others still run: wait a moment for more to
                    # finish, so one claim (riding on their commit) fills several slots.
                    self._wake.wait(self.claim_linger_s)
                    self._wake.clear()
                    with self._lock:
                        free = self.concurrency - self._inflight
                if max_tasks is not None:
                    free = min(free, max_tasks - self.stats.claimed)
                    if free <= 0 and self._inflight == 0:
                        break
                claims: list[Claim] = []
                if free > 0:
                    t_sent = time.monotonic()
                    try:
                        claims = self.writer.claim(self.holder, self.names, free)
                    except Exception as exc:  # keep the worker alive; try again next poll
                        log.error("claim failed: %s", exc)
                    if claims:
                        faults.point("claim.after_commit")
                    for claim in claims:
                        handle = self.heartbeat.add(
                            claim.task_id, claim.generation, claim.lease_s, t_sent,
                            claim.lease_until - claim.ledger_now,
                        )
                        with self._lock:
                            self._inflight += 1
                        self.stats.claimed += 1
                        if claim.takeover:
                            self.stats.takeovers += 1
                        pool.submit(self._execute, claim, handle)
                if claims:
                    idle_since = time.monotonic()
                    if len(claims) == free:
                        continue
                elif idle_exit_s is not None and self._inflight == 0 and (
                    time.monotonic() - idle_since >= idle_exit_s
                ):
                    break
                self._wake.wait(self.poll_interval_s)
                self._wake.clear()
        finally:
            self._stopping.set()
            subscription.close()
            pool.shutdown(wait=True)
            if registrar is not None:
                registrar.stop(clean=True)
            self.heartbeat.stop()
            self.writer.stop()
            self.writer.join()
            self.heartbeat.join(timeout=5)
        return self.stats

    # ------------------------------------------------------------------ one task

    def _execute(self, claim: Claim, lease: LeaseHandle) -> None:
        outcome = "abandoned"
        try:
            self.on_claimed(claim)
            definition = self.app.definition(claim.name)
            ctx = TaskContext(claim, self.holder, self.writer, lease, self._stopping)
            outcome = self._run_body(definition, claim, ctx)
        except Exception:  # never let one task kill the worker
            log.exception("internal error while running task %s", claim.task_id)
        finally:
            self.heartbeat.remove(lease)
            self.stats.by_outcome[outcome] = self.stats.by_outcome.get(outcome, 0) + 1
            with self._lock:
                self._inflight -= 1
            self._wake.set()
            self.on_finished(claim, outcome)

    def _run_body(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext) -> str:
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
            self._finish(claim, Transition(State.PENDING, reason="lease_unconfirmed"))
            return "lease_lost"
        except FenceError:
            return "abandoned"
        except EffectOutcomeUnknown as exc:
            transition = Transition(
                State.UNKNOWN, error=_printable(str(exc)),
                error_class=FailureClass.UNKNOWN_OUTCOME.value, reason="effect outcome unknown",
            )
            self.on_failure(claim, transition)
        except Exception as exc:
            transition = self._failure_transition(definition, claim, exc, ctx.open_intents())
            self.on_failure(claim, transition)
        return self._finish(claim, transition)

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

    def _finish(self, claim: Claim, transition: Transition) -> str:
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{transition.to.value}",
            transition=transition,
        )
        try:
            outcome = self.writer.commit(write)
        except Exception as exc:
            log.error("task %s: final commit failed (%s); lease will expire", claim.task_id, exc)
            return "abandoned"
        if outcome.stale:
            self.stats.stale += 1
            return "stale"
        faults.point("task.after_complete")
        counters = {
            State.SUCCEEDED: "succeeded",
            State.RETRY_WAIT: "retried",
            State.FAILED: "failed",
            State.UNKNOWN: "unknown",
            State.PENDING: "released",
        }
        attr = counters.get(transition.to)
        if attr is not None:
            setattr(self.stats, attr, getattr(self.stats, attr) + 1)
        return transition.to.value
