"""Time limits per attempt (DESIGN §7, time limits): an attempt past its task
type's ``time_limit_s`` is ended by the worker with a fenced write at its own generation,
counted as a failed attempt (``error_class`` ``"time_limit"``), its slot freed at once while
its thread is still stuck in task code; what that thread writes later is rejected by the
fence. Both ledgers, real workers on threads of this process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratchet import (
    App,
    ConfigError,
    Middleware,
    RetryPolicy,
    State,
    TaskContext,
    TimeLimitExceeded,
    Worker,
)
from ratchet.ledger.base import Claim
from ratchet.retry import TIME_LIMIT
from ratchet.testing import (
    CountingService,
    check_ledger_consistent,
    start_counting_service,
    wait_for,
)
from ratchet.testing.worker import running_worker
from ratchet.worker.runner import EXIT_HANDED_BACK, EXIT_STUCK_THREADS

pytestmark = pytest.mark.timeout(90)

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.02, max_delay_s=0.05, jitter=0.0)
LIMIT_S = 0.5


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: every stuck task body returns (no thread outlives it)."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    """The counting service: executions counted in its own process and file."""
    svc = start_counting_service(tmp_path / "service.db", honour_keys=False,
                                 log_path=tmp_path / "service.log")
    yield svc
    svc.stop()


def events(app: App, task_id: str, kind: str) -> list[Any]:
    return [e for e in app.ledger.timeline(task_id).events if e.kind == kind]


def test_a_hung_attempt_is_fenced_retried_and_its_slot_freed(
    app: App, release: threading.Event
) -> None:
    """Attempt 1 sleeps far past its limit; the worker writes RETRY_WAIT for it, runs
    another task on its single slot meanwhile, and attempt 2 succeeds. The stuck thread's
    late result is rejected by the fence (audited), never applied."""
    returned = threading.Event()

    @app.task(name="t.hang", retry=FAST, time_limit_s=LIMIT_S)
    def hang(ctx: TaskContext) -> str:
        ctx.step("before", lambda: ctx.attempt)
        if ctx.attempt == 1:
            release.wait(60)  # stuck in task code, no step boundary
            returned.set()
            return "late"
        return "done"

    @app.task(name="t.quick")
    def quick(ctx: TaskContext) -> str:
        return "quick"

    handle = app.submit("t.hang")
    with running_worker(app, concurrency=1, prefetch=0) as worker:
        info = app.wait(handle.task_id, timeout_s=20)
        assert info.state is State.SUCCEEDED and info.result == "done"
        # The first body is still stuck, yet the single slot runs other work.
        assert not returned.is_set()
        assert worker.stats.stuck_threads == 1 and worker.stats.time_limited == 1
        other = app.wait(app.submit("t.quick").task_id, timeout_s=20)
        assert other.state is State.SUCCEEDED and other.result == "quick"
        assert not returned.is_set() and worker.stats.stuck_threads == 1

        release.set()  # the stuck body returns "late" at generation 1
        wait_for("the stuck thread to come back", lambda: worker.stats.stuck_threads == 0)
        stale = wait_for("the late result's stale rejection",
                         lambda: events(app, handle.task_id, "stale_rejected"))
    assert returned.is_set()
    assert stale[0].generation == 1 and stale[0].detail["operation"] == "finish:SUCCEEDED"
    final = app.get(handle.task_id)
    assert final.state is State.SUCCEEDED and final.result == "done"  # the late one lost
    assert final.attempt == 2 and final.generation == 2
    [limited] = [e for e in events(app, handle.task_id, "transition")
                 if e.to_state == "RETRY_WAIT"]
    assert limited.generation == 1 and limited.detail["error_class"] == TIME_LIMIT
    assert f"time limit of {LIMIT_S:g} s" in limited.detail["error"]
    assert "attempt 1 of 3" in limited.detail["error"]
    assert worker.stats.time_limited == 1 and worker.stats.retried == 1
    assert worker.stats.by_outcome.get("RETRY_WAIT") == 1


def test_the_final_attempt_past_its_limit_is_failed_with_the_time_limit_class(
    app: App, release: threading.Event
) -> None:
    @app.task(name="t.always_hangs",
              retry=RetryPolicy(max_attempts=2, base_delay_s=0.02, jitter=0.0),
              time_limit_s=LIMIT_S)
    def always_hangs(ctx: TaskContext) -> None:
        release.wait(60)

    handle = app.submit("t.always_hangs")
    with running_worker(app, concurrency=1, prefetch=0) as worker:
        info = app.wait(handle.task_id, timeout_s=20)
        assert worker.stats.stuck_threads == 2  # one per attempt: both still inside
        release.set()
        wait_for("the stuck threads to come back", lambda: worker.stats.stuck_threads == 0)
    assert info.state is State.FAILED and info.error_class == TIME_LIMIT
    assert info.attempt == 2
    last = info.last_error or ""
    assert last.startswith("TimeLimitExceeded:") and "attempt 2 of 2" in last
    assert f"time limit of {LIMIT_S:g} s" in last
    # where the thread was stuck: the traceback, kept apart from the message
    assert "release.wait(60)" in (app.get(handle.task_id).last_traceback or "")
    assert worker.stats.time_limited == 2 and worker.stats.failed == 1


def test_the_stuck_thread_stops_at_its_next_step(app: App) -> None:
    """The thread cannot be killed, but its next ctx.step raises TimeLimitExceeded: no
    step of it runs after the limit."""
    went_on = threading.Event()
    stop_sleeping = threading.Event()

    @app.task(name="t.slow_step", retry=RetryPolicy(max_attempts=1), time_limit_s=LIMIT_S)
    def slow_step(ctx: TaskContext) -> None:
        stop_sleeping.wait(60)
        ctx.step("after", went_on.set)

    handle = app.submit("t.slow_step")
    with running_worker(app, concurrency=1) as worker:
        assert app.wait(handle.task_id, timeout_s=20).state is State.FAILED
        stop_sleeping.set()
        wait_for("the stuck thread to come back", lambda: worker.stats.stuck_threads == 0)
    assert not went_on.is_set()


@pytest.mark.parametrize("final", [False, True], ids=["retried", "final-attempt"])
def test_an_effect_open_at_the_limit_executes_once(
    app: App, service: CountingService, release: threading.Event, final: bool
) -> None:
    """The first attempt's call reached the service, then hung in the client: its intent
    is open at the limit. Not the final attempt: RETRY_WAIT, and the next attempt settles
    the intent by lookup (executed once, counted at the service). The final attempt:
    UNKNOWN, never FAILED (the call may have happened)."""
    client = service.client()

    @app.task(name="t.charge",
              retry=RetryPolicy(max_attempts=1 if final else 3, base_delay_s=0.02,
                                jitter=0.0),
              time_limit_s=LIMIT_S)
    def charge(ctx: TaskContext) -> Any:
        def call(key: str) -> Any:
            record = client.execute(key, {"amount_cents": 100})
            if ctx.attempt == 1:
                release.wait(60)  # the reply never comes back in time
            return record

        return ctx.effect("charge", call, key="charge:o-1", lookup=client.lookup)

    handle = app.submit("t.charge")
    with running_worker(app, concurrency=1) as worker:
        info = app.wait(handle.task_id, timeout_s=20)
        release.set()
        wait_for("the stuck thread to come back", lambda: worker.stats.stuck_threads == 0)
    assert service.executions() == {"charge:o-1": 1}
    # The stuck call's reply came back after the attempt was ended: its result write was
    # fenced out, and the existing late-effect evidence applies (a possible duplicate to
    # reconcile; here the service counted one execution).
    [late] = app.ledger.late_effects(handle.task_id)
    assert late.generation == 1 and late.key == "charge:o-1"
    if final:
        assert info.state is State.UNKNOWN and info.error_class == TIME_LIMIT
    else:
        assert info.state is State.SUCCEEDED and info.attempt == 2
        assert info.result["key"] == "charge:o-1"
        assert events(app, handle.task_id, "lookup_hit")
    client.close()


def test_a_worker_stops_itself_at_max_stuck_threads(
    app: App, release: threading.Event
) -> None:
    @app.task(name="t.hangs", retry=RetryPolicy(max_attempts=5, base_delay_s=0.02),
              time_limit_s=LIMIT_S)
    def hangs(ctx: TaskContext) -> None:
        release.wait(60)

    app.submit("t.hangs")
    worker = Worker(app, concurrency=1, poll_interval_s=0.01, max_stuck_threads=2,
                    shutdown_grace_s=1.0)
    done = threading.Event()

    def run() -> None:
        worker.run()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(30), "the worker did not stop at max_stuck_threads"
    assert worker.stop_reason == "stuck_threads" and worker.exit_code == EXIT_STUCK_THREADS
    # It decides STUCK_CONFIRM_S after the count reached the cap (threads back by then do
    # not count), so one more attempt may have been started and ended meanwhile.
    assert worker.stats.time_limited >= 2 and worker.stats.stuck_threads >= 2
    assert worker.stats.stuck_threads == worker.stats.time_limited, "each one is stuck"


class _SlowWatchdog(Worker):
    """A worker whose watchdog, after ending an attempt, goes on only once that attempt's
    thread has come back from task code: the order a loaded machine can produce (the
    thread was in a ledger call or about to start an effect, and the watchdog thread got
    no CPU in between)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.came_back = threading.Event()
        self.gauge_seen: list[int] = []

    def _stuck_returned(self, claim: Claim, late: Any) -> None:
        super()._stuck_returned(claim, late)
        self.came_back.set()

    def _give_up(self, attempt: Any) -> None:
        self.came_back.wait(20)
        self.gauge_seen.append(self.stats.stuck_threads)
        super()._give_up(attempt)


