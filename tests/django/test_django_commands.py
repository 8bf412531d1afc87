"""``manage.py ratchet_worker`` and ``ratchet_migrate`` refuse bad input with one line on
stderr and exit status 1, never a traceback: a malformed ``RATCHET`` setting, an unknown
or empty ``--names``, an empty ``--queues``. Real subprocesses on the test project
(tests/django) with a SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("django", reason="Django is not installed (pip install 'ratchet[django]')")

PROJECT = Path(__file__).resolve().parent
APP = "djproject.tasks:app"


def _manage(tmp_path: Path, *args: str,
            ratchet: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "djproject.settings", "DJ_DB": "sqlite",
           "DJ_DB_NAME": str(tmp_path / "project.sqlite3")}
    env.pop("DJ_RATCHET", None)
    if ratchet is not None:
        env["DJ_RATCHET"] = ratchet
    return subprocess.run([sys.executable, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=120)


def _refused(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    report = proc.stdout + proc.stderr
    assert proc.returncode == 1, report
    assert "Traceback" not in report, report
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("CommandError: "), report
    for text in expected:
        assert text in lines[0], report
    assert "ratchet worker" not in proc.stdout, report  # no worker started


@pytest.mark.parametrize(("setting", "expected"), [
    ('{"app": "djproject.tasks:app"}', "unknown keys ['app']"),
    (f'{{"APP": "{APP}", "DATABASE": "nope"}}', "'nope'"),
    (f'{{"APP": "{APP}", "MIGRATE": "yes"}}', "MIGRATE"),
    ("[1]", "must be a dict"),
    ("{}", "RATCHET['APP'] is not set"),
    ('{"APP": "no.such.module:app"}', "no.such.module"),
], ids=["lowercase-key", "unknown-database", "migrate-not-bool", "not-a-dict", "no-app",
        "app-not-importable"])
def test_a_bad_ratchet_setting_is_one_line_and_exit_1(tmp_path: Path, setting: str,
                                                      expected: str) -> None:
    _refused(_manage(tmp_path, "ratchet_worker", ratchet=setting), expected)


@pytest.mark.parametrize("command", ["ratchet_migrate", "migrate"])
def test_migrate_reports_a_bad_setting_on_one_line(tmp_path: Path, command: str) -> None:
    _refused(_manage(tmp_path, command, ratchet="[1]"), "must be a dict")


@pytest.mark.parametrize(("args", "expected"), [
    (("--names", "nosuch"), "unknown task 'nosuch'"),
    (("--names", ""), "--names names nothing"),
    (("--names", " , "), "--names names nothing"),
    (("--queues", ","), "--queues names nothing"),
], ids=["unknown-name", "empty-names", "blank-names", "empty-queues"])
def test_worker_options_that_name_nothing_runnable_are_refused(
        tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    _refused(_manage(tmp_path, "ratchet_worker", *args), expected)
