"""Debounce (DESIGN §8): ``submit(..., debounce_s=, idempotency_key=K)`` collapses the
submits of K made before the task is claimed into one task, run once with the last
params, ``debounce_s`` after the last submit and no later than ``debounce_max_s`` after
the first; every caller of the window gets the same task id. On both ledgers, with a real
worker where a run is involved (its runs are counted by the task body itself).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ratchet import App, State, SubmitRequest, TaskContext
from ratchet.errors import InvalidArguments
from ratchet.ledger.base import Ledger
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker

TASK = "debounce.refresh"


class Runs:
    """What the task body saw: ``(task id, n, monotonic start)`` per run, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seen: list[tuple[str, int, float]] = []

    def add(self, task_id: str, n: int) -> None:
        with self._lock:
            self.seen.append((task_id, n, time.monotonic()))

    def of(self, task_id: str) -> list[int]:
        with self._lock:
            return [n for tid, n, _ in self.seen if tid == task_id]


@pytest.fixture
def runs() -> Runs:
    return Runs()


def register(app: App, runs: Runs, **options: Any) -> None:
    @app.task(name=TASK, **options)
    def refresh(ctx: TaskContext, n: int = 0, key: str = "") -> int:
        runs.add(ctx.task_id, n)
        return n


def total_tasks(ledger: Ledger) -> int:
    return sum(n for by_state in ledger.stats().counts.values() for n in by_state.values())


def debounced_events(app: App, task_id: str) -> list[dict[str, Any]]:
    return [e.detail for e in app.ledger.timeline(task_id).events if e.kind == "debounced"]


def paced_submits(app: App, count: int, every_s: float, **options: Any
                  ) -> tuple[list[Any], float]:
    """``count`` submits of key K, one every ``every_s`` seconds (the workload's pace, on
    the monotonic clock); returns the handles and the monotonic time before the first."""
    start = time.monotonic()
    handles = []
    for i in range(count):
        pause = start + i * every_s - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        handles.append(app.submit(TASK, {"n": i}, idempotency_key="K", **options))
    return handles, start


