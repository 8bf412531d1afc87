"""Versioned definitions (DESIGN §8), on both ledgers: an instance pins the
version it was submitted with; a worker claims only the (name, version) pairs its app
defines and runs each claim with that version's function; a task whose version no live
worker has waits (never failed or dropped), is shown in ``Control.status()`` / ``ratchet
status``, and runs once a worker with its version starts; recovery after a crash runs the
pinned version. Definitions are registered in the ledger when a worker starts.

Executions are counted outside the ledger (the file ``versions_app`` appends to); real
worker subprocesses and SIGKILL where a process matters; every wait is on a condition.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, SchemaTooOld, State, TaskContext, open_ledger
from ratchet.cli.main import cli
from ratchet.ledger.base import DefinitionSpec
from ratchet.testing import ProcessGroup, wait_for
from ratchet.testing.worker import running_worker

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from versions_app import NAME, make_app  # noqa: E402

pytestmark = pytest.mark.timeout(120)
DEADLINE_S = 45.0


def _executions(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def _settled(app: App, ids: list[str]) -> bool:
    return all(app.get(i).state is State.SUCCEEDED for i in ids)


def test_submit_pins_the_newest_version_unless_given(ledger_url: str) -> None:
    app = make_app(ledger_url, [2, 1, 3])
    assert app.definition(NAME).version == 3
    assert [d.version for d in app.definitions()] == [1, 2, 3]
    assert app.submit(NAME, {"i": 0}).get().version == 3
    assert app.submit(NAME, {"i": 0}, version=1).get().version == 1
    with pytest.raises(Exception, match=r"unknown task 'ver.run' version 7; .*version=7"):
        app.submit(NAME, {"i": 0}, version=7)
    app.close()


def test_each_worker_runs_only_its_version(ledger_url: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "executions.jsonl"
    monkeypatch.setenv("VERSIONS_LOG", str(log))
    app1, app2 = make_app(ledger_url, [1]), make_app(ledger_url, [2])
    ids = {1: [app1.submit(NAME, {"i": i}).task_id for i in range(8)],
           2: [app2.submit(NAME, {"i": i}).task_id for i in range(8)]}
    with running_worker(app1, holder="w-v1") as w1, running_worker(app2, holder="w-v2") as w2:
        wait_for("every task to succeed", lambda: _settled(app1, ids[1] + ids[2]), DEADLINE_S)
        assert w1.kinds == [(NAME, 1)] and w2.kinds == [(NAME, 2)]
    with Control(ledger_url) as control:
        for version, holder in ((1, "w-v1"), (2, "w-v2")):
            for task_id in ids[version]:
                info = app1.get(task_id)
                assert info.version == version and info.result["version"] == version
                claims = [e for e in control.inspect(task_id).events if e.kind == "claim"]
                assert [e.holder for e in claims] == [holder]
    runs = _executions(log)
    assert sorted((r["task"], r["version"]) for r in runs) == sorted(
        (t, v) for v in (1, 2) for t in ids[v])  # each task once, with its version
    app1.close()
    app2.close()


def test_a_version_no_worker_has_waits_and_is_shown(ledger_url: str) -> None:
    old, new = make_app(ledger_url, [1]), make_app(ledger_url, [1, 2])
    waiting = new.submit(NAME, {"i": 0}, idempotency_key="v2-task")  # pins 2, the newest
    assert waiting.get().version == 2
    # Submitted after the v2 task: an older-first claim that ignored versions would have
    # taken the v2 task before any of these.
    later = [old.submit(NAME, {"i": i}).task_id for i in range(1, 4)]
    with running_worker(old, holder="w-old"):
        wait_for("the v1 tasks to succeed", lambda: _settled(old, later), DEADLINE_S)
        info = waiting.get()
        assert info.state is State.PENDING and info.attempt == 0 and info.holder is None
        with Control(ledger_url) as control:
            report = control.status()
        [view] = [v for v in report.versions if v.version == 2]
        assert (view.name, view.ready, view.live_workers, view.waiting) == (NAME, 1, 0, True)
        assert view.note == "no live worker has version 2"
        assert not [v for v in report.versions if v.version == 1]  # none ready
        shown = CliRunner().invoke(cli, ["status", "--ledger", ledger_url])
        assert shown.exit_code == 0, shown.output
        assert "1 task(s) of ver.run version 2: no live worker has version 2" in shown.output
        with Control(ledger_url) as control:
            views = control.definitions()
        assert [(d.name, d.version, d.live_workers) for d in views] == [(NAME, 1, 1)]
        assert views[0].spec["lease_s"] == 60.0 and views[0].last_registered_age_s >= 0
        listed = CliRunner().invoke(cli, ["definitions", "--ledger", ledger_url, "--json"])
        assert listed.exit_code == 0, listed.output
        [row] = json.loads(listed.output)
        assert (row["name"], row["version"], row["live_workers"]) == (NAME, 1, 1)
        text = CliRunner().invoke(cli, ["definitions", "--ledger", ledger_url])
        assert text.exit_code == 0 and "ver.run" in text.output, text.output
    with running_worker(new, holder="w-new"):
        info = new.wait(waiting.task_id, timeout_s=DEADLINE_S)
        assert info.state is State.SUCCEEDED and info.result["version"] == 2
        with Control(ledger_url) as control:
            assert not [v for v in control.status().versions if v.waiting]
    old.close()
    new.close()


def _group(tmp_path: Path, log: Path, gate: Path, versions: str) -> ProcessGroup:
    return ProcessGroup(tmp_path / "procs", pythonpath=[HERE], cwd=HERE, env={
        "VERSIONS_LOG": str(log), "VERSIONS_GATE": str(gate),
        "VERSIONS_APP_VERSIONS": versions})


def test_a_subprocess_v2_worker_beside_an_in_process_v1_worker(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, gate = tmp_path / "executions.jsonl", tmp_path / "gate"
    monkeypatch.setenv("VERSIONS_LOG", str(log))
    app1, app2 = make_app(ledger_url, [1]), make_app(ledger_url, [2])
    ids = {1: [app1.submit(NAME, {"i": i}).task_id for i in range(6)],
           2: [app2.submit(NAME, {"i": i}).task_id for i in range(6)]}
    with _group(tmp_path, log, gate, "2") as group:
        proc = group.worker("versions_app:app", ledger_url, name="v2", concurrency=2)
        proc.holder(DEADLINE_S)
        assert "tasks ['ver.run v2']" in proc.log()
        with running_worker(app1):
            wait_for("every task to succeed", lambda: _settled(app1, ids[1] + ids[2]),
                     DEADLINE_S)
        proc.stop()
    for version, pid in ((1, os.getpid()), (2, proc.pid)):
        for task_id in ids[version]:
            assert app1.get(task_id).result == {"version": version, "pid": pid}
    app1.close()
    app2.close()


def test_recovery_after_a_crash_runs_the_pinned_version(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, gate = tmp_path / "executions.jsonl", tmp_path / "gate"
    monkeypatch.setenv("VERSIONS_LOG", str(log))
    monkeypatch.setenv("VERSIONS_GATE", str(gate))
    submitter = make_app(ledger_url, [1])
    held = submitter.submit(NAME, {"i": 0, "hold": True}).task_id
    with _group(tmp_path, log, gate, "1") as group:
        proc = group.worker("versions_app:app", ledger_url, name="v1", concurrency=1)
        wait_for("the v1 worker to start the task",
                 lambda: [r for r in _executions(log) if r["task"] == held], DEADLINE_S)
        proc.signal(signal.SIGKILL)
        proc.wait(DEADLINE_S)
    # A worker of the next release has both versions; the crashed task pinned 1 and runs
    # with version 1's function (its lease revoked: the dead holder ran on this host).
    upgraded = make_app(ledger_url, [1, 2])
    fresh = upgraded.submit(NAME, {"i": 1}).task_id  # pins 2
    with running_worker(upgraded):
        info = upgraded.wait(held, timeout_s=DEADLINE_S)
        assert upgraded.wait(fresh, timeout_s=DEADLINE_S).result["version"] == 2
    assert info.state is State.SUCCEEDED and info.version == 1
    assert info.result == {"version": 1, "pid": os.getpid()} and info.attempt == 2
    assert [(r["version"], r["attempt"]) for r in _executions(log) if r["task"] == held] == [
        (1, 1), (1, 2)]
    submitter.close()
    upgraded.close()


def test_definitions_are_registered_and_a_changed_spec_is_audited(
    ledger_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(ledger_url, [1, 2])
    with running_worker(app, holder="w-a"):
        pass
    ledger = open_ledger(ledger_url)
    try:
        stored = {(d.name, d.version): d for d in ledger.definitions(30.0)}
        assert sorted(stored) == [(NAME, 1), (NAME, 2)]
        spec = json.loads(stored[(NAME, 2)].spec_json)
        assert spec["lease_s"] == 60.0 and spec["retry"]["max_attempts"] == 5
        assert spec["params_schema"]["required"] == ["i"]
        assert set(spec["params_schema"]["properties"]) == {"i", "hold"}
        assert all(d.live_workers == 0 for d in stored.values())  # stopped cleanly
        first = stored[(NAME, 2)].first_registered_at
        # Same (name, version), another spec (a longer lease): replaced, audited, logged.
        changed = App(ledger_url)

        @changed.task(name=NAME, version=2, lease_s=90.0)
        def run(ctx: TaskContext, i: int, hold: bool = False) -> None:
            return None

        with caplog.at_level("WARNING", logger="ratchet"), running_worker(changed):
            pass
        assert "definition ver.run version 2 registered with a different lease_s" in caplog.text
        again = {(d.name, d.version): d for d in ledger.definitions(30.0)}
        assert json.loads(again[(NAME, 2)].spec_json)["lease_s"] == 90.0
        assert again[(NAME, 2)].first_registered_at == first
        # The audit row (no task row: read with the engine's own audit statement).
        rows = ledger.dialect.run(  # type: ignore[attr-defined]
            lambda tx: tx.rows("timeline_audit", {"id": f"definition:{NAME}:2"}), write=False)
        [row] = [r for r in rows if r[3] == "definition_changed"]
        detail = json.loads(row[8])
        assert detail["differences"] == ["lease_s", "retry"] and row[7]  # the worker
        changes = ledger.register_definitions("tool", [DefinitionSpec(NAME, 2, "{}")])
        assert [(c.name, c.version) for c in changes] == [(NAME, 2)]
        assert "lease_s" in changes[0].differences
    finally:
        ledger.close()
    app.close()
    changed.close()


def test_cli_submit_pins_the_given_version(
    ledger_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vcli_app.py").write_text(
        "from versions_app import make_app\napp = make_app(None, [1, 2])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("vcli_app", None)
    runner = CliRunner()
    ids = {}
    for extra, version in (([], 2), (["--task-version", "1"], 1)):
        sys.modules.pop("vcli_app", None)  # each command loads (and configures) the app
        out = runner.invoke(cli, ["submit", "vcli_app:app", NAME, "--ledger", ledger_url,
                                  "--params", '{"i": 1}', "--json", *extra])
        assert out.exit_code == 0, out.output
        ids[version] = json.loads(out.output)["task_id"]
    sys.modules.pop("vcli_app", None)
    bad = runner.invoke(cli, ["submit", "vcli_app:app", NAME, "--ledger", ledger_url,
                              "--params", '{"i": 1}', "--task-version", "9"])
    assert bad.exit_code == 2 and "'ver.run' version 9" in bad.output, bad.output
    with Control(ledger_url) as control:
        assert {v: control.get(i).version for v, i in ids.items()} == {1: 1, 2: 2}
    sys.modules.pop("vcli_app", None)


def _before_definitions(backend: str) -> list[Any]:
    from ratchet.ledger.migrations import load_migrations

    migrations = load_migrations(backend)
    cut = next(i for i, m in enumerate(migrations) if m.name.endswith("_definitions.sql"))
    return migrations[:cut]


def test_status_of_a_ledger_not_yet_migrated_to_definitions(
    backend: str, ledger_url: str, tmp_path: Path
) -> None:
    """A newer ``ratchet status`` / ``definitions`` (read-only: it never migrates) on a
    ledger that only processes of the previous release have used: no definitions, no SQL
    error; status, which needs the newer counts tables, says to migrate."""
    import sqlite3

    import psycopg
    from psycopg import sql

    from ratchet.config import parse_ledger_url
    from ratchet.ledger.migrations import split_statements

    older = _before_definitions(backend)
    if backend == "sqlite":
        conn = sqlite3.connect(parse_ledger_url(ledger_url).path)
        for migration in older:
            for statement in split_statements(migration.sql):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {migration.version}")
        conn.commit()
        conn.close()
    else:
        schema = parse_ledger_url(ledger_url).options["schema"]
        with psycopg.connect(ledger_url.split("?", 1)[0], autocommit=True) as pg:
            pg.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for migration in older:
                pg.execute(migration.sql.encode("utf-8"))
            pg.execute("INSERT INTO schema_version (version) VALUES (%s)", (older[-1].version,))
    with Control(ledger_url) as control:
        assert control.definitions() == []
        # status needs the retention schema (its counts): a clear error, nothing changed.
        with pytest.raises(SchemaTooOld, match="ratchet migrate"):
            control.status()
    shown = CliRunner().invoke(cli, ["status", "--ledger", ledger_url])
    assert shown.exit_code == 2, shown.output
    assert "ratchet migrate" in shown.output
