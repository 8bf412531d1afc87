"""Who may read and who may mutate through ``ratchet serve``: one rule for the API and
the dashboard.

* With a token configured (``RATCHET_API_TOKEN``: the mode for a service reachable
  beyond loopback), every read and every mutation must present it: on the API
  ``Authorization: Bearer <token>`` on every ``/api`` route but ``/api/health``,
  ``/api/openapi.json`` and the index ``/api``; on the dashboard a session, which only
  the login sets after checking the token (:mod:`ratchet.web.sessions`), on every page
  but ``/login`` and ``/static``. Compared in constant time.
* Without one, the service listens on 127.0.0.1 only (``ratchet serve`` refuses another
  host and says so on start): reads are open, and mutations from loopback are accepted
  without a token.
* ``/metrics`` is open (task types, states and counters: no task ids, keys, params or
  tenants, by design), unless ``ratchet serve --metrics-auth`` (a token is then
  required): the bearer token, as a Prometheus scrape's ``authorization`` sends it.
"""

from __future__ import annotations

import contextlib
import hmac

from .settings import WebSettings

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
"""Hosts ``ratchet serve`` may bind to without a token."""


def token_ok(settings: WebSettings, presented: str | None, client_host: str | None) -> bool:
    """Whether a mutation may proceed.

    Args:
        settings: the service settings (``api_token`` ``None``: loopback mode).
        presented: the token the request carried (``None`` if none).
        client_host: the peer address (``request.client.host``), ``None`` if unknown.

    Returns:
        True when the configured token was presented; without a configured token, True
        only for a loopback peer.
    """
    if settings.api_token is None:
        return client_host in LOOPBACK_HOSTS
    return _matches(settings.api_token, presented)


def read_ok(settings: WebSettings, presented: str | None = None, *,
            has_session: bool = False) -> bool:
    """Whether a read (an API GET, a dashboard page) may proceed: always without a
    configured token (loopback mode), else only with it.

    Args:
        settings: the service settings.
        presented: the bearer token the request carried (``None`` if none).
        has_session: the request carries a valid dashboard session (only the login issues
            one, after :func:`token_ok`; its signing key derives from the token).
    """
    if settings.api_token is None:
        return True
    return has_session or _matches(settings.api_token, presented)


def metrics_ok(settings: WebSettings, presented: str | None) -> bool:
    """Whether ``GET /metrics`` may proceed: always, unless ``settings.metrics_auth``
    (``ratchet serve --metrics-auth``), then only with the configured bearer token."""
    if not settings.metrics_auth:
        return True
    return settings.api_token is not None and _matches(settings.api_token, presented)


def _matches(token: str, presented: str | None) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), token.encode())


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else ``None``.

    The value is taken as the server hands it over (Latin-1 code points for the header's
    bytes) and returned as the client's UTF-8 text when the bytes are UTF-8 (else as it
    is, and then it does not match)."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    token = value.strip()
    with contextlib.suppress(UnicodeError):
        token = token.encode("latin-1").decode("utf-8")
    return token