def test_forty_submits_over_three_seconds_give_one_run_with_the_last_params(
    app: App, runs: Runs
) -> None:
    register(app, runs)
    window_s = 1.0
    with running_worker(app, concurrency=2):
        handles, _ = paced_submits(app, 40, 0.075, debounce_s=window_s, debounce_max_s=30)
        last_submit = time.monotonic()
        task_id = handles[0].task_id
        assert {h.task_id for h in handles} == {task_id}
        assert [h.created for h in handles] == [True] + [False] * 39
        info = app.wait(task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.result == 39
    assert info.params == {"n": 39}
    assert runs.of(task_id) == [39]
    assert len(runs.seen) == 1
    # It started debounce_s after the last submit (the ledger clock and the monotonic one
    # run together on one host; the last submit's transaction began before last_submit).
    assert runs.seen[0][2] >= last_submit + window_s - 0.1
    assert total_tasks(app.ledger) == 1
    events = debounced_events(app, task_id)
    assert sum(e["collapsed"] for e in events) == 39
    assert {e["key"] for e in events} == {"K"}


def test_debounce_max_s_caps_the_delay_of_a_steady_stream(app: App, runs: Runs) -> None:
    """Submits every 100 ms for 4.5 s, debounce_s=1, debounce_max_s=2: a window never
    goes quiet for 1 s, yet each task starts 2 s after its first submit; the submits made
    once it was claimed open the next window."""
    register(app, runs)
    with running_worker(app, concurrency=2):
        handles, start = paced_submits(app, 45, 0.1, debounce_s=1.0, debounce_max_s=2.0)
        ids = list(dict.fromkeys(h.task_id for h in handles))
        for task_id in ids:
            assert app.wait(task_id, timeout_s=30).state is State.SUCCEEDED
    assert len(ids) >= 2  # without the cap, one task starting 1 s after the stream
    first_start = min(at for tid, _, at in runs.seen if tid == ids[0])
    assert start + 2.0 - 0.1 <= first_start < start + 3.5
    for task_id in ids:
        mine = [i for i, h in enumerate(handles) if h.task_id == task_id]
        assert mine == list(range(mine[0], mine[-1] + 1)), "a window is a run of submits"
        assert handles[mine[0]].created and not any(handles[i].created for i in mine[1:])
        # Run once, with the params of the last submit of its window.
        assert runs.of(task_id) == [mine[-1]]
    assert len(runs.seen) == len(ids) == total_tasks(app.ledger)


def test_a_submit_after_the_claim_opens_a_new_window(app: App, runs: Runs) -> None:
    release = threading.Event()

    @app.task(name="debounce.slow")
    def slow(ctx: TaskContext, n: int = 0) -> int:
        runs.add(ctx.task_id, n)
        release.wait(timeout=30)
        return n

    with running_worker(app, concurrency=2):
        first = app.submit("debounce.slow", {"n": 1}, idempotency_key="K", debounce_s=0.2)
        wait_for("the first task to run", lambda: runs.of(first.task_id), timeout_s=30)
        assert app.get(first.task_id).state is State.RUNNING
        second = app.submit("debounce.slow", {"n": 2}, idempotency_key="K", debounce_s=0.2)
        third = app.submit("debounce.slow", {"n": 3}, idempotency_key="K", debounce_s=0.2)
        release.set()
        assert app.wait(first.task_id, timeout_s=30).result == 1
        assert app.wait(second.task_id, timeout_s=30).result == 3
    assert second.task_id != first.task_id and second.created
    assert third.task_id == second.task_id and not third.created
    assert runs.of(first.task_id) == [1] and runs.of(second.task_id) == [3]
    assert debounced_events(app, first.task_id) == []


@pytest.fixture
def apps(ledger_url: str) -> Iterator[list[App]]:
    """Eight apps on the test's ledger, each with its own connections."""
    opened = [App(ledger_url) for _ in range(8)]
    try:
        yield opened
    finally:
        for one in opened:
            one.close()


def test_concurrent_submitters_get_one_task(app: App, apps: list[App], runs: Runs) -> None:
    """Eight threads, each with its own app (own connections, own transactions), submit
    key K five times each at once: one task, every caller gets its id, one created."""
    register(app, runs)
    for one in apps:
        register(one, runs)
    app.ledger.migrate()
    start = threading.Barrier(len(apps))
    out: list[list[Any]] = [[] for _ in apps]
    errors: list[BaseException] = []

    def submit(i: int) -> None:
        try:
            start.wait(timeout=30)
            for j in range(5):
                out[i].append(apps[i].submit(TASK, {"n": 10 * i + j}, idempotency_key="K",
                                             debounce_s=60))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(apps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    handles = [h for mine in out for h in mine]
    assert len(handles) == 40
    task_id = handles[0].task_id
    assert {h.task_id for h in handles} == {task_id}
    assert sum(h.created for h in handles) == 1
    assert total_tasks(app.ledger) == 1
    info = app.get(task_id)
    assert info.state is State.PENDING and info.generation == 0
    # The params of one of the submits (the last to commit), each caller's in order.
    assert info.params["n"] in {10 * i + 4 for i in range(len(apps))}
    assert sum(e["collapsed"] for e in debounced_events(app, task_id)) == 39


def test_submits_of_one_batch_collapse_per_key(app: App, runs: Runs) -> None:
    register(app, runs)
    requests = [SubmitRequest(TASK, {"n": i, "key": key}, idempotency_key=key,
                              debounce_s=60)
                for i, key in enumerate(["b", "a", "b", "a", "b"])]
    handles = app.submit_many(requests)
    b, a = handles[0].task_id, handles[1].task_id
    assert [h.task_id for h in handles] == [b, a, b, a, b]
    assert [h.created for h in handles] == [True, True, False, False, False]
    assert app.get(b).params == {"n": 4, "key": "b"}
    assert app.get(a).params == {"n": 3, "key": "a"}
    assert total_tasks(app.ledger) == 2
    assert debounced_events(app, b)[0]["collapsed"] == 2
    # A plain submit of the same key is its own task: the debounce group is not the
    # idempotency key's dedupe.
    plain = app.submit(TASK, {"n": 9}, idempotency_key="a")
    assert plain.created and plain.task_id not in {a, b}


def test_a_task_waiting_for_its_concurrency_key_slot_keeps_waiting(
    app: App, runs: Runs
) -> None:
    """The type has one slot per key: the second group's task waits for it (WAITING, run
    far ahead); collapsing into it moves its wanted start, not its run_at, and it runs
    once with its last params when the slot frees."""
    register(app, runs, concurrency_key=lambda params: "one")
    holder = app.submit(TASK, {"n": 1, "key": "x"}, idempotency_key="x", debounce_s=0.2)
    waiter = [app.submit(TASK, {"n": n, "key": "y"}, idempotency_key="y", debounce_s=0.2)
              for n in (2, 3, 4)]
    assert {h.task_id for h in waiter} == {waiter[0].task_id}
    parked = app.get(waiter[0].task_id)
    assert parked.state is State.WAITING and parked.run_at > 1e14
    assert parked.params == {"n": 4, "key": "y"}
    with running_worker(app, concurrency=2):
        assert app.wait(holder.task_id, timeout_s=30).result == 1
        assert app.wait(waiter[0].task_id, timeout_s=30).result == 4
    assert runs.of(waiter[0].task_id) == [4] and len(runs.seen) == 2


@pytest.mark.parametrize(("options", "message"), [
    ({"debounce_s": 1.0}, "idempotency_key"),
    ({"debounce_s": 2.0, "debounce_max_s": 1.0, "idempotency_key": "K"}, "at least"),
    ({"debounce_s": -1.0, "idempotency_key": "K"}, "debounce_s"),
    ({"debounce_s": 0, "idempotency_key": "K"}, "debounce_s"),
    ({"debounce_s": math.nan, "idempotency_key": "K"}, "debounce_s"),
    ({"debounce_s": math.inf, "idempotency_key": "K"}, "debounce_s"),
    ({"debounce_s": 1.0, "debounce_max_s": math.nan, "idempotency_key": "K"},
     "debounce_max_s"),
    ({"debounce_max_s": 5.0, "idempotency_key": "K"}, "debounce_s"),
    ({"debounce_s": True, "idempotency_key": "K"}, "debounce_s"),
])
def test_bad_debounce_arguments_are_refused_and_write_nothing(
    app: App, runs: Runs, options: dict[str, Any], message: str
) -> None:
    register(app, runs)
    with pytest.raises(InvalidArguments, match=message):
        app.submit(TASK, {"n": 1}, **options)
    with pytest.raises(InvalidArguments, match=message):
        app.submit_many([SubmitRequest(TASK, {"n": 2}, idempotency_key="ok", debounce_s=1),
                         SubmitRequest(TASK, {"n": 3}, **options)])
    assert total_tasks(app.ledger) == 0
