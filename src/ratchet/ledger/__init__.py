"""The ledger: the single source of truth (DESIGN §2, §10).

:func:`open_ledger` picks the backend from the URL scheme; callers only see the
:class:`~ratchet.ledger.base.Ledger` contract.
"""

from __future__ import annotations

from ..config import LedgerConfig, parse_ledger_url
from ..errors import ConfigError
from .base import Ledger
from .sqlite import SQLiteLedger

__all__ = ["Ledger", "open_ledger"]


def open_ledger(
    url: str | LedgerConfig | None = None,
    durability: str | None = None,
    migrate: bool = True,
    must_exist: bool = False,
) -> Ledger:
    """Open (and by default migrate) the ledger at ``url``.

    Args:
        url: a ledger URL, a parsed :class:`LedgerConfig`, or ``None`` for
            ``RATCHET_LEDGER_URL`` / ``sqlite:///ratchet.db``.
        durability: ``"fsync"``, ``"buffered"`` or ``"replicated"`` (PostgreSQL with a
            synchronous standby only), overriding the URL.
        migrate: apply pending schema migrations on open.
        must_exist: refuse to create a new, empty ledger (read-only commands use this, so a
            typo in the URL is an error rather than an empty answer).

    Raises:
        ConfigError: malformed URL or an unsupported backend.
        LedgerUnavailable: the ledger cannot be opened.
        SchemaTooNew: the ledger has a newer schema (it is not modified).
    """
    config = url if isinstance(url, LedgerConfig) else parse_ledger_url(url, durability)
    if config.scheme == "sqlite":
        return SQLiteLedger(config, migrate=migrate, must_exist=must_exist)
    if config.scheme == "postgresql":
        try:
            from .postgres import PostgresLedger
        except ImportError as exc:  # psycopg missing
            raise ConfigError(
                f"the PostgreSQL ledger needs psycopg 3 and psycopg_pool ({exc}); "
                "install them with: pip install 'ratchet[postgres]'"
            ) from exc
        return PostgresLedger(config, migrate=migrate, must_exist=must_exist)
    raise ConfigError(f"unsupported ledger backend {config.scheme!r}")
