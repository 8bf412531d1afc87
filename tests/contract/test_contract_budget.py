"""Contract: retry budgets are counted and enforced by the ledger (DESIGN §7), on every
backend. A retry over budget is never dropped nor failed: it stays ``RETRY_WAIT`` with a
later ``run_at`` (the first second whose windows have room) and the reason in its audit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest

from ratchet.ledger.base import BudgetUse, Ledger, NewTask, TaskWrite, Transition
from ratchet.states import State

TASK = "contract.task"


def _retry_all(ledger: Ledger, make_task: Callable[..., NewTask], n: int,
               use: BudgetUse) -> list[str]:
    ids = [r.task_id for r in ledger.submit([make_task(max_attempts=5) for _ in range(n)])]
    claims = ledger.claim("w1", [TASK], n)
    assert len(claims) == n
    outcomes = ledger.commit([
        TaskWrite(c.task_id, c.generation, "w1", "finish:RETRY_WAIT",
                  transition=Transition(State.RETRY_WAIT, error="e", error_class="transient",
                                        reason="retry", budgets=(use,)))
        for c in claims])
    assert all(o.ok for o in outcomes)
    return ids


def test_retries_over_budget_wait_with_the_reason(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    # min 1/s over a 2 s window, no share of calls: at most 2 retries in any 2 s.
    use = BudgetUse(f"type:{TASK}", 1, True, 0.0, 1.0, 2.0)
    now = ledger.now()
    ids = _retry_all(ledger, make_task, 5, use)
    infos = [ledger.get(t) for t in ids]
    assert all(i.state is State.RETRY_WAIT for i in infos)  # none dropped, none failed
    starts = sorted(math.floor(i.run_at) for i in infos)
    for end in range(starts[0], starts[-1] + 1):
        assert sum(1 for s in starts if end - 2 < s <= end) <= 2, starts
    assert starts[-1] - math.floor(now) >= 4  # five retries at two per 2 s window
    waited = [i for i in infos if i.run_at > now + 1.0]
    assert len(waited) >= 3
    for info in waited:
        [t] = [e for e in ledger.timeline(info.task_id).events
               if e.kind == "transition" and e.to_state == "RETRY_WAIT"]
        assert "retry budget spent" in t.detail["reason"]
        assert f"type:{TASK}" in t.detail["reason"]


def test_calls_raise_the_budget_and_budgets_are_separate(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    # 50 successful calls counted in the window: ratio 0.1 -> 5 retries + min 0. A retry
    # admitted in bucket b must fit every window it lies in, up to b + window - 1, and the
    # calls of an earlier second leave the later ones: so the successes and the retries
    # are committed within one 1 s bucket (paired CI runs straddled a second boundary and
    # saw 1 admitted). Each try uses a budget of its own; a try that straddles is redone.
    for attempt in range(6):
        key = f"downstream:psp{attempt}"
        if ledger.now() % 1.0 > 0.6:  # too close to the next second: start in it
            time.sleep(1.0 - ledger.now() % 1.0 + 0.01)
        now = ledger.now()
        ids = [r.task_id for r in ledger.submit([make_task() for _ in range(50)])]
        claims = ledger.claim("w1", [TASK], 50)
        ledger.commit([TaskWrite(c.task_id, c.generation, "w1", "finish:SUCCEEDED",
                                 transition=Transition(State.SUCCEEDED, result_json="1",
                                                       budgets=(BudgetUse(key, 1, False, 0.1,
                                                                          0.0, 10.0),)))
                       for c in claims])
        assert all(ledger.get(t).state is State.SUCCEEDED for t in ids)
        retried = _retry_all(ledger, make_task, 6, BudgetUse(key, 1, True, 0.1, 0.0, 10.0))
        done = ledger.now()
        if math.floor(done) == math.floor(now):
            break
    else:
        pytest.skip("the machine never committed both within one second in 6 tries")
    infos = sorted((ledger.get(t) for t in retried), key=lambda i: i.run_at)
    # The 6 calls of these attempts count too: allowed = 0.1 * (50 + 6) = 5.6 -> 5 now.
    assert sum(1 for i in infos if i.run_at < done + 1.5) == 5
    assert infos[-1].run_at >= math.floor(now) + 10 - 1
    # Another budget is not spent by these.
    other = _retry_all(ledger, make_task, 1, BudgetUse("downstream:mail", 1, True, 0.0,
                                                       1.0, 10.0))
    assert ledger.get(other[0]).run_at < ledger.now() + 1.5
