"""Retry budgets with a real worker, on both ledgers (DESIGN §7).

The amplification bound: about 100 tasks/s, half of whose attempts fail transiently,
against the counting service (its own process and file, where the calls are counted and
timed), with a budget of the task type. The budget admits retries: in every window of its
length the retries whose ``run_at`` lies in it stay within ``min_per_s * window_s + ratio *
calls``, and no retry reaches the service before its ``run_at``. Every task still
succeeds: retries over budget wait, they are never dropped. A downstream's budget
(``ctx.effect(..., downstream=...)``) holds the same way.

The bound is on admission, not on when a busy worker gets to a retry: a worker running
behind starts admitted retries late, so the service may see the retries of a few seconds
in one window (DESIGN §7 states this limit; ``ratchet status`` shows the lag as the oldest
ready task's age). The test therefore reads each retry's ``run_at`` from the audit trail
and its arrival from the service, not the service's windows alone.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet import (
    App,
    Control,
    RetryBudget,
    RetryPolicy,
    State,
    SubmitRequest,
    TaskContext,
    TransientError,
)
from ratchet.errors import ConfigError
from ratchet.testing import CountingService, start_counting_service, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(180)

BUDGET = RetryBudget(ratio=0.1, min_per_s=20.0, window_s=5.0)
TASKS = 300
RATE_PER_S = 100.0


@pytest.mark.parametrize("bad", [
    {"ratio": -0.1}, {"ratio": 1.5}, {"min_per_s": -1}, {"window_s": 0.5},
    {"window_s": 301}, {"ratio": float("nan")}, {"min_per_s": True},
])
def test_budget_fields_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="RetryBudget"):
        RetryBudget(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="budget"):
        RetryPolicy(budget=0.1)  # type: ignore[arg-type]


def test_downstream_budget_is_validated(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path}/l.db")
    app.downstream("psp", budget=BUDGET)
    with pytest.raises(ConfigError, match="twice"):
        app.downstream("psp", budget=BUDGET)
    with pytest.raises(ConfigError, match="RetryBudget"):
        app.downstream("mail", budget=0.1)  # type: ignore[arg-type]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    with start_counting_service(tmp_path / "service.db", honour_keys=False) as svc:
        yield svc


def _fails(task_id: str, attempt: int) -> bool:
    """Half of all attempts fail, decided by (task, attempt) alone."""
    return random.Random(f"{task_id}:{attempt}").random() < 0.5


def test_amplification_stays_within_the_budget(
    ledger_url: str, service: CountingService
) -> None:
    app = App(ledger_url)
    client = service.client(timeout_s=5.0)
    policy = RetryPolicy(max_attempts=100, base_delay_s=0.05, max_delay_s=0.2, jitter=0.0,
                         quarantine_after=None, budget=BUDGET)

    @app.task(name="amp.call", retry=policy)
    def call(ctx: TaskContext) -> str:
        client.execute(f"{ctx.task_id}:{ctx.attempt}", {})
        if _fails(ctx.task_id, ctx.attempt):
            raise TransientError("the downstream failed this call")
        return "ok"

    try:
        # Arrivals at RATE_PER_S: each task ready i / rate seconds from now.
        handles = app.submit_many(
            SubmitRequest("amp.call", {}, delay_s=i / RATE_PER_S) for i in range(TASKS))
        with running_worker(app, concurrency=8):
            wait_for("every task to succeed",
                     lambda: all(h.get().state is State.SUCCEEDED for h in handles), 150, 0.5)
        seen = service.records().times
        arrived = {key: at for at, key in seen}
        assert len(arrived) == len(seen)  # each attempt called once
        with Control(ledger_url) as control:
            trails = [control.history(h.task_id).events for h in handles]
        # From the audit trail: when each attempt ended (the budget counts its call in that
        # second of the ledger clock) and each retry's run_at (ledger clock, epoch seconds).
        ended: list[float] = []
        run_at: dict[str, float] = {}
        reasons: list[str] = []
        for handle, events in zip(handles, trails, strict=True):
            attempt = 1
            for e in events:
                if e.kind != "transition" or e.from_state != "RUNNING":
                    continue
                ended.append(e.at)
                if e.to_state != "RETRY_WAIT":
                    continue
                attempt += 1
                reason = str(e.detail.get("reason", ""))
                reasons.append(reason)
                at = e.at + float(e.detail.get("delay_s", 0.0))
                # A retry the budget held back starts on a whole second (its bucket); the
                # audit keeps the delay to the millisecond, so round back onto it.
                run_at[f"{handle.task_id}:{attempt}"] = (
                    float(round(at)) if "retry budget spent" in reason else at)
        assert len(ended) == len(arrived) and set(run_at) <= set(arrived)
        retries_total = len(run_at)
        assert len(arrived) == TASKS + retries_total and retries_total > 50
        # No retry reached the service before the second the budget admitted it to.
        early = {k: round(run_at[k] - arrived[k], 3) for k in run_at
                 if arrived[k] < run_at[k] - 0.001}
        assert not early, f"retries called before their run_at (s early): {early}"
        # The budget's windows: window_s consecutive whole seconds (its 1 s buckets).
        n = math.ceil(BUDGET.window_s)
        calls: dict[int, int] = {}
        admitted: dict[int, int] = {}
        for at in ended:
            calls[math.floor(at)] = calls.get(math.floor(at), 0) + 1
        for at in run_at.values():
            admitted[math.floor(at)] = admitted.get(math.floor(at), 0) + 1
        worst = 0.0
        for end in range(min(admitted), max(admitted) + 1):
            seconds = range(end - n + 1, end + 1)
            bound = max(1.0, BUDGET.min_per_s * BUDGET.window_s
                        + BUDGET.ratio * sum(calls.get(b, 0) for b in seconds))
            worst = max(worst, sum(admitted.get(b, 0) for b in seconds) / bound)
        assert worst <= 1.0, f"the budget admitted {worst:.2f} x its bound in a window"
        # Without the budget about as many retries as tasks start within a few seconds;
        # with it some waited, and said why.
        assert any("retry budget spent: type:amp.call" in r for r in reasons)
    finally:
        client.close()
        app.close()


def test_a_downstream_budget_holds_back_retries_of_its_failed_calls(
    ledger_url: str, service: CountingService
) -> None:
    app = App(ledger_url)
    client = service.client(timeout_s=5.0)
    app.downstream("psp", budget=RetryBudget(ratio=0.0, min_per_s=1.0, window_s=2.0))

    @app.task(name="ds.charge", retry=RetryPolicy(max_attempts=10, base_delay_s=0.01,
                                                   jitter=0.0, quarantine_after=None))
    def charge(ctx: TaskContext) -> object:
        def send(key: str) -> object:
            client.execute(f"{key}:{ctx.attempt}", {})
            if ctx.attempt == 1:
                raise TransientError("psp hiccup")
            return {"ok": True}

        return ctx.effect("charge", send, key=f"charge:{ctx.task_id}", idempotent=True,
                          downstream="psp")

    try:
        handles = [app.submit("ds.charge", {}) for _ in range(6)]
        with running_worker(app, concurrency=6):
            wait_for("every charge", lambda: all(h.get().state is State.SUCCEEDED
                                                 for h in handles), 60, 0.2)
        # 6 first calls and 6 retries at the service. The budget admits retries: each
        # retry's run_at (kept on the row after it ran) lies in the budget's 1 s buckets at
        # most 2 in any 2 consecutive seconds, and the service saw no retry before its
        # admission. (Arrival times themselves may bunch on a loaded machine: a retry
        # admitted for second s can start late, next to the ones admitted for s + 2.)
        arrived = {key.rsplit(":", 1)[0]: at for at, key in service.records().times
                   if key.endswith(":2")}
        assert len(arrived) == 6
        admitted = {f"charge:{h.task_id}": h.get().run_at for h in handles}
        assert all(arrived[k] >= admitted[k] - 0.001 for k in admitted), (arrived, admitted)
        seconds = sorted(math.floor(at) for at in admitted.values())
        for end in range(seconds[0], seconds[-1] + 1):
            assert sum(1 for s in seconds if end - 2 < s <= end) <= 2, seconds
        assert seconds[-1] - seconds[0] >= 3
        with Control(ledger_url) as control:
            reasons = [e.detail.get("reason", "") for h in handles
                       for e in control.history(h.task_id).events
                       if e.kind == "transition" and e.to_state == "RETRY_WAIT"]
        assert sum("downstream:psp" in r for r in reasons) >= 3
    finally:
        client.close()
        app.close()
