"""Waits in the ledger itself, on both ledgers (DESIGN §3, waits): a parked write is fenced
like every write; a wait hands its attempt back and the claim's wake-up makes it ready at
its deadline, never before; an event sent to a waiting task is its checkpoint; the fan-in
trigger counts each awaited child once, whatever ends it, and wakes the parent once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ratchet import open_ledger
from ratchet.ledger.base import (
    FOREVER,
    Ledger,
    NewTask,
    TaskWrite,
    Transition,
    WaitSpec,
)
from ratchet.serde import digest, dumps, loads
from ratchet.states import State
from ratchet.testing import wait_for

TASK = "wl.task"


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    opened = open_ledger(ledger_url)
    try:
        yield opened
    finally:
        opened.close()


def _submit(ledger: Ledger, task_id: str, parent: str | None = None, lease_s: float = 3600.0
            ) -> None:
    params = dumps({"id": task_id})
    ledger.submit([NewTask(task_id, TASK, 1, params, digest(TASK, params), None, 3, lease_s,
                           parent_id=parent)])


def _claim(ledger: Ledger, task_id: str, holder: str = "w1") -> int:
    claims = {c.task_id: c for c in ledger.claim(holder, [TASK], 50)}
    return claims[task_id].generation


def _park(ledger: Ledger, task_id: str, generation: int, wait: WaitSpec,
          run_at: float = FOREVER) -> bool:
    [outcome] = ledger.commit([TaskWrite(task_id, generation, "w1", "park", transition=(
        Transition(State.WAITING, run_at=run_at, wait=wait)))])
    return outcome.ok and not outcome.stale


def test_a_stale_parked_write_is_fenced(ledger: Ledger) -> None:
    _submit(ledger, "t1", lease_s=0.05)
    old = _claim(ledger, "t1")
    wait_for("the lease to expire", lambda: ledger.now() > ledger.get("t1").lease_until)
    new = _claim(ledger, "t1", "w2")  # a takeover
    assert new == old + 1
    assert not _park(ledger, "t1", old, WaitSpec("sleep"), ledger.now())
    info = ledger.get("t1")
    assert info.state is State.RUNNING and info.holder == "w2" and info.generation == new


def test_a_sleep_is_claimable_at_its_deadline_not_before_and_keeps_its_attempt(
        ledger: Ledger) -> None:
    _submit(ledger, "t1")
    generation = _claim(ledger, "t1")
    deadline = ledger.now() + 0.5
    assert _park(ledger, "t1", generation, WaitSpec("sleep"), deadline)
    parked = ledger.get("t1")
    assert parked.state is State.WAITING and parked.attempt == 0 and parked.holder is None
    assert ledger.claim("w1", [TASK], 5) == []  # not due yet
    [claim] = wait_for("the deadline", lambda: ledger.claim("w1", [TASK], 5))
    assert claim.task_id == "t1" and claim.attempt == 1 and claim.ledger_now >= deadline
    assert [e.kind for e in ledger.timeline("t1").events][-2:] == ["wake", "claim"]


def test_an_event_is_delivered_as_the_waits_checkpoint(ledger: Ledger) -> None:
    _submit(ledger, "t1")
    generation = _claim(ledger, "t1")
    assert _park(ledger, "t1", generation,
                 WaitSpec("event", "shipped", "o-1", "event:shipped", 3, 0))
    other = ledger.send_event("shipped", "o-2", dumps(1))
    assert other.woken == 0 and ledger.get("t1").state is State.WAITING
    receipt = ledger.send_event("shipped", "o-1", dumps({"n": 1}), "e-1", "tester")
    assert receipt.woken == 1
    assert ledger.get("t1").state is State.PENDING
    [claim] = ledger.claim("w1", [TASK], 5)
    delivered = claim.steps["event:shipped"]
    assert loads(delivered.result_json) == {"seq": receipt.seq, "payload": {"n": 1}}
    assert delivered.seq == 3


def test_a_wait_finds_an_event_sent_before_it_and_skips_one_it_had(ledger: Ledger) -> None:
    _submit(ledger, "t1")
    first = ledger.send_event("tick", "k", dumps("a"))
    second = ledger.send_event("tick", "k", dumps("b"))
    generation = _claim(ledger, "t1")
    # A second wait of the code path: it already received the first event.
    assert _park(ledger, "t1", generation,
                 WaitSpec("event", "tick", "k", "event:tick#2", 2, first.seq))
    assert ledger.get("t1").state is State.PENDING  # woken by its own mailbox read
    [claim] = ledger.claim("w1", [TASK], 5)
    assert loads(claim.steps["event:tick#2"].result_json) == {"seq": second.seq,
                                                               "payload": "b"}


def test_the_parent_wakes_once_when_its_last_awaited_child_ends(ledger: Ledger) -> None:
    _submit(ledger, "p")
    parent = _claim(ledger, "p")
    for child in ("c1", "c2", "c3"):
        _submit(ledger, child, parent="p")
    claims = {c.task_id: c.generation for c in ledger.claim("w2", [TASK], 10)}
    assert set(claims) == {"c1", "c2", "c3"}
    # c3 ends before the parent waits: it is not counted.
    ledger.commit([TaskWrite("c3", claims["c3"], "w2", "done",
                             transition=Transition(State.SUCCEEDED, result_json="3"))])
    assert _park(ledger, "p", parent, WaitSpec("children", children=("c1", "c2", "c3")))
    [wait] = ledger.waits(["p"])
    assert wait.kind == "children" and wait.children_left == 2
    ledger.commit([TaskWrite("c1", claims["c1"], "w2", "done",
                             transition=Transition(State.FAILED, error="boom"))])
    assert ledger.get("p").state is State.WAITING
    assert ledger.waits(["p"])[0].children_left == 1
    # The last one ends by an operator's cancel (a request, applied by its holder).
    ledger.cancel("c2", "not needed", "tester")
    ledger.commit([TaskWrite("c2", claims["c2"], "w2", "cancelled",
                             transition=Transition(State.CANCELLED))])
    assert ledger.get("p").state is State.PENDING
    [wake] = [e for e in ledger.timeline("p").events if e.kind == "wake"]
    assert wake.detail == {"cause": "children ended", "last": "c2"}
    assert ledger.waits(["p"])[0].kind is None  # not waiting any more


def test_a_wait_on_children_that_all_ended_is_ready_at_once(ledger: Ledger) -> None:
    _submit(ledger, "p")
    parent = _claim(ledger, "p")
    _submit(ledger, "c1", parent="p")
    [child] = ledger.claim("w2", [TASK], 5)
    ledger.commit([TaskWrite("c1", child.generation, "w2", "done",
                             transition=Transition(State.SUCCEEDED, result_json="1"))])
    assert _park(ledger, "p", parent, WaitSpec("children", children=("c1",)))
    assert ledger.get("p").state is State.PENDING
    [wake] = [e for e in ledger.timeline("p").events if e.kind == "wake"]
    assert wake.detail == {"cause": "children ended"}
    assert [c.task_id for c in ledger.children("p")] == ["c1"]
