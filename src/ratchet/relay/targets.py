"""The brokers a relay publishes to (DESIGN §6.2): a ``--to`` URL parsed into a
:class:`Target`, and its :class:`Publisher` (RabbitMQ through aio-pika with publisher
confirms; NATS JetStream through nats-py, awaiting each message's ack).

Both publishers send a batch's messages in outbox order on one channel / connection and
then wait for every confirmation, so a batch costs about one round trip, and the broker
receives the messages of a key in the order sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

from ..config import redact_url
from ..errors import ConfigError, InvalidArguments
from ..ledger.base import OutboxRow

try:
    import aio_pika
except ImportError:  # the relay extra is not installed: said when a target needs it
    aio_pika = None  # type: ignore[assignment]
try:
    import nats
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext
    from nats.js.errors import BadRequestError
except ImportError:
    nats = None  # type: ignore[assignment]

__all__ = ["AmqpPublisher", "NatsPublisher", "Publisher", "Target", "parse_target",
           "publisher_for"]

AMQP_SCHEMES = ("amqp", "amqps")
NATS_SCHEMES = ("nats", "tls")
DEFAULT_EXCHANGE = "ratchet"
DEFAULT_STREAM = "RATCHET"
DEFAULT_PREFIX = "ratchet"
PUBLISH_TIMEOUT_S = 10.0
"""How long a batch waits for the broker's confirmations before it counts as failed."""


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``--to`` URL.

    Attributes:
        kind: ``"amqp"`` or ``"nats"``.
        url: the broker's URL without Ratchet's own query parameters.
        where: the URL for messages (password redacted).
        exchange: RabbitMQ: the exchange (topic type, declared durable).
        stream: NATS: the JetStream stream (created when missing).
        prefix: NATS: subjects are ``<prefix>.<topic>``; the stream takes ``<prefix>.>``.
    """

    kind: str
    url: str
    where: str
    exchange: str = DEFAULT_EXCHANGE
    stream: str = DEFAULT_STREAM
    prefix: str = DEFAULT_PREFIX


def parse_target(url: str) -> Target:
    """Parse a ``--to`` URL: ``amqp[s]://user:pass@host:port/vhost?exchange=NAME``
    (default exchange ``ratchet``) or ``nats://host:port?stream=NAME&prefix=WORD``
    (default stream ``RATCHET``, prefix ``ratchet``).

    Raises:
        InvalidArguments: another scheme, an unknown or empty query parameter.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    bare = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    if scheme in AMQP_SCHEMES:
        allowed = {"exchange"}
    elif scheme in NATS_SCHEMES:
        allowed = {"stream", "prefix"}
    else:
        raise InvalidArguments(
            f"--to {redact_url(url)!r}: unknown broker scheme {parts.scheme!r}; use "
            "amqp://user:pass@host:5672/?exchange=NAME (RabbitMQ) or "
            "nats://host:4222?stream=NAME&prefix=WORD (NATS JetStream)")
    if not parts.hostname:
        raise InvalidArguments(f"--to {redact_url(url)!r}: no broker host")
    unknown = sorted(set(query) - allowed)
    if unknown or any(not query[k] for k in query):
        raise InvalidArguments(
            f"--to {redact_url(url)!r}: query parameters must be non-empty and one of "
            f"{sorted(allowed)}, got {sorted(query)}")
    if scheme in AMQP_SCHEMES:
        return Target("amqp", bare, redact_url(bare),
                      exchange=query.get("exchange", DEFAULT_EXCHANGE))
    return Target("nats", bare, redact_url(bare), stream=query.get("stream", DEFAULT_STREAM),
                  prefix=query.get("prefix", DEFAULT_PREFIX))


class Publisher(Protocol):
    """One broker connection of a relay. Not thread-safe: one asyncio task uses it."""

    target: Target

    async def connect(self) -> None:
        """Connect and declare what publishing needs (exchange / stream).

        Raises:
            Exception: the broker cannot be reached or refused (the relay retries).
        """
        ...

    async def publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        """Send ``rows`` in order and wait for each one's confirmation: one entry per row,
        None when the broker confirmed it, else why not."""
        ...

    async def close(self) -> None:
        """Close the connection (no error if it is gone)."""
        ...


