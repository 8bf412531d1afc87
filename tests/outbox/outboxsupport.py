"""What the outbox relay tests share: consumers of a RabbitMQ queue and of a JetStream
stream (what a broker received, in order), the delivery check, the relay command line and
a producer of outbox rows."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import nats
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from ratchet import open_ledger
from ratchet.outbox import new_message


@dataclass(frozen=True)
class Seen:
    """One message as a consumer received it."""

    message_id: str
    key: str | None
    outbox_id: int


@dataclass(frozen=True)
class DeliveryReport:
    received: int
    unique: int
    duplicates: int


def check_delivery(seen: Sequence[Seen], expected: dict[str, list[str]]) -> DeliveryReport:
    """Every expected message at least once; per key, first occurrences in outbox order;
    nothing unexpected. Returns the counts (exactly once after dedupe by message id)."""
    first: dict[str, list[str]] = {}
    ids: set[str] = set()
    for s in seen:
        if s.message_id in ids:
            continue
        ids.add(s.message_id)
        first.setdefault(s.key or "", []).append(s.message_id)
    wanted = {m for ms in expected.values() for m in ms}
    missing = wanted - ids
    assert not missing, f"{len(missing)} messages never reached the broker: {sorted(missing)[:5]}"
    assert ids == wanted, f"unexpected messages: {sorted(ids - wanted)[:5]}"
    for key, order in expected.items():
        got = first.get(key, [])
        assert got == order, (
            f"key {key!r}: first occurrences out of order at "
            f"{next(i for i, (a, b) in enumerate(zip(got, order, strict=False)) if a != b)}")
    return DeliveryReport(len(seen), len(ids), len(seen) - len(ids))


class AmqpSink:
    """A durable queue bound to every routing key of exchange ``name``."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.seen: list[Seen] = []
        self.to_url = f"{url}?exchange={name}"

    async def _open(self) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractQueue]:
        connection = await aio_pika.connect(self.url, timeout=5)
        channel = await connection.channel()
        exchange = await channel.declare_exchange(self.name, aio_pika.ExchangeType.TOPIC,
                                                  durable=True)
        queue = await channel.declare_queue(self.name, durable=True)
        await queue.bind(exchange, "#")
        return connection, queue

    def declare(self) -> None:
        async def run() -> None:
            connection, _ = await self._open()
            await connection.close()
        asyncio.run(run())

    def delete(self) -> None:
        async def run() -> None:
            connection = await aio_pika.connect(self.url, timeout=5)
            channel = await connection.channel()
            await channel.queue_delete(self.name)
            await channel.exchange_delete(self.name)
            await connection.close()
        asyncio.run(run())

    def drain(self, until: set[str], timeout_s: float = 30.0) -> list[Seen]:
        """Read (and ack) what the queue holds until every id of ``until`` was seen or
        ``timeout_s`` passed; returns everything seen so far, in arrival order."""
        async def run() -> None:
            connection, queue = await self._open()
            deadline = time.monotonic() + timeout_s
            have = {s.message_id for s in self.seen}
            try:
                while not until <= have and time.monotonic() < deadline:
                    message = await queue.get(no_ack=True, fail=False)
                    if message is None:
                        await asyncio.sleep(0.05)
                        continue
                    key = message.headers.get("ratchet-key")
                    self.seen.append(Seen(str(message.message_id),
                                          None if key is None else str(key),
                                          int(str(message.headers["ratchet-outbox-id"]))))
                    have.add(str(message.message_id))
                # Whatever else is already there (late duplicates).
                while (message := await queue.get(no_ack=True, fail=False)) is not None:
                    key = message.headers.get("ratchet-key")
                    self.seen.append(Seen(str(message.message_id),
                                          None if key is None else str(key),
                                          int(str(message.headers["ratchet-outbox-id"]))))
            finally:
                await connection.close()
        asyncio.run(run())
        return list(self.seen)


