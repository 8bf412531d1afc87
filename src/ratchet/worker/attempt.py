"""One attempt: build its context, start its body only when it may start, and turn
every way the body can end into an outcome (the exception ladder of
:meth:`AttemptLadder._run_body`).

How a task body can end, and what is recorded (DESIGN §7): a return is ``SUCCEEDED``; an
``Exception`` is classified by :func:`~ratchet.retry.classify`. Every other
``BaseException`` raised by task code also ends the attempt with a recorded outcome, the
lease released and the slot freed, and the worker keeps running: ``SystemExit`` (e.g.
argparse on bad arguments) and ``KeyboardInterrupt`` are permanent failures with
``error_class`` ``"system_exit"`` / ``"keyboard_interrupt"`` (running again cannot
change them); any other ``BaseException`` (``GeneratorExit``, a custom one) is transient.
The worker's own :class:`~ratchet.worker.context.Shutdown` is the exception: it releases
the task to ``PENDING`` at a step boundary. Params, step values or effect results that
cannot be decoded fail the task permanently (``error_class`` ``"undecodable"``), and a
write the database refuses (:class:`~ratchet.errors.WriteRejected`) fails it permanently
(``"write_rejected"``). As everywhere, a failure while an effect's intent is open goes to
``UNKNOWN`` instead of ``FAILED``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import Any

from ..app import TaskDefinition
from ..errors import (
    CircuitOpen,
    EffectOutcomeUnknown,
    FenceError,
    LeaseLost,
    LedgerUnavailable,
    StaleGeneration,
    TokenRejected,
    UndecodableData,
    WriteRejected,
)
from ..errortext import error_message, error_traceback
from ..ledger.base import Claim, Transition
from ..retry import FailureClass
from ..serde import dumps
from ..states import State
from .batches import run_shard_job
from .checkpoints import HistoryEnd
from .context import ControlInterrupt, Shutdown, TaskContext
from .core import UNDECODABLE, WRITE_REJECTED
from .finalwrite import FinalWrites
from .forks import exit_forked_child
from .heartbeat import LeaseHandle
from .ratewait import RateWait
from .timelimit import Attempt
from .waits import Suspend

__all__ = ["AttemptLadder", "compensations", "replay_ended"]

log = logging.getLogger("ratchet.worker")

_BASE_EXCEPTION_CLASSES: dict[type[BaseException], str] = {
    SystemExit: "system_exit",
    KeyboardInterrupt: "keyboard_interrupt",
}
"""``BaseException`` types raised by task code that fail the task permanently, with the
``error_class`` recorded. Any other ``BaseException`` from task code is transient."""



_PASSES_THROUGH: tuple[type[BaseException], ...] = (
    LeaseLost, StaleGeneration, LedgerUnavailable, WriteRejected, FenceError, TokenRejected,
    EffectOutcomeUnknown, UndecodableData, CircuitOpen, RateWait)
"""Errors of the worker's own machinery that end a compensation replay as they end any
attempt (not the body's failure being replayed)."""


class AttemptLadder(FinalWrites):
    """Runs one claimed task's attempt (see the module docstring)."""

    def _execute(self, item: tuple[Claim, LeaseHandle]) -> None:
        claim, lease = item
        outcome: str | None = "abandoned"
        ctx: TaskContext | None = None
        attempt: Attempt | None = None
        try:
            definition, ctx, attempt = self._begin(claim, lease, TaskContext,
                                                   self._executor.blocking)
            outcome = self._run_body(definition, claim, ctx)
        except BaseException:  # never let one task kill the worker or leak its slot
            log.exception("internal error while running task %s", claim.task_id)
            outcome = "abandoned"
        self._end(claim, lease, attempt, ctx, outcome)

    def _begin(
        self, claim: Claim, lease: LeaseHandle, context: type[TaskContext],
        on_block: Callable[[], None] | None,
    ) -> tuple[TaskDefinition, TaskContext, Attempt]:
        """The start of an attempt, for sync and async bodies alike: the hooks, its
        definition, its context (of class ``context``) and its registration (the time
        limit runs from here)."""
        hooks = self._hooks
        self.on_claimed(claim)
        if hooks is not None:
            hooks.before_attempt(claim)
        definition = self.app.definition(claim.name, claim.version)
        ctx = context(claim, self.holder, self.writer, lease, self._stopping,
                      on_block=on_block, hooks=hooks)
        attempt = self._attempts.begin(claim, lease, ctx, definition.time_limit_s)
        ctx.breakers = self.app.breakers
        ctx.downstream_rates = self.app.downstream_rates
        ctx.lookups = self.app.lookups
        ctx.app = self.app
        return definition, ctx, attempt

    def _end(self, claim: Claim, lease: LeaseHandle, attempt: Attempt | None,
             ctx: TaskContext | None, outcome: str | None) -> None:
        """Report ``outcome`` (None: a final write is on its way to the ledger and reports
        it when it commits), unless the attempt was ended without its body."""
        if outcome is not None:
            if attempt is None or self._attempts.end(claim):
                self._done(claim, lease, outcome, ctx.exception if ctx is not None else None)
            else:  # ended at its time limit or the shutdown grace: not ours any more
                self._stuck_returned(claim, None)

    def _start(self, ctx: TaskContext) -> dict[str, Any]:
        """The checks before a body starts (blocking: a sync body's thread, or a thread
        of the event loop's executor); returns the decoded params.

        Raises:
            Shutdown: the worker is stopping (claimed, perhaps prefetched, not started).
            ControlInterrupt: an operator asked for the task meanwhile.
            LedgerUnavailable, LeaseLost, UndecodableData: the task cannot start.
        """
        if self._stopping.is_set():
            raise Shutdown()  # claimed (perhaps prefetched), not started: release it
        # A prefetched task may have waited: start it only under a confirmed lease,
        # and not at all if an operator has asked for it meanwhile (cancel, pause),
        # as known from a read of the requests at most START_CHECK_S old.
        try:
            self._start_check.ensure(ctx.lease)
        except LedgerUnavailable as exc:
            ctx.ledger_outage = exc  # not the task's fault: hand the attempt back
            raise
        ctx.check_control()
        ctx.ensure_lease()
        return ctx.load_params()

    def _run_body(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext) -> str | None:
        """Run the task function; return its outcome, or None when the final write was
        handed to the writer (the outcome is reported when it commits)."""
        try:
            params = self._start(ctx)
            if ctx.compensation_mode:
                result = _compensate(definition, ctx, params)
            elif ctx.shard_job is not None:
                result = run_shard_job(ctx, definition.name, params, ctx.shard_job)
            else:
                result = definition.fn(ctx, **params)
        except BaseException as exc:
            return self._conclude(definition, claim, ctx, None, exc)
        return self._conclude(definition, claim, ctx, result, None)

    def _conclude(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext,
                  result: Any, error: BaseException | None) -> str | None:
        """How the body ended (its ``result``, or the ``error`` it raised, its start
        checks included) turned into an outcome, for sync and async bodies alike: the
        transition, handed to the writer (None returned: the outcome is reported when it
        commits), or the outcome itself.

        Every way the body can end is turned into an outcome here (see the module
        docstring for the classification of ``BaseException``)."""
        try:
            try:
                if error is not None:
                    raise error
            except BaseException as exc:
                if os.getpid() != self._pid:  # a child the task forked: not a worker
                    exit_forked_child(claim.task_id, exc)
                if self._attempts.is_running(claim):
                    raise
                self._stuck_returned(claim, None)  # ended without us: nothing to say
                return None
            if os.getpid() != self._pid:
                exit_forked_child(claim.task_id, None)
            if not self._attempts.is_running(claim):
                self._stuck_returned(claim, (ctx, result))
                return None
            transition = Transition(
                State.COMPENSATED if ctx.compensation_mode else State.SUCCEEDED,
                result_json=dumps(result, what=f"result of task {claim.name!r}"),
                reason="compensations done" if ctx.compensation_mode else None,
            )
        except Suspend as exc:
            # A durable wait (DESIGN §3, waits): park the task; the lease and the slot go,
            # the attempt is handed back, the ledger wakes it.
            transition = Transition(State.WAITING, run_at=exc.until, wait=exc.wait,
                                    reason=exc.reason)
        except Shutdown:
            transition = Transition(State.PENDING, reason="shutdown")
        except ControlInterrupt as exc:
            # An operator's request reached a boundary (DESIGN §3, arbitration): the
            # pipelined checkpoints ride on this fenced write; a pause hands the attempt
            # back (the engine's transition does it for PAUSED as for a release).
            if exc.request == "cancel":
                transition = Transition(State.CANCELLED, error_class="cancelled",
                                        reason="cancel requested by an operator")
            else:
                transition = Transition(State.PAUSED, error_class="paused",
                                        reason="pause requested by an operator")
        except CircuitOpen as exc:
            # The downstream's breaker is open: nothing was sent. Hand the attempt back and
            # wait until it may probe, instead of spending a retry on it (DESIGN §7).
            ctx.exception = exc
            transition = Transition(
                State.PENDING, delay_s=exc.retry_after_s or 0.0, error=error_message(exc),
                error_class="circuit_open", reason=f"circuit open toward {exc.downstream}",
            )
        except RateWait as exc:
            # The downstream's rate limit has no token now: nothing was sent. Hand the
            # attempt back until its bucket holds one (DESIGN §8, flow control).
            transition = Transition(
                State.PENDING, delay_s=exc.wait_s, flow_wait="rate",
                reason=f"rate limit of downstream {exc.downstream}")
        except (StaleGeneration, TokenRejected) as exc:
            # TokenRejected: the target saw a newer claim's fencing token, so a newer
            # generation exists; like a fenced-out write, nothing of ours counts.
            ctx.exception = exc
            self.stats.add("stale")
            return "stale"
        except LeaseLost as exc:
            ctx.exception = exc
            self.stats.add("lease_lost")
            log.warning("task %s: %s", claim.task_id, exc)
            # A fenced release is still safe: if our generation is current it frees the task
            # now instead of after expiry; if not, the ledger rejects it.
            return self._finish(
                claim, ctx, Transition(State.PENDING, reason="lease_unconfirmed"), "lease_lost"
            )
        except FenceError as exc:
            ctx.exception = exc
            return "abandoned"
        except EffectOutcomeUnknown as exc:
            ctx.exception = exc
            transition = Transition(
                State.UNKNOWN, error=error_message(exc), traceback=error_traceback(exc),
                error_class=FailureClass.UNKNOWN_OUTCOME.value, reason="effect outcome unknown",
            )
            self.on_failure(claim, transition)
        except LedgerUnavailable as exc:
            ctx.exception = exc
            if ctx.ledger_outage is exc:
                # The worker's own ledger is unreachable: not the task's fault. Hand the
                # attempt back (release to PENDING, after a pause) instead of spending the
                # retry budget on a database outage.
                transition = Transition(
                    State.PENDING, delay_s=1.0, error=error_message(exc),
                    error_class="ledger_unavailable", reason="ledger unavailable",
                )
            else:
                # Raised by the task's own code (another App, another ledger): an ordinary
                # failure that spends attempts like any other, so it ends.
                transition = self._ending(definition, claim, ctx, exc)
            self.on_failure(claim, transition)
        except UndecodableData as exc:
            # Stored data of this task cannot be read back: running again reads the same.
            ctx.exception = exc
            transition = self._ending(definition, claim, ctx, exc,
                                      failure=FailureClass.PERMANENT, error_class=UNDECODABLE)
            self.on_failure(claim, transition)
        except WriteRejected as exc:
            # The database refused one of this task's writes for its content: sending it
            # again cannot help. The failure write must not carry the refused steps.
            ctx.exception = exc
            ctx.discard_unsaved_steps()
            transition = self._ending(definition, claim, ctx, exc,
                                      failure=FailureClass.PERMANENT,
                                      error_class=WRITE_REJECTED)
            self.on_failure(claim, transition)
        except Exception as exc:
            ctx.exception = exc
            transition = self._ending(definition, claim, ctx, exc)
            self.on_failure(claim, transition)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit, custom
            ctx.exception = exc
            base_class = next(
                (c for t, c in _BASE_EXCEPTION_CLASSES.items() if isinstance(exc, t)), None
            )
            transition = self._ending(
                definition, claim, ctx, exc,
                failure=FailureClass.TRANSIENT if base_class is None else FailureClass.PERMANENT,
                error_class=base_class)
            self.on_failure(claim, transition)
        return self._finish(claim, ctx, transition)

    def _ending(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext,
                exc: BaseException, failure: FailureClass | None = None,
                error_class: str | None = None) -> Transition:
        """Where a failed attempt ends (the outcome table, through
        :meth:`~ratchet.worker.core.WorkerCore._failure_transition`), and, when that is
        ``FAILED`` with completed effects to undo, ``COMPENSATING`` instead (DESIGN §5,
        compensation): the final write carries the marker that puts the next claim's
        holder in compensation mode. A failure of the compensations themselves ends
        ``FAILED``."""
        transition = self._failure_transition(definition, claim, exc, ctx.open_intents(),
                                              failure=failure, error_class=error_class)
        if (transition.to is State.FAILED and ctx.compensations_found
                and not ctx.compensation_mode):
            ctx.mark_compensating()
            transition = dataclasses.replace(
                transition, to=State.COMPENSATING, delay_s=0.0,
                reason=f"{transition.reason or transition.error_class or 'failed'}; "
                       f"compensating {len(ctx.compensations_found)} effect(s)")
        return transition


def _compensate(definition: TaskDefinition, ctx: TaskContext, params: dict[str, Any]) -> Any:
    """Compensation mode (:mod:`ratchet.worker.waits`): replay the body over its recorded
    history until a checkpoint it lacks or the body's own failure, then run the
    compensations its completed effects registered, in reverse order. Returns what they
    returned (the task's result when it ends ``COMPENSATED``)."""
    try:
        definition.fn(ctx, **params)
    except BaseException as exc:
        replay_ended(ctx, exc)
    return compensations(ctx)


def replay_ended(ctx: TaskContext, exc: BaseException) -> None:
    """A compensation replay raised ``exc``: return when that ends the replay (a
    checkpoint its history lacks, or the body's own failure replayed); re-raise it when
    it ends the attempt (the worker's machinery, a ``BaseException``)."""
    if isinstance(exc, HistoryEnd):
        return
    if isinstance(exc, _PASSES_THROUGH) or not isinstance(exc, Exception):
        raise exc
    # The failure that ended the task, replayed: the history ends here.
    log.debug("task %s: compensation replay ended by the body's failure", ctx.task_id)


def compensations(ctx: TaskContext) -> dict[str, Any]:
    """Run the compensations a replay found (blocking); the task's result."""
    return {"compensated": ctx.run_compensations()}

