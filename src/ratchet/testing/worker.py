"""An in-process worker for your own pytest suite: a real :class:`~ratchet.Worker` on a
thread of the test process, against a real ledger, stopped cleanly at the end.

In a test::

    from ratchet.testing.worker import running_worker

    def test_charge(app):
        handle = app.submit("billing.charge", {"order_id": "o-1"})
        with running_worker(app, concurrency=4):
            info = app.wait(handle.task_id, timeout_s=10)
        assert info.state is State.SUCCEEDED

Or as a fixture, in your ``conftest.py`` (``app`` being your own fixture that yields an
:class:`~ratchet.App`)::

    from ratchet.testing.worker import worker_fixture

    ratchet_worker = worker_fixture("app", concurrency=4)

Leaving the block stops the worker the way SIGTERM does (no new claims; running tasks are
released at their next step boundary, or their leases handed back when the shutdown grace
ends: 5 s here unless ``shutdown_grace_s`` is given), joins its thread, and raises
:class:`WorkerCrashed` if the worker's thread raised or did not stop in time, so a broken
worker fails the test instead of passing silently. Wait for the states you expect
(``app.wait``) *inside* the block. Register the tasks before the worker starts (as an
import does): a worker claims the task names registered when it was created.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..app import App
from ..errors import RatchetError
from ..worker.runner import Worker

__all__ = ["WorkerCrashed", "running_worker", "worker_fixture"]


class WorkerCrashed(RatchetError, AssertionError):
    """The in-process worker's thread raised, or did not stop within the timeout.

    An ``AssertionError`` too, so pytest reports it as a failed expectation. The worker's
    own exception, if any, is the ``__cause__``.
    """


@contextmanager
def running_worker(
    app: App,
    *,
    concurrency: int = 4,
    poll_interval_s: float = 0.01,
    stop_timeout_s: float = 15.0,
    overload_floor_s: float | None = None,
    **options: Any,
) -> Iterator[Worker]:
    """Run a :class:`~ratchet.Worker` for ``app`` on a thread for the duration of the block.

    Args:
        app: the application whose tasks the worker runs (and whose ledger it uses).
        concurrency: task threads (>= 1).
        poll_interval_s: seconds between claim polls when idle (short: tests wait less).
        stop_timeout_s: seconds to wait, on leaving the block, for the worker to stop.
        overload_floor_s: the floor of the retry delay after an overload failure, seconds,
            in place of every task's ``RetryPolicy.overload_min_delay_s`` (5 s by default),
            so a test against a flaky fake (503 bursts) does not wait 5 s per retry; None
            (the default): the policies' own floors, as in production.
        **options: any other :class:`~ratchet.Worker` argument (``names``,
            ``middleware``, ``fast_takeover``, ``holder``, ...); ``shutdown_grace_s``
            defaults to ``min(5, stop_timeout_s / 2)`` seconds here, so that a body stuck
            in task code is handed back before the stop times out.

    Yields:
        The running worker (``worker.stats`` holds its counters).

    Raises:
        WorkerCrashed: on leaving the block, if the worker thread raised (its exception is
            the cause) or was still running after ``stop_timeout_s``.
        ConfigError, UnknownTask: the worker's arguments are invalid (raised at once).
    """
    options.setdefault("shutdown_grace_s", min(5.0, stop_timeout_s / 2))
    worker = Worker(app, concurrency=concurrency, poll_interval_s=poll_interval_s,
                    overload_floor_s=overload_floor_s, **options)
    failures: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # reported to the test when the block ends
            failures.append(exc)

    thread = threading.Thread(target=target, name="ratchet-test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(stop_timeout_s)
        if thread.is_alive():
            raise WorkerCrashed(
                f"the in-process worker {worker.holder} did not stop within {stop_timeout_s} s "
                "(a task body that never reaches a step boundary or returns?)"
            )
        if failures:
            raise WorkerCrashed(
                f"the in-process worker {worker.holder} crashed: {failures[0]!r}"
            ) from failures[0]


def worker_fixture(app_fixture: str = "app", **options: Any) -> Callable[..., Any]:
    """A pytest fixture that runs an in-process worker for the app fixture named
    ``app_fixture``, for one test.

    Assign it to a name in a ``conftest.py`` or test module; that name becomes the fixture
    (it yields the running :class:`~ratchet.Worker`)::

        ratchet_worker = worker_fixture("app", concurrency=4)

    Args:
        app_fixture: name of the fixture that provides the :class:`~ratchet.App`.
        **options: passed to :func:`running_worker` (``concurrency``, ``middleware``, ...).

    Returns:
        The fixture function (function scope). pytest is imported only when this is
        called, so ``ratchet.testing`` imports without it.
    """
    import pytest

    @pytest.fixture
    def _running_worker(request: pytest.FixtureRequest) -> Iterator[Worker]:
        app = request.getfixturevalue(app_fixture)
        with running_worker(app, **options) as worker:
            yield worker

    return _running_worker
