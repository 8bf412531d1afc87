"""JSON request bodies with a key twice in one object are refused, not read.

``json.loads`` keeps the last value of a repeated key, and other parsers (a proxy, a
client's own check, a log pipeline) may keep the first: ``{"reason": "ok", "reason":
""}`` or params with ``amount_cents`` twice would mean one thing to what checked the
request and another to Ratchet. The API reads every JSON body with :func:`unique_keys`
(through :class:`StrictJsonRoute`) and answers 422 ``invalid`` naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["DuplicateKey", "DuplicateKeyBody", "StrictJsonRequest", "StrictJsonRoute",
           "unique_keys"]


class DuplicateKey(ValueError):
    """A JSON object has ``key`` twice.

    Attributes:
        key: the repeated key.
    """

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object: send each key once "
                         "(JSON parsers disagree on which value counts)")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json.loads`` ``object_pairs_hook``: the object as a dict.

    Raises:
        DuplicateKey: a key appears twice.
    """
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateKey(key)
        result[key] = value
    return result


class DuplicateKeyBody(HTTPException):
    """A request body with a key twice: the API answers 422 ``invalid`` (field ``body``).

    An ``HTTPException`` so that FastAPI lets it through its body parsing (which turns
    other exceptions into a bare 400)."""

    def __init__(self, error: DuplicateKey) -> None:
        super().__init__(422, str(error))
        self.key = error.key


class StrictJsonRequest(Request):
    """A request whose JSON body is decoded with :func:`unique_keys`."""

    async def json(self) -> Any:
        """The body as JSON.

        Raises:
            json.JSONDecodeError: not JSON.
            DuplicateKeyBody: a key appears twice in one object.
        """
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, object_pairs_hook=unique_keys)
            except DuplicateKey as exc:
                raise DuplicateKeyBody(exc) from None
        return self._json


class StrictJsonRoute(APIRoute):
    """A FastAPI route that reads its JSON body with :class:`StrictJsonRequest` (set as a
    router's ``route_class``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict
