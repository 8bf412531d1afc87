"""The outbox part of the soak: whether it can run, and the delivery check.

It runs once ``TaskContext.emit`` exists (the tasks then emit one message each), the CLI
has ``ratchet relay`` and a RabbitMQ client (pika) is importable. Until then the report
says that it did not run and why (:func:`outbox_unavailable_reason`).

The check (:func:`check_deliveries`): every emitted message was delivered at least once,
and per key the first occurrences (by message id) come in the order the outbox gave them
(the task number order is not the outbox order: two tasks of one key commit in any order,
so the expected order per key is the outbox's ``id`` order, read from the ledger).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import ratchet

__all__ = [
    "DeliveryReport",
    "check_deliveries",
    "check_outbox_rows",
    "emit_available",
    "outbox_unavailable_reason",
]


def emit_available() -> bool:
    """True when tasks can emit (``TaskContext.emit`` exists): the outbox half runs."""
    return hasattr(ratchet.TaskContext, "emit")


def check_outbox_rows(rows: Sequence[tuple[str, str | None, str | None]],
                      task_ids: Iterable[str]) -> list[str]:
    """The outbox half: every task emitted exactly one message, whatever its attempts.

    Args:
        rows: ``(message_id, key, task_id)`` of the outbox, in ``id`` order.
        task_ids: the soak's tasks.

    Returns:
        One line per problem (empty: one row per task, no stray row).
    """
    per_task: dict[str, int] = {}
    for _mid, _key, tid in rows:
        per_task[tid or ""] = per_task.get(tid or "", 0) + 1
    wanted = set(task_ids)
    problems = []
    missing = [t for t in wanted if t not in per_task]
    twice = [t for t, n in per_task.items() if n > 1]
    stray = [t for t in per_task if t not in wanted]
    if missing:
        problems.append(f"{len(missing)} task(s) without an outbox message")
    if twice:
        problems.append(f"{len(twice)} task(s) with more than one message")
    if stray:
        problems.append(f"{len(stray)} message(s) of no soak task")
    return problems


def outbox_unavailable_reason(*, has_emit: bool | None = None, has_relay: bool | None = None,
                              has_pika: bool | None = None) -> str | None:
    """Why the outbox part cannot run here, or None when it can (arguments: what-ifs)."""
    if has_emit is None:
        has_emit = hasattr(ratchet.TaskContext, "emit")
    if not has_emit:
        return "ratchet.TaskContext has no emit() yet (the outbox is not on this branch)"
    if has_relay is None:
        has_relay = importlib.util.find_spec("ratchet.cli.relay") is not None
    if not has_relay:
        return "the CLI has no `ratchet relay` yet"
    if has_pika is None:
        has_pika = importlib.util.find_spec("pika") is not None
    if not has_pika:
        return "pika is not installed (pip install pika) to consume from RabbitMQ"
    return None


@dataclass
class DeliveryReport:
    """What the consumer saw against what the outbox holds."""

    expected: int = 0
    delivered_distinct: int = 0
    deliveries: int = 0
    missing: list[str] = field(default_factory=list)
    out_of_order_keys: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.out_of_order_keys


def check_deliveries(outbox: Sequence[tuple[str, str | None]],
                     delivered: Iterable[tuple[str, str | None]]) -> DeliveryReport:
    """Compare the outbox (``(message_id, key)`` in outbox ``id`` order) with what was
    delivered (``(message_id, key)`` in arrival order, duplicates included)."""
    report = DeliveryReport(expected=len(outbox))
    first_seen: dict[str, list[str]] = {}
    seen: set[str] = set()
    for message_id, key in delivered:
        report.deliveries += 1
        if message_id in seen:
            continue
        seen.add(message_id)
        first_seen.setdefault(key or "", []).append(message_id)
    report.delivered_distinct = len(seen)
    wanted: dict[str, list[str]] = {}
    for message_id, key in outbox:
        wanted.setdefault(key or "", []).append(message_id)
        if message_id not in seen:
            report.missing.append(message_id)
    for key, ids in wanted.items():
        if key == "":
            continue  # messages without a key have no order to keep
        got = [m for m in first_seen.get(key, []) if m in set(ids)]
        if got != [m for m in ids if m in seen]:
            report.out_of_order_keys.append(key)
    return report


def summarize(report: DeliveryReport) -> Mapping[str, object]:
    """The report as JSON-ready numbers."""
    return {"expected": report.expected, "delivered_distinct": report.delivered_distinct,
            "deliveries": report.deliveries, "missing": len(report.missing),
            "out_of_order_keys": len(report.out_of_order_keys), "ok": report.ok}
