"""A fork's lineage (DESIGN §8, fork) on both ledgers: ``ratchet.fencing`` keys its fence
and done markers by the lineage id, so a fenced step the original committed is not run
again by a fork (before or after the fork point); one task of a lineage runs at a time (a
retry, a compensate or a new fork is refused while another task of the lineage has not
ended) and each one that starts goes above every generation of the lineage; a fork checks
the params against the pinned version when it has the App; ``name#1`` names the first
occurrence."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import forkapp
import httpx
import pytest
from forksupport import api_server

from ratchet import App, Control, PermanentError, RetryPolicy, State, TaskContext
from ratchet.errors import IllegalTransition, InvalidArguments
from ratchet.fencing import create_fence_tables, fenced_step
from ratchet.testing import fast_retry_policy, wait_for
from ratchet.testing.processes import clean_env
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ratchet.cli.main", *args],
                          env=clean_env({}, pythonpath=[HERE]), capture_output=True,
                          text=True, timeout=60)


def _credits(path: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(path) as conn:
        return [(str(a), int(c)) for a, c in conn.execute(
            "SELECT account, cents FROM credits ORDER BY rowid")]


def test_a_fork_does_not_run_the_originals_fenced_steps_again(ledger_url: str,
                                                               tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.db"
    with sqlite3.connect(accounts, isolation_level=None) as conn:
        conn.execute("CREATE TABLE credits (account TEXT, cents INTEGER)")
        create_fence_tables(conn)
    app = App(ledger_url)
    broken = {"on": True}
    seen: list[tuple[str, str, int, Any]] = []

    @app.task(name="lineage.credit", retry=RetryPolicy(max_attempts=1))
    def credit(ctx: TaskContext, account: str, cents: int) -> Any:
        ctx.step("load", lambda: {"account": account})
        conn = sqlite3.connect(accounts, isolation_level=None)
        try:
            def apply(conn: sqlite3.Connection) -> dict[str, int]:
                conn.execute("INSERT INTO credits VALUES (?, ?)", (account, cents))
                return {"credited": cents}

            done = fenced_step(conn, ctx, "credit", apply)
        finally:
            conn.close()
        seen.append((ctx.task_id, ctx.lineage_id, ctx.fencing_token, done))
        ctx.step("notify", lambda: 1)
        if broken["on"]:
            raise PermanentError("a bug after the credit")
        return done

    try:
        with running_worker(app, concurrency=1), Control(ledger_url) as control:
            original = app.submit("lineage.credit", {"account": "A", "cents": 100})
            assert original.wait(timeout_s=60).state is State.FAILED
            broken["on"] = False
            # The fenced step lies before the fork point.
            after = control.fork(original.task_id, "notify", reason="fixed", by="t")
            assert app.wait(after, timeout_s=60).state is State.SUCCEEDED
            # ... and after it (the fork runs that code again: the marker answers).
            before = control.fork(original.task_id, "load", reason="from the start", by="t")
            assert app.wait(before, timeout_s=60).state is State.SUCCEEDED
            # A fork of a fork belongs to the original's lineage.
            again = control.fork(after, "ratchet:end", reason="once more", by="t")
            assert app.wait(again, timeout_s=60).state is State.SUCCEEDED
        assert _credits(accounts) == [("A", 100)]
        assert [(t, lin) for t, lin, _, _ in seen] == [
            (original.task_id, original.task_id), (after, original.task_id),
            (before, original.task_id), (again, original.task_id)]
        assert all(done == {"credited": 100} for _, _, _, done in seen)
        tokens = [token for _, _, token, _ in seen]
        assert tokens == sorted(set(tokens)), tokens  # rising across the lineage
        with sqlite3.connect(accounts) as conn:
            fences = conn.execute("SELECT task_id, token FROM ratchet_fences").fetchall()
        assert fences == [(original.task_id, tokens[-1])]
    finally:
        app.close()


def _failed_task(app: App, ledger_url: str) -> str:
    @app.task(name="lineage.fails", retry=RetryPolicy(max_attempts=1))
    def fails(ctx: TaskContext) -> None:
        ctx.step("a", lambda: 1)
        ctx.step("b", lambda: 2)
        raise PermanentError("broken")

    with running_worker(app, concurrency=1):
        handle = app.submit("lineage.fails", {})
        assert handle.wait(timeout_s=60).state is State.FAILED
    return handle.task_id


def test_one_task_of_a_lineage_runs_at_a_time(ledger_url: str) -> None:
    app = App(ledger_url)
    try:
        task_id = _failed_task(app, ledger_url)
        with Control(ledger_url) as control:
            first = control.fork(task_id, "b", reason="fix", by="t")  # PENDING: no worker
            live = f"another task of its fork lineage has not ended.*{first}"
            with pytest.raises(IllegalTransition, match=f"cannot be retried: {live}"):
                control.retry(task_id, reason="and retry", by="t")
            with pytest.raises(IllegalTransition, match=f"cannot be compensated: {live}"):
                control.compensate(task_id, reason="undo", by="t")
            with pytest.raises(IllegalTransition, match=f"cannot be forked: {live}"):
                control.fork(task_id, "b", reason="a client's second try", by="t")
            with api_server(control) as base:
                answer = httpx.post(f"{base}/api/tasks/{task_id}/fork",
                                    json={"from_step": "b", "reason": "twice"},
                                    headers={"X-Ratchet-Operator": "t"}, timeout=30)
            assert answer.status_code == 409, answer.text
            assert control.get(task_id).state is State.FAILED
            assert len(control.fork_links(task_id).forks) == 1
        out = _cli("retry", task_id, "--reason", "r", "--ledger", ledger_url)
        assert out.returncode == 2 and "fork lineage" in out.stderr, (out.stdout, out.stderr)
        with Control(ledger_url) as control:
            control.cancel(first, reason="not this one", by="t")
            first_gen = control.get(first).generation
            # The lineage has no live task now: a new fork (of the fork) is allowed, above
            # every generation of the lineage; "a#1" names a's first occurrence.
            second = control.fork(first, "a#1", reason="again", by="t")
            link = control.fork_links(second).forked_from
            assert link is not None and link.from_step == "a"
            second_gen = control.get(second).generation
            assert second_gen > first_gen
            with pytest.raises(IllegalTransition, match="cannot be retried"):
                control.retry(task_id, reason="r", by="t")
            control.cancel(second, reason="not this one either", by="t")
            outcome = control.retry(task_id, reason="the original after all", by="t")
            assert outcome.outcome == "done"
            assert control.get(task_id).generation > control.get(second).generation
            with pytest.raises(IllegalTransition, match="cannot be forked"):
                control.fork(second, "ratchet:end", reason="r", by="t")
    finally:
        app.close()


def test_a_fork_checks_the_params_against_the_pinned_version(ledger_url: str) -> None:
    app = forkapp.app
    app.configure(ledger=ledger_url)
    try:
        with running_worker(app, concurrency=1):
            handle = app.submit(forkapp.TASK, {"n": 1}, version=1)
            assert handle.wait(timeout_s=60).state is State.FAILED
        with Control(app=app) as control:
            with pytest.raises(InvalidArguments, match=r"version 2.*'currency'"):
                control.fork(handle.task_id, "ratchet:end", version=2, reason="v2", by="t")
            assert control.fork_links(handle.task_id).forks == ()
        out = _cli("fork", handle.task_id, "--from-step", "a", "--version", "2", "--reason",
                   "v2", "--app", "forkapp:app", "--ledger", ledger_url)
        assert out.returncode == 2 and "'currency'" in out.stderr, (out.stdout, out.stderr)
        out = _cli("fork", handle.task_id, "--from-step", "a", "--reason", "v1 again",
                   "--app", "forkapp:app", "--ledger", ledger_url)
        assert out.returncode == 0, out.stderr
        with Control(ledger_url) as control:
            assert len(control.fork_links(handle.task_id).forks) == 1
    finally:
        app.close()


def test_a_quarantine_replay_leaves_a_forked_task_to_retry(ledger_url: str) -> None:
    app = App(ledger_url)
    policy = fast_retry_policy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05,
                               quarantine_after=2)

    @app.task(name="lineage.poison", retry=policy)
    def poison(ctx: TaskContext, order: int) -> None:
        ctx.step("a", lambda: order)
        raise RuntimeError(f"order {order} timed out")

    try:
        with running_worker(app, concurrency=2):
            handles = [app.submit("lineage.poison", {"order": n}) for n in (1, 2)]
            for h in handles:
                wait_for("quarantine", lambda h=h: h.get().state is State.FAILED, 30)
        with Control(ledger_url) as control:
            [group] = control.quarantine_list()
            control.fork(handles[0].task_id, "ratchet:end", reason="fix", by="t")
            report = control.quarantine_replay(group.fingerprint, 50.0, reason="fixed",
                                               by="t")
            assert [t.task_id for t in report.tasks] == [handles[1].task_id]
            assert handles[0].get().state is State.FAILED
    finally:
        app.close()


def test_concurrent_forks_of_one_task_make_one(ledger_url: str) -> None:
    app = App(ledger_url)
    try:
        task_id = _failed_task(app, ledger_url)
        gate = threading.Barrier(4, timeout=30)
        made: list[str] = []
        refused: list[BaseException] = []

        def fork_once(n: int) -> None:
            with Control(ledger_url) as control:
                gate.wait()
                try:
                    made.append(control.fork(task_id, "b", reason=f"try {n}", by="t"))
                except IllegalTransition as exc:
                    refused.append(exc)

        threads = [threading.Thread(target=fork_once, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(made) == 1 and len(refused) == 3, (made, refused)
        with Control(ledger_url) as control:
            assert [f.task_id for f in control.fork_links(task_id).forks] == made
    finally:
        app.close()