def test_a_thread_back_from_task_code_before_the_watchdog_goes_on_is_not_stuck(
    app: App,
) -> None:
    """The thread of an attempt ended at its time limit comes back before the watchdog has
    written the end: it was counted stuck and detached when the attempt was taken from it,
    so its return uncounts it (the gauge never goes below 0) and it ends; the executor is
    left with no detached thread, the next attempt runs on a fresh one."""
    worker: _SlowWatchdog | None = None

    @app.task(name="t.back", retry=FAST, time_limit_s=LIMIT_S)
    def back(ctx: TaskContext) -> int:
        assert worker is not None
        if ctx.generation == 1:
            # Return as soon as the watchdog has taken the attempt from this thread.
            wait_for("the attempt to be ended", lambda: not any(
                a.claim.task_id == ctx.task_id for a in worker._attempts.running()), 20,
                interval_s=0.001)
        return ctx.generation

    handle = app.submit("t.back")
    worker = _SlowWatchdog(app, concurrency=1, poll_interval_s=0.01, max_stuck_threads=1,
                           shutdown_grace_s=1.0)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        info = handle.wait(30)
        assert info.state is State.SUCCEEDED and info.result == 2, info
        assert worker.gauge_seen == [0], worker.gauge_seen
        assert worker.stats.stuck_threads == 0 and worker.stats.time_limited == 1
        wait_for("no detached task thread", lambda: worker._executor.detached() == 0, 10)
        assert worker.stop_reason is None  # the thread came back: nothing is stuck
    finally:
        worker.stop()
        runner.join(15)


