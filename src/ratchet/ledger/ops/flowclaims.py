"""Claims under flow control (DESIGN §8, flow control): the ready work a claim walks per
(name, queue) pair it serves (:func:`entries_of`), and the claim of the types that are
fair or rate-limited (:class:`FlowClaims`): their candidates are read and locked, the
engine orders them (round-robin across fairness keys), applies the bulkheads
(:func:`ratchet.ledger.bulkheads.pick`) and the token buckets
(:func:`ratchet.ratelimit.plan_takes`), then claims the ones it takes and moves the
``run_at`` of those whose bucket is empty. The other types keep the one-statement claim
(:mod:`ratchet.ledger.ops.claims`)."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ...ratelimit import BucketState, RateCandidate, plan_takes
from ...serde import loads
from .. import bulkheads
from ..base import MAX_VERSION, ClaimScope
from ..dialect import Tx
from ..rows import (
    CLAIM_CANDIDATES,
    CLAIM_FAIR_CANDIDATES,
    CLAIM_FAIR_KEYS,
    CLAIM_FAIR_UNKEYED,
    CLAIM_IDS,
    RATE_BUCKETS_LOCK,
)
from ..shapes import CandidateRow, ClaimRow, QueuePairRow, RateLimitTypeRow

__all__ = ["DEFAULT_QUEUE", "FAIR_KEYS_PER_CLAIM", "Entry", "FlowClaims", "entries_of",
           "entry_params"]

DEFAULT_QUEUE = "default"
"""The queue every claimed name is walked in, whether or not ``task_queues`` lists it (a
task written by a release without queues is in it)."""

FAIR_UNKEYED_EVERY = 16
"""A fair type's tasks stored without a fairness key (submitted by code that did not declare
the type fair) are looked for by every claim whose keyed tasks left it room, and by one
claim in this many otherwise: that walk passes over the keyed tasks, so its cost grows with
their backlog; one claim in 16 bounds what it adds."""

FAIR_KEYS_PER_CLAIM = 64
"""At most this many fairness keys of one (name, queue) a claim looks at; the next claim
continues after the last key served (round-robin), so every key is reached within
``keys / 64`` claims."""


class Entry(NamedTuple):
    """One walk of a claim: the ready tasks of ``name`` in ``queue`` whose version is
    ``lo`` .. ``hi``."""

    name: str
    queue: str
    lo: int
    hi: int


def entries_of(kinds: Mapping[str, list[Any]], pairs: Iterable[QueuePairRow],
               served: Sequence[str] | None) -> list[Entry]:
    """The walks of a claim of ``kinds`` (:func:`~ratchet.ledger.base.claim_kinds`):
    each kind in each queue its name was ever submitted to (and ``default``), among
    ``served`` (None: every queue). A bare name (every version) covers that name's
    ``(name, version)`` kinds: no two entries overlap (the SQL would rank a task once per
    entry)."""
    queues: dict[str, set[str]] = {}
    for pair in pairs:
        queues.setdefault(pair.name, set()).add(pair.queue)
    allowed = None if served is None else set(served)
    bare = {n for n, lo, hi in zip(kinds["names"], kinds["lo"], kinds["hi"], strict=True)
            if lo == 1 and hi == MAX_VERSION}
    out: list[Entry] = []
    for name, lo, hi in zip(kinds["names"], kinds["lo"], kinds["hi"], strict=True):
        if name in bare and not (lo == 1 and hi == MAX_VERSION):
            continue
        for queue in sorted(queues.get(name, set()) | {DEFAULT_QUEUE}):
            if allowed is None or queue in allowed:
                out.append(Entry(name, queue, lo, hi))
    return list(dict.fromkeys(out))


def entry_params(entries: Sequence[Entry], scope: ClaimScope, now: float,
                 limit: int) -> dict[str, Any]:
    """The claim statements' parameters for ``entries``: the walks (``enames`` /
    ``equeues`` / ``elo`` / ``ehi``, PostgreSQL), the kinds without queues (``names`` /
    ``lo`` / ``hi``, each once, SQLite) and the served queues (``served``, None: all)."""
    kinds = list(dict.fromkeys((e.name, e.lo, e.hi) for e in entries))
    return {
        "now": now, "limit": limit,
        "names": [k[0] for k in kinds], "lo": [k[1] for k in kinds],
        "hi": [k[2] for k in kinds],
        "enames": [e.name for e in entries], "equeues": [e.queue for e in entries],
        "elo": [e.lo for e in entries], "ehi": [e.hi for e in entries],
        "served": None if scope.queues is None else list(scope.queues),
    }


class FlowClaims:
    """The claim of fair and rate-limited types (see the module docstring). Keeps, per
    (name, queue), the fairness key a claim of this engine served last, where the next
    one starts (round-robin per engine; several engines each go round)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._after: dict[tuple[str, str], str | None] = {}
        self._claims = 0

    def claim(
        self, tx: Tx, holder: str, now: float, entries: Sequence[Entry], want: int,
        scope: ClaimScope, rates: Mapping[str, RateLimitTypeRow],
        allowance: bulkheads.Allowance | None,
    ) -> list[ClaimRow]:
        """Claim at most ``want`` tasks of ``entries`` (types that are fair or
        rate-limited), inside the claim's transaction ``tx``.

        Order: per fair entry, round-robin across its fairness keys (each key's first
        task, then each key's second, ...; the keys in order from where the last claim
        stopped), the tasks of other entries by priority and ``run_at``; then the
        bulkheads (``allowance``: the plan of the claim's limits, None: none applies) and
        the token buckets: a task whose bucket is empty is not claimed, spends no attempt
        and waits until its bucket holds a token (``run_at``; ``flow_wait`` ``'rate'``)."""
        fair = [e for e in entries if e.name in scope.fair]
        other = [e for e in entries if e.name not in scope.fair]
        ordered: list[tuple[int, int, float, CandidateRow]] = []
        rotation: dict[tuple[str, str], list[str]] = {}
        if other:
            rows = CLAIM_CANDIDATES.all(tx, entry_params(other, scope, now, want))
            ordered += [(i, -r.priority, r.run_at, r) for i, r in enumerate(rows)]
        for entry in fair:
            ordered += self._fair(tx, now, entry, want, rotation)
        ordered.sort(key=lambda item: item[:3])
        candidates = [item[3] for item in ordered]
        if allowance is not None:
            allowed = set(bulkheads.pick(allowance, [(c.id, c.name, c.tenant)
                                                     for c in candidates]))
            candidates = [c for c in candidates if c.id in allowed]
        take = self._spend(tx, now, candidates, want, rates)
        if not take:
            return []
        claimed = {r.id: r for r in CLAIM_IDS.all(tx, {"ids": take, "holder": holder,
                                                       "now": now})}
        served = {(c.name, c.fair_key) for c in candidates if c.id in claimed}
        with self._lock:
            for (name, queue), keys in rotation.items():
                # The next claim starts after the last key this one served.
                last = [k for k in keys if (name, k) in served]
                if last:
                    self._after[(name, queue)] = last[-1]
                elif keys and len(keys) >= FAIR_KEYS_PER_CLAIM:
                    # Nothing served from this window (its tasks were locked by other
                    # claims, or rate-limited): the next claim looks further on.
                    self._after[(name, queue)] = keys[-1]
        return [claimed[i] for i in take if i in claimed]

    def _fair(self, tx: Tx, now: float, entry: Entry, want: int,
              rotation: dict[tuple[str, str], list[str]],
              ) -> list[tuple[int, int, float, CandidateRow]]:
        """The candidates of one fair entry ranked round-robin: ``(round, position of its
        key after the last one served, run_at, row)``; tasks stored without a fairness key,
        when walked, go first in each round. ``rotation`` receives the entry's keys in the
        order this claim visits them."""
        with self._lock:
            after = self._after.get((entry.name, entry.queue))
        base = {"name": entry.name, "queue": entry.queue, "now": now}
        keys = [r.key for r in CLAIM_FAIR_KEYS.all(
            tx, {**base, "after": after, "limit": FAIR_KEYS_PER_CLAIM})]
        if len(keys) < FAIR_KEYS_PER_CLAIM and after is not None:
            # Round the corner: the keys up to where the last claim stopped.
            keys += [r.key for r in CLAIM_FAIR_KEYS.all(
                tx, {**base, "after": None, "limit": FAIR_KEYS_PER_CLAIM - len(keys)})
                if r.key <= after]
        keys = list(dict.fromkeys(keys))
        rotation[(entry.name, entry.queue)] = keys
        per_key = max(1, math.ceil(want / max(1, len(keys) + 1)))
        walk = {**base, "per_key": per_key, "lo": entry.lo, "hi": entry.hi}
        rows = CLAIM_FAIR_CANDIDATES.all(tx, {**walk, "keys": keys}) if keys else []
        with self._lock:
            self._claims += 1
            due = self._claims % FAIR_UNKEYED_EVERY == 0
        if due or len(rows) < want:
            rows += CLAIM_FAIR_UNKEYED.all(tx, walk)
        position = {k: i for i, k in enumerate(keys)}
        rank: dict[str | None, int] = {}
        out: list[tuple[int, int, float, CandidateRow]] = []
        for r in sorted(rows, key=lambda r: (-r.priority, r.run_at, r.id)):
            rank[r.fair_key] = rank.get(r.fair_key, 0) + 1
            # Tasks without a key, when walked (see FAIR_UNKEYED_EVERY), go first in their
            # round: placed last, a claim of fewer tasks than keys never reached them.
            place = -1 if r.fair_key is None else position.get(r.fair_key, len(keys))
            out.append((rank[r.fair_key], place, r.run_at, r))
        return out

    @staticmethod
    def _spend(tx: Tx, now: float, candidates: Sequence[CandidateRow], want: int,
               rates: Mapping[str, RateLimitTypeRow]) -> list[str]:
        """The ids to claim among ``candidates`` once each took a token of its bucket;
        the buckets' new tokens and the waits of those left without one are written."""
        wanted: list[RateCandidate] = []
        for c in candidates:
            limit = rates.get(c.name)
            wanted.append(RateCandidate(c.id, None if limit is None
                                        else ("type", c.name, _bucket_key(c, limit))))
        buckets = sorted({w.bucket for w in wanted if w.bucket is not None})
        if not buckets:
            return [w.task_id for w in wanted][:want]
        limits = {("type", r.name): (float(r.rate_per_s), int(r.burst)) for r in rates.values()}
        tx.batch("rate_buckets_open", [
            {"scope": s, "name": n, "key": k, "tokens": float(limits[(s, n)][1])}
            for s, n, k in buckets])
        states = {(b.scope, b.name, b.key): BucketState(float(b.tokens), float(b.updated_at))
                  for b in RATE_BUCKETS_LOCK.all(tx, {
                      "scopes": [b[0] for b in buckets], "names": [b[1] for b in buckets],
                      "keys": [b[2] for b in buckets]})}
        plan = plan_takes(wanted, want, now, limits, states)
        tx.batch("rate_buckets_save", [
            {"scope": s, "name": n, "key": k, "tokens": state.tokens, "at": state.at}
            for (s, n, k), state in sorted(plan.buckets.items())])
        tx.batch("rate_defer", [{"id": i, "run_at": at} for i, at in sorted(plan.defer)])
        return plan.take


def _bucket_key(row: CandidateRow, limit: RateLimitTypeRow) -> str:
    """The bucket of ``row`` under ``limit``: the key its code computed at submit, else
    the value of the limit's key parameter in its params (text; ``""`` when absent), else
    the type's one bucket ``""``."""
    if row.rate_key is not None:
        return row.rate_key
    if limit.key_param is None:
        return ""
    try:
        params = loads(row.params)
    except ValueError:
        return ""
    value = params.get(limit.key_param) if isinstance(params, dict) else None
    return "" if value is None else value if isinstance(value, str) else str(value)
