"""Who may mutate through ``ratchet serve``: one rule for the API and the dashboard.

* With a token configured (``RATCHET_API_TOKEN``), a mutation must present it
  (``Authorization: Bearer <token>`` on the API; the dashboard's login sets it in a
  cookie). Compared in constant time.
* Without one, the service listens on 127.0.0.1 only (``ratchet serve`` refuses another
  host and says so on start), and mutations from loopback are accepted without a token.

Reads never need the token.
"""

from __future__ import annotations

import hmac

from .app import WebSettings

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
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode(), settings.api_token.encode())


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, else ``None``."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
