"""Outbox relay throughput and publish lag (a measurement tool, not a test).

Messages/s from commit to broker confirmation with one and two relays, RabbitMQ and NATS
JetStream, on a PostgreSQL ledger (a private schema, dropped after); and the publish lag
(commit returned -> broker confirmed) p50 / p99 on an idle relay woken by NOTIFY. The
relays run in this process (one event loop each, on threads) so that the confirmation time
of every message is known.

    .venv/bin/python bench/outbox.py [--messages 20000] [--keys 200] [--lag 200]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import threading
import time
from collections.abc import Sequence

import aio_pika
import psycopg

from ratchet import open_ledger
from ratchet.ledger.base import Ledger, OutboxRow
from ratchet.outbox import new_message
from ratchet.relay import Publisher, Relay, RelayOptions, default_holder, parse_target
from ratchet.relay import publisher_for as make_publisher

PG = "postgresql://postgres@127.0.0.1:5432/test"
TARGETS = {"rabbitmq": "amqp://guest:guest@127.0.0.1:5672/?exchange=ratchet-bench",
           "nats": "nats://127.0.0.1:4222?stream=RATCHETBENCH&prefix=ratchetbench"}


class Timed:
    """A publisher that notes when each message was confirmed."""

    def __init__(self, inner: Publisher, confirmed: dict[str, float]) -> None:
        self.inner = inner
        self.target = inner.target
        self.confirmed = confirmed

    async def connect(self) -> None:
        await self.inner.connect()

    async def publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        out = await self.inner.publish(rows)
        now = time.perf_counter()
        for row, result in zip(rows, out, strict=True):
            if result is None:
                self.confirmed.setdefault(row.message_id, now)
        return out

    async def close(self) -> None:
        await self.inner.close()


def start_relays(url: str, target: str, n: int, confirmed: dict[str, float]
                 ) -> list[tuple[Relay, threading.Thread, Ledger]]:
    out = []
    for _ in range(n):
        ledger = open_ledger(url)
        relay = Relay(ledger, [Timed(make_publisher(parse_target(target)), confirmed)],
                      holder=default_holder("bench"), options=RelayOptions())
        thread = threading.Thread(target=asyncio.run, args=(relay.run(),), daemon=True)
        thread.start()
        out.append((relay, thread, ledger))
    return out


def stop_relays(relays: list[tuple[Relay, threading.Thread, Ledger]]) -> None:
    for relay, thread, ledger in relays:
        relay.stop()
        thread.join(30)
        ledger.close()


def wait(confirmed: dict[str, float], ids: set[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not ids <= confirmed.keys():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ids - confirmed.keys())} never confirmed")
        time.sleep(0.005)


def throughput(url: str, target: str, relays: int, messages: int, keys: int) -> float:
    confirmed: dict[str, float] = {}
    running = start_relays(url, target, relays, confirmed)
    time.sleep(1.0)  # connected and holding partitions
    ledger = open_ledger(url)
    tag = secrets.token_hex(4)
    ids = [f"tp-{tag}-{i}" for i in range(messages)]
    started = time.perf_counter()
    for i in range(0, messages, 500):
        ledger.emit([new_message("bench.event", {"i": j}, key=f"k{j % keys}",
                                 message_id=ids[j], max_payload_bytes=10_000)
                     for j in range(i, min(i + 500, messages))])
    wait(confirmed, set(ids))
    elapsed = max(confirmed[m] for m in ids) - started
    ledger.close()
    stop_relays(running)
    return messages / elapsed


def lag(url: str, target: str, n: int) -> tuple[float, float]:
    confirmed: dict[str, float] = {}
    running = start_relays(url, target, 1, confirmed)
    time.sleep(1.0)
    ledger = open_ledger(url)
    tag = secrets.token_hex(4)
    lags = []
    for i in range(n):
        mid = f"lag-{tag}-{i}"
        ledger.emit([new_message("bench.event", {"i": i}, key=f"k{i}", message_id=mid,
                                 max_payload_bytes=10_000)])
        committed = time.perf_counter()
        wait(confirmed, {mid}, 30)
        lags.append(confirmed[mid] - committed)
        time.sleep(0.02)  # idle between messages
    ledger.close()
    stop_relays(running)
    q = statistics.quantiles(lags, n=100)
    return q[49] * 1000, q[98] * 1000


AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def amqp_queue(create: bool) -> None:
    """Bind (or delete) the bench's queue to its exchange: the relay publishes mandatory,
    so a message no queue takes would be returned and stay unsent."""
    async def run() -> None:
        connection = await aio_pika.connect(AMQP, timeout=5)
        channel = await connection.channel()
        if create:
            exchange = await channel.declare_exchange("ratchet-bench",
                                                      aio_pika.ExchangeType.TOPIC,
                                                      durable=True)
            queue = await channel.declare_queue("ratchet-bench", durable=True)
            await queue.bind(exchange, "#")
        else:
            await channel.queue_delete("ratchet-bench")
        await connection.close()
    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--lag", type=int, default=200)
    args = parser.parse_args()
    amqp_queue(create=True)
    try:
        run_all(args)
    finally:
        amqp_queue(create=False)


def run_all(args: argparse.Namespace) -> None:
    for name, target in TARGETS.items():
        for relays in (1, 2):
            schema = f"bench_outbox_{secrets.token_hex(4)}"
            url = f"{PG}?schema={schema}"
            try:
                rate = throughput(url, target, relays, args.messages, args.keys)
                print(f"{name:9} relays={relays}  {rate:8.0f} messages/s "
                      f"({args.messages} messages, {args.keys} keys)", flush=True)
            finally:
                with psycopg.connect(PG, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        schema = f"bench_outbox_{secrets.token_hex(4)}"
        try:
            p50, p99 = lag(f"{PG}?schema={schema}", target, args.lag)
            print(f"{name:9} idle relay lag  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms "
                  f"({args.lag} messages)", flush=True)
        finally:
            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
