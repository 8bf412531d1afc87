"""Operator commands on one task or holder: cancel, retry, resolve, revoke (DESIGN §3).
Each is one transaction under the task's lock, audited with who and why."""

from __future__ import annotations

from typing import Any

from ...errors import IllegalTransition, TaskNotFound
from ...serde import dumps
from ...states import TERMINAL, State, check_operator_move, check_transition
from ..base import (
    COMPENSATING_STEP,
    ControlOutcome,
    ControlRequest,
    EffectState,
    ResolveOutcome,
)
from ..dialect import Tx
from ..rows import (
    COMPENSABLE_READ,
    CONTROL_LOCK,
    HOLDER_RUNNING,
    OPEN_INTENTS,
    RESOLVE_LOCK,
    RESOLVE_OPEN_EFFECTS,
    AuditRow,
    insert_audit,
    known_state,
)
from .core import EngineCore
from .counts import unfinish
from .fork import FORKS, lineage, refuse_live
from .retire import REQUEST_CLASS, apply_requests, holder_gone
from .segment import step_entry
from .waits import TASK_CHILDREN

_ENDED = frozenset(s.value for s in TERMINAL)

__all__ = ["Commands"]


class Commands:
    """Cancel, retry, resolve and revoke of the :class:`~ratchet.ledger.base.Ledger`
    contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def resolve(self, task_id: str, outcome: ResolveOutcome, reason: str, operator: str,
                result_json: str | None = None) -> None:
        """See :meth:`Ledger.resolve` (the caller reads the task back)."""

        def body(tx: Tx) -> None:
            row = RESOLVE_LOCK.first(tx, {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            if row.state != State.UNKNOWN.value:
                raise IllegalTransition(
                    f"task {task_id} is {row.state}, not UNKNOWN; only UNKNOWN tasks can be "
                    "resolved"
                )
            request = row.control_request
            # give-up: FAILED. Otherwise the task resumes, unless an operator request was
            # kept waiting for this resolution (DESIGN §3): then it is applied now.
            if outcome is ResolveOutcome.GIVE_UP:
                # A task with a completed effect to undo compensates instead of failing
                # (DESIGN §5): its next claim runs the compensations.
                target = (State.COMPENSATING
                          if COMPENSABLE_READ.all(tx, {"ids": [task_id]}) else State.FAILED)
            elif request is not None:
                target = (State.CANCELLED if request == ControlRequest.CANCEL
                          else State.PAUSED)
            else:
                target = State.PENDING
            check_operator_move(State.UNKNOWN, target)
            open_effects = RESOLVE_OPEN_EFFECTS.all(tx, {"id": task_id})
            new_state = {ResolveOutcome.DONE: EffectState.DONE,
                         ResolveOutcome.NOT_DONE: EffectState.NOT_DONE,
                         ResolveOutcome.GIVE_UP: EffectState.GIVEN_UP}[outcome]
            tx.execute("resolve_effects", {
                "state": new_state.value,
                "result": result_json if new_state is EffectState.DONE else None,
                "now": tx.now, "id": task_id,
            })
            generation = row.generation
            if target is State.PENDING:
                tx.execute("resolve_task", {"now": tx.now, "id": task_id,
                                            "generation": generation})
                tx.wake()
            else:
                # Generation + 1: the task's history is settled by an operator here.
                given_up = outcome is ResolveOutcome.GIVE_UP
                tx.execute("control_move", {
                    "id": task_id, "from_state": State.UNKNOWN.value, "generation": generation,
                    "state": target.value, "bump": 1, "request": None,
                    "run_at": tx.now if target is State.COMPENSATING else None,
                    "reset": False, "now": tx.now,
                    "error": (f"given up by {operator}: {reason}" if given_up else None),
                    "error_class": ("given_up" if given_up or request is None
                                    else REQUEST_CLASS[ControlRequest(request)]),
                })
                generation += 1
                if target is State.COMPENSATING:
                    tx.batch("steps_upsert", [step_entry(
                        task_id, generation, (COMPENSATING_STEP, "true", None))], now=tx.now)
                    tx.execute("compensating_mark", {"ids": [task_id]})
                    tx.wake()
            detail: dict[str, Any] = {
                "operator": operator, "reason": reason, "outcome": outcome.value,
                "effects": [{"name": e.name, "key": e.key} for e in open_effects]}
            if request is not None:
                detail["request"] = request
            insert_audit(tx, [(task_id, tx.now, "operator_resolve", State.UNKNOWN.value,
                               target.value, generation, None, dumps(detail))])

        self.core.dialect.run(body)

    def cancel(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.cancel` (DESIGN §3, arbitration): one transaction under the
        task's lock; audited as ``operator_cancel`` with operator and reason. Then the
        cascade: every child the task submitted (``ctx.submit``) that has not ended is
        cancelled the same way, each in its own transaction, with the reason
        ``parent <id> cancelled: <reason>`` (a cancel sent again finishes a cascade a
        crash interrupted)."""
        outcome = self._cancel_one(task_id, reason, operator)
        if outcome.outcome == "unchanged" and outcome.previous_state is not State.CANCELLED:
            return outcome
        for child in self.core.dialect.run(
                lambda tx: [r.id for r in TASK_CHILDREN.all(tx, {"id": task_id})
                            if r.state not in _ENDED], write=False):
            self.cancel(child, f"parent {task_id} cancelled: {reason}", operator)
        return outcome

    def compensate(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.compensate`: ``FAILED -> COMPENSATING`` (an operator move,
        DESIGN §3), generation + 1, a fresh set of attempts, due now; the next claim's
        holder runs the compensations of the task's completed effects (DESIGN §5). One
        transaction under the task's lock, audited ``operator_compensate``."""

        def body(tx: Tx) -> ControlOutcome:
            row = CONTROL_LOCK.first(tx, {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state, generation = known_state(task_id, row.state, "compensate"), row.generation
            if state is not State.FAILED:
                return ControlOutcome(
                    task_id, "compensate", "unchanged", state, state, generation,
                    f"task {task_id} is {state.value}, not FAILED: nothing changed (only a "
                    "failed task is compensated)")
            check_operator_move(State.FAILED, State.COMPENSATING)
            bump = self._lineage_bump(tx, task_id, generation, "compensated")
            now = tx.now
            unfinish(tx, [(row.name, state.value, float(row.updated_at))])
            tx.execute("control_move", {
                "id": task_id, "from_state": state.value, "generation": generation,
                "state": State.COMPENSATING.value, "bump": bump, "request": None,
                "run_at": now, "reset": True, "now": now, "error": None,
                "error_class": None})
            generation += bump
            tx.batch("steps_upsert", [step_entry(task_id, generation,
                                                 (COMPENSATING_STEP, "true", None))], now=now)
            tx.execute("compensating_mark", {"ids": [task_id]})
            insert_audit(tx, [(task_id, now, "operator_compensate", State.FAILED.value,
                               State.COMPENSATING.value, generation, None,
                               dumps({"operator": operator, "reason": reason}))])
            tx.wake()
            return ControlOutcome(
                task_id, "compensate", "done", state, State.COMPENSATING, generation,
                f"task {task_id} is compensating: the compensations of its completed "
                "effects run next, in reverse order")

        return self.core.dialect.run(body)

    def _cancel_one(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """One task's cancel (see :meth:`cancel`), without the cascade."""

        def body(tx: Tx) -> ControlOutcome:
            row = CONTROL_LOCK.first(tx, {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state, generation = known_state(task_id, row.state, "cancel"), row.generation
            lease_until = row.lease_until
            now = tx.now
            if state in TERMINAL:
                return ControlOutcome(
                    task_id, "cancel", "unchanged", state, state, generation,
                    f"task {task_id} already ended {state.value}: nothing changed (a task "
                    "that finished first keeps its outcome)")
            if state is State.COMPENSATING:
                return ControlOutcome(
                    task_id, "cancel", "unchanged", state, state, generation,
                    f"task {task_id} is COMPENSATING: nothing changed (its compensations "
                    "run to their end; pause its type to hold them)")
            intents = [r.name for r in OPEN_INTENTS.all(tx, {"ids": [task_id]})]
            detail: dict[str, Any] = {"operator": operator, "reason": reason}
            gone = (state is State.RUNNING and lease_until is not None
                    and lease_until < now)
            if (state is State.RUNNING and not gone) or state is State.UNKNOWN or intents:
                # A request, for the holder's next boundary, the next holder's lookup or the
                # resolution (an open effect intent is settled first, never abandoned).
                tx.execute("control_request_set", {
                    "id": task_id, "from_state": state.value, "generation": generation,
                    "request": ControlRequest.CANCEL.value})
                if state is State.UNKNOWN:
                    message = (f"task {task_id} is UNKNOWN: the cancel is recorded and applied "
                               "when its effect is resolved (ratchet resolve)")
                elif intents:
                    message = (f"task {task_id} is {state.value} with an open effect intent "
                               f"({', '.join(intents)}): the cancel is recorded; the holder "
                               "settles the effect (lookup) first, then cancels")
                else:
                    message = (f"task {task_id} is RUNNING: its holder cancels it at its "
                               "next step boundary")
                detail.update(outcome="requested", open_intents=intents)
                insert_audit(tx, [(task_id, now, "operator_cancel", state.value, None,
                                   generation, None, dumps(detail))])
                tx.wake()  # PostgreSQL: the holder's heartbeat reads its requests now
                return ControlOutcome(task_id, "cancel", "requested", state, state,
                                      generation, message)
            if gone:
                # The holder's lease is over and no effect is open: nobody can still apply
                # the request at a boundary, so the ledger applies it (generation + 1).
                check_transition(State.RUNNING, State.CANCELLED)
                tx.batch("retire", [{
                    "id": task_id, "generation": generation, "state": State.CANCELLED.value,
                    "error": f"cancelled by {operator}: {reason} (holder {row.holder} is "
                             "gone: lease expired)",
                    "error_class": "cancelled", "request": None}], now=now)
            else:
                check_operator_move(state, State.CANCELLED)
                tx.execute("control_move", {
                    "id": task_id, "from_state": state.value, "generation": generation,
                    "state": State.CANCELLED.value, "bump": 1, "request": None,
                    "run_at": None, "reset": False, "now": now,
                    "error": None, "error_class": "cancelled"})
            detail["outcome"] = "done"
            insert_audit(tx, [(task_id, now, "operator_cancel", state.value,
                               State.CANCELLED.value, generation + 1, None, dumps(detail))])
            return ControlOutcome(task_id, "cancel", "done", state, State.CANCELLED,
                                  generation + 1, f"task {task_id} cancelled (was "
                                  f"{state.value})")

        return self.core.dialect.run(body)

    def retry(self, task_id: str, reason: str, operator: str) -> ControlOutcome:
        """See :meth:`Ledger.retry`: ``FAILED -> PENDING`` (an operator move, DESIGN §3),
        attempts reset, generation + 1, ready now; audited as ``operator_retry``."""

        def body(tx: Tx) -> ControlOutcome:
            row = CONTROL_LOCK.first(tx, {"id": task_id})
            if row is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state, generation = known_state(task_id, row.state, "retry"), row.generation
            attempts = row.attempt
            if state is not State.FAILED:
                why = ("it never moves again" if state in TERMINAL
                       else "it has not failed")
                return ControlOutcome(
                    task_id, "retry", "unchanged", state, state, generation,
                    f"task {task_id} is {state.value}, not FAILED: nothing changed ({why})")
            check_operator_move(State.FAILED, State.PENDING)
            bump = self._lineage_bump(tx, task_id, generation, "retried")
            now = tx.now
            unfinish(tx, [(row.name, state.value, float(row.updated_at))])
            tx.execute("control_move", {
                "id": task_id, "from_state": state.value, "generation": generation,
                "state": State.PENDING.value, "bump": bump, "request": None, "run_at": now,
                "reset": True, "now": now, "error": None, "error_class": None})
            insert_audit(tx, [(task_id, now, "operator_retry", State.FAILED.value,
                               State.PENDING.value, generation + bump, None,
                               dumps({"operator": operator, "reason": reason,
                                      "previous_attempts": attempts}))])
            tx.wake()
            return ControlOutcome(
                task_id, "retry", "done", state, State.PENDING, generation + bump,
                f"task {task_id} queued again with a fresh set of {row.max_attempts} "
                f"attempt(s) (it had used {attempts}); done steps stay done")

        return self.core.dialect.run(body)

    def _lineage_bump(self, tx: Tx, task_id: str, generation: int, what: str) -> int:
        """What to add to the generation of ``task_id``, an ended task about to run again
        (retry, compensate): 1, or more so that it goes above every task of its fork
        lineage (its tokens keep rising across the lineage, whose fence
        :mod:`ratchet.fencing` shares).

        Raises:
            IllegalTransition: another task of its lineage has not ended."""
        found = lineage(tx, task_id, self.core.schema.has(FORKS))
        refuse_live(task_id, found, what)
        return max(1, found.generation + 1 - generation)

    def revoke_holder(self, holder: str, by: str, reason: str) -> list[str]:
        """See :meth:`Ledger.revoke_holder`."""

        def body(tx: Tx) -> list[str]:
            rows = HOLDER_RUNNING.all(tx, {"holder": holder})
            audit: list[AuditRow] = []
            applied = apply_requests(tx, rows, audit, f"revoked by {by}: {reason}")
            everything, rows = rows, [r for r in rows if r.id not in applied]
            retry = holder_gone(tx, rows, audit, f"holder revoked by {by}: {reason}",
                                f"holder revoked by {by}") if rows else []
            if retry:
                tx.execute("revoke_retry", {
                    "now": tx.now, "error": f"holder {holder} revoked by {by}: {reason}",
                    "ids": [r.id for r in retry], "holder": holder,
                })
                for r in retry:
                    audit.append((r.id, tx.now, "revoke", State.RUNNING.value,
                                  State.RETRY_WAIT.value, r.generation + 1, by,
                                  dumps({"previous_holder": holder,
                                         "previous_generation": r.generation,
                                         "reason": reason})))
                tx.wake()
            tx.execute("worker_dead", {"holder": holder})
            insert_audit(tx, audit)
            return [r.id for r in everything]

        return self.core.dialect.run(body)
