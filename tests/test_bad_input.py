"""Bad input through the public API: every refusal is a typed error with a useful message,
and a refused submission leaves the ledger exactly as it was."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ratchet import App, RetryPolicy, SubmitRequest, TaskContext, open_ledger
from ratchet.config import DEFAULT_MAX_PAYLOAD_BYTES
from ratchet.errors import (
    ConfigError,
    IdempotencyConflict,
    InvalidArguments,
    LedgerUnavailable,
    PayloadNotSerializable,
    PayloadTooLarge,
    SchemaTooNew,
    SubmitError,
    UnknownTask,
)

# ---------------------------------------------------------------------- helpers


def make_app(tmp_path: Path, **kwargs: Any) -> App:
    app = App(f"sqlite:///{tmp_path}/l.db", **kwargs)

    @app.task(name="billing.charge")
    def charge(ctx: TaskContext, order_id: str, amount_cents: int, note: str = "") -> str:
        return order_id

    @app.task(name="mail.send")
    def send(ctx: TaskContext, to: str) -> None:
        return None

    @app.task(name="blob.store")
    def store(ctx: TaskContext, blob: Any) -> None:
        return None

    return app


@pytest.fixture
def app(tmp_path: Path) -> Iterator[App]:
    app = make_app(tmp_path)
    # One accepted task, so "unchanged" is checked against a non-empty ledger.
    app.submit("billing.charge", {"order_id": "o-0", "amount_cents": 1}, idempotency_key="o-0")
    yield app
    app.close()


STATUS_ROLLUP = {"counts_mark", "finished_counts", "audit_counts"}
"""The counts rollup behind ``ratchet status`` (DESIGN §10.2): a cache that status itself
moves forward (it summarises rows, holds none of its own), so not compared."""


def raw_rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table but the status rollup, read through a separate read-only
    connection."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in tables
            if t != "sqlite_sequence" and t not in STATUS_ROLLUP
        }
    finally:
        conn.close()


class Unchanged:
    """Context manager: the ledger's rows and stats are the same after the block.

    With ``conflicts=n`` the only change allowed is ``n`` new ``idempotency_conflict``
    audit rows (a conflict is refused, but counted).
    """

    def __init__(self, app: App, tmp_path: Path, conflicts: int = 0) -> None:
        self.app = app
        self.path = tmp_path / "l.db"
        self.conflicts = conflicts

    def __enter__(self) -> Unchanged:
        self.counts = self.app.ledger.stats().counts
        self.rows = raw_rows(self.path)
        assert self.rows["tasks"], "fixture should have written a task"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.app.ledger.stats().counts == self.counts
        rows = raw_rows(self.path)
        new_audit = [r for r in rows.pop("audit") if r not in self.rows["audit"]]
        assert [r[3] for r in new_audit] == ["idempotency_conflict"] * self.conflicts
        assert rows == {k: v for k, v in self.rows.items() if k != "audit"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------- submit refusals


def test_refusals_are_submit_errors() -> None:
    for cls in (
        UnknownTask,
        InvalidArguments,
        PayloadNotSerializable,
        PayloadTooLarge,
        IdempotencyConflict,
    ):
        assert issubclass(cls, SubmitError)


def test_unknown_task_lists_registered_names(app: App, tmp_path: Path) -> None:
    with Unchanged(app, tmp_path), pytest.raises(UnknownTask) as info:
        app.submit("billing.chrage", {"order_id": "o-1", "amount_cents": 5})
    message = str(info.value)
    assert "billing.chrage" in message
    for name in ("billing.charge", "mail.send", "blob.store"):
        assert name in message
    assert info.value.known == ["billing.charge", "blob.store", "mail.send"]


def test_unknown_task_on_empty_registry(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path}/l.db")
    with pytest.raises(UnknownTask, match="none registered"):
        app.submit("anything")
    # Nothing was even opened: a refused submit does not create a ledger file.
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize(
    "blob",
    [
        object(),
        b"raw bytes",
        {1, 2, 3},
        float("nan"),
        float("inf"),
        {"nested": [1, {"deep": object()}]},
        {(1, 2): "tuple key"},
    ],
    ids=["object", "bytes", "set", "nan", "inf", "nested-object", "tuple-key"],
)
def test_params_not_json_are_refused(app: App, tmp_path: Path, blob: Any) -> None:
    with Unchanged(app, tmp_path), pytest.raises(PayloadNotSerializable) as info:
        app.submit("blob.store", {"blob": blob})
    assert "blob.store" in str(info.value)
    assert "JSON" in str(info.value)


def test_non_string_dict_keys_are_refused(app: App, tmp_path: Path) -> None:
    # serde promises to refuse non-string keys: json would silently turn 1 into "1", so the
    # task would see other params than were submitted ({1: ..} and {"1": ..} collide).
    with Unchanged(app, tmp_path), pytest.raises(PayloadNotSerializable):
        app.submit("blob.store", {"blob": {1: "one"}})


def test_payload_over_configured_limit(tmp_path: Path) -> None:
    app = make_app(tmp_path, max_payload_bytes=100)
    app.submit("billing.charge", {"order_id": "o-0", "amount_cents": 1})
    # {"blob":"..."} is 11 bytes of JSON around the string.
    app.submit("blob.store", {"blob": "x" * (100 - 11)})  # exactly at the limit: accepted
    with Unchanged(app, tmp_path), pytest.raises(PayloadTooLarge) as info:
        app.submit("blob.store", {"blob": "x" * (100 - 10)})
    assert info.value.size_bytes == 101
    assert info.value.limit_bytes == 100
    assert "101" in str(info.value) and "100" in str(info.value)
    app.close()


def test_payload_limit_counts_utf8_bytes(tmp_path: Path) -> None:
    app = make_app(tmp_path, max_payload_bytes=100)
    app.submit("billing.charge", {"order_id": "o-0", "amount_cents": 1})
    with Unchanged(app, tmp_path), pytest.raises(PayloadTooLarge):
        app.submit("blob.store", {"blob": "é" * 45})  # 45 characters, 90 bytes + 11
    app.close()


def test_payload_over_default_limit_of_one_mebibyte(app: App, tmp_path: Path) -> None:
    assert app.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    with Unchanged(app, tmp_path), pytest.raises(PayloadTooLarge):
        app.submit("blob.store", {"blob": "x" * DEFAULT_MAX_PAYLOAD_BYTES})
    handle = app.submit("blob.store", {"blob": "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 11)})
    assert handle.created


def test_payload_limit_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_MAX_PAYLOAD_BYTES", "50")
    app = make_app(tmp_path)
    assert app.max_payload_bytes == 50
    with pytest.raises(PayloadTooLarge):
        app.submit("blob.store", {"blob": "x" * 50})
    app.close()


@pytest.mark.parametrize("value", ["0", "-5", "lots"])
def test_bad_payload_limit_from_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RATCHET_MAX_PAYLOAD_BYTES", value)
    with pytest.raises(ConfigError):
        make_app(tmp_path)


@pytest.mark.parametrize("limit", [0, -1])
def test_bad_payload_limit_argument(tmp_path: Path, limit: int) -> None:
    with pytest.raises(ConfigError):
        make_app(tmp_path, max_payload_bytes=limit)


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"order_id": "o-1"}, "amount_cents"),  # missing
        ({"order_id": "o-1", "amount_cents": 1, "coupon": "X"}, "coupon"),  # unexpected
        ({}, "order_id"),
        ({"order_id": "o-1", "amount_cents": 1, "ctx": None}, "ctx"),  # clashes with ctx
    ],
)
def test_params_not_matching_signature(
    app: App, tmp_path: Path, params: dict[str, Any], fragment: str
) -> None:
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments) as info:
        app.submit("billing.charge", params)
    assert "billing.charge" in str(info.value)
    assert fragment in str(info.value)


def test_same_key_different_params(app: App, tmp_path: Path) -> None:
    conflicts = app.ledger.stats().idempotency_conflicts
    with Unchanged(app, tmp_path, conflicts=1), pytest.raises(IdempotencyConflict) as info:
        app.submit(
            "billing.charge", {"order_id": "o-0", "amount_cents": 999}, idempotency_key="o-0"
        )
    assert info.value.key == "o-0"
    assert info.value.existing_digest != info.value.new_digest
    assert app.ledger.stats().idempotency_conflicts == conflicts + 1
    # Same key, same params: the original task, nothing new.
    with Unchanged(app, tmp_path):
        again = app.submit(
            "billing.charge", {"order_id": "o-0", "amount_cents": 1}, idempotency_key="o-0"
        )
    assert again.created is False


def test_same_key_default_params_spelled_out_is_still_a_conflict_free_resubmit(
    app: App, tmp_path: Path
) -> None:
    # Param order in the dict must not change the digest.
    first = app.submit(
        "billing.charge", {"amount_cents": 5, "order_id": "o-9"}, idempotency_key="o-9"
    )
    again = app.submit(
        "billing.charge", {"order_id": "o-9", "amount_cents": 5}, idempotency_key="o-9"
    )
    assert again.task_id == first.task_id
    assert again.created is False


def test_naive_datetime_run_at(app: App, tmp_path: Path) -> None:
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments, match="timezone"):
        app.submit("mail.send", {"to": "a@b.c"}, run_at=datetime.now() + timedelta(minutes=1))
    # An aware datetime is fine.
    handle = app.submit("mail.send", {"to": "a@b.c"}, run_at=datetime.now(UTC) + timedelta(1))
    assert handle.get().run_at > app.ledger.now() + 3600


@pytest.mark.parametrize("run_at", [float("nan"), "2030-01-01T00:00:00Z"], ids=["nan", "str"])
def test_malformed_run_at(app: App, tmp_path: Path, run_at: Any) -> None:
    # A bad run_at is the caller's mistake: a SubmitError, not a driver error (NaN reaches
    # SQLite as NULL) or a bare ValueError from float().
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments):
        app.submit("mail.send", {"to": "a@b.c"}, run_at=run_at)


def test_empty_idempotency_key(app: App, tmp_path: Path) -> None:
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments):
        app.submit("mail.send", {"to": "a@b.c"}, idempotency_key="")


def test_one_bad_request_refuses_the_whole_batch(app: App, tmp_path: Path) -> None:
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments):
        app.submit_many(
            [
                SubmitRequest("mail.send", {"to": "a@b.c"}),
                SubmitRequest("billing.charge", {"order_id": "o-2", "amount_cents": 1}),
                SubmitRequest("mail.send", {"too": "typo"}),
            ]
        )
    with Unchanged(app, tmp_path, conflicts=1), pytest.raises(IdempotencyConflict):
        app.submit_many(
            [
                SubmitRequest("mail.send", {"to": "a@b.c"}),
                SubmitRequest(
                    "billing.charge", {"order_id": "o-0", "amount_cents": 2}, idempotency_key="o-0"
                ),
            ]
        )


@pytest.mark.parametrize(
    "key",
    ["k\udcff", "k\x00", "k" * 1025, 7, b"key"],
    ids=["surrogate", "nul", "long", "int", "bytes"],
)
def test_bad_idempotency_keys_are_refused_before_the_ledger(
    app: App, tmp_path: Path, key: Any
) -> None:
    with Unchanged(app, tmp_path), pytest.raises(InvalidArguments, match="idempotency_key"):
        app.submit("mail.send", {"to": "a@b.c"}, idempotency_key=key)


def test_deeply_nested_params_are_refused_with_a_ratchet_error(app: App, tmp_path: Path) -> None:
    deep: Any = "leaf"
    for _ in range(60_000):
        deep = {"a": deep}
    with Unchanged(app, tmp_path), pytest.raises(PayloadNotSerializable, match="levels deep"):
        app.submit("blob.store", {"blob": deep})
    ok: Any = "leaf"
    for _ in range(150):
        ok = [ok]
    app.submit("blob.store", {"blob": ok})  # moderately deep JSON is fine


def test_submit_many_takes_a_generator_once(app: App) -> None:
    # A generator is read once: every request is submitted, none silently dropped.
    handles = app.submit_many(
        SubmitRequest("mail.send", {"to": f"u{i}@b.c"}) for i in range(3)
    )
    assert len(handles) == 3
    assert sorted(app.get(h.task_id).params["to"] for h in handles) == [
        "u0@b.c", "u1@b.c", "u2@b.c"
    ]


# ---------------------------------------------------------------------- task definitions


@pytest.mark.parametrize(
    "name",
    ["bad\ud800", "bad\x00name", "", "n" * 201, 42],
    ids=["surrogate", "nul", "empty", "too-long", "not-str"],
)
def test_task_names_the_ledger_cannot_store_are_refused_at_registration(
    app: App, tmp_path: Path, name: Any
) -> None:
    known = dict(app.tasks)
    with pytest.raises(InvalidArguments, match="task name"):

        @app.task(name=name)
        def task(ctx: TaskContext) -> None:
            return None

    assert app.tasks == known  # nothing registered: the worker's claims stay healthy


@pytest.mark.parametrize("lease_s", [0.001, 0.5, 0.999, 0, -1, float("nan"), float("inf"), "15"])
def test_leases_below_the_minimum_are_refused_at_definition(app: App, lease_s: Any) -> None:
    from ratchet.app import MIN_LEASE_S

    with pytest.raises(ConfigError, match="lease_s"):
        app.task(name="t.short", lease_s=lease_s)
    assert "t.short" not in app.tasks
    assert MIN_LEASE_S == 1.0


def test_minimum_lease_is_accepted(app: App) -> None:
    @app.task(name="t.min", lease_s=1.0)
    def short(ctx: TaskContext) -> None:
        return None

    assert app.definition("t.min").lease_s == 1.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": float("nan")}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"base_delay_s": float("nan")}, "base_delay_s"),
        ({"jitter": 1.5}, "jitter"),
    ],
)
def test_bad_retry_policies_never_reach_submit(
    app: App, tmp_path: Path, kwargs: dict[str, Any], field: str
) -> None:
    # Today's fault: RetryPolicy(max_attempts=nan) was accepted and submit then failed with
    # a raw "NOT NULL constraint failed". Refused where it is written, naming the field.
    with pytest.raises(ConfigError, match=f"RetryPolicy.{field}"):
        RetryPolicy(**kwargs)


# ---------------------------------------------------------------------- ledger URLs


@pytest.mark.parametrize(
    "url",
    [
        "mysql://x",
        "redis://localhost/0",
        "sqlite://host/x.db",
        "sqlite:///",
        "sqlite://",
        "",
        "   ",
        "ratchet.db",
        "sqlite:///x.db?durability=bogus",
        "sqlite:///x.db?durability=replicated",
        "sqlite:///x.db?busy_timeout_s=abc",
        "sqlite:///x.db?busy_timeout_s=-1",
    ],
)
def test_malformed_ledger_url(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        open_ledger(url)
    app = App(url)
    with pytest.raises(ConfigError):
        _ = app.ledger
    assert os.listdir(tmp_path) == [], "a refused URL must not create files"


def test_busy_timeout_nan_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        open_ledger("sqlite:///x.db?busy_timeout_s=nan")


def test_bad_durability_argument(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="durability"):
        open_ledger(f"sqlite:///{tmp_path}/l.db", durability="paranoid")
    with pytest.raises(ConfigError):
        _ = App(f"sqlite:///{tmp_path}/l.db", durability="replicated").ledger


def test_bad_durability_in_app_argument(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sometimes"):
        _ = App(f"sqlite:///{tmp_path}/l.db", durability="sometimes").ledger


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("postgresql://u@127.0.0.1/db?pool_size=abc", "pool_size"),
        ("postgresql://u@127.0.0.1/db?pool_size=0", "pool_size"),
        ("postgresql://u@127.0.0.1/db?schema=Bad-Name", "schema"),
        ("postgresql://u@127.0.0.1/db?busy_timeout_s=3", "SQLite setting"),
        ("postgresql://u@127.0.0.1/db?durability=eventually", "durability"),
        ("postgresql://", "names no server"),
        ("mysql://u@127.0.0.1/db", "unsupported ledger URL scheme"),
        ("postgresql://u@127.0.0.1:99999/db", "Port out of range"),
        ("postgresql://u@127.0.0.1:abc/db", "malformed ledger URL"),
        ("postgresql://u@[::1/db", "malformed ledger URL"),
        ("postgresql://u@127.0.0.1/db?schema=pg_catalog", "system schema"),
        ("postgresql://u@127.0.0.1/db?schema=information_schema", "system schema"),
    ],
)
def test_malformed_postgresql_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        open_ledger(url)


def test_passwords_never_appear_in_errors() -> None:
    with pytest.raises(ConfigError) as info:
        open_ledger("postgresql://app:s3cret-pw@127.0.0.1:abc/db")
    assert "s3cret-pw" not in str(info.value)
    assert "app:***@127.0.0.1:abc" in str(info.value)
    with pytest.raises(LedgerUnavailable) as unreachable:
        open_ledger("postgresql://app:s3cret-pw@127.0.0.1:1/db?connect_timeout=2")
    assert "s3cret-pw" not in str(unreachable.value)


def test_dead_postgresql_server_is_a_clear_error() -> None:
    # Port 1 on loopback: nothing listens there; the error names the ledger, fast.
    started = time.monotonic()
    with pytest.raises(LedgerUnavailable, match="cannot connect to PostgreSQL ledger"):
        open_ledger("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------------- ledger files


def _too_new_file(path: Path, wal: bool) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE future_tasks (id TEXT PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO future_tasks VALUES ('t1', 'from Ratchet 9')")
    conn.commit()
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def test_schema_too_new_is_refused_and_untouched(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _too_new_file(path, wal=False)
    digest = sha256(path)
    for attempt in range(2):  # also a second time: no half-migrated state after the first
        with pytest.raises(SchemaTooNew) as info:
            open_ledger(f"sqlite:///{path}")
        assert info.value.found == 99
        assert info.value.supported >= 1
        assert "99" in str(info.value), attempt
    with pytest.raises(SchemaTooNew):
        open_ledger(f"sqlite:///{path}", migrate=False)
    app = make_app(tmp_path)
    with pytest.raises(SchemaTooNew):
        app.submit("mail.send", {"to": "a@b.c"})
    assert sha256(path) == digest
    assert sorted(os.listdir(tmp_path)) == ["l.db"], "no -wal/-journal file may appear"
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 99
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_schema_too_new_wal_file_is_untouched(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _too_new_file(path, wal=True)
    digest = sha256(path)
    with pytest.raises(SchemaTooNew):
        open_ledger(f"sqlite:///{path}")
    assert sha256(path) == digest
    wal = tmp_path / "l.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0, "nothing may be written to the WAL"


def test_missing_directory(tmp_path: Path) -> None:
    where = tmp_path / "no" / "such" / "dir"
    with pytest.raises(LedgerUnavailable, match="does not exist"):
        open_ledger(f"sqlite:///{where}/l.db")
    app = make_app(tmp_path)
    app.configure(ledger=f"sqlite:///{where}/l.db")
    with pytest.raises(LedgerUnavailable):
        app.submit("mail.send", {"to": "a@b.c"})
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    "content",
    [b"this is not a database, it is a shopping list\n" * 200, b"\x00" * 10, os.urandom(8192)],
    ids=["text", "zeros", "random"],
)
def test_file_that_is_not_sqlite(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "l.db"
    path.write_bytes(content)
    with pytest.raises(LedgerUnavailable):
        open_ledger(f"sqlite:///{path}")
    assert path.read_bytes() == content


def test_ledger_in_a_directory_with_url_special_characters(tmp_path: Path) -> None:
    # A legal directory name must not be re-interpreted as URI syntax on the second open
    # (the read-only schema probe builds a file: URI from the path).
    # The URL percent-encodes the path, like any URL: %, # and ? in names are %25, %23, %3F.
    from urllib.parse import quote

    where = tmp_path / "100% done #1?"
    where.mkdir()
    url = f"sqlite:///{quote(str(where))}/l.db"
    first = open_ledger(url)
    first.close()
    second = open_ledger(url)
    assert second.schema_version() >= 1
    second.close()


def test_relative_ledger_url_is_pinned_when_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each thread opens its own connection; a relative path must not be re-resolved against
    # a later working directory (that would silently create a second, empty ledger).
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(home)
    app = App("sqlite:///rel.db")

    @app.task(name="t.rel")
    def rel(ctx: TaskContext) -> None:
        return None

    handle = app.submit("t.rel")
    monkeypatch.chdir(elsewhere)
    seen: list[Any] = []

    def read_from_new_thread() -> None:
        try:
            seen.append(app.get(handle.task_id).task_id)
        except Exception as exc:
            seen.append(exc)

    thread = threading.Thread(target=read_from_new_thread)
    thread.start()
    thread.join(10)
    app.close()
    assert seen == [handle.task_id]
    assert os.listdir(elsewhere) == []
