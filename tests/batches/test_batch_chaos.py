"""Chaos over one long ``ctx.batches`` run: 100,000 items in batches of 250, eight batches
in flight, two worker processes at a time, and the one holding the task SIGKILLed at
random moments (at least ten times; a fresh worker replaces each victim). Both ledgers.

The kill moments are random points of the run's progress (a kill waits until the ledger
shows a random 1-4 % more items committed than at the kill before, then a random pause):
with eight batches in flight the victim dies with batches in every phase (reading,
delivering, recording the delivery, committing). Throughout, a sampler reads the run
from the ledger; its watermark and counts never move backwards.

Counted at the counting service (which does not deduplicate keys): every item delivered
exactly once, every batch's request executed once. The ledger's report and
``Control.check`` count 100,000 items.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from batchapp import DELIVER, deliver_key
from batchkit import DONE, BatchRig, WatermarkSampler, WorkerProcess, held_by, wait_for

from ratchet import Control, State

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(240)]

SIGKILLED = -signal.SIGKILL
ITEMS = 100_000
SIZE = 250
PARALLEL = 8
LATENCY_S = 0.2  # mean per delivery: the run lasts long enough for every kill
# How long a delivery can stay in flight at the service: its latency (at most 1.5 times the
# mean) plus the lease check before sending (min(1, lease_s / 2)), and a margin.
IN_FLIGHT_S = 1.5 * LATENCY_S + 1.0 + 0.3
KILLS = 12
MIN_KILLS = 10  # the run may end before the last kills on a slow machine
WORKERS = 2


def test_chaos_every_item_once_and_the_watermark_never_moves_back(rig: BatchRig) -> None:
    seed = int(os.environ.get("BATCH_SEED", random.randrange(1 << 30)))
    print(f"batch chaos seed: {seed} (rerun with BATCH_SEED={seed})")
    rng = random.Random(seed)
    rig.start_service(latency_s=LATENCY_S)
    rig.in_flight_s = IN_FLIGHT_S
    task_id = rig.app.submit(DELIVER, {"n": ITEMS, "size": SIZE,
                                       "parallel": PARALLEL}).task_id
    sampler = WatermarkSampler(rig.reader_url, [task_id]).start()
    workers: list[WorkerProcess] = [rig.worker(f"w{i}-gen0") for i in range(WORKERS)]
    # Kill moments: each a random 1-4 % of the items past the committed count at the kill
    # before (so the kills land before the end, however fast the run goes).
    kills: list[tuple[int, int, str]] = []  # (committed items seen, watermark, victim)
    t0 = time.monotonic()
    committed = 0
    control = Control(rig.reader_url)
    try:
        for k in range(1, KILLS + 1):
            target = committed + rng.randrange(ITEMS // 100, ITEMS * 4 // 100)

            def reached(target: int = target) -> tuple[WorkerProcess | None] | None:
                info = rig.get(task_id)
                if info.state in DONE:
                    return (None,)  # the run ended first
                run = rig.run(task_id)
                if run is None or run.processed < target or info.state is not State.RUNNING:
                    return None
                victim = held_by(workers, info.holder)
                return (victim,) if victim is not None else None

            (victim,) = wait_for(f"{target} items committed by a live holder", reached, 90.0,
                                 0.01)
            if victim is None:
                break
            time.sleep(rng.uniform(0.0, 0.1))  # a random moment, not a wait
            run = rig.run(task_id)
            assert victim.kill() == SIGKILLED
            assert run is not None
            committed = run.processed
            kills.append((run.processed, run.watermark, victim.name))
            i = workers.index(victim)
            workers[i] = rig.worker(f"w{i}-gen{k}")
            # Mid-run, with the victim's batches lost: the counts still add up (what is
            # not committed is in flight).
            midway = control.check(task_id)
            assert midway.ok, midway
        info = rig.wait_state(task_id, timeout_s=120.0)
    finally:
        sampler.stop()
        control.close()
    elapsed = time.monotonic() - t0
    for w in workers:
        assert w.stop() == 0, w.describe()

    assert len(kills) >= MIN_KILLS, kills
    assert sampler.errors == [], sampler.errors[:5]
    assert sampler.backwards == [], f"the run moved backwards: {sampler.backwards[:10]}"
    assert info.state is State.SUCCEEDED, info
    batches = ITEMS // SIZE
    assert info.result == {"name": "items", "items": ITEMS, "succeeded": ITEMS, "failed": 0,
                           "skipped": 0, "batches": batches}
    run = rig.run(task_id)
    assert run is not None
    assert (run.watermark, run.above, run.done, run.processed, run.batches) == (
        ITEMS, (), True, ITEMS, batches)

    # The external side: each item applied once, each batch's request executed once.
    records = rig.records()
    twice = {item: n for item, n in records.items.items() if n != 1}
    assert twice == {}, f"items applied more than once: {sorted(twice.items())[:20]}"
    missing = set(range(ITEMS)) - set(records.items)
    assert not missing, f"{len(missing)} items never applied, e.g. {sorted(missing)[:20]}"
    assert len(records.items) == ITEMS
    assert records.executions == {deliver_key(task_id, p): 1 for p in range(0, ITEMS, SIZE)}

    with Control(rig.reader_url) as control:
        report = control.check(task_id)
    assert report.ok, report
    (line,) = report.lines
    assert (line.expected, line.succeeded, line.failed, line.skipped, line.in_flight,
            line.difference) == (ITEMS, ITEMS, 0, 0, 0, 0)
    rig.check_consistent()

    calls = rig.call_counts(task_id)
    assert set(calls) == set(range(0, ITEMS, SIZE))
    again = sum(n - 1 for n in calls.values())
    stats = rig.ledger.stats()
    print(f"kills={len(kills)} at (committed, watermark) "
          f"{[(c, w) for c, w, _ in kills]}; batches run again={again}; "
          f"samples={sampler.samples}; takeovers={stats.takeovers} "
          f"revocations={stats.revocations} claims={stats.claims}; {elapsed:.1f} s")
