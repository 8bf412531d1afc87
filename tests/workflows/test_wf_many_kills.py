"""Many kills across workflows: two worker processes, one killed with SIGKILL every
0.4-0.9 s and restarted, while durable sleeps park and wake, events arrive (each twice:
two events per key, and a re-send of the first one's id), sagas compensate and a parent
fans out to children. Then a drain. Counted at the counting service (which does not
deduplicate keys): every effect and every compensation exactly once, compensations in
reverse order, no effect of an event that was not the first of its key, no wake before
a deadline. Both ledgers."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from wfapp import CHILD, PARENT, SAGA, SAGA_STEPS, SLEEPER, WAITER
from wfkit import WfRig, wait_for

from ratchet import State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

SIGKILLED = -signal.SIGKILL
SLEEPERS = 16
WAITERS = 16
SAGAS = 4
CHILDREN = 200
KILLS = 6
CONCURRENCY = 4


def test_many_kills_across_sleeps_events_children_and_compensations(rig: WfRig) -> None:
    seed = int(os.environ.get("WF_SEED", random.randrange(1 << 30)))
    print(f"workflow many-kills seed: {seed} (rerun with WF_SEED={seed})")
    rng = random.Random(seed)
    rig.start_service()
    naps = {f"z{i}": round(rng.uniform(0.3, 3.0), 2) for i in range(SLEEPERS)}
    waiters = {f"w{i}": rig.submit(WAITER, {"order": f"w{i}"}) for i in range(WAITERS)}
    sleepers: dict[str, str] = {}
    sagas: dict[str, str] = {}
    workers = [rig.worker(f"w{i}-gen0", concurrency=CONCURRENCY) for i in range(2)]
    for w in workers:
        w.holder()

    # One timeline of actions: kills; submissions of sleepers, sagas and the parent; and
    # two events per waiter (the first, its re-send under the same id, then a second
    # event); all spread over the kills.
    actions: list[tuple[float, str, Any]] = []
    t = 0.0
    for kill in range(1, KILLS + 1):
        t += rng.uniform(0.4, 0.9)
        actions.append((t, "kill", kill))
    span = t
    for order in naps:
        actions.append((rng.uniform(0.0, span), "sleeper", order))
    for i in range(SAGAS):
        actions.append((rng.uniform(0.0, span), "saga", f"g{i}"))
    actions.append((rng.uniform(0.0, span / 2), "parent", "fan"))
    for order in waiters:
        first = rng.uniform(0.0, span)
        actions.append((first, "send", (order, "a", f"{order}-a")))
        actions.append((first + rng.uniform(0.0, 0.5), "send", (order, "a", f"{order}-a")))
        actions.append((first + rng.uniform(0.05, 1.0), "send", (order, "b", f"{order}-b")))
    actions.sort(key=lambda a: a[0])

    def held_by(holder: str) -> list[str]:
        return [t.task_id for t in rig.tasks()
                if t.state is State.RUNNING and t.holder == holder]

    t0 = time.monotonic()
    killed = 0
    parent = ""
    orphaned: set[tuple[str, str]] = set()
    for at, kind, arg in actions:
        pause = t0 + at - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the schedule, not waiting for a result
        if kind == "sleeper":
            sleepers[arg] = rig.submit(SLEEPER, {"order": arg, "nap_s": naps[arg]})
            continue
        if kind == "saga":
            sagas[arg] = rig.submit(SAGA, {"order": arg})
            continue
        if kind == "parent":
            parent = rig.submit(PARENT, {"tag": arg, "n": CHILDREN, "mode": "many",
                                         "batch": 50, "work_s": 0.02})
            continue
        if kind == "send":
            order, which, event_id = arg
            rig.app.send_event("shipped", key=f"order-{order}",
                               payload={"parcel": f"{order}-{which}"}, event_id=event_id)
            continue
        i = rng.randrange(len(workers))
        victim = workers[i]
        holder = victim.holder()
        # Kill it mid-work when it soon holds a task (up to 1 s), else anyway.
        with contextlib.suppress(AssertionError):
            wait_for(f"{victim.name} to hold a task", functools.partial(held_by, holder),
                     1.0, 0.01)
        assert victim.kill() == SIGKILLED
        killed += 1
        orphaned.update((task_id, holder) for task_id in held_by(holder))
        workers[i] = rig.worker(f"w{i}-gen{arg}", concurrency=CONCURRENCY)

    everything = {**sleepers, **waiters, **sagas, "parent": parent}

    def ended() -> bool:
        infos = rig.ledger.get_many(list(everything.values()))
        return all(i.state in (State.SUCCEEDED, State.COMPENSATED, State.FAILED,
                               State.UNKNOWN, State.CANCELLED) for i in infos)

    try:
        wait_for("every workflow to end", ended, timeout_s=90.0, interval_s=0.2)
    except AssertionError:
        states = {name: rig.get(tid).state for name, tid in everything.items()}
        raise AssertionError(f"not drained: {states}") from None
    rig.stop_all(workers)

    get: Callable[[str], Any] = rig.get
    records = rig.records()
    executions = records.executions
    expected: dict[str, int] = {}
    for order, task_id in sleepers.items():
        assert get(task_id).state is State.SUCCEEDED, get(task_id)
        expected[f"before:{order}"] = expected[f"after:{order}"] = 1
        (before_at,) = rig.times(f"before:{order}") or [0.0]
        for after_at in rig.times(f"after:{order}"):
            assert after_at >= before_at + naps[order], (order, "woke before its deadline")
    for order, task_id in waiters.items():
        info = get(task_id)
        assert info.state is State.SUCCEEDED, info
        assert info.result["payload"] == {"parcel": f"{order}-a"}, (order, info.result)
        expected[f"ship:{order}-a"] = 1
    for order, task_id in sagas.items():
        assert get(task_id).state is State.COMPENSATED, get(task_id)
        forward = [f"{step}:{order}" for step in SAGA_STEPS]
        undo = [f"compensate:{key}" for key in reversed(forward)]
        expected.update(dict.fromkeys(forward + undo, 1))
        mine = [k for _, k in records.times if k in undo]
        assert mine == undo, (order, mine)
    info = get(parent)
    assert info.state is State.SUCCEEDED, info
    assert info.result["values"] == [2 * i for i in range(CHILDREN)]
    expected["fanin:fan"] = 1
    duplicated = {k: n for k, n in executions.items() if n != 1}
    assert duplicated == {}, f"executed more than once: {duplicated}"
    assert executions == expected, {
        "missing": sorted(set(expected) - set(executions)),
        "unexpected": sorted(set(executions) - set(expected)),
    }
    children = [t for t in rig.tasks() if t.name == CHILD]
    assert sorted(t.params["i"] for t in children) == list(range(CHILDREN))
    assert all(t.parent_id == parent for t in children)
    stats = rig.ledger.stats()
    assert orphaned, "no kill landed while a task was running: the test proved nothing"
    for task_id, holder in sorted(orphaned):
        assert any(e.detail.get("previous_holder") == holder
                   for e in rig.ledger.timeline(task_id).events
                   if e.kind in ("takeover", "revoke")), (task_id, holder)
    print(f"orphaned={len(orphaned)} ", end="")
    print(f"kills={killed} claims={stats.claims} takeovers={stats.takeovers} "
          f"revocations={stats.revocations} stale_rejections={stats.stale_rejections}")
    rig.check_consistent()
