"""``ratchet status`` (capacity view, ``--window``, ``--watch``), ``ratchet workers``
(stopped / dead marked, registry retention), ``--json`` on every command, and piped output
never cut. Real CLI (typer's runner in-process, and real subprocesses), real ledgers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from ratchet import App, Control, State, TaskContext, open_ledger
from ratchet.cli.main import cli
from ratchet.fingerprint import fingerprint
from ratchet.ledger.base import TaskWrite, Transition, WorkerInfo
from ratchet.testing.processes import wait_for
from ratchet.testing.worker import running_worker
from ratchet.worker.registry import Registrar, host_identity

APP_SOURCE = """
from ratchet import App, TaskContext

app = App()


@app.task(name="cli.echo")
def echo(ctx: TaskContext, text: str = "") -> str:
    return text
"""

NOT_JSON = {"worker", "demo", "serve", "relay"}
"""Commands without --json: a worker, a relay (and the HTTP service) run until stopped, the
demo prints a report. Every other command must take --json (test_every_command_has_json)."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.pop("COLUMNS", None)
    return env


def _ratchet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the real command in a process of its own, output piped."""
    return subprocess.run([sys.executable, "-m", "ratchet.cli.main", *args],
                          capture_output=True, text=True, env=_env(), timeout=timeout,
                          check=False)


def _commands(group: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the CLI (``("limits", "set")``, ...), groups included."""
    commands = getattr(group, "commands", None)
    assert commands, group
    for name, command in commands.items():
        yield (*prefix, name)
        if getattr(command, "commands", None):
            yield from _commands(command, (*prefix, name))


def test_every_command_has_json() -> None:
    for path in _commands(get_command(cli)):
        if path[0] in NOT_JSON:
            continue
        command = get_command(cli)
        for part in path:
            command = command.commands[part]  # type: ignore[attr-defined]
        if getattr(command, "commands", None) and not command.invoke_without_command:
            continue  # a group only (ratchet quarantine): its commands are checked
        opts = {o for p in command.params for o in getattr(p, "opts", [])}
        assert "--json" in opts, f"ratchet {' '.join(path)} has no --json"
    root = {o for p in get_command(cli).params for o in getattr(p, "opts", [])}
    assert {"--version", "--json"} <= root


@pytest.fixture
def cli_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, App]]:
    (tmp_path / "cliapp.py").write_text(APP_SOURCE)
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path}/l.db"
    app = App(url)

    @app.task(name="cli.echo")
    def echo(ctx: TaskContext, text: str = "") -> str:
        return text

    yield url, app
    app.close()


def _unknown_and_failed(url: str, app: App) -> tuple[str, str]:
    """An UNKNOWN task and a FAILED one, written the way a worker writes them."""
    u = app.submit("cli.echo", {"text": "u"})
    f = app.submit("cli.echo", {"text": "f"})
    led = open_ledger(url)
    try:
        for handle, to in ((u, State.UNKNOWN), (f, State.FAILED)):
            [claim] = led.claim("w-cli", ["cli.echo"], 1)
            assert claim.task_id == handle.task_id
            [ok] = led.commit([TaskWrite(claim.task_id, claim.generation, "w-cli", "end",
                                         transition=Transition(to, error="RuntimeError: x",
                                                               error_class="transient"))])
            assert ok.ok
    finally:
        led.close()
    return u.task_id, f.task_id


