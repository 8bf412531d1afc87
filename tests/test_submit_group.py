"""Group commit of :meth:`App.submit`: concurrent callers share one ledger transaction,
and each still gets exactly the outcome it would get submitting alone, one after another.

Two kinds of test, both on every ledger:

* free-running threads against the real ledger (whatever batches the scheduler makes):
  every result right, every created task in the ledger exactly once;
* a gated ledger (a thin wrapper whose first ``submit`` waits until the test has queued
  the callers it wants): the batch a test builds is then known exactly, so a conflict, a
  refused write or an outage inside one batch can be aimed at one caller.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ratchet import App, TaskContext, open_ledger
from ratchet.app import _SubmitGroup
from ratchet.errors import (
    IdempotencyConflict,
    InvalidArguments,
    LedgerUnavailable,
    UnknownTask,
    WriteRejected,
)
from ratchet.ledger.base import Ledger, NewTask, SubmitResult
from ratchet.testing import LedgerProxy, wait_for

THREADS = 16
TASK = "group.task"


def register(app: App) -> App:
    @app.task(name=TASK)
    def work(ctx: TaskContext, n: int = 0, tag: str = "") -> int:
        return n

    return app


def total_tasks(ledger: Ledger) -> int:
    return sum(n for by_state in ledger.stats().counts.values() for n in by_state.values())


def run_threads(count: int, body: Callable[[int], Any]) -> list[Any]:
    """Run ``body(i)`` in ``count`` threads started together; return each result or the
    exception it raised, by ``i``."""
    out: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(i: int) -> None:
        start.wait(timeout=30)
        try:
            out[i] = body(i)
        except Exception as exc:
            out[i] = exc

    pool = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=120)
        assert not th.is_alive(), "a submitting thread hung"
    return out


@pytest.fixture
def app(ledger_url: str) -> Iterator[App]:
    app = register(App(ledger_url))
    yield app
    app.close()


# ---------------------------------------------------------------------- free-running threads


def test_distinct_keys_from_many_threads(app: App) -> None:
    per_thread = 25

    def body(i: int) -> list[tuple[str, str, bool]]:
        out = []
        for j in range(per_thread):
            key = f"k-{i}-{j}"
            h = app.submit(TASK, {"n": j, "tag": f"t{i}"}, idempotency_key=key)
            out.append((key, h.task_id, h.created))
        return out

    results = run_threads(THREADS, body)
    rows = [r for per in results for r in per]
    assert len(rows) == THREADS * per_thread
    assert all(created for _, _, created in rows)
    assert len({task_id for _, task_id, _ in rows}) == len(rows)
    assert total_tasks(app.ledger) == len(rows)
    infos = app.ledger.get_many([task_id for _, task_id, _ in rows])
    assert {i.task_id: i.idempotency_key for i in infos} == {t: k for k, t, _ in rows}


def test_no_keys_from_many_threads(app: App) -> None:
    per_thread = 25
    results = run_threads(
        THREADS, lambda i: [app.submit(TASK, {"n": j}) for j in range(per_thread)]
    )
    handles = [h for per in results for h in per]
    assert all(h.created for h in handles)
    assert len({h.task_id for h in handles}) == THREADS * per_thread
    assert total_tasks(app.ledger) == THREADS * per_thread
    for h in handles[:: per_thread]:
        assert app.get(h.task_id).params == {"n": 0}


def test_same_keys_same_params_from_many_threads(app: App) -> None:
    rounds = 10

    def body(i: int) -> list[tuple[str, bool]]:
        return [
            (h.task_id, h.created)
            for h in (app.submit(TASK, {"n": r}, idempotency_key=f"shared-{r}")
                      for r in range(rounds))
        ]

    results = run_threads(THREADS, body)
    for r in range(rounds):
        per_key = [per[r] for per in results]
        assert len({task_id for task_id, _ in per_key}) == 1, "one task per key"
        assert sum(created for _, created in per_key) == 1, "created exactly once"
    assert total_tasks(app.ledger) == rounds
    assert app.ledger.stats().idempotency_conflicts == 0


def test_same_key_different_params_fails_only_those_callers(app: App) -> None:
    """Half the threads send params A, half params B, under one key, while others submit
    keyless tasks: one side wins (created once, the rest of its side dedupe onto it), every
    caller of the other side gets its own IdempotencyConflict, the neighbours all succeed."""

    def body(i: int) -> Any:
        if i % 4 == 3:
            return [app.submit(TASK, {"n": i}) for _ in range(5)]
        return app.submit(TASK, {"n": i % 2}, idempotency_key="contested")

    results = run_threads(THREADS, body)
    neighbours = [h for i, r in enumerate(results) if i % 4 == 3 for h in r]
    contenders = {i: r for i, r in enumerate(results) if i % 4 != 3}
    assert all(h.created for h in neighbours)
    won = [i for i, r in contenders.items() if not isinstance(r, Exception)]
    lost = [i for i, r in contenders.items() if isinstance(r, Exception)]
    assert won, "the first submit of the key cannot conflict"
    assert {i % 2 for i in won} != {i % 2 for i in lost}, "one side wins, the other loses"
    assert len({contenders[i].task_id for i in won}) == 1
    assert sum(contenders[i].created for i in won) == 1
    for i in lost:
        assert isinstance(contenders[i], IdempotencyConflict)
        assert contenders[i].task_id == contenders[won[0]].task_id
    assert app.ledger.stats().idempotency_conflicts == len(lost)
    assert total_tasks(app.ledger) == len(neighbours) + 1


def test_bad_submits_fail_in_their_own_thread(app: App) -> None:
    """Validation runs in the caller's thread, before any queue: the others are unaffected."""

    def body(i: int) -> Any:
        if i % 3 == 0:
            return app.submit(TASK, {"nope": 1})
        if i % 3 == 1:
            return app.submit("group.unknown")
        return app.submit(TASK, {"n": i})

    results = run_threads(THREADS, body)
    for i, r in enumerate(results):
        expected = (InvalidArguments, UnknownTask)[i % 3] if i % 3 < 2 else None
        if expected is None:
            assert r.created and app.get(r.task_id).params == {"n": i}
        else:
            assert isinstance(r, expected)
    assert total_tasks(app.ledger) == sum(1 for i in range(THREADS) if i % 3 == 2)


