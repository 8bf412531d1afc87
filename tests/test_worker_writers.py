"""Several writer threads per worker (``Worker(..., writers=N)``, ``ratchet worker
--writers N``): each commits (and claims) in transactions of its own, a task's writes
always on the same one.

Every test runs on both ledgers (the ``ledger_url`` fixture of tests/conftest.py); both
default to one writer, and must stay correct with several. What is
checked: a task's writes are committed in the order it made them (many steps per task,
values read back); exactly-once over a few hundred tasks with two multi-writer workers;
bodies never run more than ``concurrency`` at once and claims never take more than the
worker has room for when writers claim at once; ``sync`` waits for every writer thread,
``stop`` finishes what is queued on each and refuses later writes.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, State, SubmitRequest, TaskContext, Worker, open_ledger
from ratchet.cli.main import cli
from ratchet.errors import ConfigError
from ratchet.ledger.base import Claim, CommitOutcome, Ledger, TaskWrite, Transition
from ratchet.testing import LedgerProxy, wait_for
from ratchet.worker.runner import default_writers
from ratchet.worker.writer import LedgerWriter, WriterStopped

pytestmark = pytest.mark.timeout(90)


class RecordingLedger(LedgerProxy):
    """The real ledger, recording per task the writes it committed (step names and final
    state, in commit order) and which threads committed them."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner, after={"commit": self._after_commit,
                                       "commit_and_claim": self._after_commit_and_claim})
        self._guard = threading.Lock()
        self.committed: dict[str, list[str]] = defaultdict(list)
        self.threads: set[int] = set()

    def _record(self, writes: Sequence[TaskWrite], outcomes: Sequence[CommitOutcome]) -> None:
        with self._guard:
            self.threads.add(threading.get_ident())
            for w, o in zip(writes, outcomes, strict=True):
                if not o.ok:
                    continue
                names = [s[0] for s in w.steps]
                if w.transition is not None:
                    names.append(w.transition.to.value)
                self.committed[w.task_id].extend(names)

    def _after_commit(self, outcomes: list[CommitOutcome], writes: Sequence[TaskWrite]) -> None:
        self._record(writes, outcomes)

    def _after_commit_and_claim(
        self, result: tuple[list[CommitOutcome], list[Claim]], writes: Sequence[TaskWrite],
        *rest: Any,
    ) -> None:
        self._record(writes, result[0])


