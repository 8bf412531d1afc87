"""The connection a transaction step's function gets (:class:`GuardedConnection`): the
ledger transaction's own, minus what would end it; and :func:`joinable`, which lets
``App.submit`` / ``App.emit`` with ``connection=`` join that transaction."""

from __future__ import annotations

from typing import Any

from ...errors import TransactionMisuse

__all__ = ["GuardedConnection", "joinable"]


_FORBIDDEN = frozenset({"commit", "rollback", "close", "executescript", "autocommit",
                        "set_autocommit", "isolation_level", "set_isolation_level",
                        "tpc_begin", "tpc_commit", "tpc_prepare", "tpc_rollback"})
"""Connection attributes a transaction step's function may not use (they would end or
reconfigure the ledger's transaction)."""


def joinable(connection: Any) -> Any:
    """The connection to join for a caller's ``connection=`` (``App.submit``,
    ``App.emit``): a transaction step's guarded connection is its ledger transaction's
    own (the rows then commit with the step); any other is itself."""
    if isinstance(connection, GuardedConnection):
        return connection._conn
    return connection


class GuardedConnection:
    """The DB-API connection of a transaction step, minus what would end the transaction.

    Everything is delegated to the real connection (``execute``, ``executemany``,
    ``cursor``, psycopg's ``transaction()`` for a savepoint, ...) except ``commit``,
    ``rollback``, ``close``, ``executescript`` (it commits first), ``autocommit`` /
    ``isolation_level`` and two-phase commit, which raise :class:`TransactionMisuse`, as
    does setting any attribute (it would stay on the ledger's connection); a ``with
    conn:`` block is refused too (on sqlite3 it commits, on psycopg it closes).
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name: str) -> Any:
        if name in _FORBIDDEN:
            raise TransactionMisuse(
                f"a transaction step may not call {name!r} on its connection: Ratchet "
                "commits the step's writes together with its checkpoint (or rolls them back)")
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Any attribute set here would stay on the ledger's own connection (row_factory,
        # text_factory, autocommit...) after the step.
        raise TransactionMisuse(
            f"a transaction step may not set {name!r} on its connection (it is the "
            "ledger's own; set row factories on a cursor instead)")

    def __enter__(self) -> Any:
        raise TransactionMisuse(
            "a transaction step may not use its connection as a context manager (it would "
            "commit or close it); use the connection directly, or a savepoint")

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<transaction step connection {self._conn!r}>"
