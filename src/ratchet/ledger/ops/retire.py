"""Deliveries whose holder is gone (lease expiry, revocation): counted as crashes,
retired on their final attempt, quarantined after ``quarantine_after`` crashes, and the
operator requests on them applied (DESIGN §3, §7)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...fingerprint import worker_died
from ...outcome import AttemptFacts, Happened, decide
from ...serde import dumps
from ...states import State, check_transition
from ..base import ControlRequest
from ..dialect import Tx
from ..rows import OPEN_INTENTS, AuditRow
from ..shapes import LeaseRow

__all__ = ["REQUEST_CLASS", "apply_requests", "holder_gone", "retire"]

REQUEST_CLASS = {ControlRequest.CANCEL: "cancelled", ControlRequest.PAUSE: "paused"}
"""``error_class`` recorded when an operator request ends a task's run."""


def holder_gone(
    tx: Tx, rows: Sequence[LeaseRow], audit: list[AuditRow], final_reason: str, cause: str,
) -> list[LeaseRow]:
    """Deliveries that ended with their holder gone (lease expiry, revocation): locked
    RUNNING rows. Each is counted in ``crash_count`` (the worker is dead, so the ledger
    counts, DESIGN §7). A final attempt is retired (:func:`retire`); a task whose worker
    died ``quarantine_after`` times is quarantined (retired with the quarantine flag and
    the :func:`~ratchet.fingerprint.worker_died` fingerprint; ``UNKNOWN`` without the flag
    when an effect intent is open). Returns the rows that stay on the retry path (to take
    over or revoke)."""
    now = tx.now
    survivors: list[LeaseRow] = []
    exhausted: list[LeaseRow] = []
    poisoned: list[LeaseRow] = []
    crashes: dict[str, int] = {}
    for row in rows:
        crashes[row.id] = int(row.crash_count or 0) + 1
        # The outcome table without the intent read (made for the retired rows only).
        rules = decide(_gone_facts(row, now, False, with_request=False)).rules
        if "gone_quarantine" in rules:
            poisoned.append(row)
        elif "gone_final" in rules:
            exhausted.append(row)
        else:
            survivors.append(row)
    marks: list[dict[str, Any]] = [
        {"id": row.id, "fingerprint": None, "count": None, "crashes": crashes[row.id],
         "quarantined": False} for row in [*survivors, *exhausted]]
    if exhausted:
        retire(tx, exhausted, audit, final_reason)
    if poisoned:
        targets = retire(tx, poisoned, audit, "quarantined: its worker died on "
                         f"{crashes[poisoned[0].id]} deliveries ({cause})")
        for row in poisoned:
            flagged = targets[row.id] is State.FAILED
            fp = worker_died(row.name)
            marks.append({"id": row.id, "fingerprint": fp, "count": crashes[row.id],
                          "crashes": crashes[row.id], "quarantined": flagged})
            if flagged:
                audit.append((row.id, now, "quarantine", State.RUNNING.value,
                              State.FAILED.value, row.generation + 1, None,
                              dumps({"fingerprint": fp, "cause": "worker_died",
                                     "count": crashes[row.id], "previous_holder": row.holder,
                                     "reason": cause})))
    tx.batch("quarantine_mark", marks, now=now)
    return survivors


def retire(
    tx: Tx, rows: Sequence[LeaseRow], audit: list[AuditRow], reason: str
) -> dict[str, State]:
    """Retire locked RUNNING rows whose holder is gone on the final attempt or quarantined:
    where each ends is the outcome table's (:func:`ratchet.outcome.decide`): ``FAILED``, or
    ``UNKNOWN`` when an effect intent is open (the call may have happened; an operator
    resolves it). Returns each task's new state."""
    open_intents: dict[str, tuple[str, str]] = {}
    for intent_row in OPEN_INTENTS.all(tx, {"ids": [r.id for r in rows]}):
        open_intents.setdefault(intent_row.task_id, (intent_row.name, intent_row.key))
    batch: list[dict[str, Any]] = []
    targets: dict[str, State] = {}
    for row in rows:
        task_id, holder, generation = row.id, row.holder, row.generation
        intent = open_intents.get(task_id)
        ending = decide(_gone_facts(row, tx.now, intent is not None))
        target = ending.state
        targets[task_id] = target
        check_transition(State.RUNNING, target)
        error = (f"holder {holder} is gone ({reason}) during attempt {row.attempt} of "
                 f"{row.max_attempts}")
        if intent:
            error += f"; effect {intent[0]!r} (key {intent[1]!r}) has an open intent"
        # An operator's request waits on UNKNOWN for the resolution (DESIGN §3).
        batch.append({"id": task_id, "generation": generation, "state": target.value,
                      "error": error, "error_class": ending.error_class,
                      "request": ending.request})
        audit.append((task_id, tx.now, "transition", State.RUNNING.value, target.value,
                      generation + 1, None,
                      dumps({"reason": reason, "previous_holder": holder, "error": error})))
    tx.batch("retire", batch, now=tx.now)
    return targets


def apply_requests(
    tx: Tx, rows: Sequence[LeaseRow], audit: list[AuditRow], why: str
) -> set[str]:
    """Apply the operator requests of locked RUNNING rows whose holder is gone (``why``):
    ``cancel`` -> ``CANCELLED``, ``pause`` -> ``PAUSED``, generation + 1, for rows
    without an open effect intent (with one, the next holder settles it by lookup
    first, DESIGN §3). Returns the ids moved."""
    requested = [row for row in rows if row.control_request is not None]
    if not requested:
        return set()
    open_ids = {r.task_id for r in OPEN_INTENTS.all(tx, {"ids": [r.id for r in requested]})}
    batch: list[dict[str, Any]] = []
    for row in requested:
        task_id, holder, generation = row.id, row.holder, row.generation
        request = row.control_request
        ending = decide(_gone_facts(row, tx.now, task_id in open_ids))
        if "gone_request" not in ending.rules:
            continue  # an intent is open: the takeover's holder settles it first
        target = ending.state
        check_transition(State.RUNNING, target)
        error = f"{request} requested by an operator; holder {holder} is gone ({why})"
        batch.append({"id": task_id, "generation": generation, "state": target.value,
                      "error": error, "error_class": ending.error_class,
                      "request": None})
        audit.append((task_id, tx.now, "transition", State.RUNNING.value, target.value,
                      generation + 1, None,
                      dumps({"reason": f"{request} requested ({why})", "request": request,
                             "previous_holder": holder})))
    tx.batch("retire", batch, now=tx.now)
    return {row["id"] for row in batch}


def _gone_facts(row: LeaseRow, now: float, intent_open: bool, *,
                with_request: bool = True) -> AttemptFacts:
    """The outcome table's facts of a locked RUNNING row whose holder is gone; this
    delivery counts as a crash."""
    return AttemptFacts(
        Happened.HOLDER_GONE, now=now, attempt=row.attempt, max_attempts=row.max_attempts,
        intent_open=intent_open, request=row.control_request if with_request else None,
        streak=int(row.crash_count or 0) + 1, quarantine_after=row.quarantine_after)
