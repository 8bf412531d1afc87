"""What the dashboard's templates show, computed from Control's records: formatting of
times, durations, rates and stored values, a task's merged timeline, and the tree of its
children.

Pure functions over the frozen records of :mod:`ratchet.control`; nothing here reads the
ledger itself (:func:`child_tree` reads through the function it is given).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..control import LATE_ACCOUNTED_FOR, TaskInfo, TaskTimeline
from ..errortext import error_summary
from ..serde import Undecodable, printable

__all__ = [
    "MAX_TREE_DEPTH",
    "MAX_TREE_NODES",
    "ChildNode",
    "TimelineRow",
    "ago",
    "child_tree",
    "drain",
    "duration",
    "error_line",
    "rate",
    "show_value",
    "timeline_rows",
    "when",
]


def when(epoch_s: float | None) -> str:
    """``2026-12-01 11:30:02.125Z`` (UTC, milliseconds), ``-`` for None."""
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def duration(seconds: float | None) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``,
    ``3 d 4 h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def ago(epoch_s: float | None, now: float) -> str:
    """``12.3 s ago`` relative to ``now`` (the ledger clock), ``-`` for None."""
    if epoch_s is None:
        return "-"
    return f"{duration(now - epoch_s)} ago"


def rate(per_s: float | None, unit: str = "/s") -> str:
    """A rate in tasks per second: ``12.5/s``, ``0.25/s``, ``0/s``; ``-`` for None
    (``unit=""``: the number alone, under a "per second" heading)."""
    if per_s is None:
        return "-"
    if per_s == 0:
        return f"0{unit}"
    if abs(per_s) >= 100:
        return f"{per_s:.0f}{unit}"
    return f"{per_s:.3g}{unit}"


def show_value(value: Any) -> str:
    """A stored value as compact JSON text; an undecodable one as its text and the reason."""
    if isinstance(value, Undecodable):
        return f"(undecodable: {value.error}) {value.text}"
    try:
        return json.dumps(value, separators=(", ", ": "), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return printable(repr(value))


def error_line(text: str | None) -> str:
    """One line of a recorded error: its type and the first line of its message
    (:func:`ratchet.errortext.error_summary`)."""
    return error_summary(text)


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One row of a task's timeline.

    Attributes:
        at: ledger clock, epoch seconds.
        kind: a CSS-friendly category: ``submit``, ``claim``, ``takeover``,
            ``transition``, ``step``, ``effect``, ``lookup``, ``stale``, ``late``,
            ``operator``, ``other``.
        label: what happened, one line.
        generation: the fencing generation involved (None when none).
        holder: the lease holder involved (None when none).
        detail: further facts, ``key=value`` text.
        operator, reason: who acted and why (operator actions).
    """

    at: float
    kind: str
    label: str
    generation: int | None
    holder: str | None
    detail: str
    operator: str | None = None
    reason: str | None = None


_LABELS = {
    "claim": "claimed",
    "takeover": "taken over (the previous lease had expired)",
    "stale_rejected": "stale write rejected (old fencing generation)",
    "lookup_hit": "lookup settled an effect",
    "late_effect": "LATE effect: sent by a stale holder after a takeover",
    "idempotency_conflict": "idempotency key reused with other params (refused)",
}


def _kind(kind: str) -> str:
    if kind.startswith("operator_"):
        return "operator"
    return {"claim": "claim", "takeover": "takeover", "transition": "transition",
            "stale_rejected": "stale", "lookup_hit": "lookup",
            "late_effect": "late"}.get(kind, "other")


def _detail(detail: dict[str, Any], skip: tuple[str, ...]) -> str:
    return " ".join(f"{k}={show_value(v) if not isinstance(v, str) else printable(v)}"
                    for k, v in detail.items() if k not in skip)