def test_json_on_every_command_parses(cli_ledger: tuple[str, App]) -> None:
    """One table: each command with --json prints JSON (the record the control API
    returns), exit status 0 (1 for an operator command that changed nothing is not used
    here)."""
    url, app = cli_ledger
    unknown_id, failed_id = _unknown_and_failed(url, app)
    pending = app.submit("cli.echo", {"text": "p"}, delay_s=3600).task_id
    led = "--ledger", url
    table: list[tuple[list[str], type]] = [
        (["--version"], dict),
        (["migrate", *led], dict),
        (["submit", "cliapp:app", "cli.echo", "--params", '{"text": "s"}', *led], dict),
        (["status", *led], dict),
        (["status", "--window", "5m", *led], dict),
        (["tasks", *led], dict),
        (["tasks", "--state", "UNKNOWN", *led], dict),
        (["workers", *led], list),
        (["workers", "--prune-after", "1h", *led], list),
        (["definitions", *led], list),
        (["inspect", pending, *led], dict),
        (["late-effects", *led], list),
        (["resolve", unknown_id, "--outcome", "not-done", "--reason", "checked", *led], dict),
        (["cancel", pending, "--reason", "mistake", *led], dict),
        (["retry", failed_id, "--reason", "fixed", *led], dict),
        (["pause", "--type", "cli.echo", "--reason", "incident", *led], dict),
        (["resume", "--type", "cli.echo", "--reason", "over", *led], dict),
        (["limits", *led], dict),
        (["limits", "set", "--type", "cli.echo", "--max", "3", "--reason", "r", *led], dict),
        (["limits", "clear", "--type", "cli.echo", "--reason", "r", *led], dict),
        (["quarantine", "list", *led], list),
        (["quarantine", "replay", "--fingerprint", "0" * 16, "--dry-run", *led], dict),
        (["prune", "--older-than", "30d", "--dry-run", *led], dict),
        (["prune", "--older-than", "30d", *led], dict),
    ]
    runner = CliRunner()
    for args, kind in table:
        result = runner.invoke(cli, [*args, "--json"])
        assert result.exit_code == 0, (args, result.output)
        assert isinstance(json.loads(result.stdout), kind), (args, result.stdout)
    # The same through a real process (piped stdout), for the capacity view.
    proc = _ratchet("status", "--json", *led)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert {t["name"] for t in shown["types"]} == {"cli.echo"}
    assert shown["totals"]["name"] == "*" and shown["window_s"] == 60


def test_watch_redraws_n_frames(cli_ledger: tuple[str, App]) -> None:
    url, app = cli_ledger
    app.submit("cli.echo", {"text": "x"})
    proc = _ratchet("status", "--watch", "0.2", "--count", "3", "--ledger", url)
    assert proc.returncode == 0, proc.stderr
    frames = [ln for ln in proc.stdout.splitlines() if ln.startswith("== ratchet status at ")]
    assert len(frames) == 3, proc.stdout
    assert proc.stdout.count("capacity (rates over the last 60 s)") == 3
    proc = _ratchet("status", "--watch", "0.2", "--count", "2", "--json", "--ledger", url)
    assert proc.returncode == 0, proc.stderr
    reads = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert len(reads) == 2 and reads[0]["ledger_now"] <= reads[1]["ledger_now"]
    runner = CliRunner()
    for bad in (["status", "0.2"], ["status", "--count", "2"],
                ["status", "--watch", "0", "--count", "1"], ["status", "--window", "0"],
                ["status", "--window", "2d"]):
        result = runner.invoke(cli, [*bad, "--ledger", url])
        assert result.exit_code == 2, (bad, result.output)
        assert "error: InvalidArguments" in result.stderr, (bad, result.stderr)


def test_watch_runs_until_ctrl_c(cli_ledger: tuple[str, App], tmp_path: Path) -> None:
    url, app = cli_ledger
    app.submit("cli.echo", {"text": "x"})
    out = tmp_path / "frames.txt"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli.main", "status", "--watch", "0.1", "--ledger",
             url], stdout=sink, stderr=subprocess.PIPE, text=True, env=_env())
        try:
            def two_frames() -> bool:
                assert proc.poll() is None, out.read_text()
                return out.read_text().count("== ratchet status at") >= 2

            wait_for("two frames", two_frames, timeout_s=60)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    proc.stderr.close()


