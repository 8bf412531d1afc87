"""Caps on request bodies for ``ratchet serve``, in size and in time.

Size: a body over the cap is refused with 413 before the application (or its JSON parser)
sees it, so a client cannot make the service hold many times a huge body in memory (the
params limit is checked only after parsing). A body with a ``Content-Length`` over the cap
is refused without keeping it; a chunked one is kept up to the cap and refused as soon as
it passes it. The rest of a refused body is read and dropped before the answer (memory
stays flat; closing with unread input would make TCP reset the connection and the client
lose the 413).

Time: the whole body (a refused one's rest included) must arrive within ``timeout_s`` of
the request's headers; else the answer is 408 (``request_timeout``) with ``Connection:
close`` and the server closes the connection. Without it a client that declares a
``Content-Length`` and sends less (or trickles a chunked body) holds a connection, and the
memory of what it sent, for as long as it likes. uvicorn has no such timeout of its own
(its ``timeout_keep_alive`` covers only the idle time between requests).

Bodies within the caps are read whole and handed on unchanged (every route reads its
whole body anyway).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DEFAULT_BODY_TIMEOUT_S", "BodyLimit", "body_limit_bytes"]

DEFAULT_BODY_TIMEOUT_S = 30.0
"""Seconds a request body may take to arrive (``ratchet serve --body-timeout-s``): the
largest accepted body (4 MiB with the default payload limit) at 140 KB/s."""


def body_limit_bytes(max_payload_bytes: int) -> int:
    """The request body cap for a ledger payload limit, bytes: four times the limit (JSON
    escapes, the rest of the body) plus 64 KiB."""
    return 4 * max_payload_bytes + 64 * 1024


class BodyLimit:
    """ASGI middleware: 413 (an API ``ErrorBody``, ``payload_too_large``) for an HTTP
    request body over ``max_bytes`` bytes, 408 (``request_timeout``, then the connection
    is closed) for one that has not arrived whole ``timeout_s`` seconds after the headers.

    Args:
        app: the wrapped ASGI application.
        max_bytes: the largest body accepted, bytes (> 0).
        timeout_s: seconds the whole body may take to arrive (> 0).
    """

    def __init__(self, app: ASGIApp, max_bytes: int,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        received = _Counted(receive)
        outcome: Message | None = None  # the whole body, a disconnect, or None: too large
        with anyio.move_on_after(self.timeout_s) as deadline:
            outcome = await self._read(received, length)
        if deadline.cancelled_caught and not received.over_cap:
            await self._timed_out(send, length, received.bytes)
        elif outcome is None or received.over_cap:
            await self._refuse(send, length if length is not None and length > self.max_bytes
                               else None)
        elif outcome["type"] != "http.request":  # the client went away
            await self.app(scope, _replay([outcome]), send)
        else:
            await self.app(scope, _replay([outcome], then=receive), send)

    async def _read(self, receive: _Counted, length: int | None) -> Message | None:
        """The whole body as one ``http.request`` message, the message that ended it
        early (a disconnect), or ``None`` for a body over the cap (read and dropped)."""
        if length is not None and length > self.max_bytes:
            receive.over_cap = True
            await _drain(receive)
            return None
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return message
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                receive.over_cap = True
                if message.get("more_body", False):
                    await _drain(receive)
                return None
            chunks.append(body)
            more = bool(message.get("more_body", False))
        return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    async def _refuse(self, send: Send, length: int | None) -> None:
        size = f" ({length} bytes)" if length is not None else ""
        await _answer(send, 413, "payload_too_large",
                      f"the request body{size} is over the service's limit of "
                      f"{self.max_bytes} bytes; store large data elsewhere and pass a "
                      "reference")

    async def _timed_out(self, send: Send, length: int | None, arrived: int) -> None:
        what = (f"{arrived} of the {length} bytes declared" if length is not None
                else f"{arrived} bytes")
        await _answer(send, 408, "request_timeout",
                      f"the request body did not arrive within {self.timeout_s:g} s "
                      f"({what} arrived); the connection is closed. Send the body as "
                      "soon as the headers (ratchet serve --body-timeout-s sets the "
                      "limit)")


class _Counted:
    """A ``receive`` that counts the body bytes it handed over; ``over_cap`` once the body
    is known to be over the cap (what is left of it is being dropped)."""

    def __init__(self, receive: Receive) -> None:
        self.receive = receive
        self.bytes = 0
        self.over_cap = False

    async def __call__(self) -> Message:
        message = await self.receive()
        self.bytes += len(message.get("body", b""))
        return message


async def _answer(send: Send, status: int, error: str, message: str) -> None:
    """An API ``ErrorBody`` answer, then the connection is closed (``Connection: close``:
    what is left of the request body is not read)."""
    payload = json.dumps({
        "error": error, "message": message, "errors": [], "task_id": None, "state": None,
        "existing_digest": None, "new_digest": None}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})


async def _drain(receive: Receive) -> None:
    """Read the rest of the body and drop it (memory stays flat): closing a connection
    with unread input makes TCP reset it, and the client would lose the 413."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A ``receive`` that returns ``messages`` first, then defers to ``then`` (which waits
    for the disconnect) or repeats a disconnect."""
    queue = list(messages)

    async def receive() -> Any:
        if queue:
            return queue.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
