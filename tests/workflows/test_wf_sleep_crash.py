"""A durable sleep survives SIGKILL: before it, at the wake-up, and while parked.

A ``wf.sleeper`` task runs: step ``prepare``, effect ``before``, ``ctx.sleep("nap")``,
effect ``after``, step ``finish``. A real worker process is killed with SIGKILL (at a fault
point in the task code, at the worker's claim of the woken task, or from outside while the
task is parked ``WAITING``), a fresh worker finishes. Counted outside Ratchet: each effect
executed once at the counting service (which does not deduplicate keys), each step ran
once (the external step log), the ``after`` effect never before the deadline fixed at the
first reach of the sleep and never after a second full nap (the deadline is not reset by a
replay). Both ledgers.
"""

from __future__ import annotations

import signal

import pytest
from wfapp import SLEEPER
from wfkit import WfRig

from ratchet import State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

SIGKILLED = -signal.SIGKILL


def assert_slept_once(rig: WfRig, task_id: str, order: str, nap_s: float) -> None:
    """Every effect once at the service, every step once, the nap taken exactly once."""
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED, info
    executions = rig.executions()
    assert executions == {f"before:{order}": 1, f"after:{order}": 1}, executions
    assert dict(rig.step_counts(task_id)) == {"prepare": 1, "finish": 1}
    (before_at,) = rig.times(f"before:{order}")
    (after_at,) = rig.times(f"after:{order}")
    # The deadline was fixed when the sleep was first reached, after "before" executed.
    assert after_at >= before_at + nap_s, ("woke early", after_at - before_at)
    # A replay never sleeps again from its own start: at most one nap (plus recovery).
    assert after_at < before_at + 2 * nap_s, ("slept twice", after_at - before_at)
    records = rig.records()
    assert info.result == {
        "before": records.ids[f"before:{order}"],
        "after": records.ids[f"after:{order}"],
        "final": {"order": order, "done": True},
    }
    rig.check_consistent()


def test_sigkill_before_the_sleep_is_reached(rig: WfRig) -> None:
    """Killed after the effect before the sleep, before the sleep is recorded: the next
    holder does not repeat the effect, sleeps, and runs the rest once."""
    nap_s = 3.0
    rig.start_service()
    b = rig.standby("B")
    task_id = rig.submit(SLEEPER, {"order": "s1", "nap_s": nap_s})
    a = rig.worker("A", crash_at="test.before_sleep")
    assert a.wait(30) == SIGKILLED, a.log()
    assert rig.executions() == {"before:s1": 1}
    assert rig.get(task_id).state is State.RUNNING

    b.resume()
    assert_slept_once(rig, task_id, "s1", nap_s)
    rig.stop_all([b])


@pytest.mark.parametrize("crash_at", [None, "task.after_complete"],
                         ids=["from-outside-while-parked", "right-after-the-park-committed"])
def test_sigkill_while_parked_in_the_sleep(rig: WfRig, crash_at: str | None) -> None:
    """Killed while the task is parked (WAITING: no lease, no slot), from outside, or at
    the instant its park (``RUNNING -> WAITING``, the sleep's deadline with it) committed,
    before the worker learnt it: nothing is lost and nothing runs early; a fresh worker
    wakes it at its deadline."""
    nap_s = 3.0
    rig.start_service()
    b = rig.standby("B")
    task_id = rig.submit(SLEEPER, {"order": "s2", "nap_s": nap_s})
    a = rig.worker("A", crash_at=crash_at)
    parked = rig.wait_waiting(task_id)
    assert parked.holder is None, parked
    if crash_at is None:
        assert a.kill() == SIGKILLED
    else:
        assert a.wait(30) == SIGKILLED, a.log()
    assert rig.executions() == {"before:s2": 1}, "nothing after the sleep ran yet"
    assert rig.get(task_id).state is State.WAITING

    b.resume()
    assert_slept_once(rig, task_id, "s2", nap_s)
    rig.stop_all([b])


@pytest.mark.parametrize(
    ("crash_at", "skip"),
    [("test.after_wake", 0), ("claim.after_commit", 1)],
    ids=["in-task-after-sleep-returned", "wake-claim-committed"],
)
def test_sigkill_at_the_wake_up(rig: WfRig, crash_at: str, skip: int) -> None:
    """Killed at the wake-up: right after ``ctx.sleep`` returned in the task, or right
    after the worker's claim of the woken task committed (its second claim). The next
    holder does not sleep again (the deadline is the first one) and runs the effect after
    the sleep once; the effect before it is not repeated."""
    nap_s = 3.0
    rig.start_service()
    b = rig.standby("B")
    task_id = rig.submit(SLEEPER, {"order": "s3", "nap_s": nap_s})
    a = rig.worker("A", crash_at=crash_at, skip=skip)
    rig.wait_waiting(task_id)
    assert a.wait(30) == SIGKILLED, a.log()
    assert rig.executions() == {"before:s3": 1}, "killed before the effect after the sleep"
    held = rig.get(task_id)
    assert held.state is State.RUNNING and held.holder is not None, held

    b.resume()
    assert_slept_once(rig, task_id, "s3", nap_s)
    rig.stop_all([b])
