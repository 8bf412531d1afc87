"""Pause and resume of everything, a task type or one task (DESIGN §8 control)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArguments, TaskNotFound
from ...serde import dumps
from ...states import TERMINAL, State, check_operator_move
from ..base import ControlRequest, PauseRecord, PauseResult
from ..dialect import Tx
from ..rows import (
    CONTROL_LOCK,
    PAUSE_GATE,
    PAUSE_INSERT,
    PAUSE_RESUME,
    PAUSE_VERSION,
    PAUSED_TASKS,
    PAUSES_ACTIVE,
    RUNNING_BY_TYPE,
    TASK_GET_MANY,
    AuditRow,
    insert_audit,
    known_state,
)
from ..shapes import ControlRow, PausedRow, PauseRow
from .core import EngineCore

__all__ = ["SCOPES", "Pauses", "covered"]

SCOPES = ("all", "type", "task")
"""What a pause covers: everything, a task type, one task."""


class Pauses:
    """The pause operations of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def pause(self, scope: str, target: str, reason: str, operator: str) -> PauseResult:
        """See :meth:`Ledger.pause` (DESIGN §8)."""
        if scope not in SCOPES:
            raise InvalidArguments(f"pause scope must be one of {', '.join(SCOPES)}, "
                                   f"got {scope!r}")

        def body(tx: Tx, repaired: list[bool]) -> PauseResult:
            task: ControlRow | None = None
            if scope == "task":
                # One task: its row lock serializes with its claims and its holder.
                task = CONTROL_LOCK.first(tx, {"id": target})
                if task is None:
                    raise TaskNotFound(f"no task {target!r} in the ledger")
                if known_state(target, task.state, "pause") in TERMINAL:
                    return PauseResult("pause", "unchanged", [], 0, 0,
                                       f"task {target} already ended {task.state}: nothing "
                                       "to pause")
            else:
                PAUSE_GATE.first(tx)  # claims in flight finish first; later ones see it
            now = tx.now
            self.core.repair_clock(tx, now, repaired)  # after the lock or gate: never waits
            active = [pause_record(r) for r in PAUSES_ACTIVE.all(tx)]
            same = [p for p in active if (p.scope, p.target) == (scope, target)]
            if same:
                return PauseResult("pause", "unchanged", same, 0, 0,
                                   f"{_scope_text(scope, target)} is already paused "
                                   f"(pause record version {same[0].version}, "
                                   f"by {same[0].paused_by})")
            version = _next_version(tx)
            [inserted] = PAUSE_INSERT.all(tx, {
                "scope": scope, "target": target, "version": version, "by": operator,
                "reason": reason, "now": now})
            pause_id = inserted.id
            moved = running = 0
            audit: list[AuditRow] = []
            detail = {"operator": operator, "reason": reason, "scope": scope,
                      "target": target, "version": version, "pause_id": pause_id}
            if task is not None:
                state, generation = known_state(target, task.state, "pause"), task.generation
                if state in (State.PENDING, State.RETRY_WAIT, State.WAITING):
                    # A waiting task too: its resume replays it to its wait, which parks
                    # it again unless what it waited for came meanwhile.
                    check_operator_move(state, State.PAUSED)
                    tx.execute("control_move", {
                        "id": target, "from_state": state.value, "generation": generation,
                        "state": State.PAUSED.value, "bump": 1,
                        "request": task.control_request,
                        # a wait's deadline goes: the resume replays the task to its wait
                        "run_at": now if state is State.WAITING else None, "reset": False,
                        "now": now, "error": None, "error_class": None})
                    audit.append((target, now, "operator_pause", state.value,
                                  State.PAUSED.value, generation + 1, None, dumps(detail)))
                    moved = 1
                else:
                    if state in (State.RUNNING, State.UNKNOWN) and task.control_request is None:
                        # RUNNING: the holder stops at its next boundary; UNKNOWN: applied
                        # by the resolution. A cancel already asked for wins.
                        tx.execute("control_request_set", {
                            "id": target, "from_state": state.value,
                            "generation": generation, "request": ControlRequest.PAUSE.value})
                    running = int(state is State.RUNNING)
                    audit.append((target, now, "operator_pause", state.value, None,
                                  generation, None, dumps(detail)))
            else:
                running = sum(int(r.n) for r in RUNNING_BY_TYPE.all(tx)
                              if scope == "all" or r.name == target)
                audit.append((f"pause:{pause_id}", now, "operator_pause", None, None, None,
                              None, dumps(detail)))
            insert_audit(tx, audit)
            tx.wake()  # PostgreSQL: holders' heartbeats read their requests now
            record = PauseRecord(pause_id, scope, target, version, operator, reason, now,
                                 running)
            what = _scope_text(scope, target)
            message = (f"{what} paused (pause record version {version})"
                       + (f"; {running} running task(s) stop at their next step boundary"
                          if running else "")
                       + ("; the task is PAUSED now" if moved else ""))
            return PauseResult("pause", "done", [record], moved, running, message)

        return self.core.run_repairing(body)

    def resume(self, scope: str, target: str, reason: str, operator: str,
               rate_per_s: float | None = None) -> PauseResult:
        """See :meth:`Ledger.resume` (DESIGN §8)."""
        if scope not in SCOPES:
            raise InvalidArguments(f"resume scope must be one of {', '.join(SCOPES)}, "
                                   f"got {scope!r}")

        def body(tx: Tx, repaired: list[bool]) -> PauseResult:
            before = PAUSES_ACTIVE.all(tx)
            now = tx.now
            self.core.repair_clock(tx, now, repaired)
            version = _next_version(tx)
            ended = PAUSE_RESUME.all(tx, {"scope": scope, "target": target, "now": now,
                                          "by": operator, "reason": reason,
                                          "version": version})
            if not ended:
                return PauseResult("resume", "unchanged", [], 0, 0,
                                   _not_paused(scope, target, len(before)))
            ended_ids = {r.id for r in ended}
            still = [p for p in before if p.id not in ended_ids]
            audit: list[AuditRow] = []
            candidates: list[PausedRow] = []
            if scope == "task":
                task = CONTROL_LOCK.first(tx, {"id": target})
                if task is not None:
                    if task.state == State.PAUSED.value:
                        candidates = [PausedRow(target, task.name, task.generation,
                                                task.control_request)]
                    elif task.control_request == ControlRequest.PAUSE.value:
                        # Not at a boundary yet (or UNKNOWN): the request is withdrawn.
                        tx.execute("control_request_set", {
                            "id": target, "from_state": task.state,
                            "generation": task.generation, "request": None})
            else:
                candidates = PAUSED_TASKS.all(
                    tx, {"name": target if scope == "type" else None})
            readmit = [c for c in candidates if not covered(still, c.id, c.name)]
            step = 0.0 if not rate_per_s else 1.0 / rate_per_s
            rows: list[dict[str, Any]] = [
                {"id": c.id, "generation": c.generation, "run_at": now + i * step}
                for i, c in enumerate(readmit)]
            tx.batch("resume_tasks", rows, now=now)
            detail = {"operator": operator, "reason": reason, "scope": scope,
                      "target": target, "version": version}
            for end in ended:
                audit.append((target if scope == "task" else f"pause:{end.id}", now,
                              "operator_resume", None, None, None, None,
                              dumps({**detail, "pause_id": end.id})))
            for row in rows:
                audit.append((row["id"], now, "operator_resume", State.PAUSED.value,
                              State.PENDING.value, row["generation"], None,
                              dumps({**detail, "run_at": row["run_at"]})))
            insert_audit(tx, audit)
            if rows:
                tx.wake()
            records = [pause_record(p) for p in before if p.id in ended_ids]
            records = [dataclasses.replace(r, resumed_at=now, resumed_by=operator,
                                           resume_reason=reason, resumed_version=version)
                       for r in records]
            kept = len(candidates) - len(readmit)
            message = (f"{_scope_text(scope, target)} resumed (pause record version "
                       f"{version}); {len(rows)} paused task(s) ready again"
                       + (f" at {rate_per_s:g}/s" if rate_per_s and rows else "")
                       + (f"; {kept} stay paused by another pause" if kept else ""))
            return PauseResult("resume", "done", records, len(rows), 0, message)

        return self.core.run_repairing(body)

    def pauses(self) -> list[PauseRecord]:
        """See :meth:`Ledger.pauses`."""

        def body(tx: Tx) -> list[PauseRecord]:
            active_rows, count_rows = tx.rows_many([PAUSES_ACTIVE.sent(),
                                                    RUNNING_BY_TYPE.sent()])
            active = PAUSES_ACTIVE.of(active_rows)
            if not active:
                return []
            by_type = {r.name: int(r.n) for r in RUNNING_BY_TYPE.of(count_rows)}
            tasks = [p.target for p in active if p.scope == "task"]
            running_tasks = {r.id for r in TASK_GET_MANY.all(tx, {"ids": tasks})
                             if r.state == State.RUNNING.value} if tasks else set()
            out = []
            for p in active:
                if p.scope == "all":
                    running = sum(by_type.values())
                elif p.scope == "type":
                    running = by_type.get(p.target, 0)
                else:
                    running = int(p.target in running_tasks)
                out.append(dataclasses.replace(pause_record(p), running=running))
            return out

        return self.core.dialect.run(body, write=False)


