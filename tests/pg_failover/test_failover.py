"""Failover with ``durability=replicated``: the primary's host dies mid-drain, the
synchronous standby is promoted, and nothing a caller saw is lost.

Two ``ratchet worker`` processes drain charges (an effect on the counting service, which
honours idempotency keys and counts executions in its own file) over the multi-host URL
``postgresql://...@primary,standby/postgres?target_session_attrs=read-write&
durability=replicated``. A caller thread in the test waits on the tasks in submit order
(``handle.wait``) and records every completion it sees. A quarter of the way through, the
primary's postmaster and all its processes are SIGKILLed (the host is gone) and the
standby is promoted. Then:

* both workers reconnect to the new primary on their own (libpq skips the dead host and
  refuses the standby until it is promoted): the first completion after the promotion
  comes within :data:`RECONNECT_BOUND_S`, and each worker completes tasks again;
* every completion the caller saw before the kill is SUCCEEDED on the promoted standby
  (``synchronous_commit = remote_apply``: a commit is visible on the primary only after
  the standby applied it);
* every task, including ones submitted after the promotion through the caller's same
  ``App``, ends SUCCEEDED, and every charge executed exactly once at the counting service.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import crashapp
import pytest
from pairkit import ReplicatedPair
from pgkit import PgRig
from rigsupport import test_failed

from ratchet import App, SubmitRequest, TaskHandle
from ratchet.errors import ConfigError, LedgerError, WaitTimeout
from ratchet.ledger import open_ledger
from ratchet.states import State
from ratchet.testing import check_exactly_once, check_ledger_consistent, wait_for

pytestmark = [
    pytest.mark.crash,
    pytest.mark.timeout(300),
    # Process kills, a promotion and a reconnect bound: kept on one xdist worker.
    pytest.mark.xdist_group("pg_failover"),
]

SCHEMA = "rt_failover"
TASKS = 400
LATE_TASKS = 40
"""Submitted through the caller's App after the promotion."""
WORKERS = 2
CONCURRENCY = 8
WORK_S = 0.1
"""Time each charge spends in its ``prepare`` step, seconds: the drain lasts a few seconds,
so the kill lands in the middle of it."""
LEASE_S = 2.0
REFUSED = "session is read-only"
"""libpq's refusal of a standby under ``target_session_attrs=read-write``, as the pool
logs it."""
STARTUP_S = 90.0
"""Bound on a worker's start-up and on the drain phases, seconds: generous, because a
loaded CI machine (several suites at once) starts a Python process in tens of seconds."""
RECONNECT_BOUND_S = 30.0
"""Promotion → first completion on the new primary, seconds (about 1-3 s expected)."""


class Caller(threading.Thread):
    """A client of the ledger: waits on each task in submit order and records the ones it
    saw SUCCEEDED, with the monotonic time it saw them. Ledger errors (the primary is gone,
    no primary yet) are retried, as a caller riding out a failover would."""

    def __init__(self, app: App, handles: list[TaskHandle]) -> None:
        super().__init__(name="caller", daemon=True)
        self.app = app
        self.pending = list(handles)
        self.seen: list[tuple[str, float]] = []
        self.errors = 0
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def add(self, handles: list[TaskHandle]) -> None:
        with self.lock:
            self.pending.extend(handles)

    def snapshot(self) -> set[str]:
        with self.lock:
            return {task_id for task_id, _ in self.seen}

    def run(self) -> None:
        while not self.stopped.is_set():
            with self.lock:
                handle = self.pending[0] if self.pending else None
            if handle is None:
                self.stopped.wait(0.05)
                continue
            try:
                info = handle.wait(timeout_s=1.0)
            except WaitTimeout:
                continue
            except LedgerError:
                self.errors += 1
                self.stopped.wait(0.05)
                continue
            with self.lock:
                self.pending.pop(0)
                if info.state is State.SUCCEEDED:
                    self.seen.append((handle.task_id, time.monotonic()))


def _charge(order: str, amount: int) -> SubmitRequest:
    params = {"order_id": order, "amount_cents": amount, "work_s": WORK_S,
              "target": "idempotent"}  # fmt: skip
    return SubmitRequest(crashapp.CHARGE, params, idempotency_key=f"order:{order}")


