"""Ledger contract: submit, dedupe by idempotency key, all-or-nothing batches."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from ...errors import IdempotencyConflict, RatchetError, TaskNotFound
from ...ledger.base import Ledger, NewTask
from ...states import State

TASK = "contract.task"  # make_task's default name
OTHER = "contract.other"
MakeTask = Callable[..., NewTask]


def total_tasks(ledger: Ledger) -> int:
    return sum(n for by_state in ledger.stats().counts.values() for n in by_state.values())


def test_submit_creates_a_pending_task(ledger: Ledger, make_task: MakeTask) -> None:
    task = make_task({"order": "o-1", "cents": 1200}, key="order-o-1")
    before = ledger.now()
    [result] = ledger.submit([task])
    after = ledger.now()
    assert result.task_id == task.task_id
    assert result.created is True
    info = ledger.get(task.task_id)
    assert info.state is State.PENDING
    assert info.name == TASK
    assert info.params == {"order": "o-1", "cents": 1200}
    assert info.params_digest == task.params_digest
    assert info.idempotency_key == "order-o-1"
    assert info.generation == 0
    assert info.attempt == 0
    assert info.max_attempts == task.max_attempts
    assert info.holder is None
    assert info.lease_until is None
    assert before <= info.created_at <= after
    assert before <= info.run_at <= after
    assert info.result is None
    assert info.last_error is None


def test_same_key_same_digest_returns_original(ledger: Ledger, make_task: MakeTask) -> None:
    first = make_task({"a": 1}, key="k-1")
    [r1] = ledger.submit([first])
    again = make_task({"a": 1}, key="k-1")  # a retry by the client: new candidate id
    assert again.task_id != first.task_id
    [r2] = ledger.submit([again])
    assert r2.task_id == first.task_id
    assert r2.created is False
    assert r1.created is True
    assert total_tasks(ledger) == 1
    with pytest.raises(TaskNotFound):
        ledger.get(again.task_id)
    assert ledger.stats().idempotency_conflicts == 0


def test_same_key_other_digest_is_a_conflict(ledger: Ledger, make_task: MakeTask) -> None:
    first = make_task({"a": 1}, key="k-1")
    ledger.submit([first])
    before = ledger.get(first.task_id)
    other = make_task({"a": 2}, key="k-1")
    with pytest.raises(IdempotencyConflict) as info:
        ledger.submit([other])
    err = info.value
    assert err.key == "k-1"
    assert err.task_id == first.task_id
    assert err.existing_digest == first.params_digest
    assert err.new_digest == other.params_digest
    assert first.params_digest in str(err)
    assert other.params_digest in str(err)
    # Nothing written, the original untouched, and the conflict counted.
    assert total_tasks(ledger) == 1
    with pytest.raises(TaskNotFound):
        ledger.get(other.task_id)
    assert ledger.get(first.task_id) == before
    assert ledger.stats().idempotency_conflicts == 1
    with pytest.raises(IdempotencyConflict):
        ledger.submit([make_task({"a": 3}, key="k-1")])
    assert ledger.stats().idempotency_conflicts == 2


def test_same_params_under_another_task_name_is_a_conflict(
    ledger: Ledger, make_task: MakeTask
) -> None:
    ledger.submit([make_task({"a": 1}, key="shared", name=TASK)])
    with pytest.raises(IdempotencyConflict):
        ledger.submit([make_task({"a": 1}, key="shared", name=OTHER)])


def test_tasks_without_key_are_never_deduplicated(ledger: Ledger, make_task: MakeTask) -> None:
    results = ledger.submit([make_task({"a": 1}), make_task({"a": 1})])
    assert all(r.created for r in results)
    assert len({r.task_id for r in results}) == 2
    assert total_tasks(ledger) == 2


def test_batch_submit_is_all_or_nothing(ledger: Ledger, make_task: MakeTask) -> None:
    existing = make_task({"a": 1}, key="taken")
    ledger.submit([existing])
    fresh_a = make_task({"b": 1}, key="fresh-a")
    fresh_b = make_task({"b": 2})
    clash = make_task({"a": 999}, key="taken")
    with pytest.raises(IdempotencyConflict):
        ledger.submit([fresh_a, fresh_b, clash])
    for task in (fresh_a, fresh_b, clash):
        with pytest.raises(TaskNotFound):
            ledger.get(task.task_id)
    assert total_tasks(ledger) == 1
    # The keys of the refused batch are still free.
    [ok] = ledger.submit([make_task({"b": 7}, key="fresh-a")])
    assert ok.created is True


def test_batch_with_conflict_first_writes_nothing(ledger: Ledger, make_task: MakeTask) -> None:
    ledger.submit([make_task({"a": 1}, key="taken")])
    later = make_task({"c": 1})
    with pytest.raises(IdempotencyConflict):
        ledger.submit([make_task({"a": 2}, key="taken"), later])
    with pytest.raises(TaskNotFound):
        ledger.get(later.task_id)


def test_batch_failing_in_the_store_writes_nothing(ledger: Ledger, make_task: MakeTask) -> None:
    a = make_task({"x": 1})
    duplicate_id = make_task({"x": 2}, task_id=a.task_id)
    with pytest.raises(RatchetError):
        ledger.submit([make_task({"x": 0}, key="k"), a, duplicate_id])
    assert total_tasks(ledger) == 0


def test_batch_dedupes_within_itself(ledger: Ledger, make_task: MakeTask) -> None:
    first = make_task({"a": 1}, key="twice")
    second = make_task({"a": 1}, key="twice")
    r1, r2 = ledger.submit([first, second])
    assert r1.created is True
    assert r2.created is False
    assert r2.task_id == r1.task_id == first.task_id
    assert total_tasks(ledger) == 1


def test_batch_conflicts_within_itself(ledger: Ledger, make_task: MakeTask) -> None:
    with pytest.raises(IdempotencyConflict):
        ledger.submit([make_task({"a": 1}, key="twice"), make_task({"a": 2}, key="twice")])
    assert total_tasks(ledger) == 0


def test_batch_results_follow_input_order(ledger: Ledger, make_task: MakeTask) -> None:
    tasks = [make_task({"i": i}) for i in range(20)]
    results = ledger.submit(tasks)
    assert [r.task_id for r in results] == [t.task_id for t in tasks]
    assert {i.task_id for i in ledger.get_many([t.task_id for t in tasks])} == {
        t.task_id for t in tasks
    }


def test_submit_delay_and_absolute_run_at(ledger: Ledger, make_task: MakeTask) -> None:
    before = ledger.now()
    delayed = make_task(delay_s=120.0)
    absolute = make_task(run_at_epoch_s=before + 600.0, delay_s=5.0)
    ledger.submit([delayed, absolute])
    after = ledger.now()
    assert before + 120.0 <= ledger.get(delayed.task_id).run_at <= after + 120.0
    # An absolute run_at wins over delay_s.
    assert ledger.get(absolute.task_id).run_at == pytest.approx(before + 600.0, abs=1e-3)


def test_submit_is_visible_to_another_ledger_object(
    open_store: Callable[[], Ledger], make_task: MakeTask
) -> None:
    writer, reader = open_store(), open_store()
    task = make_task({"z": 1})
    writer.submit([task])
    assert reader.get(task.task_id).params == {"z": 1}


def _debounced(make_task: MakeTask, params: dict[str, int], delay_s: float,
               max_s: float) -> NewTask:
    """A task of debounce group ``"K"`` as ``App.submit(..., debounce_s=delay_s)`` builds
    it (no idempotency key; its delay is the window)."""
    return dataclasses.replace(make_task(params, delay_s=delay_s), debounce_key="K",
                               debounce_s=delay_s, debounce_max_s=max_s)


def test_debounced_submits_collapse_into_the_open_task(
    ledger: Ledger, make_task: MakeTask
) -> None:
    first = _debounced(make_task, {"n": 1}, 30.0, 600.0)
    second = _debounced(make_task, {"n": 2}, 30.0, 600.0)
    [r1] = ledger.submit([first])
    before = ledger.now()
    [r2] = ledger.submit([second])
    after = ledger.now()
    assert (r1.task_id, r1.created) == (first.task_id, True)
    assert (r2.task_id, r2.created) == (first.task_id, False)
    info = ledger.get(first.task_id)
    assert info.state is State.PENDING and info.idempotency_key is None
    assert info.params == {"n": 2} and info.params_digest == second.params_digest
    assert before + 30.0 <= info.run_at <= after + 30.0  # 30 s after the last submit
    assert total_tasks(ledger) == 1
    [event] = [e for e in ledger.timeline(first.task_id).events if e.kind == "debounced"]
    assert event.detail["key"] == "K" and event.detail["collapsed"] == 1


def test_a_debounced_start_is_capped_by_the_first_submit(
    ledger: Ledger, make_task: MakeTask
) -> None:
    first = _debounced(make_task, {"n": 1}, 30.0, 30.0)
    ledger.submit([first])
    run_at = ledger.get(first.task_id).run_at
    ledger.submit([_debounced(make_task, {"n": 2}, 30.0, 30.0)])
    assert ledger.get(first.task_id).run_at == pytest.approx(run_at, abs=1e-6)


def test_a_claimed_debounced_task_is_closed_to_new_submits(
    ledger: Ledger, make_task: MakeTask
) -> None:
    first = _debounced(make_task, {"n": 1}, 0.0, 60.0)
    ledger.submit([first])
    [claim] = ledger.claim("w", [TASK], 5)
    assert claim.task_id == first.task_id
    second = _debounced(make_task, {"n": 2}, 30.0, 60.0)
    [result] = ledger.submit([second])
    assert (result.task_id, result.created) == (second.task_id, True)
    assert ledger.get(first.task_id).params == {"n": 1}
    assert total_tasks(ledger) == 2
