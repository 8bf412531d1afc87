"""ratchet.Control, the API the CLI (and later HTTP) calls, on both ledgers: read-only
calls never create or migrate a ledger, records are what ``--json`` prints, resolve is
validated and audited."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from ratchet import (
    App,
    ConfigError,
    Control,
    IllegalTransition,
    InvalidArguments,
    LedgerUnavailable,
    PayloadNotSerializable,
    State,
    StatusReport,
    TaskContext,
    TaskNotFound,
    TaskTimeline,
    WorkerView,
    open_ledger,
)
from ratchet.cli.main import cli
from ratchet.ledger.base import EffectState, EffectWrite, TaskWrite, Transition, WorkerInfo
from ratchet.serde import digest
from ratchet.testing import wait_for
from ratchet.worker.registry import host_identity, process_start_time


def make_app(url: str) -> App:
    app = App(url)

    @app.task(name="billing.charge")
    def charge(ctx: TaskContext, order_id: str) -> str:
        return order_id

    return app


def unknown_task(url: str, order_id: str = "o-1") -> str:
    """A task left UNKNOWN with an open effect intent, written through the real ledger the
    way a worker does (claim, intent, transition)."""
    app = make_app(url)
    handle = app.submit("billing.charge", {"order_id": order_id})
    app.close()
    ledger = open_ledger(url)
    try:
        [claim] = ledger.claim("w-test", ["billing.charge"], 1)
        intent = EffectWrite("charge", f"charge:{order_id}", digest("x"), EffectState.INTENT)
        [ok] = ledger.commit([TaskWrite(claim.task_id, claim.generation, "w-test", "effect",
                                        effects=[intent])])
        assert ok.ok
        [ok] = ledger.commit([TaskWrite(
            claim.task_id, claim.generation, "w-test", "unknown",
            transition=Transition(State.UNKNOWN, error="lookup inconclusive",
                                  error_class="unknown_outcome"),
        )])
        assert ok.ok
        assert ledger.get(handle.task_id).state is State.UNKNOWN
    finally:
        ledger.close()
    return handle.task_id


def test_read_only_calls_never_create_a_ledger(ledger_url: str, backend: str,
                                               tmp_path: Path) -> None:
    control = Control(ledger_url)
    for call in (control.status, control.workers, lambda: control.inspect("0" * 32)):
        with pytest.raises(LedgerUnavailable):
            call()
    control.close()
    if backend == "sqlite":
        assert list(tmp_path.iterdir()) == []
    # nothing was created: a ledger opened now is still at schema version 0
    with pytest.raises(LedgerUnavailable):
        Control(ledger_url).status()
    assert Control(ledger_url).migrate() >= 1


def test_status_counts_and_json_form(ledger_url: str) -> None:
    app = make_app(ledger_url)
    with Control(app=app) as control:
        a = control.submit("billing.charge", {"order_id": "o-1"}, idempotency_key="k1")
        again = control.submit("billing.charge", {"order_id": "o-1"}, idempotency_key="k1")
        control.submit("billing.charge", {"order_id": "o-2"}, delay_s=3600)
        assert again.task_id == a.task_id and not again.created
        report = control.status()
    app.close()
    assert isinstance(report, StatusReport)
    assert report.counts == {"billing.charge": {"PENDING": 2}}
    assert report.unknown == 0 and report.claims == 0
    assert report.durability == "fsync"
    assert report.schema_version >= 1
    assert report.backend in ("sqlite", "postgresql")
    # the CLI's --json is exactly the record
    result = CliRunner().invoke(cli, ["status", "--ledger", ledger_url, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert list(shown) == [f.name for f in dataclasses.fields(StatusReport)]
    assert shown["counts"] == report.counts


def test_inspect_returns_task_steps_effects_and_events(ledger_url: str) -> None:
    task_id = unknown_task(ledger_url)
    with Control(ledger_url) as control:
        view = control.inspect(task_id)
    assert isinstance(view, TaskTimeline)
    assert view.task.task_id == task_id and view.task.state is State.UNKNOWN
    assert view.task.params == {"order_id": "o-1"}
    assert [(e.name, e.key, e.state, e.result) for e in view.effects] == [
        ("charge", "charge:o-1", "intent", None)
    ]
    kinds = [e.kind for e in view.events]
    assert "claim" in kinds and "transition" in kinds
    result = CliRunner().invoke(cli, ["inspect", task_id, "--ledger", ledger_url, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert list(shown) == [f.name for f in dataclasses.fields(TaskTimeline)]
    assert shown["task"]["state"] == "UNKNOWN"
    assert shown["effects"][0]["key"] == "charge:o-1"


def test_resolve_done_records_the_result_and_the_operator(ledger_url: str) -> None:
    task_id = unknown_task(ledger_url)
    with Control(ledger_url) as control:
        info = control.resolve(task_id, "done", {"charge_id": "ch_1"},
                               reason="seen in the PSP dashboard", by="alice")
        assert info.state is State.PENDING
        view = control.inspect(task_id)
        assert control.status().operator_actions == 1
    [effect] = view.effects
    assert (effect.state, effect.result) == ("done", {"charge_id": "ch_1"})
    resolved = [e for e in view.events if e.detail.get("operator") == "alice"]
    assert resolved, view.events
    assert resolved[-1].detail["reason"] == "seen in the PSP dashboard"


def test_resolve_refusals(ledger_url: str) -> None:
    task_id = unknown_task(ledger_url)
    with Control(ledger_url) as control:
        with pytest.raises(InvalidArguments, match="'done', 'not-done' or 'give-up'"):
            control.resolve(task_id, "maybe", reason="r")
        with pytest.raises(InvalidArguments, match="reason"):
            control.resolve(task_id, "done", reason="   ")
        with pytest.raises(InvalidArguments, match="operator"):
            control.resolve(task_id, "done", reason="r", by="bad\ud800")
        with pytest.raises(PayloadNotSerializable):
            control.resolve(task_id, "done", {"when": object()}, reason="r")
        with pytest.raises(TaskNotFound):
            control.resolve("f" * 32, "done", reason="r")
        with pytest.raises(InvalidArguments, match="task id"):
            control.resolve("", "done", reason="r")
        assert control.inspect(task_id).task.state is State.UNKNOWN  # nothing changed
        control.resolve(task_id, "not-done", reason="not in the PSP", by="bob")
        with pytest.raises(IllegalTransition):
            control.resolve(task_id, "not-done", reason="twice", by="bob")


def test_cli_resolve(ledger_url: str) -> None:
    task_id = unknown_task(ledger_url)
    result = CliRunner().invoke(cli, [
        "resolve", task_id, "--outcome", "done", "--result", '{"charge_id": "ch_9"}',
        "--reason", "confirmed [by phone]", "--operator", "[carol]", "--ledger", ledger_url,
    ])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{task_id} resolved (done) by [carol] now PENDING"
    with Control(ledger_url) as control:
        assert control.inspect(task_id).effects[0].result == {"charge_id": "ch_9"}


def test_workers_judges_processes_on_this_host(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    here = host_identity()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    ledger = open_ledger(ledger_url)
    try:
        ledger.register_worker(WorkerInfo("w-me", here, "h", os.getpid(),
                                          process_start_time(os.getpid())))
        ledger.register_worker(WorkerInfo("w-dead", here, "h", dead.pid, None))
        ledger.register_worker(WorkerInfo("w-far", "elsewhere/boot/ns", "far", 1, None))
        ledger.register_worker(WorkerInfo("w-gone", here, "h", 2, None))
        ledger.revoke_holder("w-gone", by="test", reason="test")
    finally:
        ledger.close()
    with Control(ledger_url) as control:
        views = {w.holder: w for w in control.workers()}
    assert all(isinstance(w, WorkerView) for w in views.values())
    assert {h: w.process for h, w in views.items()} == {
        "w-me": "running", "w-dead": "gone", "w-far": "other host", "w-gone": "-",
    }
    assert views["w-gone"].state == "dead"
    assert all(w.last_seen_age_s >= 0 for w in views.values())
    result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert {w["holder"]: w["process"] for w in shown} == {
        h: w.process for h, w in views.items()
    }
    assert list(shown[0]) == [f.name for f in dataclasses.fields(WorkerView)]


def test_workers_shows_the_os_process_state(ledger_url: str) -> None:
    """A SIGSTOPped worker process is shown ``stopped`` (it runs nothing until continued),
    an exited unreaped one ``zombie`` (gone: it will never write again)."""
    Control(ledger_url).migrate()
    here = host_identity()
    frozen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        wait_for("the kernel to say it is stopped",
                 lambda: psutil.Process(frozen.pid).status() == psutil.STATUS_STOPPED)
        wait_for("the child to exit, unreaped",
                 lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE)
        ledger = open_ledger(ledger_url)
        try:
            for holder, proc in (("w-frozen", frozen), ("w-zombie", zombie)):
                ledger.register_worker(WorkerInfo(holder, here, "h", proc.pid,
                                                  process_start_time(proc.pid)))
        finally:
            ledger.close()
        with Control(ledger_url) as control:
            views = {w.holder: w.process for w in control.workers()}
        assert views == {"w-frozen": "stopped", "w-zombie": "zombie"}
        result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url])
        assert result.exit_code == 0, result.output
        [row] = [ln for ln in result.stdout.splitlines() if "w-frozen" in ln]
        assert "stopped" in row and "running" not in row, row
        [row] = [ln for ln in result.stdout.splitlines() if "w-zombie" in ln]
        assert "zombie (not yet revoked)" in row, row
    finally:
        frozen.kill()
        frozen.wait()
        zombie.wait()


def test_every_audited_operator_command_is_counted(ledger_url: str) -> None:
    """pause, resume, limits set and limits clear (each audited with a reason) are four
    operator actions in ``ratchet status``."""
    Control(ledger_url).migrate()
    for args in (["pause", "--type", "billing.charge"], ["resume", "--type", "billing.charge"],
                 ["limits", "set", "--type", "billing.charge", "--max", "2"],
                 ["limits", "clear", "--type", "billing.charge"]):
        result = CliRunner().invoke(cli, [*args, "--reason", "trial", "--ledger", ledger_url])
        assert result.exit_code == 0, (args, result.output)
    with Control(ledger_url) as control:
        assert control.status().operator_actions == 4
    result = CliRunner().invoke(cli, ["status", "--ledger", ledger_url])
    assert "operator actions: 4" in result.stdout, result.stdout


def test_cli_resolve_warns_of_no_result_only_when_accepted(ledger_url: str) -> None:
    task_id = unknown_task(ledger_url)
    args = ["resolve", task_id, "--outcome", "done", "--reason", "x", "--ledger", ledger_url]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "warning: no --result given" in result.stderr, result.stderr
    result = CliRunner().invoke(cli, args)  # the task is PENDING now: refused
    assert result.exit_code == 2, result.output
    assert "error: IllegalTransition: " in result.stderr, result.stderr
    assert "warning" not in result.stderr, result.stderr


def test_submit_needs_an_app(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Control\(app=\.\.\.\)"):
        Control(f"sqlite:///{tmp_path}/l.db").submit("billing.charge", {})
    assert list(tmp_path.iterdir()) == []


def test_malformed_url_is_refused_at_construction() -> None:
    with pytest.raises(ConfigError):
        Control("mysql://x/y")


def test_wait_gives_up_at_its_deadline_and_returns_at_unknown(ledger_url: str) -> None:
    import time

    from ratchet import WaitTimeout

    unknown_id = unknown_task(ledger_url, "o-u")  # first: its claim must take this task
    app = make_app(ledger_url)
    pending = app.submit("billing.charge", {"order_id": "o-w"})
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"still PENDING after 0\.4 s"):
        app.wait(pending.task_id, timeout_s=0.4, poll_s=0.05)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.4  # never early
    assert elapsed < 0.4 + 5.0  # one last look at the deadline, not a whole extra interval
    assert app.wait(unknown_id, timeout_s=30).state is State.UNKNOWN  # a person, not time
    app.close()


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {"app": 5}, "app must be a ratchet.App"),
    (("sqlite:///x.db",), {"app": App("sqlite:///y.db")}, "not both"),
])
def test_control_arguments_are_checked(args: tuple[str, ...], kwargs: dict[str, object],
                                       message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Control(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [0, -1.0, 1e-320, 1e-300, 10**400, float("nan"), True, "5"])
def test_resume_and_replay_refuse_rates_out_of_range(tmp_path: Path, rate: object) -> None:
    """A rate below one task an hour would schedule tasks so far ahead they look lost (or
    overflow 1 / rate); above the cap is a typo: refused, nothing changed."""
    from ratchet import InvalidArguments

    url = f"sqlite:///{tmp_path}/l.db"
    with Control(url) as control:
        control.migrate()
        with pytest.raises(InvalidArguments, match="rate_per_s"):
            control.resume("all", reason="go", by="op", rate_per_s=rate)  # type: ignore[arg-type]
        with pytest.raises(InvalidArguments, match="rate_per_s"):
            control.quarantine_replay("0123456789abcdef", rate, reason="go")  # type: ignore[arg-type]

