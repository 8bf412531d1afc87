"""What every part of the worker shares: its state, the decision after a failed attempt
(:meth:`~WorkerCore._failure_transition`: retry, dead-letter or ``UNKNOWN``) and freeing
a finished task's slot (:meth:`~WorkerCore._done`). The per-task hooks a subclass may
override (``on_claimed``, ``on_finished``, ``on_failure``) and ``stop`` are defined here,
where the layers that call them find them.

The :class:`~ratchet.worker.runner.Worker` is built in layers, each a module with one
job, each class extending the one below: this core; claim slots
(:mod:`ratchet.worker.slots`); final writes (:mod:`ratchet.worker.finalwrite`); one
attempt and how its body can end (:mod:`ratchet.worker.attempt`); attempts ended without
their thread (:mod:`ratchet.worker.ended`: time limits, the shutdown grace); the loop and
signals (:mod:`ratchet.worker.runner`). The attributes are declared here and set by
``Worker.__init__``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from ..app import App, TaskDefinition
from ..errortext import bounded, error_message, error_summary, error_traceback
from ..fingerprint import of_exception
from ..ledger.base import Claim, ClaimScope, Ledger, Transition
from ..outcome import AttemptFacts, Happened, decide
from ..retry import TIME_LIMIT, FailureClass, classify, downstream_unreachable, retry_after_s
from ..states import State
from .asyncrun import AsyncRunner
from .backoff import RepeatedFailure
from .executor import Executor
from .heartbeat import Heartbeat, LeaseHandle
from .hooks import Hooks
from .startcheck import StartCheck
from .stats import WorkerStats
from .timelimit import Attempts
from .writer import LedgerWriter

__all__ = ["UNDECODABLE", "WRITE_REJECTED", "WorkerCore"]

log = logging.getLogger("ratchet.worker")

UNDECODABLE = "undecodable"
"""``error_class`` of a task failed because a value stored for it (params, a step value, an
effect result) cannot be decoded (:class:`~ratchet.errors.UndecodableData`)."""

WRITE_REJECTED = "write_rejected"
"""``error_class`` of a task failed because the database refused one of its writes."""


class WorkerCore:
    """The worker's shared state and the methods every layer uses (see the module
    docstring); :class:`~ratchet.worker.runner.Worker` is the class to use."""

    app: App
    ledger: Ledger
    holder: str
    kinds: list[tuple[str, int]]
    claim_scope: ClaimScope
    concurrency: int
    max_stuck_threads: int
    overload_floor_s: float | None
    stop_reason: str | None
    stats: WorkerStats
    writer: LedgerWriter
    heartbeat: Heartbeat
    final_commit_failures: RepeatedFailure
    _hooks: Hooks | None
    _start_check: StartCheck
    _stopping: threading.Event
    _wake: threading.Event
    _lock: threading.Lock
    _capacity: int
    _claim_batch: int
    _inflight: int
    _reserved: int
    _reserved_room: int
    _max_tasks: int | None
    _last_claimed_at: float
    _executor: Executor[tuple[Claim, LeaseHandle]]
    _async: AsyncRunner[tuple[Claim, LeaseHandle]] | None
    _run_slots: int
    _attempts: Attempts
    _stop_began: float | None
    _pid: int

    # The per-task hooks a subclass (or a user's Worker subclass) may override, and stop.

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
        the error's type and message (its first line); the traceback at DEBUG.
        """
        summary = error_summary(transition.error)
        level = logging.WARNING if transition.to is State.RETRY_WAIT else logging.ERROR
        extra = f" in {transition.delay_s:.2f} s" if transition.to is State.RETRY_WAIT else ""
        log.log(
            level, "task %s %s gen=%d attempt %d/%d -> %s%s (%s): %s", claim.name,
            claim.task_id, claim.generation, claim.attempt, claim.max_attempts,
            transition.to.value, extra, transition.reason or transition.error_class, summary,
        )
        if log.isEnabledFor(logging.DEBUG) and (transition.traceback or transition.error):
            log.debug("task %s error:\n%s\n%s", claim.task_id, transition.error or "",
                      transition.traceback or "")

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running tasks are released at their next boundary, or their
        leases handed back when the shutdown grace ends (``shutdown_grace_s``)."""
        if self._stop_began is None:
            self._stop_began = time.monotonic()
        self._stopping.set()
        self._wake.set()

    def _done(
        self, claim: Claim, lease: LeaseHandle, outcome: str,
        exception: BaseException | None = None,
    ) -> None:
        """The worker is done with ``claim``: free its lease and slot, fire on_finished."""
        try:
            self.heartbeat.remove(lease)
            self.stats.add_outcome(outcome)
            with self._lock:
                self._inflight -= 1
                idle = self._inflight == 0
            if idle:
                self._wake.set()
        finally:
            try:
                self.on_finished(claim, outcome)
            finally:
                if self._hooks is not None:
                    self._hooks.after_attempt(claim, outcome, exception)

    def _failure_transition(
        self,
        definition: TaskDefinition,
        claim: Claim,
        exc: BaseException,
        open_intents: list[str],
        *,
        failure: FailureClass | None = None,
        error_class: str | None = None,
        error: str | None = None,
        trace: str | None = None,
    ) -> Transition:
        """The transition after the body raised ``exc``, as the outcome table says
        (:func:`ratchet.outcome.decide`, the worker's half): ``RETRY_WAIT`` while attempts
        remain for a retryable failure, else ``FAILED`` (``UNKNOWN`` while an effect's
        intent is open); the ledger completes it. ``failure`` overrides :func:`classify`;
        ``error_class`` the class recorded (default the failure class); ``error`` the
        recorded message (default :func:`~ratchet.errortext.error_message`: ``Type:
        message``) and ``trace`` its traceback (default
        :func:`~ratchet.errortext.error_traceback`), kept apart."""
        if failure is None:
            failure = classify(exc)
        recorded_class = error_class or failure.value
        error = bounded(error) if error is not None else error_message(exc)
        if trace is None:
            trace = error_traceback(exc)
        # Quarantine (DESIGN §7): the ledger counts the fingerprint of failures that say
        # something about the task; overload, unknown outcomes and an unreachable
        # downstream are about the downstream.
        fp = (of_exception(claim.name, exc)
              if failure in (FailureClass.TRANSIENT, FailureClass.PERMANENT)
              and not downstream_unreachable(exc) else None)
        # Where it ends is the outcome table's (the worker's half; the ledger completes it).
        facts = AttemptFacts(
            Happened.TIME_LIMIT if error_class == TIME_LIMIT else Happened.RAISED,
            failure=failure, error_class=recorded_class, attempt=claim.attempt,
            max_attempts=claim.max_attempts, intent_open=bool(open_intents))
        ending = decide(facts)
        if ending.state is State.RETRY_WAIT:  # the backoff draws only for a retry
            ending = decide(dataclasses.replace(facts, delay_s=definition.retry.backoff_s(
                claim.attempt, failure, retry_after_s(exc),
                overload_floor_s=self.overload_floor_s)))
            return Transition(
                State.RETRY_WAIT, delay_s=ending.run_at or 0.0, error=error,
                error_class=ending.error_class, reason="retry", fingerprint=fp, traceback=trace,
            )
        reason = "permanent" if failure is FailureClass.PERMANENT else "attempts exhausted"
        if ending.state is State.UNKNOWN:
            # The call may have happened: a dead-letter would hide a possible charge.
            reason = f"{reason} with open effect intent(s) {', '.join(open_intents)}"
        return Transition(ending.state, error=error, error_class=ending.error_class,
                          reason=reason, fingerprint=fp, traceback=trace)

