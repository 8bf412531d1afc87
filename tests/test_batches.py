"""Long work in batches and sharded jobs with a real worker on both ledgers (DESIGN §6 row
9, §8 logical shards): the watermark, resume after a failed attempt, a lost commit below a
later one, effects inside batches, the window, what fn may call, bad input, cancel, and the
conservation check. Crash tests with killed processes live in tests/batches/."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ratchet import (
    App,
    BatchCounts,
    InvalidArguments,
    PermanentError,
    State,
    SubmitRequest,
    TaskContext,
    TransientError,
)
from ratchet.control import Control
from ratchet.ledger.base import TaskQuery
from ratchet.shards import shard_of
from ratchet.testing import wait_for
from ratchet.testing.doubles import fast_retry_policy
from ratchet.testing.worker import running_worker
from ratchet.worker.batches import WINDOW_BATCHES

REPORT_KEYS = {"name", "items", "succeeded", "failed", "skipped", "batches"}


def _run(app: App, task_id: str) -> Any:
    [run] = app.ledger.batch_runs([task_id])
    return run


def test_every_item_once_in_order_of_positions_with_counts(app: App) -> None:
    seen: Counter[int] = Counter()
    lock = threading.Lock()

    @app.task(name="b.count")
    def count(ctx: TaskContext, n: int, parallel: int) -> Any:
        def fn(batch: list[int], position: int) -> BatchCounts | None:
            assert batch[0] == position  # the list's item at a position is the position
            with lock:
                seen.update(batch)
            if position == 0:
                return BatchCounts(failed=1, skipped=2)
            return None
        return ctx.batches("items", list(range(n)), fn, size=7, parallel=parallel)

    handles = [app.submit("b.count", {"n": 100, "parallel": p}) for p in (1, 4)]
    with running_worker(app):
        infos = [app.wait(h.task_id, timeout_s=30) for h in handles]
    for info in infos:
        assert info.state is State.SUCCEEDED, info.last_error
        assert info.result == {"name": "items", "items": 100, "succeeded": 97, "failed": 1,
                               "skipped": 2, "batches": 15}
        run = _run(app, info.task_id)
        assert (run.watermark, run.above, run.done, run.total) == (100, (), True, 100)
        assert run.processed == run.committed_items == 100
    assert seen == Counter({i: 2 for i in range(100)})


def test_a_callable_source_is_read_from_the_watermark_on_a_retry(app: App) -> None:
    starts: list[int] = []
    calls: Counter[int] = Counter()

    @app.task(name="b.resume", retry=fast_retry_policy())
    def resume(ctx: TaskContext) -> Any:
        def source(start: int) -> Any:
            starts.append(start)
            return iter(range(start, 50))

        def fn(batch: list[int], position: int) -> None:
            calls[position] += 1
            if position == 30 and ctx.attempt == 1:
                raise TransientError("the target hiccuped at 30")
        return ctx.batches("items", source, fn, size=10, total=50)

    handle = app.submit("b.resume")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.attempt == 2
    assert starts == [0, 30]  # the second attempt starts at the watermark
    assert calls == {0: 1, 10: 1, 20: 1, 30: 2, 40: 1}
    assert info.result["items"] == 50


def test_a_lost_batch_below_a_committed_one_runs_again_and_the_later_one_does_not(
        app: App) -> None:
    # Batch 0 fails only once batch 1 has committed: the watermark stays at 0 with batch 1
    # above it; the retry processes batch 0 again and skips batch 1 (DESIGN §6 row 9).
    calls: Counter[int] = Counter()
    committed_above = threading.Event()

    @app.task(name="b.hole", retry=fast_retry_policy())
    def hole(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            calls[position] += 1
            if position == 0 and ctx.attempt == 1:
                wait_for("batch 1 to commit", committed_above.is_set, timeout_s=20)
                raise TransientError("batch 0 lost")
        return ctx.batches("items", list(range(20)), fn, size=10, parallel=2)

    handle = app.submit("b.hole")

    def above() -> bool:
        runs = app.ledger.batch_runs([handle.task_id])
        if runs and runs[0].above == ((10, 20),) and runs[0].watermark == 0:
            committed_above.set()
            return True
        return False

    with running_worker(app):
        wait_for("batch 1 committed above a hole", above, timeout_s=20)
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert calls == {0: 2, 10: 1}
    assert info.result["items"] == 20 and info.result["batches"] == 2
    assert _run(app, handle.task_id).watermark == 20


def test_an_effect_inside_a_batch_happens_once_when_the_batch_runs_again(app: App) -> None:
    sent: Counter[str] = Counter()

    @app.task(name="b.effect", retry=fast_retry_policy())
    def effect(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            for i in batch:
                ctx.effect("deliver", lambda k: sent.update([k]) or k, key=f"item:{i}")
            if position == 4 and ctx.attempt == 1:
                raise TransientError("after the effects, before the commit")
        return ctx.batches("items", list(range(8)), fn, size=4, parallel=2)

    handle = app.submit("b.effect")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert sent == Counter({f"item:{i}": 1 for i in range(8)})
    # The batch's effects are its own, stored under the batch's position.
    names = {e.name for e in app.ledger.timeline(handle.task_id).effects}
    assert f"ratchet:batch:items@{4:020d}/deliver#4" in names


def test_a_finished_run_is_a_checkpoint_a_replay_returns_without_running_fn(
        app: App) -> None:
    calls: Counter[int] = Counter()

    @app.task(name="b.replay", retry=fast_retry_policy())
    def replay(ctx: TaskContext) -> Any:
        report = ctx.batches("items", list(range(6)), lambda b, p: calls.update([p]),
                             size=3)
        if ctx.attempt == 1:
            raise TransientError("after the run")
        return report

    handle = app.submit("b.replay")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert calls == {0: 1, 3: 1}
    assert set(info.result) == REPORT_KEYS and info.result["items"] == 6


def test_batches_start_at_most_a_window_past_a_slow_batch(app: App) -> None:
    release = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    @app.task(name="b.window")
    def window(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            with lock:
                started.append(position)
            if position == 0:
                wait_for("the test to release batch 0", release.is_set, timeout_s=30)
        return ctx.batches("items", list(range(1000)), fn, size=1, parallel=2)

    handle = app.submit("b.window")
    limit = WINDOW_BATCHES * 2
    with running_worker(app):
        wait_for("the window to fill", lambda: len(started) >= limit, timeout_s=20)
        # Give the run every chance to overrun: it waits for batch 0 instead.
        wait_for("the run to stop at the window", lambda: _stalled(app, handle.task_id,
                                                                   limit - 1), timeout_s=20)
        with lock:
            assert max(started) <= limit
        release.set()
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.SUCCEEDED, info.last_error
    assert len(started) == 1000


def _stalled(app: App, task_id: str, above: int) -> bool:
    runs = app.ledger.batch_runs([task_id])
    return bool(runs) and runs[0].watermark == 0 and len(runs[0].above) >= above


@pytest.mark.parametrize("call", ["step", "sleep", "batches", "compensate"])
def test_fn_may_only_call_ctx_effect(app: App, call: str) -> None:
    @app.task(name="b.misuse")
    def misuse(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            if call == "step":
                ctx.step("inner", lambda: 1)
            elif call == "sleep":
                ctx.sleep("inner", 1)
            elif call == "batches":
                ctx.batches("inner", [1], lambda b, p: None, size=1)
            else:
                ctx.effect("e", lambda k: 1, key="k", compensate=lambda k, r: None)
        return ctx.batches("items", [1, 2], fn, size=1)

    handle = app.submit("b.misuse")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED
    expected = "cannot register a compensation" if call == "compensate" else (
        "only ctx.effect may be called")
    assert expected in (info.last_error or "")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"size": 0}, "size must be an int from 1"),
    ({"size": 2, "parallel": 0}, "parallel must be an int from 1"),
    ({"size": 2, "parallel": 65}, "parallel must be an int from 1 to 64"),
    ({"size": 2, "source": 5}, "source must be callable"),
    ({"size": 2, "name": "ratchet:x"}, "reserved"),
    ({"size": 2, "total": -1}, "total must be an int"),
    ({"size": 2, "returns": 3}, "fn must return None or ratchet.BatchCounts"),
    ({"size": 2, "returns": BatchCounts(failed=3)}, "adding up to at most"),
])
def test_bad_arguments_fail_the_task_with_a_specific_error(
        app: App, kwargs: dict[str, Any], message: str) -> None:
    @app.task(name="b.bad")
    def bad(ctx: TaskContext) -> Any:
        options = dict(kwargs)
        name = options.pop("name", "items")
        source = options.pop("source", [1, 2, 3])
        returns = options.pop("returns", None)
        return ctx.batches(name, source, lambda b, p: returns, **options)

    handle = app.submit("b.bad")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED
    assert message in (info.last_error or ""), info.last_error


def test_reserved_checkpoint_names_are_refused(app: App) -> None:
    @app.task(name="b.reserved")
    def reserved(ctx: TaskContext) -> None:
        ctx.step("ratchet:compensating", lambda: 1)

    handle = app.submit("b.reserved")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED and "reserved" in (info.last_error or "")


def test_cancel_stops_the_run_at_the_next_batch(app: App) -> None:
    gate = threading.Event()
    calls: list[int] = []

    @app.task(name="b.cancel")
    def cancel(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            calls.append(position)
            if position == 2:
                wait_for("the cancel", gate.is_set, timeout_s=30)
            if position == 3:  # the heartbeat brings the request to the holder
                wait_for("the request to reach the holder",
                         lambda: ctx.lease.request is not None, timeout_s=30)
        return ctx.batches("items", list(range(100)), fn, size=1)

    handle = app.submit("b.cancel")
    with running_worker(app):
        wait_for("batch 2 to start", lambda: 2 in calls, timeout_s=20)
        Control(app=app).cancel(handle.task_id, reason="operator stop", by="test")
        gate.set()
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.CANCELLED
    # The boundary after batch 2 (the heartbeat already brought the request) or after
    # batch 3 (which waits for it) saw the request: no batch past them started.
    assert calls in ([0, 1, 2], [0, 1, 2, 3])
    # Every batch that started (one at a time) committed before the next boundary.
    assert _run(app, handle.task_id).watermark == len(calls)


def test_sharded_job_partitions_items_and_conserves_totals(app: App) -> None:
    owned: dict[int, list[int]] = {}
    lock = threading.Lock()

    @app.task(name="b.shard")
    def shard(ctx: TaskContext, n: int) -> Any:
        s = ctx.shard
        assert s is not None and s.count == 5
        mine = [i for i in range(n) if s.owns(f"order-{i}")]
        with lock:
            owned[s.index] = mine
        return ctx.batches("orders", mine, lambda b, p: None, size=10, parallel=2)

    handle = app.submit_sharded("b.shard", {"n": 300}, shards=5, key="job-1")
    again = app.submit_sharded("b.shard", {"n": 300}, shards=5, key="job-1")
    assert again.task_id == handle.task_id and not again.created
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result["shards"] == 5 and info.result["totals"]["items"] == 300
    assert sorted(i for items in owned.values() for i in items) == list(range(300))
    assert all(shard_of(f"order-{i}", 5) == k for k, items in owned.items() for i in items)
    children = app.ledger.children(handle.task_id)
    assert len(children) == 5
    report = Control(app=app).check(handle.task_id)
    assert report.ok and report.shards == 5
    job = report.lines[-1]
    assert (job.scope, job.expected, job.succeeded, job.in_flight, job.difference) == (
        "job", 300, 300, 0, 0)


def test_a_failed_shard_fails_the_job_and_the_check_shows_what_is_missing(app: App) -> None:
    @app.task(name="b.bad_shard", retry=fast_retry_policy())
    def bad_shard(ctx: TaskContext, n: int) -> Any:
        s = ctx.shard
        assert s is not None

        def fn(batch: list[int], position: int) -> None:
            if s.index == 1 and position >= 10:
                raise PermanentError("shard 1 cannot go on")
        return ctx.batches("items", list(range(n)), fn, size=10)

    handle = app.submit_sharded("b.bad_shard", {"n": 40}, shards=2)
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.FAILED
    assert "ChildFailed" in (info.error_class or "") or "child" in (info.last_error or "")
    report = Control(app=app).check(handle.task_id)
    assert not report.ok
    bad = [x for x in report.lines if x.scope.startswith("shard 1/2")]
    assert bad and bad[0].difference == 30 and "never processed" in bad[0].note
    assert report.lines[-1].scope == "job" and not report.lines[-1].ok


@pytest.mark.parametrize("shards", [0, 4097, True, "3"])
def test_submit_sharded_refuses_a_bad_shard_count(app: App, shards: Any) -> None:
    @app.task(name="b.any")
    def any_task(ctx: TaskContext) -> None:
        return None

    with pytest.raises(InvalidArguments, match="shards must be an int"):
        app.submit_sharded("b.any", {}, shards=shards)



def test_the_check_catches_a_report_that_disagrees_with_the_ledger(
        app: App, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fault in the worker's own tally (a batch counted twice by the task although
    # committed once) is the kind of error the check exists for: inject one.
    from ratchet.worker import batches as worker_batches

    honest = worker_batches._Run.report

    def inflated(self: Any) -> dict[str, Any]:
        report = honest(self)
        return {**report, "succeeded": report["succeeded"] + 10, "batches": report["batches"] + 1}

    monkeypatch.setattr(worker_batches._Run, "report", inflated)

    @app.task(name="b.inflated")
    def inflated_task(ctx: TaskContext) -> Any:
        return ctx.batches("items", list(range(30)), lambda b, p: None, size=10)

    handle = app.submit("b.inflated")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.result["succeeded"] == 40
    report = Control(app=app).check(handle.task_id)
    assert not report.ok
    [line] = report.lines
    assert "succeeded 40 (ledger 30)" in line.note and line.difference == 10


def test_a_job_retried_after_its_failed_shard_was_retried_completes(app: App) -> None:
    broken = threading.Event()
    broken.set()

    @app.task(name="b.flaky_shard", retry=fast_retry_policy())
    def flaky_shard(ctx: TaskContext, n: int) -> Any:
        s = ctx.shard
        assert s is not None

        def fn(batch: list[int], position: int) -> None:
            if s.index == 1 and position >= 10 and broken.is_set():
                raise PermanentError("shard 1 cannot go on yet")
        return ctx.batches("items", list(range(n)), fn, size=10)

    handle = app.submit_sharded("b.flaky_shard", {"n": 40}, shards=3)
    control = Control(app=app)
    with running_worker(app):
        assert app.wait(handle.task_id, timeout_s=60).state is State.FAILED
        # Retrying the job alone fails it again: the shard is still FAILED.
        control.retry(handle.task_id, reason="too early", by="test")
        wait_for("the job to fail again", lambda: app.get(handle.task_id).state
                 is State.FAILED and app.get(handle.task_id).attempt == 1, timeout_s=60)
        [shard] = [c for c in app.ledger.children(handle.task_id)
                   if c.state is State.FAILED]
        broken.clear()
        control.retry(shard.task_id, reason="fixed the target", by="test")
        control.retry(handle.task_id, reason="its shard was retried", by="test")
        info = app.wait(handle.task_id, timeout_s=60)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result["totals"]["items"] == 120
    report = control.check(handle.task_id)
    assert report.ok, report


@pytest.mark.parametrize("key", ["ratchet:shards", "ratchet:shard"])
def test_params_may_not_forge_a_shard_job_or_place(app: App, key: str) -> None:
    @app.task(name="b.kwargs")
    def kwargs_task(ctx: TaskContext, **params: Any) -> None:
        return None

    value: Any = 50 if key == "ratchet:shards" else {"index": 7, "count": 2}
    with pytest.raises(InvalidArguments, match="are Ratchet's own"):
        app.submit("b.kwargs", {key: value})
    with pytest.raises(InvalidArguments, match="are Ratchet's own"):
        app.submit_many([SubmitRequest("b.kwargs", {key: value})])
    assert app.ledger.list_tasks(TaskQuery(names=["b.kwargs"])) == []


def test_ctx_used_from_a_thread_the_run_did_not_start_is_refused(app: App) -> None:
    @app.task(name="b.helper_thread")
    def helper_thread(ctx: TaskContext) -> Any:
        def fn(batch: list[int], position: int) -> None:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda i: ctx.effect("send", lambda k: k, key=f"item:{i}"),
                              batch))
        return ctx.batches("items", list(range(4)), fn, size=2)

    handle = app.submit("b.helper_thread")
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED
    assert "a thread that ctx.batches did not start" in (info.last_error or "")
    assert [e.name for e in app.ledger.timeline(handle.task_id).effects] == []


def test_check_of_a_job_whose_shards_return_their_own_totals(app: App) -> None:
    @app.task(name="b.plain_shard")
    def plain_shard(ctx: TaskContext) -> dict[str, int]:
        return {"succeeded": 5}

    handle = app.submit_sharded("b.plain_shard", {}, shards=2)
    with running_worker(app):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.SUCCEEDED and info.result["totals"] == {"succeeded": 10}
    report = Control(app=app).check(handle.task_id)
    assert report.ok, report


def test_check_says_when_more_items_were_processed_than_the_total(app: App) -> None:
    @app.task(name="b.short_total")
    def short_total(ctx: TaskContext) -> Any:
        return ctx.batches("items", lambda s: iter(range(s, 50)), lambda b, p: None,
                           size=10, total=20)

    handle = app.submit("b.short_total")
    with running_worker(app):
        assert app.wait(handle.task_id, timeout_s=30).state is State.SUCCEEDED
    [line] = Control(app=app).check(handle.task_id).lines
    assert not line.ok and "30 more items processed than the total of 20" in line.note
