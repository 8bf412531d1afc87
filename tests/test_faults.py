"""Fault-point names are checked: a name that is no fault point is refused with the list of
known ones (a typo would otherwise arm nothing, silently), and a worker started with a
point armed says so once at start-up. Each case runs in a subprocess with the variable set,
as a crash test's worker does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ratchet import faults
from ratchet.testing import wait_for

SOURCE = Path(__file__).resolve().parents[1] / "src" / "ratchet"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    (tmp_path / "fpproj.py").write_text(
        "import ratchet\napp = ratchet.App()\n\n"
        "@app.task(name='fp.noop')\ndef noop(ctx):\n    return None\n"
    )
    pythonpath = f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def _worker(tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "ratchet.cli.main", "worker", "fpproj:app",
            "--ledger", f"sqlite:///{tmp_path}/l.db"]


def test_every_point_the_code_reaches_is_known() -> None:
    """POINTS lists exactly the names src/ passes to the fault-point call."""
    reached: set[str] = set()
    for path in SOURCE.rglob("*.py"):
        for line in path.read_text().splitlines():
            for call in ("fault_point(\"", "faults.point(\""):
                if call in line:
                    reached.add(line.split(call, 1)[1].split('"', 1)[0])
    assert reached == faults.POINTS


@pytest.mark.parametrize("variable", ["RATCHET_CRASH_AT", "RATCHET_PAUSE_AT"])
def test_an_unknown_point_is_refused_at_first_use(tmp_path: Path, variable: str) -> None:
    code = ("from ratchet import faults\n"
            "try:\n    faults.point('effect.after_call')\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    env = _env(tmp_path, **{variable: "effect.aftercall"})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, env=env)
    known = ", ".join(sorted(faults.POINTS))
    assert out.stdout.strip() == (
        f"ConfigError {variable}='effect.aftercall' is not a fault point; known points: {known}"
    ), out.stderr


def test_a_worker_with_an_unknown_point_does_not_start(tmp_path: Path) -> None:
    out = subprocess.run(_worker(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False, cwd=tmp_path,
                         env=_env(tmp_path, RATCHET_CRASH_AT="effect.aftercall"))
    assert out.returncode == 2, out.stderr
    assert "RATCHET_CRASH_AT='effect.aftercall' is not a fault point; known points: " in out.stderr
    assert "effect.after_call" in out.stderr
    assert "stopped:" not in out.stderr  # refused before it claimed anything


def test_a_worker_logs_an_armed_point_once_at_start_up(tmp_path: Path) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(_worker(tmp_path), stdout=log_file, stderr=subprocess.STDOUT,
                                cwd=tmp_path,
                                env=_env(tmp_path, RATCHET_CRASH_AT="effect.after_call"))
    try:
        wait_for("the worker's armed-point warning",
                 lambda: "fault point armed" in log_path.read_text(), timeout_s=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    lines = [line for line in log_path.read_text().splitlines() if "fault point armed" in line]
    assert len(lines) == 1, log_path.read_text()
    assert " WARNING ratchet.worker " in lines[0]
    assert "RATCHET_CRASH_AT=effect.after_call" in lines[0]
