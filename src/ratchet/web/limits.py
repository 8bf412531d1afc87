"""A cap on request bodies for ``ratchet serve``: a body over the cap is refused with 413
before the application (or its JSON parser) sees it, so a client cannot make the service
hold many times a huge body in memory (the params limit is checked only after parsing).

A body with a ``Content-Length`` over the cap is refused without keeping it; a chunked one
is kept up to the cap and refused as soon as it passes it. The rest of a refused body is
read and dropped before the answer (memory stays flat; closing with unread input would
make TCP reset the connection and the client lose the 413), so a client can still make
the service read a long upload: bound that with a proxy. Bodies within the cap are read
whole and handed on unchanged (every route reads its whole body anyway).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodyLimit", "body_limit_bytes"]


def body_limit_bytes(max_payload_bytes: int) -> int:
    """The request body cap for a ledger payload limit, bytes: four times the limit (JSON
    escapes, the rest of the body) plus 64 KiB."""
    return 4 * max_payload_bytes + 64 * 1024


class BodyLimit:
    """ASGI middleware: 413 (an API ``ErrorBody``, ``payload_too_large``) for an HTTP
    request body over ``max_bytes`` bytes.

    Args:
        app: the wrapped ASGI application.
        max_bytes: the largest body accepted, bytes (> 0).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await _drain(receive)
            await self._refuse(send, length)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive)
                await self._refuse(send, None)
                return
            chunks.append(body)
            more = bool(message.get("more_body", False))
        whole: Message = {"type": "http.request", "body": b"".join(chunks),
                          "more_body": False}
        await self.app(scope, _replay([whole], then=receive), send)

    async def _refuse(self, send: Send, length: int | None) -> None:
        size = f" ({length} bytes)" if length is not None else ""
        payload = json.dumps({
            "error": "payload_too_large",
            "message": f"the request body{size} is over the service's limit of "
                       f"{self.max_bytes} bytes; store large data elsewhere and pass a "
                       "reference",
            "errors": [], "task_id": None, "state": None, "existing_digest": None,
            "new_digest": None}).encode()
        await send({"type": "http.response.start", "status": 413,
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
