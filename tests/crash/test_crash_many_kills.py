"""Many kills: two worker processes, one killed with SIGKILL every 0.5-1 s and restarted,
then a drain. Every task must succeed and the payment service must have executed every
charge exactly once (counted in its own SQLite file)."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import crashapp
import pytest
from crashkit import SIGKILLED, Rig, wait_for

from ratchet import State, SubmitRequest

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

TASKS = 150
KILLS = 6
CONCURRENCY = 3
WORK_S = 0.2  # per task, so the kills land while plenty of work is in flight


@pytest.mark.parametrize("honour_keys", [True, False], ids=["honour-keys", "no-honour-keys"])
def test_many_kills_every_charge_exactly_once(rig: Rig, honour_keys: bool) -> None:
    """With ``honour_keys`` the service dedupes by itself; without it (every POST executes)
    only Ratchet's intent record and lookup-first recovery keep each charge single."""
    seed = int(os.environ.get("CRASH_SEED", random.randrange(1 << 30)))
    print(f"many-kills seed: {seed} (rerun with CRASH_SEED={seed})")
    rng = random.Random(seed)
    rig.start_service(honour_keys=honour_keys)
    orders = [f"m-{i:03d}" for i in range(TASKS)]
    handles = rig.app.submit_many(
        [
            SubmitRequest(
                crashapp.CHARGE,
                {"order_id": o, "amount_cents": 100 + i, "work_s": WORK_S},
                idempotency_key=f"order:{o}",
            )
            for i, o in enumerate(orders)
        ]
    )
    ids = [h.task_id for h in handles]
    workers = [
        rig.worker(f"w{i}-gen0", concurrency=CONCURRENCY, fast_takeover=True) for i in range(2)
    ]
    # (task id, holder killed while RUNNING it); a task can be orphaned more than once,
    # since a fresh worker takes over expired leases first and may be the next victim.
    orphaned: set[tuple[str, str]] = set()
    kills = 0

    def held_by(holder: str) -> list[str]:
        return [
            t.task_id
            for t in rig.ledger.get_many(ids)
            if t.state is State.RUNNING and t.holder == holder
        ]

    for kill in range(1, KILLS + 1):
        time.sleep(rng.uniform(0.5, 1.0))
        i = rng.randrange(len(workers))
        victim = workers[i]
        # Kill it mid-work: once it is up and holds at least one running task (on a loaded
        # machine a fresh worker may need longer than the kill interval to start).
        holder = victim.holder()
        try:
            wait_for(
                f"{victim.name} to hold a running task", lambda h=holder: held_by(h), 15.0, 0.01
            )
        except AssertionError:
            if all(t.terminal for t in rig.ledger.get_many(ids)):
                break  # everything finished before this kill: nothing left to interrupt
            raise
        assert victim.kill() == SIGKILLED
        kills += 1
        orphaned.update((task_id, holder) for task_id in held_by(holder))
        workers[i] = rig.worker(f"w{i}-gen{kill}", concurrency=CONCURRENCY, fast_takeover=True)

    def drained() -> bool:
        return all(t.state is State.SUCCEEDED for t in rig.ledger.get_many(ids))

    try:
        wait_for("every task to succeed", drained, timeout_s=90.0, interval_s=0.2)
    except AssertionError:
        states: dict[str, int] = {}
        for t in rig.ledger.get_many(ids):
            states[t.state.value] = states.get(t.state.value, 0) + 1
        raise AssertionError(f"not drained: {states}") from None
    for w in workers:
        assert w.stop() == 0

    # Exactly one execution per business key, counted by the service itself.
    executions = rig.executions()
    assert set(executions) == {f"charge:{o}" for o in orders}
    duplicated = {k: n for k, n in executions.items() if n != 1}
    assert duplicated == {}, f"keys executed more than once: {duplicated}"
    assert rig.client.stats()["duplicate_keys"] == 0

    # Every task ran each step at least once (a step killed before its commit runs again).
    runs: dict[str, Any] = {}
    for r in rig.step_runs():
        runs.setdefault(r.task, set()).add(r.step)
    assert all(runs.get(t) == {"prepare", "finalize"} for t in ids)

    # Every task a killed worker was running was taken from that worker: revoked by a
    # peer on this host that saw the process gone, or taken over once its lease expired.
    assert orphaned, "no kill landed while a task was running: the test proved nothing"
    for task_id, holder in sorted(orphaned):
        events = rig.ledger.timeline(task_id).events
        assert any(
            e.kind in ("takeover", "revoke") and e.detail.get("previous_holder") == holder
            for e in events
        ), (task_id, holder, events)
    stats = rig.ledger.stats()
    assert stats.takeovers + stats.revocations >= len(orphaned)
    print(
        f"kills={kills} orphaned={len(orphaned)} takeovers={stats.takeovers} "
        f"claims={stats.claims} stale_rejections={stats.stale_rejections}"
    )
    rig.check_consistent()