def test_the_shutdown_grace_hands_back_a_stuck_task(
    app: App, release: threading.Event
) -> None:
    """In process: stop() with a body that never reaches a boundary; run() returns when
    the grace ends, the task is PENDING again with its attempt handed back."""
    started = threading.Event()

    @app.task(name="t.stuck")
    def stuck(ctx: TaskContext) -> None:
        ctx.step("one", lambda: 1)
        started.set()
        release.wait(60)

    handle = app.submit("t.stuck")
    worker = Worker(app, concurrency=1, poll_interval_s=0.01, shutdown_grace_s=1.0)
    done = threading.Event()
    threading.Thread(target=lambda: (worker.run(), done.set()), daemon=True).start()
    assert started.wait(20)
    worker.stop()
    assert done.wait(15), "run() did not return after the shutdown grace"
    info = handle.get()
    assert info.state is State.PENDING and info.attempt == 0 and info.holder is None
    assert worker.stats.handed_back == 1 and worker.exit_code == EXIT_HANDED_BACK
    [back] = [e for e in events(app, handle.task_id, "transition") if e.to_state == "PENDING"]
    assert back.detail["reason"] == "shutdown grace of 1 s ended"


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "5"])
def test_time_limit_s_is_checked_at_definition(app: App, bad: Any) -> None:
    with pytest.raises(ConfigError, match="time_limit_s"):
        app.task(name="t.bad", time_limit_s=bad)


@pytest.mark.parametrize(("option", "bad"), [
    ("shutdown_grace_s", -1), ("shutdown_grace_s", float("nan")), ("shutdown_grace_s", True),
    ("max_stuck_threads", 0), ("max_stuck_threads", 1.5),
])
def test_worker_limits_are_checked(app: App, option: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=option):
        Worker(app, **{option: bad})


class _Attempts(Middleware):
    """Counts after_attempt per claim (task id, generation): each attempt ends once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ends: dict[tuple[str, int], list[str]] = {}
        self.errors: list[BaseException | None] = []

    def after_attempt(self, worker: Worker, claim: Claim, outcome: str,
                      exception: BaseException | None) -> None:
        with self.lock:
            self.ends.setdefault((claim.task_id, claim.generation), []).append(outcome)
            if outcome == "RETRY_WAIT":
                self.errors.append(exception)


def test_bodies_ending_right_at_their_limit_end_each_attempt_once(
    app: App, ledger_url: str
) -> None:
    """Race the watchdog: first attempts end within a few milliseconds of their limit,
    either way. Each attempt is reported once, every task succeeds, no stuck thread is left
    and the worker's slots all come back."""
    limit = 0.2

    @app.task(name="t.close_call", retry=FAST, time_limit_s=limit)
    def close_call(ctx: TaskContext, n: int) -> int:
        if ctx.attempt == 1:
            threading.Event().wait(limit + (n % 7 - 3) * 0.004)  # 12 ms either side
            ctx.step("after", lambda: n)
        return n

    n = 40
    handles = [app.submit("t.close_call", {"n": i}) for i in range(n)]
    counter = _Attempts()
    with running_worker(app, concurrency=4, middleware=[counter]) as worker:
        infos = [app.wait(h.task_id, timeout_s=60) for h in handles]
        wait_for("stuck threads to come back", lambda: worker.stats.stuck_threads == 0)
        wait_for("every slot to be free", lambda: worker._inflight == 0)
    assert [i.state for i in infos] == [State.SUCCEEDED] * n
    assert sorted(i.result for i in infos) == list(range(n))
    assert all(len(ends) == 1 for ends in counter.ends.values()), counter.ends
    limited = worker.stats.time_limited
    assert limited == sum(1 for i in infos if i.attempt == 2) == len(counter.errors)
    assert all(isinstance(e, TimeLimitExceeded) for e in counter.errors)
    assert worker.stats.succeeded == n
    check_ledger_consistent(ledger_url, task_ids=[h.task_id for h in handles])
