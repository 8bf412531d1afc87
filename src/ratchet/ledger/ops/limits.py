"""Concurrency limits (bulkheads, DESIGN §8): the operator's ``limits`` rows and the slot
usage ``ratchet limits`` shows. The claim-time arithmetic is :mod:`ratchet.ledger.bulkheads`."""

from __future__ import annotations

from ...errors import InvalidArguments
from ...serde import dumps
from ...validation import check_int
from ..base import AuditEvent, Limit, LimitScope, SlotUsage
from ..dialect import Tx
from ..rows import (
    LIMIT_DELETE,
    LIMIT_UPSERT,
    LIMITS_ALL,
    LIMITS_AUDIT,
    LIMITS_LOCK,
    LIMITS_RUNNING,
    SLOT_READY,
    decode_detail,
    insert_audit,
)
from ..shapes import LimitRow
from .core import EngineCore

__all__ = ["MAX_LIMIT", "Limits", "limit_record"]

MAX_LIMIT = 2**31 - 1
"""The largest ``reserved`` / ``maximum`` of a concurrency limit (PostgreSQL ``integer``)."""


def limit_record(row: LimitRow) -> Limit:
    """A :class:`Limit` from a ``limits`` row."""
    return Limit(LimitScope(row.scope), row.name, int(row.reserved),
                 None if row.maximum is None else int(row.maximum), int(row.version),
                 float(row.updated_at), row.updated_by, row.reason)


