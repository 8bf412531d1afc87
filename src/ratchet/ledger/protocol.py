"""The ledger contract (DESIGN §10) as one :class:`Ledger` Protocol, made of the roles that
call it: :class:`~ratchet.ledger.protocol_worker.WorkerLedger` (an application and its
workers), :class:`~ratchet.ledger.protocol_operator.OperatorLedger` (Control and the
operator tools) and :class:`AdminLedger` (schema and retention), on the shared
:class:`~ratchet.ledger.protocol_handle.LedgerHandle`. A caller that needs one role only
can ask for that one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from .protocol_handle import LedgerHandle, Subscription
from .protocol_operator import OperatorLedger
from .protocol_relay import RelayLedger
from .protocol_worker import WorkerLedger
from .records_ops import PruneReport

__all__ = ["AdminLedger", "Ledger", "LedgerHandle", "OperatorLedger", "RelayLedger",
           "Subscription", "WorkerLedger"]


@runtime_checkable
class AdminLedger(LedgerHandle, Protocol):
    """The calls that change the ledger's schema or delete history: ``ratchet migrate``,
    ``ratchet prune`` and a worker's retention loop (DESIGN §10.2)."""

    def migrate(self) -> int:
        """Apply pending schema migrations; return the schema version.

        Raises:
            SchemaTooNew: the ledger has a newer schema (it is left untouched).
        """
        ...

    def schema_version(self) -> int:
        """The ledger's current schema version (0 for an empty ledger)."""
        ...

    def prune(
        self,
        older_than_s: float,
        *,
        by: str,
        dry_run: bool = False,
        batch_size: int = 500,
        export: Callable[[list[dict[str, Any]]], None] | None = None,
        audit_empty: bool = True,
        pace: float | None = None,
    ) -> PruneReport:
        """Delete finished tasks older than ``older_than_s`` with their steps, effects,
        late effects and audit rows, in batches of ``batch_size`` tasks, each its own
        short transaction; then audit rows older than the age whose task is gone. A dry
        run only counts. ``export(records)`` is called in each batch's transaction before
        its delete, with one JSON-ready record per task (row and history); if it raises,
        the batch is rolled back and the prune stops. The prune is audited (kind
        ``prune``) unless it is a dry run, or deleted nothing and ``audit_empty`` is off.
        Between batches it sleeps ``pace`` times the batch's duration (default: 1 where one
        writer holds the whole database, SQLite; else 0). Never deletes a task that is not
        terminal. See DESIGN §10.2.
        """
        ...

    def prune_workers(self, older_than_s: float) -> list[str]:
        """Delete the registry rows of workers ``stopped`` or ``dead`` whose last heartbeat
        is more than ``older_than_s`` seconds old (ledger clock), with their definition
        rows; ``alive`` rows are never deleted. Returns the holders deleted. One short
        transaction over the registry only (no task row)."""
        ...


@runtime_checkable
class Ledger(WorkerLedger, OperatorLedger, AdminLedger, RelayLedger, Protocol):
    """The storage contract every backend implements (:class:`~ratchet.ledger.engine.
    LedgerEngine` over the SQLite and PostgreSQL dialects).

    Implementations must be safe to call from several threads; each method is one
    transaction. Errors from the driver surface as :class:`~ratchet.errors.LedgerError`:
    ``LedgerUnavailable`` for connection trouble, ``WriteRejected`` for a write the
    database refuses for its content. Reads never fail on stored JSON they cannot decode
    (``TaskInfo.params`` / ``.result`` then hold an
    :class:`~ratchet.serde.Undecodable`).
    """
