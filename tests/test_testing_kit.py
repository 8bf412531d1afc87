"""``ratchet.testing``: the counting service, the checks and process control, for real.

The counting service runs in its own process on loopback; the checks read real ledgers
(both backends) that a real in-process worker filled, and are shown to *fail* on a
duplicate, a stray execution, an unfinished task, a wrong recorded result and a tampered
generation; worker processes get real signals.
"""

from __future__ import annotations

import signal
import sqlite3
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from ratchet import NOT_FOUND, App, RatchetError, State, TaskContext
from ratchet.config import parse_ledger_url
from ratchet.testing import (
    CheckFailed,
    ConditionTimeout,
    CountingClient,
    CountingService,
    ProcessGroup,
    check_exactly_once,
    check_ledger_consistent,
    list_task_ids,
    running_worker,
    start_counting_service,
    wait_for,
)

# ---------------------------------------------------------------------------- the service


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    svc = start_counting_service(tmp_path / "svc.db")
    try:
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def client(service: CountingService) -> Iterator[CountingClient]:
    with service.client(timeout_s=5.0) as c:
        yield c


def test_service_honours_the_key_and_counts_in_its_own_file(
    service: CountingService, client: CountingClient
) -> None:
    assert client.lookup("k1") is NOT_FOUND
    first = client.execute("k1", {"amount": 5})
    assert first["replayed"] is False and first["body"] == {"amount": 5}
    again = client.execute("k1", {"amount": 5})
    assert again["replayed"] is True and again["id"] == first["id"]
    with pytest.raises(httpx.HTTPStatusError) as conflict:
        client.execute("k1", {"amount": 6})
    assert conflict.value.response.status_code == 422
    found = client.lookup("k1")
    assert isinstance(found, dict) and found["id"] == first["id"]
    records = service.records()
    assert records.executions == {"k1": 1} == client.executions()
    assert records.ids == {"k1": first["id"]}
    stats = client.stats()
    assert (stats["replays"], stats["lookups"], stats["lookups_found"]) == (1, 2, 1)


def test_service_without_key_honouring_executes_every_post(tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "legacy.db", honour_keys=False) as svc:
        with svc.client() as c:
            ids = {c.execute("k", {"n": 1})["id"] for _ in range(3)}
        assert len(ids) == 3
        assert svc.executions() == {"k": 3}
        assert [k for _, k in svc.records().times] == ["k", "k", "k"]


def test_service_faults(service: CountingService, client: CountingClient) -> None:
    # A 503 executes nothing and says when to come back.
    client.set_faults(fail_next_503=1)
    with pytest.raises(httpx.HTTPStatusError) as busy:
        client.execute("a", {})
    assert busy.value.response.status_code == 503
    assert busy.value.response.headers["Retry-After"] == "0.2"
    assert service.executions() == {}
    # A lost reply: executed and committed, the client sees the connection dropped.
    client.set_faults(reply_lost_next=1)
    with pytest.raises(httpx.TransportError):
        client.execute("b", {})
    assert service.executions() == {"b": 1}
    # A slow reply outlasts the client's timeout; the execution lands afterwards.
    client.set_faults(slow_next=1, slow_s=1.0)
    with CountingClient(service.url, timeout_s=0.2) as impatient, pytest.raises(
        httpx.ReadTimeout
    ):
        impatient.execute("c", {})
    wait_for("the slow execution to land", lambda: service.executions().get("c") == 1, 10)
    injected = client.stats()["injected"]
    assert (injected["503"], injected["reply_lost"], injected["slow"]) == (1, 1, 1)
    with pytest.raises(httpx.HTTPStatusError) as bad:
        client.set_faults(reply_lost=2.0)
    assert bad.value.response.status_code == 400


# ---------------------------------------------------------------------------- the checks


def _app(ledger_url: str, pay_url: str) -> App:
    app = App(ledger_url)

    @app.task(name="kit.pay", lease_s=5.0)
    def pay(ctx: TaskContext, order: str) -> dict[str, Any]:
        with CountingClient(pay_url) as c:
            return ctx.effect(  # type: ignore[no-any-return]
                "pay",
                lambda key: c.execute(key, {"order": order}),
                key=f"pay:{order}",
                lookup=c.lookup,
                idempotent=True,
            )

    return app


