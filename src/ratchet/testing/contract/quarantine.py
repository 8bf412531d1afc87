"""Contract: quarantine is counted and decided by the ledger (DESIGN §7), on every backend.

* A fenced failure carries its error fingerprint; the ledger counts failures in a row with
  the same fingerprint and, at the task's ``quarantine_after``, turns the retry into a
  quarantined ``FAILED`` in the same transaction.
* A delivery whose holder is gone (lease expiry, revocation) is counted by the ledger (the
  worker is dead); at ``quarantine_after`` such deliveries the task is quarantined instead of
  taken over or re-queued.
* A replay re-queues the quarantined tasks of one fingerprint with fresh attempt counters
  at staggered ``run_at``; a dry run writes nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest

from ...fingerprint import fingerprint, worker_died
from ...ledger.base import EffectState, EffectWrite, Ledger, NewTask, TaskWrite, Transition
from ...states import State
from ...storedtext import StoredState

TASK = "contract.task"
FP_A = fingerprint(TASK, "RuntimeError", "order 1 timed out")
FP_B = fingerprint(TASK, "RuntimeError", "order 'x' not found")


def _submit(ledger: Ledger, make_task: Callable[..., NewTask], *, quarantine_after: int | None,
            max_attempts: int = 10, lease_s: float = 30.0) -> str:
    task = dataclasses.replace(make_task(max_attempts=max_attempts, lease_s=lease_s),
                               quarantine_after=quarantine_after)
    [result] = ledger.submit([task])
    return result.task_id


def _fail(ledger: Ledger, task_id: str, fp: str | None, holder: str = "w1",
          to: State = State.RETRY_WAIT) -> State | StoredState:
    """Claim the task and record a failure (``to``: what the worker decided) with
    fingerprint ``fp``; return the state the ledger applied."""
    [claim] = ledger.claim(holder, [TASK], 1)
    assert claim.task_id == task_id
    [outcome] = ledger.commit([TaskWrite(
        task_id, claim.generation, holder, f"finish:{to.value}",
        transition=Transition(to, error="RuntimeError: boom",
                              error_class="transient", reason="retry", fingerprint=fp))])
    assert outcome.ok
    return ledger.get(task_id).state


def test_same_fingerprint_n_times_in_a_row_quarantines(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    task_id = _submit(ledger, make_task, quarantine_after=3)
    assert _fail(ledger, task_id, FP_A) is State.RETRY_WAIT
    assert _fail(ledger, task_id, FP_A) is State.RETRY_WAIT
    assert _fail(ledger, task_id, FP_A) is State.FAILED
    info = ledger.get(task_id)
    assert info.attempt == 3 and info.error_class == "transient"
    assert ledger.claim("w2", [TASK], 5) == []  # never redelivered automatically
    [group] = ledger.quarantine_groups()
    assert (group.fingerprint, group.name, group.count, group.task_ids) == (
        FP_A, TASK, 1, [task_id])
    assert group.first_at <= group.last_at
    kinds = [e.kind for e in ledger.timeline(task_id).events]
    assert kinds.count("quarantine") == 1
    [q] = [e for e in ledger.timeline(task_id).events if e.kind == "quarantine"]
    assert q.detail["fingerprint"] == FP_A and q.detail["count"] == 3


def test_a_different_fingerprint_restarts_the_streak(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    task_id = _submit(ledger, make_task, quarantine_after=2, max_attempts=5)
    for fp in (FP_A, FP_B, FP_A, FP_B):
        assert _fail(ledger, task_id, fp) is State.RETRY_WAIT
    # The fifth failure exhausts the attempts (the worker writes FAILED): not quarantined.
    assert _fail(ledger, task_id, FP_A, to=State.FAILED) is State.FAILED
    assert ledger.quarantine_groups() == []


def test_failures_without_fingerprint_and_unset_threshold_never_quarantine(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    off = _submit(ledger, make_task, quarantine_after=None, max_attempts=4)
    for _ in range(3):
        assert _fail(ledger, off, FP_A) is State.RETRY_WAIT
    unpinned = _submit(ledger, make_task, quarantine_after=1, max_attempts=4)
    # Claims take the oldest ready task: finish `off` first.
    assert _fail(ledger, off, FP_A, to=State.FAILED) is State.FAILED
    for _ in range(3):
        assert _fail(ledger, unpinned, None) is State.RETRY_WAIT  # overload/unknown: no fp
    assert ledger.quarantine_groups() == []


def test_a_final_failure_with_the_streak_is_flagged(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    """A permanent failure (FAILED at once) that completes a streak is flagged too."""
    task_id = _submit(ledger, make_task, quarantine_after=2)
    assert _fail(ledger, task_id, FP_A) is State.RETRY_WAIT
    [claim] = ledger.claim("w1", [TASK], 1)
    ledger.commit([TaskWrite(task_id, claim.generation, "w1", "finish:FAILED",
                             transition=Transition(State.FAILED, error="e", reason="permanent",
                                                   error_class="permanent", fingerprint=FP_A))])
    [group] = ledger.quarantine_groups()
    assert group.task_ids == [task_id] and group.error_class == "permanent"


def test_expired_leases_count_as_dead_workers_and_quarantine(
    ledger: Ledger, make_task: Callable[..., NewTask],
    sleep_until: Callable[[Ledger, float], None],
) -> None:
    task_id = _submit(ledger, make_task, quarantine_after=3, lease_s=0.05)
    until = ledger.claim("w1", [TASK], 1)[0].lease_until
    for holder in ("w2", "w3"):
        sleep_until(ledger, until)
        [claim] = ledger.claim(holder, [TASK], 1)
        assert claim.takeover
        until = claim.lease_until
    sleep_until(ledger, until)
    # Third dead delivery: quarantined instead of taken over.
    assert ledger.claim("w4", [TASK], 1) == []
    info = ledger.get(task_id)
    assert info.state is State.FAILED and info.error_class == "lease_expired"
    [group] = ledger.quarantine_groups()
    assert group.fingerprint == worker_died(TASK) and group.task_ids == [task_id]


def test_revocations_count_as_dead_workers_and_quarantine(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    task_id = _submit(ledger, make_task, quarantine_after=2)
    ledger.claim("w1", [TASK], 1)
    assert ledger.revoke_holder("w1", "test", "pid gone") == [task_id]
    assert ledger.get(task_id).state is State.RETRY_WAIT
    ledger.claim("w2", [TASK], 1)
    ledger.revoke_holder("w2", "test", "pid gone")
    assert ledger.get(task_id).state is State.FAILED
    [group] = ledger.quarantine_groups()
    assert group.fingerprint == worker_died(TASK)


def test_an_open_intent_goes_unknown_not_quarantined(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    task_id = _submit(ledger, make_task, quarantine_after=1)
    [claim] = ledger.claim("w1", [TASK], 1)
    ledger.commit([TaskWrite(task_id, claim.generation, "w1", "effect:charge", effects=[
        EffectWrite("charge", "k1", "d", EffectState.INTENT)])])
    ledger.commit([TaskWrite(task_id, claim.generation, "w1", "finish:RETRY_WAIT",
                             transition=Transition(State.RETRY_WAIT, error="e",
                                                   fingerprint=FP_A))])
    assert ledger.get(task_id).state is State.UNKNOWN
    assert ledger.quarantine_groups() == []


def test_replay_requeues_with_fresh_counters_and_dry_run_changes_nothing(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    ids = [_submit(ledger, make_task, quarantine_after=1) for _ in range(3)]
    claims = ledger.claim("w1", [TASK], 3)  # same run_at possible: claim them together
    assert sorted(c.task_id for c in claims) == sorted(ids)
    ledger.commit([TaskWrite(c.task_id, c.generation, "w1", "finish:RETRY_WAIT",
                             transition=Transition(State.RETRY_WAIT, error="e",
                                                   fingerprint=FP_A)) for c in claims])
    assert all(ledger.get(t).state is State.FAILED for t in ids)
    # Replay order: oldest quarantine first (here one instant), then task id.
    ids = [p.task_id for p in ledger.quarantine_replay(FP_A, 5.0, "alice", "", dry_run=True)]
    before = [ledger.get(t) for t in ids]
    preview = ledger.quarantine_replay(FP_A, 5.0, "alice", "", dry_run=True)
    assert [p.task_id for p in preview] == ids
    assert [ledger.get(t) for t in ids] == before  # nothing changed
    assert all("operator_replay" not in [e.kind for e in ledger.timeline(t).events]
               for t in ids)

    replayed = ledger.quarantine_replay(FP_A, 5.0, "alice", "fixed the parser")
    assert [p.task_id for p in replayed] == ids
    gaps = [b.run_at - a.run_at for a, b in itertools.pairwise(replayed)]
    assert gaps == pytest.approx([0.2, 0.2])
    for p in replayed:
        info = ledger.get(p.task_id)
        assert info.state is State.PENDING and info.attempt == 0
        assert info.run_at == pytest.approx(p.run_at)
        [event] = [e for e in ledger.timeline(p.task_id).events if e.kind == "operator_replay"]
        assert event.detail["operator"] == "alice"
        assert event.detail["reason"] == "fixed the parser"
        assert event.detail["fingerprint"] == FP_A
        assert (event.from_state, event.to_state) == ("FAILED", "PENDING")
    assert ledger.quarantine_groups() == []
    # Fresh counters: one more identical failure quarantines again (threshold 1), and the
    # replay of an empty fingerprint does nothing.
    assert ledger.quarantine_replay(FP_B, 1.0, "alice", "none there") == []
