"""The outbox as operators see it (DESIGN §6 row 10, §9): :meth:`Ledger.outbox_stats
<ratchet.ledger.base.Ledger.outbox_stats>` and :meth:`Ledger.outbox_messages
<ratchet.ledger.base.Ledger.outbox_messages>`, and the outbox's share of the retention
prune (:func:`prune_outbox_batch`, :func:`count_prunable`).

Cheap on a large outbox: the backlog is counted over the partial index ``outbox_unsent``
and the sent rows over ``outbox_sent``, each up to :data:`COUNT_CAP` rows; the oldest
unsent age reads the head of each of the 32 partitions (32 index probes); the per-topic
and failing figures look at most :data:`SCAN_CAP` unsent rows. Nothing reads the sent
history row by row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ...errors import InvalidArguments
from ...outbox import OUTBOX_PARTITIONS
from ...validation import MAX_KEY_BYTES, check_identifier, check_int
from ..dialect import Tx
from ..records_outbox import OutboxMessage, OutboxRelay, OutboxStats, OutboxTopic
from ..rows import Read
from .core import EngineCore

__all__ = ["COUNT_CAP", "MAX_MESSAGES", "OUTBOX", "SCAN_CAP", "OutboxViews",
           "count_prunable", "prune_outbox_batch"]

OUTBOX = "outbox.sql"
"""The migration of the outbox tables (schema 16)."""

COUNT_CAP = 100_000
"""The most rows the ``unsent`` and ``sent`` counts of :class:`OutboxStats` walk (a range
of their partial index; PostgreSQL may read the sent rows from the table instead when
they are most of it, a walk of at most this many); past it the figure is flagged
capped."""

SCAN_CAP = 100_000
"""The most unsent rows the per-topic and failing figures look at."""

MAX_MESSAGES = 10_000
"""The most messages :meth:`OutboxViews.outbox_messages` returns."""

_FAILURES = 20
"""The failing messages :attr:`OutboxStats.failures` lists."""


class _TopicRow(NamedTuple):
    topic: str
    n: int
    failing: int | None


class _LeaseRow(NamedTuple):
    holder: str
    part: int
    lease_until: float


class _PickRow(NamedTuple):
    id: int
    key: str | None


def _message(row: Iterable[Any]) -> OutboxMessage:
    (id_, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
     last_error) = row
    state = "sent" if sent_at is not None else ("failing" if attempts else "unsent")
    return OutboxMessage(int(id_), message_id, topic, key, int(part), task_id,
                         float(created_at), None if sent_at is None else float(sent_at),
                         sent_by, int(attempts), last_error, state)


_TOPICS = Read.rows("outbox_unsent_topics", _TopicRow._make)
_FAILING = Read.rows("outbox_failures", _message)
_LEASES = Read.rows("outbox_relay_leases", _LeaseRow._make)
_LIST = Read.rows("outbox_list", _message)
_LIST_UNSENT = Read.rows("outbox_list_unsent", _message)
_PICK = Read.rows("outbox_prune_pick", _PickRow._make)


def _scalar(row: tuple[Any, ...] | None) -> Any:
    """The first column of a one-row read, or None."""
    return None if row is None else row[0]


class OutboxViews:
    """The outbox reads of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def outbox_stats(self, top: int = 10) -> OutboxStats:
        """See :meth:`Ledger.outbox_stats` (one read-only transaction).

        Raises:
            InvalidArguments: ``top`` below 0 or above 1000.
            SchemaTooOld: the ledger has no outbox (schema below 16).
        """
        top = check_int(top, "top", minimum=0, maximum=1000)
        self.core.schema.require(OUTBOX, "the outbox's stats")

        def body(tx: Tx) -> OutboxStats:
            now = tx.now
            unsent = int(_scalar(tx.one("outbox_count_unsent", {"cap": COUNT_CAP})) or 0)
            sent = int(_scalar(tx.one("outbox_count_sent", {"cap": COUNT_CAP})) or 0)
            sent_capped = sent >= COUNT_CAP
            if sent_capped:
                estimate = _scalar(tx.one("outbox_sent_estimate", {}))
                sent = max(sent, int(estimate or 0))
            oldest = _scalar(tx.one("outbox_oldest_unsent", {})) if unsent else None
            topics = _TOPICS.all(tx, {"scan": SCAN_CAP}) if unsent else []
            failing = sum(int(t.failing or 0) for t in topics)
            failures = (_FAILING.all(tx, {"scan": SCAN_CAP, "limit": _FAILURES})
                        if failing else [])
            held: dict[str, list[_LeaseRow]] = {}
            for lease in _LEASES.all(tx, {}):
                held.setdefault(lease.holder, []).append(lease)
            # A relay's own row with a negative part is its presence (a live relay that
            # holds no partition yet still counts in the fair share), not a partition.
            relays = [OutboxRelay(holder, tuple(sorted(int(r.part) for r in rows
                                                       if int(r.part) >= 0)),
                                  min((float(r.lease_until) for r in rows
                                       if int(r.part) >= 0),
                                      default=max(float(r.lease_until) for r in rows)))
                      for holder, rows in sorted(held.items())]
            ranked = sorted(topics, key=lambda t: (-int(t.n), t.topic))[:top]
            return OutboxStats(
                unsent=unsent,
                oldest_unsent_age_s=None if oldest is None else max(0.0, now - float(oldest)),
                sent=sent, failing=failing, scanned=sum(int(t.n) for t in topics),
                topics=[OutboxTopic(t.topic, int(t.n), int(t.failing or 0)) for t in ranked],
                failures=failures, relays=relays,
                free_partitions=OUTBOX_PARTITIONS - sum(len(r.partitions) for r in relays),
                ledger_now=now, count_cap=COUNT_CAP, unsent_capped=unsent >= COUNT_CAP,
                sent_capped=sent_capped)

        return self.core.dialect.run(body, write=False)

    def outbox_messages(self, limit: int = 50, unsent_only: bool = False,
                        topic: str | None = None, key: str | None = None,
                        ) -> list[OutboxMessage]:
        """See :meth:`Ledger.outbox_messages` (one read-only transaction).

        Raises:
            InvalidArguments: ``limit`` not in 1..:data:`MAX_MESSAGES`, a topic or key
                that no message can have (empty, too long, a NUL).
            SchemaTooOld: the ledger has no outbox.
        """
        limit = check_int(limit, "limit", minimum=1, maximum=MAX_MESSAGES)
        if not isinstance(unsent_only, bool):
            raise InvalidArguments(f"unsent_only must be a bool, got {unsent_only!r:.40}")
        if topic is not None:
            check_identifier(topic, "topic", MAX_KEY_BYTES)
        if key is not None:
            check_identifier(key, "key", MAX_KEY_BYTES)
        self.core.schema.require(OUTBOX, "the outbox's messages")
        read = _LIST_UNSENT if unsent_only else _LIST
        params = {"limit": limit, "topic": topic, "key": key}
        return self.core.dialect.run(lambda tx: read.all(tx, params), write=False)


def count_prunable(tx: Tx, cutoff: float) -> int:
    """Sent outbox rows a prune at ``cutoff`` (ledger clock, epoch seconds) would delete
    (a range of ``outbox_sent``)."""
    return int(_scalar(tx.one("outbox_prune_count", {"cutoff": cutoff})) or 0)


def prune_outbox_batch(tx: Tx, cutoff: float, limit: int) -> tuple[int, int]:
    """One batch of the outbox's retention in ``tx``: delete up to ``limit`` sent rows
    whose ``sent_at`` is before ``cutoff``, the oldest sent first (never an unsent row,
    whatever its age), and the ``outbox_keys`` lock rows of their keys (an emit upserts
    its key's row again; one an emit holds now is skipped on PostgreSQL). Returns
    ``(rows picked, rows deleted)``."""
    picked = _PICK.all(tx, {"cutoff": cutoff, "limit": limit})
    if not picked:
        return 0, 0
    gone = tx.execute("outbox_prune_rows", {"ids": [int(r.id) for r in picked]})
    keys = sorted({r.key for r in picked if r.key is not None})
    if keys:
        tx.execute("outbox_prune_keys", {"keys": keys})
    return len(picked), gone