def _headers(row: OutboxRow) -> dict[str, str]:
    headers: dict[str, str] = {}
    if row.headers:
        extra = json.loads(row.headers)
        if isinstance(extra, dict):
            headers.update({str(k): str(v) for k, v in extra.items()})
    headers["ratchet-outbox-id"] = str(row.id)
    if row.key is not None:
        headers["ratchet-key"] = row.key
    return headers


class AmqpPublisher:
    """RabbitMQ: publisher confirms on one channel, persistent messages to a durable topic
    exchange; routing key = topic, ``message_id`` = the message id, headers
    ``ratchet-key``, ``ratchet-outbox-id``."""

    def __init__(self, target: Target) -> None:
        if aio_pika is None:
            raise ConfigError("publishing to RabbitMQ needs aio-pika: pip install "
                              "'ratchet[relay]'")
        self.target = target
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None

    async def connect(self) -> None:
        """See :meth:`Publisher.connect`."""
        await self.close()
        self._connection = await aio_pika.connect(self.target.url, timeout=5)
        channel = await self._connection.channel(publisher_confirms=True)
        self._exchange = await channel.declare_exchange(
            self.target.exchange, aio_pika.ExchangeType.TOPIC, durable=True)

    async def publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        """See :meth:`Publisher.publish`. The sends are started in order; the channel's lock
        writes them in that order."""
        exchange = self._exchange
        if exchange is None:
            raise ConnectionError(f"not connected to {self.target.where}")
        sends = [exchange.publish(
            aio_pika.Message(row.payload.encode(), message_id=row.message_id,
                             delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                             content_type="application/json", headers=dict(_headers(row))),
            routing_key=row.topic, timeout=PUBLISH_TIMEOUT_S) for row in rows]
        results = await asyncio.gather(*sends, return_exceptions=True)
        return [r if isinstance(r, BaseException) else None for r in results]

    async def close(self) -> None:
        """See :meth:`Publisher.close`."""
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                await connection.close()


class NatsPublisher:
    """NATS JetStream: subject ``<prefix>.<topic>``, header ``Nats-Msg-Id`` = the message id
    (the stream drops a second copy within its duplicate window, 2 minutes by default),
    ``ratchet-key``, ``ratchet-outbox-id``; each message's ack awaited."""

    def __init__(self, target: Target) -> None:
        if nats is None:
            raise ConfigError("publishing to NATS needs nats-py: pip install 'ratchet[relay]'")
        self.target = target
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None

    async def connect(self) -> None:
        """See :meth:`Publisher.connect`. Creates the stream on ``<prefix>.>`` if missing."""
        await self.close()
        self._nc = await nats.connect(servers=[self.target.url], connect_timeout=5,
                                      allow_reconnect=False, max_reconnect_attempts=0)
        js = self._nc.jetstream()
        subjects = [f"{self.target.prefix}.>"]
        try:
            await js.stream_info(self.target.stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(name=self.target.stream, subjects=subjects)
            except BadRequestError:  # created meanwhile by another relay
                await js.stream_info(self.target.stream)
        self._js = js

    async def publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        """See :meth:`Publisher.publish`: every message sent in order, then every ack
        awaited."""
        js = self._js
        if js is None:
            raise ConnectionError(f"not connected to {self.target.where}")
        futures: list[asyncio.Future[object]] = []
        out: list[BaseException | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            headers = {"Nats-Msg-Id": row.message_id, **_headers(row)}
            try:
                futures.append(await js.publish_async(  # type: ignore[arg-type]
                    f"{self.target.prefix}.{row.topic}", row.payload.encode(),
                    wait_stall=PUBLISH_TIMEOUT_S, headers=headers))
            except Exception as exc:  # this row and the rest are not sent
                for j in range(i, len(rows)):
                    out[j] = exc
                break
        try:
            acks = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), PUBLISH_TIMEOUT_S)
        except TimeoutError as exc:
            for j in range(len(futures)):
                out[j] = exc
            return out
        for j, ack in enumerate(acks):
            if isinstance(ack, BaseException):
                out[j] = ack
        return out

    async def close(self) -> None:
        """See :meth:`Publisher.close`."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                await nc.close()


def publisher_for(target: Target) -> Publisher:
    """The publisher of ``target``.

    Raises:
        ConfigError: the broker's client library is not installed (``ratchet[relay]``).
    """
    if target.kind == "amqp":
        return AmqpPublisher(target)
    return NatsPublisher(target)