def _next_version(tx: Tx) -> int:
    """The ledger's next control version (one above any pause's or resume's)."""
    row = PAUSE_VERSION.first(tx, {})
    return int(row.value or 0) + 1 if row else 1


def _not_paused(scope: str, target: str, active: int) -> str:
    """The message of a resume that ended no pause; ``active``: the pauses still active (a
    resume of everything ends only a pause of everything, not those of a type or task)."""
    if scope != "all":
        return f"{_scope_text(scope, target)} is not paused"
    if not active:
        return "nothing is paused"
    return (f"there is no pause of everything to resume; {active} pause(s) of a task type "
            "or a task stay active (resume each in its own scope)")


def _scope_text(scope: str, target: str) -> str:
    return {"all": "everything", "type": f"task type {target!r}",
            "task": f"task {target}"}[scope]


def pause_record(row: PauseRow) -> PauseRecord:
    """A :class:`PauseRecord` from a ``pauses_active`` row."""
    return PauseRecord(int(row.id), row.scope, row.target, int(row.version), row.paused_by,
                       row.reason, row.created_at)


def covered(pauses: Sequence[PauseRow], task_id: str, name: str,
            skip: int | None = None) -> bool:
    """Is the task ``task_id`` of type ``name`` in the scope of one of ``pauses`` (active
    pauses), not counting pause ``skip``?"""
    for p in pauses:
        if p.id == skip:
            continue
        if p.scope == "all" or (p.scope == "type" and p.target == name) or (
                p.scope == "task" and p.target == task_id):
            return True
    return False
