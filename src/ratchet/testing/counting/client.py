"""The httpx client of the counting service: errors are raised unchanged so Ratchet's
classifier sees them, except a 409 stale-token reply, raised as ``ratchet.TokenRejected``."""

from __future__ import annotations

from types import TracebackType
from typing import Any, cast
from urllib.parse import quote

import httpx

from ...errors import TokenRejected
from ...worker.context import NOT_FOUND, NotFound
from .protocol import STALE_TOKEN_ERROR, TOKEN_HEADER

__all__ = ["AsyncCountingClient", "CountingClient"]


def _raise_if_stale(r: httpx.Response, key: str, token: int | None) -> None:
    """Raise ``TokenRejected`` for a 409 stale-token reply (any other reply: nothing)."""
    if r.status_code != 409:
        return
    try:
        body = r.json()
    except ValueError:
        return
    if isinstance(body, dict) and body.get("error") == STALE_TOKEN_ERROR:
        highest = body.get("highest")
        raise TokenRejected(
            str(body.get("key", key)),
            int(body.get("token", token if token is not None else -1)),
            highest if isinstance(highest, int) else None,
        )


def _lookup_answer(r: httpx.Response, key: str, token: int | None) -> dict[str, Any] | NotFound:
    """The answer of a ``GET /effects/{key}`` reply (see :meth:`CountingClient.lookup`)."""
    _raise_if_stale(r, key, token)
    if r.status_code == 404:
        try:
            body = r.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("error") == "not found":
            return NOT_FOUND
    r.raise_for_status()
    return cast(dict[str, Any], r.json())


def _effect_request(key: str, token: int | None) -> dict[str, str]:
    headers = {"Idempotency-Key": key}
    if token is not None:
        headers[TOKEN_HEADER] = str(token)
    return headers


class CountingClient:
    """An httpx client of the counting service. Thread-safe (one pooled ``httpx.Client``).

    Errors are raised unchanged so Ratchet's classifier sees them: ``HTTPStatusError`` 503
    is overload, 4xx permanent; ``ReadTimeout`` / ``RemoteProtocolError`` (dropped reply)
    are unknown outcomes; connect errors are transient.

    Args:
        base_url: e.g. ``http://127.0.0.1:54321``.
        timeout_s: read/write/pool timeout per request, seconds.
        connect_timeout_s: TCP connect timeout, seconds.
    """

    def __init__(
        self, base_url: str, timeout_s: float = 1.0, connect_timeout_s: float = 2.0
    ) -> None:
        self.base_url = base_url
        self._http = httpx.Client(
            base_url=base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )

    def execute(
        self, key: str, body: dict[str, Any], token: int | None = None
    ) -> dict[str, Any]:
        """``POST /effects`` with ``Idempotency-Key: key``: the effect.

        Args:
            key: the idempotency key.
            body: the request (a JSON object).
            token: fencing token sent as ``Fencing-Token`` (with ``ctx.effect(...,
                fenced=True)`` the call gets it: ``lambda k, t: client.execute(k, body, t)``).
                None sends no header.

        Returns:
            The record: ``{"id", "key", "body", "created_at", "replayed"}``.

        Raises:
            ratchet.TokenRejected: the service (fenced mode) refused ``token`` as stale;
                nothing executed.
            httpx.HTTPStatusError: other 4xx/5xx (503 carries ``Retry-After``).
            httpx.TransportError: timeouts, dropped replies, refused connections.
        """
        headers = {"Idempotency-Key": key}
        if token is not None:
            headers[TOKEN_HEADER] = str(token)
        r = self._http.post("/effects", json=body, headers=headers)
        _raise_if_stale(r, key, token)
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def lookup(self, key: str, token: int | None = None) -> dict[str, Any] | NotFound:
        """``GET /effects/{key}``: the stored record, or ``ratchet.NOT_FOUND`` when the
        service confirms the key never executed (pass it as ``ctx.effect(lookup=...)``;
        with ``fenced=True`` it is called as ``lookup(key, token)``).

        Args:
            key: the idempotency key.
            token: fencing token sent as ``Fencing-Token``; a fenced service records it as
                seen before answering, so no request with a lower token executes after.

        Raises:
            ratchet.TokenRejected: the service (fenced mode) refused ``token`` as stale.
            httpx.HTTPStatusError: any other error status (the lookup is inconclusive).
            httpx.TransportError: the service could not answer.
        """
        headers = {TOKEN_HEADER: str(token)} if token is not None else None
        r = self._http.get(f"/effects/{quote(key, safe='')}", headers=headers)
        return _lookup_answer(r, key, token)

    def executions(self) -> dict[str, int]:
        """``GET /executions``: executions per key."""
        r = self._http.get("/executions")
        r.raise_for_status()
        return {str(k): int(v) for k, v in r.json().items()}

    def stats(self) -> dict[str, Any]:
        """``GET /stats``: executions, keys, duplicate_keys, replays, lookups, lookups_found,
        stale_tokens_rejected, items_applied, injected (fault counts)."""
        r = self._http.get("/stats")
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """``POST /admin/faults``: change fault settings; returns all of them.

        Keyword args are :class:`FaultSettings` fields, e.g. ``reply_lost_next=1``.

        Raises:
            httpx.HTTPStatusError: 400 for an unknown setting or a value out of range.
        """
        r = self._http.post("/admin/faults", json=changes)
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> CountingClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncCountingClient:
    """An ``httpx.AsyncClient`` of the counting service, for ``async def`` task bodies
    (``await ctx.effect("charge", lambda k: client.execute(k, body), key=...,
    lookup=client.lookup)``: the call returns a coroutine, which the context awaits):
    the same requests, answers and errors as :class:`CountingClient`.
    Use it on one event loop (the worker's), closed with :meth:`aclose`.

    Args:
        base_url: e.g. ``http://127.0.0.1:54321``.
        timeout_s: read/write/pool timeout per request, seconds.
        connect_timeout_s: TCP connect timeout, seconds.
        max_connections: most connections open at once.
    """

    def __init__(self, base_url: str, timeout_s: float = 1.0, connect_timeout_s: float = 2.0,
                 max_connections: int = 1000) -> None:
        self.base_url = base_url
        self._http = httpx.AsyncClient(
            base_url=base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections),
        )

    async def execute(self, key: str, body: dict[str, Any],
                      token: int | None = None) -> dict[str, Any]:
        """``POST /effects`` (see :meth:`CountingClient.execute`).

        Raises:
            The errors of :meth:`CountingClient.execute`.
        """
        r = await self._http.post("/effects", json=body, headers=_effect_request(key, token))
        _raise_if_stale(r, key, token)
        r.raise_for_status()
        return cast(dict[str, Any], r.json())

    async def lookup(self, key: str, token: int | None = None) -> dict[str, Any] | NotFound:
        """``GET /effects/{key}`` (see :meth:`CountingClient.lookup`).

        Raises:
            The errors of :meth:`CountingClient.lookup`.
        """
        headers = {TOKEN_HEADER: str(token)} if token is not None else None
        r = await self._http.get(f"/effects/{quote(key, safe='')}", headers=headers)
        return _lookup_answer(r, key, token)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()
