"""Retry budgets of one commit: counting calls and admitting retries (DESIGN §7).

:class:`BudgetBook` is the window rule over 1 s buckets of the ledger clock. It is pure
arithmetic over the bucket counts it is given (:meth:`BudgetBook.load`) and the clock it
is handed (``now``, epoch seconds, the commit transaction's ledger clock): a test drives it
with any clock, without waiting on seconds (tests/test_budget_window.py); the engine reads
and writes the counts in the commit's transaction (``budget_lock``, ``budget_window``,
``budget_bump``, ``budget_prune``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from ..outcome import AttemptFacts, Happened, decide
from ..states import State
from .base import BudgetUse, TaskWrite, Transition
from .dialect import Tx
from .shapes import BudgetCountRow

__all__ = ["BUDGET_KEEP_S", "BudgetBook"]


BUDGET_KEEP_S = 3600
"""Buckets of a budget older than this many seconds are deleted when the budget is next
charged with a retry (the window is at most 300 s)."""


class BudgetBook:
    """The retry budgets of one commit (DESIGN §7): counts calls and admits retries.

    Counts live in ``budget_counts`` rows of 1 s buckets per (budget, bucket, holder): a
    worker's commits only ever update rows of their own holder, so commits of different
    workers never wait on each other for the counts. Admitting a retry reads the budget's
    window under a per-budget lock (PostgreSQL: a transaction advisory lock, taken in key
    order after the fence's row locks; SQLite: the write lock), so two workers never grant
    the same room. A retry is reserved in the bucket where it will start: the first second
    at or after its backoff where every window of ``window_s`` seconds containing it stays
    within ``min_per_s * window_s + ratio * calls`` (at least 1), ``calls`` being the last
    window's. The task waits until then (its ``run_at``), with the reason in the audit.
    """

    def __init__(self, writes: Sequence[TaskWrite]) -> None:
        self.keys = sorted({u.key for w in writes if w.transition is not None
                            and w.transition.to is State.RETRY_WAIT
                            for u in w.transition.budgets if u.retry})
        self.locked = bool(self.keys)
        self.calls: dict[str, dict[int, int]] = {}
        self.retries: dict[str, dict[int, int]] = {}
        self.bumps: dict[tuple[str, int, str], list[int]] = {}

    def reads(self) -> list[tuple[str, dict[str, Any]]]:
        """The reads to send with the fence read: lock, then window (if any retry)."""
        if not self.keys:
            return []
        return [("budget_lock", {"keys": self.keys}),
                ("budget_window", {"keys": self.keys})]

    def load(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """The summed ``(budget, bucket, calls, retries)`` rows of the locked budgets."""
        for key in self.keys:
            self.calls.setdefault(key, {})
            self.retries.setdefault(key, {})
        for row in map(BudgetCountRow._make, rows):
            self.calls[row.budget][int(row.bucket)] = int(row.calls or 0)
            self.retries[row.budget][int(row.bucket)] = int(row.retries or 0)

    def _bump(self, key: str, bucket: int, holder: str, calls: int, retries: int) -> None:
        entry = self.bumps.setdefault((key, bucket, holder), [0, 0])
        entry[0] += calls
        entry[1] += retries
        if key in self.calls:
            by = self.calls[key]
            by[bucket] = by.get(bucket, 0) + calls
            rb = self.retries[key]
            rb[bucket] = rb.get(bucket, 0) + retries

    @staticmethod
    def _room(use: BudgetUse, calls: dict[int, int], retries: dict[int, int],
              now_bucket: int, start: int) -> tuple[int, float, int]:
        """``(first bucket >= start with room, allowed retries in the window at now, used
        in it)``.

        A retry in bucket b lies in the windows ending at b .. b + n - 1. A window ending at
        e allows ``min_per_s * window_s + ratio * calls`` retries (at least 1), ``calls``
        counting only calls already made in it: future seconds have none yet, so a retry
        pushed past the current window gets the ``min_per_s`` share alone, and the bound
        holds whatever the traffic does later. Past the last reservation every window is
        empty, so the scan ends."""
        n = max(1, math.ceil(use.window_s))
        floor_ = use.min_per_s * use.window_s

        def allowed_in(window_calls: int) -> float:
            return max(1.0, floor_ + use.ratio * window_calls)

        recent = sum(calls.get(b, 0) for b in range(now_bucket - n + 1, now_bucket + 1))
        used_now = sum(retries.get(b, 0) for b in range(now_bucket - n + 1, now_bucket + 1))
        last = max([start, *retries]) + n
        window = sum(retries.get(b, 0) for b in range(start - n + 1, start + 1))
        window_calls = sum(calls.get(b, 0) for b in range(start - n + 1, start + 1))
        bucket = start
        for end in range(start, last + 1):
            if end > start:
                window += retries.get(end, 0) - retries.get(end - n, 0)
                window_calls += calls.get(end, 0) - calls.get(end - n, 0)
            if window + 1 > allowed_in(window_calls) and end >= bucket:
                bucket = end + 1  # every bucket up to `end` is in this full window
            elif end >= bucket + n - 1:
                break  # the n windows holding `bucket` all have room
        return bucket, allowed_in(recent), used_now

    def charge(self, holder: str, t: Transition, now: float) -> Transition:
        """Count ``t``'s calls; admit its retry: the first second with room is reserved,
        and the outcome table (:func:`ratchet.outcome.decide`) moves ``run_at`` there when
        it is later than the backoff's."""
        now_bucket = math.floor(now)
        for use in t.budgets:
            if use.calls:
                self._bump(use.key, now_bucket, holder, use.calls, 0)
        uses = [u for u in t.budgets if u.retry and t.to is State.RETRY_WAIT]
        if not uses:
            return t
        ready = now + max(0.0, t.delay_s)
        start = math.floor(ready)
        notes: dict[str, tuple[float, int]] = {}
        while True:  # the first second every budget has room in
            found = start
            for use in uses:
                bucket, allowed, used = self._room(
                    use, self.calls[use.key], self.retries[use.key], now_bucket, start)
                notes[use.key] = (allowed, used)
                found = max(found, bucket)
            if found == start:
                break
            start = found
        for use in uses:
            self._bump(use.key, start, holder, 0, 1)
        # Whether the retry waits longer is the outcome table's (its budget rule).
        ending = decide(AttemptFacts(Happened.ASKED, now=now, proposed=t.to,
                                     error_class=t.error_class, delay_s=max(0.0, t.delay_s),
                                     budget_at=float(start)))
        if "budget_wait" not in ending.rules or ending.run_at is None:
            return t
        wait = ending.run_at - ready
        spent = ", ".join(f"{k} ({used} of {allowed:g} retries in the window)"
                          for k, (allowed, used) in notes.items())
        reason = f"retry budget spent: {spent}; waits {wait:.1f} s more"
        return dataclasses.replace(t, delay_s=t.delay_s + wait,
                                   reason=f"{t.reason}; {reason}" if t.reason else reason)

    def flush(self, tx: Tx, now: float) -> None:
        """Write the counted calls and reserved retries (and prune old buckets)."""
        if self.bumps:
            tx.batch("budget_bump", [
                {"budget": k, "bucket": b, "holder": h, "calls": c, "retries": r}
                for (k, b, h), (c, r) in sorted(self.bumps.items())])
        if self.keys:
            tx.execute("budget_prune", {"keys": self.keys,
                                        "before": math.floor(now) - BUDGET_KEEP_S})
