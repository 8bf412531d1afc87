"""The records of the outbox as operators see it (DESIGN §6 row 10, §9): its backlog, the
relays holding its partitions, the messages that fail, and a list of messages."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["OutboxMessage", "OutboxRelay", "OutboxStats", "OutboxTopic"]


@dataclass(frozen=True, slots=True)
class OutboxTopic:
    """Unsent messages of one topic (:attr:`OutboxStats.topics`).

    Attributes:
        topic: the routing key / subject.
        unsent: its unsent messages (among those :attr:`OutboxStats.scanned`).
        failing: those of them a relay failed to publish at least once (``attempts > 0``).
    """

    topic: str
    unsent: int
    failing: int = 0


@dataclass(frozen=True, slots=True)
class OutboxRelay:
    """One relay holding outbox partitions now (an unexpired lease).

    Attributes:
        holder: the relay's identity (``ratchet relay`` prints it).
        partitions: the partitions it holds, ascending.
        lease_until: the earliest end of its leases, ledger clock, epoch seconds (it
            renews them well before; one past it means the relay stopped renewing).
    """

    holder: str
    partitions: tuple[int, ...]
    lease_until: float


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One outbox row, without its payload (:meth:`Ledger.outbox_messages`).

    Attributes:
        id: the outbox order (per key, the commit order).
        message_id: the id consumers deduplicate by.
        topic: the routing key / subject; key: the ordering key, or None.
        part: its partition.
        task_id: the task that emitted it, or None (``App.emit``).
        created_at: when it was written, ledger clock, epoch seconds.
        sent_at: when a relay marked it sent (the broker confirmed), or None: unsent.
        sent_by: the relay that did.
        attempts: failed publish attempts recorded by relays; last_error: the last one's
            error text.
        state: ``"sent"``, ``"failing"`` (unsent, ``attempts > 0``) or ``"unsent"``.
    """

    id: int
    message_id: str
    topic: str
    key: str | None
    part: int
    task_id: str | None
    created_at: float
    sent_at: float | None
    sent_by: str | None
    attempts: int
    last_error: str | None
    state: str


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """The outbox at a glance (:meth:`Ledger.outbox_stats`; ``ratchet status``, the
    ``ratchet_outbox_*`` metrics, ``GET /api/outbox``). Every figure is read from the
    partial indexes (``outbox_unsent``, ``outbox_sent``) and the 32 lease rows, never
    by a scan of the sent history.

    Attributes:
        unsent: messages written and not yet confirmed by the broker (exact up to
            :attr:`count_cap`; at the cap, ``unsent_capped`` is true and the backlog is
            at least that).
        oldest_unsent_age_s: seconds (ledger clock) since the oldest message at the
            head of a partition was written, None when nothing is unsent; the figure to
            alert on (a relay down, a broker refusing).
        sent: sent messages still kept (pruned with the retention age): exact up to
            :attr:`count_cap`; past it ``sent_capped`` is true and, on PostgreSQL, it is
            the planner's estimate of the ``outbox_sent`` index's rows (the last
            ``ANALYZE``; at least the cap).
        failing: unsent messages a relay failed to publish at least once (among those
            scanned).
        scanned: the unsent messages the per-topic and failing figures were counted
            over: all of them unless the backlog is over the scan cap.
        topics: unsent messages per topic, the largest first, at most the ``top`` asked.
        failures: unsent messages with ``attempts > 0`` and their last error, oldest first
            (a few: the ones blocking their partitions).
        relays: the relays holding partitions with an unexpired lease, by holder.
        free_partitions: partitions no relay holds now (of
            :data:`~ratchet.outbox.OUTBOX_PARTITIONS`): their messages wait for a relay.
        ledger_now: the ledger clock at the read, epoch seconds.
        count_cap: the cap of the ``unsent`` and ``sent`` counts.
    """

    unsent: int = 0
    oldest_unsent_age_s: float | None = None
    sent: int = 0
    failing: int = 0
    scanned: int = 0
    topics: list[OutboxTopic] = field(default_factory=list)
    failures: list[OutboxMessage] = field(default_factory=list)
    relays: list[OutboxRelay] = field(default_factory=list)
    free_partitions: int = 0
    ledger_now: float = 0.0
    count_cap: int = 0
    unsent_capped: bool = False
    sent_capped: bool = False
