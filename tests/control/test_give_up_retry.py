"""``resolve --outcome give-up`` and ``ratchet retry`` (DESIGN §3: FAILED is
the dead-letter state, left only by an operator's audited retry), on both ledgers, with a
real in-process worker and the counting service counting executions at the external side.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, PermanentError, RetryPolicy, State, TaskContext
from ratchet.cli.main import cli
from ratchet.errors import InvalidArguments
from ratchet.testing import (
    check_ledger_consistent,
    running_worker,
    start_counting_service,
    wait_for,
)

pytestmark = pytest.mark.timeout(90)

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.02, max_delay_s=0.1, jitter=0.0)


def test_give_up_fails_an_unknown_task_and_marks_its_effects(
    ledger_url: str, tmp_path: Path
) -> None:
    """An effect whose reply is lost at a target with neither lookup nor dedupe sends its
    task to UNKNOWN; ``not-done`` lets it call again (lost again: UNKNOWN again); give-up
    ends it FAILED with the operator's reason, its open effect marked ``given_up``. A
    ``--result`` with not-done / give-up is refused. Retried, the task does not call the
    given-up effect blindly again: it goes back to UNKNOWN (never re-sent without proof)."""
    app = App(ledger_url)
    with start_counting_service(tmp_path / "svc.db", honour_keys=False) as svc:
        client = svc.client()

        @app.task(name="g.charge", retry=FAST)
        def charge(ctx: TaskContext, order: str) -> Any:
            return ctx.effect("charge", lambda key: client.execute(key, {"o": order}),
                              key=f"charge:{order}")

        try:
            handle = app.submit("g.charge", {"order": "o1"})
            tid = handle.task_id
            with running_worker(app), Control(app=app) as control:
                client.set_faults(reply_lost_next=1)
                assert app.wait(tid, timeout_s=20).state is State.UNKNOWN
                with pytest.raises(InvalidArguments):
                    control.resolve(tid, "not-done", {"x": 1}, reason="r", by="op")
                result = CliRunner().invoke(cli, [
                    "resolve", tid, "--outcome", "give-up", "--result", "{}",
                    "--reason", "r", "--ledger", ledger_url])
                assert result.exit_code == 2 and "--result" in result.output
                assert control.get(tid).state is State.UNKNOWN
                client.set_faults(reply_lost_next=1)
                control.resolve(tid, "not-done", reason="PSP says no", by="op")
                # Wait for the second lost reply's UNKNOWN (not the one just resolved).
                wait_for("UNKNOWN again", lambda: control.get(tid).state is State.UNKNOWN
                         and len(
                             [e for e in control.inspect(tid).events
                              if e.to_state == "UNKNOWN"]) == 2, timeout_s=20)
                before = control.get(tid)
                result = CliRunner().invoke(cli, [
                    "resolve", tid, "--outcome", "give-up", "--reason", "PSP cannot tell",
                    "--operator", "alice", "--ledger", ledger_url])
                assert result.exit_code == 0, result.output
                info = control.get(tid)
                assert info.state is State.FAILED
                assert info.generation == before.generation + 1
                assert "PSP cannot tell" in (info.last_error or "")
                assert info.error_class == "given_up"
                view = control.inspect(tid)
                assert [e.state for e in view.effects] == ["given_up"]
                [event] = [e for e in view.events if e.kind == "operator_resolve"
                           and e.detail.get("outcome") == "give-up"]
                assert event.detail["operator"] == "alice"
                assert event.detail["reason"] == "PSP cannot tell"
                assert (event.from_state, event.to_state) == ("UNKNOWN", "FAILED")
                assert svc.executions() == {"charge:o1": 2}
                out = control.retry(tid, reason="try once more", by="bob")
                assert (out.outcome, out.state) == ("done", State.PENDING)
                assert app.wait(tid, timeout_s=20).state is State.UNKNOWN
                assert svc.executions() == {"charge:o1": 2}  # not re-sent without proof
        finally:
            client.close()
            app.close()


def test_retry_runs_a_failed_task_again_from_its_checkpoint(
    ledger_url: str, tmp_path: Path
) -> None:
    """A task fails permanently after a step and an effect; ``retry`` gives it a fresh set
    of attempts (attempt 1 of 1 again), generation + 1, audited; it really runs again: its
    done step and effect are not repeated (counted at the service), the rest runs and it
    succeeds. SUCCEEDED and CANCELLED never move; CLI exit codes follow the outcome."""
    app = App(ledger_url)
    fail = threading.Event()
    fail.set()
    steps: list[str] = []
    with start_counting_service(tmp_path / "svc.db") as svc:
        client = svc.client()

        @app.task(name="r.flow", retry=RetryPolicy(max_attempts=1))
        def flow(ctx: TaskContext, order: str) -> Any:
            ctx.step("prepare", lambda: steps.append("prepare") or 1)
            ctx.effect("charge", lambda key: client.execute(key, {"o": order}),
                       key=f"charge:{order}", lookup=client.lookup, idempotent=True)
            if fail.is_set():
                raise PermanentError("the downstream rejected it")
            return ctx.effect("notify", lambda key: client.execute(key, {"o": order}),
                              key=f"notify:{order}", lookup=client.lookup, idempotent=True)

        try:
            handle = app.submit("r.flow", {"order": "o1"})
            tid = handle.task_id
            with running_worker(app), Control(app=app) as control:
                failed = app.wait(tid, timeout_s=20)
                assert failed.state is State.FAILED and failed.attempt == 1
                fail.clear()
                out = control.retry(tid, reason="downstream fixed", by="op")
                assert (out.outcome, out.previous_state, out.state) == (
                    "done", State.FAILED, State.PENDING)
                assert out.generation == failed.generation + 1
                done = app.wait(tid, timeout_s=20)
                assert done.state is State.SUCCEEDED
                assert done.attempt == 1  # a fresh set: attempt 1 of 1 again
                assert steps == ["prepare"]  # the done step stayed done
                assert svc.executions() == {"charge:o1": 1, "notify:o1": 1}
                view = control.inspect(tid)
                [event] = [e for e in view.events if e.kind == "operator_retry"]
                assert event.detail == {"operator": "op", "reason": "downstream fixed",
                                        "previous_attempts": 1}
                assert (event.from_state, event.to_state) == ("FAILED", "PENDING")
                again = control.retry(tid, reason="again", by="op")
                assert (again.outcome, again.state) == ("unchanged", State.SUCCEEDED)
                result = CliRunner().invoke(cli, ["retry", tid, "--reason", "x",
                                                  "--ledger", ledger_url])
                assert result.exit_code == 1, result.output
                other = app.submit("r.flow", {"order": "o2"}, delay_s=3600)
                control.cancel(other.task_id, reason="no", by="op")
                assert control.retry(other.task_id, reason="x", by="op").outcome == \
                    "unchanged"
                assert control.get(other.task_id).state is State.CANCELLED
            check_ledger_consistent(ledger_url)
        finally:
            client.close()
            app.close()
