"""Odd inputs at a worker's edges, each on both ledgers with a real worker:
an error message holding NUL, a ``LedgerUnavailable`` raised by the task's own code, an
unstorable worker holder, a nonsensical ``in_flight_s``; and ``ratchet inspect`` of a task
whose recorded error is only white space."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ratchet import App, RetryPolicy, State, TaskContext, Worker
from ratchet.cli.main import cli
from ratchet.errors import InvalidArguments
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)

FAST = RetryPolicy(max_attempts=2, base_delay_s=0.02, max_delay_s=0.05, jitter=0.0)


def test_an_error_message_with_nul_is_recorded_and_retried(app: App) -> None:
    """PostgreSQL text cannot hold NUL: the message is stored escaped, the failure stays
    transient (it used to become a refused write, ending the task with the error lost)."""

    @app.task(name="edge.nul", retry=FAST)
    def nul(ctx: TaskContext) -> None:
        raise RuntimeError("bad\x00msg")

    handle = app.submit("edge.nul")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED and info.attempt == 2
    assert info.error_class == "transient"
    assert info.last_error is not None and "bad\\x00msg" in info.last_error


def test_ledger_unavailable_from_the_task_code_spends_attempts(app: App, tmp_path: Path) -> None:
    """Only the worker's own ledger being down hands an attempt back; a task that talks to
    another, unreachable ledger fails like any other transient failure and ends."""
    other = App(f"sqlite:///{tmp_path}/missing-dir/other.db")  # its directory does not exist
    other.task(name="other.noop")(lambda ctx: None)

    @app.task(name="edge.nested", retry=FAST)
    def nested(ctx: TaskContext) -> None:
        other.submit("other.noop")

    handle = app.submit("edge.nested")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED and info.attempt == 2
    assert info.last_error is not None and "LedgerUnavailable" in info.last_error


@pytest.mark.parametrize("holder", ["a\x00b", "bad\ud800", "x" * 201, ""])
def test_an_unstorable_worker_holder_is_refused(app: App, holder: str) -> None:
    @app.task(name="edge.noop")
    def noop(ctx: TaskContext) -> None:
        return None

    with pytest.raises(InvalidArguments, match="worker holder"):
        Worker(app, holder=holder)


@pytest.mark.parametrize("in_flight_s", [float("nan"), -1.0, float("inf"), "5", True])
def test_a_nonsensical_in_flight_s_fails_the_task_permanently(
    app: App, in_flight_s: object
) -> None:
    calls: list[str] = []

    @app.task(name="edge.inflight", retry=FAST)
    def inflight(ctx: TaskContext) -> None:
        ctx.effect("pay", lambda key: calls.append(key), key="k-1",
                   in_flight_s=in_flight_s)  # type: ignore[arg-type]

    handle = app.submit("edge.inflight")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=30)
    assert info.state is State.FAILED and info.attempt == 1
    assert info.last_error is not None and "in_flight_s" in info.last_error
    assert calls == []  # refused before any intent or call


@pytest.mark.parametrize("stored", [" ", "\n\n", "line1\rOVERWRITTEN"])
def test_inspect_shows_any_recorded_error(tmp_path: Path, stored: str) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    app = App(url)
    app.task(name="edge.noop")(lambda ctx: None)
    handle = app.submit("edge.noop")
    app.close()
    conn = sqlite3.connect(tmp_path / "l.db")
    conn.execute("UPDATE tasks SET last_error = ? WHERE id = ?", (stored, handle.task_id))
    conn.commit()
    conn.close()
    result = CliRunner().invoke(cli, ["inspect", handle.task_id, "--ledger", url])
    assert result.exit_code == 0, result.output
    assert "last error:" in result.output
    if "\r" in stored:
        assert "line1" in result.output and "OVERWRITTEN" in result.output


