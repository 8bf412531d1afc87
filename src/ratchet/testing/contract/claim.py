"""Ledger contract: claim, lease renewal, expiry and takeover, concurrent claimers."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from ...ledger.base import Claim, EffectState, EffectWrite, Ledger, NewTask, TaskWrite, Transition
from ...states import State

TASK = "contract.task"
OTHER = "contract.other"
MakeTask = Callable[..., NewTask]
SleepUntil = Callable[[Ledger, float], None]


def submit(ledger: Ledger, make_task: MakeTask, n: int = 1, **kw: object) -> list[str]:
    return [r.task_id for r in ledger.submit([make_task({"i": i}, **kw) for i in range(n)])]


# ---------------------------------------------------------------------- claim


def test_claim_leases_a_ready_task(ledger: Ledger, make_task: MakeTask) -> None:
    [task_id] = submit(ledger, make_task, lease_s=42.0, max_attempts=4)
    before = ledger.now()
    [claim] = ledger.claim("worker-a", [TASK], 10)
    after = ledger.now()
    assert claim.task_id == task_id
    assert claim.name == TASK
    assert claim.params_json == '{"i":0}'
    assert claim.generation == 1
    assert claim.attempt == 1
    assert claim.max_attempts == 4
    assert claim.lease_s == 42.0
    assert before <= claim.ledger_now <= after
    assert claim.lease_until == pytest.approx(claim.ledger_now + 42.0, abs=1e-3)
    assert claim.takeover is False
    assert claim.previous_holder is None
    assert claim.steps == {}
    assert claim.effects == {}
    info = ledger.get(task_id)
    assert info.state is State.RUNNING
    assert info.holder == "worker-a"
    assert info.generation == 1
    assert info.attempt == 1
    assert info.lease_until == pytest.approx(claim.lease_until, abs=1e-3)


def test_a_leased_task_is_not_claimed_again(ledger: Ledger, make_task: MakeTask) -> None:
    submit(ledger, make_task)
    assert len(ledger.claim("a", [TASK], 5)) == 1
    assert ledger.claim("b", [TASK], 5) == []
    assert ledger.claim("a", [TASK], 5) == []


def test_claim_respects_limit(ledger: Ledger, make_task: MakeTask) -> None:
    ids = submit(ledger, make_task, 5)
    first = ledger.claim("a", [TASK], 2)
    second = ledger.claim("a", [TASK], 10)
    third = ledger.claim("a", [TASK], 10)
    assert len(first) == 2
    assert len(second) == 3
    assert third == []
    assert sorted(c.task_id for c in first + second) == sorted(ids)
    assert ledger.claim("a", [TASK], 0) == []


def test_claim_limit_zero_and_no_names_claim_nothing(ledger: Ledger, make_task: MakeTask) -> None:
    [task_id] = submit(ledger, make_task)
    assert ledger.claim("a", [TASK], 0) == []
    assert ledger.claim("a", [], 10) == []
    assert ledger.get(task_id).state is State.PENDING


def test_claim_filters_by_name(ledger: Ledger, make_task: MakeTask) -> None:
    mine = submit(ledger, make_task, 2, name=TASK)
    theirs = submit(ledger, make_task, 2, name=OTHER)
    claims = ledger.claim("a", [TASK], 10)
    assert sorted(c.task_id for c in claims) == sorted(mine)
    assert all(ledger.get(t).state is State.PENDING for t in theirs)
    assert ledger.claim("a", ["nobody.registered"], 10) == []
    both = ledger.claim("b", [TASK, OTHER], 10)
    assert sorted(c.task_id for c in both) == sorted(theirs)


def test_claim_takes_the_oldest_ready_tasks_across_names(
    ledger: Ledger, make_task: MakeTask
) -> None:
    """Several names (one repeated): the oldest run_at first whatever the name, each task
    once, up to the limit (the order of the returned claims is not part of the contract)."""
    base = ledger.now() - 100.0
    order = [(TASK, 5), (OTHER, 1), (TASK, 3), (OTHER, 4), (TASK, 2), (OTHER, 6)]
    ids = {
        at: ledger.submit([make_task({"at": at}, name=name, run_at_epoch_s=base + at)])[0].task_id
        for name, at in order
    }
    claims = ledger.claim("a", [TASK, OTHER, TASK], 4)
    assert sorted(c.task_id for c in claims) == sorted([ids[1], ids[2], ids[3], ids[4]])
    rest = ledger.claim("a", [OTHER, TASK], 10)
    assert sorted(c.task_id for c in rest) == sorted([ids[5], ids[6]])


def test_future_run_at_is_not_claimable_until_then(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    [task_id] = submit(ledger, make_task, delay_s=0.3)
    [now_id] = submit(ledger, make_task)
    claims = ledger.claim("a", [TASK], 10)
    assert [c.task_id for c in claims] == [now_id]
    assert ledger.get(task_id).state is State.PENDING
    sleep_until(ledger, ledger.get(task_id).run_at)
    [claim] = ledger.claim("a", [TASK], 10)
    assert claim.task_id == task_id


def test_absolute_run_at_in_the_future_waits(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    at = ledger.now() + 0.3
    submit(ledger, make_task, run_at_epoch_s=at)
    assert ledger.claim("a", [TASK], 1) == []
    sleep_until(ledger, at)
    assert len(ledger.claim("a", [TASK], 1)) == 1


def test_claim_is_audited_and_counted(ledger: Ledger, make_task: MakeTask) -> None:
    [task_id] = submit(ledger, make_task)
    [claim] = ledger.claim("worker-a", [TASK], 1)
    events = [e for e in ledger.timeline(task_id).events if e.kind == "claim"]
    assert len(events) == 1
    assert events[0].holder == "worker-a"
    assert events[0].generation == claim.generation
    assert events[0].to_state == State.RUNNING
    assert ledger.stats().claims == 1


# ---------------------------------------------------------------------- renew


def test_renew_extends_the_holders_lease(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    [task_id] = submit(ledger, make_task, lease_s=30.0)
    [claim] = ledger.claim("a", [TASK], 1)
    sleep_until(ledger, claim.ledger_now)  # the ledger clock moved on: a longer lease
    [result] = ledger.renew("a", [(task_id, claim.generation)])
    assert result.ok is True
    assert result.task_id == task_id
    assert result.generation == claim.generation
    assert result.lease_until is not None
    assert result.lease_until == pytest.approx(result.ledger_now + 30.0, abs=1e-3)
    assert result.lease_until > claim.lease_until
    assert ledger.get(task_id).lease_until == pytest.approx(result.lease_until, abs=1e-3)


@pytest.mark.parametrize(("holder", "shift"), [("a", -1), ("a", 1), ("intruder", 0)])
def test_renew_refused_for_wrong_generation_or_holder(
    ledger: Ledger, make_task: MakeTask, holder: str, shift: int
) -> None:
    [task_id] = submit(ledger, make_task)
    [claim] = ledger.claim("a", [TASK], 1)
    before = ledger.get(task_id)
    [result] = ledger.renew(holder, [(task_id, claim.generation + shift)])
    assert result.ok is False
    assert result.lease_until is None
    assert ledger.get(task_id) == before


def test_renew_refused_after_expiry(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    [task_id] = submit(ledger, make_task, lease_s=0.2)
    [claim] = ledger.claim("a", [TASK], 1)
    sleep_until(ledger, claim.lease_until)
    [result] = ledger.renew("a", [(task_id, claim.generation)])
    assert result.ok is False
    assert ledger.get(task_id).lease_until == pytest.approx(claim.lease_until, abs=1e-3)


def test_renew_refused_after_the_task_finished(ledger: Ledger, make_task: MakeTask) -> None:
    [task_id] = submit(ledger, make_task)
    [claim] = ledger.claim("a", [TASK], 1)
    ledger.commit(
        [
            TaskWrite(
                task_id,
                claim.generation,
                "a",
                "done",
                transition=Transition(State.SUCCEEDED, result_json="1"),
            )
        ]
    )
    [result] = ledger.renew("a", [(task_id, claim.generation)])
    assert result.ok is False
    assert ledger.get(task_id).state is State.SUCCEEDED


def test_renew_batch_answers_per_lease(ledger: Ledger, make_task: MakeTask) -> None:
    ids = submit(ledger, make_task, 3)
    claims = {c.task_id: c for c in ledger.claim("a", [TASK], 3)}
    leases = [
        (ids[0], claims[ids[0]].generation),
        (ids[1], claims[ids[1]].generation + 5),
        ("no-such-task", 1),
        (ids[2], claims[ids[2]].generation),
    ]
    results = ledger.renew("a", leases)
    assert [(r.task_id, r.ok) for r in results] == [
        (ids[0], True),
        (ids[1], False),
        ("no-such-task", False),
        (ids[2], True),
    ]
    assert ledger.renew("a", []) == []


# ---------------------------------------------------------------------- takeover


def test_expired_lease_is_taken_over_with_next_generation(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    [task_id] = submit(ledger, make_task, lease_s=0.2)
    [first] = ledger.claim("worker-a", [TASK], 1)
    assert ledger.claim("worker-b", [TASK], 1) == []  # not before expiry
    sleep_until(ledger, first.lease_until)
    [second] = ledger.claim("worker-b", [TASK], 1)
    assert second.task_id == task_id
    assert second.takeover is True
    assert second.previous_holder == "worker-a"
    assert second.generation == first.generation + 1
    assert second.attempt == first.attempt + 1
    info = ledger.get(task_id)
    assert info.holder == "worker-b"
    assert info.generation == second.generation
    takeovers = [e for e in ledger.timeline(task_id).events if e.kind == "takeover"]
    assert len(takeovers) == 1
    assert takeovers[0].holder == "worker-b"
    assert takeovers[0].generation == second.generation
    assert takeovers[0].detail["previous_holder"] == "worker-a"
    assert ledger.stats().takeovers == 1
    # The old holder can no longer renew.
    [renewal] = ledger.renew("worker-a", [(task_id, first.generation)])
    assert renewal.ok is False


@pytest.mark.parametrize("open_intent", [False, True])
def test_expired_final_attempt_is_retired_not_taken_over(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil, open_intent: bool
) -> None:
    """A holder that dies on the final attempt dead-letters the task (crash loops end);
    with an effect intent open the task goes UNKNOWN instead, since the call may have run."""
    [task_id] = submit(ledger, make_task, lease_s=0.2, max_attempts=1)
    [claim] = ledger.claim("worker-a", [TASK], 1)
    if open_intent:
        write = TaskWrite(
            task_id, claim.generation, "worker-a", "effect_intent:charge",
            effects=[EffectWrite("charge", "charge:o-1", "d", EffectState.INTENT)],
        )
        assert ledger.commit([write])[0].ok
    sleep_until(ledger, claim.lease_until)
    assert ledger.claim("worker-b", [TASK], 1) == []
    info = ledger.get(task_id)
    assert info.state is (State.UNKNOWN if open_intent else State.FAILED)
    assert info.generation == claim.generation + 1 and info.holder is None
    assert info.last_error is not None and "worker-a" in info.last_error
    # The dead holder's late write is fenced out.
    late = TaskWrite(task_id, claim.generation, "worker-a", "finish",
                     transition=Transition(State.SUCCEEDED, result_json="1"))
    assert ledger.commit([late])[0].stale
    assert ledger.get(task_id).state is info.state


def test_renewed_lease_is_not_taken_over(ledger: Ledger, make_task: MakeTask) -> None:
    # Renewed every 0.1 s until the ledger clock is well past the first lease's end; a 3 s
    # lease leaves room for a stalled test process on a loaded machine.
    [task_id] = submit(ledger, make_task, lease_s=3.0)
    [claim] = ledger.claim("a", [TASK], 1)
    renewals = 0
    while ledger.now() < claim.lease_until + 1.0:
        [result] = ledger.renew("a", [(task_id, claim.generation)])
        assert result.ok
        renewals += 1
        assert ledger.claim("b", [TASK], 1) == []
        time.sleep(0.1)
    assert renewals > 1
    assert ledger.get(task_id).generation == claim.generation


def test_takeover_carries_committed_steps(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    [task_id] = submit(ledger, make_task, lease_s=0.2)
    [first] = ledger.claim("a", [TASK], 1)
    ledger.commit([TaskWrite(task_id, first.generation, "a", "step", steps=[("s1", "[1,2]")])])
    sleep_until(ledger, first.lease_until)
    [second] = ledger.claim("b", [TASK], 1)
    assert second.takeover
    assert second.steps["s1"].result_json == "[1,2]"
    assert second.steps["s1"].generation == first.generation


# ---------------------------------------------------------------------- races


def _race(stores: list[Ledger], body: Callable[[int, Ledger], list[Claim]]) -> list[list[Claim]]:
    """Run ``body`` in one thread per store, all released at once by a barrier."""
    barrier = threading.Barrier(len(stores))
    results: list[list[Claim]] = [[] for _ in stores]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = body(i, stores[i])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def test_concurrent_claimers_never_get_the_same_task(
    open_store: Callable[[], Ledger], make_task: MakeTask
) -> None:
    setup = open_store()
    ids = submit(setup, make_task, 60)
    stores = [open_store() for _ in range(8)]

    def drain(i: int, store: Ledger) -> list[Claim]:
        got: list[Claim] = []
        while batch := store.claim(f"w{i}", [TASK], 3):
            got.extend(batch)
        return got

    results = _race(stores, drain)
    claimed = Counter(c.task_id for got in results for c in got)
    assert set(claimed) == set(ids)
    assert all(n == 1 for n in claimed.values()), "a task was claimed twice"
    for i, got in enumerate(results):
        for c in got:
            assert c.generation == 1
            assert setup.get(c.task_id).holder == f"w{i}"


@pytest.mark.parametrize("round_no", range(5))
def test_exactly_one_winner_per_task(
    open_store: Callable[[], Ledger], make_task: MakeTask, round_no: int
) -> None:
    setup = open_store()
    [task_id] = submit(setup, make_task)
    stores = [open_store() for _ in range(6)]
    results = _race(stores, lambda i, store: store.claim(f"w{i}", [TASK], 1))
    winners = [i for i, got in enumerate(results) if got]
    assert len(winners) == 1
    assert results[winners[0]][0].task_id == task_id
    assert setup.get(task_id).holder == f"w{winners[0]}"
    assert setup.get(task_id).generation == 1


def test_exactly_one_takeover_of_an_expired_lease(
    open_store: Callable[[], Ledger], make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    setup = open_store()
    [task_id] = submit(setup, make_task, lease_s=0.2)
    [first] = setup.claim("dead-worker", [TASK], 1)
    sleep_until(setup, first.lease_until)
    stores = [open_store() for _ in range(6)]
    results = _race(stores, lambda i, store: store.claim(f"w{i}", [TASK], 1))
    winners = [got[0] for got in results if got]
    assert len(winners) == 1
    assert winners[0].takeover
    assert winners[0].previous_holder == "dead-worker"
    assert winners[0].generation == 2
    assert setup.stats().takeovers == 1
    assert setup.get(task_id).generation == 2
