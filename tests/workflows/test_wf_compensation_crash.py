"""SIGKILL during compensation: each compensation executed once, in reverse order.

A ``wf.saga`` task performs three effects (``book``, ``reserve``, ``charge``), each with a
compensation, then fails permanently: its compensations run in the reverse order
(``compensate:charge:<order>``, then ``reserve``, then ``book``), and the task ends
``COMPENSATED``. The worker running the compensations is a real process killed with
SIGKILL at a point inside the compensation functions (before the request leaves, or after
the service executed it and before the result is recorded) or at the core's effect fault
points. Counted at the counting service (which does not deduplicate keys): every forward
effect once, every compensation once, the compensations in reverse order. Both ledgers.
"""

from __future__ import annotations

import signal

import pytest
from wfapp import SAGA, SAGA_STEPS
from wfkit import WfRig

from ratchet import State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

SIGKILLED = -signal.SIGKILL


@pytest.mark.parametrize(
    ("crash_at", "skip", "undone_before"),
    [
        ("test.after_undo", 0, 1),
        ("test.after_undo", 1, 2),
        ("test.after_undo", 2, 3),
        ("test.before_undo", 1, 1),
        ("effect.after_intent", 4, 1),
        ("task.after_complete", 0, 0),
    ],
    ids=["after-1st-undo-call", "after-2nd-undo-call", "after-3rd-undo-call",
         "before-2nd-undo-call", "2nd-undo-intent-committed",
         "failure-committed-before-any-undo"],
)
def test_sigkill_during_compensation(
    rig: WfRig, crash_at: str, skip: int, undone_before: int
) -> None:
    """``undone_before``: compensations the service executed when the worker died."""
    rig.start_service()
    order = "o-1"
    task_id = rig.submit(SAGA, {"order": order})
    a = rig.worker("A", crash_at=crash_at, skip=skip)
    assert a.wait(45) == SIGKILLED, a.log()
    forward = [f"{step}:{order}" for step in SAGA_STEPS]
    undo = [f"compensate:{key}" for key in reversed(forward)]
    executed = rig.executions()
    assert executed == {**dict.fromkeys(forward, 1), **dict.fromkeys(undo[:undone_before], 1)}
    state = rig.get(task_id).state
    assert state in (State.RUNNING, State.COMPENSATING), state

    b = rig.worker("B")
    info = rig.wait_state(task_id, timeout_s=45)
    rig.stop_all([b])
    assert info.state is State.COMPENSATED, info
    records = rig.records()
    assert records.executions == {**dict.fromkeys(forward, 1), **dict.fromkeys(undo, 1)}, (
        records.executions)
    order_of_undo = [key for _, key in records.times if key.startswith("compensate:")]
    assert order_of_undo == undo, "compensations must run once each, in reverse order"
    assert [key for _, key in records.times][:3] == forward
    rig.check_consistent()


@pytest.mark.parametrize(
    ("crash_at", "skip", "done_before"),
    [("effect.after_call", 1, 2), ("effect.after_intent", 2, 2)],
    ids=["reserve-executed-not-recorded", "charge-intent-committed-not-sent"],
)
def test_sigkill_before_the_failure_every_effect_done_is_compensated(
    rig: WfRig, crash_at: str, skip: int, done_before: int
) -> None:
    """Killed in the forward part of the saga, with an effect's outcome open; the next
    holder settles it (lookup first: found, reused; or not found, sent), fails, and
    compensates every effect that happened, the one settled by lookup too: each
    compensation once, in reverse order."""
    rig.start_service()
    order = "o-2"
    task_id = rig.submit(SAGA, {"order": order})
    a = rig.worker("A", crash_at=crash_at, skip=skip)
    assert a.wait(45) == SIGKILLED, a.log()
    forward = [f"{step}:{order}" for step in SAGA_STEPS]
    undo = [f"compensate:{key}" for key in reversed(forward)]
    assert rig.executions() == dict.fromkeys(forward[:done_before], 1)

    b = rig.worker("B")
    info = rig.wait_state(task_id, timeout_s=45)
    rig.stop_all([b])
    assert info.state is State.COMPENSATED, info
    records = rig.records()
    assert records.executions == {**dict.fromkeys(forward, 1), **dict.fromkeys(undo, 1)}, (
        records.executions)
    assert [key for _, key in records.times] == forward + undo
    rig.check_consistent()
