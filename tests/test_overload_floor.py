"""The 5 s floor of an overload retry (``RetryPolicy.overload_min_delay_s``) can be
overridden for a test run: ``running_worker(app, overload_floor_s=...)`` (a ``Worker``
option) retries an overloaded task's default policy at once, on both ledgers; without it
the policy's own floor holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from ratchet import App, ConfigError, OverloadError, State, TaskContext, Worker
from ratchet.retry import FailureClass, RetryPolicy
from ratchet.testing import running_worker, wait_for

NAME = "floor.flaky"


@pytest.fixture
def flaky(ledger_url: str) -> Iterator[tuple[App, list[float]]]:
    """A task with the default retry policy whose first call is overloaded (a 503)."""
    app = App(ledger_url)
    calls: list[float] = []
    lock = threading.Lock()

    @app.task(name=NAME)
    def call(ctx: TaskContext) -> int:
        with lock:
            calls.append(time.monotonic())
            first = len(calls) == 1
        if first:
            raise OverloadError("503 from the fake")
        return 1

    yield app, calls
    app.close()


def test_the_override_retries_an_overload_at_once(flaky: tuple[App, list[float]]) -> None:
    app, calls = flaky
    assert app.definition(NAME).retry.overload_min_delay_s == 5.0  # the default policy
    handle = app.submit(NAME, {})
    with running_worker(app, overload_floor_s=0.01):
        assert app.wait(handle.task_id, timeout_s=30).state is State.SUCCEEDED
    assert len(calls) == 2
    # The retry waited far less than the policy's 5 s floor (base delay 1 s, jittered).
    assert calls[1] - calls[0] < 4.0, calls


def test_without_it_the_policys_floor_holds(flaky: tuple[App, list[float]]) -> None:
    app, calls = flaky
    handle = app.submit(NAME, {})
    with running_worker(app):
        info = wait_for("the overloaded task to back off", lambda: (
            t if (t := app.get(handle.task_id)).state is State.RETRY_WAIT else None),
            timeout_s=30)
        assert info.run_at - info.updated_at >= 5.0 - 1e-3, info
    assert len(calls) == 1


def test_the_floor_arithmetic_and_its_checks(ledger_url: str) -> None:
    policy = RetryPolicy(jitter=0.0)
    assert policy.backoff_s(1, FailureClass.OVERLOAD) == 5.0
    assert policy.backoff_s(1, FailureClass.OVERLOAD, overload_floor_s=0.0) == 1.0
    assert policy.backoff_s(1, FailureClass.OVERLOAD, hint_s=3.0, overload_floor_s=0.0) == 3.0
    assert policy.backoff_s(1, FailureClass.TRANSIENT, overload_floor_s=9.0) == 1.0
    app = App(ledger_url)
    try:
        for bad in (-1.0, float("nan"), float("inf"), True, "1"):
            with pytest.raises(ConfigError, match="overload_floor_s"):
                Worker(app, overload_floor_s=bad)  # type: ignore[arg-type]
    finally:
        app.close()
