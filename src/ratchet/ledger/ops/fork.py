"""Fork a task from a step (``ratchet fork``, DESIGN §8, fork): a new task whose history is
the source's up to, not including, one of its checkpoints, pinned to a version and linked
to the source (:meth:`Ledger.fork <ratchet.ledger.base.Ledger.fork>`), and the links of a
task (:meth:`Ledger.fork_links <ratchet.ledger.base.Ledger.fork_links>`).

One transaction: the source's row is read (and locked on PostgreSQL) with its state
checked, the new task is inserted as a submit inserts one
(:func:`~ratchet.ledger.ops.submit.submit_in`: queue, key slot and rate key as the
source's), its generation set above the source's, the source's steps and effects at
positions below the fork point copied to it as they are, the link written to ``forks``
and an audit row ``forked`` written on both tasks.

Lineage: the fork holds the reserved step :data:`~ratchet.ledger.base.LINEAGE_STEP`
(without a position) naming the first task of its chain of forks. One task of a lineage
runs at a time: a fork, and a retry or compensate (:mod:`.commands`), is refused while
another task of the lineage has not ended (:func:`lineage`, :func:`refuse_live`), and the
task that starts gets a generation above every task of the lineage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ...errors import IllegalTransition, InvalidArguments, TaskNotFound
from ...serde import dumps, loads
from ...states import TERMINAL, State
from ...validation import MAX_VERSION, check_int
from ..base import COMPENSABLE_STEP, COMPENSATING_STEP, NewTask
from ..dialect import Tx
from ..records_fork import FORK_AT_END, LINEAGE_STEP, ForkLinks, ForkRecord
from ..rows import DEFINITIONS_OF, Read, insert_audit, task_state
from .core import EngineCore
from .schema import DEFINITIONS
from .segment import step_entry
from .submit import submit_in

__all__ = ["FORKABLE", "FORKS", "Forks", "Lineage", "fork_point", "lineage", "linked",
           "refuse_live", "stored_step_name"]

FORKS = "forks.sql"
"""The migration of the ``forks`` table (schema 17)."""

FORKABLE = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
"""The states a task can be forked from: ended, so that the source never runs again
beside its fork. ``COMPENSATED`` (and ``COMPENSATING``) are refused: their completed
effects were undone, and a fork would take them as done."""

_MARKERS = frozenset({COMPENSABLE_STEP, COMPENSATING_STEP, LINEAGE_STEP})
"""Steps the worker writes without a position (not checkpoints of the code path)."""

_LISTED = 50
"""The most recorded checkpoint names an error about an unknown fork point lists."""


class _SourceRow(NamedTuple):
    id: str
    name: str
    version: int
    state: Any
    generation: int
    params: str
    params_digest: str
    max_attempts: int
    lease_s: float
    quarantine_after: int | None
    tenant: str | None
    queue: str
    priority: int
    fair_key: str | None
    ckey: str | None
    ckey_max: int | None
    rate_key: str | None


class _HistoryRow(NamedTuple):
    kind: str
    name: str
    seq: int | None


class _MemberRow(NamedTuple):
    id: str
    state: Any
    generation: int


_SOURCE = Read.rows("fork_source", _SourceRow._make)
_HISTORY = Read.rows("fork_history", _HistoryRow._make)
_ROOT = Read.rows("fork_lineage_root", lambda row: str(next(iter(row))))
_MEMBERS = Read.rows("fork_lineage", _MemberRow._make)
_LINKED = Read.rows("fork_linked", lambda row: str(next(iter(row))))


def linked(tx: Tx, task_ids: Sequence[str], has_forks: bool) -> set[str]:
    """Which of ``task_ids`` a fork links (made by ``ratchet fork``, or forked from): the
    tasks a bulk move (quarantine replay) leaves to ``ratchet retry``, which checks their
    lineage. Empty without the ``forks`` table (``has_forks`` False) or ids."""
    if not has_forks or not task_ids:
        return set()
    return set(_LINKED.all(tx, {"ids": list(task_ids)}))


class Lineage(NamedTuple):
    """A task's lineage as a write that starts one of its tasks sees it (locked).

    Attributes:
        root: the lineage id (the first task of the chain of forks; the task itself when
            it is not a fork).
        live: the tasks of the lineage other than the one asked about that have not
            ended, as (task id, state).
        generation: the highest generation among the lineage's tasks (0 when none is
            left).
    """

    root: str
    live: tuple[tuple[str, str], ...]
    generation: int


def lineage(tx: Tx, task_id: str, has_forks: bool) -> Lineage:
    """The lineage of ``task_id`` in ``tx``, after taking its lock (PostgreSQL: an
    advisory lock on the lineage id, so that two writes starting tasks of one lineage are
    serialised; SQLite: the write lock already is). ``has_forks``: the ledger has the
    ``forks`` table (schema 17); without it a task is its own lineage and alone in it.

    Raises:
        UndecodableData: a stored lineage step is not a JSON string.
    """
    if not has_forks:
        return Lineage(task_id, (), 0)
    stored = _ROOT.first(tx, {"id": task_id, "name": LINEAGE_STEP})
    root = task_id
    if stored is not None:
        value = loads(stored, f"lineage step of task {task_id}")
        root = value if isinstance(value, str) and value else task_id
    tx.execute("fork_lineage_lock", {"root": root})
    members = _MEMBERS.all(tx, {"root": root})
    live = tuple((m.id, str(task_state(m.state))) for m in members
                 if m.id != task_id and task_state(m.state) not in TERMINAL)
    return Lineage(root, live, max((int(m.generation) for m in members), default=0))


def refuse_live(task_id: str, found: Lineage, what: str) -> None:
    """Raise unless ``found`` has no live task besides ``task_id``.

    Raises:
        IllegalTransition: another task of the lineage (a fork of it, the task it was
            forked from, a sibling fork) has not ended: ``what`` (e.g. ``"retried"``)
            would run the same history beside it.
    """
    if not found.live:
        return
    others = ", ".join(f"{tid} ({state})" for tid, state in found.live[:5])
    raise IllegalTransition(
        f"task {task_id} cannot be {what}: another task of its fork lineage has not ended "
        f"({others}); two tasks with one history would run side by side. Wait for it to "
        "end, or cancel it first (ratchet cancel)")


def _record(row: Iterable[Any]) -> ForkRecord:
    (task_id, source_id, from_step, from_seq, source_version, version, created_at, by,
     reason) = row
    return ForkRecord(task_id, source_id, from_step, int(from_seq), int(source_version),
                      int(version), float(created_at), by, reason)


_LINKS = Read.rows("fork_links", _record)


def stored_step_name(from_step: str) -> str:
    """``from_step`` as it is stored: ``name#1`` is ``name`` (a first occurrence is stored
    without a suffix); any other name as given."""
    return from_step[:-2] if from_step.endswith("#1") and len(from_step) > 2 else from_step


def fork_point(task_id: str, history: Sequence[_HistoryRow], from_step: str) -> int:
    """The position of the checkpoint stored as ``from_step`` in ``history`` (the lowest,
    when a step and an effect share the name); for :data:`FORK_AT_END`, the position after
    the last one.

    Raises:
        InvalidArguments: no checkpoint of that name (the message lists the recorded
            names in code-path order), or the history has checkpoints without a position
            (written by an older release: the fork point cannot be placed).
    """
    unplaced = [h.name for h in history if h.seq is None and h.name not in _MARKERS]
    if unplaced:
        raise InvalidArguments(
            f"task {task_id} has checkpoints recorded without a position by an older "
            f"release ({', '.join(sorted(unplaced)[:5])}): it cannot be forked")
    placed = [h for h in history if h.seq is not None]
    if from_step == FORK_AT_END:
        return max((h.seq for h in placed if h.seq is not None), default=-1) + 1
    found = [h.seq for h in placed if h.name == from_step and h.seq is not None]
    if found:
        return min(found)
    names = [f"{h.name} ({h.kind})" for h in placed[:_LISTED]]
    more = f", and {len(placed) - _LISTED} more" if len(placed) > _LISTED else ""
    recorded = (f"its recorded checkpoints, in order: {', '.join(names)}{more}" if names
                else "it recorded no checkpoint (fork it from nothing by re-submitting it)")
    raise InvalidArguments(
        f"task {task_id} has no checkpoint {from_step!r} (a stored name: 'name' or "
        f"'name#1' is its first occurrence, 'name#2' the second); {recorded}. A step that "
        f"failed is not recorded: to run again from it, fork from {FORK_AT_END!r} (after "
        "the last one)")


class Forks:
    """Fork and fork links of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def fork(self, task_id: str, from_step: str, new_task_id: str, version: int | None,
             reason: str, operator: str, known_versions: Sequence[int] = ()) -> ForkRecord:
        """See :meth:`Ledger.fork`."""
        self.core.schema.require(FORKS, "fork")
        from_step = stored_step_name(from_step)
        if version is not None:
            check_int(version, "version", minimum=1, maximum=MAX_VERSION)
        has_definitions = self.core.schema.has(DEFINITIONS)

        def body(tx: Tx) -> ForkRecord:
            src = _SOURCE.first(tx, {"id": task_id})
            if src is None:
                raise TaskNotFound(f"no task {task_id!r} in the ledger")
            state = task_state(src.state)
            if state not in FORKABLE:
                raise InvalidArguments(
                    f"task {task_id} is {state}: only an ended task (SUCCEEDED, FAILED or "
                    "CANCELLED) can be forked, so that it never runs beside its fork; "
                    "cancel it first (ratchet cancel), or wait for it to end"
                    + (" (a COMPENSATED task's effects were undone: submit it anew)"
                       if state in (State.COMPENSATED, State.COMPENSATING) else ""))
            pinned = src.version if version is None else version
            if pinned != src.version and pinned not in known_versions:
                stored = sorted({int(r.version) for r in DEFINITIONS_OF.all(
                    tx, {"names": [src.name]})}) if has_definitions else []
                if pinned not in stored:
                    known = sorted({*stored, *known_versions, src.version})
                    raise InvalidArguments(
                        f"version {pinned} of {src.name!r} is not known: no worker "
                        "registered it and no app defining it was given (pass the app: "
                        "ratchet fork --app MODULE:APP, or Control(app=...)) (known: "
                        f"{', '.join(map(str, known))})")
            history = _HISTORY.all(tx, {"id": task_id})
            seq = fork_point(task_id, history, from_step)
            found = lineage(tx, task_id, True)
            refuse_live(task_id, found, "forked")
            now = tx.now
            submit_in(tx, [NewTask(
                task_id=new_task_id, name=src.name, version=pinned, params_json=src.params,
                params_digest=src.params_digest, idempotency_key=None,
                max_attempts=src.max_attempts, lease_s=float(src.lease_s),
                quarantine_after=src.quarantine_after, tenant=src.tenant,
                queue=src.queue, priority=src.priority, fair_key=src.fair_key,
                ckey=src.ckey, ckey_max=src.ckey_max, rate_key=src.rate_key)])
            # Above every task of the lineage: the tokens the fork's claims hand to fenced
            # targets (and the lineage fence of ratchet.fencing) keep rising.
            generation = max(src.generation, found.generation) + 1
            tx.execute("fork_generation", {"id": new_task_id, "generation": generation})
            tx.batch("steps_upsert", [step_entry(new_task_id, generation,
                                                 (LINEAGE_STEP, dumps(found.root), None))],
                     now=now)
            copy = {"id": task_id, "new_id": new_task_id, "seq": seq,
                    "marker": COMPENSABLE_STEP}
            tx.execute("fork_copy_steps", copy)
            tx.execute("fork_copy_effects", copy)
            tx.execute("fork_insert", {
                "task_id": new_task_id, "source_id": task_id, "from_step": from_step,
                "from_seq": seq, "source_version": src.version, "version": pinned,
                "now": now, "by": operator, "reason": reason})
            before = [h for h in history if h.seq is not None and h.seq < seq]
            common = {"operator": operator, "reason": reason, "from_step": from_step,
                      "from_seq": seq, "source_version": src.version, "version": pinned}
            start = State.PENDING.value if src.ckey is None else State.WAITING.value
            insert_audit(tx, [
                (task_id, now, "forked", state.value, state.value, src.generation, None,
                 dumps({**common, "fork": new_task_id})),
                (new_task_id, now, "forked", None, start, generation, None,
                 dumps({**common, "forked_from": task_id,
                        "steps": sum(1 for h in before if h.kind == "step"),
                        "effects": sum(1 for h in before if h.kind == "effect")})),
            ])
            return ForkRecord(new_task_id, task_id, from_step, seq, src.version, pinned,
                              now, operator, reason)

        return self.core.dialect.run(body)

    def fork_links(self, task_id: str) -> ForkLinks:
        """See :meth:`Ledger.fork_links`."""
        if not self.core.schema.has(FORKS):
            return ForkLinks()

        def body(tx: Tx) -> ForkLinks:
            records = _LINKS.all(tx, {"id": task_id})
            made = next((r for r in records if r.task_id == task_id), None)
            return ForkLinks(made, tuple(r for r in records if r.source_id == task_id))

        return self.core.dialect.run(body, write=False)