# ---------------------------------------------------------------------- exact batches


class GatedLedger(LedgerProxy):
    """A ledger wrapper: records each ``submit`` batch (and the thread that sent it) in
    ``batches``; while ``gate`` is clear, a ``submit`` waits for it; ``refuse(batch)`` may
    return an error to raise instead of submitting (nothing is written then, as a refused
    transaction)."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner, fail={"submit": self._gate})
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[tuple[list[NewTask], str]] = []
        self.refuse: Callable[[list[NewTask]], Exception | None] = lambda batch: None
        self._guard = threading.Lock()

    def _gate(self, tasks: Sequence[NewTask]) -> BaseException | None:
        batch = list(tasks)
        with self._guard:
            self.batches.append((batch, threading.current_thread().name))
        assert self.gate.wait(timeout=60)
        return self.refuse(batch)

    def sizes(self) -> list[int]:
        with self._guard:
            return [len(batch) for batch, _ in self.batches]


@pytest.fixture
def gated(ledger_url: str) -> Iterator[tuple[App, GatedLedger]]:
    inner = open_ledger(ledger_url)
    ledger = GatedLedger(inner)
    app = register(App(ledger))  # type: ignore[arg-type]
    yield app, ledger
    inner.close()


def in_one_batch(app: App, ledger: GatedLedger, calls: list[Callable[[], Any]],
                 sizes: list[int] | None = None) -> list[Any]:
    """Run ``calls`` (each in its own thread, queued in list order) as one batch: a first
    submit holds the gate while all of them queue, then the gate opens. ``sizes``: the
    ``ledger.submit`` calls expected after the holder's (default: one with every call).
    Returns each call's result or error."""
    group: _SubmitGroup = app._submit_group
    before = len(ledger.batches)
    ledger.gate.clear()
    holder = threading.Thread(target=app.submit, args=(TASK, {"tag": "holder"}))
    holder.start()
    wait_for("the holder's submit to reach the ledger", lambda: len(ledger.batches) == before + 1,
             timeout_s=30.0, interval_s=0.002)
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:
            out[i] = exc

    pool = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for i, th in enumerate(pool):
        th.start()
        wait_for(f"caller {i} to queue", lambda i=i: group.waiting == i + 1,  # keeps order
                 timeout_s=30.0, interval_s=0.002)
    ledger.gate.set()
    for th in [holder, *pool]:
        th.join(timeout=60)
        assert not th.is_alive()
    assert ledger.sizes()[before:] == [1, *(sizes or [len(calls)])]
    return out


