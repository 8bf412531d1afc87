"""Ledger-level faults, each on both dialects where it applies: undecodable stored
data affects only its own task; a write the database refuses is ``WriteRejected``, not an
outage; a SQLite file that holds no ledger is refused untouched; a new SQLite ledger is
private to its owner; renewing a lease is a registry heartbeat too."""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg import sql

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.errors import LedgerCorrupt, LedgerUnavailable, WriteRejected
from ratchet.ledger.base import (
    EffectState,
    EffectWrite,
    NewTask,
    TaskWrite,
    Transition,
    WorkerInfo,
)
from ratchet.serde import Undecodable, digest, dumps
from ratchet.states import State
from ratchet.storedtext import UndecodableText, is_undecodable
from ratchet.testing import wait_for

NAME = "faults.task"
BAD_UTF8 = "CAST(X'7B226E223AFF7D' AS TEXT)"
"""``{"n":<0xFF>}``: text whose bytes are not UTF-8 (SQLite stores whatever it is given)."""


def _task(max_attempts: int = 3, **kw: Any) -> NewTask:
    params = dumps({"n": 1})
    return NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), None,
                   kw.pop("max_attempts_raw", max_attempts), 30.0, **kw)


@contextmanager
def _raw_sql(url: str) -> Iterator[Any]:
    """A raw connection to the store behind ``url`` (SQLite file or PostgreSQL schema)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
        return
    schema = parse_qs(urlsplit(url).query)["schema"][0]
    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        yield conn


def _corrupt(url: str, backend: str, task_id: str) -> None:
    """Make every stored JSON field of ``task_id`` undecodable (and last_error, on SQLite)."""
    bad = BAD_UTF8 if backend == "sqlite" else "'{oops'"
    mark = "?" if backend == "sqlite" else "%s"
    with _raw_sql(url) as conn:
        conn.execute(f"UPDATE tasks SET params = {bad}, result = {bad} WHERE id = {mark}",
                     (task_id,))
        if backend == "sqlite":
            conn.execute(f"UPDATE tasks SET last_error = {bad} WHERE id = ?", (task_id,))
        conn.execute(f"UPDATE steps SET result = {bad} WHERE task_id = {mark}", (task_id,))
        conn.execute(f"UPDATE effects SET result = {bad} WHERE task_id = {mark}", (task_id,))


def test_undecodable_stored_data_affects_only_its_own_task(
    ledger_url: str, backend: str
) -> None:
    ledger = open_ledger(ledger_url)
    try:
        bad, good = _task(), _task()
        ledger.submit([bad])
        [first] = ledger.claim("a", [NAME], 1)
        write = TaskWrite(
            bad.task_id, first.generation, "a", "step:s", steps=[("s", dumps(1))],
            effects=[EffectWrite("pay", "k1", "d", EffectState.DONE, dumps({"id": 1}))],
            transition=Transition(State.RETRY_WAIT, error="boom", error_class="transient"),
        )
        assert ledger.commit([write])[0].ok
        ledger.submit([good])
        _corrupt(ledger_url, backend, bad.task_id)

        # The claim hands both rows over; the undecodable one keeps its stored text.
        claims = {c.task_id: c for c in ledger.claim("b", [NAME], 10)}
        assert set(claims) == {bad.task_id, good.task_id}
        assert claims[good.task_id].params_json == dumps({"n": 1})
        resumed = claims[bad.task_id]
        assert resumed.steps["s"].result_json and resumed.effects["pay"].result_json
        if backend == "sqlite":
            # the bad byte, kept as stored and shown as an escape
            assert is_undecodable(resumed.params_json)
            assert isinstance(resumed.params_json, UndecodableText)
            assert resumed.params_json.stored == b'{"n":\xff}'
            assert "\\xff" in resumed.params_json
        else:
            assert resumed.params_json == "{oops"

        for info in (ledger.get(bad.task_id), *ledger.get_many([bad.task_id, good.task_id])):
            if info.task_id == bad.task_id:
                assert isinstance(info.params, Undecodable)
                assert isinstance(info.result, Undecodable)
                info.params.text.encode("utf-8")  # printable
            else:
                assert info.params == {"n": 1}
        timeline = ledger.timeline(bad.task_id)
        assert [s.name for s in timeline.steps] == ["s"]
        assert isinstance(timeline.task.params, Undecodable)
        assert ledger.stats().counts[NAME] == {"RUNNING": 2}

        # The worker fails the task with an error quoting the bad text (a message it
        # composes, as serde.loads does): stored printable.
        failed = TaskWrite(bad.task_id, resumed.generation, "b", "complete",
                           transition=Transition(State.FAILED,
                                                 error=f"not JSON: {resumed.params_json}",
                                                 error_class="undecodable"))
        assert ledger.commit([failed])[0].ok
        stored = ledger.get(bad.task_id).last_error
        assert stored is not None
        stored.encode("utf-8")
        if backend == "sqlite":
            with _raw_sql(ledger_url) as conn:
                raw = conn.execute("SELECT CAST(last_error AS BLOB) FROM tasks WHERE id = ?",
                                   (bad.task_id,)).fetchone()[0]
            raw.decode("utf-8")  # valid UTF-8 on disk: nothing surrogate-escaped written back
    finally:
        ledger.close()


def test_a_refused_value_is_write_rejected_not_an_outage(ledger_url: str) -> None:
    """``max_attempts=nan``: SQLite stores NULL (NOT NULL fails), PostgreSQL cannot cast it
    to integer. Either way the write is refused for its content; the ledger stays usable."""
    ledger = open_ledger(ledger_url)
    try:
        with pytest.raises(WriteRejected, match="submit_insert"):
            ledger.submit([_task(max_attempts_raw=float("nan"))])
        assert ledger.submit([_task()])[0].created
    finally:
        ledger.close()


def test_a_10kb_step_name_is_write_rejected_naming_the_write(ledger_url: str,
                                                             backend: str) -> None:
    ledger = open_ledger(ledger_url)
    try:
        ledger.submit([_task()])
        [claim] = ledger.claim("a", [NAME], 1)
        huge = secrets.token_hex(5000)  # 10,000 characters that do not compress
        write = TaskWrite(claim.task_id, claim.generation, "a", "step:huge",
                          steps=[(huge, dumps(1))])
        if backend == "postgresql":
            # Over the btree row limit of steps_pkey: refused, and reported as such, naming
            # the statement and the write.
            with pytest.raises(WriteRejected, match="steps_upsert") as caught:
                ledger.commit([write])
            assert not isinstance(caught.value, LedgerUnavailable)
            assert "index row" in str(caught.value) and "'step:huge'" in str(caught.value)
        else:
            assert ledger.commit([write])[0].ok  # SQLite has no such limit
        ok = TaskWrite(claim.task_id, claim.generation, "a", "step:small",
                       steps=[("small", dumps(2))])
        assert ledger.commit([ok])[0].ok  # the ledger is not "unreachable"
    finally:
        ledger.close()


def test_renew_touches_the_registry_heartbeat(ledger_url: str) -> None:
    ledger = open_ledger(ledger_url)
    try:
        ledger.register_worker(WorkerInfo("w1", "host", "hostname", os.getpid(), None))
        [before] = ledger.list_workers()
        wait_for("the ledger clock to pass the registration",
                 lambda: ledger.now() > before.last_seen, timeout_s=5, interval_s=0.01)
        ledger.submit([_task()])
        [claim] = ledger.claim("w1", [NAME], 1)
        [renewed] = ledger.renew("w1", [(claim.task_id, claim.generation)])
        assert renewed.ok
        [after] = ledger.list_workers()
        assert after.last_seen > before.last_seen
        assert after.last_seen == pytest.approx(renewed.ledger_now, abs=1e-3)
    finally:
        ledger.close()


# ---------------------------------------------------------------------- SQLite files


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("user_version", [0, 1, 2, 3])
def test_sqlite_file_without_a_ledger_is_refused_untouched(
    tmp_path: Path, user_version: int
) -> None:
    """Also when the application numbers its own schema with a user_version Ratchet knows:
    the file is not switched to WAL, migrated or reported as a ledger."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.execute(f"PRAGMA user_version = {user_version}")
    conn.commit()
    conn.close()
    before = _digest(path)
    for kwargs in ({"must_exist": True}, {"migrate": False}, {}):
        with pytest.raises(LedgerUnavailable,
                           match=r"holds no Ratchet ledger \(tables: orders, users\)"):
            open_ledger(f"sqlite:///{path}", **kwargs)
    assert _digest(path) == before
    assert sorted(os.listdir(tmp_path)) == ["app.db"]


