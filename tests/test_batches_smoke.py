from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from ratchet import App, BatchCounts, State, TaskContext
from ratchet.testing.worker import running_worker


def test_smoke(app: App) -> None:
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    @app.task(name="b.smoke")
    def smoke(ctx: TaskContext, n: int, parallel: int) -> Any:
        def fn(batch: list[int], pos: int) -> BatchCounts | None:
            with lock:
                seen.update(batch)
            ctx.effect("send", lambda k: len(batch), key=f"send:{pos}")
            return BatchCounts(skipped=1) if pos == 0 else None
        return ctx.batches("items", list(range(n)), fn, size=7, parallel=parallel)

    h = app.submit("b.smoke", {"n": 100, "parallel": 4})
    with running_worker(app):
        info = app.wait(h.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == {"name": "items", "items": 100, "succeeded": 99, "failed": 0,
                           "skipped": 1, "batches": 15}
    assert seen == Counter(range(100))
    [run] = app.ledger.batch_runs([h.task_id])
    assert run.watermark == 100 and run.done and run.above == () and run.total == 100


def test_sharded(app: App) -> None:
    @app.task(name="b.shard")
    def shard(ctx: TaskContext, n: int) -> Any:
        s = ctx.shard
        assert s is not None
        mine = [i for i in range(n) if s.owns(str(i))]
        return ctx.batches("mine", mine, lambda b, p: None, size=5)

    h = app.submit_sharded("b.shard", {"n": 200}, shards=4)
    with running_worker(app):
        info = app.wait(h.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result["totals"]["items"] == 200
    assert info.result["shards"] == 4


def test_check(app: App) -> None:
    from ratchet import Control

    @app.task(name="b.shard2")
    def shard(ctx: TaskContext, n: int) -> Any:
        s = ctx.shard
        assert s is not None
        mine = [i for i in range(n) if s.owns(str(i))]
        return ctx.batches("mine", mine, lambda b, p: None, size=5)

    h = app.submit_sharded("b.shard2", {"n": 100}, shards=3)
    with running_worker(app):
        app.wait(h.task_id, timeout_s=30)
    with Control(app=app) as c:
        rep = c.check(h.task_id)
        print(rep)
        assert rep.ok and rep.shards == 3 and len(rep.lines) == 4
        assert rep.lines[-1].expected == 100
