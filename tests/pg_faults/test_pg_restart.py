"""A PostgreSQL restart in the middle of a run, on a private cluster this test starts with
``initdb``/``pg_ctl`` on its own port (the shared server is never restarted or stopped).

Two worker processes ride it out: every task ends SUCCEEDED, every charge executed exactly
once at the payment service (which executes every POST), the workers stay up.
"""

from __future__ import annotations

import time

import pytest
from crashkit import wait_for
from pgkit import PgRig, assert_exactly_once, check_pg_ledger_consistent

from ratchet import SubmitRequest

pytestmark = [pytest.mark.crash, pytest.mark.timeout(240)]

TASKS = 800
LEASE_S = 2.0


@pytest.mark.parametrize("mode", ["restart-fast", "stop-2s-start", "crash-immediate"])
def test_pg_restart_mid_run(cluster_rig: PgRig, mode: str) -> None:
    """``restart-fast``: ``pg_ctl restart -m fast``. ``stop-2s-start``: stopped (fast) for
    2 s, then started. ``crash-immediate``: ``pg_ctl restart -m immediate`` (no shutdown
    checkpoint; crash recovery on start): with ``fsync`` durability no acknowledged commit
    may be lost."""
    rig = cluster_rig
    assert rig.cluster is not None
    rig.lease_s = LEASE_S
    rig.start_service(honour_keys=False)
    orders = [f"r-{i:04d}" for i in range(TASKS)]
    rig.app.submit_many([
        SubmitRequest("crash.charge", {"order_id": o, "amount_cents": 100 + i, "work_s": 0.01},
                      idempotency_key=f"order:{o}")
        for i, o in enumerate(orders)
    ])
    workers = [rig.pg_worker(f"w{i}", concurrency=8) for i in range(2)]
    for w in workers:
        w.holder()
    wait_for("a fifth of the tasks to succeed",
             lambda: rig.states().get("SUCCEEDED", 0) >= TASKS // 5, 60, 0.05)
    before = rig.states()
    t0 = time.monotonic()
    if mode == "restart-fast":
        rig.cluster.restart("fast")
    elif mode == "stop-2s-start":
        rig.cluster.stop("fast")
        time.sleep(2.0)
        rig.cluster.start()
    else:
        rig.cluster.restart("immediate")
    down_s = time.monotonic() - t0
    assert before.get("SUCCEEDED", 0) < TASKS, "everything finished before the restart"

    rig.wait_all_succeeded(TASKS, timeout_s=120)
    recovered_s = time.monotonic() - t0
    for w in workers:
        assert w.returncode is None, f"{w.name} exited during the restart (rc={w.returncode})"
    for w in workers:
        assert w.stop() == 0
    assert_exactly_once(rig, {f"charge:{o}" for o in orders})
    stats = rig.ledger.stats()
    assert stats.unknown_count == 0
    logs = "".join(w.log() for w in workers)
    print(
        f"mode={mode} before={before} restart took {down_s:.1f}s, drained {recovered_s:.1f}s "
        f"after it; takeovers={stats.takeovers} revocations={stats.revocations} "
        f"stale={stats.stale_rejections} lookup_hits={stats.lookup_hits}; worker logs: "
        f"{logs.count('final commit failed')} failed final commits, "
        f"{logs.count('renewal failed')} failed renewals, {logs.count('-> RETRY_WAIT')} retries"
    )
    check_pg_ledger_consistent(rig)


def test_worker_started_while_the_database_is_down_waits_for_it(cluster_rig: PgRig) -> None:
    """Boot order is not guaranteed: a worker that starts while PostgreSQL is down keeps
    trying (``--ledger-wait-s``, default 30 s) and works once the server is up."""
    rig = cluster_rig
    assert rig.cluster is not None
    rig.start_service(honour_keys=False)
    orders = [f"late-{i:03d}" for i in range(20)]
    rig.app.submit_many([
        SubmitRequest("crash.charge", {"order_id": o, "amount_cents": 100, "work_s": 0.0},
                      idempotency_key=f"order:{o}")
        for o in orders
    ])
    rig.cluster.stop("fast")
    worker = rig.pg_worker("early", concurrency=4)
    # It found the database down and kept trying: at least two failed attempts logged.
    wait_for("the worker to retry the unreachable ledger twice",
             lambda: worker.log().count("ledger unavailable") >= 2 or worker.returncode is not None,
             timeout_s=25.0, interval_s=0.1)
    assert worker.returncode is None, "the worker gave up while the database was down"
    rig.cluster.start()
    rig.wait_all_succeeded(len(orders), timeout_s=60)
    assert worker.stop() == 0
    assert_exactly_once(rig, {f"charge:{o}" for o in orders})
