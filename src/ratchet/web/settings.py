"""The settings of ``ratchet serve`` (:class:`WebSettings`): the low module every part of
:mod:`ratchet.web` reads them from (the API, the dashboard, the auth rule, the app)."""

from __future__ import annotations

from dataclasses import dataclass

from .limits import DEFAULT_BODY_TIMEOUT_S

__all__ = ["WebSettings"]


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
