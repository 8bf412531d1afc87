"""An event delivered while its waiting task's worker is killed reaches the task exactly once.

A ``wf.waiter`` task waits for the event ``shipped`` keyed ``order-<order>`` and then
performs one effect keyed on the payload (``ship:<parcel>``), counted at the counting
service (which does not deduplicate): a lost delivery shows as no execution, a double
delivery (or a second payload) as a second execution or a second key. The worker is a real
process killed with SIGKILL; the event is sent by the test process through the public API
(``App.send_event``), while no worker is alive or while the woken task's holder dies.
Both ledgers.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from wfapp import WAITER
from wfkit import WfRig, wait_for

from ratchet import State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

SIGKILLED = -signal.SIGKILL


def assert_delivered_once(rig: WfRig, task_id: str, payload: dict[str, str]) -> None:
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED, info
    assert info.result["payload"] == payload, info.result
    parcel = payload["parcel"]
    assert rig.executions() == {f"ship:{parcel}": 1}, rig.executions()
    assert info.result["receipt"] == rig.records().ids[f"ship:{parcel}"]
    rig.check_consistent()


@pytest.mark.parametrize("crash_at", [None, "task.after_complete"],
                         ids=["from-outside-while-parked", "right-after-the-park-committed"])
def test_event_sent_while_the_waiters_worker_is_dead(rig: WfRig, crash_at: str | None) -> None:
    """The task is parked waiting; its worker is SIGKILLed (from outside, or at the instant
    its park committed); the event arrives while no worker is alive (twice, the same event
    id: a sender's retry); a fresh worker runs the task with the payload once."""
    rig.start_service()
    task_id = rig.submit(WAITER, {"order": "7"})
    a = rig.worker("A", crash_at=crash_at)
    parked = rig.wait_waiting(task_id)
    if crash_at is None:
        assert a.kill() == SIGKILLED
    else:
        assert a.wait(30) == SIGKILLED, a.log()
    assert parked.holder is None, parked

    payload = {"parcel": "p-7"}
    first = rig.app.send_event("shipped", key="order-7", payload=payload, event_id="ev-7")
    assert (first.duplicate, first.woken) == (False, 1), first
    again = rig.app.send_event("shipped", key="order-7", payload=payload, event_id="ev-7")
    assert again.duplicate and again.event_id == first.event_id, again
    assert again.woken == 0, again
    assert rig.executions() == {}, "nobody ran the task yet"

    b = rig.worker("B")
    assert_delivered_once(rig, task_id, payload)
    rig.stop_all([b])


def test_holder_killed_right_after_the_event_was_delivered(rig: WfRig) -> None:
    """The event wakes the task; the worker that claims it is killed right after
    ``wait_for_event`` returned the payload (before the effect keyed on it). A second,
    different event for the same key arrives while the task is held by the dead worker.
    The next holder gets the first payload again (checkpointed), never the second: one
    effect, on the first parcel."""
    rig.start_service()
    task_id = rig.submit(WAITER, {"order": "8"})
    a = rig.worker("A", crash_at="test.after_event")
    rig.wait_waiting(task_id)

    payload = {"parcel": "p-8"}
    receipt = rig.app.send_event("shipped", key="order-8", payload=payload)
    assert (receipt.duplicate, receipt.woken) == (False, 1), receipt
    assert a.wait(30) == SIGKILLED, a.log()
    held = rig.get(task_id)
    assert held.state is State.RUNNING, held
    other = rig.app.send_event("shipped", key="order-8", payload={"parcel": "p-8-bis"})
    assert not other.duplicate and other.woken == 0, other
    assert rig.executions() == {}

    b = rig.worker("B")
    assert_delivered_once(rig, task_id, payload)
    rig.stop_all([b])


def test_event_sent_while_the_holder_before_its_wait_is_dead(rig: WfRig) -> None:
    """The holder is killed on its way to the wait (running, lease held, not parked yet);
    the event arrives in that gap. The next holder reaches the wait and must get it: an
    event whose waiter's worker died is not lost."""
    rig.start_service()
    task_id = rig.submit(WAITER, {"order": "9"})
    a = rig.worker("A", crash_at="test.before_wait")
    assert a.wait(30) == SIGKILLED, a.log()
    assert rig.get(task_id).state is State.RUNNING

    payload = {"parcel": "p-9"}
    rig.app.send_event("shipped", key="order-9", payload=payload, event_id="ev-9")
    b = rig.worker("B")
    assert_delivered_once(rig, task_id, payload)
    rig.stop_all([b])


@pytest.mark.parametrize("kill_after_ms", [0, 20, 60, 150])
def test_events_and_a_kill_at_the_instant_the_waiters_park(
    rig: WfRig, kill_after_ms: int
) -> None:
    """Six waiters reach their wait at one known instant on worker A; the test sends each
    its event at that instant and SIGKILLs A ``kill_after_ms`` after it, so the sends race
    the parks and the kill lands before, during or after the parks commit. Every task
    gets its event exactly once (the mailbox keeps one sent before the wait; the
    delivery is a checkpoint), and a second event per key is never received."""
    n = 6
    rig.start_service()
    b = rig.standby("B", concurrency=n)
    orders = [f"k{i}" for i in range(n)]
    ids = {o: rig.submit(WAITER, {"order": o, "marks": str(rig.marks)}) for o in orders}
    a = rig.worker("A", concurrency=n, prefetch=0)

    def all_marked() -> list[Path] | None:
        found = sorted(rig.marks.glob("k*"))
        return found if len(found) == n else None

    marks = wait_for("every waiter to mark its instant", all_marked, 30.0, 0.005)
    instant = min(m.stat().st_mtime for m in marks) + 0.5
    while time.time() < instant:
        time.sleep(0.0005)  # pacing to the instant, not waiting for a result
    for o in orders:
        rig.app.send_event("shipped", key=f"order-{o}", payload={"parcel": f"{o}-a"},
                           event_id=f"{o}-a")
    kill_at = instant + kill_after_ms / 1000
    while time.time() < kill_at:
        time.sleep(0.0005)
    assert a.kill() == SIGKILLED
    at_kill = sorted(str(rig.get(t).state) for t in ids.values())
    print(f"states when A died ({kill_after_ms} ms after the instant): {at_kill}")
    for o in orders:
        rig.app.send_event("shipped", key=f"order-{o}", payload={"parcel": f"{o}-b"},
                           event_id=f"{o}-b")

    b.resume()
    for o, task_id in ids.items():
        info = rig.wait_state(task_id)
        assert info.state is State.SUCCEEDED, info
        assert info.result["payload"] == {"parcel": f"{o}-a"}, (o, info.result)
    rig.stop_all([b])
    assert rig.executions() == {f"ship:{o}-a": 1 for o in orders}, rig.executions()
    rig.check_consistent()
