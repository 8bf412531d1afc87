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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ...errors import InvalidArguments, TaskNotFound
from ...serde import dumps
from ...states import State
from ...validation import MAX_VERSION, check_int
from ..base import COMPENSABLE_STEP, COMPENSATING_STEP, NewTask
from ..dialect import Tx
from ..records_fork import FORK_AT_END, ForkLinks, ForkRecord
from ..rows import DEFINITIONS_OF, Read, insert_audit, task_state
from .core import EngineCore
from .schema import DEFINITIONS
from .submit import submit_in

__all__ = ["FORKABLE", "FORKS", "Forks", "fork_point"]

FORKS = "forks.sql"
"""The migration of the ``forks`` table (schema 17)."""

FORKABLE = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
"""The states a task can be forked from: ended, so that the source never runs again
beside its fork. ``COMPENSATED`` (and ``COMPENSATING``) are refused: their completed
effects were undone, and a fork would take them as done."""

_MARKERS = frozenset({COMPENSABLE_STEP, COMPENSATING_STEP})
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


class _LinkRow(NamedTuple):
    task_id: str
    source_id: str
    from_step: str
    from_seq: int
    source_version: int
    version: int
    created_at: float
    by: str
    reason: str


_SOURCE = Read.rows("fork_source", _SourceRow._make)
_HISTORY = Read.rows("fork_history", _HistoryRow._make)


def _record(row: Iterable[Any]) -> ForkRecord:
    r = _LinkRow._make(row)
    return ForkRecord(r.task_id, r.source_id, r.from_step, int(r.from_seq),
                      int(r.source_version), int(r.version), float(r.created_at), r.by,
                      r.reason)


_LINKS = Read.rows("fork_links", _record)


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
        f"task {task_id} has no checkpoint {from_step!r} (a stored name: 'name' is its "
        f"first occurrence, 'name#2' the second); {recorded}. A step that failed is not "
        f"recorded: to run again from it, fork from {FORK_AT_END!r} (after the last one)")


class Forks:
    """Fork and fork links of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def fork(self, task_id: str, from_step: str, new_task_id: str, version: int | None,
             reason: str, operator: str, known_versions: Sequence[int] = ()) -> ForkRecord:
        """See :meth:`Ledger.fork`."""
        self.core.schema.require(FORKS, "fork")
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
                        "registered it and this caller's app does not define it (known: "
                        f"{', '.join(map(str, known))})")
            history = _HISTORY.all(tx, {"id": task_id})
            seq = fork_point(task_id, history, from_step)
            now = tx.now
            submit_in(tx, [NewTask(
                task_id=new_task_id, name=src.name, version=pinned, params_json=src.params,
                params_digest=src.params_digest, idempotency_key=None,
                max_attempts=src.max_attempts, lease_s=float(src.lease_s),
                quarantine_after=src.quarantine_after, tenant=src.tenant,
                queue=src.queue, priority=src.priority, fair_key=src.fair_key,
                ckey=src.ckey, ckey_max=src.ckey_max, rate_key=src.rate_key)])
            generation = src.generation + 1
            tx.execute("fork_generation", {"id": new_task_id, "generation": generation})
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
