"""``ratchet worker --middleware MODULE:ATTR`` installs middleware in a real worker process,
and bad specs are one clear ConfigError."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet import App, State
from ratchet.errors import ConfigError
from ratchet.loading import load_middleware
from ratchet.testing import wait_for

MODULE = '''
from pathlib import Path

import ratchet

app = ratchet.App()
LOG = Path(__file__).with_name("hooks.log")


@app.task(name="mw.echo")
def echo(ctx: ratchet.TaskContext, n: int) -> int:
    return ctx.step("double", lambda: n * 2)


class Recorder(ratchet.Middleware):
    def worker_start(self, worker):
        with LOG.open("a") as f:
            f.write("start\\n")

    def after_step(self, ctx, name, cached, duration_s, exception):
        with LOG.open("a") as f:
            f.write(f"step {name}\\n")

    def after_attempt(self, worker, claim, outcome, exception):
        with LOG.open("a") as f:
            f.write(f"attempt {claim.name} {outcome}\\n")


instance = Recorder()
not_middleware = 42


class NeedsArgs(ratchet.Middleware):
    def __init__(self, url):
        self.url = url
'''


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "mwproj.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("spec", ["mwproj:Recorder", "mwproj:instance"])
def test_class_or_instance_loads(project: Path, spec: str) -> None:
    assert type(load_middleware(spec)).__name__ == "Recorder"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mwproj", "must look like MODULE:ATTRIBUTE"),
        ("nosuchmodule:x", "cannot import module 'nosuchmodule'"),
        ("mwproj:missing", "has no attribute 'missing'"),
        ("mwproj:not_middleware", "is a int, not a ratchet.Middleware"),
        ("mwproj:NeedsArgs", "cannot be created without arguments"),
    ],
)
def test_bad_middleware_specs_are_config_errors(project: Path, spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_middleware(spec)


def test_worker_process_runs_the_middleware(project: Path, ledger_url: str) -> None:
    log_path = project / "hooks.log"
    out = (project / "worker.out").open("wb")
    env = {**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ratchet.cli.main", "worker", "mwproj:app", "--ledger",
         ledger_url, "--middleware", "mwproj:Recorder", "--poll-interval-s", "0.02"],
        cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT,
    )
    app = App(ledger=ledger_url)
    app.task(name="mw.echo")(lambda ctx, n: n)  # the submitter only needs the name
    try:
        handle = app.submit("mw.echo", {"n": 21})
        info = app.wait(handle.task_id, timeout_s=60)
        assert info.state is State.SUCCEEDED and info.result == 42

        def logged() -> list[str] | None:
            lines = log_path.read_text().splitlines() if log_path.exists() else []
            return lines if "attempt mw.echo SUCCEEDED" in lines else None

        lines = wait_for("the middleware to log the attempt's end", logged, timeout_s=30,
                         interval_s=0.05)
        assert lines[0] == "start", lines
        assert "step double" in lines and "attempt mw.echo SUCCEEDED" in lines, lines
    finally:
        app.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
