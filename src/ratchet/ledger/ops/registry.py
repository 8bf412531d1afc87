"""The worker registry (who runs, where, seen when) and the task definitions workers
register (DESIGN §8 versions)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...serde import dumps
from ..base import (
    DefinitionChange,
    DefinitionRecord,
    DefinitionSpec,
    VersionBacklog,
    WorkerInfo,
    WorkerSlots,
)
from ..dialect import Tx
from ..rows import (
    DEFINITIONS_ALL,
    DEFINITIONS_OF,
    LIVE_DEFINITIONS,
    LIVE_WORKER_SLOTS,
    READY_BY_VERSION,
    WORKER_DEFINITION_SPECS,
    WORKERS_ALL,
    WORKERS_ON_HOST,
    WORKERS_PRUNE,
    AuditRow,
    insert_audit,
)
from .core import EngineCore
from .ratelimits import register_code_limits
from .schema import DEFINITIONS, FLOW

__all__ = ["Registry"]

class Registry:
    """Workers and definitions of the :class:`~ratchet.ledger.base.Ledger` contract. The
    definition tables may be missing on a ledger opened read-only by a newer release: their
    reads then return nothing."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def register_worker(self, info: WorkerInfo) -> None:
        """See :meth:`Ledger.register_worker`."""
        self.core.dialect.run(lambda tx: tx.execute("worker_register", {
            "holder": info.holder, "host_id": info.host_id, "hostname": info.hostname,
            "pid": info.pid, "pid_start": info.pid_start, "now": tx.now,
        }))

    def record_worker_slots(self, holder: str, slots: int,
                            queues: Sequence[str] | None = None) -> None:
        """See :meth:`Ledger.record_worker_slots`: the registry row's ``slots`` and
        ``queues`` (JSON)."""
        if not self.core.schema.has(FLOW):
            return  # a ledger before flow control: no column for them
        served = None if queues is None else dumps(sorted(queues))
        self.core.dialect.run(lambda tx: tx.execute(
            "worker_slots_set", {"holder": holder, "slots": slots, "queues": served}))

    def live_worker_slots(self, live_within_s: float) -> list[WorkerSlots]:
        """See :meth:`Ledger.live_worker_slots` (none on a ledger not yet migrated to the
        definition tables)."""
        if not self.core.schema.has(DEFINITIONS) or not self.core.schema.has(FLOW):
            return []
        rows = self.core.dialect.run(lambda tx: LIVE_WORKER_SLOTS.all(
            tx, {"since": tx.now - live_within_s}), write=False)
        names: dict[str, set[str]] = {}
        slots: dict[str, int | None] = {}
        served: dict[str, tuple[str, ...] | None] = {}
        for r in rows:
            names.setdefault(r.holder, set()).add(r.name)
            slots[r.holder] = r.slots if isinstance(r.slots, int) and r.slots > 0 else None
            served[r.holder] = _queues_of(r.queues)
        return [WorkerSlots(h, slots[h], tuple(sorted(names[h])), served[h])
                for h in sorted(names)]

    def touch_worker(self, holder: str, state: str = "alive") -> None:
        """See :meth:`Ledger.touch_worker`."""
        self.core.dialect.run(lambda tx: tx.execute(
            "worker_touch", {"now": tx.now, "state": state, "holder": holder}))

    def list_workers(self, host_id: str | None = None) -> list[WorkerInfo]:
        """See :meth:`Ledger.list_workers`."""
        if host_id is None:
            return self.core.dialect.run(lambda tx: WORKERS_ALL.all(tx), write=False)
        return self.core.dialect.run(
            lambda tx: WORKERS_ON_HOST.all(tx, {"host_id": host_id}), write=False)

    def prune_workers(self, older_than_s: float) -> list[str]:
        """See :meth:`Ledger.prune_workers`."""
        definitions = self.core.schema.has(DEFINITIONS)

        def body(tx: Tx) -> list[str]:
            cutoff = {"cutoff": tx.now - older_than_s}
            if definitions:
                tx.execute("worker_definitions_prune", cutoff)
            return sorted(str(r.holder) for r in WORKERS_PRUNE.all(tx, cutoff))

        return self.core.dialect.run(body)

    def register_definitions(
        self, holder: str, definitions: Sequence[DefinitionSpec]
    ) -> list[DefinitionChange]:
        """See :meth:`Ledger.register_definitions`. With flow control, each type's code
        rate limit is written too (:func:`~ratchet.ledger.ops.ratelimits.
        register_code_limits`: an operator's row wins; the last registration wins)."""
        flow = self.core.schema.has(FLOW)

        def body(tx: Tx) -> list[DefinitionChange]:
            names = sorted({d.name for d in definitions})
            stored = {(r.name, r.version): r.spec
                      for r in DEFINITIONS_OF.all(tx, {"names": names})} if names else {}
            changes: list[DefinitionChange] = []
            audit: list[AuditRow] = []
            for d in sorted(definitions, key=lambda d: (d.name, d.version)):
                old = stored.get((d.name, d.version))
                if old is not None and old != d.spec_json:
                    change = DefinitionChange(d.name, d.version, _spec_differences(
                        old, d.spec_json), old, d.spec_json)
                    changes.append(change)
                    audit.append((f"definition:{d.name}:{d.version}", tx.now,
                                  "definition_changed", None, None, None, holder,
                                  dumps({"name": d.name, "version": d.version,
                                         "differences": list(change.differences),
                                         "old_spec": old, "new_spec": d.spec_json})))
                tx.execute("definition_upsert", {"name": d.name, "version": d.version,
                                                 "spec": d.spec_json, "now": tx.now})
            tx.execute("worker_definitions_clear", {"holder": holder})
            for d in definitions:
                tx.execute("worker_definition_insert",
                           {"holder": holder, "name": d.name, "version": d.version})
            insert_audit(tx, audit)
            if flow:
                register_code_limits(tx, holder, definitions)
            return changes

        return self.core.dialect.run(body)

    def definitions(self, live_within_s: float) -> list[DefinitionRecord]:
        """See :meth:`Ledger.definitions` (none on a ledger not yet migrated to them)."""
        if not self.core.schema.has(DEFINITIONS):
            return []

        def body(tx: Tx) -> list[DefinitionRecord]:
            live = _live(tx, live_within_s)
            return [DefinitionRecord(r.name, r.version, r.spec, r.first_registered_at,
                                     r.last_registered_at, live.get((r.name, r.version), 0))
                    for r in DEFINITIONS_ALL.all(tx)]

        return self.core.dialect.run(body, write=False)

    def worker_definition_specs(self) -> list[tuple[str, str]]:
        """See :meth:`Ledger.worker_definition_specs` (the registry is small)."""
        if not self.core.schema.has(DEFINITIONS):
            return []
        # Kept as read (an undecodable holder stays equal to its registry row's).
        return [(r.holder, r.spec) for r in self.core.dialect.run(
            lambda tx: WORKER_DEFINITION_SPECS.all(tx), write=False)]

    def version_backlog(self, live_within_s: float) -> list[VersionBacklog]:
        """See :meth:`Ledger.version_backlog` (none on a ledger not yet migrated to the
        definition tables: no worker of this release has run on it)."""
        if not self.core.schema.has(DEFINITIONS):
            return []

        def body(tx: Tx) -> list[VersionBacklog]:
            live = _live(tx, live_within_s)
            return sorted(
                (VersionBacklog(r.name, r.version, r.n, r.oldest,
                                live.get((r.name, r.version), 0))
                 for r in READY_BY_VERSION.all(tx)),
                key=lambda b: (b.name, b.version))

        return self.core.dialect.run(body, write=False)


def _live(tx: Tx, live_within_s: float) -> dict[tuple[str, int], int]:
    """Live workers per (name, version): alive and seen within ``live_within_s`` seconds."""
    return {(r.name, r.version): r.n
            for r in LIVE_DEFINITIONS.all(tx, {"since": tx.now - live_within_s})}


def _queues_of(text: str | None) -> tuple[str, ...] | None:
    """A worker's recorded queues (None: every queue, or nothing readable recorded)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
        return None
    return tuple(value)


def _spec_differences(old_json: str, new_json: str) -> tuple[str, ...]:
    """The top-level keys whose values differ between two definition specs (``("spec",)``
    when one of them is not a JSON object)."""
    try:
        old, new = json.loads(old_json), json.loads(new_json)
    except ValueError:
        return ("spec",)
    if not isinstance(old, dict) or not isinstance(new, dict):
        return ("spec",)
    return tuple(sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)))
