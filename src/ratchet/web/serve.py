"""Running the web service (``ratchet serve``): the bind rule and uvicorn.

With ``RATCHET_API_TOKEN`` every read and mutation needs it (:mod:`ratchet.web.auth`).
Without it the service listens on a loopback address only (reads are open, mutations from
loopback need no token): another ``--host`` is refused before anything listens. Either way
it answers only to the allowed ``Host`` names (:mod:`ratchet.web.hosts`): localhost,
127.0.0.1, [::1], the ``--host`` it listens on and ``--allowed-host`` /
``RATCHET_ALLOWED_HOSTS``. The start line says which rule is in force and which names.
"""

from __future__ import annotations

import dataclasses
import math
import socket
import sys
from typing import TextIO

import uvicorn

from ..config import parse_ledger_url, redact_url
from ..errors import ConfigError
from .app import create_app
from .auth import LOOPBACK_HOSTS
from .hosts import allowed_hosts, check_allowed_hosts
from .settings import WebSettings

__all__ = ["bind_socket", "check_bind", "serve", "start_line"]


def check_bind(settings: WebSettings, host: str) -> None:
    """Refuse a non-loopback ``host`` when no token is configured.

    Raises:
        ConfigError: ``host`` is not 127.0.0.1 / ::1 / localhost and ``settings.api_token``
            is None (the message says how to fix it); the token is blank or has leading
            or trailing whitespace (HTTP strips header values: no client could present it);
            ``settings.metrics_auth`` without a token; an allowed host that is not a host
            name, or ``*`` without a token (:func:`ratchet.web.hosts.check_allowed_hosts`);
            a ``body_timeout_s`` that is not a positive number of seconds.
    """
    token = settings.api_token
    if token is not None and (not token.strip() or token != token.strip()):
        raise ConfigError(
            "RATCHET_API_TOKEN is blank or starts or ends with whitespace: no client could "
            "present it (HTTP strips header values), so every mutation would be refused. "
            "Set it without the surrounding whitespace")
    if settings.metrics_auth and token is None:
        raise ConfigError(
            "--metrics-auth needs RATCHET_API_TOKEN: /metrics would ask for a bearer token "
            "there is none of. Set RATCHET_API_TOKEN (the scraper sends it as "
            "'Authorization: Bearer <token>'), or drop --metrics-auth")
    check_allowed_hosts(settings.allowed_hosts, token_mode=token is not None)
    if not (math.isfinite(settings.body_timeout_s) and settings.body_timeout_s > 0):
        raise ConfigError(f"--body-timeout-s must be a positive number of seconds, not "
                          f"{settings.body_timeout_s!r}")
    if settings.api_token is None and host not in LOOPBACK_HOSTS:
        raise ConfigError(
            f"refusing to listen on {host!r} without RATCHET_API_TOKEN: anyone who can "
            "reach the port could cancel, retry, pause or resolve tasks. Set "
            "RATCHET_API_TOKEN (clients send 'Authorization: Bearer <token>'), or listen "
            "on --host 127.0.0.1")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (``port`` 0: an ephemeral port; read it
    with ``sock.getsockname()[1]``).

    Raises:
        ConfigError: the address cannot be bound (in use, not an address of this host).
    """
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(128)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


def start_line(settings: WebSettings, host: str, port: int, ledger: str) -> str:
    """What ``ratchet serve`` prints when it listens: where, which ledger, which rule."""
    where = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    metrics = ("/metrics needs it too" if settings.metrics_auth
               else "/metrics and /api/health open")
    rule = ("reads and mutations need 'Authorization: Bearer $RATCHET_API_TOKEN' (the "
            f"dashboard: a login), {metrics}"
            if settings.api_token is not None else
            "no RATCHET_API_TOKEN: listening on loopback only; reads open, mutations from "
            "loopback need no token")
    submit = (f"submit checked by {settings.app_spec}" if settings.app_spec is not None
              else "no --app: POST /api/tasks refused (403)")
    names = allowed_hosts(settings.allowed_hosts, host)
    hosts = ("any Host (--allowed-host '*')" if "*" in names else
             f"answers to Host {', '.join(names)} only (more: --allowed-host NAME)")
    return (f"ratchet serve: {where} (API {where}/api, OpenAPI {where}/api/openapi.json) "
            f"on ledger {ledger}; {rule}; {hosts}; {submit}")


def serve(settings: WebSettings, host: str = "127.0.0.1", port: int = 8000, *,
          log_level: str = "info", out: TextIO | None = None) -> None:
    """Serve the API (and the dashboard) until SIGINT / SIGTERM.

    Args:
        settings: ledger, token, app (:class:`WebSettings`).
        host: the address to listen on.
        port: the TCP port (0: an ephemeral port, printed).
        log_level: uvicorn's log level (``info``, ``warning``, ...).
        out: where the start line goes (default stderr).

    Raises:
        ConfigError: a non-loopback host without a token, a bad allowed host or body
            timeout (:func:`check_bind`), an address that cannot be bound, a malformed
            ledger URL, an app that cannot be loaded.
    """
    check_bind(settings, host)
    settings = dataclasses.replace(
        settings, allowed_hosts=tuple(allowed_hosts(settings.allowed_hosts, host)))
    app = create_app(settings)
    sock = bind_socket(host, port)
    bound = sock.getsockname()[1]
    ledger = redact_url(parse_ledger_url(settings.ledger_url).url)
    print(start_line(settings, host, bound, ledger), file=out or sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level=log_level, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
