"""The database drops a worker's connections (``pg_terminate_backend``).

The worker must reconnect by itself and finish its tasks; nothing may be lost or executed
twice at the payment service (which executes every POST); and while its leases cannot be
confirmed it must not start a new effect.

Only the worker under test is hit: it runs with its own ``application_name`` (a libpq
parameter in its ledger URL), and only server connections with that name are terminated.
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from crashkit import wait_for
from pgkit import (
    PgRig,
    TcpProxy,
    assert_exactly_once,
    backends_of,
    check_pg_ledger_consistent,
    execution_times,
    terminate_backends,
    unique_app_name,
)

from ratchet import State, SubmitRequest

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

LEASE_S = 2.0


def _submit(rig: PgRig, prefix: str, n: int, work_s: float) -> tuple[list[str], list[str]]:
    orders = [f"{prefix}-{i:04d}" for i in range(n)]
    handles = rig.app.submit_many([
        SubmitRequest(
            "crash.charge", {"order_id": o, "amount_cents": 100 + i, "work_s": work_s},
            idempotency_key=f"order:{o}",
        )
        for i, o in enumerate(orders)
    ])
    return [h.task_id for h in handles], orders


def test_pg_terminate_backend_worker_reconnects(pg_rig: PgRig) -> None:
    """Five times, while the worker holds running tasks, every server connection it has
    is terminated. It must reconnect, finish everything, and stay up."""
    rig = pg_rig
    rig.lease_s = LEASE_S
    rig.start_service(honour_keys=False)
    ids, orders = _submit(rig, "t", 800, work_s=0.03)
    app = unique_app_name("rt_term")
    w = rig.pg_worker("W", concurrency=8, app_name=app)
    holder = w.holder()
    other = rig.pg_worker("bystander", concurrency=2, app_name=unique_app_name("rt_by"))
    other.holder()

    cuts: list[tuple[int, int]] = []  # (backends terminated, tasks W held at that moment)
    for _ in range(5):
        wait_for("W to hold running tasks", lambda: rig.running_held_by(holder), 20, 0.01)
        held = len(rig.running_held_by(holder))
        terminated = terminate_backends(rig.raw, app)
        assert terminated, "W had no server connection to terminate"
        cuts.append((len(terminated), held))
        # It reconnects: new server connections with its name appear.
        wait_for(
            "W to reconnect",
            lambda t=set(terminated): set(backends_of(rig.raw, app)) - t, 20, 0.02,
        )
        time.sleep(0.4)
    print(f"cuts (connections terminated, tasks held): {cuts}")

    rig.wait_all_succeeded(len(ids), timeout_s=90)
    assert w.returncode is None, f"W exited after its connections were dropped ({w.returncode})"
    assert other.returncode is None
    assert w.stop() == 0 and other.stop() == 0
    assert_exactly_once(rig, {f"charge:{o}" for o in orders})
    stats = rig.ledger.stats()
    assert stats.unknown_count == 0
    log = w.log()
    print(
        f"takeovers={stats.takeovers} revocations={stats.revocations} "
        f"stale={stats.stale_rejections} lookup_hits={stats.lookup_hits}; W logged "
        f"{log.count('final commit failed')} failed final commits, "
        f"{log.count('renewal failed')} failed renewals, {log.count(' ERROR ')} errors"
    )
    check_pg_ledger_consistent(rig)


def _proxied(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    userinfo = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit((parts.scheme, f"{userinfo}127.0.0.1:{port}", parts.path, parts.query, ""))


def test_pg_terminate_backend_leases_unconfirmed_no_new_effects(pg_rig: PgRig) -> None:
    """The worker's connections are terminated and it cannot reconnect for longer than
    its leases (its connections go through a loopback proxy that refuses new ones for a
    while: the server is "unreachable" for this worker only). While its leases are
    unconfirmed it must start no new effect: no charge may execute at the service during
    the outage, beyond requests already in flight when it began. Afterwards it
    reconnects and everything finishes, each charge once."""
    rig = pg_rig
    rig.lease_s = LEASE_S
    rig.start_service(honour_keys=False)
    parts = urlsplit(rig.ledger_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    try:
        ids, orders = _submit(rig, "u", 150, work_s=0.05)
        app = unique_app_name("rt_out")
        w = rig.pg_worker("W", concurrency=8, app_name=app,
                          url=_proxied(rig.ledger_url, proxy.port),
                          log_level=os.environ.get("PG_FAULT_LOG_LEVEL", "INFO"))
        holder = w.holder()
        wait_for("W to hold running tasks", lambda: len(rig.running_held_by(holder)) >= 4,
                 20, 0.01)
        proxy.block()
        t_cut = time.time()
        terminated = terminate_backends(rig.raw, app)
        assert terminated
        # A connection the proxy accepted just before the block may finish its start-up
        # after that terminate and then survive the outage: terminate
        # until none is left, so the worker really has no connection.
        wait_for("every connection of W terminated",
                 lambda: not terminate_backends(rig.raw, app) and not backends_of(rig.raw, app),
                 10, 0.05)
        held = rig.running_held_by(holder)
        gen_at_cut = {t.task_id: t.generation for t in rig.ledger.get_many(held)}
        outage_s = 2 * LEASE_S + 1.0
        time.sleep(outage_s)  # the outage itself (the fault under test), not a wait for state
        # Still down: it has no connection at all, and its leases have expired.
        assert backends_of(rig.raw, app) == []
        assert proxy.refused > 0, "W did not even try to reconnect"
        t_restore = time.time()
        proxy.unblock()
        expired = [t for t in rig.ledger.get_many(held) if t.state is State.RUNNING]
        assert all(t.lease_until is not None and t.lease_until < rig.ledger.now()
                   for t in expired)

        rig.wait_all_succeeded(len(ids), timeout_s=120)
        assert w.returncode is None, f"W exited during the outage ({w.returncode})"
        assert w.stop() == 0

        # No charge executed during the outage, except requests already in flight when it
        # began (one request at most per task thread, each answered within the client's
        # 1 s timeout).
        during = sorted(
            (at, key) for at, key in execution_times(rig) if t_cut + 1.0 < at < t_restore
        )
        assert during == [], f"charges executed while W's leases were unconfirmed: {during}"
        # And no charge was made under a lease that was held at the cut and never renewed
        # after it: the tasks W held then were finished under a new generation, or their
        # charge had already executed before the cut.
        executed_at = {key: at for at, key in execution_times(rig)}
        for task_id, generation in gen_at_cut.items():
            (effect,) = rig.ledger.timeline(task_id).effects
            if effect.generation == generation:
                assert executed_at[effect.key] < t_cut + 1.0, (task_id, effect)
        assert_exactly_once(rig, {f"charge:{o}" for o in orders})
        log = w.log()
        assert "lease on task" in log, "W never treated a lease as unconfirmed or lost"
        print(
            f"held at cut={len(held)} refused={proxy.refused} "
            f"lease_lost={log.count('cannot confirm lease')} "
            f"stats={rig.ledger.stats()}"
        )
        check_pg_ledger_consistent(rig)
    finally:
        proxy.close()
