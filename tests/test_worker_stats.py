"""WorkerStats updates are thread-safe: task threads, the writer thread and the heartbeat
all count into the same object."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from ratchet import App, State, TaskContext
from ratchet.testing.worker import running_worker
from ratchet.worker import WorkerStats

pytestmark = pytest.mark.timeout(120)

THREADS = 16
PER_THREAD = 20_000


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Switch threads as often as the interpreter allows, so unlocked ``+=`` races show."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_counters_from_many_threads_add_up(fine_switching: None) -> None:
    stats = WorkerStats()
    start = threading.Barrier(THREADS)

    def hammer(i: int) -> None:
        start.wait()
        for _ in range(PER_THREAD):
            stats.add("succeeded")
            stats.add("claimed", 2)
            stats.add_outcome("SUCCEEDED" if i % 2 else "stale")

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.succeeded == THREADS * PER_THREAD
    assert stats.claimed == 2 * THREADS * PER_THREAD
    assert stats.by_outcome == {
        "SUCCEEDED": THREADS // 2 * PER_THREAD, "stale": THREADS // 2 * PER_THREAD
    }
    snap = stats.snapshot()
    assert snap["succeeded"] == THREADS * PER_THREAD
    assert snap["by_outcome"] == stats.by_outcome and snap["by_outcome"] is not stats.by_outcome
    assert "_lock" not in snap
    assert asdict(stats) == snap  # the lock is no field: asdict / == see counters only


def test_a_busy_worker_counts_every_task(ledger_url: str) -> None:
    app = App(ledger_url)
    try:

        @app.task(name="t.count")
        def count(ctx: TaskContext, i: int) -> int:
            return int(ctx.step("s", lambda: i))

        handles = [app.submit("t.count", {"i": i}) for i in range(300)]
        with running_worker(app, concurrency=16) as worker:
            infos = [app.wait(h.task_id, timeout_s=60) for h in handles]
        assert all(i.state is State.SUCCEEDED for i in infos)
        snap = worker.stats.snapshot()
        assert snap["claimed"] == 300 and snap["succeeded"] == 300
        assert snap["by_outcome"] == {"SUCCEEDED": 300}
    finally:
        app.close()