class Limits:
    """The limit operations of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def limits(self) -> list[Limit]:
        """See :meth:`Ledger.limits`."""
        rows = self.core.dialect.run(lambda tx: LIMITS_ALL.all(tx), write=False)
        return [limit_record(r) for r in rows]

    def set_limit(
        self, scope: LimitScope, name: str, reserved: int, maximum: int | None,
        operator: str, reason: str,
    ) -> Limit:
        """See :meth:`Ledger.set_limit`. Checked on its own (``reserved <= maximum``,
        ``maximum >= 1``, ...) and against the other rows in the same transaction, under
        the total's claim lock (``*``, so two sets never race): with a total, the
        reservations of the types, and those of the tenants, add up to at most the total.
        Audited as ``limit_set`` (task id ``limit:SCOPE[:NAME]``) with the old and new
        values. A claim already in flight finishes under the limits it read; tasks running
        above a lowered cap are not stopped (no preemption)."""
        scope = LimitScope(scope)
        _check_limit(scope, name, reserved, maximum)

        def body(tx: Tx) -> Limit:
            [_, rows] = tx.rows_many([LIMITS_LOCK.sent({"scopes": ["*"]}), LIMITS_ALL.sent()])
            current = {(lim.scope, lim.name): lim
                       for lim in map(limit_record, LIMITS_ALL.of(rows))}
            old = current.get((scope, name))
            current[(scope, name)] = Limit(scope, name, reserved, maximum, 0, 0.0, "", "")
            _check_reservations(current)
            row = LIMIT_UPSERT.first(tx, {
                "scope": scope.value, "name": name, "reserved": reserved,
                "maximum": maximum, "now": tx.now, "operator": operator, "reason": reason})
            assert row is not None
            new = limit_record(row)
            insert_audit(tx, [(_limit_audit_id(scope, name), tx.now, "limit_set", None, None,
                               None, None, dumps({
                                   "operator": operator, "reason": reason,
                                   "scope": scope.value, "name": name, "reserved": reserved,
                                   "maximum": maximum, "version": new.version,
                                   "previous": None if old is None else
                                   {"reserved": old.reserved, "maximum": old.maximum}}))])
            return new

        return self.core.dialect.run(body)

    def clear_limit(self, scope: LimitScope, name: str, operator: str, reason: str) -> Limit:
        """See :meth:`Ledger.clear_limit`. Audited as ``limit_cleared``. Clearing the total
        while reservations remain is allowed (they then have no effect)."""
        scope = LimitScope(scope)

        def body(tx: Tx) -> Limit:
            row = LIMIT_DELETE.first(tx, {"scope": scope.value, "name": name})
            if row is None:
                raise InvalidArguments(
                    f"no {scope.value} limit {name!r} to clear" if name else
                    f"no {scope.value} limit to clear")
            old = limit_record(row)
            insert_audit(tx, [(_limit_audit_id(scope, name), tx.now, "limit_cleared", None,
                               None, None, None, dumps({
                                   "operator": operator, "reason": reason,
                                   "scope": scope.value, "name": name,
                                   "previous": {"reserved": old.reserved,
                                                "maximum": old.maximum}}))])
            return old

        return self.core.dialect.run(body)

    def limit_changes(self, limit: int = 20) -> list[AuditEvent]:
        """See :meth:`Ledger.limit_changes`."""
        rows = self.core.dialect.run(lambda tx: LIMITS_AUDIT.all(tx, {"limit": limit}),
                                     write=False)
        return [AuditEvent(r.seq, r.task_id, r.at, r.kind, r.from_state, r.to_state,
                           r.generation, r.holder, decode_detail(r.detail)) for r in rows]

    def slot_usage(self) -> SlotUsage:
        """See :meth:`Ledger.slot_usage` (one read transaction)."""

        def body(tx: Tx) -> SlotUsage:
            running = {(r.name, r.tenant): int(r.n) for r in LIMITS_RUNNING.all(tx)}
            ready_rows = SLOT_READY.all(tx, {"now": tx.now})
            return SlotUsage(running, {(r.name, r.tenant): int(r.n) for r in ready_rows},
                             {(r.name, r.tenant): float(r.oldest) for r in ready_rows}, tx.now)

        return self.core.dialect.run(body, write=False)


def _limit_audit_id(scope: LimitScope, name: str) -> str:
    """The ``task_id`` of a limit's audit rows (``limit:type:NAME``; ``ratchet limits``
    lists them)."""
    return f"limit:{scope.value}:{name}" if name else f"limit:{scope.value}"


def _check_limit(scope: LimitScope, name: str, reserved: int, maximum: int | None) -> None:
    """Refuse a limit that cannot be right on its own (InvalidArguments)."""
    if scope is LimitScope.TOTAL:
        if name:
            raise InvalidArguments("the total limit has no name")
        if maximum is None:
            raise InvalidArguments("the total limit needs a maximum (the number of slots)")
        if reserved:
            raise InvalidArguments("the total limit reserves nothing (reserve per type or "
                                   "tenant)")
    elif not name:
        raise InvalidArguments(f"a {scope.value} limit needs the {scope.value}'s name")
    # Both are stored as 32-bit integers (MAX_LIMIT).
    check_int(reserved, "reserved", minimum=0, maximum=MAX_LIMIT)
    if maximum == 0 and not isinstance(maximum, bool):
        # A type is stopped by pausing it, not by a limit of no slots: say so.
        raise InvalidArguments("maximum must be an integer from 1 to "
                               f"{MAX_LIMIT}, got 0 (to stop a type, pause it)")
    if maximum is not None:
        check_int(maximum, "maximum", minimum=1, maximum=MAX_LIMIT)
    if maximum is not None and reserved > maximum:
        raise InvalidArguments(f"reserved ({reserved}) exceeds maximum ({maximum})")
    if maximum is None and not reserved and scope is not LimitScope.TOTAL:
        raise InvalidArguments("a limit needs reserved > 0 or a maximum (to remove one, "
                               "clear it)")


def _check_reservations(limits: dict[tuple[LimitScope, str], Limit]) -> None:
    """With a total, the reservations of the types, and those of the tenants, add up to
    at most the total (InvalidArguments)."""
    total = limits.get((LimitScope.TOTAL, ""))
    if total is None or total.maximum is None:
        return
    for scope in (LimitScope.TYPE, LimitScope.TENANT):
        reserved = sum(lim.reserved for lim in limits.values() if lim.scope is scope)
        if reserved > total.maximum:
            raise InvalidArguments(
                f"the {scope.value} reservations would add up to {reserved}, more than the "
                f"total of {total.maximum} slots")
