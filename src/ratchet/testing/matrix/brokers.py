"""The broker side of row 10 (the outbox relay): small consumers that read what RabbitMQ or
NATS JetStream really received, message id by message id, in arrival order.

Each run gets a place of its own on the user's broker, deleted at the end: on RabbitMQ a
durable topic exchange ``ratchet-matrix-<token>`` and a durable queue of the same name bound
to all of it; on NATS a JetStream stream ``RATCHET_MATRIX_<token>`` on subjects
``ratchet-matrix-<token>.>``. :attr:`Sink.to_url` is the ``ratchet relay --to`` URL that
publishes there.

The consumers use aio-pika and nats-py (``pip install 'ratchet[relay]'``), like the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from ...config import redact_url
from ...errors import ConfigError, InvalidArguments
from ...relay import parse_target
from .rig import RowFailed

try:
    import aio_pika
except ImportError:  # the relay extra is not installed: said when a sink needs it
    aio_pika = None  # type: ignore[assignment]
try:
    import nats
    from nats.aio.client import Client as NatsClient
    from nats.js.errors import NotFoundError
except ImportError:
    nats = None  # type: ignore[assignment]

__all__ = ["AmqpSink", "Delivery", "NatsSink", "Sink", "check_broker_url", "sink_for"]

CONNECT_TIMEOUT_S = 5.0
"""How long a consumer waits for the broker's connection, seconds."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class Delivery:
    """One message as the consumer received it.

    Attributes:
        message_id: RabbitMQ's ``message_id`` / NATS's ``Nats-Msg-Id`` (the outbox's id).
        key: the ``ratchet-key`` header (``None``: no key).
        outbox_id: the ``ratchet-outbox-id`` header (the row's id in the outbox).
    """

    message_id: str
    key: str | None
    outbox_id: int


class Sink(Protocol):
    """A per-run place on the broker and a consumer of it (not thread-safe)."""

    where: str
    """The broker and the place, for messages (password redacted)."""
    to_url: str
    """The ``ratchet relay --to`` URL that publishes here."""

    def declare(self) -> None:
        """Create the place (before any relay publishes).

        Raises:
            RowFailed: the broker cannot be reached or refused.
        """
        ...

    def pending(self) -> int:
        """Messages the broker holds that :meth:`read` has not returned yet."""
        ...

    def read(self, count: int, timeout_s: float) -> list[Delivery]:
        """The next ``count`` messages in arrival order.

        Raises:
            RowFailed: fewer arrived within ``timeout_s`` seconds.
        """
        ...

    def delete(self) -> None:
        """Delete the place (no error when it is gone or the broker cannot be reached)."""
        ...


def check_broker_url(url: str) -> None:
    """Check a ``--broker`` URL: ``amqp[s]://user:pass@host:port/vhost`` or
    ``nats://host:port``, without query parameters (the matrix publishes to a place of its
    own).

    Raises:
        InvalidArguments: another scheme, no host, or query parameters.
    """
    parts = urlsplit(url)
    shown = redact_url(url)
    if parts.scheme.lower() not in ("amqp", "amqps", "nats", "tls"):
        raise InvalidArguments(f"--broker {shown!r}: use amqp://user:pass@host:5672/ "
                               "(RabbitMQ) or nats://host:4222 (NATS JetStream)")
    if not parts.hostname:
        raise InvalidArguments(f"--broker {shown!r}: no broker host")
    if parts.query:
        raise InvalidArguments(f"--broker {shown!r}: no query parameters: the matrix "
                               "publishes to an exchange or stream of its own")
    parse_target(url)


