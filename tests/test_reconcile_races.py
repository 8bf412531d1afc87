"""``ratchet reconcile --apply`` racing the rest of the system, on both ledgers: a lookup's
answer goes stale while it is in transit (an operator resolves the task, a worker runs it
again and its new call reaches the target); apply must not act on the old answer."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ratchet import NOT_FOUND, App, Control, OutcomeUnknownError, RetryPolicy, TaskContext
from ratchet.reconcile import ReconcileReport, reconcile
from ratchet.testing import running_worker
from ratchet.testing.processes import wait_for

pytestmark = pytest.mark.timeout(120)

TASK = "rr.send"


def test_apply_ignores_an_answer_about_an_older_intent(ledger_url: str) -> None:
    target: dict[str, Any] = {}  # the external side: keys it executed
    answered = threading.Event()
    release = threading.Event()
    app = App(ledger_url)

    @app.task(name=TASK, retry=RetryPolicy(max_attempts=5, base_delay_s=0.01))
    def send(ctx: TaskContext, order: str) -> Any:
        def call(key: str) -> Any:
            if ctx.generation >= 2:  # this call executes; its reply is lost
                target[key] = {"sent": order}
            raise OutcomeUnknownError(f"the reply for {key} was lost")

        return ctx.effect("send", call, key=f"send:{order}")

    @app.lookup(TASK, "send", worker=False)
    def look(key: str) -> Any:
        answer = target.get(key, NOT_FOUND)  # read now, delivered late
        answered.set()
        assert release.wait(60), "the test never released the lookup"
        return answer

    control = Control(app=app)
    control.migrate()
    task_id = app.submit(TASK, {"order": "o1"}).task_id
    with running_worker(app):
        wait_for("UNKNOWN", lambda: control.get(task_id).state.value == "UNKNOWN")

    reports: list[ReconcileReport] = []
    runner = threading.Thread(target=lambda: reports.append(reconcile(
        control, app, TASK, apply=True, reason="nightly", by="ops", rate_per_s=None)))
    runner.start()
    try:
        assert answered.wait(60)
        # Meanwhile: a person settles it, a worker calls again and the call executes.
        control.resolve(task_id, "not-done", reason="checked by hand", by="bob")
        with running_worker(app):
            wait_for("UNKNOWN again", lambda: control.get(task_id).state.value == "UNKNOWN")
        assert "send:o1" in target
    finally:
        release.set()
        runner.join(60)
    [report] = reports
    [finding] = [f for f in report.findings if f.task_id == task_id]
    assert finding.outcome == "not_executed"  # true of the intent it looked up
    # The open intent now is generation 2's, whose call the target has: resolving it
    # not-done would make the task call a third time with the same key.
    assert not finding.applied, finding
    assert control.get(task_id).state.value == "UNKNOWN"
    app.close()


def test_a_lookup_raising_system_exit_is_inconclusive_at_once(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task(name=TASK)
    def send(ctx: TaskContext, order: str) -> Any:
        def call(key: str) -> Any:
            raise OutcomeUnknownError(f"the reply for {key} was lost")

        return ctx.effect("send", call, key=f"send:{order}")

    @app.lookup(TASK, "send", worker=False)
    def look(key: str) -> Any:
        raise SystemExit(3)  # a careless lookup (a CLI helper calling sys.exit)

    control = Control(app=app)
    control.migrate()
    task_id = app.submit(TASK, {"order": "o1"}).task_id
    with running_worker(app):
        wait_for("UNKNOWN", lambda: control.get(task_id).state.value == "UNKNOWN")
    report = reconcile(control, app, TASK, apply=True, reason="r", by="ops",
                       rate_per_s=None, lookup_timeout_s=30)
    [finding] = report.findings
    assert finding.outcome == "unknown" and "SystemExit" in finding.note, finding
    assert report.elapsed_s < 20  # not left to the lookup timeout
    assert control.get(task_id).state.value == "UNKNOWN"
    app.close()
