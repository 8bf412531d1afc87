"""Flow control with real worker processes and real signals, on both ledgers, counted at the
external side: every body sends marks to the counting service (tests/flow/flowapp.py),
whose own file holds them in the order it executed them; the assertions read that file.

* per-key order under SIGKILL: 20 accounts x 50 ordered tasks, 4 workers, 3-6 of them
  killed mid-body and restarted; per account the bodies never overlap (a killed body
  holds its account until its re-run ends) and run in submit order;
* a rate limit of 10/s with a burst of 10 over 200 tasks and 4 workers: no second of
  starts holds more than the bucket allows, and waiting for a token costs no attempt;
* fairness: one task of tenant B submitted behind 10,000 of tenant A starts within a few
  claim rounds; without fairness it waits behind A's burst;
* priority: a task at priority 10 submitted behind 5,000 ready ones starts within one
  claim round of the worker;
* queues: a worker serving ``critical`` and one serving ``bulk`` each run only their own.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import defaultdict
from itertools import pairwise

import pytest
from flowkit import FlowRig, Mark, WorkerProcess, wait_for

from ratchet import SubmitRequest

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(600)]

SIGKILLED = -signal.SIGKILL

ACCOUNTS = 20
PER_ACCOUNT = 50
ORDERED_WORKERS = 4


def _open_starts(marks: list[Mark], pid: int) -> set[tuple[str, ...]]:
    """The ``flow.ordered`` bodies of process ``pid`` that started and have not ended."""
    started = {m.fields[1:4] for m in marks if m.kind == "s" and m.fields[4] == str(pid)}
    ended = {m.fields[1:4] for m in marks if m.kind == "e" and m.fields[4] == str(pid)}
    return started - ended


def test_per_key_order_holds_under_sigkill(rig: FlowRig) -> None:
    seed = int(os.environ.get("FLOW_SEED", random.randrange(1 << 30)))
    print(f"flow order chaos seed: {seed} (rerun with FLOW_SEED={seed})")
    rng = random.Random(seed)
    total = ACCOUNTS * PER_ACCOUNT
    t0 = time.monotonic()
    workers: list[WorkerProcess] = [rig.worker(f"w{i}-gen0", concurrency=4, prefetch=2)
                                    for i in range(ORDERED_WORKERS)]
    for w in workers:
        w.holder(60.0)
    # In order per account, interleaved across accounts, while the workers run.
    for n in range(PER_ACCOUNT):
        rig.app.submit_many([SubmitRequest("flow.ordered", {"account": f"a{a:02d}", "n": n})
                             for a in range(ACCOUNTS)])
    kills = rng.randint(3, 6)
    killed: list[tuple[str, int, bool]] = []  # (victim, bodies seen open, took one down)
    for k in range(kills):
        # Spread over the run: a random point of each of `kills` equal parts of 10-85 %.
        target = int(total * (0.10 + 0.75 * (k + rng.random()) / kills))
        wait_for(f"{target} ordered bodies ended", lambda t=target: len(rig.marks("e")) >= t,
                 180.0, 0.05)
        i = rng.randrange(len(workers))
        victim = workers[i]
        # Kill it inside a body when it has one running (most of the time it does).
        try:
            open_now = wait_for(f"{victim.name} inside a body",
                                lambda v=victim: _open_starts(rig.marks(), v.pid), 5.0, 0.005)
        except AssertionError:
            open_now = set()
        assert victim.kill() == SIGKILLED
        still_open = _open_starts(rig.marks(), victim.pid)
        killed.append((victim.name, len(open_now), bool(still_open)))
        workers[i] = rig.worker(f"w{i}-gen{k + 1}", concurrency=4, prefetch=2)
    rig.wait_succeeded("flow.ordered", total, 240.0)
    elapsed = time.monotonic() - t0
    for w in workers:
        assert w.stop() == 0, w.describe()

    marks = rig.marks()
    starts: dict[tuple[str, int], list[Mark]] = defaultdict(list)
    ends: dict[tuple[str, int], list[Mark]] = defaultdict(list)
    for m in marks:
        if m.kind in ("s", "e"):
            (starts if m.kind == "s" else ends)[(m.fields[1], int(m.fields[2]))].append(m)
    assert len(starts) == total and len(ends) == total, (len(starts), len(ends))
    mid_body = 0
    for a in range(ACCOUNTS):
        account = f"a{a:02d}"
        # Each task holds its account from its first start to the end of its last
        # attempt (the highest generation): a killed body's start has no end, and its
        # re-run is the same task.
        spans: list[tuple[int, int, int]] = []  # (first start, final end, n)
        for n in range(PER_ACCOUNT):
            s, e = starts[(account, n)], ends[(account, n)]
            final_gen = max(int(m.fields[3]) for m in e)
            (final,) = [m for m in e if int(m.fields[3]) == final_gen]
            assert all(m.seq < final.seq for m in s), (
                f"{account} n={n} started again after its final end: {s} {final}")
            spans.append((min(m.seq for m in s), final.seq, n))
            gens_started = {m.fields[3] for m in s}
            mid_body += len(gens_started - {m.fields[3] for m in e})
        spans.sort()
        assert [n for _, _, n in spans] == list(range(PER_ACCOUNT)), (
            f"{account}: first starts out of submit order: {[n for _, _, n in spans]}")
        for (_, end, n), (start, _, m) in pairwise(spans):
            assert start > end, (
                f"{account}: n={m} started (mark {start}) before n={n} ended (mark {end})")
    stats = rig.app.ledger.stats()
    print(f"ordered: {total} tasks, kills {killed} (victim, bodies open at the kill, "
          f"a body cut), bodies cut mid-way {mid_body}, revocations {stats.revocations}, "
          f"takeovers {stats.takeovers}; {elapsed:.1f} s [{rig.backend}]")
    assert len(killed) == kills
    assert mid_body >= 1, f"no kill landed inside a body: {killed}"
