"""PostgreSQL-only behaviour of the ledger (the shared contract is in tests/contract/).

Each test works in its own schema on the test server (see ``pgsupport``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from pgsupport import private_schema, with_params
from psycopg import sql

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.errors import ConfigError, SchemaTooNew
from ratchet.ledger.base import Ledger, NewTask, RenewResult, WorkerInfo
from ratchet.serde import digest, dumps
from ratchet.states import State


@pytest.fixture
def pg() -> Iterator[tuple[str, str]]:
    with private_schema("rt_pg") as found:
        yield found


def _task(name: str = "pg.task", max_attempts: int = 3) -> NewTask:
    params = dumps({})
    return NewTask(new_task_id(), name, 1, params, digest(name, params), None, max_attempts,
                   30.0)


def _raw(url: str) -> psycopg.Connection[tuple[object, ...]]:
    base = url.split("?")[0]
    return psycopg.connect(base, autocommit=True)


def test_newer_schema_is_refused_and_not_modified(pg: tuple[str, str]) -> None:
    url, schema = pg
    open_ledger(url).close()
    with _raw(url) as conn:
        conn.execute(sql.SQL("UPDATE {}.schema_version SET version = 99").format(
            sql.Identifier(schema)))
        before = conn.execute(sql.SQL("SELECT count(*) FROM {}.tasks").format(
            sql.Identifier(schema))).fetchone()
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        open_ledger(url)
    with pytest.raises(SchemaTooNew):
        open_ledger(url, migrate=False)
    with _raw(url) as conn:
        version = conn.execute(sql.SQL("SELECT version FROM {}.schema_version").format(
            sql.Identifier(schema))).fetchone()
        after = conn.execute(sql.SQL("SELECT count(*) FROM {}.tasks").format(
            sql.Identifier(schema))).fetchone()
    assert version == (99,)
    assert before == after


def test_concurrent_migrate_from_many_processes_is_safe(pg: tuple[str, str]) -> None:
    url, schema = pg
    errors: list[BaseException] = []
    versions: list[int] = []
    barrier = threading.Barrier(6)

    def migrate() -> None:
        try:
            barrier.wait()
            ledger = open_ledger(url, migrate=False)
            try:
                versions.append(ledger.migrate())
            finally:
                ledger.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(versions)) == 1
    with _raw(url) as conn:
        rows = conn.execute(sql.SQL("SELECT version FROM {}.schema_version").format(
            sql.Identifier(schema))).fetchall()
    assert rows == [(versions[0],)]


def test_must_exist_refuses_an_empty_schema(pg: tuple[str, str]) -> None:
    url, _ = pg
    from ratchet.errors import LedgerUnavailable

    with pytest.raises(LedgerUnavailable, match="no Ratchet ledger"):
        open_ledger(url, must_exist=True)


def test_durability_maps_to_synchronous_commit(pg: tuple[str, str]) -> None:
    url, _ = pg
    for level, expected in (("fsync", "on"), ("buffered", "off")):
        ledger = open_ledger(with_params(url, durability=level))
        try:
            stats = ledger.stats()
            assert stats.durability == level
            assert stats.backend_settings["synchronous_commit"] == expected
        finally:
            ledger.close()


def test_replicated_without_a_synchronous_standby_is_refused(pg: tuple[str, str]) -> None:
    url, _ = pg
    with pytest.raises(ConfigError, match="synchronous standby"):
        open_ledger(with_params(url, durability="replicated"))


def test_submit_notifies_subscribers(pg: tuple[str, str]) -> None:
    url, _ = pg
    ledger = open_ledger(url)
    woke = threading.Event()
    calls: list[float] = []

    def on_ready() -> None:
        calls.append(time.monotonic())
        woke.set()

    sub = ledger.subscribe(on_ready)
    try:
        assert woke.wait(5), "no initial wake-up after LISTEN"  # one per connect
        woke.clear()
        n = len(calls)
        ledger.submit([_task()])
        assert woke.wait(5), "no NOTIFY after submit"
        assert len(calls) > n
    finally:
        sub.close()
        ledger.close()


def _claim_one(ledger: Ledger, holder: str) -> str:
    claims = ledger.claim(holder, ["pg.task"], 10)
    assert len(claims) == 1
    return claims[0].task_id


def test_revoke_holder_bumps_generation_and_makes_tasks_claimable(pg: tuple[str, str]) -> None:
    url, _ = pg
    ledger = open_ledger(url)
    try:
        ledger.register_worker(WorkerInfo("dead-holder", "host-a", "a", 999_999, None))
        ledger.submit([_task(), _task(max_attempts=1)])
        claims = ledger.claim("dead-holder", ["pg.task"], 10)
        assert len(claims) == 2
        taken = ledger.revoke_holder("dead-holder", by="peer", reason="process gone")
        assert sorted(taken) == sorted(c.task_id for c in claims)
        infos = {i.task_id: i for i in ledger.get_many(taken)}
        by_attempts = {c.max_attempts: c for c in claims}
        retried = infos[by_attempts[3].task_id]
        final = infos[by_attempts[1].task_id]
        assert retried.state is State.RETRY_WAIT and retried.generation == 2
        assert final.state is State.FAILED and final.generation == 2
        # Ready at once for another worker; the dead holder's late write is fenced out.
        again = ledger.claim("peer", ["pg.task"], 10)
        assert [c.task_id for c in again] == [retried.task_id]
        assert again[0].generation == 3
        assert ledger.list_workers("host-a") == []
        assert ledger.stats().revocations == 1
    finally:
        ledger.close()


def test_claim_plan_uses_the_ready_index_with_many_finished_tasks(pg: tuple[str, str]) -> None:
    """The claim must stay an index scan of the partial ready set: finished tasks are not in
    ``tasks_ready``, so their number cannot slow a claim (the benchmark shows 10k vs 1M)."""
    from ratchet.ledger.base import ClaimScope, claim_kinds
    from ratchet.ledger.ops.flowclaims import entries_of, entry_params
    from ratchet.ledger.postgres import CLAIM_READY_SQL

    url, schema = pg
    ledger = open_ledger(url)
    try:
        ledger.submit([_task() for _ in range(20)])
        with _raw(url) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(
                "INSERT INTO tasks (id, name, version, params, params_digest, state, generation,"
                " attempt, max_attempts, lease_s, run_at, created_at, updated_at)"
                " SELECT 'done-' || g, 'pg.task', 1, '{}', 'd', 'SUCCEEDED', 1, 1, 3, 30,"
                " g, g, g FROM generate_series(1, 50000) AS g"
            )
            conn.execute("ANALYZE tasks")
            conn.execute("BEGIN")
            plan = "\n".join(
                str(r[0]) for r in conn.execute(
                    "EXPLAIN " + CLAIM_READY_SQL,
                    {**entry_params(entries_of(claim_kinds([("pg.task", 1)]), [], None),
                                    ClaimScope(), time.time(), 10), "holder": "h"},
                )
            )
            conn.execute("ROLLBACK")
        assert "tasks_ready" in plan, plan
        assert "Seq Scan on tasks" not in plan, plan
        assert len(ledger.claim("h", ["pg.task"], 10)) == 10
    finally:
        ledger.close()


def test_long_schema_names_get_a_valid_notify_channel() -> None:
    with private_schema("rt_" + "x" * 40) as (url, _):
        ledger = open_ledger(url)
        try:
            assert len(ledger.submit([_task()])) == 1  # pg_notify accepted the channel
        finally:
            ledger.close()


def test_pool_recovers_at_once_after_its_connections_are_killed(pg: tuple[str, str]) -> None:
    url, schema = pg
    # Named after the schema: a second copy of the suite on the same server has its own.
    victim = f"kill_{schema}"
    ledger = open_ledger(with_params(url, application_name=victim, pool_size="4"))
    try:
        ledger.submit([_task() for _ in range(4)])
        for _ in range(3):
            with _raw(url) as conn:
                killed = conn.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = %s", (victim,),
                ).fetchone()
            assert killed is not None and killed[0] >= 1
            # Every operation right after the kill works: the pool is checked and refilled.
            assert ledger.now() > 0
            assert len(ledger.claim("h", ["pg.task"], 1)) == 1
    finally:
        ledger.close()


def test_libpq_url_keeps_a_local_socket_url_intact() -> None:
    from ratchet.config import parse_ledger_url
    from ratchet.ledger.postgres import libpq_url

    cfg = parse_ledger_url("postgresql:///test?host=127.0.0.1&user=postgres&schema=s&options=-c%20x%3D1")
    assert libpq_url(cfg) == "postgresql:///test?host=127.0.0.1&user=postgres&options=-c%20x%3D1"


def test_multi_host_urls_reach_libpq_whole() -> None:
    """Several hosts, as libpq takes them (how workers find the new primary after a
    failover): parsed, each port checked, passed to libpq with target_session_attrs."""
    from ratchet.config import Durability, parse_ledger_url
    from ratchet.ledger.postgres import libpq_url

    cfg = parse_ledger_url(
        "postgresql://postgres@127.0.0.1:5432,[::1]:5433,db3/test"
        "?target_session_attrs=read-write&durability=replicated&schema=s&connect_timeout=2"
    )
    assert cfg.durability is Durability.REPLICATED
    url = libpq_url(cfg)
    assert url == (
        "postgresql://postgres@127.0.0.1:5432,[::1]:5433,db3/test"
        "?target_session_attrs=read-write&connect_timeout=2"
    )
    assert psycopg.conninfo.conninfo_to_dict(url) == {
        "user": "postgres", "dbname": "test", "host": "127.0.0.1,::1,db3",
        "port": "5432,5433,", "target_session_attrs": "read-write", "connect_timeout": "2",
    }
    for bad, reason in (("h1:5432,h2:x", "'x'"), ("h1:5432,h2:70000", "out of range")):
        with pytest.raises(ConfigError, match=reason):
            parse_ledger_url(f"postgresql://u@{bad}/test")


def test_the_urls_connect_timeout_is_the_one_every_connection_uses() -> None:
    """psycopg's connect_timeout keyword overrides the URL's, so the ledger reads the URL's
    itself (a failover over a multi-host URL waits that long on a vanished host)."""
    from ratchet.config import parse_ledger_url
    from ratchet.ledger.postgres import DEFAULT_CONNECT_TIMEOUT_S, connect_timeout_s

    base = "postgresql://u@h1,h2/test"
    assert connect_timeout_s(parse_ledger_url(base)) == DEFAULT_CONNECT_TIMEOUT_S
    assert connect_timeout_s(parse_ledger_url(f"{base}?connect_timeout=2")) == 2
    with pytest.raises(ConfigError, match="connect_timeout must be a whole number"):
        connect_timeout_s(parse_ledger_url(f"{base}?connect_timeout=soon"))


def test_non_ascii_names_and_keys_with_a_latin1_client_encoding(pg: tuple[str, str]) -> None:
    """Statements travel with their parameters bound in, as UTF-8: a URL (or PGCLIENTENCODING)
    asking for another client encoding must not garble names and keys (found by review: a
    task named 'tâche' was never claimed and a keyed re-submit raised KeyError)."""
    from ratchet import App, TaskContext
    from ratchet.testing import running_worker, wait_for

    url, _ = pg
    app = App(with_params(url, client_encoding="LATIN1"))

    @app.task(name="tâche")
    def tache(ctx: TaskContext, n: int) -> int:
        return ctx.step("double", lambda: n * 2)

    try:
        plain = app.submit("tâche", {"n": 1})
        keyed = app.submit("tâche", {"n": 2}, idempotency_key="clé-€")
        again = app.submit("tâche", {"n": 2}, idempotency_key="clé-€")
        assert again.task_id == keyed.task_id and not again.created
        with running_worker(app, concurrency=2):
            wait_for("both tasks to succeed", lambda: all(
                app.get(h.task_id).state is State.SUCCEEDED for h in (plain, keyed)),
                timeout_s=30)
        assert [app.get(h.task_id).result for h in (plain, keyed)] == [2, 4]
        info = app.get(keyed.task_id)
        assert (info.name, info.idempotency_key) == ("tâche", "clé-€")
    finally:
        app.close()


def test_renew_does_not_wait_for_a_locked_task_row(pg: tuple[str, str]) -> None:
    """A task row locked by another transaction (a transaction step running its user code)
    must not hold up the renewal of the worker's other leases: the locked lease is reported
    held at its current lease_until, the others are extended, and the renewal returns
    while the lock is still held. Once the lock is gone the next renewal extends it."""
    url, schema = pg
    ledger = open_ledger(url)
    try:
        ledger.submit([_task(), _task()])
        claims = ledger.claim("w", ["pg.task"], 2)
        assert len(claims) == 2
        locked, free = sorted(claims, key=lambda c: c.task_id)
        leases = [(c.task_id, c.generation) for c in (locked, free)]
        with _raw(url) as holder_of_lock:
            holder_of_lock.execute("BEGIN")
            holder_of_lock.execute(sql.SQL("SELECT 1 FROM {}.tasks WHERE id = %s FOR UPDATE")
                                   .format(sql.Identifier(schema)), (locked.task_id,))
            done: list[list[RenewResult]] = []
            renewer = threading.Thread(target=lambda: done.append(ledger.renew("w", leases)))
            renewer.start()
            renewer.join(timeout=20.0)
            assert not renewer.is_alive(), "renew waited for another transaction's row lock"
            results = {r.task_id: r for r in done[0]}
            assert results[locked.task_id].ok and not results[locked.task_id].extended
            assert results[locked.task_id].lease_until == pytest.approx(locked.lease_until)
            assert results[free.task_id].ok and results[free.task_id].extended
            assert (results[free.task_id].lease_until or 0.0) > free.lease_until
            holder_of_lock.execute("ROLLBACK")
        again = {r.task_id: r for r in ledger.renew("w", leases)}
        assert again[locked.task_id].ok and again[locked.task_id].extended
        assert (again[locked.task_id].lease_until or 0.0) > locked.lease_until
        # A lease that is really gone is still reported lost.
        lost = ledger.renew("w", [(locked.task_id, locked.generation + 1)])
        assert [(r.ok, r.extended) for r in lost] == [(False, False)]
    finally:
        ledger.close()


def test_transaction_steps_never_take_the_whole_pool(pg: tuple[str, str]) -> None:
    """Transaction steps hold a pooled connection while user code runs; at most
    ``pool_size - 2`` of them run at once, so the writer and the heartbeat always get a
    connection (a starved heartbeat loses every lease of the worker)."""
    from ratchet import App, RetryPolicy, State, TaskContext
    from ratchet.testing import wait_for
    from ratchet.testing.worker import running_worker

    url, _schema = pg
    app = App(with_params(url, pool_size="3"))  # one slot for user code
    inside = [0]
    most = [0]
    lock = threading.Lock()

    @app.task(name="t.slow_tx", retry=RetryPolicy(max_attempts=3), lease_s=3.0)
    def slow_tx(ctx: TaskContext, i: int) -> int:
        def fn(conn: psycopg.Connection[tuple[object, ...]]) -> int:
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            try:
                conn.execute("SELECT pg_sleep(0.3)")
            finally:
                with lock:
                    inside[0] -= 1
            return i

        return int(ctx.transaction("slow", fn))

    try:
        handles = [app.submit("t.slow_tx", {"i": i}) for i in range(4)]
        with running_worker(app, concurrency=4, prefetch=0):
            wait_for("every task to finish",
                     lambda: all(h.get().state is State.SUCCEEDED for h in handles),
                     timeout_s=60)
        assert most[0] == 1, "more transaction steps at once than the pool leaves room for"
        assert [h.get().result for h in handles] == [0, 1, 2, 3]
    finally:
        app.close()
