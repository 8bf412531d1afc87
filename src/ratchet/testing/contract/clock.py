"""Contract: a step of the ledger clock never leaves work idle (DESIGN §4, the ledger
clock). The clock is injected into the ledger object (``ratchet.testing.inject_clock``)
and stepped 60 s forward, then back, as NTP does; time "passing" is a step too, so no test
waits on the wall clock.

* A write that makes a task ready now (release, retry without delay, operator retry,
  resolve) never moves its ``run_at`` later: after the step back it is claimable at once.
* A delayed write (retry backoff, a submit's delay, a paused delayed task) waits at most
  its delay after the step back, never the step's length, and is not made ready earlier.
* A lease granted ahead of the clock ends at most ``lease_s`` after the step back.
* A write after the step back on a row written before it (a pause, a holder's pause at a
  boundary, a takeover, a pause applied for a gone holder, a resolution into a pause) keeps
  the row's own wait: the resume makes it ready after that wait, not the step's.
"""

from __future__ import annotations

from collections.abc import Callable

from ...ledger.base import Ledger, NewTask, ResolveOutcome, TaskWrite, Transition
from ...states import State
from ..clock import LedgerClock, inject_clock

TASK = "contract.task"
STEP_S = 60.0


def _write(c: object, to: State, delay_s: float = 0.0, **kw: object) -> TaskWrite:
    return TaskWrite(c.task_id, c.generation, "w1", f"finish:{to.value}",  # type: ignore[attr-defined]
                     transition=Transition(to, delay_s=delay_s, **kw))  # type: ignore[arg-type]


def _claim_all(ledger: Ledger, holder: str = "w2", n: int = 50) -> set[str]:
    return {c.task_id for c in ledger.claim(holder, [TASK], n)}


def test_releases_during_a_forward_step_are_claimable_at_once_after_the_step_back(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    ids = [r.task_id for r in ledger.submit([make_task(max_attempts=3) for _ in range(5)])]
    before = {t: ledger.get(t).run_at for t in ids}
    clock.step(STEP_S)
    claims = {c.task_id: c for c in ledger.claim("w1", [TASK], 5)}
    assert set(claims) == set(ids)
    released, retried, failed, unknown, running = (claims[t] for t in ids)
    outcomes = ledger.commit([
        _write(released, State.PENDING, reason="shutdown"),
        _write(retried, State.RETRY_WAIT, error="e", error_class="transient"),
        _write(failed, State.FAILED, error="e", error_class="permanent"),
        _write(unknown, State.UNKNOWN, error="e", error_class="outcome_unknown"),
    ])
    assert all(o.ok for o in outcomes)
    ledger.retry(failed.task_id, "again", "op")  # an operator's retry, ahead of the clock
    ledger.resolve(unknown.task_id, ResolveOutcome.NOT_DONE, "never sent", "op")
    # Ready now: never later than it was (the pre-step run_at is kept).
    for t in (released, retried, failed, unknown):
        assert ledger.get(t.task_id).run_at <= before[t.task_id]
    clock.step(-STEP_S)
    again = _claim_all(ledger)
    assert again == {released.task_id, retried.task_id, failed.task_id, unknown.task_id}
    assert running.task_id not in again  # its lease (30 s) is not over


def test_delays_written_ahead_of_the_clock_wait_their_delay_not_the_step(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    [first] = [r.task_id for r in ledger.submit([make_task(max_attempts=3)])]
    clock.step(STEP_S)
    [c] = ledger.claim("w1", [TASK], 1)
    assert ledger.commit([_write(c, State.RETRY_WAIT, delay_s=5.0, error="e",
                                 error_class="transient")])[0].ok
    [later] = [r.task_id for r in ledger.submit([make_task(delay_s=5.0)])]
    clock.step(-STEP_S)
    # Not ready before its delay: the backoff is kept, not dropped.
    assert _claim_all(ledger) == set()
    now = ledger.now()
    for t in (first, later):
        assert ledger.get(t).run_at <= now + 5.0 + 1.0, "stretched by the step"
    clock.step(5.0 + 1.0)  # the delay passes
    assert _claim_all(ledger) == {first, later}


def test_a_lease_granted_ahead_of_the_clock_ends_within_lease_s_after_the_step_back(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    [tid] = [r.task_id for r in ledger.submit([make_task(lease_s=10.0)])]
    clock.step(STEP_S)
    [c] = ledger.claim("w1", [TASK], 1)  # w1 then dies: it never renews
    clock.step(-STEP_S)
    assert _claim_all(ledger) == set()  # the lease is not over yet
    clock.step(10.0 + 1.0)  # lease_s passes
    [taken] = ledger.claim("w2", [TASK], 1)
    assert (taken.task_id, taken.takeover) == (tid, True)
    assert taken.generation == c.generation + 1


def test_a_paused_delayed_task_resumed_after_the_step_back_keeps_only_its_delay(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task(delay_s=5.0)])]
    ledger.pause("task", tid, "hold", "op")
    clock.step(-STEP_S)
    ledger.resume("task", tid, "go", "op")
    assert _claim_all(ledger) == set()  # its delay is kept through the pause
    assert ledger.get(tid).run_at <= ledger.now() + 5.0 + 1.0
    clock.step(5.0 + 1.0)
    assert _claim_all(ledger) == {tid}


def test_a_frozen_clock_stands_still(ledger: Ledger) -> None:
    clock: LedgerClock = inject_clock(ledger)
    clock.freeze(1_000_000.25)
    assert ledger.now() == 1_000_000.25
    clock.step(2.0)
    assert ledger.now() == 1_000_002.25
    clock.thaw()
    assert ledger.now() > 1_000_002.25


# Operator writes after a step back, before any claim (workers stopped): every statement that
# rewrites updated_at of a row whose run_at it keeps re-anchors that run_at first, so the
# row's wait (run_at - updated_at) stays its own wait, never the step's length.


def _paused_then_resumed_is_ready(ledger: Ledger, tid: str) -> None:
    assert ledger.get(tid).state is State.PAUSED
    ledger.resume("task", tid, "go", "op")
    assert ledger.get(tid).run_at <= ledger.now() + 1.0, "stretched by the step"
    assert _claim_all(ledger) == {tid}


def test_a_delayed_task_paused_after_the_step_back_keeps_only_its_delay(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task(delay_s=5.0)])]
    clock.step(-STEP_S)
    ledger.pause("task", tid, "hold", "op")  # no claim since the step
    assert ledger.get(tid).run_at <= ledger.now() + 5.0 + 1.0, "stretched by the step"
    ledger.resume("task", tid, "go", "op")
    assert _claim_all(ledger) == set()  # its delay is kept through the pause
    assert ledger.get(tid).run_at <= ledger.now() + 5.0 + 1.0, "stretched by the step"
    clock.step(5.0 + 1.0)
    assert _claim_all(ledger) == {tid}


