"""Settings: ledger URL, durability level, payload limit. Parsed once, validated loudly.

Ledger URLs:

* ``sqlite:///ratchet.db`` — a file relative to the working directory (the default);
* ``sqlite:////var/lib/ratchet/ledger.db`` — an absolute path;
* query parameters: ``durability=fsync|buffered``, ``busy_timeout_s=<seconds>``;
* ``postgresql://user@host:5432/dbname`` — a PostgreSQL ledger (several hosts as libpq
  takes them, ``postgresql://user@h1:5432,h2:5432/dbname?target_session_attrs=read-write``,
  so that workers find the new primary after a failover); query parameters
  ``durability=fsync|buffered|replicated``, ``schema=<name>`` (default ``ratchet``: the
  ledger's tables live in that schema), ``pool_size=<connections>`` (default 4), and any
  libpq parameter (``sslmode``, ``connect_timeout``, ``application_name``, ...).

Environment: ``RATCHET_LEDGER_URL``, ``RATCHET_MAX_PAYLOAD_BYTES``. The durability level is
part of the URL, so every process that uses the same URL runs at the same level.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import ConfigError

__all__ = [
    "DEFAULT_LEDGER_URL",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Durability",
    "LedgerConfig",
    "max_payload_bytes_from_env",
    "parse_ledger_url",
    "redact_url",
]

DEFAULT_LEDGER_URL = "sqlite:///ratchet.db"
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class Durability(StrEnum):
    """How durable a commit is when the ledger says it is done (DESIGN §1).

    * ``buffered`` — survives a process crash, not an OS crash or power loss
      (SQLite ``synchronous=NORMAL`` in WAL mode).
    * ``fsync`` — survives power loss of the host (SQLite ``synchronous=FULL``). Default.
    * ``replicated`` — survives loss of the host (PostgreSQL synchronous standby only).
    """

    BUFFERED = "buffered"
    FSYNC = "fsync"
    REPLICATED = "replicated"


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """A parsed ledger URL.

    Attributes:
        url: the URL as given.
        scheme: ``sqlite`` or ``postgresql``.
        path: file path for SQLite (``""`` for PostgreSQL).
        durability: the named durability level.
        busy_timeout_s: how long a SQLite writer waits for the file lock, in seconds.
        options: other query parameters, for the backend.
    """

    url: str
    scheme: str
    path: str
    durability: Durability = Durability.FSYNC
    busy_timeout_s: float = 30.0
    options: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """The fields, with the password of ``url`` and of ``options`` redacted."""
        options = {
            k: ("***" if _SECRET_PARAM.search(k) else v) for k, v in self.options.items()
        }
        return (
            f"LedgerConfig(url={redact_url(self.url)!r}, scheme={self.scheme!r}, "
            f"path={self.path!r}, durability={self.durability.value!r}, "
            f"busy_timeout_s={self.busy_timeout_s!r}, options={options!r})"
        )

    __str__ = __repr__


_SECRET_PARAM = re.compile(r"pass|secret|token|key", re.IGNORECASE)
"""Query parameter names whose values are secrets (``password``, ``sslpassword``, ...)."""
_SECRET_QUERY = re.compile(r"(?i)([?&;][^=&#;]*(?:pass|secret|token|key)[^=&#;]*=)[^&;]*")
"""A secret query parameter's value runs to the next ``&`` or ``;`` (a ``#`` in it is part
of the secret, not a fragment to show)."""


def redact_url(url: str) -> str:
    """``url`` with every secret replaced by ``***``, for messages, logs and reprs.

    Robust to URLs that do not parse: the user-info part is taken as everything between
    ``scheme://`` and the *last* ``@`` of the whole string, so a password holding an
    unencoded ``#``, ``/``, ``?`` or ``@`` is still hidden whole; everything from the first
    ``:`` of that part to the ``@`` becomes ``***``. Query parameters whose name mentions
    a password, secret, token or key (``password=``, ``sslpassword=``) are redacted too.
    Over-redacting an odd URL is accepted; printing a secret is not.

    Args:
        url: any string (a ledger URL, usually).

    Returns:
        the redacted string (``url`` unchanged when it holds no secret).
    """
    scheme, sep, rest = url.partition("://")
    if sep:
        at = rest.rfind("@")
        if at >= 0:
            userinfo = rest[:at]
            if ":" in userinfo:
                rest = f"{userinfo.split(':', 1)[0]}:***{rest[at:]}"
        url = f"{scheme}{sep}{rest}"
    return _SECRET_QUERY.sub(r"\1***", url)


def _encoding_hint(raw: str) -> str:
    """A hint to percent-encode the user-info part when ``raw`` has one (``user:...@``)."""
    _, sep, rest = raw.partition("://")
    if sep and ":" in rest[: max(0, rest.rfind("@"))]:
        return (
            "; if the password holds '#', '/', '?' or '@', percent-encode them "
            "(%23, %2F, %3F, %40)"
        )
    return ""


def _durability(raw: str) -> Durability:
    try:
        return Durability(raw.strip().lower())
    except ValueError:
        names = ", ".join(d.value for d in Durability)
        raise ConfigError(f"unknown durability level {raw!r}; expected one of: {names}") from None


def _check_ports(scheme: str, netloc: str) -> None:
    """Validate the port(s) of ``netloc``; raise ``ValueError`` (urllib's) when one is bad.

    A PostgreSQL URL may name several hosts, as libpq does
    (``postgresql://user@h1:5432,h2:5433/db?target_session_attrs=read-write``): libpq tries
    them in turn, which is how a client finds the new primary after a failover. urllib
    reads ``5432,h2:5433`` as one port and refuses it, so each ``host[:port]`` entry is
    checked on its own.
    """
    hosts = netloc.rpartition("@")[2]
    if scheme in ("postgresql", "postgres") and "," in hosts:
        for entry in hosts.split(","):
            urlsplit(f"//{entry}").port  # noqa: B018 - validates the port
        return
    urlsplit(f"//{hosts}").port  # noqa: B018 - validates the port


def parse_ledger_url(url: str | None = None, durability: str | None = None) -> LedgerConfig:
    """Parse a ledger URL (default: ``RATCHET_LEDGER_URL`` or ``sqlite:///ratchet.db``).

    Args:
        url: the ledger URL, or ``None`` for the environment / default.
        durability: overrides the URL's level (``App(durability=...)``).

    Raises:
        ConfigError: unknown scheme, missing path, bad durability or timeout value.
    """
    raw = url if url is not None else os.environ.get("RATCHET_LEDGER_URL", DEFAULT_LEDGER_URL)
    if not isinstance(raw, str):
        raise ConfigError(f"ledger URL must be a string, got {type(raw).__name__}")
    if durability is not None and not isinstance(durability, str):
        raise ConfigError(f"durability must be a string, got {type(durability).__name__}")
    raw = raw.strip()
    if not raw:
        raise ConfigError("ledger URL is empty; expected e.g. sqlite:///ratchet.db")
    try:
        parts = urlsplit(raw)
        _check_ports(parts.scheme.lower(), parts.netloc)
    except ValueError as exc:
        hint = _encoding_hint(raw)
        # urllib's message quotes the text it choked on, which may be part of a password
        reason = "the user name, password or port is malformed" if hint else str(exc)
        raise ConfigError(f"malformed ledger URL {redact_url(raw)!r}: {reason}{hint}") from None
    scheme = parts.scheme.lower()
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    level_raw = durability or query.pop("durability", None)
    query.pop("durability", None)
    level = _durability(level_raw) if level_raw else Durability.FSYNC
    busy_raw = query.pop("busy_timeout_s", "30")
    try:
        busy = float(busy_raw)
    except ValueError:
        raise ConfigError(f"busy_timeout_s must be a number of seconds, got {busy_raw!r}") from None
    if not math.isfinite(busy) or busy < 0:
        raise ConfigError(f"busy_timeout_s must be a finite number >= 0 seconds, got {busy_raw!r}")
    if parts.fragment:
        raise ConfigError(
            f"ledger URL {redact_url(raw)!r} contains '#'; percent-encode it as %23 (in the "
            "path or the password)"
        )
    if scheme == "sqlite":
        if parts.netloc:
            raise ConfigError(
                f"malformed SQLite URL {redact_url(raw)!r}: use sqlite:///relative.db or "
                "sqlite:////abs/path.db"
            )
        path = unquote(parts.path[1:] if parts.path.startswith("/") else parts.path)
        if not path:
            raise ConfigError(
                f"SQLite URL {redact_url(raw)!r} has no file path; e.g. sqlite:///ratchet.db"
            )
        if query:
            raise ConfigError(
                f"unknown SQLite ledger URL parameter(s) {', '.join(sorted(query))} in "
                f"{redact_url(raw)!r}; "
                "known: durability, busy_timeout_s"
            )
        if level is Durability.REPLICATED:
            raise ConfigError(
                "durability 'replicated' needs a PostgreSQL ledger with a synchronous standby; "
                "SQLite offers 'fsync' (default) or 'buffered'"
            )
        return LedgerConfig(raw, "sqlite", path, level, busy, query)
    if scheme in ("postgresql", "postgres"):
        after_host = raw.split("://", 1)[-1][len(parts.netloc):]
        if parts.netloc.count("@") > 1 or ("@" not in parts.netloc and "@" in after_host):
            # "user:12/secret@host": parsers take "user" as the host and "12" as the port,
            # and the rest of the password as path or query (printed, sent as an option).
            # "user:s3cr@et@host": libpq splits at the first '@' and sends "et@host" as
            # the host name (printed in its error).
            raise ConfigError(
                f"ledger URL {redact_url(raw)!r} has an '@' other than the one before the "
                "host; percent-encode an '@' in the user or password as %40, and '/', '?' "
                "or '#' in the password as %2F, %3F, %23"
            )
        if "busy_timeout_s" in parse_qs(parts.query, keep_blank_values=True):
            raise ConfigError(
                "busy_timeout_s is a SQLite setting; PostgreSQL ledger URLs take durability, "
                "schema, pool_size and libpq parameters (sslmode, connect_timeout, ...)"
            )
        schema = query.get("schema", "ratchet")
        if schema.startswith("pg_") or schema == "information_schema":
            raise ConfigError(
                f"schema {schema!r} is a PostgreSQL system schema; choose another name"
            )
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(
                f"schema must be a plain PostgreSQL identifier (lower-case letters, digits, _; "
                f"at most 63 characters, not starting with a digit), got {schema!r}"
            )
        pool_raw = query.get("pool_size", "4")
        try:
            pool_size = int(pool_raw)
        except ValueError:
            pool_size = 0
        if not 1 <= pool_size <= 100:
            raise ConfigError(f"pool_size must be an integer from 1 to 100, got {pool_raw!r}")
        if not parts.hostname and not parts.path.strip("/") and "host" not in query:
            raise ConfigError(
                f"PostgreSQL URL {redact_url(raw)!r} names no server or database; "
                "e.g. postgresql://user@127.0.0.1:5432/dbname"
            )
        return LedgerConfig(raw, "postgresql", "", level, busy, query)
    raise ConfigError(
        f"unsupported ledger URL scheme {parts.scheme!r} in {redact_url(raw)!r}; expected "
        "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://host/dbname"
    )


def max_payload_bytes_from_env(default: int = DEFAULT_MAX_PAYLOAD_BYTES) -> int:
    """Read ``RATCHET_MAX_PAYLOAD_BYTES`` (bytes) or return ``default``.

    Raises:
        ConfigError: the variable is not a positive integer.
    """
    raw = os.environ.get("RATCHET_MAX_PAYLOAD_BYTES")
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"RATCHET_MAX_PAYLOAD_BYTES must be an integer, got {raw!r}") from None
    if value <= 0:
        raise ConfigError("RATCHET_MAX_PAYLOAD_BYTES must be > 0")
    return value
