"""What the operator faces show of periodic schedules, on both ledgers: ``ratchet
schedules`` (table, ``--json``, ``--app`` marking a schedule the code lacks), the ledger
metrics per schedule, ``GET /api/schedules``, a worker's scheduler thread (on by default, off with
``scheduler=False``) and the claim of a worker that lacks the task."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from ratchet import App, Control, State, TaskContext
from ratchet.cli.main import cli
from ratchet.observe.ledger_metrics import render_ledger_metrics
from ratchet.testing import inject_clock, running_worker, wait_for
from ratchet.web import WebSettings, create_app
from ratchet.worker.scheduler import Scheduler

T0 = datetime(2026, 12, 4, 13, 0, 0, tzinfo=UTC).timestamp()


def _cli(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def make_app(url: str, name: str = "hourly", every_s: int = 3600) -> App:
    app = App(url)

    @app.periodic(name, every_s=every_s, misfire_grace_s=30)
    @app.task("faces.report")
    def report(ctx: TaskContext) -> str:
        return "ok"

    return app


@pytest.fixture
def fired_app(ledger_url: str) -> Iterator[App]:
    """A schedule fired once at 13:00 and missing ten hours (ticks 14:00 .. 23:00 missed,
    fired at 00:00)."""
    app = make_app(ledger_url)
    clock = inject_clock(app.ledger)
    now = [T0 - 1]
    clock.freeze(now[0])
    s = Scheduler(app.ledger, app.periodic_tasks, "w1", clock=lambda: now[0])
    s.register()
    for at in (T0 + 1, T0 + 11 * 3600 + 1):
        now[0] = at
        clock.freeze(at)
        s.run_once()
    yield app
    app.close()


def test_ratchet_schedules_shows_next_last_and_missed_ticks(
    fired_app: App, ledger_url: str
) -> None:
    shown = _cli("schedules", "--ledger", ledger_url)
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert "hourly" in out and "faces.report" in out and "every 3600s" in out
    assert "2026-12-05 00:00:00Z" in out  # last fired
    assert "2026-12-05 01:00:00Z" in out  # next tick
    assert "10 tick(s)" in out and "misfire_grace_s=30" in out
    as_json = _cli("schedules", "--ledger", ledger_url, "--json")
    assert as_json.exit_code == 0, as_json.output
    (row,) = json.loads(as_json.stdout)
    assert row["name"] == "hourly" and row["fired"] == 2 and row["missed"] == 10
    assert row["last_missed_at"] == T0 + 10 * 3600
    assert row["next_tick_at"] == T0 + 12 * 3600
    assert row["in_code"] is None


def test_ratchet_schedules_with_an_app_marks_a_schedule_the_code_lacks(
    fired_app: App, ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "other_sched_app.py").write_text(textwrap.dedent('''
        import ratchet

        app = ratchet.App()


        @app.periodic("daily", cron="0 6 * * *", tz="Europe/Berlin")
        @app.task(name="faces.daily")
        def daily(ctx):
            return None
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    shown = _cli("schedules", "--ledger", ledger_url, "--app", "other_sched_app:app")
    assert shown.exit_code == 0, shown.output
    assert "not in this code" in shown.stdout
    sys.modules.pop("other_sched_app", None)


def test_ledger_metrics_count_fired_and_missed_ticks_per_schedule(fired_app: App) -> None:
    with Control(app=fired_app) as control:
        body, _ = render_ledger_metrics(control)
    text = body.decode()
    assert 'ratchet_ledger_schedule_fired_total{schedule="hourly"} 2.0' in text
    assert 'ratchet_ledger_schedule_missed_total{schedule="hourly"} 10.0' in text
    assert 'ratchet_ledger_schedule_stale{schedule="hourly"}' in text


def test_a_worker_runs_the_scheduler_by_default_and_not_when_told(ledger_url: str) -> None:
    app = make_app(ledger_url, name="fast", every_s=1)
    try:
        with running_worker(app, poll_interval_s=0.02, scheduler=False) as w:
            assert not w.run_scheduler
        assert w.scheduler is None
        assert app.list_tasks().tasks == []
        with running_worker(app, poll_interval_s=0.02) as w:
            wait_for("the worker's scheduler thread", lambda: w.scheduler, timeout_s=20)

            def succeeded() -> bool:
                return any(t.state is State.SUCCEEDED for t in app.list_tasks().tasks)

            wait_for("a tick's task to run", succeeded, timeout_s=20)
        task = app.list_tasks().tasks[0]
        assert task.idempotency_key is not None
        assert task.idempotency_key.startswith("periodic:fast:")
    finally:
        app.close()


def test_a_worker_without_the_task_never_claims_its_ticks(ledger_url: str) -> None:
    """A rolling deploy: a worker whose code lacks the periodic task's definition runs
    (other tasks), the tick's task waits for a worker that has it."""
    app = make_app(ledger_url, name="fast", every_s=1)
    clock = inject_clock(app.ledger)
    s = Scheduler(app.ledger, app.periodic_tasks, "w1", clock=lambda: T0 + 1)
    clock.freeze(T0 - 1)
    s.register()
    clock.freeze(T0 + 1)
    s.run_once(T0 + 1)
    clock.thaw()
    old = App(ledger_url)

    @old.task("faces.other")
    def other(ctx: TaskContext) -> str:
        return "other"

    try:
        handle = old.submit("faces.other", {})
        with running_worker(old, poll_interval_s=0.02):
            assert old.wait(handle.task_id, 20).state is State.SUCCEEDED
        ticks = [t for t in app.list_tasks().tasks if t.name == "faces.report"]
        assert len(ticks) == 2  # T0 and T0 + 1
        assert all(t.state is State.PENDING and t.attempt == 0 for t in ticks)
    finally:
        old.close()
        app.close()


def test_get_api_schedules_lists_them(fired_app: App, ledger_url: str) -> None:
    settings = WebSettings(ledger_url=ledger_url)
    asgi = create_app(settings, control=Control(ledger_url))

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/api/schedules")

    answer = asyncio.run(get())
    assert answer.status_code == 200, answer.text
    (row,) = answer.json()
    assert row["name"] == "hourly" and row["missed"] == 10 and row["fired"] == 2
    assert row["last_missed_reason"].startswith("10 tick(s)")


def test_a_starting_worker_logs_the_schedules_its_code_lacks(
    fired_app: App, ledger_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    plain = App(ledger_url)

    @plain.task("faces.plain")
    def plain_task(ctx: TaskContext) -> None:
        return None

    try:
        with caplog.at_level("WARNING", logger="ratchet.worker"), \
                running_worker(plain, poll_interval_s=0.02):
            wait_for("the start-up warning", lambda: any(
                "lacks" in r.getMessage() for r in caplog.records), timeout_s=20)
        (line,) = [r.getMessage() for r in caplog.records if "lacks" in r.getMessage()]
        assert line.endswith(": hourly")
    finally:
        plain.close()