def test_a_retry_wait_whose_type_an_operator_pauses_after_the_step_back_waits_its_delay(
    ledger: Ledger, open_store: Callable[[], Ledger], make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    [tid] = [r.task_id for r in ledger.submit([make_task(max_attempts=3)])]
    clock.step(STEP_S)
    [c] = ledger.claim("w1", [TASK], 1)
    assert ledger.commit([_write(c, State.RETRY_WAIT, delay_s=1.0, error="e",
                                 error_class="transient")])[0].ok
    clock.step(-STEP_S)  # the workers are stopped: nothing claims
    operator = open_store()  # the operator's command, a process of its own
    inject_clock(operator, clock)
    operator.pause("type", TASK, "maintenance", "op")
    operator.resume("type", TASK, "done", "op")
    assert ledger.get(tid).run_at <= ledger.now() + 1.0 + 1.0, "stretched by the step"
    clock.step(2.0)
    assert _claim_all(ledger) == {tid}


def test_a_holder_pausing_at_its_boundary_after_the_step_back_is_ready_on_resume(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task()])]
    [c] = ledger.claim("w1", [TASK], 1)
    ledger.pause("task", tid, "hold", "op")  # a request: the holder stops at a boundary
    clock.step(-STEP_S)
    assert ledger.commit([_write(c, State.PAUSED, reason="paused")])[0].ok
    _paused_then_resumed_is_ready(ledger, tid)


def test_a_taken_over_task_pausing_after_the_step_back_is_ready_on_resume(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task(lease_s=10.0)])]
    ledger.claim("w1", [TASK], 1)  # w1 then dies
    clock.step(-STEP_S)
    assert _claim_all(ledger) == set()  # the lease is capped, not over yet
    clock.step(10.0 + 1.0)
    [taken] = ledger.claim("w2", [TASK], 1)
    assert taken.takeover
    ledger.pause("task", tid, "hold", "op")
    assert ledger.commit([_write(taken, State.PAUSED, reason="paused")])[0].ok
    _paused_then_resumed_is_ready(ledger, tid)


def test_a_pause_applied_for_a_gone_holder_after_the_step_back_is_ready_on_resume(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task(lease_s=10.0)])]
    ledger.claim("w1", [TASK], 1)  # w1 then dies
    ledger.pause("task", tid, "hold", "op")  # a request on its lease
    clock.step(-STEP_S)
    assert _claim_all(ledger) == set()  # the lease is capped, not over yet
    clock.step(10.0 + 1.0)
    assert _claim_all(ledger) == set()  # the ledger applies the request: PAUSED
    _paused_then_resumed_is_ready(ledger, tid)


def test_an_unknown_task_resolved_into_its_pause_after_the_step_back_is_ready_on_resume(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    clock = inject_clock(ledger)
    clock.step(STEP_S)
    [tid] = [r.task_id for r in ledger.submit([make_task()])]
    [c] = ledger.claim("w1", [TASK], 1)
    assert ledger.commit([_write(c, State.UNKNOWN, error="e",
                                 error_class="outcome_unknown")])[0].ok
    ledger.pause("task", tid, "hold", "op")  # kept for the resolution
    clock.step(-STEP_S)
    ledger.resolve(tid, ResolveOutcome.NOT_DONE, "never sent", "op")
    _paused_then_resumed_is_ready(ledger, tid)
