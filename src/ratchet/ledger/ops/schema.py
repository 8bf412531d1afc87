"""Schema feature gates: which migrations a ledger has (the one place that asks).

A read-only caller (``ratchet status`` of a newer release) may open a ledger no process of
this release has migrated yet: an operation that needs a newer table either refuses
(:meth:`SchemaGate.require`, :class:`~ratchet.errors.SchemaTooOld`) or degrades
(:meth:`SchemaGate.has`). Migrations are found by file name (``NNNN_<name>``), so
renumbering changes nothing; a gate that passed is remembered (schemas only move up).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ...errors import SchemaTooOld
from ..migrations import load_migrations

__all__ = ["DEFINITIONS", "FLOW", "RETENTION", "RETRY_GOVERNANCE", "SCHEDULES", "SchemaGate"]

DEFINITIONS = "definitions.sql"
"""The migration of the task definition tables (workers' definitions, DESIGN §8)."""
FLOW = "flow_control.sql"
"""The migration of flow control (queues, key slots, rate limits; DESIGN §8)."""
RETENTION = "retention.sql"
"""The migration of the counts rollup (stats, audit counts; DESIGN §9)."""
RETRY_GOVERNANCE = "retry_governance.sql"
"""The migration of the quarantine columns (DESIGN §7)."""
SCHEDULES = "schedules.sql"
"""The migration of the periodic schedules table (DESIGN §8, periodic tasks)."""


class SchemaGate:
    """The migrations known applied to one ledger.

    Args:
        scheme: the ledger URL's scheme (``"sqlite"`` / ``"postgresql"``), naming its
            migrations.
        version: reads the ledger's schema version (a round trip; called until the gate
            passes).
    """

    def __init__(self, scheme: str, version: Callable[[], int]) -> None:
        self._scheme = scheme
        self._version = version
        self._has: set[str] = set()
        self._lock = threading.Lock()

    def require(self, migration: str, what: str) -> None:
        """Return if the ledger has the migration whose file name ends ``_<migration>``.

        Raises:
            SchemaTooOld: it does not (``what`` names the operation that needs it).
        """
        if migration in self._has:
            return
        needed = next((m.version for m in load_migrations(self._scheme)
                       if m.name.split("_", 1)[1] == migration), None)
        if needed is not None:
            found = self._version()
            if found < needed:
                raise SchemaTooOld(found, needed, what)
        with self._lock:
            self._has.add(migration)

    def has(self, migration: str) -> bool:
        """Whether the ledger has that migration (for a read that degrades on an older
        schema instead of failing)."""
        try:
            self.require(migration, "")
        except SchemaTooOld:
            return False
        return True
