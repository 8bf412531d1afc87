"""The records of the outbox's relay side (DESIGN §6.2): the partition leases a relay holds
and the unsent rows it publishes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OutboxRow", "PartLease"]


@dataclass(frozen=True, slots=True)
class PartLease:
    """One outbox partition held by a relay (:meth:`Ledger.outbox_lease`).

    Attributes:
        part: the partition, ``0 <= part < OUTBOX_PARTITIONS``.
        generation: the fencing token of this holding: every take bumps it; a mark sent
            with an older one changes nothing.
        lease_until: when the lease ends unless renewed, ledger clock, epoch seconds.
        now: the ledger clock of the call that returned it, epoch seconds (so the holder
            knows how long it has left: ``lease_until - now`` seconds).
    """

    part: int
    generation: int
    lease_until: float
    now: float


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One unsent outbox message (:meth:`Ledger.outbox_fetch`).

    Attributes:
        id: the outbox order (per key, commit order).
        message_id: the id consumers deduplicate by.
        topic: the routing key / subject.
        key: the ordering key, or None.
        part: its partition.
        payload: the message, JSON text.
        headers: extra headers, a JSON object as text, or None.
        task_id: the task that emitted it, or None.
        created_at: when its transaction wrote it, ledger clock, epoch seconds.
        attempts: failed publishes so far.
    """

    id: int
    message_id: str
    topic: str
    key: str | None
    part: int
    payload: str
    headers: str | None
    task_id: str | None
    created_at: float
    attempts: int
