"""``async def`` task bodies on the worker's event loop, in this process, on both ledgers:
steps (async and sync functions), effects whose call and lookup are coroutines, emits,
transaction steps, durable sleeps, hooks, the refusals (an awaitable in a plain def task,
``ctx.batches`` in an async one), cancel and pause of a running async body, and its time
limit. External systems are dicts counting what happened on their side."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from typing import Any

import pytest

from ratchet import (
    NOT_FOUND,
    App,
    AsyncTaskContext,
    Control,
    Middleware,
    PermanentError,
    State,
    TaskContext,
    Worker,
)
from ratchet.errors import ConfigError, TransactionMisuse
from ratchet.testing import fast_retry_policy, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(60)

FAST = fast_retry_policy()


def test_registration_marks_async_definitions(app: App) -> None:
    @app.task(name="t.async")
    async def a(ctx: AsyncTaskContext, n: int) -> int:
        return n

    @app.task(name="t.sync")
    def s(ctx: TaskContext, n: int) -> int:
        return n

    assert app.definition("t.async").is_async
    assert not app.definition("t.sync").is_async
    with pytest.raises(ConfigError, match="context parameter"):
        @app.task(name="t.noctx")
        async def bad() -> None:
            return None


def test_async_steps_effects_emit_and_transaction(app: App, backend: str) -> None:
    sent: Counter[str] = Counter()
    loop_threads: set[str] = set()

    async def charge(key: str) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        loop_threads.add(threading.current_thread().name)
        sent[key] += 1
        return {"charged": key}

    async def find(key: str) -> Any:
        return NOT_FOUND

    async def fetch(x: int) -> int:
        await asyncio.sleep(0.001)
        return x * 2

    def write_row(conn: Any, value: int) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS async_rows (v INTEGER)")
        mark = "?" if backend == "sqlite" else "%s"
        conn.execute(f"INSERT INTO async_rows (v) VALUES ({mark})", (value,))
        return value

    @app.task(name="t.order", retry=FAST)
    async def order(ctx: AsyncTaskContext, n: int) -> dict[str, Any]:
        doubled = await ctx.step("fetch", fetch, n)
        plain = await ctx.step("plain", lambda: n + 1)
        receipt = await ctx.effect("charge", charge, key=f"charge:{n}", lookup=find,
                                   in_flight_s=0.0)
        mid = await ctx.emit("order.paid", {"n": n})
        row = await ctx.transaction("row", write_row, n)
        return {"doubled": doubled, "plain": plain, "receipt": receipt, "mid": mid,
                "row": row}

    handles = [app.submit("t.order", {"n": i}) for i in range(5)]
    with running_worker(app, concurrency=2, async_concurrency=10):
        infos = [h.wait(timeout_s=30) for h in handles]
    for i, info in enumerate(infos):
        assert info.state is State.SUCCEEDED, info.last_error
        assert info.result["doubled"] == 2 * i
        assert info.result["plain"] == i + 1
        assert info.result["receipt"] == {"charged": f"charge:{i}"}
        assert info.result["row"] == i
    assert sent == Counter({f"charge:{i}": 1 for i in range(5)})
    assert loop_threads == {"ratchet-async"}  # the coroutines ran on the worker's loop


def test_hooks_fire_for_async_steps_and_effects(app: App) -> None:
    seen: list[str] = []

    class Record(Middleware):
        def before_step(self, ctx: Any, name: str) -> None:
            seen.append(f"step:{name}")

        def after_effect(self, ctx: Any, name: str, key: str, how: str, duration_s: float,
                         error: BaseException | None) -> None:
            seen.append(f"effect:{name}:{how}")

    async def call(key: str) -> int:
        return 1

    @app.task(name="t.hooked", retry=FAST)
    async def hooked(ctx: AsyncTaskContext) -> int:
        await ctx.step("a", lambda: 1)
        return int(await ctx.effect("e", call, key="k", idempotent=True))

    h = app.submit("t.hooked", {})
    with running_worker(app, middleware=[Record()]):
        assert h.wait(timeout_s=30).state is State.SUCCEEDED
    assert seen == ["step:a", "effect:e:call"]


def test_an_awaitable_in_a_plain_task_is_refused(app: App) -> None:
    async def fetch() -> int:
        return 1

    @app.task(name="t.mixed", retry=FAST)
    def mixed(ctx: TaskContext) -> Any:
        return ctx.step("fetch", fetch)

    h = app.submit("t.mixed", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    assert info.state is State.FAILED
    assert "async def" in (info.last_error or "")


def test_an_effect_call_returning_an_awaitable_in_a_plain_task_fails_not_unknown(
        app: App) -> None:
    sent: list[str] = []

    async def charge(key: str) -> int:
        sent.append(key)  # never runs: the coroutine is closed unawaited
        return 1

    @app.task(name="t.mixed_effect", retry=FAST)
    def mixed(ctx: TaskContext) -> Any:
        return ctx.effect("charge", lambda key: charge(key), key="k1")

    h = app.submit("t.mixed_effect", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    # Nothing left the process, so the outcome is known: FAILED, not UNKNOWN.
    assert info.state is State.FAILED, info
    assert "async def" in (info.last_error or "")
    assert sent == []
    [effect] = Control(app=app).history(h.task_id).effects
    assert effect.state.value == "not_done"


def test_batches_are_refused_in_an_async_task(app: App) -> None:
    @app.task(name="t.batches", retry=FAST)
    async def batches(ctx: AsyncTaskContext) -> Any:
        return ctx.batches("b", [1, 2], lambda items, start: None, size=1)

    h = app.submit("t.batches", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    assert info.state is State.FAILED
    assert "ctx.batches" in (info.last_error or "")


def test_a_durable_sleep_in_an_async_task(app: App) -> None:
    @app.task(name="t.sleeper", retry=FAST)
    async def sleeper(ctx: AsyncTaskContext) -> int:
        before = await ctx.step("before", lambda: 1)
        await ctx.sleep("nap", 0.3)
        return int(before) + 1

    h = app.submit("t.sleeper", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    assert info.state is State.SUCCEEDED and info.result == 2
    assert info.generation >= 2  # woken by the ledger, claimed again, replayed


@pytest.mark.parametrize("request_kind", ["cancel", "pause"])
def test_cancel_and_pause_reach_a_running_async_body(app: App, ledger_url: str,
                                                     request_kind: str) -> None:
    started = threading.Event()
    release = threading.Event()
    seen: dict[str, AsyncTaskContext] = {}

    async def gate() -> int:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return 1

    @app.task(name="t.long", retry=FAST)
    async def long(ctx: AsyncTaskContext) -> int:
        seen["ctx"] = ctx
        await ctx.step("first", gate)
        await ctx.step("second", lambda: 2)
        return 3

    h = app.submit("t.long", {})
    control = Control(ledger_url)
    try:
        with running_worker(app):
            assert started.wait(20)
            if request_kind == "cancel":
                control.cancel(h.task_id, reason="test")
            else:
                control.pause("task", h.task_id, reason="test")
            # The heartbeat reads the request for the lease; the next boundary stops.
            wait_for("the request to reach the lease",
                     lambda: seen["ctx"].lease.request is not None, timeout_s=20)
            release.set()
            expected = State.CANCELLED if request_kind == "cancel" else State.PAUSED
            wait_for(f"the task to be {expected.value}",
                     lambda: app.get(h.task_id).state is expected, timeout_s=20)
        steps = {s.name for s in app.ledger.timeline(h.task_id).steps}
        assert "first" in steps and "second" not in steps
    finally:
        control.close()


def test_time_limit_cancels_an_async_body(app: App) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @app.task(name="t.slow", retry=FAST, time_limit_s=0.5)
    async def slow(ctx: AsyncTaskContext) -> None:
        await ctx.step("forever", forever)

    h = app.submit("t.slow", {})
    with running_worker(app) as worker:
        wait_for("the time limit", lambda: app.get(h.task_id).error_class == "time_limit",
                 timeout_s=20)
        assert cancelled.wait(10)
        assert worker.stats.stuck_threads == 0


def test_a_stopping_worker_releases_an_async_body_at_its_next_boundary(app: App) -> None:
    started = threading.Event()
    release = threading.Event()

    async def gate() -> int:
        started.set()
        while not release.is_set():
            await asyncio.sleep(0.01)
        return 1

    @app.task(name="t.stopped", retry=FAST)
    async def stopped(ctx: AsyncTaskContext) -> int:
        await ctx.step("first", gate)
        await ctx.step("second", lambda: 2)
        return 3

    h = app.submit("t.stopped", {})
    with running_worker(app, shutdown_grace_s=20) as worker:
        assert started.wait(20)
        worker.stop()
        release.set()
    info = app.get(h.task_id)
    assert info.state is State.PENDING  # released at the "second" boundary
    assert worker.exit_code == 0
    assert [s.name for s in app.ledger.timeline(h.task_id).steps] == ["first"]


def test_the_end_of_the_grace_hands_back_and_cancels_an_async_body(app: App) -> None:
    started = threading.Event()
    cancelled = threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @app.task(name="t.stuck", retry=FAST)
    async def stuck(ctx: AsyncTaskContext) -> None:
        await ctx.step("forever", forever)

    h = app.submit("t.stuck", {})
    with running_worker(app, shutdown_grace_s=0.5) as worker:
        assert started.wait(20)
    assert cancelled.is_set()
    assert worker.stats.handed_back == 1 and worker.exit_code == 3
    assert app.get(h.task_id).state is State.PENDING


def test_async_concurrency_is_validated(app: App) -> None:
    @app.task(name="t.any")
    async def any_(ctx: AsyncTaskContext) -> None:
        return None

    for bad in (0, 10_001, "8"):
        with pytest.raises(ConfigError, match="async_concurrency"):
            Worker(app, async_concurrency=bad)  # type: ignore[arg-type]


def test_children_and_events_in_an_async_task(app: App) -> None:
    @app.task(name="t.child", retry=FAST)
    def child(ctx: TaskContext, n: int) -> int:
        return n * 10

    @app.task(name="t.parent", retry=FAST)
    async def parent(ctx: AsyncTaskContext) -> dict[str, Any]:
        handles = await ctx.submit_many("t.child", [{"n": 1}, {"n": 2}])
        one = await ctx.submit("t.child", {"n": 3})
        results = await ctx.gather([*handles, one])
        got = await ctx.wait_for_event("shipped", key=ctx.task_id, timeout_s=60)
        return {"results": results, "event": got}

    h = app.submit("t.parent", {})
    with running_worker(app):
        wait_for("the parent to wait for its event", lambda: any(
            s.name.startswith("event-deadline:") for s in app.ledger.timeline(h.task_id).steps),
            timeout_s=30)
        app.send_event("shipped", key=h.task_id, payload={"box": 7})
        info = h.wait(timeout_s=30)
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == {"results": [10, 20, 30], "event": {"box": 7}}


def test_an_async_task_that_fails_is_compensated(app: App) -> None:
    undone: list[str] = []

    async def call(key: str) -> str:
        return f"done:{key}"

    @app.task(name="t.saga", retry=FAST)
    async def saga(ctx: AsyncTaskContext) -> None:
        await ctx.effect("reserve", call, key="r-1", idempotent=True,
                         compensate=lambda key, result: undone.append(f"{key}={result}"))
        raise PermanentError("out of stock")

    h = app.submit("t.saga", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    assert info.state is State.COMPENSATED, info.last_error
    assert undone == ["compensate:r-1=done:r-1"]


def test_checkpoints_awaited_side_by_side_are_refused(app: App) -> None:
    async def slow() -> int:
        await asyncio.sleep(0.05)
        return 1

    @app.task(name="t.gathered", retry=FAST)
    async def gathered(ctx: AsyncTaskContext) -> Any:
        return await asyncio.gather(ctx.step("a", slow), ctx.step("b", slow))

    h = app.submit("t.gathered", {})
    with running_worker(app):
        info = h.wait(timeout_s=30)
    assert info.state is State.FAILED
    assert "one at a time" in (info.last_error or "")


def test_a_task_the_body_left_running_cannot_checkpoint_after_it_returned(
        app: App) -> None:
    ran: list[str] = []
    outcome: list[BaseException] = []
    spawned: list[asyncio.Task[Any]] = []
    release = asyncio.Event()

    async def orphan(ctx: AsyncTaskContext) -> None:
        await release.wait()
        try:
            await ctx.step("late", lambda: ran.append("late"))
        except BaseException as exc:
            outcome.append(exc)

    @app.task(name="t.spawner", retry=FAST)
    async def spawner(ctx: AsyncTaskContext) -> int:
        spawned.append(asyncio.get_running_loop().create_task(orphan(ctx)))
        return 1

    h = app.submit("t.spawner", {})
    with running_worker(app):
        assert h.wait(timeout_s=30).state is State.SUCCEEDED
        loop = spawned[0].get_loop()
        loop.call_soon_threadsafe(release.set)
        wait_for("the orphan's step to be refused", lambda: outcome, timeout_s=30)
    assert ran == []
    assert isinstance(outcome[0], TransactionMisuse), outcome
