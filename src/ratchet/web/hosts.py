"""Which ``Host`` names ``ratchet serve`` answers to: the guard against DNS rebinding.

A web page the operator opens can make its own name (``rebind.attacker.example``) resolve
to 127.0.0.1; the browser then sends the page's requests to the service as same-origin
ones, with ``Host: rebind.attacker.example:PORT`` and a matching ``Origin``, so neither
the loopback rule nor the dashboard's Origin check tells them apart. The service
therefore answers only to the names it was configured with, in both modes (token and
loopback): ``localhost``, ``127.0.0.1``, ``[::1]``, the ``--host`` it listens on (unless
a wildcard: 0.0.0.0, ::), and the extra names of ``--allowed-host`` /
``RATCHET_ALLOWED_HOSTS`` (a reverse proxy's name, the name clients use for a service
listening on 0.0.0.0). Any other ``Host`` is refused with 400 before any route runs and
before the body is read (:class:`HostGuard`, around Starlette's ``TrustedHostMiddleware``);
the port is not compared. Under ``/api`` the refusal is the API's JSON error
(``{"error": "host_not_allowed", ...}``), elsewhere Starlette's plain ``Invalid host
header``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigError
from .models import ErrorBody

__all__ = ["ALLOWED_HOSTS_ENV", "HOST_NOT_ALLOWED", "LOCAL_HOSTS", "HostGuard",
           "allowed_hosts", "check_allowed_hosts", "host_name", "parse_allowed_hosts"]

HOST_NOT_ALLOWED = "host_not_allowed"
"""The API's error code for a ``Host`` the service does not answer to (400)."""

_PASSED = "ratchet.host_allowed"
"""Scope key set once the ``Host`` check let the request through."""

LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""The names the service always answers to (a client on this machine)."""

ALLOWED_HOSTS_ENV = "RATCHET_ALLOWED_HOSTS"
"""The environment variable with extra allowed host names, comma-separated."""

WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
"""Bind addresses that mean every interface (no name of their own)."""

_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


def host_name(host: str) -> str:
    """``host`` as it appears in a ``Host`` header: lower case, an IPv6 address in
    brackets (``::1`` → ``[::1]``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


def check_allowed_hosts(names: Iterable[str], *, token_mode: bool) -> tuple[str, ...]:
    """Validate extra allowed host names and return them normalised (:func:`host_name`).

    Args:
        names: host names (``proxy.example``), IP addresses, ``*.example.com`` (every
            subdomain), or ``*`` (any host: only with a token, for a proxy that checks
            ``Host`` itself).
        token_mode: a token is configured (``RATCHET_API_TOKEN``).

    Raises:
        ConfigError: a name with a port, a scheme or a path, a wildcard other than a
            leading ``*.``, or ``*`` without a token (it would reopen DNS rebinding to
            the token-less loopback service).
    """
    checked: list[str] = []
    for raw in names:
        name = host_name(raw)
        if name == "*":
            if not token_mode:
                raise ConfigError(
                    "--allowed-host '*' needs RATCHET_API_TOKEN: without a token any web "
                    "page the operator opens could reach the service through a name it "
                    "points at 127.0.0.1 (DNS rebinding). Name the hosts instead")
            checked.append(name)
            continue
        bracketed = name.startswith("[") and name.endswith("]")
        if bracketed:
            try:
                ipaddress.IPv6Address(name[1:-1])
            except ValueError:
                bracketed = False
        if not bracketed and not _NAME.fullmatch(name):
            raise ConfigError(
                f"--allowed-host {raw!r} is not a host name: give the name alone (no "
                "scheme, port or path), e.g. 'ratchet.example.com', '10.0.0.5', "
                "'*.example.com'")
        checked.append(name)
    return tuple(dict.fromkeys(checked))


def parse_allowed_hosts(text: str | None) -> tuple[str, ...]:
    """The names of ``RATCHET_ALLOWED_HOSTS`` (comma- or space-separated; ``None`` or
    blank: none)."""
    if not text:
        return ()
    return tuple(part for part in re.split(r"[,\s]+", text) if part)


def allowed_hosts(extra: Iterable[str], bind: str | None = None) -> list[str]:
    """The ``Host`` names the service answers to: :data:`LOCAL_HOSTS`, ``bind`` (the
    address it listens on, unless a wildcard) and ``extra`` (already checked by
    :func:`check_allowed_hosts`), without repeats."""
    names = [*LOCAL_HOSTS]
    if bind is not None and bind.strip().lower() not in WILDCARD_BINDS:
        names.append(host_name(bind))
    names.extend(host_name(n) for n in extra)
    return list(dict.fromkeys(names))


class HostGuard:
    """ASGI middleware: Starlette's ``TrustedHostMiddleware`` over ``allowed_hosts`` (from
    :func:`allowed_hosts`), whose refusal of a request under ``/api`` is answered as the
    API answers errors: 400, :class:`~ratchet.web.models.ErrorBody` with ``error``
    :data:`HOST_NOT_ALLOWED` (the plain-text answer elsewhere: the dashboard's pages)."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app = app
        self.trusted = TrustedHostMiddleware(self._through, allowed_hosts=allowed_hosts,
                                             www_redirect=False)

    async def _through(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[_PASSED] = True
        await self.app(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/api" or path.startswith("/api/")):
            await self.trusted(scope, receive, send)
            return

        async def refusal_dropped(message: Message) -> None:
            if scope.get(_PASSED):  # the app's own answer
                await send(message)

        await self.trusted(scope, receive, refusal_dropped)
        if not scope.get(_PASSED):
            body = ErrorBody(error=HOST_NOT_ALLOWED, message=(
                "the Host header names a host this service does not answer to (ratchet "
                "serve --allowed-host adds one): a guard against DNS rebinding"))
            await JSONResponse(body.model_dump(), status_code=400)(scope, receive, send)

