"""The task records :class:`ratchet.Control` answers with (a task's timeline, its steps
and effects, late effects, quarantine groups and replays): frozen dataclasses whose
``dataclasses.asdict`` is their JSON form (the CLI's ``--json``, the HTTP API); the
system-wide reports are in :mod:`ratchet.control._reports`.

The views of what the ledger stores (:class:`TaskTimeline`, :class:`StepView`,
:class:`EffectView`, :class:`LateEffectView`, :class:`TaskEffectView`,
:class:`QuarantineGroupView`) are built from the ledger's records
(:mod:`ratchet.ledger.base`) by their ``from_record`` / ``from_timeline``: the fields both
have by the same name are copied (the list is derived from the two classes, so a field the
ledger adds under a view's name is carried without a second copy of the code); the others
are the stored values decoded (``result_json`` -> ``result``, an ``Undecodable`` when not
JSON) or left out (digests, sequence numbers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..errortext import error_summary
from ..ledger.base import (
    FOREVER,
    LATE_POSSIBLE_DUPLICATE,
    AuditEvent,
    BatchRun,
    EffectRecord,
    EffectState,
    ForkLinks,
    ForkRecord,
    LateEffect,
    QuarantineGroup,
    ReplayedTask,
    StepRecord,
    TaskEffect,
    TaskInfo,
    Timeline,
    WaitInfo,
)
from ..serde import loads_stored
from ..storedtext import StoredState, UndecodableText

__all__ = [
    "BatchProgress",
    "EffectPage",
    "EffectView",
    "LateEffectView",
    "QuarantineGroupView",
    "ReplayReport",
    "StepView",
    "TaskEffectView",
    "TaskTimeline",
    "waiting_text",
]


def waiting_text(wait: WaitInfo) -> str | None:
    """What a task waits for, for people: ``"sleep until 2026-12-04T11:30:00Z"``,
    ``"event shipped/order-7"`` (``" until <when>"`` with a timeout), ``"3 children"``;
    None when it is not waiting (times are the ledger clock's, UTC)."""
    text = wait.describe()
    if text is None:
        return None
    if wait.until is not None and wait.until < FOREVER:
        at = datetime.fromtimestamp(wait.until, UTC).isoformat(timespec="seconds")
        text = f"{text} until {at.replace('+00:00', 'Z')}"
    return text


def _copied(view: type, record: type, *, converted: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of ``view`` that ``record`` has by the same name, in the view's order,
    except those the view holds ``converted`` (decoded, or of another type)."""
    names = {f.name for f in dataclasses.fields(record)}
    return tuple(f.name for f in dataclasses.fields(view)
                 if f.name in names and f.name not in converted)


def _copy(record: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(record, n) for n in names}


@dataclass(frozen=True, slots=True)
class LateEffectView:
    """A call a stale holder sent after its claim was taken over (DESIGN §5), for
    reconciliation: a possible duplicate at a target that cannot deduplicate, unless
    accounted for (``kind``).

    Attributes:
        seq: the record's sequence number in the ledger.
        task_id, task_name: the task (``task_name`` None if the task row is gone).
        effect: the effect's stored name (``name`` or ``name#N`` for its N-th occurrence).
        key: the business idempotency key the late call carried.
        generation: the stale holder's fencing token; holder: the stale holder.
        at: ledger clock when it was recorded, epoch seconds.
        outcome: ``done`` (the call returned) or ``unknown`` (it raised; it may have
            executed).
        detail: the call's result (decoded JSON) or the error text.
        recorded_key: the key the ledger recorded for this effect (what the current
            holder settled), None if none.
        recorded_generation: the generation that recorded the effect's outcome, if any.
        kind: ``accounted_for`` (:data:`~ratchet.ledger.base.LATE_ACCOUNTED_FOR`): the
            effect's record was settled by a lookup hit and only one intent was ever
            recorded for it, so the late call was the only request sent and the hit found
            its execution (the new holder did not call); ``possible_duplicate``: anything
            else (check the target). Read from the record as it is now: a late effect
            recorded before the new holder's lookup settled the record changes kind then.
    """

    seq: int
    task_id: str
    task_name: str | None
    effect: str
    key: str
    generation: int
    holder: str
    at: float
    outcome: str
    detail: Any
    recorded_key: str | None
    recorded_generation: int | None
    kind: str = LATE_POSSIBLE_DUPLICATE

    @classmethod
    def from_record(cls, le: LateEffect, task_name: str | None,
                    effects: list[EffectRecord]) -> LateEffectView:
        """The view of ``le``, a late effect of task ``task_name`` (None: the task row is
        gone) whose recorded effects are ``effects``: its ``detail`` decoded when the call
        returned, and what the ledger recorded for that effect."""
        recorded = next((e for e in effects if e.name == le.effect), None)
        detail = (loads_stored(le.detail, f"late effect {le.effect!r} detail")
                  if le.outcome == "done" and le.detail is not None else le.detail)
        return cls(
            **_copy(le, _LATE_COPIED), task_name=task_name, detail=detail,
            recorded_key=recorded.key if recorded else None,
            recorded_generation=recorded.generation
            if recorded and recorded.state is not EffectState.INTENT else None,
        )


@dataclass(frozen=True, slots=True)
class StepView:
    """A committed step of a task.

    Attributes:
        name: the step name.
        result: the stored value, decoded (an :class:`~ratchet.serde.Undecodable` when the
            stored text is not JSON).
        generation: fencing generation of the claim that committed it.
        committed_at: ledger clock, epoch seconds.
    """

    name: str
    result: Any
    generation: int
    committed_at: float

    @classmethod
    def from_record(cls, s: StepRecord) -> StepView:
        """The view of ``s``, its stored result decoded."""
        return cls(**_copy(s, _STEP_COPIED),
                   result=loads_stored(s.result_json, f"step {s.name!r}"))


@dataclass(frozen=True, slots=True)
class EffectView:
    """An effect of a task, as the ledger records it.

    Attributes:
        name: effect name; key: its business idempotency key.
        state: ``intent`` (outcome not recorded), ``done``, ``not_done`` or ``given_up``;
            a :class:`~ratchet.storedtext.StoredState` when the row holds another value.
        result: the recorded result, decoded (``Undecodable`` when not JSON).
        generation, attempt: the claim that wrote it last.
        calls: how many times the call was made.
        via_lookup: the result came from a lookup, not from a call.
        updated_at: ledger clock, epoch seconds.
        undecodable: the fields shown as stored (``"state"`` for a state that is not a
            known one; ``"name"``, ``"key"`` for text that is not valid UTF-8).
    """

    name: str
    key: str
    state: str
    result: Any
    generation: int
    attempt: int
    calls: int
    via_lookup: bool
    updated_at: float
    undecodable: tuple[str, ...] = ()

    @classmethod
    def from_record(cls, e: EffectRecord) -> EffectView:
        """The view of ``e``: its state as text, its result decoded, and in
        ``undecodable`` its fields shown as stored."""
        shown = tuple(f for f, v in (("name", e.name), ("key", e.key), ("state", e.state))
                      if isinstance(v, UndecodableText | StoredState))
        return cls(**_copy(e, _EFFECT_COPIED), state=e.state.value,
                   result=loads_stored(e.result_json, f"effect {e.name!r} result"),
                   undecodable=shown)


@dataclass(frozen=True, slots=True)
class TaskEffectView:
    """One effect of a task of a type, with its task (:meth:`Control.effects`).

    Attributes:
        task_id, task_name: the task. task_state: its state now (``SUCCEEDED``,
            ``UNKNOWN``, ...). task_generation: its current fencing generation.
        task_created_at: when it was submitted (ledger clock, epoch seconds).
        effect: the effect record (its ``name`` is the stored occurrence, ``name`` or
            ``name#N``).
    """

    task_id: str
    task_name: str
    task_state: str
    task_generation: int
    task_created_at: float
    effect: EffectView

    @classmethod
    def from_record(cls, te: TaskEffect, task_type: str) -> TaskEffectView:
        """The view of ``te``, an effect of a task of type ``task_type``."""
        return cls(**_copy(te, _TASK_EFFECT_COPIED), task_name=task_type,
                   task_state=te.task_state.value, effect=EffectView.from_record(te.effect))


@dataclass(frozen=True, slots=True)
class EffectPage:
    """A page of :meth:`Control.effects`.

    Attributes:
        effects: newest task first, by effect name within a task.
        next_cursor: pass it as ``cursor=`` for the next page; None when this is the last.
    """

    effects: list[TaskEffectView]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """One ``ctx.batches`` run of a task, for people (``ratchet inspect``, the dashboard).

    Attributes:
        task_id: the task.
        name: the run's name (``#N`` for its N-th occurrence).
        watermark: every item position below it is committed.
        total: the item count when known, else None.
        succeeded, failed, skipped: item counts of the committed batches.
        batches: how many batches committed.
        above: committed batches past the watermark, ``[start, end]`` pairs.
        done: the run finished.
        started_at, updated_at: ledger times of its first and last committed batch,
            epoch seconds.
        rate_per_s: items committed per second between those two times (None before two
            batches or when no time passed).
        eta_s: seconds left at that rate (None without a total or a rate; 0 when done).
    """

    task_id: str
    name: str
    watermark: int
    total: int | None
    succeeded: int
    failed: int
    skipped: int
    batches: int
    above: list[list[int]]
    done: bool
    started_at: float
    updated_at: float
    rate_per_s: float | None
    eta_s: float | None

    @classmethod
    def from_run(cls, run: BatchRun) -> BatchProgress:
        """The view of a ledger :class:`~ratchet.ledger.base.BatchRun`."""
        elapsed = run.updated_at - run.started_at
        rate = run.processed / elapsed if elapsed > 0 and run.batches > 1 else None
        eta: float | None = None
        if run.done:
            eta = 0.0
        elif run.total is not None and rate:
            eta = max(0, run.total - run.processed) / rate
        return cls(run.task_id, run.name, run.watermark, run.total, run.succeeded,
                   run.failed, run.skipped, run.batches, [list(a) for a in run.above],
                   run.done, run.started_at, run.updated_at, rate, eta)


@dataclass(frozen=True, slots=True)
class TaskTimeline:
    """What ``ratchet inspect`` shows: the task and everything the ledger knows about it.

    Attributes:
        task: the task row (params and result decoded; ``Undecodable`` when not JSON).
        events: audit events (claims, transitions, stale rejections, lookups, operator
            actions), oldest first.
        steps: committed steps, in code-path order.
        effects: effect records, in code-path order.
        late_effects: calls stale holders sent after a takeover (possible duplicates),
            newest first.
        children: the tasks it submitted with ``ctx.submit`` / ``ctx.submit_many``
            (each one's ``parent_id`` is this task), oldest first; their own children are
            on their own timelines. The parent is ``task.parent_id``.
        batches: its ``ctx.batches`` runs (watermark, total, counts, rate, ETA), in name
            order; empty when it has none.
        shards: a sharded job's shard count (``App.submit_sharded``), else None.
        shard_batches: a sharded job's shards' runs (each one's ``task_id`` is the shard
            task, a child whose ``params["ratchet:shard"]`` gives its index); empty unless
            the task is a sharded job.
        forked_from: the fork that made this task (``ratchet fork``: the original, the
            step, who and why), or None.
        forks: the tasks forked from this one, oldest first.
    """

    task: TaskInfo
    events: list[AuditEvent]
    steps: list[StepView]
    effects: list[EffectView]
    late_effects: list[LateEffectView] = field(default_factory=list)
    children: list[TaskInfo] = field(default_factory=list)
    batches: list[BatchProgress] = field(default_factory=list)
    shards: int | None = None
    shard_batches: list[BatchProgress] = field(default_factory=list)
    forked_from: ForkRecord | None = None
    forks: list[ForkRecord] = field(default_factory=list)

    @classmethod
    def from_timeline(cls, tl: Timeline, children: Sequence[TaskInfo] = (),
                      batches: Sequence[BatchRun] = (), shards: int | None = None,
                      shard_batches: Sequence[BatchRun] = (),
                      links: ForkLinks | None = None) -> TaskTimeline:
        """The view of the ledger's :class:`~ratchet.ledger.base.Timeline`: the same
        fields, each step, effect and late effect decoded; ``children``: the task's
        children as the ledger read them; ``batches``: its batch runs; ``shards`` and
        ``shard_batches``: a sharded job's shard count and its shards' runs; ``links``:
        its fork links."""
        effects = list(tl.effects)
        return cls(
            **_copy(tl, _TIMELINE_COPIED), events=list(tl.events),
            steps=[StepView.from_record(s) for s in tl.steps],
            effects=[EffectView.from_record(e) for e in effects],
            late_effects=[LateEffectView.from_record(le, tl.task.name, effects)
                          for le in tl.late_effects],
            children=list(children),
            batches=[BatchProgress.from_run(r) for r in batches], shards=shards,
            shard_batches=[BatchProgress.from_run(r) for r in shard_batches],
            forked_from=links.forked_from if links is not None else None,
            forks=list(links.forks) if links is not None else [],
        )


@dataclass(frozen=True, slots=True)
class QuarantineGroupView:
    """Quarantined tasks of one error fingerprint (``ratchet quarantine list``, DESIGN §7).

    Attributes:
        fingerprint: the error fingerprint (16 hex digits; ``--fingerprint`` of a replay).
        task_type: the task type (part of the fingerprint).
        count: quarantined ``FAILED`` tasks with it.
        error_class: the recorded failure class of the newest one (``lease_expired``: its
            worker died on every counted delivery).
        example_message: the newest one's error, one line (``Class: message``, the
            message's first line).
        example_error: the newest one's recorded error message in full.
        first_seen, last_seen: ledger clock of the first and the latest quarantine, epoch s.
        task_ids: a sample of its task ids (at most 5), newest first.
    """

    fingerprint: str
    task_type: str
    count: int
    error_class: str | None
    example_message: str
    example_error: str | None
    first_seen: float
    last_seen: float
    task_ids: list[str]

    @classmethod
    def from_record(cls, g: QuarantineGroup) -> QuarantineGroupView:
        """The view of ``g``: its example error in full and as one line."""
        return cls(**_copy(g, _QUARANTINE_COPIED), task_type=g.name,
                   example_message=error_summary(g.example_error),
                   first_seen=g.first_at, last_seen=g.last_at, task_ids=list(g.task_ids))


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a quarantine replay did (or, with ``dry_run``, would do).

    Attributes:
        fingerprint: the replayed fingerprint.
        dry_run: True: nothing was changed.
        rate_per_s: admission rate, tasks per second (``run_at`` staggered by ``1/rate``).
        operator, reason: who and why (audited per task unless a dry run).
        tasks: the tasks, in replay order, with the ``run_at`` each gets.
        ledger_now: the ledger clock when it ran, epoch seconds.
    """

    fingerprint: str
    dry_run: bool
    rate_per_s: float
    operator: str
    reason: str
    tasks: list[ReplayedTask]
    ledger_now: float



_LATE_COPIED = _copied(LateEffectView, LateEffect, converted=("detail",))
_STEP_COPIED = _copied(StepView, StepRecord, converted=("result",))
_EFFECT_COPIED = _copied(EffectView, EffectRecord, converted=("state", "result", "undecodable"))
_TASK_EFFECT_COPIED = _copied(TaskEffectView, TaskEffect, converted=("task_state", "effect"))
_TIMELINE_COPIED = _copied(TaskTimeline, Timeline,
                           converted=("events", "steps", "effects", "late_effects",
                                      "children", "batches", "shards", "shard_batches"))
_QUARANTINE_COPIED = _copied(QuarantineGroupView, QuarantineGroup, converted=("task_ids",))