def sink_for(url: str, token: str) -> Sink:
    """The sink of this run on the broker of ``url`` (see :func:`check_broker_url`), its
    names made from ``token`` (lower-case letters and digits).

    Raises:
        InvalidArguments: see :func:`check_broker_url`.
        ConfigError: the broker's client library is not installed (``ratchet[relay]``).
    """
    check_broker_url(url)
    if parse_target(url).kind == "amqp":
        return AmqpSink(url, f"ratchet-matrix-{token}")
    return NatsSink(url, stream=f"RATCHET_MATRIX_{token.upper()}",
                    prefix=f"ratchet-matrix-{token}")


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _run(where: str, body: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``body()`` on a fresh event loop; a broker error becomes a :class:`RowFailed`."""

    async def main() -> _T:
        return await body()

    try:
        return asyncio.run(main())
    except RowFailed:
        raise
    except Exception as exc:  # any client error: the broker could not be used
        raise RowFailed(f"the broker at {where} cannot be used: {_first_line(exc)}") from exc


class AmqpSink:
    """RabbitMQ: exchange ``name`` (topic, durable) and queue ``name`` bound to ``#``.

    Raises:
        ConfigError: aio-pika is not installed.
    """

    def __init__(self, url: str, name: str) -> None:
        if aio_pika is None:
            raise ConfigError("row 10 on RabbitMQ needs aio-pika: pip install "
                              "'ratchet[relay]'")
        self.url = url
        self.name = name
        self.where = f"{redact_url(url)} (exchange and queue {name})"
        self.to_url = f"{url}?exchange={name}"

    async def _open(self) -> tuple[aio_pika.abc.AbstractConnection, aio_pika.abc.AbstractQueue]:
        connection = await aio_pika.connect(self.url, timeout=CONNECT_TIMEOUT_S)
        try:
            channel = await connection.channel()
            exchange = await channel.declare_exchange(self.name, aio_pika.ExchangeType.TOPIC,
                                                      durable=True)
            queue = await channel.declare_queue(self.name, durable=True)
            await queue.bind(exchange, "#")
        except BaseException:
            await connection.close()
            raise
        return connection, queue

    def declare(self) -> None:
        """See :meth:`Sink.declare`."""

        async def body() -> None:
            connection, _ = await self._open()
            await connection.close()

        _run(self.where, body)

    def pending(self) -> int:
        """See :meth:`Sink.pending`."""

        async def body() -> int:
            connection, queue = await self._open()
            try:
                result = queue.declaration_result
                return int(result.message_count or 0)
            finally:
                await connection.close()

        return _run(self.where, body)

    def read(self, count: int, timeout_s: float) -> list[Delivery]:
        """See :meth:`Sink.read` (each message is acknowledged as it is read)."""

        async def body() -> list[Delivery]:
            connection, queue = await self._open()
            out: list[Delivery] = []
            deadline = time.monotonic() + timeout_s
            try:
                while len(out) < count:
                    message = await queue.get(no_ack=True, fail=False)
                    if message is None:
                        if time.monotonic() > deadline:
                            raise RowFailed(f"{len(out)} of {count} messages arrived at "
                                            f"{self.where} within {timeout_s:.0f} s")
                        await asyncio.sleep(0.05)
                        continue
                    key = message.headers.get("ratchet-key")
                    out.append(Delivery(str(message.message_id),
                                        None if key is None else str(key),
                                        int(str(message.headers.get("ratchet-outbox-id",
                                                                    "0")))))
            finally:
                await connection.close()
            return out

        return _run(self.where, body)

    def delete(self) -> None:
        """See :meth:`Sink.delete`."""

        async def body() -> None:
            connection = await aio_pika.connect(self.url, timeout=CONNECT_TIMEOUT_S)
            try:
                channel = await connection.channel()
                await channel.queue_delete(self.name)
                await channel.exchange_delete(self.name)
            finally:
                await connection.close()

        with contextlib.suppress(RowFailed):
            _run(self.where, body)


class NatsSink:
    """NATS JetStream: stream ``stream`` on ``<prefix>.>``, read by sequence number.

    Raises:
        ConfigError: nats-py is not installed.
    """

    def __init__(self, url: str, *, stream: str, prefix: str) -> None:
        if nats is None:
            raise ConfigError("row 10 on NATS needs nats-py: pip install 'ratchet[relay]'")
        self.url = url
        self.stream = stream
        self.prefix = prefix
        self.where = f"{redact_url(url)} (stream {stream})"
        self.to_url = f"{url}?stream={stream}&prefix={prefix}"
        self._next_seq = 1

    async def _connect(self) -> NatsClient:
        async def quiet(exc: Exception) -> None:  # reported by the timeout below
            return None

        # nats-py keeps retrying a refused connection: bound it here.
        try:
            return await asyncio.wait_for(
                nats.connect(servers=[self.url], connect_timeout=CONNECT_TIMEOUT_S,
                             allow_reconnect=False, max_reconnect_attempts=0,
                             error_cb=quiet),
                CONNECT_TIMEOUT_S * 2)
        except TimeoutError:
            raise ConnectionError(f"no connection within {CONNECT_TIMEOUT_S * 2:.0f} s"
                                  ) from None

    def declare(self) -> None:
        """See :meth:`Sink.declare`."""

        async def body() -> None:
            nc = await self._connect()
            try:
                await nc.jetstream().add_stream(name=self.stream,
                                                subjects=[f"{self.prefix}.>"])
            finally:
                await nc.close()

        _run(self.where, body)

    def pending(self) -> int:
        """See :meth:`Sink.pending`."""

        async def body() -> int:
            nc = await self._connect()
            try:
                info = await nc.jetstream().stream_info(self.stream)
                return max(0, int(info.state.last_seq) - self._next_seq + 1)
            finally:
                await nc.close()

        return _run(self.where, body)

    def read(self, count: int, timeout_s: float) -> list[Delivery]:
        """See :meth:`Sink.read` (the stream keeps the messages; this reads on from the
        last sequence number read)."""

        async def body() -> list[Delivery]:
            nc = await self._connect()
            js = nc.jetstream()
            out: list[Delivery] = []
            deadline = time.monotonic() + timeout_s
            try:
                while len(out) < count:
                    last = int((await js.stream_info(self.stream)).state.last_seq)
                    if self._next_seq > last:
                        if time.monotonic() > deadline:
                            raise RowFailed(f"{len(out)} of {count} messages arrived at "
                                            f"{self.where} within {timeout_s:.0f} s")
                        await asyncio.sleep(0.05)
                        continue
                    msg = await js.get_msg(self.stream, self._next_seq)
                    self._next_seq += 1
                    headers = msg.headers or {}
                    out.append(Delivery(headers.get("Nats-Msg-Id", ""),
                                        headers.get("ratchet-key"),
                                        int(headers.get("ratchet-outbox-id", "0"))))
            finally:
                await nc.close()
            return out

        return _run(self.where, body)

    def delete(self) -> None:
        """See :meth:`Sink.delete`."""

        async def body() -> None:
            nc = await self._connect()
            try:
                with contextlib.suppress(NotFoundError):
                    await nc.jetstream().delete_stream(self.stream)
            finally:
                await nc.close()

        with contextlib.suppress(RowFailed):
            _run(self.where, body)
