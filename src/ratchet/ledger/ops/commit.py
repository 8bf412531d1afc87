"""Fenced commits (DESIGN §3): each write checked against the task's state and generation
in the write's own transaction; a holder's move arbitrated against an operator request;
failure streaks counted toward quarantine and retry budgets charged (DESIGN §7); the re-send
of writes whose ``COMMIT`` reply was lost."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import WriteRejected
from ...outcome import AttemptFacts, Ending, Happened, asked_as_is, decide
from ...serde import dumps, printable
from ...states import State, check_transition
from ..base import (
    BatchMark,
    Claim,
    ClaimKind,
    ClaimScope,
    CommitOutcome,
    EffectState,
    TaskWrite,
    Transition,
)
from ..budgets import BudgetBook
from ..dialect import CommitOutcomeUnknown, Tx
from ..rows import (
    FENCE_READ,
    OPEN_INTENTS,
    PAUSES_ACTIVE,
    QUARANTINE_READ,
    AuditRow,
    insert_audit,
    reschedules,
    task_state,
    transition_audit,
)
from ..shapes import FenceRow, PauseRow
from .batches import apply_marks
from .claims import ClaimReads, Claims
from .core import EngineCore
from .pauses import covered
from .segment import Segment
from .waits import park

__all__ = ["Commits"]


class Commits:
    """:meth:`Ledger.commit <ratchet.ledger.base.Ledger.commit>` and ``commit_and_claim``
    (the claim runs through ``claims`` in the commit's transaction)."""

    def __init__(self, core: EngineCore, claims: Claims) -> None:
        self.core = core
        self.claims = claims

    def commit(self, writes: Sequence[TaskWrite]) -> list[CommitOutcome]:
        """See :meth:`Ledger.commit`: one transaction, fenced per task.

        When the connection is lost during ``COMMIT`` (outcome unknown), the writes are
        sent again in a new transaction: a write already applied at its generation is
        acknowledged (``ok``), not reported stale, and re-sent intents are not counted as
        new calls. A write the database refuses raises
        :class:`~ratchet.errors.WriteRejected` for the whole call (nothing is written); the
        worker's writer then applies the writes one by one.
        """
        _check_transitions(writes)
        if not writes:
            return []
        dialect = self.core.dialect
        try:
            try:
                return dialect.run(lambda tx: commit_in(tx, writes)[0])
            except CommitOutcomeUnknown:
                return dialect.run(lambda tx: commit_in(tx, writes, resend=True)[0])
        except WriteRejected as exc:
            raise _naming(exc, writes) from exc

    def commit_and_claim(
        self, writes: Sequence[TaskWrite], holder: str, names: Sequence[ClaimKind], limit: int,
        scope: ClaimScope | None = None,
    ) -> tuple[list[CommitOutcome], list[Claim]]:
        """See :meth:`Ledger.commit_and_claim`: both in one transaction (one fsync).

        After a lost ``COMMIT`` reply only the writes are re-sent; tasks the lost
        transaction may have claimed stay leased, unseen, until their leases expire.
        """
        _check_transitions(writes)

        claiming = limit > 0 and bool(names)
        repaired: list[bool] = []

        def body(tx: Tx) -> tuple[list[CommitOutcome], list[Claim]]:
            repaired.clear()  # a retried attempt decides again
            # The expired-lease scan, the pause gate, the pauses and the limits travel
            # with the fence read (one round trip).
            also, walks = (self.claims.reads(names, limit, scope, holder) if claiming
                           else ([], None))
            outcomes, extra = commit_in(tx, writes, also=also)
            if not claiming:
                return outcomes, []
            pre = ClaimReads.of(extra, walks)
            # The scan ran before the writes: a lease this commit ended (its holder's own
            # final write, e.g. a completion or a release) is not expired any more.
            ended = {w.task_id for w, o in zip(writes, outcomes, strict=True)
                     if o.ok and w.transition is not None
                     and w.transition.to is not State.RUNNING}
            pre = pre._replace(expired=[r for r in pre.expired if r.id not in ended])
            return outcomes, self.claims.claim_in(tx, holder, names, limit, pre, repaired,
                                                  scope)

        dialect = self.core.dialect
        try:
            try:
                result = dialect.run(body)
                if repaired:
                    self.core.clock_watch.repaired()
                return result
            except CommitOutcomeUnknown:
                return dialect.run(lambda tx: commit_in(tx, writes, resend=True)[0]), []
        except WriteRejected as exc:
            raise _naming(exc, writes) from exc


_PARKS = frozenset({State.WAITING, State.COMPENSATING})


def _check_transitions(writes: Sequence[TaskWrite]) -> None:
    for write in writes:
        if write.transition is not None:
            check_transition(State.RUNNING, write.transition.to)


def commit_in(
    tx: Tx, writes: Sequence[TaskWrite], resend: bool = False,
    also: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> tuple[list[CommitOutcome], list[list[tuple[Any, ...]]]]:
    """The commit, inside the caller's transaction (see :meth:`Commits.commit`). Returns
    the outcomes and the rows of the reads ``also`` sent with the fence read.

    ``resend``: these writes were sent before in a transaction whose COMMIT reply was
    lost. A write at the task's current generation whose task has already moved on
    was applied then: it is acknowledged.
    """
    if not writes:
        return [], tx.rows_many(also) if also else []
    # Failures that count toward quarantine: their streaks travel with the fence read.
    counted = sorted({w.task_id for w in writes
                      if w.transition is not None and w.transition.fingerprint})
    reads = [FENCE_READ.sent({"ids": sorted({w.task_id for w in writes})})]
    if counted:
        reads.append(QUARANTINE_READ.sent({"ids": counted}))
    # Retry budgets: the windows of budgets that must admit a retry, read (under the
    # budgets' locks) in the same round trip.
    book = BudgetBook(writes)
    reads.extend(book.reads())
    fence, *extra = tx.rows_many([*reads, *also])
    streaks: dict[str, tuple[str | None, int, int | None]] = {}
    if counted:
        streaks = {r.id: (r.fingerprint, int(r.streak or 0), r.quarantine_after)
                   for r in QUARANTINE_READ.of(extra.pop(0))}
    if book.locked:
        extra.pop(0)  # budget_lock
        book.load(extra.pop(0))
    marks: list[dict[str, Any]] = []
    current: dict[str, FenceRow] = {r.id: r for r in FENCE_READ.of(fence)}
    now = tx.now  # after the first read: BEGIN, clock and fence in one round trip
    # Operator requests on tasks this batch moves out of RUNNING (rare: one read then).
    requested = sorted({w.task_id for w in writes if w.transition is not None
                        and (c := current.get(w.task_id)) is not None and c.control_request})
    open_db: dict[str, set[str]] = {}
    if requested:
        for intent in OPEN_INTENTS.all(tx, {"ids": requested}):
            open_db.setdefault(intent.task_id, set()).add(intent.name)
    # A holder stopping for a pause: is a pause still active for it (rare: one read)?
    active: list[PauseRow] | None = None
    if any(w.transition is not None and w.transition.to is State.PAUSED for w in writes):
        active = PAUSES_ACTIVE.all(tx)
    outcomes: dict[int, CommitOutcome] = {}
    audit: list[AuditRow] = []
    segment = Segment()
    ready = False
    parked: list[tuple[TaskWrite, Transition]] = []
    batch_marks: list[tuple[str, int, BatchMark]] = []  # of the writes that passed
    seen: set[str] = set()
    for index, write in enumerate(writes):
        if write.task_id in seen:
            # A task written twice in one batch: apply what came before first, so the
            # second write sees the first (as if committed one after the other).
            segment.apply(tx, now, resend)
            if parked and park(tx, parked, audit, now):
                ready = True
            segment, seen, parked = Segment(), set(), []
        seen.add(write.task_id)
        row = current.get(write.task_id)
        t = write.transition
        if row is not None and row.generation == write.generation and (
            (t is not None and t.to is not State.RUNNING and row.state == t.to.value)
            or (resend and row.state != State.RUNNING.value)
        ):
            # Already applied at this generation (only the holder of a generation writes
            # with it): a re-send after a lost COMMIT reply. Acknowledge; write nothing.
            outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation)
            continue
        if row is None or row.state != State.RUNNING.value or row.generation != write.generation:
            state = task_state(row.state) if row is not None else None
            generation = row.generation if row is not None else None
            audit.append((write.task_id, now, "stale_rejected", None, None,
                          write.generation, write.holder,
                          dumps({"operation": printable(write.operation),
                                 "current_generation": generation,
                                 "current_state": None if state is None
                                 else str(state)})))
            outcomes[index] = CommitOutcome(write.task_id, False, True, generation, state)
            continue
        attempt = row.attempt
        original = t.to if t is not None else None
        if t is not None and t.to is not State.RUNNING:
            # The ledger's half of the outcome table: request, pause, quarantine.
            t, request = _arbitrate(tx, write, t, row, open_db.get(write.task_id),
                                    active, streaks, marks, audit, now)
            if t is not write.transition:
                write = dataclasses.replace(write, transition=t)
        else:
            request = row.control_request if t is None or t.to is State.RUNNING else None
        if t is not None and t.budgets:
            t = book.charge(write.holder, t, now)
            write = dataclasses.replace(write, transition=t)
        segment.add(write, attempt, audit, now, request)
        if write.batches:
            batch_marks.extend((write.task_id, write.generation, m) for m in write.batches)
        if t is not None:
            if t.to in _PARKS:
                parked.append((write, t))
            audit.append(transition_audit(write, t, now))
            # Later writes of this batch for the same task see the new state.
            current[write.task_id] = row._replace(state=t.to.value, control_request=request)
            ready = ready or (reschedules(t.to) and t.delay_s <= 0
                              and (t.run_at is None or t.run_at <= now))
        # The state applied, when arbitration changed the write's (else None).
        applied = t.to if t is not None and write.transition is not None and (
            t.to is not original) else None
        outcomes[index] = CommitOutcome(write.task_id, True, False, write.generation,
                                        applied)
    segment.apply(tx, now, resend)
    if parked and park(tx, parked, audit, now):
        ready = True
    if batch_marks:
        apply_marks(tx, batch_marks, now)
    tx.batch("quarantine_mark", marks, now=now)
    book.flush(tx, now)
    insert_audit(tx, audit)
    if ready:
        tx.wake()
    return [outcomes[i] for i in range(len(writes))], extra


def _arbitrate(
    tx: Tx, write: TaskWrite, t: Transition, row: FenceRow,
    open_before: set[str] | None, active: list[PauseRow] | None,
    streaks: dict[str, tuple[str | None, int, int | None]],
    marks: list[dict[str, Any]], audit: list[AuditRow], now: float,
) -> tuple[Transition, str | None]:
    """Complete a holder's fenced move out of ``RUNNING`` with the ledger's facts
    (DESIGN §3 arbitration, §7 quarantine) through the outcome table
    (:func:`ratchet.outcome.decide`): the operator request on the task, whether a pause
    still covers it, the quarantine streak. ``row``: the task's fence row;
    ``open_before``: the task's open intents when it has a request (read with the batch).
    Returns the transition to apply and the request the task keeps."""
    request = row.control_request
    fp = t.fingerprint
    count, limit = 0, None
    if fp is not None:
        previous, count, limit = streaks.get(write.task_id, (None, 0, None))
        count = count + 1 if previous == fp else 1
    pause_active = t.to is not State.PAUSED or covered(active or [], write.task_id, row.name)
    if asked_as_is(request, pause_active, count, limit):
        # The table leaves this write as asked (the common final write): only the
        # fingerprint's streak is counted.
        if fp is not None:
            streaks[write.task_id] = (fp, count, limit)
            marks.append({"id": write.task_id, "fingerprint": fp, "count": count,
                          "crashes": None, "quarantined": False})
        return t, None
    intent_open = False
    if request or (limit and count >= limit):
        if open_before is None:
            open_before = {r.name for r in OPEN_INTENTS.all(tx, {"ids": [write.task_id]})}
        settled = {e.name for e in write.effects if e.state is not EffectState.INTENT}
        opened = {e.name for e in write.effects if e.state is EffectState.INTENT}
        intent_open = bool((open_before - settled) | opened)
    ending = decide(AttemptFacts(
        Happened.ASKED, now=now, error_class=t.error_class, delay_s=t.delay_s,
        intent_open=intent_open, proposed=t.to, request=request,
        pause_active=pause_active, streak=count, quarantine_after=limit))
    rules = set(ending.rules)
    if "request_applied" in rules:
        check_transition(State.RUNNING, ending.state)
        t = Transition(
            ending.state, error=t.error, traceback=t.traceback, error_class=ending.error_class,
            reason=f"{request} requested by an operator; the attempt ended {t.to.value} "
                   f"({t.reason or t.error_class or '-'})")
    elif "pause_lifted" in rules:
        # Resumed before this holder reached its boundary: released instead.
        t = Transition(State.PENDING, reason="paused, then resumed before the "
                       "boundary: released (attempt handed back)")
    elif "request_dropped" in rules:
        why = f"{request} request dropped: the attempt ended {t.to.value} first"
        t = dataclasses.replace(t, reason=f"{t.reason}; {why}" if t.reason else why)
    if fp is not None and not ending.replaced:
        t = _count_failure(write, t, ending, count, limit, streaks, marks, audit, now)
    return t, ending.request


def _count_failure(
    write: TaskWrite, t: Transition, ending: Ending, count: int, limit: int | None,
    streaks: dict[str, tuple[str | None, int, int | None]],
    marks: list[dict[str, Any]], audit: list[AuditRow], now: float,
) -> Transition:
    """Count a fenced failure that carries an error fingerprint (DESIGN §7): the
    streak of failures in a row with the same fingerprint grows, or restarts at 1
    (``count``, this failure included). Where it ends at the task's
    ``quarantine_after`` is the outcome table's (``ending``): a ``RETRY_WAIT`` becomes
    a quarantined ``FAILED`` (``UNKNOWN``, not flagged, when an effect intent is open),
    and a ``FAILED`` (attempts exhausted, permanent) is flagged. Returns the transition
    to apply."""
    fp = t.fingerprint
    streaks[write.task_id] = (fp, count, limit)
    rules = set(ending.rules)
    if rules & {"quarantine", "quarantine_intent_open"}:
        why = f"quarantined: the same error {count} times in a row (fingerprint {fp})"
        check_transition(State.RUNNING, ending.state)
        t = dataclasses.replace(
            t, to=ending.state, delay_s=0.0,
            reason=why if ending.quarantined else f"{why}; an effect intent is open")
    if ending.quarantined:
        audit.append((write.task_id, now, "quarantine", State.RUNNING.value,
                      State.FAILED.value, write.generation, write.holder,
                      dumps({"fingerprint": fp, "cause": "error", "count": count,
                             "error_class": t.error_class})))
    marks.append({"id": write.task_id, "fingerprint": fp, "count": count, "crashes": None,
                  "quarantined": ending.quarantined})
    return t


def _naming(exc: WriteRejected, writes: Sequence[TaskWrite]) -> WriteRejected:
    """``exc`` with the writes of the refused batch named (operation and task, at most 5)."""
    named = ", ".join(f"{printable(w.operation)[:80]!r} of task {w.task_id}" for w in writes[:5])
    more = f" and {len(writes) - 5} more" if len(writes) > 5 else ""
    return WriteRejected(f"{exc} (in the batch: {named}{more})")
