"""Final writes: the fenced write that ends an attempt, handed to the writer without
waiting; the lease and the slot stay held until it commits, then the outcome is reported.
An unreachable ledger has the write sent again while the lease lasts; a write the database
refuses becomes a permanent failure without the task's unsaved steps; a thread that comes
back after its attempt was ended without it sends its late result, to be judged stale."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any

import tenacity

from ..errors import LedgerUnavailable, RatchetError, WriteRejected
from ..errortext import error_message
from ..faults import point as fault_point
from ..ledger.base import BudgetUse, Claim, CommitOutcome, TaskWrite, Transition
from ..retry import FailureClass
from ..serde import dumps
from ..states import State
from .context import TaskContext
from .core import WRITE_REJECTED
from .heartbeat import LeaseHandle
from .slots import ClaimSlots
from .timelimit import Attempt

__all__ = ["FinalWrites"]

log = logging.getLogger("ratchet.worker")


class _StopWhenLost(tenacity.stop.stop_base):
    """tenacity stop condition: the lease is known lost (a re-sent write would be stale)."""

    def __init__(self, lease: LeaseHandle) -> None:
        self._lease = lease

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._lease.lost


class FinalWrites(ClaimSlots):
    """The final writes of attempts (see the module docstring)."""

    def _write_ended(self, attempt: Attempt, transition: Transition, operation: str) -> None:
        """The fenced final write of an attempt ended without its thread (the holder's own
        write at its generation); its outcome is reported, and its slot freed, once it
        commits. If it fails, the lease (no longer renewed) expires and the task is taken
        over or retired by the ledger as for a dead holder."""
        claim, ctx, lease = attempt.claim, attempt.ctx, attempt.lease
        write = TaskWrite(claim.task_id, claim.generation, self.holder,
                          f"{operation}:{transition.to.value}", transition=transition)

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            self._finished(claim, lease, ctx, [], transition, None, outcome, error)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            done(None, exc)
        finally:
            if attempt.end_sent is not None:
                attempt.end_sent.set()

    def _stuck_returned(self, claim: Claim, late: tuple[TaskContext, Any] | None) -> None:
        """A task thread came back from task code after its attempt was ended without it
        (time limit, shutdown grace). ``late``: ``(ctx, result)`` if the body returned.

        A late result is still sent, fenced at the attempt's generation: the ledger judges
        it and rejects it as stale (audited) since the attempt's transition was written (a
        later claim may have run the task again). Nothing else is reported: the attempt's
        outcome was reported when it was ended."""
        attempt = self._attempts.came_back(claim)
        if attempt is not None and attempt.cancel is None:
            # A thread counted stuck when it was taken (_taken_from_thread); an async
            # body's task was cancelled instead, never counted.
            self.stats.add("stuck_threads", -1)
        log.warning("task %s gen=%d: its %s came back from the task's code after the "
                    "attempt was ended without it", claim.task_id, claim.generation,
                    "task thread" if attempt is None or attempt.cancel is None
                    else "cancelled async body")
        if late is None or attempt is None or attempt.end_sent is None:
            return
        # The attempt's own end goes first (its writes are applied in order): the watchdog
        # may still be building it. Without it, the late result could land first.
        if not attempt.end_sent.wait(10.0):
            return
        ctx, result = late
        try:
            result_json = dumps(result, what=f"result of task {claim.name!r}")
        except Exception:
            return
        write = TaskWrite(claim.task_id, claim.generation, self.holder, "finish:SUCCEEDED",
                          steps=ctx.unsaved_steps(),
                          transition=Transition(State.SUCCEEDED, result_json=result_json))

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is not None and outcome.stale:
                self.stats.add("stale")
                log.info("task %s gen=%d: late result rejected (stale)", claim.task_id,
                         claim.generation)
            elif outcome is not None:
                log.warning("task %s gen=%d: late result accepted (the attempt's own end "
                            "had not been written)", claim.task_id, claim.generation)

        with contextlib.suppress(RatchetError):
            self.writer.submit(write, done)

    def _finish(
        self, claim: Claim, ctx: TaskContext, transition: Transition, label: str | None = None
    ) -> str | None:
        """Hand the final write (with the steps not yet durable) to the writer, without
        waiting. The lease and the slot stay held until it commits; then
        :meth:`_finished` reports the outcome (``label`` overrides its name).

        If the ledger is unreachable (or the reply to COMMIT was lost), the same write is
        sent again from a helper thread while the lease lasts (:meth:`_resend`). If the
        database refuses the write for its content, a failure write without the task's
        unsaved steps and result is sent instead (:meth:`_reject`)."""
        if not self._attempts.end(claim):
            # Ended at its time limit or the shutdown grace while this thread was in the
            # task's code: its lease, slot and outcome are no longer this thread's.
            self._stuck_returned(claim, None)
            return None
        steps = ctx.unsaved_steps()
        budgets = self._budget_uses(claim, ctx, transition)
        if budgets:
            transition = dataclasses.replace(transition, budgets=budgets)
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{transition.to.value}",
            steps=steps, transition=transition,
        )
        lease = ctx.lease

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is None and isinstance(error, LedgerUnavailable) and not lease.lost:
                thread = threading.Thread(
                    target=self._resend, args=(claim, lease, ctx, steps, transition, label, write),
                    name=f"ratchet-resend-{claim.task_id}", daemon=True,
                )
                thread.start()
                return
            if outcome is None and isinstance(error, WriteRejected):
                self._reject(claim, ctx, transition, error)
                return
            if (outcome is not None and outcome.ok and outcome.current_state is not None
                    and outcome.current_state is not transition.to):
                # The ledger applied another state than asked (an operator's request, a
                # quarantine): say so next to the line on_failure logged for the request.
                log.warning("task %s %s gen=%d: the ledger made it %s (asked %s)",
                            claim.name, claim.task_id, claim.generation,
                            outcome.current_state.value, transition.to.value)
            self._finished(claim, lease, ctx, steps, transition, label, outcome, error)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            log.error("task %s: final commit failed (%s); lease will expire", claim.task_id, exc)
            return "abandoned"
        return None

    def _budget_uses(
        self, claim: Claim, ctx: TaskContext, transition: Transition
    ) -> tuple[BudgetUse, ...]:
        """What this attempt charges to retry budgets (DESIGN §7): one call to its task
        type's budget (not for a release, which hands the attempt back), the requests its
        effects sent to each budgeted downstream; a ``RETRY_WAIT`` asks the type's budget
        and the budget of the downstream whose call failed to admit the retry. The ledger
        counts and decides (:class:`~ratchet.ledger.engine.LedgerEngine`)."""
        uses: list[BudgetUse] = []
        retry = transition.to is State.RETRY_WAIT
        definition = self.app.versions.get(claim.name, {}).get(claim.version)  # pinned
        type_budget = definition.retry.budget if definition is not None else None
        if type_budget is not None and transition.to is not State.PENDING:
            uses.append(BudgetUse(f"type:{claim.name}", 1, retry, type_budget.ratio,
                                  type_budget.min_per_s, type_budget.window_s))
        downstreams = self.app.downstreams
        if downstreams:
            names = dict(ctx.downstream_calls)
            if ctx.failed_downstream is not None:
                names.setdefault(ctx.failed_downstream, 0)
            for name, calls in sorted(names.items()):
                budget = downstreams.get(name)
                if budget is not None:
                    uses.append(BudgetUse(f"downstream:{name}", calls,
                                          retry and ctx.failed_downstream == name,
                                          budget.ratio, budget.min_per_s, budget.window_s))
        return tuple(uses)

    def _resend(
        self, claim: Claim, lease: LeaseHandle, ctx: TaskContext,
        steps: list[tuple[str, str, int | None]], transition: Transition, label: str | None,
        write: TaskWrite,
    ) -> None:
        """Send a final write again while the ledger is unreachable (helper thread).

        Re-sending is safe: every write is fenced, and a transition already applied at
        this generation is acknowledged, not applied twice. Exponential backoff from
        0.1 s up to 1 s between tries (tenacity), for at most one lease length or until
        the lease is known lost: after that the write would be stale anyway and the task
        belongs to its next holder."""

        def log_retry(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            self.final_commit_failures.failed(RuntimeError(
                f"task {claim.task_id}: {error}; sending it again in {delay:.2f} s"))

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(LedgerUnavailable),
            wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
            stop=tenacity.stop_after_delay(claim.lease_s) | _StopWhenLost(lease),
            before_sleep=log_retry,
            reraise=True,
        )
        outcome: CommitOutcome | None = None
        error: BaseException | None = None
        try:
            # The first try waits like the failed send did: the ledger was just unreachable.
            time.sleep(0.1)
            outcome = retrying(self.writer.commit, write)
        except Exception as exc:  # writer stopped, lease gone, or still unreachable
            error = exc
        else:
            self.final_commit_failures.succeeded()
        self._finished(claim, lease, ctx, steps, transition, label, outcome, error)

    def _reject(
        self, claim: Claim, ctx: TaskContext, transition: Transition, error: BaseException
    ) -> None:
        """The database refused a final write: record a permanent failure instead, without
        the unsaved steps or the result (writer thread). If that write is refused too, the
        attempt is abandoned (the lease expires)."""
        log.error("task %s: the ledger refused its final write (%s); failing it",
                  claim.task_id, error)
        ctx.exception = ctx.exception or error
        ctx.discard_unsaved_steps()
        failure = self._failure_transition(
            self.app.definition(claim.name, claim.version), claim, error, ctx.open_intents(),
            failure=FailureClass.PERMANENT, error_class=WRITE_REJECTED,
            error=f"{error_message(error)} (refused write: {transition.to.value} of task "
                  f"{claim.task_id})",
        )
        self.on_failure(claim, failure)
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{failure.to.value}",
            transition=failure,
        )

        def done(outcome: CommitOutcome | None, err: BaseException | None) -> None:
            self._finished(claim, ctx.lease, ctx, [], failure, None, outcome, err)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            done(None, exc)

    def _finished(
        self,
        claim: Claim,
        lease: LeaseHandle,
        ctx: TaskContext,
        steps: list[tuple[str, str, int | None]],
        transition: Transition,
        label: str | None,
        outcome: CommitOutcome | None,
        error: BaseException | None,
    ) -> None:
        """The final write's outcome is known (writer thread, or the resend thread)."""
        result = "abandoned"
        try:
            if outcome is None:
                log.error("task %s: final commit failed (%s); lease will expire",
                          claim.task_id, error)
            elif outcome.stale:
                self.stats.add("stale")
                result = "stale"
            else:
                ctx.steps_saved(steps)
                fault_point("task.after_complete")
                # An operator request may have changed the state applied (arbitration).
                applied = outcome.current_state or transition.to
                attr = _COUNTERS.get(applied)
                if attr is not None:
                    self.stats.add(attr)
                result = applied.value
        finally:
            self._done(claim, lease, label or result, ctx.exception)


_COUNTERS: dict[str, str] = {
    State.CANCELLED: "cancelled",
    State.PAUSED: "paused",
    State.SUCCEEDED: "succeeded",
    State.RETRY_WAIT: "retried",
    State.FAILED: "failed",
    State.UNKNOWN: "unknown",
    State.PENDING: "released",
}