def _rows(pair: ReplicatedPair, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """``query`` on the promoted standby alone (never through the multi-host URL)."""
    with pair.standby.connect() as conn:
        conn.execute(f"SET search_path TO {SCHEMA}")
        return conn.execute(query, args or None).fetchall()


@pytest.mark.parametrize("outage", ["prompt", "leases-expire"])
def test_failover_to_the_synchronous_standby_loses_nothing_a_caller_saw(
    pair: ReplicatedPair, tmp_path: Any, request: pytest.FixtureRequest, outage: str
) -> None:
    """``prompt``: the standby is promoted as soon as every worker found no writable host.
    ``leases-expire``: only once every lease the standby knows of has expired (a slower
    failover; the running tasks are taken over on the new primary)."""
    url = pair.hosts_url(target_session_attrs="read-write", durability="replicated",
                         schema=SCHEMA, connect_timeout="2")  # fmt: skip
    rig = PgRig(tmp_path, url, SCHEMA)
    caller: Caller | None = None
    try:
        rig.lease_s = LEASE_S
        rig.start_service(honour_keys=True)
        orders = [f"f-{i:04d}" for i in range(TASKS)]
        handles = rig.app.submit_many([_charge(o, 100 + i) for i, o in enumerate(orders)])
        workers = [rig.pg_worker(f"w{i}", concurrency=CONCURRENCY) for i in range(WORKERS)]
        holders = {w.holder(timeout_s=STARTUP_S) for w in workers}
        caller = Caller(rig.app, handles)
        caller.start()
        # The kill comes once a quarter of the tasks succeeded (read on the standby, whose
        # replay is in step with the primary's commits) and the caller saw some of them: a
        # caller slower than the workers (a loaded machine) must not push the kill past the
        # end of the drain.
        with pair.standby.connect() as watch:
            def succeeded() -> int:
                row = watch.execute(
                    f"SELECT count(*) FROM {SCHEMA}.tasks WHERE state = 'SUCCEEDED'"
                ).fetchone()
                return int(row[0]) if row else 0

            wait_for("a quarter of the tasks to succeed, some of them seen by the caller",
                     lambda: succeeded() >= TASKS // 4 and caller.snapshot(),
                     timeout_s=STARTUP_S, interval_s=0.01)  # fmt: skip

        # ---- the primary's host dies; the standby is promoted
        saw = caller.snapshot()
        killed = time.monotonic()
        pair.kill_primary()
        # No writable host until the promotion: every worker finds the primary gone and
        # is refused by the standby (target_session_attrs=read-write), and keeps trying.
        wait_for("every worker to be refused by the read-only standby",
                 lambda: all(REFUSED in w.log() for w in workers), timeout_s=RECONNECT_BOUND_S,
                 interval_s=0.02)  # fmt: skip
        if outage == "leases-expire":
            # A slower failover: every lease the standby knows of runs out first, so the
            # workers' running tasks are taken over (new generations) on the new primary.
            leases = _rows(pair, "SELECT max(lease_until) FROM tasks WHERE state = 'RUNNING'")
            until = float(leases[0][0] or 0.0)
            wait_for("every running task's lease to expire", lambda: time.time() > until,
                     timeout_s=LEASE_S + 10, interval_s=0.02)  # fmt: skip
        down_s = time.monotonic() - killed
        pair.promote()
        promoted = time.monotonic()
        promoted_wall = time.time()  # the ledger clock is this host's clock (same machine)
        done_at_kill = _rows(pair, "SELECT count(*) FROM tasks WHERE state = 'SUCCEEDED'")[0][0]
        assert done_at_kill < TASKS, "every task finished before the kill: nothing was tested"
        for w in workers:
            assert w.returncode is None, f"{w.name} exited without a primary: {w.log()[-3000:]}"

        # ---- workers reconnect on their own
        def first_completions() -> dict[str, float] | None:
            rows = _rows(pair, "SELECT holder, min(at) FROM audit WHERE to_state = 'SUCCEEDED'"
                               " AND at > %s GROUP BY holder", promoted_wall)  # fmt: skip
            found = {str(h): float(at) for h, at in rows if h in holders}
            return found if found else None

        first = wait_for("a completion on the promoted standby", first_completions,
                         timeout_s=RECONNECT_BOUND_S, interval_s=0.02)
        seen_new_s = time.monotonic() - promoted
        reconnect_s = min(first.values()) - promoted_wall
        every = wait_for("every worker to complete a task on the new primary",
                         lambda: (f := first_completions()) and len(f) == WORKERS and f,
                         timeout_s=RECONNECT_BOUND_S, interval_s=0.05)  # fmt: skip
        per_worker_s = sorted(at - promoted_wall for at in every.values())
        assert reconnect_s < RECONNECT_BOUND_S

        # ---- the caller's App reconnects too: submit more after the failover
        late = wait_for(
            "a submit through the caller's App to succeed after the failover",
            lambda: _try_submit(rig.app, [_charge(f"late-{i:03d}", 7) for i in range(LATE_TASKS)]),
            timeout_s=RECONNECT_BOUND_S, interval_s=0.1,
        )  # fmt: skip
        caller.add(late)

        # ---- everything drains on the promoted standby
        total = TASKS + LATE_TASKS
        wait_for("every task to succeed on the promoted standby",
                 lambda: _rows(pair, "SELECT count(*) FROM tasks WHERE state = 'SUCCEEDED'")
                 [0][0] == total, timeout_s=STARTUP_S, interval_s=0.1)  # fmt: skip
        for w in workers:
            assert w.returncode is None, f"{w.name} exited during the failover: {w.log()[-3000:]}"
        for w in workers:
            assert w.stop() == 0

        # ---- nothing a caller saw is lost
        states = dict(_rows(pair, "SELECT id, state FROM tasks"))
        lost = sorted(t for t in saw if states.get(t) != State.SUCCEEDED.value)
        assert not lost, f"{len(lost)} completions the caller saw are not SUCCEEDED: {lost[:5]}"
        assert len(states) == total

        # ---- nothing executed twice, counted at the service
        check_url = pair.standby.url + f"?schema={SCHEMA}&durability=fsync"
        assert rig.service is not None
        report = check_exactly_once(check_url, rig.service.records(), effect="charge",
                                    result_id_field="id")  # fmt: skip
        keys = {f"charge:{o}" for o in orders} | {f"charge:late-{i:03d}" for i in range(LATE_TASKS)}
        assert set(report.executions) == keys
        assert report.succeeded == report.succeeded_once == report.tasks == total
        stats = rig.client.stats()
        assert stats["duplicate_keys"] == 0 and stats["executions"] == total, stats
        check_ledger_consistent(check_url)
        takeovers = _rows(pair, "SELECT count(*) FROM tasks WHERE generation > 1")[0][0]

        # ---- the promoted standby has no synchronous standby of its own: 'replicated' no
        # longer holds, and a process opening the ledger now is told so (the running ones
        # carried on at the level the server gives them: see docs/how-to/postgresql.md).
        with pytest.raises(ConfigError, match="synchronous standby"):
            open_ledger(url).close()

        print(
            f"failover ({outage}): saw {len(saw)} completions before the kill, "
            f"{done_at_kill} done on the standby at the kill; no writable host for "
            f"{down_s:.2f} s, promoted {promoted - killed:.2f} s after the kill; "
            f"first completion "
            f"on the new primary {reconnect_s:.2f} s after promotion (seen by the test after "
            f"{seen_new_s:.2f} s), per worker {[f'{s:.2f}' for s in per_worker_s]} s; caller "
            f"retried {caller.errors} ledger errors; service replays {stats['replays']}; "
            f"takeovers {takeovers}"
        )
    finally:
        if caller is not None:
            caller.stopped.set()
            caller.join(timeout=5)
        try:
            rig.cleanup()
        finally:
            if test_failed(request):
                print(rig.dump())


def _try_submit(app: App, requests: list[SubmitRequest]) -> list[TaskHandle] | None:
    """``app.submit_many(requests)``, or None when the ledger is not reachable yet (the
    same idempotency keys make a retried submit return the same tasks)."""
    try:
        return app.submit_many(requests)
    except LedgerError:
        return None
