"""The views of flow control in :class:`ratchet.Control`'s reports (DESIGN §8, flow
control): a rate limit with the tasks it holds back, the live tasks per queue, the tasks
of a type flow control holds back."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..ledger.base import FlowCount, RateLimitSetting, WorkerSlots

__all__ = ["QueueStatusView", "RateLimitView", "TypeFlowView", "flow_views", "rate_text"]

_UNITS = (("s", 1.0), ("m", 60.0), ("h", 3600.0), ("d", 86400.0))


def rate_text(per_s: float) -> str:
    """A rate, tasks per second, as ``parse_rate`` reads it: ``"20/s"``, ``"100/m"``,
    ``"2/d"`` (the first unit in which it is a whole count), else ``"0.37/s"``."""
    for unit, seconds in _UNITS:
        count = per_s * seconds
        if count >= 1 and math.isclose(count, round(count), rel_tol=1e-9):
            return f"{round(count)}/{unit}"
    return f"{per_s:.4g}/s"


@dataclass(frozen=True, slots=True)
class RateLimitView:
    """One rate limit and the tasks it holds back now (``ratchet limits``).

    Attributes:
        scope: ``"type"`` (a task type's claims) or ``"downstream"``.
        name: the task type (or downstream).
        rate: the rate as text (``"20/s"``; :func:`rate_text`); per_s: tasks per second.
        burst: the bucket's size, tasks.
        key_param: the parameter whose value is the bucket key, or None.
        source: ``"code"`` (registered by a worker from ``@app.task(rate_limit=...)``) or
            ``"operator"`` (wins over the code's until cleared).
        version, updated_at, updated_by, reason: the row's last write (for a code row:
            the worker that registered it, reason ``"declared in code"``).
        held: tasks of the type held back by it now (``PENDING`` / ``RETRY_WAIT``,
            ``flow_wait`` ``"rate"``, ``run_at`` to come).
    """

    scope: str
    name: str
    rate: str
    per_s: float
    burst: int
    key_param: str | None
    source: str
    version: int
    updated_at: float
    updated_by: str | None
    reason: str | None
    held: int = 0

    @classmethod
    def of(cls, row: RateLimitSetting, held: int) -> RateLimitView:
        """The view of a ledger row with its held-back count."""
        return cls(row.scope, row.name, rate_text(row.per_s), row.per_s, row.burst,
                   row.key_param, row.source, row.version, row.updated_at, row.updated_by,
                   row.reason, held)


@dataclass(frozen=True, slots=True)
class QueueStatusView:
    """Live tasks of one queue (``ratchet status``, per queue).

    Attributes:
        queue: the queue's name.
        ready: ``PENDING`` / ``RETRY_WAIT`` tasks due now (rate-limited ones whose instant
            came included).
        scheduled: those whose ``run_at`` is still to come, rate-limited ones excepted.
        running: ``RUNNING`` tasks.
        key_waiting: tasks waiting for a concurrency key's slot (``flow_wait`` ``"key"``).
        rate_limited: tasks a rate limit holds back now (``flow_wait`` ``"rate"``,
            ``run_at`` to come).
        waiting: other parked tasks (``WAITING`` on a sleep, an event, children;
            ``COMPENSATING``).
        workers: live workers that serve the queue (``--queues`` naming it, or none given).
        unserved: tasks wait in the queue while live workers run and none serves it
            (a worker's ``--queues`` misspelt, or none started for it): they never start.
    """

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    key_waiting: int = 0
    rate_limited: int = 0
    waiting: int = 0
    workers: int = 0
    unserved: bool = False


@dataclass(frozen=True, slots=True)
class TypeFlowView:
    """Tasks of one type flow control holds back (``ratchet status``, metrics).

    Attributes:
        name: the task type.
        rate_limited: held back by a rate limit now (as :attr:`QueueStatusView.rate_limited`).
        key_waiting: waiting for a concurrency key's slot.
    """

    name: str
    rate_limited: int = 0
    key_waiting: int = 0


def serving_workers(workers: Sequence[WorkerSlots], counts: Iterable[FlowCount],
                    ) -> list[WorkerSlots]:
    """``workers`` with each one's types narrowed to those it can claim: a worker serving
    some queues (``--queues``) serves a type only if the type has live tasks in one of
    them, or none at all (the capacity figures of ``ratchet status``)."""
    queues_of: dict[str, set[str]] = {}
    for c in counts:
        queues_of.setdefault(c.name, set()).add(c.queue)
    out = []
    for w in workers:
        if w.queues is not None:
            names = tuple(n for n in w.names
                          if n not in queues_of or queues_of[n] & set(w.queues))
            w = WorkerSlots(w.holder, w.slots, names, w.queues)
        out.append(w)
    return out


def flow_views(counts: Iterable[FlowCount], workers: Sequence[WorkerSlots] = (),
               ) -> tuple[list[QueueStatusView], list[TypeFlowView]]:
    """Per queue (every queue with a live task) and per type (those with a task held back
    by flow control), by name, from :meth:`Ledger.flow_counts` rows; ``workers``: the live
    workers (:meth:`Ledger.live_worker_slots`), for who serves each queue."""
    queues: dict[str, dict[str, int]] = {}
    types: dict[str, dict[str, int]] = {}
    for c in counts:
        q = queues.setdefault(c.queue, {})
        later = c.n - c.due
        if c.state in ("PENDING", "RETRY_WAIT"):
            q["ready"] = q.get("ready", 0) + c.due
            what = "rate_limited" if c.flow_wait == "rate" else "scheduled"
            q[what] = q.get(what, 0) + later
            if c.flow_wait == "rate" and later:
                t = types.setdefault(c.name, {})
                t["rate_limited"] = t.get("rate_limited", 0) + later
        elif c.state == "RUNNING":
            q["running"] = q.get("running", 0) + c.n
        elif c.flow_wait == "key":
            q["key_waiting"] = q.get("key_waiting", 0) + c.n
            t = types.setdefault(c.name, {})
            t["key_waiting"] = t.get("key_waiting", 0) + c.n
        else:
            q["waiting"] = q.get("waiting", 0) + c.n
    views = []
    for name in sorted(queues):
        serving = sum(1 for w in workers if w.queues is None or name in w.queues)
        waiting = sum(v for k, v in queues[name].items() if k != "running")
        views.append(QueueStatusView(name, **queues[name], workers=serving,
                                     unserved=bool(workers) and not serving and waiting > 0))
    return (views,
            [TypeFlowView(name, **types[name]) for name in sorted(types)])
