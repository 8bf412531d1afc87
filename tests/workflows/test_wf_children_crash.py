"""Child tasks under SIGKILL: 1,000 children submitted by a parent whose worker is killed
mid-submission, and the fan-in race of the last two children finishing at one instant.

Counted outside Ratchet: the parent's fan-in effect (after ``ctx.gather``) at the
counting service, which does not deduplicate keys, and the fan-in step in the external
step log. The children are counted in the ledger (each row with its ``parent_id``): the
question there is what the ledger holds, not how often something ran. Both ledgers.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from wfapp import CHILD, PARENT, RACE_PARENT, RACER
from wfkit import WfRig

from ratchet import State
from ratchet.testing import list_task_ids

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

SIGKILLED = -signal.SIGKILL
N = 1000


@pytest.mark.parametrize(
    ("mode", "batch", "crash_at", "skip", "committed"),
    [
        ("loop", 0, "test.mid_submit", 0, N // 2),
        ("many", 250, "test.between_batches", 1, N // 2),
        ("many", 0, "test.after_batch", 0, N),
        ("many", 0, None, 0, None),
    ],
    ids=["loop-killed-at-child-500", "many-killed-after-2-of-4-batches",
         "many-killed-after-the-batch-committed-before-its-checkpoint",
         "many-killed-from-outside-as-children-appear"],
)
def test_sigkill_while_the_parent_submits_1000_children(
    rig: WfRig, mode: str, batch: int, crash_at: str | None, skip: int, committed: int | None
) -> None:
    """The parent's worker A (which also runs children) is killed while the parent submits
    1,000 children: at a point in the parent's loop of ``ctx.submit``, between two
    ``ctx.submit_many`` batches, right after a batch committed (before the checkpoint of
    its ids is durable: the replay submits the same children again), or from outside
    (SIGKILL) as soon as the first child is in the ledger. A fresh worker finishes:
    exactly 1,000 children exist, each once, and the parent finishes with every result in
    order; its fan-in effect runs once."""
    rig.start_service()
    tag = f"{mode}-{batch}-{crash_at}"
    parent_id = rig.submit(PARENT, {"tag": tag, "n": N, "mode": mode, "batch": batch})
    if crash_at is not None:
        a = rig.worker("A", crash_at=crash_at, skip=skip, concurrency=4)
        assert a.wait(60) == SIGKILLED, a.log()
    else:
        a = rig.worker("A", concurrency=4)
        status = rig.kill_when(
            "the first child to be in the ledger", a,
            lambda: len(list_task_ids(rig.ledger_url)) > 1,
        )  # fmt: skip
        assert status == SIGKILLED
    assert rig.executions() == {}, "the fan-in cannot have run before every child ended"
    before = len(list_task_ids(rig.ledger_url)) - 1
    if committed is not None:
        # Each ctx.submit / submit_many batch is committed before it returns.
        assert before == committed, f"{before} children committed before the crash"
    else:
        assert before >= 1

    b = rig.worker("B", concurrency=8)
    c = rig.worker("C", concurrency=8)
    info = rig.wait_state(parent_id, timeout_s=90)
    assert info.state is State.SUCCEEDED, info
    rig.stop_all([b, c])

    assert info.result["values"] == [2 * i for i in range(N)], "every result, in order"
    assert rig.executions() == {f"fanin:{tag}": 1}, rig.executions()
    tasks = rig.tasks()
    children = [t for t in tasks if t.task_id != parent_id]
    assert len(tasks) == N + 1, f"{len(children)} other tasks besides the parent"
    assert all(t.name == CHILD for t in children), Counter(t.name for t in children)
    assert all(t.parent_id == parent_id for t in children)
    assert sorted(t.params["i"] for t in children) == list(range(N)), "each child once"
    assert Counter(t.state for t in children) == {State.SUCCEEDED: N}
    rig.check_consistent()


@pytest.mark.parametrize(
    ("sync_gather", "one_worker"),
    [(False, False), (True, False), (False, True)],
    ids=["parent-parked-first", "parent-parks-at-the-same-instant",
         "both-on-one-worker-one-group-commit"],
)
def test_the_last_two_children_finish_at_one_instant(
    rig: WfRig, sync_gather: bool, one_worker: bool
) -> None:
    """Two children of one parent run on two workers (concurrency 1, no prefetch; a third
    worker for the parent) and return at the same instant (a barrier, then a common
    release time), so their completions race to wake the parent; with ``sync_gather`` the
    parent's own wait on them (``ctx.gather``) commits at that instant too; with
    ``one_worker`` both run on one worker (concurrency 3), whose writer commits both
    completions in one transaction. The parent wakes once: its fan-in step and its fan-in
    effect (after the gather) each run once. Several rounds, one after another, each a
    fresh race."""
    rounds = 4
    rig.start_service()
    workers = (
        [rig.worker("W", concurrency=3, prefetch=0)] if one_worker
        else [rig.worker(f"W{i}", concurrency=1, prefetch=0) for i in range(3)]
    )
    for w in workers:
        w.holder()
    gaps: list[float] = []
    for r in range(rounds):
        tag = f"race{r}"
        parent_id = rig.submit(RACE_PARENT, {"tag": tag, "of": 2, "marks": str(rig.marks),
                                             "sync_gather": sync_gather})
        info = rig.wait_state(parent_id, timeout_s=40)
        assert info.state is State.SUCCEEDED, info
        assert info.result["got"] == [0, 1], info.result
        assert rig.executions().get(f"fanin:{tag}") == 1, rig.executions()
        assert rig.step_counts(parent_id) == {"fanin": 1}, rig.step_counts(parent_id)
        kids = rig.children(parent_id, RACER)
        assert len(kids) == 2 and all(k.state is State.SUCCEEDED for k in kids), kids
        holders = {e.holder for k in kids for e in rig.events(k.task_id, "claim")}
        assert len(holders) == (1 if one_worker else 2), f"children ran on {holders}"
        # Woken once: claimed once to start, once after its wait ended, never again. (On a
        # loaded machine the children may both have ended before the parent's gather
        # committed, when it gathers at their instant: then it does not park, and is
        # claimed once.)
        claims = rig.events(parent_id, "claim")
        parks = [e for e in rig.events(parent_id, "transition") if e.to_state == "WAITING"]
        assert len(parks) == 1 if not sync_gather else len(parks) <= 1, parks
        assert len(claims) == 1 + len(parks), (
            f"the parent was claimed {len(claims)} times, parked {len(parks)}: {claims}")
        ends = sorted(e.at for k in kids for e in rig.events(k.task_id, "transition")
                      if e.to_state == "SUCCEEDED")
        gaps.append(ends[1] - ends[0])
    rig.stop_all(workers)
    # Not vacuous: in some round the two completions committed within 50 ms of each other.
    assert min(gaps) < 0.05, f"the children never finished together: {gaps}"
    assert rig.executions() == {f"fanin:race{r}": 1 for r in range(rounds)}
    rig.check_consistent()
