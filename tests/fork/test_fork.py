"""``ratchet fork`` (DESIGN §8, fork) on both ledgers, with a real worker and the counting
service: a task whose version 1 fails for good at its fifth checkpoint is forked from its
fourth with version 2. The fork replays what came before the fork point (no step function
called, no effect sent, no message emitted again), sends the effects from the fork point on
with the same keys (the service deduplicates the one the original had sent), and succeeds;
the original stays FAILED. The link is on both tasks (Control, ``ratchet inspect``, the
HTTP API, the dashboard page) and audited on both. Bad input changes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
from forksupport import CHECKPOINTS, TASK, api_server, order_app

from ratchet import App, Control, State, TaskContext
from ratchet.errors import InvalidArguments, TaskNotFound
from ratchet.testing import start_counting_service, wait_for
from ratchet.testing.processes import clean_env
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ratchet.cli.main", *args],
                          env=clean_env({}), capture_output=True, text=True, timeout=60)


def test_fork_runs_the_rest_with_the_fixed_version(ledger_url: str, tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    with start_counting_service(tmp_path / "svc.db") as svc, \
            svc.client(timeout_s=10.0) as client:
        app = order_app(ledger_url, client, calls)
        try:
            with running_worker(app, concurrency=2):
                handle = app.submit(TASK, {"order": "o-1"}, version=1)
                original = handle.wait(timeout_s=60)
                assert original.state is State.FAILED, original
                assert "box size table" in (original.last_error or "")
                assert svc.executions() == {"charge:o-1": 1, "reserve:o-1": 1}
                with Control(ledger_url) as control:
                    before = control.inspect(handle.task_id)
                    assert [s.name for s in before.steps] == ["load", "ratchet:emit:orders"]
                    fork_id = control.fork(handle.task_id, "reserve", version=2,
                                           reason="box size table fixed", by="alice")
                done = app.wait(fork_id, timeout_s=60)
            assert done.state is State.SUCCEEDED, done
            assert done.version == 2 and done.params == {"order": "o-1"}
            assert done.result["box"] == "box-3" and done.result["amount"] == 42
            # Before the fork point: nothing again (load ran once, charge sent once: the
            # fork's result carries the original's charge record).
            assert calls["load"] == 1
            assert calls["pack"] == 2  # the original's failing one, the fork's
            assert svc.executions() == {"charge:o-1": 1, "reserve:o-1": 1, "ship:o-1": 1}
            stats = client.stats()
            assert stats["executions"] == 3
            # From the fork point on, the same keys: the service replayed "reserve" (the
            # original had sent it) instead of executing it twice.
            assert stats["replays"] == 1
            assert app.get(handle.task_id).state is State.FAILED

            with Control(ledger_url) as control:
                forked = control.inspect(fork_id)
                source = control.inspect(handle.task_id)
                messages = control.outbox_messages(100, topic="orders")
            assert [m.task_id for m in messages] == [handle.task_id]  # not emitted again
            # The reserved lineage step (no position) names the original.
            assert [s.name for s in forked.steps] == [
                "ratchet:lineage", "load", "ratchet:emit:orders", "pack"]
            assert forked.steps[0].result == handle.task_id
            assert [e.name for e in forked.effects] == ["charge", "reserve", "ship"]
            assert forked.effects[0].result == before.effects[0].result
            assert forked.task.generation > original.generation
            link = forked.forked_from
            assert link is not None and forked.forks == []
            assert (link.task_id, link.source_id, link.from_step, link.from_seq) == (
                fork_id, handle.task_id, "reserve", CHECKPOINTS.index("reserve"))
            assert (link.source_version, link.version, link.by, link.reason) == (
                1, 2, "alice", "box size table fixed")
            assert source.forked_from is None and source.forks == [link]
            [mine] = [e for e in forked.events if e.kind == "forked"]
            assert mine.detail["forked_from"] == handle.task_id
            assert (mine.detail["operator"], mine.detail["reason"]) == (
                "alice", "box size table fixed")
            assert (mine.detail["steps"], mine.detail["effects"]) == (2, 1)
            # Made above the original's generation: fencing tokens of shared keys rise.
            assert (mine.to_state, mine.generation) == ("PENDING", original.generation + 1)
            [theirs] = [e for e in source.events if e.kind == "forked"]
            assert theirs.detail["fork"] == fork_id and theirs.to_state == "FAILED"

            out = _cli("inspect", fork_id, "--ledger", ledger_url)
            assert out.returncode == 0, out.stderr
            assert f"forked from {handle.task_id} at step reserve" in out.stdout
            out = _cli("inspect", handle.task_id, "--ledger", ledger_url)
            assert f"forks: {fork_id} (at step reserve, version 2)" in out.stdout

            with api_server(Control(ledger_url)) as base:
                page = httpx.get(f"{base}/api/tasks/{fork_id}", timeout=30).json()
                assert page["forked_from"]["source_id"] == handle.task_id
                assert page["forked_from"]["from_step"] == "reserve"
                page = httpx.get(f"{base}/api/tasks/{handle.task_id}", timeout=30).json()
                assert [f["task_id"] for f in page["forks"]] == [fork_id]
                html = httpx.get(f"{base}/tasks/{fork_id}", timeout=30).text
                assert 'id="task-forked-from"' in html and handle.task_id in html
                html = httpx.get(f"{base}/tasks/{handle.task_id}", timeout=30).text
                assert 'id="task-fork-list"' in html and fork_id in html
                # Over HTTP: bad input is a 422 naming the recorded checkpoints; a fork a 201.
                url = f"{base}/api/tasks/{handle.task_id}/fork"
                bad = httpx.post(url, json={"from_step": "nope", "reason": "r"}, timeout=30)
                assert bad.status_code == 422 and "charge (effect)" in bad.text, bad.text
                missing = httpx.post(f"{base}/api/tasks/nope/fork",
                                     json={"from_step": "load", "reason": "r"}, timeout=30)
                assert missing.status_code == 404, missing.text
                made = httpx.post(url, json={"from_step": "load", "reason": "over http"},
                                  headers={"X-Ratchet-Operator": "carol"}, timeout=30)
                assert made.status_code == 201, made.text
                assert (made.json()["from_seq"], made.json()["version"],
                        made.json()["by"]) == (0, 1, "carol")
        finally:
            app.close()


def test_fork_through_the_cli(ledger_url: str, tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    with start_counting_service(tmp_path / "svc.db") as svc, \
            svc.client(timeout_s=10.0) as client:
        app = order_app(ledger_url, client, calls)
        try:
            with running_worker(app, concurrency=2):
                handle = app.submit(TASK, {"order": "o-2"}, version=1)
                assert handle.wait(timeout_s=60).state is State.FAILED
            # The worker registered versions 1 and 2: the CLI (no app) accepts 2.
            # "pack" failed, so it is not recorded: the fork point is the end.
            out = _cli("fork", handle.task_id, "--from-step", "pack", "--reason", "r",
                       "--ledger", ledger_url)
            assert out.returncode == 2 and "fork from 'ratchet:end'" in out.stderr
            out = _cli("fork", handle.task_id, "--from-step", "ratchet:end", "--version", "2",
                       "--reason", "fixed", "--operator", "bob", "--ledger", ledger_url,
                       "--json")
            assert out.returncode == 0, out.stderr
            record = json.loads(out.stdout)
            assert (record["source_id"], record["from_step"], record["from_seq"],
                    record["version"], record["by"]) == (
                        handle.task_id, "ratchet:end", CHECKPOINTS.index("pack"), 2, "bob")
            fork_id = record["task_id"]
            assert app.get(fork_id).state is State.PENDING
            with running_worker(app, concurrency=2):
                assert app.wait(fork_id, timeout_s=60).state is State.SUCCEEDED
            # Forked at the end: charge and reserve were before it, sent once in all.
            assert svc.executions() == {"charge:o-2": 1, "reserve:o-2": 1, "ship:o-2": 1}
            assert client.stats()["replays"] == 0
            out = _cli("fork", handle.task_id, "--from-step", "load", "--reason", "again",
                       "--ledger", ledger_url)
            assert out.returncode == 0 and "forked from" in out.stdout, out.stderr
            with Control(ledger_url) as control:
                assert len(control.fork_links(handle.task_id).forks) == 2
        finally:
            app.close()


def test_bad_input_changes_nothing(ledger_url: str) -> None:
    app = App(ledger_url)
    hold = Counter[str]()

    @app.task(name="fork.slow")
    def slow(ctx: TaskContext) -> int:
        ctx.step("first", lambda: 1)
        ctx.step("first", lambda: 2)
        hold["started"] += 1
        wait_for("the test to let go", lambda: hold["go"] > 0, 60, 0.02)
        return 3

    try:
        with running_worker(app, concurrency=1), Control(ledger_url) as control:
            running = app.submit("fork.slow", {})
            wait_for("the task to start", lambda: hold["started"] > 0, 30, 0.02)
            with pytest.raises(InvalidArguments, match="RUNNING: only an ended task"):
                control.fork(running.task_id, "first", reason="r")
            hold["go"] = 1
            assert running.wait(timeout_s=30).state is State.SUCCEEDED
            with pytest.raises(TaskNotFound):
                control.fork("no-such-task", "first", reason="r")
            with pytest.raises(InvalidArguments,
                               match=r"no checkpoint 'nope'.*in order: first \(step\), "
                                     r"first#2 \(step\)"):
                control.fork(running.task_id, "nope", reason="r")
            with pytest.raises(InvalidArguments, match=r"version 7 of 'fork.slow' is not "
                                                       r"known.*\(known: 1\)"):
                control.fork(running.task_id, "first", version=7, reason="r")
            with pytest.raises(InvalidArguments, match="reason"):
                control.fork(running.task_id, "first", reason=" ")
            assert control.fork_links(running.task_id).forks == ()
        # name#N is the N-th occurrence: the fork holds the first one only. Forked with no
        # worker running: one would claim the fork at once and record its first#2 again.
        with Control(ledger_url) as control:
            fork_id = control.fork(running.task_id, "first#2", reason="second time")
            assert [s.name for s in control.inspect(fork_id).steps] == [
                "ratchet:lineage", "first"]
            assert control.fork_links(fork_id).forked_from is not None
        out = _cli("fork", running.task_id, "--from-step", "nope", "--reason", "r",
                   "--ledger", ledger_url)
        assert out.returncode == 2
        assert "no checkpoint 'nope'" in out.stderr and "first#2 (step)" in out.stderr
        out = _cli("fork", running.task_id, "--from-step", "first", "--ledger", ledger_url)
        assert out.returncode == 2, out.stderr
    finally:
        app.close()