def test_piped_output_keeps_long_cells_whole(cli_ledger: tuple[str, App]) -> None:
    url, app = cli_ledger
    name = "cli.echo"
    error = "RuntimeError: " + "e" * 400 + " end-of-error"
    h = app.submit(name, {"text": "x"}, idempotency_key="k-" + "k" * 300)
    led = open_ledger(url)
    try:
        [claim] = led.claim("w-cli", [name], 1)
        fp = fingerprint(name, "RuntimeError", "e")
        for _ in range(5):  # the same error until the ledger quarantines it
            [ok] = led.commit([TaskWrite(
                claim.task_id, claim.generation, "w-cli", "fail",
                transition=Transition(State.RETRY_WAIT, error=error, error_class="transient",
                                      reason="retry", fingerprint=fp))])
            assert ok.ok
            if led.get(h.task_id).state is State.FAILED:
                break
            [claim] = led.claim("w-cli", [name], 1)
        assert led.get(h.task_id).quarantined
    finally:
        led.close()
    later = app.submit(name, {"text": "later"}, delay_s=3600).task_id
    proc = _ratchet("tasks", "--ledger", url)
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()
    assert any(h.task_id in r and "end-of-error" in r and "k" * 300 in r for r in rows), rows
    assert any(h.task_id in r and "FAILED quarantined" in r for r in rows), rows
    assert any(later in r and "(in 59m" in r for r in rows), rows
    proc = _ratchet("quarantine", "list", "--ledger", url)
    assert proc.returncode == 0 and "e" * 400 + " end-of-error" in proc.stdout
    proc = _ratchet("inspect", h.task_id, "--ledger", url)
    assert proc.returncode == 0 and "quarantined: not retried automatically" in proc.stdout
    assert "end-of-error" in proc.stdout
    proc = _ratchet("inspect", later, "--ledger", url)
    assert proc.returncode == 0 and "scheduled: runs at " in proc.stdout, proc.stdout
    proc = _ratchet("status", "--ledger", url)
    assert proc.returncode == 0
    widest = max(len(ln) for ln in proc.stdout.splitlines())
    assert widest > 80  # the capacity table is not squeezed into 80 columns
    assert any("quarantined" in ln for ln in proc.stdout.splitlines())


def test_status_numbers_with_a_running_worker(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task(name="cap.run")
    def run(ctx: TaskContext, n: int) -> int:
        return n

    handles = [app.submit("cap.run", {"n": n}) for n in range(20)]
    app.submit("cap.run", {"n": -1}, delay_s=3600)
    with running_worker(app, concurrency=4):
        for h in handles:
            assert app.wait(h.task_id, timeout_s=60).state is State.SUCCEEDED
    with Control(app=app) as control:
        report = control.status(window_s=600)
    app.close()
    [view] = report.types
    assert view.counts == {"SUCCEEDED": 20, "PENDING": 1} and view.total == 21
    assert (view.backlog, view.scheduled, view.running) == (0, 1, 0)
    assert view.arrival_per_s == pytest.approx(21 / 600)
    assert view.completion_per_s == pytest.approx(20 / 600)
    assert view.drain_eta_s is None  # one more arrived than finished: not draining
    result = CliRunner().invoke(cli, ["status", "--window", "10m", "--ledger", ledger_url])
    assert result.exit_code == 0, result.output
    assert "nothing ready, 1 scheduled" in result.stdout, result.stdout


def test_workers_marks_and_prunes_stopped_and_dead(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    here = host_identity()
    led = open_ledger(ledger_url)
    try:
        for holder in ("w-alive", "w-stopped", "w-dead"):
            led.register_worker(WorkerInfo(holder, here, "h", os.getpid(), None))
        led.touch_worker("w-stopped", state="stopped")
        led.revoke_holder("w-dead", by="test", reason="test")
        result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url])
        assert result.exit_code == 0, result.output
        assert "STOPPED (clean exit)" in result.stdout and "DEAD (revoked)" in result.stdout
        assert "1 alive, 1 stopped, 1 dead" in result.stdout
        with Control(ledger_url) as control:
            assert control.prune_workers(3600) == []        # all younger than an hour
            seen = max(w.last_seen for w in control.workers())
            wait_for("the rows to age", lambda: control.ledger_now() > seen + 0.3,
                     timeout_s=30)
            result = CliRunner().invoke(cli, ["workers", "--prune-after", "0.3", "--json",
                                              "--ledger", ledger_url])
            assert result.exit_code == 0, result.output
            assert [w["holder"] for w in json.loads(result.stdout)] == ["w-alive"]
            # Running workers prune on their registry heartbeat (retention 24 h; here 0.3 s).
            led.register_worker(WorkerInfo("w-old", here, "h", os.getpid(), None))
            led.touch_worker("w-old", state="stopped")
            registrar = Registrar(led, "w-alive", scan_interval_s=0.05, touch_interval_s=1.0,
                                  retention_s=0.3, prune_interval_s=0.1)
            registrar.start()
            try:
                wait_for("the registrar to prune w-old",
                         lambda: {w.holder for w in control.workers()} == {"w-alive"},
                         timeout_s=30)
            finally:
                registrar.stop(clean=False)
            assert [w.holder for w in control.workers()] == ["w-alive"]  # alive: never
    finally:
        led.close()
