"""Contract: retry budgets are counted and enforced by the ledger (DESIGN §7), on every
backend. A retry over budget is never dropped nor failed: it stays ``RETRY_WAIT`` with a
later ``run_at`` (the first second whose windows have room) and the reason in its audit.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ...ledger.base import BudgetUse, Claim, Ledger, NewTask, TaskWrite, Transition
from ...states import State
from ..clock import inject_clock

TASK = "contract.task"


def _claim_all(ledger: Ledger, ids: list[str], name: str = TASK) -> list[Claim]:
    """Claim until every one of ``ids`` is claimed (a claim may return fewer than asked,
    e.g. rows a concurrent statement holds are skipped); bounded."""
    claims: list[Claim] = []
    for _ in range(100):
        claims += ledger.claim("w1", [name], len(ids) - len(claims))
        if len(claims) >= len(ids):
            break
    assert sorted(c.task_id for c in claims) == sorted(ids)
    return claims


def _retry_all(ledger: Ledger, make_task: Callable[..., NewTask], n: int,
               use: BudgetUse, name: str = TASK) -> list[str]:
    ids = [r.task_id for r in ledger.submit([make_task(name=name, max_attempts=5)
                                             for _ in range(n)])]
    outcomes = ledger.commit([
        TaskWrite(c.task_id, c.generation, "w1", "finish:RETRY_WAIT",
                  transition=Transition(State.RETRY_WAIT, error="e", error_class="transient",
                                        reason="retry", budgets=(use,)))
        for c in _claim_all(ledger, ids, name)])
    assert all(o.ok for o in outcomes)
    return ids


def _frozen(ledger: Ledger) -> float:
    """Freeze the ledger clock a tenth of a second into a second and return it: every
    commit of the test is counted in that one 1 s bucket, whatever the machine's speed."""
    at = math.floor(ledger.now()) + 0.1
    inject_clock(ledger).freeze(at)
    return at


def test_retries_over_budget_wait_with_the_reason(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    # min 1/s over a 2 s window, no share of calls: at most 2 retries in any 2 s.
    use = BudgetUse(f"type:{TASK}", 1, True, 0.0, 1.0, 2.0)
    now = _frozen(ledger)
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
    # admitted in bucket b must fit every window it lies in, up to b + window - 1, which
    # only calls of bucket b and later are in: so the successes and the retries are
    # committed in one bucket, on a frozen ledger clock (tests/test_budget_window.py
    # checks the rule across bucket boundaries).
    key = "downstream:psp"
    now = _frozen(ledger)
    ids = [r.task_id for r in ledger.submit([make_task() for _ in range(50)])]
    ledger.commit([TaskWrite(c.task_id, c.generation, "w1", "finish:SUCCEEDED",
                             transition=Transition(State.SUCCEEDED, result_json="1",
                                                   budgets=(BudgetUse(key, 1, False, 0.1,
                                                                      0.0, 10.0),)))
                   for c in _claim_all(ledger, ids)])
    assert all(ledger.get(t).state is State.SUCCEEDED for t in ids)
    retried = _retry_all(ledger, make_task, 6, BudgetUse(key, 1, True, 0.1, 0.0, 10.0))
    infos = sorted((ledger.get(t) for t in retried), key=lambda i: i.run_at)
    # The 6 calls of these attempts count too: allowed = 0.1 * (50 + 6) = 5.6 -> 5 now.
    assert [i.run_at for i in infos[:5]] == [now] * 5
    assert infos[-1].run_at >= math.floor(now) + 10 - 1
    # Another budget is not spent by these (another task type: the admitted retries above
    # are ready again on the frozen clock).
    other = _retry_all(ledger, make_task, 1, BudgetUse("downstream:mail", 1, True, 0.0,
                                                       1.0, 10.0), name="contract.other")
    assert ledger.get(other[0]).run_at == now
