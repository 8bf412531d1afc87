"""``ratchet serve``: the HTTP API and the dashboard (:mod:`ratchet.web`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated

import typer

from ..web.hosts import ALLOWED_HOSTS_ENV, parse_allowed_hosts
from ..web.settings import WebSettings
from .guard import guard
from .options import (
    MAX_WAIT_S,
    LedgerOpt,
)
from .render import (
    err_console,
    line,
)

__all__ = ["serve"]


def serve(
    ledger: LedgerOpt = None,
    host: Annotated[
        str,
        typer.Option("--host", metavar="HOST",
                     help="Address to listen on. Without RATCHET_API_TOKEN only loopback"
                     " (127.0.0.1, ::1, localhost) is allowed."),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, metavar="PORT",
                     help="TCP port (0: an ephemeral one, printed on start)."),
    ] = 8000,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", metavar="MODULE:APP",
                     help="The application whose task registry checks submits"
                     " (POST /api/tasks); without it submitting is refused."),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", metavar="LEVEL",
                     help="uvicorn's log level: debug, info, warning, error."),
    ] = "info",
    metrics_auth: Annotated[
        bool,
        typer.Option("--metrics-auth",
                     help="/metrics needs the bearer token too (needs RATCHET_API_TOKEN;"
                     " Prometheus: the scrape config's authorization credentials)."
                     " Default: /metrics is open (no task ids, keys or params)."),
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", metavar="NAME",
                     help="A Host name to answer to besides localhost, 127.0.0.1, [::1] and"
                     " --host (repeat for several; '*.example.com' for subdomains; also"
                     " $RATCHET_ALLOWED_HOSTS, comma-separated): e.g. a reverse proxy's"
                     " name. Requests for any other Host are refused (400), which stops DNS"
                     " rebinding."),
    ] = None,
    body_timeout_s: Annotated[
        float | None,
        typer.Option("--body-timeout-s", min=0.001, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Seconds a request body may take to arrive; then 408 and the"
                     " connection is closed. Default: 30."),
    ] = None,
) -> None:
    """Serve the HTTP API (/api, OpenAPI at /api/openapi.json) and the dashboard.

    Stateless: several replicas may serve one ledger. With RATCHET_API_TOKEN set, every
    /api read and mutation needs 'Authorization: Bearer $RATCHET_API_TOKEN' (but
    /api/health and /api/openapi.json) and every dashboard page a login; without it the
    service listens on loopback only (another --host is refused), reads are open and
    mutations are accepted from loopback. Either way only requests for an allowed Host
    (localhost, 127.0.0.1, [::1], --host, --allowed-host) are answered. Operator actions
    take a reason and are audited with the X-Ratchet-Operator header's name.
    """
    level = log_level.lower()
    if level not in ("debug", "info", "warning", "error"):
        err_console().print(line(("error: ", "bold red"),
                                 "--log-level must be debug, info, warning or error, not ",
                                 (repr(log_level), "")))
        raise typer.Exit(2)
    token = os.environ.get("RATCHET_API_TOKEN") or None
    extra = (*parse_allowed_hosts(os.environ.get(ALLOWED_HOSTS_ENV)), *(allowed_host or ()))
    settings = WebSettings(ledger_url=ledger, api_token=token, app_spec=app_spec,
                           metrics_auth=metrics_auth, allowed_hosts=extra)
    if body_timeout_s is not None:
        settings = dataclasses.replace(settings, body_timeout_s=body_timeout_s)
    # The HTTP stack is loaded when this command runs, not with the CLI: every other
    # command and every worker start would pay for it (tests/test_structure.py lists it).
    from ..web.serve import serve as run_service

    guard(lambda: run_service(settings, host, port, log_level=level))
