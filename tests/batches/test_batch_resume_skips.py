"""A resumed ``ctx.batches`` run skips every batch an earlier attempt committed above the
watermark, however the source's reading and the batches' commits interleave (a worker in
this process, both ledgers).

The first attempt's batch at position 0 fails (a transient error) after the three batches
after it committed: the run resumes at watermark 0 with three batches above it. In the
second attempt the source is slow to read (as a query per row or a remote file is): batch
0 runs and commits, and the watermark advances over the three committed batches, before
the next batch is read. Each of them is skipped all the same: run once in all, counted
once in the task's result as in the ledger.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from ratchet import App, RetryPolicy, State, TaskContext, TransientError
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)

SIZE = 10
ITEMS = 4 * SIZE


def test_batches_committed_above_the_watermark_are_skipped_on_resume(app: App) -> None:
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    @app.task(name="b.resume", retry=RetryPolicy(max_attempts=3, base_delay_s=0.01,
                                                 max_delay_s=0.02))  # fmt: skip
    def resume(ctx: TaskContext) -> Any:
        def source(start: int) -> Iterator[int]:
            for item in range(start, ITEMS):
                if ctx.attempt > 1:
                    time.sleep(0.03)  # a slow read; the commit of batch 0 overtakes it
                yield item

        def fn(batch: list[int], pos: int) -> None:
            with lock:
                calls[pos] += 1
            if pos == 0 and ctx.attempt == 1:
                later = ((SIZE, 2 * SIZE), (2 * SIZE, 3 * SIZE), (3 * SIZE, 4 * SIZE))

                def later_committed() -> bool:
                    runs = app.ledger.batch_runs([ctx.task_id])
                    return bool(runs) and runs[0].above == later

                wait_for("the three later batches to commit", later_committed, 30.0, 0.01)
                raise TransientError("batch 0 fails on the first attempt")

        return ctx.batches("items", source, fn, size=SIZE, parallel=2, total=ITEMS)

    handle = app.submit("b.resume", {})
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.attempt == 2, info
    assert calls == {0: 2, SIZE: 1, 2 * SIZE: 1, 3 * SIZE: 1}
    assert info.result == {"name": "items", "items": ITEMS, "succeeded": ITEMS, "failed": 0,
                           "skipped": 0, "batches": 4}
    [run] = app.ledger.batch_runs([handle.task_id])
    assert (run.watermark, run.succeeded, run.batches, run.done) == (ITEMS, ITEMS, 4, True)