def timeline_rows(tl: TaskTimeline) -> list[TimelineRow]:
    """Every recorded fact of a task in time order: its submission, claims and takeovers
    (holder, generation), transitions, committed steps, effects with their keys, lookups,
    stale rejections, late effects and operator actions (who, why). Within one instant:
    submitted, claims, steps and effects, then transitions (the CLI's order)."""
    t = tl.task
    rows: list[tuple[float, int, TimelineRow]] = [(t.created_at, 0, TimelineRow(
        t.created_at, "submit", "submitted", None, None,
        f"key={t.idempotency_key}" if t.idempotency_key is not None else "no idempotency key"))]
    for e in tl.events:
        if e.kind == "late_effect" and tl.late_effects:
            continue  # shown from the late-effect records below, with what was recorded
        kind = _kind(e.kind)
        if e.kind == "transition":
            label = f"{e.from_state} -> {e.to_state}"
        elif kind == "operator":
            action = e.kind.removeprefix("operator_")
            moved = f" ({e.from_state} -> {e.to_state})" if e.to_state else ""
            label = f"operator {action}{moved}"
        else:
            label = _LABELS.get(e.kind, e.kind)
        detail = dict(e.detail)
        if "error" in detail:
            detail["error"] = error_line(str(detail["error"]))
        operator = detail.get("operator") if kind == "operator" else None
        reason = detail.get("reason") if kind == "operator" else None
        rows.append((e.at, 3 if e.kind == "transition" else 1, TimelineRow(
            e.at, kind, label, e.generation, e.holder,
            _detail(detail, ("operator", "reason") if kind == "operator" else ()),
            str(operator) if operator is not None else None,
            str(reason) if reason is not None else None)))
    for s in tl.steps:
        rows.append((s.committed_at, 2, TimelineRow(
            s.committed_at, "step", f"step {s.name} committed", s.generation, None,
            f"result={show_value(s.result)}")))
    for eff in tl.effects:
        via = " via lookup" if eff.via_lookup else ""
        rows.append((eff.updated_at, 2, TimelineRow(
            eff.updated_at, "effect", f"effect {eff.name} {eff.state}{via}", eff.generation,
            None, f"key={eff.key} calls={eff.calls} attempt={eff.attempt}")))
    for le in tl.late_effects:
        rows.append((le.at, 2, TimelineRow(
            le.at, "late", f"LATE effect {le.effect} ({le.outcome})", le.generation,
            le.holder, f"key={le.key} "
            + ("accounted for (the only request sent; a lookup hit settled the effect)"
               if le.kind == LATE_ACCOUNTED_FOR else "possible duplicate at the target")
            + f"; ledger recorded key={le.recorded_key} generation={le.recorded_generation}")))
    return [row for _, _, row in sorted(rows, key=lambda r: (r[0], r[1]))]


def drain(row: Any) -> str:
    """The drain column of one task type: the verdict of its ``TypeStatusView``
    (``drain``: paused by whom since when, limited, ``drains in ~X (at the last N s's
    rate)``, ``backlog growing by N/s``, ``no backlog``, ...), made once in
    :mod:`ratchet.capacity` for every face; ``-`` when a record has none."""
    return str(getattr(row, "drain", "") or "-")


MAX_TREE_DEPTH = 3
"""Levels of a task's children tree the task page shows (children, grandchildren, ...);
a deeper one is on its own task's page."""

MAX_TREE_NODES = 200
"""Tasks at most in one children tree (one ledger read each, but the first level's);
the rest are counted, not listed."""


@dataclass(frozen=True, slots=True)
class ChildNode:
    """One task of a children tree.

    Attributes:
        task: the child.
        children: its own children that are shown, oldest first.
        hidden: its children not shown (over :data:`MAX_TREE_NODES`).
        unread: True when its children were not read (below :data:`MAX_TREE_DEPTH`, or
            the node budget spent): its own page shows them.
    """

    task: TaskInfo
    children: list[ChildNode]
    hidden: int = 0
    unread: bool = False


def child_tree(children: Sequence[TaskInfo], read_children: Callable[[str], list[TaskInfo]],
               *, max_depth: int = MAX_TREE_DEPTH, max_nodes: int = MAX_TREE_NODES,
               ) -> tuple[list[ChildNode], int]:
    """The tree of a task's ``children`` (its first level, already read), level by level
    (every child before any grandchild), each task's children read with
    ``read_children(task_id)`` (blocking: call it off the event loop), at most
    ``max_depth`` levels and ``max_nodes`` tasks.

    Returns:
        ``(the first level's nodes, how many of the first level are not shown)``.
    """
    first = list(children[:max_nodes])
    budget = max_nodes - len(first)
    below: dict[str, list[TaskInfo]] = {}
    hidden: dict[str, int] = {}
    frontier = [(task, 1) for task in first]
    while frontier:
        following: list[tuple[TaskInfo, int]] = []
        for task, depth in frontier:
            if depth >= max_depth or budget <= 0 or task.task_id in below:
                continue
            found = read_children(task.task_id)
            shown = found[:budget]
            budget -= len(shown)
            below[task.task_id] = shown
            hidden[task.task_id] = len(found) - len(shown)
            following += [(child, depth + 1) for child in shown]
        frontier = following

    def node(task: TaskInfo, path: frozenset[str]) -> ChildNode:
        if task.task_id not in below or task.task_id in path:
            return ChildNode(task, [], unread=True)
        inner = path | {task.task_id}
        return ChildNode(task, [node(c, inner) for c in below[task.task_id]],
                         hidden[task.task_id])

    return [node(task, frozenset()) for task in first], len(children) - len(first)
