"""The outbox part of the soak: whether it can run, and the delivery check.

It runs once ``TaskContext.emit`` exists (the tasks then emit one message each), the CLI
has ``ratchet relay``, a RabbitMQ client (aio-pika, in the ``test`` extra) is importable and
the broker answers. Otherwise the report says that it did not run and why
(:func:`outbox_unavailable_reason`, :func:`broker_unreachable_reason`).

The consumer (:class:`AmqpConsumer`) runs an asyncio loop on a thread of the soak: it
declares the run's own topic exchange and a queue bound to all of it (before any relay
starts, so nothing is published unrouted), records every delivery (message id, the
``ratchet-key`` and ``ratchet-outbox-id`` headers), acks it after recording, and deletes
the queue and the exchange at the end.

The check (:func:`check_deliveries`): every emitted message was delivered at least once,
and per key the first occurrences (by message id) come in the order the outbox gave them
(the task number order is not the outbox order: two tasks of one key commit in any order,
so the expected order per key is the outbox's ``id`` order, read from the ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import ratchet

__all__ = [
    "AmqpConsumer",
    "DeliveryReport",
    "broker_unreachable_reason",
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
                              has_client: bool | None = None) -> str | None:
    """Why the outbox part cannot run here, or None when it can (arguments: what-ifs)."""
    if has_emit is None:
        has_emit = hasattr(ratchet.TaskContext, "emit")
    if not has_emit:
        return "ratchet.TaskContext has no emit() yet (the outbox is not on this branch)"
    if has_relay is None:
        has_relay = importlib.util.find_spec("ratchet.cli.relay") is not None
    if not has_relay:
        return "the CLI has no `ratchet relay` yet"
    if has_client is None:
        has_client = importlib.util.find_spec("aio_pika") is not None
    if not has_client:
        return "aio-pika is not installed (pip install -e '.[test]') to consume from RabbitMQ"
    return None


def broker_unreachable_reason(amqp_url: str, timeout_s: float = 3.0) -> str | None:
    """Why RabbitMQ at ``amqp_url`` cannot be used, or None when its port answers."""
    parts = urlsplit(amqp_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"RabbitMQ at {host}:{port} is not reachable ({exc})"
    return None


@dataclass
class DeliveryReport:
    """What the consumer saw against what the outbox holds."""

    expected: int = 0
    delivered_distinct: int = 0
    deliveries: int = 0
    missing: list[str] = field(default_factory=list)
    out_of_order_keys: list[str] = field(default_factory=list)
    unexpected: int = 0

    @property
    def duplicates(self) -> int:
        """Deliveries beyond the first of their message id (allowed: at least once)."""
        return self.deliveries - self.delivered_distinct

    @property
    def ok(self) -> bool:
        return not self.missing and not self.out_of_order_keys and not self.unexpected


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
    report.unexpected = len(seen - {m for m, _ in outbox})
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
            "deliveries": report.deliveries, "duplicates": report.duplicates,
            "missing": len(report.missing), "unexpected": report.unexpected,
            "out_of_order_keys": len(report.out_of_order_keys), "ok": report.ok}


class AmqpConsumer:
    """Consumes the run's exchange on a thread of its own (an asyncio loop, aio-pika).

    Args:
        url: the broker, ``amqp://user:pass@host:port/`` (no query).
        name: the run's exchange and queue name (both made here, deleted by :meth:`stop`).
    """

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.deliveries: list[tuple[str, str | None, int]] = []
        self.redelivered = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, name="amqp-consumer", daemon=True)
        self._deleted = False

    def start(self, timeout_s: float = 30.0) -> None:
        """Declare the exchange and the queue, start consuming; raise when it cannot."""
        self._thread.start()
        if not self._ready.wait(timeout_s) or self.errors:
            raise RuntimeError("the AMQP consumer did not start: "
                               + ("; ".join(self.errors) or f"nothing in {timeout_s:.0f} s"))

    def seen(self) -> list[tuple[str, str | None, int]]:
        """Every delivery so far, in arrival order: ``(message_id, key, outbox id)``."""
        with self._lock:
            return list(self.deliveries)

    def distinct(self) -> set[str]:
        with self._lock:
            return {m for m, _, _ in self.deliveries}

    def wait_for(self, ids: set[str], timeout_s: float) -> bool:
        """Wait until every id of ``ids`` was delivered (True) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ids <= self.distinct():
                return True
            time.sleep(0.2)
        return ids <= self.distinct()

    def stop(self) -> None:
        """Stop consuming and delete the queue and the exchange (idempotent)."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=30)
        if not self._deleted:
            self._deleted = True
            asyncio.run(self._delete())

    async def _delete(self) -> None:
        import aio_pika

        connection = await aio_pika.connect(self.url, timeout=10)
        try:
            channel = await connection.channel()
            await channel.queue_delete(self.name)
            await channel.exchange_delete(self.name)
        finally:
            await connection.close()

    def _main(self) -> None:
        try:
            asyncio.run(self._consume())
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self._ready.set()

    async def _consume(self) -> None:
        import aio_pika

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        connection = await aio_pika.connect_robust(self.url, timeout=10)
        connection.reconnect_callbacks.add(self._on_reconnect)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=500)
            exchange = await channel.declare_exchange(self.name, aio_pika.ExchangeType.TOPIC,
                                                      durable=True)
            queue = await channel.declare_queue(self.name, durable=True)
            await queue.bind(exchange, "#")
            await queue.consume(self._on_message)
            self._ready.set()
            await self._stop.wait()
        finally:
            await connection.close()

    def _on_reconnect(self, *_args: Any) -> None:
        self.reconnects += 1

    async def _on_message(self, message: Any) -> None:
        headers = message.headers or {}
        key = headers.get("ratchet-key")
        raw_id = headers.get("ratchet-outbox-id")
        with self._lock:
            self.deliveries.append((str(message.message_id),
                                    None if key is None else str(key),
                                    -1 if raw_id is None else int(str(raw_id))))
            if message.redelivered:
                self.redelivered += 1
        await message.ack()
