"""The SQLite ledger's file itself (real files, real processes): a new ledger appears at its
path only whole (built in a temporary file and linked into place), so an existing empty
file was truncated and is :class:`~ratchet.LedgerCorrupt`, never migrated into a new,
empty ledger (lost history, reset idempotency keys); two processes creating one path at
once end up on the same ledger; and workers whose file is truncated under them notice
(their connections would go on with what they cached) and exit with
:data:`~ratchet.errors.EXIT_LEDGER_CORRUPT`."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ratchet import App, LedgerCorrupt, LedgerUnavailable, TaskContext, open_ledger
from ratchet.errors import EXIT_LEDGER_CORRUPT
from ratchet.ledger.sqlitefile import create_whole
from ratchet.testing.processes import ProcessGroup, clean_env, wait_for

pytestmark = pytest.mark.timeout(180)

MODULE = '''
import ratchet

app = ratchet.App()


@app.task(name="lf.echo")
def echo(ctx, n):
    return {"n": n}
'''

OPENER = '''
import sys, time
from pathlib import Path
import ratchet

go = Path(sys.argv[2])
(go.parent / f"ready-{sys.argv[3]}").touch()
while not go.exists():
    time.sleep(0.001)
app = ratchet.App(sys.argv[1])


@app.task(name="lf.echo")
def echo(ctx, n):
    return {"n": n}


print(app.submit("lf.echo", {"n": 1}, idempotency_key=sys.argv[3]).task_id)
'''


def _make_app(url: str) -> App:
    app = App(url)

    @app.task(name="lf.echo")
    def echo(ctx: TaskContext, n: int) -> dict[str, int]:
        return {"n": n}

    return app


def _ledger_with_tasks(path: Path, n: int = 5) -> list[str]:
    app = _make_app(f"sqlite:///{path}")
    try:
        return [app.submit("lf.echo", {"n": i}, idempotency_key=f"k{i}").task_id
                for i in range(n)]
    finally:
        app.close()


def _truncate(path: Path) -> None:
    """What the tester did: ``: > l.db; rm -f l.db-wal l.db-shm``."""
    with open(path, "w"):
        pass
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ratchet.cli.main", *args],
                          capture_output=True, text=True, env=clean_env({}), timeout=60,
                          check=False)


def test_a_truncated_ledger_is_corrupt_and_never_becomes_a_new_one(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    url = f"sqlite:///{db}"
    _ledger_with_tasks(db)
    _truncate(db)
    for kwargs in ({"must_exist": True, "migrate": False}, {"migrate": False}, {}):
        with pytest.raises(LedgerCorrupt, match="the file is empty") as caught:
            open_ledger(url, **kwargs)
        assert "delete the file" in str(caught.value) and "restore it from a backup" in str(
            caught.value)
    app = _make_app(url)
    with pytest.raises(LedgerCorrupt):
        app.submit("lf.echo", {"n": 9}, idempotency_key="k0")
    app.close()
    done = _cli("status", "--ledger", url)
    assert done.returncode == EXIT_LEDGER_CORRUPT, (done.stdout, done.stderr)
    (message,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert message.startswith("error: LedgerCorrupt: ") and "the file is empty" in message
    assert db.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["l.db"], "nothing may be created next to it"


def test_a_worker_started_on_a_truncated_ledger_exits_corrupt(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "lfapp.py").write_text(MODULE)
    db = tmp_path / "l.db"
    _ledger_with_tasks(db)
    _truncate(db)
    with ProcessGroup(tmp_path / "logs", pythonpath=[project]) as group:
        worker = group.worker("lfapp:app", f"sqlite:///{db}")
        assert worker.wait(timeout_s=60) == EXIT_LEDGER_CORRUPT, group.dump()
    assert "the file is empty" in worker.log()
    assert db.stat().st_size == 0


def test_a_sqlite_file_without_tables_is_refused_untouched(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    sqlite3.connect(db).execute("VACUUM").connection.close()  # a header, no schema
    before = db.read_bytes()
    assert before.startswith(b"SQLite format 3\x00")
    for kwargs in ({"must_exist": True}, {"migrate": False}, {}):
        with pytest.raises(LedgerUnavailable, match=r"holds no Ratchet ledger \(tables: none\)"):
            open_ledger(f"sqlite:///{db}", **kwargs)
    assert db.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["l.db"]


def test_a_new_ledger_is_linked_into_place_whole(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    ledger = open_ledger(f"sqlite:///{db}", migrate=False)  # creation needs no migrate
    try:
        assert ledger.schema_version() == ledger.latest_version  # type: ignore[attr-defined]
    finally:
        ledger.close()
    leftovers = [name for name in os.listdir(tmp_path) if not name.startswith("l.db")]
    assert leftovers == [], "the temporary file is removed"

    def fails(temp: str) -> None:
        Path(temp).write_bytes(b"SQLite format 3\x00half made")
        raise RuntimeError("the build failed half way")

    other = tmp_path / "other.db"
    with pytest.raises(RuntimeError):
        create_whole(str(other), fails)
    assert not other.exists()
    assert not create_whole(str(db), lambda temp: None)  # a file is there: left alone
    assert [name for name in os.listdir(tmp_path) if not name.startswith("l.db")] == [], (
        "nothing half made is left")


@pytest.mark.parametrize("attempt", range(3))
def test_processes_creating_one_ledger_at_once_share_it(tmp_path: Path, attempt: int
                                                        ) -> None:
    db = tmp_path / "l.db"
    go = tmp_path / "go"
    script = tmp_path / "opener.py"
    script.write_text(OPENER)
    procs = [subprocess.Popen([sys.executable, str(script), f"sqlite:///{db}", str(go),
                               f"key{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=clean_env({}))
             for i in range(4)]
    try:
        # Each process has imported Ratchet and waits for the go file: then all create.
        wait_for("the openers to be ready", lambda: all(
            (tmp_path / f"ready-key{i}").exists() for i in range(4)), timeout_s=60)
        go.touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 4, outputs
    task_ids = {out.strip() for out, _ in outputs}
    ledger = open_ledger(f"sqlite:///{db}", must_exist=True)
    try:
        assert {ledger.get(task_id).task_id for task_id in task_ids  # type: ignore[union-attr]
                } == task_ids, "every process's task is in the one ledger"
    finally:
        ledger.close()
    assert [name for name in os.listdir(tmp_path) if name.startswith(".")] == [], (
        "every temporary file is removed")


@pytest.mark.parametrize("attempt", range(3))
def test_running_workers_exit_corrupt_when_the_file_is_truncated(
    tmp_path: Path, attempt: int
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "lfapp.py").write_text(MODULE)
    db = tmp_path / "l.db"
    url = f"sqlite:///{db}"
    app = _make_app(url)
    handles = [app.submit("lf.echo", {"n": i}) for i in range(6)]
    with ProcessGroup(tmp_path / "logs", pythonpath=[project]) as group:
        workers = [group.worker("lfapp:app", url, name=f"w{i}") for i in range(2)]
        for handle in handles:
            handle.wait(timeout_s=60)
        for worker in workers:
            worker.holder()  # running and polling
        app.close()
        _truncate(db)
        for worker in workers:
            assert worker.wait(timeout_s=30) == EXIT_LEDGER_CORRUPT, group.dump()
    for worker in workers:
        said = [line for line in worker.log().splitlines() if "is corrupt" in line]
        # Whichever sees it first: the dialect's look at the file, or SQLite reading it
        # (not a database any more, or a page read short from a connection's cache).
        assert len(said) == 1, worker.log()
        assert any(sign in said[0] for sign in
                   ("the file is empty", "SQLITE_NOTADB", "SQLITE_CORRUPT")), worker.log()
        assert "Traceback" not in worker.log()


def test_an_open_ledger_notices_its_file_replaced_or_removed(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    _ledger_with_tasks(db)
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)
    ledger = open_ledger(f"sqlite:///{db}", must_exist=True)
    try:
        assert ledger.claim("h", ["lf.echo"], 1)
        os.replace(copy, db)  # a restore by rename under an open ledger
        with pytest.raises(LedgerCorrupt, match="replaced while in use"):
            wait_for("the replacement to be noticed", lambda: ledger.now() < 0, timeout_s=10)
        assert ledger.corruption is not None
        with pytest.raises(LedgerCorrupt, match="replaced while in use"):
            ledger.claim("h", ["lf.echo"], 1)  # and every later call
    finally:
        ledger.close()
    ledger = open_ledger(f"sqlite:///{db}", must_exist=True)
    try:
        assert ledger.claim("h", ["lf.echo"], 1)
        os.unlink(db)
        with pytest.raises(LedgerCorrupt, match="removed while in use"):
            wait_for("the removal to be noticed", lambda: ledger.now() < 0, timeout_s=10)
    finally:
        ledger.close()


def test_a_new_connection_to_a_truncated_file_fails_at_once(tmp_path: Path) -> None:
    # A thread's first connection, to a file truncated a moment after another thread
    # looked at it, would otherwise wait for the open connections' locks (the busy
    # timeout) to write a new, empty database into the file.
    db = tmp_path / "l.db"
    _ledger_with_tasks(db)
    ledger = open_ledger(f"sqlite:///{db}", must_exist=True)
    try:
        ledger.now()  # this thread's connection, and a look at the file
        _truncate(db)
        caught: list[BaseException] = []

        def first_use() -> None:
            try:
                ledger.now()
            except BaseException as exc:
                caught.append(exc)

        thread = threading.Thread(target=first_use)
        started = time.monotonic()
        thread.start()
        thread.join(timeout=60)
        assert time.monotonic() - started < 5
        assert len(caught) == 1 and isinstance(caught[0], LedgerCorrupt), caught
        assert db.stat().st_size == 0
    finally:
        ledger.close()


def test_looking_at_the_file_keeps_the_locks_of_open_connections(tmp_path: Path) -> None:
    """The dialect's periodic look at its file must not open and close it: closing any
    descriptor of a file drops every POSIX lock the process holds on it, SQLite's
    included, and another process closing its last connection would then take itself for
    the last user and delete the -wal and -shm files under the open connections."""
    db = tmp_path / "l.db"
    url = f"sqlite:///{db}"
    ledger = open_ledger(url)
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # past several looks at the file
            ledger.stats()
        other = (
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1]); c.execute('SELECT count(*) FROM tasks')"
            ".fetchone(); c.close()\n"
        )
        subprocess.run([sys.executable, "-c", other, str(db)], check=True, timeout=60)
        assert (tmp_path / "l.db-wal").exists() and (tmp_path / "l.db-shm").exists(), (
            "another process's close took this one's connections for gone")
        ledger.stats()
    finally:
        ledger.close()