def test_uncontended_submit_runs_in_the_callers_thread(
        gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    h = app.submit(TASK, {"n": 1})
    assert h.created
    assert ledger.batches[0][1] == threading.current_thread().name
    assert app._submit_group.transactions == 1
    assert app._submit_group.waiting == 0


def test_callers_arriving_during_a_submit_share_the_next_transaction(
        gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    results = in_one_batch(
        app, ledger, [lambda n=n: app.submit(TASK, {"n": n}) for n in range(THREADS - 1)]
    )
    assert all(r.created for r in results)
    assert [app.get(r.task_id).params for r in results] == [{"n": n} for n in range(15)]
    assert total_tasks(app.ledger) == THREADS
    assert app._submit_group.transactions == 2
    # the batch was sent by one of its callers (no thread of the group's own)
    assert ledger.batches[1][1] != threading.current_thread().name


def test_a_batch_holds_at_most_max_batch(gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    app._submit_group = _SubmitGroup(max_batch=4)
    ledger.gate.clear()
    holder = threading.Thread(target=app.submit, args=(TASK,))
    holder.start()
    wait_for("the holder's submit", lambda: len(ledger.batches) == 1,
             timeout_s=30.0, interval_s=0.002)
    pool = [threading.Thread(target=app.submit, args=(TASK, {"n": n})) for n in range(10)]
    for th in pool:
        th.start()
    wait_for("ten callers to queue", lambda: app._submit_group.waiting == 10,
             timeout_s=30.0, interval_s=0.002)
    ledger.gate.set()
    for th in [holder, *pool]:
        th.join(timeout=60)
    assert ledger.sizes() == [1, 4, 4, 2]
    assert total_tasks(app.ledger) == 11


def test_same_key_twice_in_a_batch_dedupes_like_two_submits(
        gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    first, second, other = in_one_batch(app, ledger, [
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="twice"),
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="twice"),
        lambda: app.submit(TASK, {"n": 2}, idempotency_key="once"),
    ])
    assert first.created and not second.created
    assert second.task_id == first.task_id
    assert other.created
    assert total_tasks(app.ledger) == 3  # the holder, "twice", "once"


def test_conflict_inside_a_batch_fails_only_its_caller(
        gated: tuple[App, GatedLedger]) -> None:
    """A, B (same key, other params), C (same key and params as A), D (no key), queued
    together, must end as four sequential submits would: B alone is refused, C dedupes
    onto A, and the conflict is audited once, against A's (committed) task."""
    app, ledger = gated
    a, b, c, d = in_one_batch(app, ledger, [
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="k"),
        lambda: app.submit(TASK, {"n": 2}, idempotency_key="k"),
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="k"),
        lambda: app.submit(TASK, {"n": 3}),
    ], sizes=[2, 1, 1])  # [A, D]; B waits (its key has other params in the batch); [B]; [C]
    assert a.created and d.created
    assert isinstance(b, IdempotencyConflict) and b.task_id == a.task_id
    assert not c.created and c.task_id == a.task_id
    assert app.ledger.stats().idempotency_conflicts == 1
    kinds = [e.kind for e in app.ledger.timeline(a.task_id).events]
    assert kinds.count("idempotency_conflict") == 1
    assert total_tasks(app.ledger) == 3  # the holder, A, D


def test_conflicts_with_a_committed_task_fail_only_their_callers(
        gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    old = app.submit(TASK, {"n": 1}, idempotency_key="old")
    results = in_one_batch(app, ledger, [
        lambda: app.submit(TASK, {"n": 2}, idempotency_key="old"),
        lambda: app.submit(TASK, {"n": 5}),
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="old"),
        lambda: app.submit(TASK, {"n": 2}, idempotency_key="old"),
        lambda: app.submit(TASK, {"n": 6}, idempotency_key="new"),
    ], sizes=[3, 2, 1, 1])  # [bad1, plain, new] refused, re-sent without bad1; [same]; [bad2]
    bad1, plain, same, bad2, new = results
    for bad in (bad1, bad2):
        assert isinstance(bad, IdempotencyConflict) and bad.task_id == old.task_id
    assert plain.created and new.created
    assert not same.created and same.task_id == old.task_id
    assert app.ledger.stats().idempotency_conflicts == 2  # one per refused caller
    assert total_tasks(app.ledger) == 4  # old, the holder, plain, new


