"""Every way a task body can end ends the attempt with a recorded outcome.

A task that calls ``sys.exit()`` (argparse does on bad arguments), raises
``KeyboardInterrupt``, ``GeneratorExit`` or its own ``BaseException`` must not stay
RUNNING with its lease renewed forever: the attempt ends, the lease is released, the slot
is freed, and the next task runs on the same worker. Both ledgers, a real worker on a
thread of this process.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable

import pytest

from ratchet import App, State, TaskContext
from ratchet.testing import fast_retry_policy
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(60)

FAST = fast_retry_policy(max_delay_s=0.05)


class CustomBase(BaseException):
    """A BaseException the worker knows nothing about."""


def argparse_exit() -> None:
    parser = argparse.ArgumentParser(prog="task", exit_on_error=True)
    parser.add_argument("--count", type=int, required=True)
    parser.parse_args(["--count", "many"])  # prints usage, raises SystemExit(2)


def raise_(exc: BaseException) -> Callable[[], None]:
    def body() -> None:
        raise exc

    return body


CASES = [
    # (body, final state, error_class, attempts, text in the recorded error)
    pytest.param(argparse_exit, State.FAILED, "system_exit", 1, "SystemExit", id="argparse"),
    pytest.param(raise_(SystemExit(3)), State.FAILED, "system_exit", 1, "SystemExit: 3",
                 id="sys.exit"),
    pytest.param(raise_(KeyboardInterrupt()), State.FAILED, "keyboard_interrupt", 1,
                 "KeyboardInterrupt", id="KeyboardInterrupt"),
    pytest.param(raise_(GeneratorExit()), State.FAILED, "transient", 3, "GeneratorExit",
                 id="GeneratorExit"),
    pytest.param(raise_(CustomBase("custom stop")), State.FAILED, "transient", 3,
                 "CustomBase: custom stop", id="custom"),
]


@pytest.mark.parametrize(("body", "state", "error_class", "attempts", "text"), CASES)
def test_base_exception_ends_the_attempt_and_the_worker_goes_on(
    app: App, body: Callable[[], None], state: State, error_class: str, attempts: int,
    text: str,
) -> None:
    runs: list[int] = []
    after: list[str] = []

    @app.task(name="t.ends", retry=FAST)
    def ends(ctx: TaskContext) -> None:
        runs.append(ctx.attempt)
        ctx.step("before", lambda: 1)
        body()

    @app.task(name="t.next")
    def next_task(ctx: TaskContext) -> str:
        after.append(ctx.holder)
        return "ran"

    bad = app.submit("t.ends")
    with running_worker(app, concurrency=1) as worker:
        info = app.wait(bad.task_id, timeout_s=20)
        # Submitted only now: it can run only if the single slot was freed.
        good = app.submit("t.next")
        good_info = app.wait(good.task_id, timeout_s=20)
    assert info.state is state
    assert info.error_class == error_class
    assert text in (info.last_error or "")
    assert info.attempt == attempts and runs == list(range(1, attempts + 1))
    assert info.holder is None and info.lease_until is None  # the lease was released
    assert good_info.state is State.SUCCEEDED and good_info.result == "ran"
    assert after == [worker.holder]
    assert worker.stats.failed == 1 and worker.stats.succeeded == 1
    assert worker.stats.by_outcome.get("abandoned", 0) == 0


def test_base_exception_after_an_effect_intent_is_unknown_not_failed(app: App) -> None:
    """SystemExit inside the effect's call: the call may have happened, so the task is
    parked as UNKNOWN (never dead-lettered as if nothing happened)."""

    @app.task(name="t.exit_in_call", retry=FAST)
    def exit_in_call(ctx: TaskContext) -> None:
        ctx.effect("charge", lambda key: raise_(SystemExit(1))(), key="charge:x")

    handle = app.submit("t.exit_in_call")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert info.state is State.UNKNOWN
    assert info.error_class == "system_exit"
    assert "SystemExit" in (info.last_error or "")


def test_shutdown_still_releases_at_the_next_step(app: App) -> None:
    """The worker's own Shutdown (a BaseException) keeps its meaning: release to PENDING
    with the attempt handed back, not a failure."""
    in_body, go = threading.Event(), threading.Event()

    @app.task(name="t.slow")
    def slow(ctx: TaskContext) -> str:
        ctx.step("one", lambda: 1)
        in_body.set()
        assert go.wait(10)
        ctx.step("two", lambda: 2)
        return "done"

    handle = app.submit("t.slow")
    with running_worker(app, concurrency=1) as worker:
        assert in_body.wait(10)
        worker.stop()
        go.set()
    info = handle.get()
    assert info.state is State.PENDING
    assert info.attempt == 0 and info.error_class is None
    assert worker.stats.released == 1
