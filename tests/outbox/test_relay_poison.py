"""A message the broker refuses holds back its own key only: the other keys are delivered
at once, the refused key's later messages stay unsent behind it, the relay keeps its
connection and backs off (bounded attempts, low CPU)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import psutil
from outboxsupport import AmqpSink, NatsSink, emit, plan, relay_cmd

from ratchet import open_ledger
from ratchet.outbox import new_message, partition_of
from ratchet.testing import ProcessGroup, wait_for

OBSERVE_S = 3.0


def _emit_poison(url: str, topic: str, size: int) -> None:
    ledger = open_ledger(url)
    try:
        ledger.emit([new_message(topic, {"blob": "x" * size}, key="bad", message_id="poison",
                                 max_payload_bytes=4_000_000)])
    finally:
        ledger.close()


def _attempts(url: str) -> int:
    ledger = open_ledger(url)
    try:
        rows = ledger.outbox_fetch([partition_of("bad", "poison")], 1)
        assert rows and rows[0].message_id == "poison", "the poisoned message was sent"
        return rows[0].attempts
    finally:
        ledger.close()


def _check_backs_off(url: str, relay_pid: int, log: str) -> None:
    """Over OBSERVE_S: the poisoned message's attempts grow by a backoff's worth, the relay
    uses little CPU, and it never reconnected."""
    proc = psutil.Process(relay_pid)
    before, cpu0, t0 = _attempts(url), sum(proc.cpu_times()[:2]), time.monotonic()
    wait_for("an observation window", lambda: time.monotonic() - t0 >= OBSERVE_S,
             timeout_s=OBSERVE_S + 5)
    grew = _attempts(url) - before
    cpu = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
    assert grew <= 4, f"{grew} attempts in {OBSERVE_S} s: no backoff"
    assert cpu < 0.15, f"relay used {cpu:.0%} CPU while only a held key was left"
    assert "reconnecting" not in log, log


def test_a_message_too_large_for_nats_holds_back_only_its_key(
        nats_sink: NatsSink, procs: ProcessGroup, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    _emit_poison(url, "test.event", 1_500_000)  # above the server's max_payload (1 MiB)
    bad = [("bad", f"bad-{i}") for i in range(600)]
    others = plan(50, 2, "ok")
    emit(url, bad + others)
    relay = procs.spawn("relay", relay_cmd(url, nats_sink.to_url, batch=500))
    # Timed from when the relay holds its partitions, not from its spawn: a process start
    # takes seconds on a loaded machine.
    wait_for("the relay to hold its partitions", lambda: " partitions" in relay.log(),
             timeout_s=60)
    started = time.monotonic()
    seen = nats_sink.drain({m for _, m in others}, timeout_s=20)
    took = time.monotonic() - started
    assert {m for _, m in others} <= {s.message_id for s in seen}
    assert took < 10, f"the other keys took {took:.1f} s"
    wait_for("the refusal logged", lambda: "refused" in relay.log(), timeout_s=10)
    _check_backs_off(url, relay.pid, relay.log())
    assert relay.stop() == 0, relay.describe()
    seen = nats_sink.drain(set(), timeout_s=0.5)
    assert not [s for s in seen if s.key == "bad"], "a message of the held key was sent"
    assert _attempts(url) >= 1


def _declare_rejecting_queue(sink: AmqpSink, topic: str) -> None:
    """A queue bound to ``topic`` only that takes nothing (x-max-length 0,
    reject-publish): with publisher confirms, the broker nacks every message routed to
    it."""
    async def run() -> None:
        connection = await aio_pika.connect(sink.url, timeout=5)
        channel = await connection.channel()
        exchange = await channel.declare_exchange(sink.name, aio_pika.ExchangeType.TOPIC,
                                                  durable=True)
        queue = await channel.declare_queue(
            f"{sink.name}-full", auto_delete=True,
            arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
        await queue.bind(exchange, topic)
        await connection.close()
    asyncio.run(run())


def test_a_message_rabbitmq_nacks_holds_back_only_its_key(
        amqp: AmqpSink, procs: ProcessGroup, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    _declare_rejecting_queue(amqp, "test.poison")
    _emit_poison(url, "test.poison", 10)
    others = plan(50, 2, "ok")
    emit(url, others)
    relay = procs.spawn("relay", relay_cmd(url, amqp.to_url, batch=500))
    seen = amqp.drain({m for _, m in others}, timeout_s=20)
    assert {m for _, m in others} <= {s.message_id for s in seen}
    wait_for("the nack counted", lambda: _attempts(url) >= 1, timeout_s=10)
    # The key is on probation now: its later messages wait behind the refused one.
    emit(url, [("bad", f"bad-{i}") for i in range(600)])
    _check_backs_off(url, relay.pid, relay.log())
    assert relay.stop() == 0, relay.describe()
    seen = amqp.drain(set(), timeout_s=0.5)
    assert not [s for s in seen if s.key == "bad" and s.message_id != "poison"], (
        "a message behind the refused one was sent")
