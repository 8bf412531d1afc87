"""A corrupt ledger is :class:`~ratchet.LedgerCorrupt`, never "busy" (DESIGN §10.1): real
SQLite files damaged in place (bytes overwritten in the task pages, the file cut short)
under a running worker process, which stops claiming, logs it once and exits with
:data:`~ratchet.errors.EXIT_LEDGER_CORRUPT`; ``ratchet status`` prints it and exits with
that status, without a traceback; the ledger metrics and the worker's say so. PostgreSQL:
its corruption SQLSTATEs (class XX: XX001 data_corrupted, XX002 index_corrupted), raised by
the real server, map to the same error; an internal error (XX000) does not."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from corruptsupport import damage_task_pages, truncate_ledger
from prometheus_client.parser import text_string_to_metric_families

from ratchet import App, Control, LedgerCorrupt, LedgerError, LedgerUnavailable, TaskContext
from ratchet.errors import EXIT_LEDGER_CORRUPT
from ratchet.ledger import open_ledger
from ratchet.observe.ledger_metrics import render_ledger_metrics
from ratchet.observe.metrics import WorkerMetrics, render
from ratchet.testing.processes import ProcessGroup, clean_env
from ratchet.worker import Worker

pytestmark = pytest.mark.timeout(120)

MODULE = '''
import ratchet

app = ratchet.App()


@app.task(name="cr.echo")
def echo(ctx, n):
    return {"n": n}
'''

DAMAGE: dict[str, Callable[[Path], None]] = {
    "task-pages": damage_task_pages, "truncated": truncate_ledger}


def _make_app(url: str) -> App:
    app = App(url)

    @app.task(name="cr.echo")
    def echo(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n}

    return app


def _ledger_with_tasks(path: Path, n: int = 5) -> App:
    app = _make_app(f"sqlite:///{path}")
    for i in range(n):
        app.submit("cr.echo", {"n": i})
    return app


def _gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"no {name} in the scrape")


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_running_worker_stops_and_exits_with_the_corruption_status(
    tmp_path: Path, damage: str
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "crapp.py").write_text(MODULE)
    db = tmp_path / "l.db"
    url = f"sqlite:///{db}"
    app = _ledger_with_tasks(db)
    handles = [app.submit("cr.echo", {"n": 10 + i}) for i in range(3)]
    with ProcessGroup(tmp_path / "logs", pythonpath=[project]) as group:
        worker = group.worker("crapp:app", url)
        for handle in handles:
            handle.wait(timeout_s=60)
        app.close()
        DAMAGE[damage](db)
        assert worker.wait(timeout_s=60) == EXIT_LEDGER_CORRUPT, group.dump()
    log = worker.log()
    said = [line for line in log.splitlines() if "is corrupt" in line]
    assert len(said) == 1, log
    assert "CRITICAL" in said[0] and "SQLITE_CORRUPT" in said[0], said[0]
    assert "restore it from a backup" in said[0] and ".recover" in said[0]
    assert f"exits (status {EXIT_LEDGER_CORRUPT})" in said[0]
    assert "Traceback" not in log


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_cli_status_reports_corruption_with_its_exit_status(tmp_path: Path, damage: str
                                                             ) -> None:
    db = tmp_path / "l.db"
    _ledger_with_tasks(db).close()
    DAMAGE[damage](db)
    done = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "status", "--ledger", f"sqlite:///{db}"],
        capture_output=True, text=True, env=clean_env({}), timeout=60, check=False)
    assert done.returncode == EXIT_LEDGER_CORRUPT, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    (message,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert message.startswith("error: LedgerCorrupt: ledger ") and str(db) in message
    assert "SQLITE_CORRUPT" in message and "restore it from a backup" in message


def test_corrupt_is_a_ledger_error_but_not_unavailable(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    app = _ledger_with_tasks(db)
    app.close()
    damage_task_pages(db)
    ledger = open_ledger(f"sqlite:///{db}", migrate=False, must_exist=True)
    try:
        assert ledger.corruption is None  # the header and schema are still whole
        with pytest.raises(LedgerCorrupt) as caught:
            ledger.claim("h", ["cr.echo"], 5)
        assert isinstance(caught.value, LedgerError)
        assert not isinstance(caught.value, LedgerUnavailable)  # nothing retries it
        assert caught.value.where == str(db)
        assert caught.value.detail == "database disk image is malformed [SQLITE_CORRUPT]"
        assert ledger.corruption is caught.value
    finally:
        ledger.close()


def test_ledger_metrics_raise_the_corruption_alarm(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    _ledger_with_tasks(db).close()
    control = Control(f"sqlite:///{db}")
    try:
        body, _ = render_ledger_metrics(control)
        assert _gauge(body.decode(), "ratchet_ledger_corrupt") == 0
        assert _gauge(body.decode(), "ratchet_ledger_up") == 1
        damage_task_pages(db)
        body, _ = render_ledger_metrics(control)
        assert _gauge(body.decode(), "ratchet_ledger_corrupt") == 1
        assert _gauge(body.decode(), "ratchet_ledger_up") == 0
    finally:
        control.close()


def test_in_process_worker_stops_and_its_metrics_say_corrupt(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    _ledger_with_tasks(db).close()
    damage_task_pages(db)
    app = _make_app(f"sqlite:///{db}")
    metrics = WorkerMetrics()
    worker = Worker(app, middleware=[metrics], poll_interval_s=0.02)
    try:
        worker.run(idle_exit_s=60)  # returns at once: the first claim finds the damage
        assert worker.stop_reason == "ledger_corrupt"
        assert worker.exit_code == EXIT_LEDGER_CORRUPT
        assert _gauge(render(metrics.registry)[0].decode(), "ratchet_ledger_corrupt") == 1
    finally:
        app.close()


@pytest.mark.parametrize("backend", ["postgresql"])
@pytest.mark.parametrize(("errcode", "sqlstate"), [("data_corrupted", "XX001"),
                                                   ("index_corrupted", "XX002")])
def test_postgresql_corruption_sqlstates_are_ledger_corrupt(
    ledger_url: str, errcode: str, sqlstate: str
) -> None:
    # The real server raises the SQLSTATE (damaging a relation's files under a shared test
    # server is not an option); the mapping under test is the dialect's.
    ledger = open_ledger(ledger_url)
    try:
        assert ledger.corruption is None

        def body(tx: object) -> None:
            tx.cur.execute(  # type: ignore[attr-defined]
                "DO $$ BEGIN RAISE EXCEPTION 'invalid page in block 7 of relation "
                f"\"tasks\"' USING ERRCODE = '{errcode}'; END $$")

        with pytest.raises(LedgerCorrupt) as caught:
            ledger.dialect.run(body)  # type: ignore[attr-defined]
        assert caught.value.detail == f'invalid page in block 7 of relation "tasks" [{sqlstate}]'
        assert not isinstance(caught.value, LedgerUnavailable)
        assert ledger.corruption is caught.value
        assert ("REINDEX" in str(caught.value)) == (sqlstate == "XX002")
        assert ledger.now() > 0  # the connection is usable again

        def internal(tx: object) -> None:
            tx.cur.execute(  # type: ignore[attr-defined]
                "DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = 'internal_error'; END $$")

        with pytest.raises(LedgerError) as other:
            ledger.dialect.run(internal)  # type: ignore[attr-defined]
        assert not isinstance(other.value, LedgerCorrupt)
    finally:
        ledger.close()