class NatsSink:
    """A JetStream stream on ``<prefix>.>``, read in stream order."""

    def __init__(self, url: str, *, stream: str, prefix: str) -> None:
        self.url = url
        self.stream = stream
        self.prefix = prefix
        self.seen: list[Seen] = []
        self.to_url = f"{url}?stream={stream}&prefix={prefix}"
        self._next_seq = 1

    def declare(self) -> None:
        async def run() -> None:
            nc = await nats.connect(self.url)
            await nc.jetstream().add_stream(StreamConfig(name=self.stream,
                                                         subjects=[f"{self.prefix}.>"]))
            await nc.close()
        asyncio.run(run())

    def delete(self) -> None:
        async def run() -> None:
            nc = await nats.connect(self.url)
            with contextlib.suppress(NotFoundError):
                await nc.jetstream().delete_stream(self.stream)
            await nc.close()
        asyncio.run(run())

    def drain(self, until: set[str], timeout_s: float = 30.0) -> list[Seen]:
        """Read the stream from where the last call stopped, by sequence, until every id of
        ``until`` was seen or ``timeout_s`` passed."""
        async def run() -> None:
            nc = await nats.connect(self.url)
            js = nc.jetstream()
            deadline = time.monotonic() + timeout_s
            have = {s.message_id for s in self.seen}
            try:
                while time.monotonic() < deadline:
                    info = await js.stream_info(self.stream)
                    last = info.state.last_seq
                    while self._next_seq <= last:
                        msg = await js.get_msg(self.stream, self._next_seq)
                        self._next_seq += 1
                        headers = msg.headers or {}
                        self.seen.append(Seen(headers["Nats-Msg-Id"],
                                              headers.get("ratchet-key"),
                                              int(headers["ratchet-outbox-id"])))
                        have.add(headers["Nats-Msg-Id"])
                    if until <= have:
                        return
                    await asyncio.sleep(0.05)
            finally:
                await nc.close()
        asyncio.run(run())
        return list(self.seen)


def relay_cmd(ledger_url: str, *to: str, lease: str = "1s", batch: int = 100,
              name: str = "t") -> list[str]:
    """The ``ratchet relay`` command line of a test relay."""
    cmd = [sys.executable, "-m", "ratchet.cli.main", "relay", "--ledger", ledger_url,
           "--lease", lease, "--batch", str(batch), "--name", name]
    for url in to:
        cmd += ["--to", url]
    return cmd


def plan(keys: int, per_key: int, tag: str) -> list[tuple[str, str]]:
    """``(key, message id)`` in emit order: round-robin over the keys."""
    return [(f"k{k}", f"{tag}-k{k}-{i}") for i in range(per_key) for k in range(keys)]


def expected_of(rows: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, mid in rows:
        out.setdefault(key, []).append(mid)
    return out


def emit(ledger_url: str, rows: Sequence[tuple[str, str]], chunk: int = 50,
         pause_s: float = 0.0) -> None:
    """Write ``rows`` to the outbox, ``chunk`` per transaction, ``pause_s`` between."""
    ledger = open_ledger(ledger_url)
    try:
        for i in range(0, len(rows), chunk):
            ledger.emit([new_message("test.event", {"n": i + j}, key=key, message_id=mid,
                                     max_payload_bytes=10_000)
                         for j, (key, mid) in enumerate(rows[i:i + chunk])])
            if pause_s:
                time.sleep(pause_s)
    finally:
        ledger.close()


class Producer(threading.Thread):
    """:func:`emit` on a thread (messages keep arriving while relays come and go)."""

    def __init__(self, ledger_url: str, rows: Sequence[tuple[str, str]], chunk: int = 50,
                 pause_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.args = (ledger_url, rows, chunk, pause_s)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            emit(*self.args)
        except BaseException as exc:  # reported by the test
            self.error = exc


def unsent(ledger_url: str) -> int:
    """Rows of the outbox not marked sent."""
    ledger = open_ledger(ledger_url)
    try:
        return len(ledger.outbox_fetch(list(range(32)), 100_000))
    finally:
        ledger.close()


def require_broker(name: str, host: str, port: int) -> None:
    """Skip (fail under ``CI=true``) unless ``host:port`` accepts a connection."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as exc:
        message = (f"{name} at {host}:{port} is not reachable ({exc}); start it (.ci/run "
                   "does) to run the outbox relay tests")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
