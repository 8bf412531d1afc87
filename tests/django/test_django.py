"""ratchet.contrib.django under Django's own test runner: ``manage.py test`` on the small
project beside this file (djproject, shop), once against a SQLite file and once against
PostgreSQL (Django creates and drops its ``test_<name>`` database there).

What the Django tests check (shop/tests.py): submit inside ``transaction.atomic()``
commits the order row and the task together and an exception rolls back both (a rolled
back savepoint too); submit outside ``atomic()`` is refused and writes nothing;
``manage.py ratchet_worker``, a real subprocess, runs the task to ``SUCCEEDED`` (the task
updates the order through the ORM) and exits 0 on SIGTERM; the admin page shows counts by
state and dashboard links to staff and sends anonymous and non-staff users to the login
page; the ledger was made by ``manage.py migrate`` in the project's database.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from pgsupport import pg_base_url, require_pg

pytest.importorskip("django", reason="Django is not installed (pip install 'ratchet[django]')")

PROJECT = Path(__file__).resolve().parent


def _run_django_tests(env: dict[str, str]) -> None:
    """Run ``manage.py test shop`` in a subprocess; fail with its output unless it passes."""
    full = {**os.environ, "DJANGO_SETTINGS_MODULE": "djproject.settings", **env}
    proc = subprocess.run(
        [sys.executable, "manage.py", "test", "shop", "--noinput", "-v", "2"],
        cwd=PROJECT, env=full, capture_output=True, text=True, timeout=280)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "Ran 13 tests" in report and "\nOK" in report, report


def test_django_runner_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "project.sqlite3"
    _run_django_tests({"DJ_DB": "sqlite", "DJ_DB_NAME": str(db),
                       "DJ_TEST_DB_NAME": str(tmp_path / "project-test.sqlite3")})


def test_django_runner_on_postgresql() -> None:
    require_pg()
    psycopg = pytest.importorskip("psycopg")
    name = f"rtdj_{secrets.token_hex(5)}"
    try:
        _run_django_tests({"DJ_DB": "postgresql", "DJ_DB_NAME": name,
                           "DJ_PG_URL": pg_base_url()})
    finally:
        with psycopg.connect(pg_base_url(), autocommit=True, connect_timeout=5) as conn:
            for db in (f"test_{name}", f"test_{name}_other"):
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
