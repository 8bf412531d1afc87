"""The ASGI application of ``ratchet serve``: the API, the dashboard and ``/metrics``
mounted on one Starlette app around one :class:`~ratchet.control.Control`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import App
from ..config import max_payload_bytes_from_env
from ..control import Control
from ..loading import load_app
from ..observe.ledger_metrics import render_ledger_metrics
from . import api, dashboard
from .auth import bearer, metrics_ok
from .hosts import HostGuard, allowed_hosts, check_allowed_hosts
from .limits import BodyLimit, body_limit_bytes
from .settings import WebSettings

__all__ = ["WebSettings", "create_app"]


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
        Middleware(HostGuard, allowed_hosts=hosts),
        Middleware(BodyLimit, max_bytes=body_limit_bytes(payload_limit),
                   timeout_s=settings.body_timeout_s)])
    app.state.control = ctl
    app.state.settings = settings
    return app

