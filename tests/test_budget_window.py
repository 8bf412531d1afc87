"""The retry budget's window rule (ratchet.ledger.budgets, DESIGN §7) as arithmetic: the
ledger clock is a number handed to the book, so no test here waits on a second."""

from __future__ import annotations

import math

import pytest

from ratchet.ledger.base import BudgetUse, TaskWrite, Transition
from ratchet.ledger.budgets import BudgetBook
from ratchet.states import State

KEY = "downstream:psp"


def _retry(i: int, use: BudgetUse, delay_s: float = 0.0) -> TaskWrite:
    return TaskWrite(f"t{i}", 1, "w1", "finish:RETRY_WAIT",
                     transition=Transition(State.RETRY_WAIT, delay_s=delay_s, budgets=(use,)))


def _success(i: int, use: BudgetUse) -> TaskWrite:
    return TaskWrite(f"s{i}", 1, "w1", "finish:SUCCEEDED",
                     transition=Transition(State.SUCCEEDED, budgets=(use,)))


def _run(writes: list[TaskWrite], now: float,
         rows: list[tuple[str, int, int, int]] | None = None) -> tuple[BudgetBook, list[float]]:
    """Charge ``writes`` in one commit at ledger clock ``now``; return the book and each
    write's ready time (``now + delay``)."""
    book = BudgetBook(writes)
    book.load(rows or [])
    ready = []
    for w in writes:
        assert w.transition is not None
        t = book.charge(w.holder, w.transition, now)
        ready.append(now + t.delay_s)
    return book, ready


def test_the_floor_admits_min_per_s_times_window_in_every_window() -> None:
    use = BudgetUse(KEY, 1, True, 0.0, 1.0, 2.0)  # 2 retries in any 2 s window
    _, ready = _run([_retry(i, use) for i in range(5)], now=100.3)
    assert [math.floor(r) for r in ready] == [100, 100, 102, 102, 104]
    assert ready[:2] == [100.3, 100.3]  # admitted at once: no delay added
    assert ready[2] == 102.0  # pushed to the start of the first second with room


@pytest.mark.parametrize("now", [100.0, 100.5, 100.999])
def test_calls_in_the_same_bucket_raise_the_budget_wherever_in_the_second(now: float) -> None:
    calls = BudgetUse(KEY, 1, False, 0.1, 0.0, 10.0)
    retry = BudgetUse(KEY, 1, True, 0.1, 0.0, 10.0)
    writes = [_success(i, calls) for i in range(50)] + [_retry(i, retry) for i in range(6)]
    book, ready = _run(writes, now)
    # 56 calls in the window: 0.1 * 56 = 5.6 -> 5 admitted now, the 6th after the window.
    assert ready[50:55] == [now] * 5
    assert ready[55] >= math.floor(now) + 10 - 1
    assert book.bumps[(KEY, math.floor(now), "w1")] == [56, 5]


def test_calls_of_an_earlier_second_leave_the_windows_past_it() -> None:
    # 50 calls counted in bucket 99; retries committed at 100.2. A retry in bucket 100 lies
    # in the windows ending 100 .. 109; the one ending at 109 holds none of bucket 99's
    # calls, so only its floor (at least 1) applies there: one retry now, whatever came
    # just before the second boundary. (The rule keeps the bound for traffic that stops.)
    retry = BudgetUse(KEY, 1, True, 0.1, 0.0, 10.0)
    _, ready = _run([_retry(i, retry) for i in range(3)], 100.2,
                    rows=[(KEY, 99, 50, 0)])
    assert ready[0] == 100.2
    assert all(r >= 101 for r in ready[1:])


def test_reservations_already_made_count_and_a_backoff_starts_the_search() -> None:
    use = BudgetUse(KEY, 1, True, 0.0, 1.0, 2.0)
    # Two retries already reserved in bucket 105 (another commit): the window holding it
    # is full, so a retry whose backoff ends at 105.5 waits for 107.
    _, ready = _run([_retry(0, use, delay_s=5.2)], 100.3, rows=[(KEY, 105, 0, 2)])
    assert ready == [107.0]
    _, ready = _run([_retry(0, use, delay_s=2.0)], 100.3, rows=[(KEY, 105, 0, 2)])
    assert ready == [pytest.approx(102.3)]  # before the full window: its own backoff