def test_a_refused_write_fails_only_its_caller(gated: tuple[App, GatedLedger]) -> None:
    app, ledger = gated
    ledger.refuse = lambda batch: (
        WriteRejected("poison refused") if any("poison" in t.params_json for t in batch)
        else None
    )
    results = in_one_batch(app, ledger, [
        lambda: app.submit(TASK, {"n": 1}, idempotency_key="ok-1"),
        lambda: app.submit(TASK, {"tag": "poison"}),
        lambda: app.submit(TASK, {"n": 2}),
    ], sizes=[3, 1, 1, 1])  # refused as a batch, then one by one
    ok1, poison, ok2 = results
    assert isinstance(poison, WriteRejected)
    assert ok1.created and ok2.created
    assert app.get(ok1.task_id).params == {"n": 1}
    assert app.get(ok2.task_id).params == {"n": 2}
    assert total_tasks(app.ledger) == 3  # the holder, ok1, ok2


def test_an_outage_fails_the_batch_and_the_next_caller_goes_on(
        gated: tuple[App, GatedLedger]) -> None:
    """LedgerUnavailable (perhaps lost during COMMIT) reaches every caller of the batch and
    is not re-sent task by task; the group stays usable."""
    app, ledger = gated
    ledger.refuse = lambda batch: LedgerUnavailable("down") if len(batch) > 1 else None
    results = in_one_batch(app, ledger, [
        lambda n=n: app.submit(TASK, {"n": n}) for n in range(4)
    ])
    assert all(isinstance(r, LedgerUnavailable) for r in results)
    assert ledger.sizes() == [1, 4], "not re-sent one by one"
    assert app.submit(TASK, {"n": 9}).created
    assert total_tasks(app.ledger) == 2


def test_validation_does_not_queue(gated: tuple[App, GatedLedger]) -> None:
    """While a submit is in flight, a bad call is refused at once in its own thread."""
    app, ledger = gated
    ledger.gate.clear()
    holder = threading.Thread(target=app.submit, args=(TASK,))
    holder.start()
    try:
        wait_for("the holder's submit", lambda: len(ledger.batches) == 1,
                 timeout_s=30.0, interval_s=0.002)
        with pytest.raises(InvalidArguments):
            app.submit(TASK, {"n": 1}, delay_s=float("nan"))
        with pytest.raises(UnknownTask):
            app.submit("group.nothing")
        assert app._submit_group.waiting == 0
    finally:
        ledger.gate.set()
        holder.join(timeout=60)
    assert total_tasks(app.ledger) == 1


class _InstantLedger:
    """Answers every submit at once (no storage): for the group's own mechanics."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def submit(self, tasks: Sequence[NewTask]) -> list[SubmitResult]:
        if self.gate is not None:
            assert self.gate.wait(timeout=60)
        return [SubmitResult(t.task_id, created=True) for t in tasks]


def _new_task(task_id: str) -> NewTask:
    return NewTask(task_id, TASK, 1, "{}", "digest", None, 3, 15.0)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with threads running
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_does_not_wait_for_the_parents_submit() -> None:
    """Forked while another thread leads a submit and one waits: the child's group is idle
    (its submits do not queue behind transactions of the parent's threads)."""
    group = _SubmitGroup()
    gate = threading.Event()
    slow = _InstantLedger(gate)
    leader = threading.Thread(target=group.submit, args=(slow, _new_task("t-leader")))
    follower = threading.Thread(target=group.submit, args=(slow, _new_task("t-follower")))
    leader.start()
    follower.start()
    wait_for("the follower to queue", lambda: group.waiting == 1, timeout_s=30.0, interval_s=0.002)
    pid = os.fork()
    if pid == 0:  # the child: one submit, then out without running pytest's teardown
        code = 1
        try:
            result = group.submit(_InstantLedger(), _new_task("t-child"))
            code = 0 if result.task_id == "t-child" and group.waiting == 0 else 2
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail("the forked child's submit hung behind the parent's")
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        gate.set()
        leader.join(timeout=60)
        follower.join(timeout=60)
    assert group.waiting == 0 and group.transactions == 2
