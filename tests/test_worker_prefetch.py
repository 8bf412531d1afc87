"""Worker prefetch: tasks claimed beyond ``concurrency`` and held, leased, until a thread
is free (``Worker(..., prefetch=N)``, ``ratchet worker --prefetch N``).

Every test runs on both ledgers (the ``ledger_url`` fixture of tests/conftest.py). What is
checked: bodies never run more than ``concurrency`` at once; the heartbeat keeps prefetched
leases; a graceful stop releases prefetched tasks that had not started (``PENDING``, attempt
handed back, body never run) and another worker runs them later; exactly-once still holds
with several prefetching workers on one ledger.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, State, SubmitRequest, TaskContext, Worker, open_ledger
from ratchet.app import MIN_LEASE_S
from ratchet.cli.main import cli
from ratchet.errors import ConfigError
from ratchet.testing import wait_for
from ratchet.worker.runner import default_prefetch

pytestmark = pytest.mark.timeout(60)


def test_default_prefetch_and_bad_values(app: App) -> None:
    @app.task(name="t.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    assert Worker(app, concurrency=1).prefetch == default_prefetch(1) == 4
    assert Worker(app, concurrency=4).prefetch == 16
    assert Worker(app, concurrency=8).prefetch == 32
    assert Worker(app, concurrency=100).prefetch == 32
    assert Worker(app, concurrency=2, prefetch=0).prefetch == 0
    with pytest.raises(ConfigError):
        Worker(app, concurrency=2, prefetch=-1)


def test_bodies_never_exceed_concurrency_with_prefetch(app: App) -> None:
    lock = threading.Lock()
    running = 0
    most_running = 0
    most_held = 0
    runs: Counter[int] = Counter()
    worker: Worker | None = None

    @app.task(name="t.count")
    def count(ctx: TaskContext, i: int) -> int:
        nonlocal running, most_running, most_held
        with lock:
            running += 1
            most_running = max(most_running, running)
            assert worker is not None
        # What the ledger holds for the worker (RUNNING rows): the bound is on leases. The
        # heartbeat's in-memory set briefly holds both a commit's new claims and the
        # completions that same commit ended (more than the bound for a moment, never in
        # the ledger), so it is not what is asserted.
        held = len(control.list_tasks(state="RUNNING", limit=100).tasks)
        with lock:
            most_held = max(most_held, held)
        try:
            ctx.step("work", lambda: time.sleep(0.002))
            with lock:
                runs[i] += 1
            return i
        finally:
            with lock:
                running -= 1

    control = Control(app=app)
    handles = app.submit_many([SubmitRequest("t.count", {"i": i}) for i in range(60)])
    worker = Worker(app, concurrency=2, prefetch=6, poll_interval_s=0.01)
    stats = worker.run(max_tasks=60)
    assert stats.succeeded == 60
    assert most_running <= 2, f"{most_running} bodies ran at once with concurrency 2"
    assert most_held > 2, "the worker never held more tasks than its threads (no prefetch)"
    assert most_held <= 8
    assert runs == Counter(range(60))
    assert all(h.get().state is State.SUCCEEDED for h in handles)


def test_graceful_stop_releases_prefetched_tasks_unstarted(app: App, ledger_url: str) -> None:
    """A task body blocks while three more tasks are prefetched behind it for longer than a
    lease: the heartbeat keeps all four (no takeover). On stop, the running one finishes
    and the three are released without running; a second worker runs them."""
    started: list[int] = []
    first_in, go = threading.Event(), threading.Event()

    @app.task(name="t.block", lease_s=MIN_LEASE_S)
    def block(ctx: TaskContext, i: int) -> int:
        started.append(i)
        if len(started) == 1:
            first_in.set()
            assert go.wait(30)
        return i

    handles = app.submit_many([SubmitRequest("t.block", {"i": i}) for i in range(4)])
    worker = Worker(app, concurrency=1, prefetch=3, poll_interval_s=0.01)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thief = open_ledger(ledger_url)
    try:
        assert first_in.wait(10)
        wait_for("four leases held", lambda: len(worker.heartbeat.held()) == 4, timeout_s=10.0)
        # Three renewal rounds (one every third of a lease) span more than a full lease
        # since the claim: the prefetched leases were renewed, so none can be taken over.
        renewals = worker.heartbeat.renewals
        wait_for("lease renewals", lambda: worker.heartbeat.renewals >= renewals + 4,
                 timeout_s=10.0)
        assert thief.claim("thief", ["t.block"], 10) == []
        assert {h.get().state for h in handles} == {State.RUNNING}
        worker.stop()
        go.set()
        thread.join(20)
        assert not thread.is_alive()
    finally:
        go.set()
        thread.join(20)
    assert len(started) == 1, f"prefetched task bodies started after stop: {started}"
    first = started[0]
    assert worker.stats.claimed == 4
    assert worker.stats.succeeded == 1
    assert worker.stats.released == 3
    try:
        for h in handles:
            info = h.get()
            if info.params == {"i": first}:
                assert info.state is State.SUCCEEDED
                continue
            assert info.state is State.PENDING
            assert info.holder is None
            assert info.attempt == 0, "a release of an unstarted task hands its attempt back"
            kinds = [(e.kind, e.to_state) for e in thief.timeline(h.task_id).events]
            assert kinds == [("claim", State.RUNNING), ("transition", State.PENDING)]
        later = Worker(app, concurrency=1, prefetch=3, poll_interval_s=0.01)
        assert later.run(max_tasks=3).succeeded == 3
        assert sorted(started[1:]) == sorted({0, 1, 2, 3} - {first})
        for h in handles:
            info = h.get()
            assert info.state is State.SUCCEEDED
            if info.params != {"i": first}:
                assert (info.attempt, info.generation) == (1, 2)
    finally:
        thief.close()


def test_cli_worker_accepts_prefetch(app: App) -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--prefetch" in result.output
    bad = CliRunner().invoke(cli, ["worker", "x:app", "--prefetch", "-1"])
    assert bad.exit_code == 2
