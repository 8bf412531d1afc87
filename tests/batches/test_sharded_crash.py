"""Sharded jobs (DESIGN §8, logical shards) under worker SIGKILLs, with real processes:
a job of eight shards, each running ``ctx.batches`` over the items it owns
(``ctx.shard.owns``), two workers at a time and the holders of running shards killed at
random points of the job's progress. Totals are conserved: the job's result totals equal
the item count, the real ``ratchet check JOB_ID`` exits 0, and every item was applied once
at the counting service. A job whose shard fails permanently does not add up:
``ratchet check`` exits 1 and prints the difference. Both ledgers.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections import Counter

import pytest
from batchapp import SHARD, deliver_key
from batchkit import DONE, BatchRig, WatermarkSampler, WorkerProcess, held_by, wait_for

from ratchet import Control, State
from ratchet.shards import shard_of

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

SIGKILLED = -signal.SIGKILL
SHARDS = 8
ITEMS = 40_000
SIZE = 200
LATENCY_S = 0.1
IN_FLIGHT_S = 1.5 * LATENCY_S + 1.0 + 0.3  # see test_batch_chaos.py
KILLS = 6
MIN_KILLS = 4  # the job may end before the last kills on a slow machine


def _check_cli(rig: BatchRig, task_id: str) -> subprocess.CompletedProcess[str] | None:
    """``ratchet check TASK_ID`` run as a subprocess; None when this revision's command
    line has no ``check`` command yet (the caller then skips, after its other checks)."""
    out = rig.cli("check", task_id)
    if out.returncode == 2 and "No such command" in out.stdout + out.stderr:
        return None
    return out


def _owned(shard: int) -> list[int]:
    return [i for i in range(ITEMS) if shard_of(str(i), SHARDS) == shard]


@pytest.mark.slow
def test_sharded_job_conserves_its_totals_under_kills(rig: BatchRig) -> None:
    seed = int(os.environ.get("BATCH_SEED", random.randrange(1 << 30)))
    print(f"sharded chaos seed: {seed} (rerun with BATCH_SEED={seed})")
    rng = random.Random(seed)
    rig.start_service(latency_s=LATENCY_S)
    rig.in_flight_s = IN_FLIGHT_S
    job = rig.app.submit_sharded(SHARD, {"n": ITEMS, "size": SIZE, "parallel": 2},
                                 shards=SHARDS).task_id
    workers: list[WorkerProcess] = [rig.worker(f"w{i}-gen0", concurrency=5) for i in range(2)]

    def shards_ids() -> list[str] | None:
        ids = [c.task_id for c in rig.ledger.children(job)]
        return ids if len(ids) == SHARDS else None

    shard_ids = wait_for("the job to submit its shards", shards_ids, 60.0)
    sampler = WatermarkSampler(rig.reader_url, shard_ids).start()

    def committed_now() -> int:
        return sum(run.processed for run in rig.ledger.batch_runs(shard_ids))

    # Kill moments: each a random 1-5 % of the items past the committed count at the kill
    # before (so the kills land before the end, however fast the job goes).
    kills: list[tuple[int, str, int]] = []  # (committed items, victim, shards it held)
    committed = 0
    control = Control(rig.reader_url)
    try:
        for k in range(1, KILLS + 1):
            target = committed + rng.randrange(ITEMS // 100, ITEMS * 5 // 100)

            def reached(target: int = target) -> tuple[WorkerProcess | None, int] | None:
                infos = rig.ledger.get_many(shard_ids)
                if all(i.state in DONE for i in infos):
                    return (None, 0)  # the job's shards ended first
                if committed_now() < target:
                    return None
                held: dict[int, tuple[WorkerProcess, int]] = {}
                for info in infos:
                    worker = held_by(workers, info.holder) if info.state is State.RUNNING \
                        else None
                    if worker is not None:
                        held[worker.pid] = (worker, held.get(worker.pid, (worker, 0))[1] + 1)
                return rng.choice(sorted(held.values(), key=lambda h: h[0].pid)) \
                    if held else None

            victim, held = wait_for(f"{target} items committed, a shard held", reached,
                                    90.0, 0.01)
            if victim is None:
                break
            time.sleep(rng.uniform(0.0, 0.1))  # a random moment, not a wait
            committed = committed_now()
            assert victim.kill() == SIGKILLED
            kills.append((committed, victim.name, held))
            i = workers.index(victim)
            workers[i] = rig.worker(f"w{i}-gen{k}", concurrency=5)
            midway = control.check(job)  # mid-job the counts add up too
            assert midway.ok, midway
        info = rig.wait_state(job, timeout_s=120.0)
    finally:
        sampler.stop()
        control.close()
    for w in workers:
        assert w.stop() == 0, w.describe()

    assert len(kills) >= MIN_KILLS, kills
    assert sampler.errors == [] and sampler.backwards == [], (sampler.errors[:5],
                                                              sampler.backwards[:10])
    assert info.state is State.SUCCEEDED, info
    assert info.result["shards"] == SHARDS
    totals = info.result["totals"]
    assert (totals["items"], totals["succeeded"], totals["failed"], totals["skipped"]) == (
        ITEMS, ITEMS, 0, 0)
    # Each shard processed exactly the items it owns, counted once.
    children = {c.params["ratchet:shard"]["index"]: c for c in rig.ledger.children(job)}
    assert sorted(children) == list(range(SHARDS))
    for index, child in children.items():
        assert child.state is State.SUCCEEDED, child
        assert child.result["items"] == len(_owned(index)), (index, child.result)

    records = rig.records()
    twice = {item: n for item, n in records.items.items() if n != 1}
    assert twice == {}, f"items applied more than once: {sorted(twice.items())[:20]}"
    assert set(records.items) == set(range(ITEMS)), "items never applied"
    expected_keys = {deliver_key(f"shard{s}", p): 1 for s in range(SHARDS)
                     for p in range(0, len(_owned(s)), SIZE)}
    assert records.executions == expected_keys

    with Control(rig.reader_url) as control:
        report = control.check(job)
    assert report.ok, report
    assert report.shards == SHARDS and len(report.lines) == SHARDS + 1
    line = report.lines[-1]
    assert (line.scope, line.expected, line.succeeded, line.difference) == (
        "job", ITEMS, ITEMS, 0)
    rig.check_consistent()
    calls = Counter((c.task, c.pos) for c in rig.calls())
    again = sum(n - 1 for n in calls.values())
    print(f"kills (committed, victim, shards held)={kills}; batches run again={again}")

    out = _check_cli(rig, job)
    if out is None:
        pytest.skip("this revision's command line has no `ratchet check`: the job's "
                    "conservation was checked through Control.check only")
    assert out.returncode == 0, (out.stdout, out.stderr)


def test_a_failed_shard_leaves_a_difference_that_ratchet_check_reports(
        rig: BatchRig) -> None:
    """Shard 2 of 4 fails permanently in its third batch (two committed before it): the
    job fails, and the check finds the shard's unprocessed items missing."""
    shards, n, size = 4, 2_000, 50
    rig.start_service()
    job = rig.app.submit_sharded(SHARD, {"n": n, "size": size, "parallel": 1,
                                         "fail_shard": 2, "fail_at": 2 * size},
                                 shards=shards).task_id
    w = rig.worker("w", concurrency=5)
    info = rig.wait_state(job)
    assert w.stop() == 0
    assert info.state is State.FAILED, info
    owned = {s: [i for i in range(n) if shard_of(str(i), shards) == s] for s in range(shards)}
    children = {c.params["ratchet:shard"]["index"]: c for c in rig.ledger.children(job)}
    assert children[2].state is State.FAILED, children[2]
    missing = len(owned[2]) - 2 * size
    # The external side: every item but the failed shard's unprocessed ones, once.
    applied = set(range(n)) - set(owned[2][2 * size:])
    assert rig.records().items == dict.fromkeys(applied, 1)

    with Control(rig.reader_url) as control:
        report = control.check(job)
    assert not report.ok, report
    bad = [x for x in report.lines if not x.ok]
    assert [x.scope for x in bad] == ["shard 2/4 run mine", "job"], report.lines
    assert (bad[0].expected, bad[0].succeeded, bad[0].in_flight, bad[0].difference) == (
        len(owned[2]), 2 * size, 0, missing)
    assert bad[1].difference == missing and bad[1].expected == n
    assert f"{missing} of {len(owned[2])} items never processed" in bad[0].note

    out = _check_cli(rig, job)
    if out is None:
        pytest.skip("this revision's command line has no `ratchet check`: the job's "
                    "conservation was checked through Control.check only")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert str(missing) in out.stdout, out.stdout
