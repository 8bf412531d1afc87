"""Adversarial checks of the PostgreSQL ledger and of fast takeover, with real concurrency.

Each test works in its own schema on the test server (``pgsupport.private_schema``). These
pin behaviours that were attacked and held: concurrent claimers never share a generation,
concurrent submits of one idempotency key make one task, a revoked holder is fenced out,
schemas do not leak into each other, a connection killed inside a transaction is retried,
and the registrar judges real processes (stopped, zombie, recycled pid) correctly.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgsupport import pg_base_url, private_schema, with_params
from psycopg import sql

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.errors import IdempotencyConflict, LedgerError, LedgerUnavailable
from ratchet.ledger.base import (
    EffectState,
    EffectWrite,
    Ledger,
    NewTask,
    TaskWrite,
    Transition,
    WorkerInfo,
)
from ratchet.ledger.pgtx import PgTx
from ratchet.serde import digest, dumps
from ratchet.states import State
from ratchet.worker.registry import (
    Registrar,
    host_identity,
    process_gone,
    process_start_time,
)

NAME = "adv.task"


@pytest.fixture
def pg() -> Iterator[tuple[str, str]]:
    with private_schema("rt_adv") as found:
        yield found


def _task(
    key: str | None = None,
    params: Any = None,
    lease_s: float = 30.0,
    max_attempts: int = 3,
) -> NewTask:
    params_json = dumps(params if params is not None else {})
    return NewTask(new_task_id(), NAME, 1, params_json, digest(NAME, params_json), key,
                   max_attempts, lease_s)


def _raw(schema: str | None = None) -> psycopg.Connection[tuple[Any, ...]]:
    conn = psycopg.connect(pg_base_url(), autocommit=True)
    if schema is not None:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn


def _run_threads(count: int, target: Any) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)


def test_concurrent_claimers_never_share_a_generation(pg: tuple[str, str]) -> None:
    url, schema = pg
    ledger = open_ledger(with_params(url, pool_size="8"))
    try:
        # Half the tasks have a 0 s lease: every claim of them expires at once, so
        # takeovers race with fresh claims too.
        ledger.submit([_task(lease_s=0.0 if i % 2 else 30.0) for i in range(300)])
        got: list[tuple[str, int]] = []
        lock = threading.Lock()
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def claimer(i: int) -> None:
            try:
                barrier.wait()
                for _ in range(25):
                    claims = ledger.claim(f"h{i}", [NAME], 13)
                    with lock:
                        got.extend((c.task_id, c.generation) for c in claims)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        _run_threads(8, claimer)
        assert errors == []
        counts = collections.Counter(got)
        assert [k for k, n in counts.items() if n > 1] == []
        with _raw(schema) as conn:
            rows = conn.execute(
                "SELECT t.id, t.generation, t.state, array_agg(a.generation ORDER BY a.seq)"
                " FILTER (WHERE a.kind IN ('claim', 'takeover'))"
                " FROM tasks t LEFT JOIN audit a ON a.task_id = t.id GROUP BY t.id"
            ).fetchall()
        per_task = collections.Counter(task_id for task_id, _ in got)
        for task_id, generation, state, claim_generations in rows:
            claimed = [g for g in (claim_generations or []) if g is not None]
            # Every claim bumped the generation exactly once, in order.
            assert claimed == list(range(1, len(claimed) + 1))
            assert per_task[task_id] == len(claimed)
            retired = 1 if state == "FAILED" else 0  # an expired final attempt, retired
            assert generation == len(claimed) + retired
    finally:
        ledger.close()


def test_concurrent_submits_of_one_key_make_one_task(pg: tuple[str, str]) -> None:
    url, schema = pg
    ledger = open_ledger(with_params(url, pool_size="10"))
    try:
        same: list[tuple[str, bool]] = []
        conflicts: list[IdempotencyConflict] = []
        conflicting_ids: list[str] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(10)

        def submitter(i: int) -> None:
            try:
                barrier.wait()
                other = i % 3 == 0
                first = _task(key="order-1", params={"amount": 5 if other else 1})
                extra = _task()  # rides in the same batch: written only with it
                try:
                    [result, _] = ledger.submit([first, extra])
                    same.append((result.task_id, result.created))
                except IdempotencyConflict as exc:
                    conflicts.append(exc)
                    conflicting_ids.append(extra.task_id)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        _run_threads(10, submitter)
        assert errors == []
        with _raw(schema) as conn:
            stored = conn.execute(
                "SELECT id, params_digest FROM tasks WHERE idempotency_key = 'order-1'"
            ).fetchall()
            leaked = conn.execute(
                "SELECT count(*) FROM tasks WHERE id = ANY(%s)", (conflicting_ids,)
            ).fetchone()
            audits = conn.execute(
                "SELECT count(*) FROM audit WHERE kind = 'idempotency_conflict'"
            ).fetchone()
        assert len(stored) == 1
        task_id, stored_digest = stored[0]
        winners = [created for _, created in same if created]
        assert len(winners) == 1
        assert {tid for tid, _ in same} == {task_id}
        assert len(same) + len(conflicts) == 10
        for exc in conflicts:
            assert exc.task_id == task_id
            assert exc.existing_digest == stored_digest
            assert exc.new_digest != stored_digest
            assert exc.existing_digest in str(exc) and exc.new_digest in str(exc)
        assert leaked == (0,)
        assert audits == (len(conflicts),)
    finally:
        ledger.close()


def test_duplicate_key_inside_one_batch(pg: tuple[str, str]) -> None:
    url, _ = pg
    ledger = open_ledger(url)
    try:
        a, b = _task(key="k", params={"v": 1}), _task(key="k", params={"v": 1})
        first, second = ledger.submit([a, b])
        assert (first.task_id, first.created) == (a.task_id, True)
        assert (second.task_id, second.created) == (a.task_id, False)
        c, d, e = _task(), _task(key="k2", params={"v": 1}), _task(key="k2", params={"v": 2})
        with pytest.raises(IdempotencyConflict):
            ledger.submit([c, d, e])
        assert ledger.get_many([c.task_id, d.task_id, e.task_id]) == []
    finally:
        ledger.close()


def test_revoked_holder_is_fenced_out_and_audited(pg: tuple[str, str]) -> None:
    url, schema = pg
    ledger = open_ledger(url)
    try:
        ledger.submit([_task() for _ in range(3)])
        claims = ledger.claim("old", [NAME], 3)
        ledger.commit([
            TaskWrite(c.task_id, c.generation, "old", "step", steps=[("s", dumps("old-1"))])
            for c in claims
        ])
        assert sorted(ledger.revoke_holder("old", by="peer", reason="gone")) == sorted(
            c.task_id for c in claims)
        again = {c.task_id: c for c in ledger.claim("new", [NAME], 3)}
        assert set(again) == {c.task_id for c in claims}
        assert {c.generation for c in again.values()} == {3}

        def frozen() -> list[Any]:
            with _raw(schema) as conn:
                return [
                    conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
                    for table in ("tasks", "steps", "effects")
                ]

        before = frozen()
        stale_before = ledger.stats().stale_rejections
        late = [
            TaskWrite(c.task_id, c.generation, "old", "late", steps=[("s", dumps("old-2"))],
                      effects=[EffectWrite("pay", "k", "d", EffectState.INTENT)],
                      transition=Transition(State.SUCCEEDED, result_json=dumps("old")))
            for c in claims
        ]
        outcomes = ledger.commit(late)
        assert all(o.stale and not o.ok for o in outcomes)
        assert {o.current_generation for o in outcomes} == {3}
        assert frozen() == before
        assert ledger.stats().stale_rejections == stale_before + 3
        renewed = ledger.renew("old", [(c.task_id, c.generation) for c in claims])
        assert [r.ok for r in renewed] == [False, False, False]
        assert [w.state for w in ledger.list_workers()] in ([], ["dead"])
    finally:
        ledger.close()


def test_schemas_do_not_leak_into_each_other() -> None:
    with private_schema("rt_adv") as (url_a, _), private_schema("rt_adv") as (url_b, _):
        a, b = open_ledger(url_a), open_ledger(url_b)
        woke_a: list[float] = []
        woke_b: list[float] = []
        sub_a = a.subscribe(lambda: woke_a.append(time.monotonic()))
        sub_b = b.subscribe(lambda: woke_b.append(time.monotonic()))
        try:
            deadline = time.monotonic() + 5
            while (not woke_a or not woke_b) and time.monotonic() < deadline:
                time.sleep(0.05)  # both LISTENs are up (one wake-up each on connect)
            seen_a, seen_b = len(woke_a), len(woke_b)
            # Same key, other params, other schema: no conflict. b's NOTIFY is sent first,
            # so a leak into a's channel would reach a before a's own.
            b.submit([_task(key="same", params={"x": 2}), _task(), _task()])
            a.submit([_task(key="same", params={"x": 1})])
            deadline = time.monotonic() + 10
            while (len(woke_a) <= seen_a or len(woke_b) <= seen_b) \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(woke_b) == seen_b + 1, "b did not get its own notification"
            assert len(woke_a) == seen_a + 1, "a got b's notification (or none of its own)"
            claims_a = a.claim("h", [NAME], 10)
            claims_b = b.claim("h", [NAME], 10)
            assert len(claims_a) == 1 and len(claims_b) == 3
            assert len(b.revoke_holder("h", by="peer", reason="test")) == 3
            assert a.get(claims_a[0].task_id).state is State.RUNNING
        finally:
            sub_a.close()
            sub_b.close()
            a.close()
            b.close()


def test_must_exist_on_an_absent_schema_creates_nothing(pg: tuple[str, str]) -> None:
    url, schema = pg
    with pytest.raises(LedgerUnavailable, match="no Ratchet ledger"):
        open_ledger(url, must_exist=True)
    with _raw() as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert found == (0,)


def test_libpq_parameters_keep_spaces(pg: tuple[str, str]) -> None:
    url, schema = pg
    ledger = open_ledger(url + f"&application_name=adv%20{schema}")
    try:
        ledger.now()  # the pool keeps this connection open
        with _raw() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (f"adv {schema}",),
            ).fetchone()
        assert row is not None and row[0] >= 1
    finally:
        ledger.close()


def test_connection_killed_inside_a_transaction_is_retried(
    pg: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend is terminated after the transaction's first round trip (BEGIN, the
    clock and the first statement): the server rolled it back, the operation runs again on
    another connection, once. (Where that round trip was the last before COMMIT, the loss
    shows at COMMIT: outcome unknown, and the engine re-sends.)"""
    url, schema = pg
    ledger = open_ledger(with_params(url, pool_size="2"))
    armed = [0]
    real_send = PgTx._send

    def send_then_kill(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = not self.started
        cur = real_send(self, *args, **kwargs)
        if first and armed[0]:
            armed[0] -= 1
            with _raw() as conn:
                conn.execute("SELECT pg_terminate_backend(%s)",
                             (cur.connection.info.backend_pid,))
            time.sleep(0.05)
        return cur

    monkeypatch.setattr(PgTx, "_send", send_then_kill)

    def once(op: Any) -> Any:
        armed[0] = 1
        result = op()
        assert armed[0] == 0, "the fault did not fire"
        return result

    try:
        tasks = [_task(key=f"k{i}") for i in range(3)]
        assert [r.created for r in once(lambda: ledger.submit(tasks))] == [True] * 3
        assert [r.created for r in once(lambda: ledger.submit(tasks))] == [False] * 3
        claims = once(lambda: ledger.claim("h", [NAME], 10))
        assert sorted(c.generation for c in claims) == [1, 1, 1]
        renewed = once(lambda: ledger.renew("h", [(c.task_id, c.generation) for c in claims]))
        assert all(r.ok for r in renewed)
        writes = [
            TaskWrite(c.task_id, c.generation, "h", "intent",
                      effects=[EffectWrite("pay", "k", "d", EffectState.INTENT)])
            for c in claims
        ]
        assert all(o.ok for o in once(lambda: ledger.commit(writes)))
        once(lambda: ledger.revoke_holder("h", by="peer", reason="test"))
        with _raw(schema) as conn:
            assert conn.execute(
                "SELECT count(*), min(generation), max(generation) FROM tasks"
            ).fetchone() == (3, 2, 2)
            assert conn.execute(
                "SELECT kind, count(*) FROM audit GROUP BY kind ORDER BY kind"
            ).fetchall() == [("claim", 3), ("revoke", 3)]
            assert conn.execute("SELECT sum(calls) FROM effects").fetchone() == (3,)
    finally:
        ledger.close()


def test_a_read_whose_commit_is_lost_runs_again(pg: tuple[str, str]) -> None:
    """A transaction that only reads (``write=False``: ``READ ONLY``) and loses its
    connection at COMMIT wrote nothing, so it runs again on another connection instead of
    reporting an unknown outcome (a process stalled past the server's idle-in-transaction
    timeout while it read); and the server refuses a write inside one."""
    url, _ = pg
    ledger = open_ledger(with_params(url, pool_size="2"))
    runs: list[Any] = []

    def read(tx: Any) -> Any:
        runs.append(tx.one("ledger_identity"))
        if len(runs) == 1:  # the first run's backend dies before its COMMIT is sent
            pid = tx.conn.info.backend_pid
            with _raw() as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                deadline = time.monotonic() + 10
                while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone():
                    assert time.monotonic() < deadline, "the backend was not terminated"
                    time.sleep(0.01)
        return runs[-1]

    def write(tx: Any) -> int:
        return tx.execute("budget_prune", {"keys": ["k"], "before": 0})

    try:
        assert ledger.dialect.run(read, write=False) == runs[0]
        assert len(runs) == 2 and runs[0] == runs[1]
        with pytest.raises(LedgerError, match="read-only transaction"):
            ledger.dialect.run(write, write=False)
        assert ledger.dialect.run(write) == 0
    finally:
        ledger.close()


def _ledger_with_holders(ledger: Ledger, holders: list[tuple[str, int, str | None]]) -> None:
    me = host_identity()
    ledger.submit([_task() for _ in holders])
    for holder, pid, start in holders:
        ledger.register_worker(WorkerInfo(holder, me, "host", pid, start))
        assert len(ledger.claim(holder, [NAME], 1)) == 1


def test_registrar_judges_real_processes(pg: tuple[str, str]) -> None:
    url, _ = pg
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    live, stopped, zombie = (subprocess.Popen(sleeper) for _ in range(3))
    reaped = subprocess.Popen([sys.executable, "-c", "pass"])
    reaped.wait()
    ledger = open_ledger(url)
    try:
        deadline = time.monotonic() + 5  # every child is up (its start time readable)
        while any(process_start_time(p.pid) is None for p in (live, stopped, zombie)):
            assert time.monotonic() < deadline, "child processes did not start"
            time.sleep(0.01)
        starts = {p.pid: process_start_time(p.pid) for p in (live, stopped, zombie)}
        os.kill(stopped.pid, signal.SIGSTOP)
        os.kill(zombie.pid, signal.SIGKILL)  # not reaped yet: a zombie
        deadline = time.monotonic() + 5
        while not process_gone(zombie.pid, starts[zombie.pid]) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process_gone(live.pid, starts[live.pid]) is False
        assert process_gone(live.pid, None) is False
        assert process_gone(stopped.pid, starts[stopped.pid]) is False
        assert process_gone(zombie.pid, starts[zombie.pid]) is True
        assert process_gone(reaped.pid, None) is True
        _ledger_with_holders(ledger, [
            ("w-live", live.pid, starts[live.pid]),
            ("w-stopped", stopped.pid, starts[stopped.pid]),
            ("w-zombie", zombie.pid, starts[zombie.pid]),
            ("w-reaped", reaped.pid, None),
            ("w-recycled", live.pid, "1"),  # the pid now belongs to another process
        ])
        ledger.register_worker(WorkerInfo("w-elsewhere", "other/host/ns", "h", reaped.pid, None))
        judge = Registrar(ledger, "judge")
        revoked = judge.scan_once()
        assert sorted(revoked) == ["w-reaped", "w-recycled", "w-zombie"]
        assert all(len(v) == 1 for v in revoked.values())
        assert judge.scan_once() == {}
        alive = sorted(w.holder for w in ledger.list_workers(host_identity()))
        assert alive == ["w-live", "w-stopped"]
    finally:
        ledger.close()
        os.kill(stopped.pid, signal.SIGCONT)
        for p in (live, stopped, zombie):
            p.kill()
            p.wait()
