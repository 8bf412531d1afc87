"""The brokers a relay publishes to (DESIGN §6.2): a ``--to`` URL parsed into a
:class:`Target`, and its :class:`Publisher` (RabbitMQ through aio-pika with publisher
confirms; NATS JetStream through nats-py, awaiting each message's ack).

Both publishers send a batch's messages in outbox order on one channel / connection and
then wait for every confirmation, so a batch costs about one round trip, and the broker
receives the messages of a key in the order sent.

A publish reports one result per row. A refusal of one message (too large for the server
or the stream, a broker nack of that message) is a :class:`Refused` for that row only: the
other rows, of other keys, are still sent and confirmed. A row of the same key after a row
refused while sending is not sent (:class:`HeldBack`). Anything else (connection lost, no
confirmation in time) is a connection failure: the relay reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

from ..config import redact_url
from ..errors import ConfigError, InvalidArguments
from ..ledger.base import OutboxRow

try:
    import aio_pika
    import aiormq.exceptions
except ImportError:  # the relay extra is not installed: said when a target needs it
    aio_pika = None  # type: ignore[assignment]
try:
    import nats
    from nats.aio.client import Client as NatsClient
    from nats.errors import MaxPayloadError
    from nats.js import JetStreamContext
    from nats.js.errors import APIError, BadRequestError, ServiceUnavailableError
except ImportError:
    nats = None  # type: ignore[assignment]

__all__ = ["AmqpPublisher", "HeldBack", "NatsPublisher", "Publisher", "Refused", "Target",
           "parse_target", "publisher_for"]

AMQP_SCHEMES = ("amqp", "amqps")
NATS_SCHEMES = ("nats", "tls")
DEFAULT_EXCHANGE = "ratchet"
DEFAULT_STREAM = "RATCHET"
DEFAULT_PREFIX = "ratchet"
log = logging.getLogger("ratchet.relay")

CONNECT_TIMEOUT_S = 10.0
"""How long one connect to a broker may take before the relay counts it failed, seconds."""

PUBLISH_TIMEOUT_S = 10.0
"""How long a batch waits for the broker's confirmations before it counts as failed."""


class Refused(Exception):
    """The broker (or its client's limit) refused this one message; the connection is
    fine and the batch's other messages are not affected."""


class HeldBack(Exception):
    """Not sent: an earlier message of the same key in the batch was refused."""


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
        None when the broker confirmed it, a :class:`Refused` when the broker refused that
        message only, a :class:`HeldBack` for a row of a key whose earlier row was refused
        before it was sent, any other exception when the connection failed."""
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
    ``ratchet-key``, ``ratchet-outbox-id``. Published mandatory: a message that no bound
    queue takes is returned, and counts as refused (it stays unsent)."""

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
        # A message no queue is bound for is returned (mandatory) and raises: it stays
        # unsent and failing, never "sent" into nowhere.
        channel = await self._connection.channel(publisher_confirms=True,
                                                 on_return_raises=True)
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
        return [_amqp_result(r) for r in results]

    async def close(self) -> None:
        """See :meth:`Publisher.close`."""
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                await connection.close()