def _tamper(ledger_url: str, statement: str) -> None:
    """Corrupt the ledger behind Ratchet's back (the test's own SQL)."""
    config = parse_ledger_url(ledger_url)
    if config.scheme == "sqlite":
        conn = sqlite3.connect(config.path)
        with conn:
            conn.execute(statement)
        conn.close()
        return
    base = ledger_url.split("?")[0]
    schema = config.options["schema"]
    with psycopg.connect(base, autocommit=True) as pg:
        pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        pg.execute(statement.encode())


def test_checks_pass_on_a_clean_run_and_name_every_violation(
    ledger_url: str, service: CountingService, client: CountingClient
) -> None:
    app = _app(ledger_url, service.url)
    try:
        handles = [app.submit("kit.pay", {"order": f"o{i}"}) for i in range(3)]
        with running_worker(app, concurrency=2):
            for h in handles:
                assert app.wait(h.task_id, timeout_s=30).state is State.SUCCEEDED
        ids = [h.task_id for h in handles]
        # Oldest first, but tasks created in the same clock tick (SQLite: 1 ms) tie.
        assert sorted(list_task_ids(ledger_url)) == sorted(ids)

        report = check_exactly_once(ledger_url, service, effect="pay", result_id_field="id")
        assert report.ok and report.succeeded_once == 3 and report.tasks == 3
        assert check_ledger_consistent(ledger_url).ok

        # An unfinished task, and an execution no task accounts for.
        pending = app.submit("kit.pay", {"order": "late"}).task_id
        client.execute("stray", {})
        with pytest.raises(CheckFailed) as failed:
            check_exactly_once(ledger_url, service, effect="pay", result_id_field="id")
        assert isinstance(failed.value, AssertionError | RatchetError)
        message = str(failed.value)
        assert f"{pending}: PENDING" in message and "stray: 1" in message
        rep = check_exactly_once(
            ledger_url, service, task_ids=ids, effect="pay", allow_unexpected=True
        )
        assert rep.ok

        # A second execution of a succeeded task's key (a target that stopped honouring
        # keys): duplicated, and the ledger no longer names the service's latest record.
        client.set_faults(honour_keys=False)
        client.execute("pay:o1", {"order": "o1"})
        dup = check_exactly_once(
            ledger_url, service, task_ids=ids, effect="pay", result_id_field="id",
            raise_on_violation=False,
        )  # fmt: skip
        assert dup.duplicated == {"pay:o1": 2}
        assert list(dup.mismatched) == [ids[1]]
        assert dup.succeeded_once == 2 and dup.unexpected == {"stray": 1}
        assert len(dup.violations) == 3, dup.violations

        # A generation bumped without its audit row.
        _tamper(ledger_url, f"UPDATE tasks SET generation = generation + 1 WHERE id = '{ids[0]}'")
        broken = check_ledger_consistent(ledger_url, raise_on_violation=False)
        assert any(ids[0] in v and "audit rows account for 1" in v for v in broken.violations)
        with pytest.raises(CheckFailed):
            check_ledger_consistent(ledger_url, task_ids=[ids[0]])
    finally:
        app.close()


# ---------------------------------------------------------------------------- processes


def test_wait_for_fails_with_the_condition_named() -> None:
    assert wait_for("a value", lambda: 7, 1.0) == 7
    with pytest.raises(ConditionTimeout, match="waiting for nothing") as exc:
        wait_for("nothing", lambda: None, 0.1, 0.01)
    assert isinstance(exc.value, AssertionError) and isinstance(exc.value, RatchetError)


def test_worker_process_signals_and_holder(ledger_url: str, tmp_path: Path) -> None:
    (tmp_path / "kitapp.py").write_text(
        textwrap.dedent(
            """
            import ratchet
            app = ratchet.App()

            @app.task(name="kit.noop")
            def noop(ctx):
                return {}
            """
        )
    )
    with ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path]) as procs:
        w = procs.worker("kitapp:app", ledger_url, name="w")
        holder = w.holder()
        assert f":{w.pid}:" in holder
        w.pause()
        assert w.status() == "stopped"
        w.resume()
        wait_for("the worker to run again", lambda: w.status() != "stopped", 10)
        assert w.stop() == 0, w.log()
        victim = procs.worker("kitapp:app", ledger_url, name="victim")
        victim.holder()
        assert victim.kill() == -signal.SIGKILL
        assert "victim" in procs.dump()
        lingering = procs.python("sleeper", "import time; time.sleep(60)")
    assert lingering.returncode == -signal.SIGKILL  # cleanup killed it
