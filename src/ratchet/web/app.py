"""The ASGI application of ``ratchet serve``: the API, the dashboard and ``/metrics``
mounted on one Starlette app around one :class:`~ratchet.control.Control`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..app import App
from ..config import max_payload_bytes_from_env
from ..control import Control
from ..loading import load_app
from .hosts import allowed_hosts, check_allowed_hosts
from .limits import DEFAULT_BODY_TIMEOUT_S, BodyLimit, body_limit_bytes


@dataclass(frozen=True, slots=True)
class WebSettings:
    """How ``ratchet serve`` runs.

    Attributes:
        ledger_url: the ledger URL (``None``: ``RATCHET_LEDGER_URL``, default
            ``sqlite:///ratchet.db``).
        api_token: the bearer token every read and mutation needs (``RATCHET_API_TOKEN``;
            :mod:`ratchet.web.auth`); ``None``: the service binds to 127.0.0.1 only, reads
            are open and mutations from loopback need no token.
        app_spec: ``MODULE:APP`` of the application (``ratchet serve --app``): its task
            registry checks submits (``POST /api/tasks``); ``None``: submitting is refused
            (403 naming the fix), everything else works.
        metrics_auth: ``/metrics`` needs the bearer token too (``ratchet serve
            --metrics-auth``; needs ``api_token``); default open (it carries no task ids,
            keys, params or tenants).
        allowed_hosts: ``Host`` names answered besides localhost, 127.0.0.1 and [::1]
            (``ratchet serve --allowed-host``, ``RATCHET_ALLOWED_HOSTS``; ``serve`` adds
            the address it listens on): any other is refused with 400, the guard against
            DNS rebinding (:mod:`ratchet.web.hosts`).
        body_timeout_s: seconds a request's whole body may take to arrive (``ratchet
            serve --body-timeout-s``); later, 408 and the connection is closed
            (:mod:`ratchet.web.limits`).
    """

    ledger_url: str | None = None
    api_token: str | None = None
    app_spec: str | None = None
    metrics_auth: bool = False
    allowed_hosts: tuple[str, ...] = ()
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S


def create_app(settings: WebSettings, *, control: Control | None = None) -> Starlette:
    """Build the ASGI app: ``/api/...`` (JSON, OpenAPI at ``/api/openapi.json``), the
    dashboard at ``/`` and Prometheus exposition at ``/metrics``, under the rule of
    :mod:`ratchet.web.auth`. A ``Host`` other than the allowed ones
    (:func:`ratchet.web.hosts.allowed_hosts`) is refused (400); request bodies over
    :func:`ratchet.web.limits.body_limit_bytes` of the payload limit are refused (413),
    and those that do not arrive within ``settings.body_timeout_s`` too (408).

    Args:
        settings: see :class:`WebSettings`.
        control: the Control to use (tests pass one); default ``Control(app=...)`` of
            ``settings.app_spec`` on ``settings.ledger_url``, or ``Control(ledger_url)``.

    Raises:
        ConfigError: malformed ledger URL; the app cannot be loaded
            (:func:`ratchet.loading.load_app`); an allowed host that is not a host name
            (:func:`ratchet.web.hosts.check_allowed_hosts`).
    """
    hosts = allowed_hosts(check_allowed_hosts(settings.allowed_hosts,
                                              token_mode=settings.api_token is not None))
    from . import api, dashboard
    from .auth import bearer, metrics_ok

    loaded: App | None = None
    if control is not None:
        ctl = control
    elif settings.app_spec is not None:
        loaded = load_app(settings.app_spec)
        loaded.configure(ledger=settings.ledger_url)
        ctl = Control(app=loaded)
    else:
        ctl = Control(settings.ledger_url)
    routes: list[BaseRoute] = [*api.routes(ctl, settings), *dashboard.routes(ctl, settings)]

    async def metrics(request: Request) -> Response:
        from ..observe.ledger_metrics import render_ledger_metrics

        if not metrics_ok(settings, bearer(request.headers.get("authorization"))):
            return Response("/metrics needs 'Authorization: Bearer <RATCHET_API_TOKEN>' "
                            "(ratchet serve --metrics-auth)\n", status_code=401,
                            headers={"WWW-Authenticate": "Bearer"},
                            media_type="text/plain")
        body, content_type = await run_in_threadpool(render_ledger_metrics, ctl)
        return Response(body, headers={"Content-Type": content_type})

    routes.append(Route("/metrics", metrics, methods=["GET"]))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        ctl.close()
        if loaded is not None:
            loaded.close()

    # The Host is checked first (ratchet.web.hosts); request bodies are capped in size
    # and time before parsing (413, 408): see ratchet.web.limits.
    payload_limit = (loaded.max_payload_bytes if loaded is not None
                     else max_payload_bytes_from_env())
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[
        Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        Middleware(BodyLimit, max_bytes=body_limit_bytes(payload_limit),
                   timeout_s=settings.body_timeout_s)])
    app.state.control = ctl
    app.state.settings = settings
    return app