def _amqp_result(result: object) -> BaseException | None:
    """A nack or a return of one message is that message's refusal; the rest is the
    connection's."""
    if not isinstance(result, BaseException):
        return None
    if isinstance(result, aiormq.exceptions.DeliveryError | aiormq.exceptions.PublishError):
        refused = Refused(f"the broker refused the message: {type(result).__name__}: "
                          f"{result}")
        refused.__cause__ = result
        return refused
    return result


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
        self._max_msg_size: int | None = None

    async def connect(self) -> None:
        """See :meth:`Publisher.connect`. Creates the stream on ``<prefix>.>`` if missing."""
        await self.close()
        # One try, bounded: nats-py retries a refused server for ever when its reconnect
        # attempts are 0 (0 means "no limit" there), and logs every try with a traceback
        # through its default error callback; the relay's own loop retries with backoff.
        self._nc = await asyncio.wait_for(nats.connect(
            servers=[self.target.url], connect_timeout=5, allow_reconnect=False,
            max_reconnect_attempts=1, reconnect_time_wait=0.1, error_cb=_nats_error),
            timeout=CONNECT_TIMEOUT_S)
        js = self._nc.jetstream()
        subjects = [f"{self.target.prefix}.>"]
        try:
            info = await js.stream_info(self.target.stream)
        except nats.js.errors.NotFoundError:
            try:
                info = await js.add_stream(name=self.target.stream, subjects=subjects)
            except BadRequestError:  # created meanwhile by another relay
                info = await js.stream_info(self.target.stream)
        limit = info.config.max_msg_size
        self._max_msg_size = limit if limit is not None and limit > 0 else None
        self._js = js

    async def publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        """See :meth:`Publisher.publish`: every message sent in order, then every ack
        awaited. A message above the server's ``max_payload`` or the stream's
        ``max_msg_size`` is refused before it is sent, and the later rows of its key are
        held back; an error ack of the stream is that message's refusal."""
        js = self._js
        if js is None:
            raise ConnectionError(f"not connected to {self.target.where}")
        futures: list[tuple[int, asyncio.Future[object]]] = []
        out: list[BaseException | None] = [None] * len(rows)
        stopped: set[str] = set()
        for i, row in enumerate(rows):
            if row.key is not None and row.key in stopped:
                out[i] = HeldBack(f"an earlier message of key {row.key!r} was refused")
                continue
            headers = {"Nats-Msg-Id": row.message_id, **_headers(row)}
            payload = row.payload.encode()
            try:
                size = len(payload) + sum(len(k) + len(v) for k, v in headers.items())
                if self._max_msg_size is not None and size > self._max_msg_size:
                    raise Refused(f"message of {size} bytes is above the stream's "
                                  f"max_msg_size {self._max_msg_size}")
                futures.append((i, await js.publish_async(  # type: ignore[arg-type]
                    f"{self.target.prefix}.{row.topic}", payload,
                    wait_stall=PUBLISH_TIMEOUT_S, headers=headers)))
            except (Refused, MaxPayloadError) as exc:  # this message only
                out[i] = exc if isinstance(exc, Refused) else Refused(
                    f"message of {len(payload)} bytes is above the server's max_payload "
                    f"{self._nc.max_payload if self._nc else '?'} (MaxPayloadError)")
                if row.key is not None:
                    stopped.add(row.key)
            except Exception as exc:  # the connection: this row and the rest are not sent
                for j in range(i, len(rows)):
                    out[j] = exc
                break
        try:
            acks = await asyncio.wait_for(
                asyncio.gather(*(f for _, f in futures), return_exceptions=True),
                PUBLISH_TIMEOUT_S)
        except TimeoutError as exc:
            for j, _ in futures:
                out[j] = exc
            return out
        for (j, _), ack in zip(futures, acks, strict=True):
            if isinstance(ack, APIError) and not isinstance(ack, ServiceUnavailableError):
                refused = Refused(f"the stream refused the message: {ack}")
                refused.__cause__ = ack
                out[j] = refused
            elif isinstance(ack, BaseException):
                out[j] = ack
        return out

    async def close(self) -> None:
        """See :meth:`Publisher.close`."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                await nc.close()


def misconfigured(exc: BaseException) -> bool:
    """Is ``exc``, raised by a publisher's connect, a set-up the broker refuses whatever
    the retries (a bad stream name, an exchange declared with another type, refused
    credentials, TLS against a plain port), rather than a broker that cannot be reached?"""
    if isinstance(exc, ValueError | ssl.SSLError):
        return True
    if aio_pika is not None and isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed
                                           | aiormq.exceptions.ChannelAccessRefused
                                           | aiormq.exceptions.ProbableAuthenticationError):
        return True
    return nats is not None and isinstance(exc, BadRequestError)


async def _nats_error(exc: Exception) -> None:
    """nats-py's error callback: one line at debug level (the relay logs the failure of
    the connect or publish it causes, once, with its backoff)."""
    log.debug("nats: %s: %s", type(exc).__name__, exc)


def publisher_for(target: Target) -> Publisher:
    """The publisher of ``target``.

    Raises:
        ConfigError: the broker's client library is not installed (``ratchet[relay]``).
    """
    if target.kind == "amqp":
        return AmqpPublisher(target)
    return NatsPublisher(target)
