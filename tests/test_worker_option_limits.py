"""Upper bounds of the worker's numeric options: ``Worker(...)`` raises ``ConfigError``
and ``ratchet worker`` exits with a usage error (status 2), each naming the option and the
limit, instead of accepting e.g. ``--prefetch 99999999`` (a worker holding a hundred million
leases hidden from every other worker)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, TaskContext, Worker
from ratchet.cli.main import cli
from ratchet.errors import ConfigError
from ratchet.worker.runner import (
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
)


@pytest.fixture
def noop_app(app: App) -> App:
    @app.task(name="t.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    return app


@pytest.mark.parametrize(("option", "bad", "limit"), [
    ("concurrency", MAX_CONCURRENCY + 1, str(MAX_CONCURRENCY)),
    ("concurrency", 0, str(MAX_CONCURRENCY)),
    ("concurrency", 2.5, str(MAX_CONCURRENCY)),
    ("async_concurrency", MAX_ASYNC_CONCURRENCY + 1, str(MAX_ASYNC_CONCURRENCY)),
    ("async_concurrency", 0, str(MAX_ASYNC_CONCURRENCY)),
    ("prefetch", 99_999_999, str(MAX_PREFETCH)),
    ("prefetch", -1, str(MAX_PREFETCH)),
    ("writers", MAX_WRITERS + 1, str(MAX_WRITERS)),
    ("max_stuck_threads", MAX_STUCK_THREADS + 1, str(MAX_STUCK_THREADS)),
    ("poll_interval_s", MAX_POLL_INTERVAL_S * 2, f"{MAX_POLL_INTERVAL_S:g}"),
    ("poll_interval_s", 0, f"{MAX_POLL_INTERVAL_S:g}"),
    ("poll_interval_s", float("nan"), f"{MAX_POLL_INTERVAL_S:g}"),
])
def test_worker_refuses_values_past_the_limits(
    noop_app: App, option: str, bad: Any, limit: str
) -> None:
    with pytest.raises(ConfigError, match=option) as caught:
        Worker(noop_app, **{option: bad})
    assert limit in str(caught.value)


def test_the_limits_themselves_are_accepted(noop_app: App) -> None:
    w = Worker(noop_app, concurrency=MAX_CONCURRENCY, prefetch=MAX_PREFETCH,
               async_concurrency=MAX_ASYNC_CONCURRENCY,
               writers=MAX_WRITERS, max_stuck_threads=MAX_STUCK_THREADS,
               poll_interval_s=MAX_POLL_INTERVAL_S)
    assert (w.concurrency, w.prefetch, w.writers) == (MAX_CONCURRENCY, MAX_PREFETCH, MAX_WRITERS)


@pytest.mark.parametrize(("flag", "value", "limit"), [
    ("--prefetch", "99999999", MAX_PREFETCH),
    ("--concurrency", str(MAX_CONCURRENCY + 1), MAX_CONCURRENCY),
    ("--writers", "1000", MAX_WRITERS),
    ("--max-stuck-threads", str(MAX_STUCK_THREADS + 1), MAX_STUCK_THREADS),
    ("--poll-interval-s", "3600", MAX_POLL_INTERVAL_S),
])
def test_ratchet_worker_refuses_values_past_the_limits(
    flag: str, value: str, limit: float
) -> None:
    # The options are checked before the app is loaded: no app module is needed.
    result = CliRunner().invoke(cli, ["worker", "no.such.module:app", flag, value])
    assert result.exit_code == 2, result.output
    assert flag in result.output and f"{limit:g}" in result.output, result.output