def test_default_writers_and_bad_values(app: App) -> None:
    @app.task(name="t.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    assert default_writers(app.ledger) == 1
    assert Worker(app).writers == 1
    assert Worker(app, writers=3).writers == 3
    assert Worker(app, writers=3).writer.writers == 3
    with pytest.raises(ConfigError):
        Worker(app, writers=0)
    with pytest.raises(ValueError):
        LedgerWriter(app.ledger, writers=0)


@pytest.mark.parametrize("writers", [2, 4])
@pytest.mark.parametrize("durable", [False, True], ids=["pipelined", "durable"])
def test_a_tasks_writes_commit_in_order(ledger_url: str, writers: int, durable: bool) -> None:
    """Many steps per task, pipelined (not waited for) or durable: each task's steps and
    final write reach the ledger in the order the task made them, with their values,
    while several writer threads commit."""
    recording = RecordingLedger(open_ledger(ledger_url))
    app = App(recording)  # type: ignore[arg-type]
    steps_per_task = 8
    try:

        @app.task(name="t.steps")
        def steps(ctx: TaskContext, i: int) -> int:
            total = 0
            for k in range(steps_per_task):
                # Each value depends on the previous one: a replay would need them all.
                total = int(ctx.step(f"s{k}", lambda k=k, total=total: total + i * 100 + k,
                                     durable=durable))
            return total

        n = 80
        handles = app.submit_many([SubmitRequest("t.steps", {"i": i}) for i in range(n)])
        worker = Worker(app, concurrency=8, writers=writers, poll_interval_s=0.01)
        stats = worker.run(max_tasks=n)
        assert stats.succeeded == n
        assert len(recording.threads) > 1, "the writes were all committed by one thread"
        expected_names = [f"s{k}" for k in range(steps_per_task)] + ["SUCCEEDED"]
        for h in handles:
            info = h.get()
            assert info.state is State.SUCCEEDED
            i = info.params["i"]
            committed = recording.committed[h.task_id]
            # A pipelined step still in flight is carried again by the next write (an
            # idempotent rewrite): order is that of first commits, the final write last.
            assert list(dict.fromkeys(committed)) == expected_names, committed
            assert committed[-1] == "SUCCEEDED" and committed.count("SUCCEEDED") == 1
            timeline = recording.timeline(h.task_id)
            values = {s.name: json.loads(s.result_json) for s in timeline.steps}
            running = 0
            for k in range(steps_per_task):
                running += i * 100 + k
                assert values[f"s{k}"] == running
            assert info.result == running
    finally:
        app.close()


@pytest.mark.parametrize("configs", [
    ((1, 8, 1), (4, 4, 1)),  # prefetch beyond the threads, one writer each
    ((2, 8, 3), (6, 4, 2)),  # prefetch and several writers
], ids=["prefetch", "writers"])
def test_exactly_once_with_two_workers(
    app: App, configs: tuple[tuple[int, int, int], ...]
) -> None:
    """Two workers (concurrency, prefetch, writers) drain 300 tasks: each body and each
    step runs once, every claim succeeds."""
    lock = threading.Lock()
    bodies: Counter[int] = Counter()
    steps: Counter[int] = Counter()

    @app.task(name="t.once")
    def once(ctx: TaskContext, i: int) -> int:
        with lock:
            bodies[i] += 1

        def effect() -> int:
            with lock:
                steps[i] += 1
            return i

        ctx.step("first", lambda: i, durable=False)
        return int(ctx.step("record", effect))

    n = 300
    handles = app.submit_many([SubmitRequest("t.once", {"i": i}) for i in range(n)])
    workers = [Worker(app, concurrency=c, prefetch=p, writers=w, poll_interval_s=0.01)
               for c, p, w in configs]
    threads = [threading.Thread(target=w.run, kwargs={"idle_exit_s": 0.5}) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert sum(w.stats.succeeded for w in workers) == n
    assert sum(w.stats.claimed for w in workers) == n
    assert bodies == Counter(range(n))
    assert steps == Counter(range(n))
    assert all(h.get().state is State.SUCCEEDED for h in handles)


class HoldingLedger(RecordingLedger):
    """Also counts the tasks the worker holds in the ledger after each of its transactions:
    claimed, less those whose final write committed (the most at any time in ``most``)."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.held = 0
        self.most = 0
        self.after["claim"] = self._after_claim

    def _count(self, claims: Sequence[Claim], writes: Sequence[TaskWrite],
               outcomes: Sequence[CommitOutcome]) -> None:
        finished = sum(1 for w, o in zip(writes, outcomes, strict=True)
                       if o.ok and w.transition is not None)
        with self._guard:
            self.held += len(claims) - finished
            self.most = max(self.most, self.held)

    def _after_commit(self, outcomes: list[CommitOutcome], writes: Sequence[TaskWrite]) -> None:
        super()._after_commit(outcomes, writes)
        self._count([], writes, outcomes)

    def _after_commit_and_claim(
        self, result: tuple[list[CommitOutcome], list[Claim]], writes: Sequence[TaskWrite],
        *rest: Any,
    ) -> None:
        super()._after_commit_and_claim(result, writes, *rest)
        self._count(result[1], writes, result[0])

    def _after_claim(self, claims: list[Claim], *args: Any) -> None:
        self._count(claims, [], [])


def test_concurrency_and_room_hold_with_writers_claiming_at_once(ledger_url: str) -> None:
    """Four writers, each claiming with its own commits: bodies never run more than
    ``concurrency`` at once, and the worker never holds more than ``concurrency +
    prefetch`` tasks in the ledger (claimed, final write not committed)."""
    holding = HoldingLedger(open_ledger(ledger_url))
    app = App(holding)  # type: ignore[arg-type]
    concurrency, prefetch = 3, 5
    lock = threading.Lock()
    running = 0
    most_running = 0
    runs: Counter[int] = Counter()

    @app.task(name="t.count")
    def count(ctx: TaskContext, i: int) -> int:
        nonlocal running, most_running
        with lock:
            running += 1
            most_running = max(most_running, running)
        try:
            ctx.step("work", lambda: time.sleep(0.001), durable=False)
            with lock:
                runs[i] += 1
            return i
        finally:
            with lock:
                running -= 1

    try:
        n = 150
        handles = app.submit_many([SubmitRequest("t.count", {"i": i}) for i in range(n)])
        worker = Worker(app, concurrency=concurrency, prefetch=prefetch, writers=4,
                        poll_interval_s=0.01)
        stats = worker.run(max_tasks=n)
        assert stats.succeeded == n
        assert stats.claimed == n
        assert most_running <= concurrency, f"{most_running} bodies ran at once"
        assert holding.most <= concurrency + prefetch, f"{holding.most} tasks held at once"
        assert holding.most > concurrency, "never prefetched: the test checks nothing"
        assert holding.held == 0
        assert len(holding.threads) > 1, "the writes were all committed by one thread"
        assert runs == Counter(range(n))
        assert all(h.get().state is State.SUCCEEDED for h in handles)
        assert (worker._reserved, worker._reserved_room, worker._inflight) == (0, 0, 0)
    finally:
        app.close()


def test_reservations_never_exceed_the_room(app: App) -> None:
    """Two writers asking for claims at once: the second sees the first's reservation."""

    @app.task(name="t.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    worker = Worker(app, concurrency=2, prefetch=2, writers=2)
    first = worker._reserve(0, forced=True)
    assert first == 4
    assert worker._reserve(0, forced=True) == 0
    assert worker._reserve(3, forced=False) == 3  # completions in its own transaction
    worker._release(3, 3)
    worker._release(first, 0)
    assert worker._reserve(0, forced=True) == 4
    worker._release(4, 0)
    # Every slot taken: two transactions each completing two tasks may each claim two
    # (their own completions), and nothing more is left for a third asker.
    worker._inflight = 4
    assert worker._reserve(2, forced=False) == 2
    assert worker._reserve(2, forced=False) == 2
    assert worker._reserve(0, forced=True) == 0
    worker._release(2, 2)
    worker._release(2, 2)
    worker._inflight = 0
    assert (worker._reserved, worker._reserved_room) == (0, 0)
    # Concurrent askers never get more than the room in all.
    got: list[int] = []
    barrier = threading.Barrier(8)

    def ask() -> None:
        barrier.wait()
        got.append(worker._reserve(0, forced=True))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(got) == 4
    assert worker._reserved == worker._reserved_room == 4


def _claimed(ledger_url: str, n: int) -> tuple[App, Ledger, list[Claim]]:
    setup = App(ledger_url)

    @setup.task(name="t.w")
    def w(ctx: TaskContext, i: int) -> int:
        return i

    setup.submit_many([SubmitRequest("t.w", {"i": i}) for i in range(n)])
    ledger = open_ledger(ledger_url)
    claims = ledger.claim("holder-1", ["t.w"], n)
    assert len(claims) == n
    return setup, ledger, claims


def test_sync_waits_for_every_writer_and_stop_finishes_all(ledger_url: str) -> None:
    setup, ledger, claims = _claimed(ledger_url, 12)
    try:
        writer = LedgerWriter(ledger, writers=3)
        results: dict[str, list[CommitOutcome | None]] = defaultdict(list)
        lock = threading.Lock()

        def callback(task_id: str) -> Any:
            def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
                assert error is None
                with lock:
                    results[task_id].append(outcome)
            return done

        # Queued before the threads start: every writer has a backlog when sync is asked.
        for c in claims:
            writer.submit(TaskWrite(c.task_id, c.generation, "holder-1", "step",
                                    steps=[("a", "1")]), callback(c.task_id))
        writer.start()
        writer.sync()
        # Everything queued before sync was handled, on every writer thread.
        assert {t: len(r) for t, r in results.items()} == {c.task_id: 1 for c in claims}
        assert all(r[0] is not None and r[0].ok for r in results.values())
        for c in claims:
            assert [s.name for s in ledger.timeline(c.task_id).steps] == ["a"]
        # Final writes queued right before stop are all committed before the threads end.
        for c in claims:
            writer.submit(TaskWrite(c.task_id, c.generation, "holder-1", "finish",
                                    transition=Transition(State.SUCCEEDED, result_json="1")),
                          callback(c.task_id))
        writer.stop()
        writer.join(20)
        assert not writer.is_alive()
        assert all(len(r) == 2 and r[1] is not None and r[1].ok for r in results.values())
        assert all(ledger.get(c.task_id).state is State.SUCCEEDED for c in claims)
        assert writer.writes == 2 * len(claims)
        assert 2 <= writer.transactions <= 2 * len(claims)
        with pytest.raises(WriterStopped):
            writer.submit(TaskWrite(claims[0].task_id, claims[0].generation, "holder-1",
                                    "late", steps=[("b", "2")]), callback(claims[0].task_id))
        with pytest.raises(WriterStopped):
            writer.commit(TaskWrite(claims[0].task_id, claims[0].generation, "holder-1",
                                    "late", steps=[("b", "2")]))
    finally:
        ledger.close()
        setup.close()


def test_worker_with_writers_stops_every_writer_thread(app: App) -> None:
    @app.task(name="t.noop")
    def noop(ctx: TaskContext, i: int) -> int:
        return i

    app.submit_many([SubmitRequest("t.noop", {"i": i}) for i in range(20)])
    worker = Worker(app, concurrency=2, writers=3, poll_interval_s=0.01)
    done = threading.Event()
    thread = threading.Thread(target=lambda: (worker.run(), done.set()))
    thread.start()
    try:
        wait_for("20 tasks done", lambda: worker.stats.succeeded == 20, timeout_s=20.0)
        assert worker.writer.is_alive()
    finally:
        worker.stop()
        thread.join(20)
    assert done.is_set()
    assert not worker.writer.is_alive()
    assert worker.writer.writes >= 20


def test_cli_worker_accepts_writers(app: App) -> None:
    result = CliRunner().invoke(cli, ["worker", "--help"])
    assert result.exit_code == 0
    assert "--writers" in result.output
    bad = CliRunner().invoke(cli, ["worker", "x:app", "--writers", "0"])
    assert bad.exit_code == 2
