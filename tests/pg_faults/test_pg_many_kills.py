"""Many kills on the PostgreSQL ledger: 4 worker processes, 5,000 tasks, a random worker
SIGKILLed every 1-3 s and restarted. Every task must end SUCCEEDED and the payment service
(which executes every POST: it does not honour keys) must have executed every charge
exactly once, counted in its own SQLite file."""

from __future__ import annotations

import os
import random
import time

import crashapp
import pytest
from crashkit import SIGKILLED, Proc, wait_for
from pgkit import (
    PgRig,
    assert_exactly_once,
    backends_of,
    check_pg_ledger_consistent,
    unique_app_name,
)

from ratchet import SubmitRequest

# 85 s alone on 2 cores, 208 s beside a second copy of the suite: the timeout leaves room.
pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(480)]

TASKS = int(os.environ.get("PG_FAULT_TASKS", "5000"))
WORKERS = 4
CONCURRENCY = 8
LEASE_S = 2.0
MAX_KILLS = 40


def test_pg_many_kills_every_charge_exactly_once(pg_rig: PgRig) -> None:
    rig = pg_rig
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    print(f"pg many-kills seed: {seed} (rerun with CRASH_SEED={seed})")
    rng = random.Random(seed)
    rig.lease_s = LEASE_S
    rig.start_service(honour_keys=False)  # every POST executes: only Ratchet keeps it single
    orders = [f"k-{i:05d}" for i in range(TASKS)]
    requests = [
        SubmitRequest(
            crashapp.CHARGE,
            {"order_id": o, "amount_cents": 100 + i},
            idempotency_key=f"order:{o}",
        )
        for i, o in enumerate(orders)
    ]
    for start in range(0, TASKS, 1000):
        rig.app.submit_many(requests[start : start + 1000])
    assert rig.states() == {"PENDING": TASKS}

    t0 = time.monotonic()
    def start(name: str) -> tuple[Proc, str]:
        app_name = unique_app_name("rt_kill")
        return rig.pg_worker(name, concurrency=CONCURRENCY, app_name=app_name), app_name

    workers = [start(f"w{i}-gen0") for i in range(WORKERS)]
    orphaned: set[tuple[str, str]] = set()  # (task id, holder killed while RUNNING it)
    kills = 0
    while kills < MAX_KILLS:
        time.sleep(rng.uniform(1.0, 3.0))
        if rig.states().get("SUCCEEDED", 0) == TASKS:
            break
        i = rng.randrange(WORKERS)
        victim, app_name = workers[i]
        holder = victim.holder()
        try:
            wait_for(
                f"{victim.name} to hold a running task",
                lambda h=holder: rig.running_held_by(h), 15.0, 0.01,
            )
        except AssertionError:
            if rig.states().get("SUCCEEDED", 0) == TASKS:
                break
            raise
        assert victim.kill() == SIGKILLED, f"{victim.name} died before it was killed"
        kills += 1
        # A COMMIT the victim sent just before dying may still complete on the server:
        # read what it held only once all its server connections are gone.
        wait_for(
            f"{victim.name}'s server connections to end",
            lambda a=app_name: not backends_of(rig.raw, a), 15.0, 0.02,
        )
        orphaned.update((task_id, holder) for task_id in rig.running_held_by(holder))
        workers[i] = start(f"w{i}-gen{kills}")
    rig.wait_all_succeeded(TASKS, timeout_s=120.0)
    elapsed = time.monotonic() - t0
    for w, _ in workers:
        assert w.returncode is None, f"{w.name} exited by itself (rc={w.returncode})"
        assert w.stop() == 0

    assert_exactly_once(rig, {f"charge:{o}" for o in orders})
    # Every task ran both steps (a step killed before its commit may run again).
    steps: dict[str, set[str]] = {}
    for r in rig.step_runs():
        steps.setdefault(r.task, set()).add(r.step)
    assert len(steps) == TASKS
    assert all(s == {"prepare", "finalize"} for s in steps.values())

    # Every task a killed worker was running was recovered from that worker: taken over
    # after its lease expired, or revoked at once by a same-host worker that saw the
    # process was gone (fast takeover); both bump the generation.
    assert kills >= 3, f"only {kills} kills landed: the test proved little"
    assert orphaned, "no kill landed while a task was running"
    recovered = {
        (task_id, prev)
        for task_id, prev in rig.sql(
            "SELECT task_id, detail::jsonb ->> 'previous_holder' FROM audit"
            " WHERE kind IN ('takeover', 'revoke')"
        )
    }
    missing = orphaned - recovered
    assert not missing, f"orphaned tasks never taken over: {sorted(missing)[:5]}"
    stats = rig.ledger.stats()
    assert stats.takeovers + stats.revocations >= len(orphaned)
    assert stats.unknown_count == 0
    print(
        f"tasks={TASKS} kills={kills} orphaned={len(orphaned)} takeovers={stats.takeovers} "
        f"revocations={stats.revocations} claims={stats.claims} "
        f"stale_rejections={stats.stale_rejections} "
        f"lookup_hits={stats.lookup_hits} elapsed={elapsed:.1f}s"
    )
    check_pg_ledger_consistent(rig)
