"""Per-key backoff of a relay (DESIGN §6.2; no I/O): a message the broker refused holds back
its key (or, without a key, itself) for a while, and only that key.

After a refusal the key waits ``first_s * 2 ** attempts`` seconds (``attempts``: the failed
publishes the message had before this one, so a restarted relay continues the sequence),
at most ``max_s``, jittered by ±20 %. While it waits, the relay's fetch leaves the key out
(``skip_keys`` / ``skip_ids`` of :meth:`~ratchet.ledger.base.Ledger.outbox_fetch`), so
other keys fill the batches. When the wait is over the key is *on probation*: only its
head message is published, alone of its key in the batch, until the broker confirms it;
then the key is published normally again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ..ledger.base import OutboxRow

__all__ = ["FIRST_S", "MAX_S", "KeyHolds", "hold_name"]

FIRST_S = 0.5
"""The first wait after a refusal, seconds."""
MAX_S = 60.0
"""The longest wait, seconds."""


def hold_name(row: OutboxRow) -> str:
    """What a refusal of ``row`` holds back: ``k:<key>``, or ``m:<outbox id>`` for a message
    without a key."""
    return f"k:{row.key}" if row.key is not None else f"m:{row.id}"


@dataclass(slots=True)
class _Hold:
    part: int
    until: float  # monotonic seconds
    key: str | None
    row_id: int


class KeyHolds:
    """The keys (and keyless messages) a relay backs off from.

    Args:
        first_s: the first wait, seconds.
        max_s: the longest wait, seconds.
        rng: uniform ``[0, 1)`` numbers for the jitter.
    """

    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S,
                 rng: Callable[[], float] = random.random) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._rng = rng
        self._holds: dict[str, _Hold] = {}

    def __len__(self) -> int:
        return len(self._holds)

    def skips(self, now: float) -> tuple[list[str], list[int]]:
        """The keys and the keyless outbox ids still waiting at ``now`` (monotonic s)."""
        keys = [h.key for h in self._holds.values() if h.until > now and h.key is not None]
        ids = [h.row_id for h in self._holds.values() if h.until > now and h.key is None]
        return keys, ids

    def next_end(self, now: float) -> float | None:
        """Seconds until the first wait still running at ``now`` ends (None: none)."""
        ends = [h.until - now for h in self._holds.values() if h.until > now]
        return min(ends) if ends else None

    def keep_parts(self, parts: Collection[int]) -> None:
        """Forget the holds of partitions not held any more (another relay owns them)."""
        for name in [n for n, h in self._holds.items() if h.part not in parts]:
            del self._holds[name]

    def trim(self, rows: Sequence[OutboxRow]) -> list[OutboxRow]:
        """``rows`` (a fetched batch, id order) with a key on probation cut to its head:
        a key with a hold whose wait is over, or whose head failed before
        (``attempts > 0``, e.g. under a relay that stopped since)."""
        out: list[OutboxRow] = []
        probing: set[str] = set()
        for row in rows:
            name = hold_name(row)
            if row.key is not None and name in probing:
                continue
            if name in self._holds or row.attempts > 0:
                probing.add(name)
            out.append(row)
        return out

    def refused(self, row: OutboxRow, now: float) -> float:
        """Hold back ``row``'s key after its refusal at ``now``; returns the wait, s."""
        wait = min(self.max_s, self.first_s * 2.0 ** min(row.attempts, 30))
        wait *= 0.8 + 0.4 * self._rng()
        self._holds[hold_name(row)] = _Hold(row.part, now + wait, row.key, row.id)
        return wait

    def confirmed(self, row: OutboxRow) -> None:
        """``row`` was confirmed: its key is published normally again."""
        self._holds.pop(hold_name(row), None)
