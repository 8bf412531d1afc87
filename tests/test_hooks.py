"""Worker lifecycle hooks (ratchet.Middleware): what a middleware sees, in which order, and
that a middleware that raises changes nothing. Real worker in this process, both ledgers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ratchet import App, RetryPolicy, State, TaskContext, TransientError
from ratchet.ledger.base import Claim
from ratchet.testing import fast_retry_policy
from ratchet.testing.worker import running_worker
from ratchet.worker import Worker
from ratchet.worker.hooks import EffectSettlement, Middleware

pytestmark = pytest.mark.timeout(60)

FAST = fast_retry_policy()


class Recorder(Middleware):
    """Records every hook call with the thread it ran on."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.threads: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def _add(self, *event: Any) -> None:
        with self._lock:
            self.events.append(event)
            self.threads.setdefault(event[0], set()).add(threading.current_thread().name)

    def worker_start(self, worker: Worker) -> None:
        self._add("worker_start")

    def worker_stop(self, worker: Worker) -> None:
        self._add("worker_stop")

    def before_claim(self, worker: Worker, limit: int) -> None:
        assert limit > 0
        self._add("before_claim")

    def after_claim(self, worker: Worker, claims: list[Claim]) -> None:
        if claims:
            self._add("after_claim", *[c.task_id for c in claims])

    def before_attempt(self, worker: Worker, claim: Claim) -> None:
        self._add("before_attempt", claim.task_id, claim.attempt)

    def after_attempt(
        self, worker: Worker, claim: Claim, outcome: str, exception: BaseException | None
    ) -> None:
        self._add("after_attempt", claim.task_id, outcome, type(exception).__name__)

    def before_step(self, ctx: TaskContext, name: str) -> None:
        self._add("before_step", name)

    def after_step(
        self, ctx: TaskContext, name: str, cached: bool, duration_s: float,
        exception: BaseException | None,
    ) -> None:
        assert duration_s >= 0
        self._add("after_step", name, cached, exception)

    def before_effect(self, ctx: TaskContext, name: str, key: str) -> None:
        self._add("before_effect", name, key)

    def after_effect(
        self, ctx: TaskContext, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        assert duration_s >= 0
        self._add("after_effect", name, key, settled, exception)

    def before_commit(self, worker: Worker, batch_size: int) -> None:
        self._add("before_commit", batch_size)

    def after_commit(
        self, worker: Worker, batch_size: int, duration_s: float, error: BaseException | None
    ) -> None:
        assert duration_s >= 0
        self._add("after_commit", batch_size, error)


TASK_EVENTS = {"before_attempt", "after_attempt", "before_step", "after_step",
               "before_effect", "after_effect"}


def test_recording_middleware_sees_the_whole_lifecycle(app: App) -> None:
    charges: list[str] = []

    @app.task(name="t.hooked", retry=FAST)
    def hooked(ctx: TaskContext, order: str) -> str:
        amount = ctx.step("quote", lambda: 42)
        charge = ctx.effect("charge", lambda key: charges.append(key) or f"ch-{amount}",
                            key=f"charge:{order}")
        if ctx.attempt == 1:
            raise TransientError("mail server down after charging")
        return str(charge)

    recorder = Recorder()
    handle = app.submit("t.hooked", {"order": "o-1"})
    with running_worker(app, concurrency=2, middleware=[recorder]) as worker:
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.SUCCEEDED, info.last_error
    assert charges == ["charge:o-1"]
    tid = handle.task_id
    events = recorder.events
    assert events[0] == ("worker_start",)
    assert events[-1] == ("worker_stop",)
    task_events = [e for e in events if e[0] in TASK_EVENTS]
    assert task_events == [
        ("before_attempt", tid, 1),
        ("before_step", "quote"),
        ("after_step", "quote", False, None),
        ("before_effect", "charge", "charge:o-1"),
        ("after_effect", "charge", "charge:o-1", "call", None),
        ("after_attempt", tid, "RETRY_WAIT", "TransientError"),
        ("before_attempt", tid, 2),
        ("before_step", "quote"),
        ("after_step", "quote", True, None),  # replayed from the ledger
        ("before_effect", "charge", "charge:o-1"),
        ("after_effect", "charge", "charge:o-1", "cached", None),  # done: not called again
        ("after_attempt", tid, "SUCCEEDED", "NoneType"),
    ]
    # Each attempt is claimed (after_claim) before it runs, after a before_claim.
    for attempt in (1, 2):
        start = events.index(("before_attempt", tid, attempt))
        claims = [i for i, e in enumerate(events[:start]) if e[0] == "after_claim" and tid in e]
        assert len(claims) == attempt
        assert any(e[0] == "before_claim" for e in events[: claims[-1]])
    # Every commit is reported twice (before, after) and none failed. At least: the
    # intent, the effect's result, two final writes.
    before = [e for e in events if e[0] == "before_commit"]
    after = [e for e in events if e[0] == "after_commit"]
    assert len(before) == len(after) >= 4
    assert all(e[2] is None for e in after)
    assert sum(e[1] for e in after) >= 4
    # The documented threads: task hooks on task threads, claims and commits on the writer.
    for hook in ("before_attempt", "before_step", "after_step", "after_effect"):
        assert all(t.startswith("ratchet-task") for t in recorder.threads[hook]), hook
    assert recorder.threads["before_commit"] == {"ratchet-writer"}
    assert recorder.threads["after_claim"] == {"ratchet-writer"}
    assert recorder.threads["after_attempt"] == {"ratchet-writer"}
    assert recorder.threads["worker_start"] == {"ratchet-test-worker"}
    assert worker.stats.succeeded == 1 and worker.stats.retried == 1


class PluginExit(BaseException):
    """A plugin's own BaseException (not an Exception)."""


class Exploding(Middleware):
    """Raises from every hook (``error``: the exception class to raise)."""

    def __init__(self, error: type[BaseException] = RuntimeError) -> None:
        self.calls = 0
        self.error = error

    def __getattribute__(self, name: str) -> Any:
        if name in Middleware.__dict__ and not name.startswith("_"):
            def explode(*args: Any, **kwargs: Any) -> None:
                object.__setattr__(self, "calls", object.__getattribute__(self, "calls") + 1)
                raise object.__getattribute__(self, "error")(f"middleware bug in {name}")
            return explode
        return object.__getattribute__(self, name)


@pytest.mark.parametrize("error", [RuntimeError, SystemExit, PluginExit])
def test_a_raising_middleware_changes_nothing(
    app: App, caplog: pytest.LogCaptureFixture, error: type[BaseException]
) -> None:
    runs: list[int] = []

    @app.task(name="t.fine", retry=FAST)
    def fine(ctx: TaskContext, i: int) -> int:
        value = int(ctx.step("double", lambda: 2 * i))
        ctx.effect("note", lambda key: key, key=f"note:{i}")
        runs.append(i)
        return value

    @app.task(name="t.failing", retry=RetryPolicy(max_attempts=1))
    def failing(ctx: TaskContext) -> None:
        raise ValueError("bad input")

    exploding, recorder = Exploding(error), Recorder()
    handles = [app.submit("t.fine", {"i": i}) for i in range(5)]
    bad = app.submit("t.failing")
    with running_worker(app, concurrency=3, middleware=[exploding, recorder]) as worker:
        infos = [app.wait(h.task_id, timeout_s=20) for h in handles]
        bad_info = app.wait(bad.task_id, timeout_s=20)
    assert [i.state for i in infos] == [State.SUCCEEDED] * 5
    assert [i.result for i in infos] == [0, 2, 4, 6, 8]
    assert sorted(runs) == [0, 1, 2, 3, 4]
    assert all(i.attempt == 1 for i in infos)
    assert bad_info.state is State.FAILED and bad_info.error_class == "permanent"
    assert "bad input" in (bad_info.last_error or "")
    assert worker.stats.succeeded == 5 and worker.stats.failed == 1
    # The middleware after the broken one still saw everything.
    assert [e[2] for e in recorder.events if e[0] == "after_attempt"].count("SUCCEEDED") == 5
    assert exploding.calls > 0
    assert "middleware Exploding.before_attempt failed" in caplog.text


def test_no_middleware_means_no_dispatcher(app: App) -> None:
    """With no middleware the worker keeps no hook dispatcher at all (zero cost)."""
    worker = Worker(app)
    assert worker.middleware == ()
    assert worker.writer.hooks is None
