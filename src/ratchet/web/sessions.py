"""Dashboard sessions and CSRF tokens: signed cookies, no server-side store.

``ratchet serve`` is stateless (several replicas may run against one ledger), so a session
is a cookie the server signs and every replica can check:

* the cookie (``ratchet_session``; HttpOnly, SameSite=Strict, Secure over https) holds the
  operator's name, a random session id and an expiry, with an HMAC-SHA256 over them;
* the signing key is derived from ``RATCHET_API_TOKEN`` when one is configured (replicas
  with the same token accept each other's sessions; changing the token ends every
  session), else it is a random key of this process (loopback mode: one local process);
* the CSRF token of a session is ``HMAC(key, "csrf" + session id)``: every dashboard form
  carries it, every POST is refused without it.

Nothing here decides *who* may mutate: the login checks the token with
:func:`ratchet.web.auth.token_ok`, the one rule for the API and the dashboard.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

SESSION_COOKIE = "ratchet_session"
"""Name of the session cookie."""

FLASH_COOKIE = "ratchet_flash"
"""Name of the one-shot cookie that carries a success message across a redirect."""

SESSION_TTL_S = 8 * 3600.0
"""A session lasts this many seconds after the login."""

FLASH_TTL_S = 60.0
"""A flash message is shown if the redirected page is fetched within this many seconds."""


@dataclass(frozen=True, slots=True)
class Session:
    """A logged-in dashboard session.

    Attributes:
        operator: the name recorded as ``by=`` on every mutation of this session.
        session_id: 32 random hex digits (what the CSRF token is bound to).
        expires_at: epoch seconds (wall clock of the server).
    """

    operator: str
    session_id: str
    expires_at: float


@dataclass(frozen=True, slots=True)
class Flash:
    """A one-shot message shown after a redirect: ``kind`` ``ok`` or ``unchanged``."""

    message: str
    kind: str


class SessionKeeper:
    """Signs and checks session cookies, CSRF tokens and flash messages.

    Args:
        api_token: the configured API token (the key is derived from it), or ``None`` for
            a random key of this process.
        ttl_s: session lifetime, seconds.
    """

    def __init__(self, api_token: str | None, ttl_s: float = SESSION_TTL_S) -> None:
        if api_token is None:
            self._key = secrets.token_bytes(32)
        else:
            self._key = hmac.new(api_token.encode(), b"ratchet dashboard session v1",
                                 hashlib.sha256).digest()
        self._ttl_s = ttl_s

    # ------------------------------------------------------------------ signing

    def _mac(self, purpose: str, payload: str) -> str:
        return hmac.new(self._key, f"{purpose}\x00{payload}".encode(),
                        hashlib.sha256).hexdigest()

    def _sign(self, purpose: str, data: dict[str, object]) -> str:
        payload = base64.urlsafe_b64encode(
            json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")
        return f"{payload}.{self._mac(purpose, payload)}"

    def _unsign(self, purpose: str, value: str | None) -> dict[str, object] | None:
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(purpose, payload)):
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    # ------------------------------------------------------------------ sessions

    def issue(self, operator: str, now: float | None = None) -> tuple[Session, str]:
        """A new session for ``operator`` and its cookie value."""
        at = time.time() if now is None else now
        session = Session(operator, secrets.token_hex(16), at + self._ttl_s)
        cookie = self._sign("session", {"op": operator, "sid": session.session_id,
                                        "exp": session.expires_at})
        return session, cookie

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie value carries, or ``None`` if it is missing, forged,
        malformed or expired."""
        data = self._unsign("session", cookie)
        if data is None:
            return None
        op, sid, exp = data.get("op"), data.get("sid"), data.get("exp")
        if not isinstance(op, str) or not isinstance(sid, str) \
                or not isinstance(exp, int | float):
            return None
        if (time.time() if now is None else now) >= exp:
            return None
        return Session(op, sid, float(exp))

    def csrf_token(self, session: Session) -> str:
        """The CSRF token of ``session`` (64 hex digits)."""
        return self._mac("csrf", session.session_id)

    def csrf_ok(self, session: Session | None, presented: str | None) -> bool:
        """Whether ``presented`` is the CSRF token of ``session`` (constant time)."""
        if session is None or not presented:
            return False
        return hmac.compare_digest(presented, self.csrf_token(session))

    # ------------------------------------------------------------------ flash

    def flash(self, message: str, kind: str = "ok", now: float | None = None) -> str:
        """A flash cookie value carrying ``message`` (one line for people) and its
        ``kind`` (``ok``: it was done; ``unchanged``: nothing needed doing)."""
        at = time.time() if now is None else now
        return self._sign("flash", {"m": message, "k": kind, "exp": at + FLASH_TTL_S})

    def read_flash(self, cookie: str | None, now: float | None = None) -> Flash | None:
        """The message of a flash cookie value, or ``None``."""
        data = self._unsign("flash", cookie)
        if data is None:
            return None
        message, kind, exp = data.get("m"), data.get("k"), data.get("exp")
        if not isinstance(message, str) or not isinstance(kind, str) \
                or not isinstance(exp, int | float):
            return None
        return Flash(message, kind) if (time.time() if now is None else now) < exp else None