def test_an_empty_sqlite_file_is_a_truncated_ledger_never_a_new_one(tmp_path: Path) -> None:
    # Ratchet links a new ledger into place whole: an empty file was truncated.
    path = tmp_path / "empty.db"
    path.touch()
    for kwargs in ({"must_exist": True}, {"migrate": False}, {}):
        with pytest.raises(LedgerCorrupt, match="the file is empty"):
            open_ledger(f"sqlite:///{path}", **kwargs)
    assert path.stat().st_size == 0
    assert sorted(os.listdir(tmp_path)) == ["empty.db"]


def test_a_new_sqlite_ledger_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)  # a usual umask: files would be 0644
    try:
        path = tmp_path / "private.db"
        ledger = open_ledger(f"sqlite:///{path}")
        try:
            ledger.submit([_task()])
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            for file in files:
                assert file.exists(), file
                assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
        finally:
            ledger.close()
    finally:
        os.umask(old_umask)


def test_sqlite_errors_never_show_a_password_of_the_url(tmp_path: Path) -> None:
    from ratchet.config import LedgerConfig

    url = f"sqlite://user:s3cret@localhost/{tmp_path}/missing.db"
    config = LedgerConfig(url, "sqlite", str(tmp_path / "missing.db"))
    with pytest.raises(LedgerUnavailable) as caught:
        open_ledger(config, must_exist=True)
    assert "s3cret" not in str(caught.value) and "missing.db" in str(caught.value)
    (tmp_path / "foreign.db").write_bytes(b"")
    sqlite3.connect(tmp_path / "foreign.db").execute("CREATE TABLE t (x)").connection.close()
    config = LedgerConfig(url, "sqlite", str(tmp_path / "foreign.db"))
    with pytest.raises(LedgerUnavailable) as caught:
        open_ledger(config)
    assert "s3cret" not in str(caught.value) and "holds no Ratchet ledger" in str(caught.value)
