"""One root: every error Ratchet raises derives from ``RatchetError``. The public names are
pinned, and the public entry points are walked with bad input: each refuses with a
``RatchetError`` subclass, never ``ValueError``, ``TypeError``, ``RecursionError``, a
driver error or a raw ``json`` error."""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ratchet
from ratchet import errors
from ratchet.config import parse_ledger_url
from ratchet.serde import dumps, loads
from ratchet.validation import check_identifier

PUBLIC_NAMES = {
    "NOT_FOUND", "App", "ConfigError", "Control", "Durability", "EffectOutcomeUnknown",
    "FailureClass", "FenceError", "IdempotencyConflict", "IllegalTransition",
    "InvalidArguments", "LeaseLost", "LedgerError", "LedgerUnavailable",
    "OutcomeUnknownError", "OverloadError", "PayloadNotSerializable", "PayloadTooLarge",
    "PermanentError", "RatchetError", "RetryPolicy", "SchemaTooNew", "StaleGeneration",
    "State", "StatusReport", "SubmitError", "SubmitRequest", "TaskContext", "TaskDefinition",
    "TaskFailure", "TaskHandle", "TaskInfo", "TaskNotFound", "TaskTimeline", "TransientError",
    "UndecodableData", "UnknownTask", "WaitTimeout", "Worker", "WorkerView", "__version__",
    "open_ledger",
}
"""``ratchet.__all__`` as this part of the code base defines it. Names other parts add
(``Middleware``, ``WriteRejected``, ...) are allowed on top, but none of these may go."""


def test_public_names_are_pinned() -> None:
    exported = set(ratchet.__all__)
    missing = PUBLIC_NAMES - exported
    assert not missing, f"ratchet.__all__ lost {sorted(missing)}"
    assert len(ratchet.__all__) == len(exported), "duplicates in ratchet.__all__"
    for name in ratchet.__all__:
        assert hasattr(ratchet, name), name


def test_every_error_class_derives_from_the_root() -> None:
    assert errors.__all__, "ratchet.errors exports nothing"
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert inspect.isclass(cls) and issubclass(cls, errors.RatchetError), name
    # and every exception class defined in the module is exported
    defined = {n for n, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == errors.__name__}
    assert defined == set(errors.__all__)


def test_error_tree_docstring_names_every_class() -> None:
    doc = errors.__doc__ or ""
    for name in errors.__all__:
        assert name in doc, f"{name} missing from the tree in ratchet/errors.py"


def test_exported_error_names_from_ratchet_are_the_same_classes() -> None:
    for name in errors.__all__:
        if name in ratchet.__all__:
            assert getattr(ratchet, name) is getattr(errors, name)


# ---------------------------------------------------------------------- the walk


def _app(tmp_path: Path) -> ratchet.App:
    app = ratchet.App(f"sqlite:///{tmp_path}/l.db")

    @app.task(name="t.ok")
    def ok(ctx: ratchet.TaskContext, n: int = 0) -> int:
        return n

    return app


def _deep(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def _register(app: ratchet.App, **kwargs: Any) -> None:
    def fn(ctx: ratchet.TaskContext) -> None:
        return None

    app.task(**kwargs)(fn)


BadCall = Callable[[ratchet.App, Path], object]

BAD_CALLS: dict[str, BadCall] = {
    # task definitions
    "task name lone surrogate": lambda a, p: _register(a, name="bad\ud800"),
    "task name NUL": lambda a, p: _register(a, name="bad\x00name"),
    "task name empty": lambda a, p: _register(a, name=""),
    "task name not str": lambda a, p: _register(a, name=42),
    "task name too long": lambda a, p: _register(a, name="n" * 10_000),
    "task name twice": lambda a, p: _register(a, name="t.ok"),
    "lease 1 ms": lambda a, p: _register(a, name="t.l1", lease_s=0.001),
    "lease zero": lambda a, p: _register(a, name="t.l2", lease_s=0),
    "lease NaN": lambda a, p: _register(a, name="t.l3", lease_s=math.nan),
    "lease str": lambda a, p: _register(a, name="t.l4", lease_s="15"),
    "lease bool": lambda a, p: _register(a, name="t.l5", lease_s=True),
    "version zero": lambda a, p: _register(a, name="t.v1", version=0),
    "version float": lambda a, p: _register(a, name="t.v2", version=1.5),
    "version huge": lambda a, p: _register(a, name="t.v3", version=2**40),
    "retry not a policy": lambda a, p: _register(a, name="t.r1", retry={"max_attempts": 3}),
    # retry policies
    "max_attempts NaN": lambda a, p: ratchet.RetryPolicy(max_attempts=math.nan),  # type: ignore[arg-type]
    "max_attempts 1.5": lambda a, p: ratchet.RetryPolicy(max_attempts=1.5),  # type: ignore[arg-type]
    "max_attempts 0": lambda a, p: ratchet.RetryPolicy(max_attempts=0),
    "max_attempts None": lambda a, p: ratchet.RetryPolicy(max_attempts=None),  # type: ignore[arg-type]
    "base_delay inf": lambda a, p: ratchet.RetryPolicy(base_delay_s=math.inf),
    "jitter 2": lambda a, p: ratchet.RetryPolicy(jitter=2.0),
    "multiplier str": lambda a, p: ratchet.RetryPolicy(multiplier="2"),  # type: ignore[arg-type]
    # submit
    "unknown task": lambda a, p: a.submit("t.nope"),
    "name not str": lambda a, p: a.submit(None),  # type: ignore[arg-type]
    "params not mapping": lambda a, p: a.submit("t.ok", [1, 2]),  # type: ignore[arg-type]
    "params wrong arg": lambda a, p: a.submit("t.ok", {"m": 1}),
    "params object": lambda a, p: a.submit("t.ok", {"n": object()}),
    "params bytes": lambda a, p: a.submit("t.ok", {"n": b"x"}),
    "params NaN": lambda a, p: a.submit("t.ok", {"n": math.nan}),
    "params too deep": lambda a, p: a.submit("t.ok", {"n": _deep(60_000)}),
    "params int key": lambda a, p: a.submit("t.ok", {"n": {1: 2}}),
    "params cycle": lambda a, p: a.submit("t.ok", {"n": _cycle()}),
    "params too large": lambda a, p: a.submit("t.ok", {"n": "x" * (2 * 1024 * 1024)}),
    "key surrogate": lambda a, p: a.submit("t.ok", idempotency_key="k\udcff"),
    "key NUL": lambda a, p: a.submit("t.ok", idempotency_key="k\x00"),
    "key empty": lambda a, p: a.submit("t.ok", idempotency_key=""),
    "key int": lambda a, p: a.submit("t.ok", idempotency_key=7),  # type: ignore[arg-type]
    "key too long": lambda a, p: a.submit("t.ok", idempotency_key="k" * 5000),
    "run_at naive": lambda a, p: a.submit("t.ok", run_at=_naive()),
    "run_at str": lambda a, p: a.submit("t.ok", run_at="tomorrow"),  # type: ignore[arg-type]
    "run_at inf": lambda a, p: a.submit("t.ok", run_at=math.inf),
    "run_at huge": lambda a, p: a.submit("t.ok", run_at=10**400),
    "delay NaN": lambda a, p: a.submit("t.ok", delay_s=math.nan),
    "delay str": lambda a, p: a.submit("t.ok", delay_s="1"),  # type: ignore[arg-type]
    "submit_many item": lambda a, p: a.submit_many([("t.ok", {})]),  # type: ignore[list-item]
    "submit_many not iterable": lambda a, p: a.submit_many(5),  # type: ignore[arg-type]
    "submit_many one request": lambda a, p: a.submit_many(ratchet.SubmitRequest("t.ok")),  # type: ignore[arg-type]
    "idempotency conflict": lambda a, p: (
        a.submit("t.ok", {"n": 1}, idempotency_key="same"),
        a.submit("t.ok", {"n": 2}, idempotency_key="same"),
    ),
    # reads
    "get missing": lambda a, p: a.get("0" * 32),
    "get surrogate id": lambda a, p: a.get("\ud800"),
    "get int id": lambda a, p: a.get(5),  # type: ignore[arg-type]
    "get dict id": lambda a, p: a.get({}),  # type: ignore[arg-type]
    "wait missing": lambda a, p: a.wait("0" * 32, timeout_s=1),
    "wait timeout NaN": lambda a, p: a.wait("0" * 32, timeout_s=math.nan),
    "wait negative poll": lambda a, p: a.wait("0" * 32, timeout_s=1, poll_s=-1),
    "wait times out": lambda a, p: a.wait(a.submit("t.ok").task_id, timeout_s=0.05),
    # app and ledger configuration
    "app payload limit 0": lambda a, p: ratchet.App(max_payload_bytes=0),
    "app payload limit str": lambda a, p: ratchet.App(max_payload_bytes="10"),  # type: ignore[arg-type]
    "app ledger int": lambda a, p: ratchet.App(42),  # type: ignore[arg-type]
    "app ledger bytes": lambda a, p: ratchet.App(b"sqlite:///x.db"),  # type: ignore[arg-type]
    "app durability int": lambda a, p: ratchet.App(durability=1),  # type: ignore[arg-type]
    "configure ledger int": lambda a, p: ratchet.App().configure(ledger=1),  # type: ignore[arg-type]
    "crash skip env": lambda a, p: _crash_skip_garbage(),
    "app durability": lambda a, p: ratchet.App(f"sqlite:///{p}/x.db", durability="eventually")
    .ledger,
    "configure after open": lambda a, p: (a.ledger, a.configure(ledger="sqlite:///y.db")),
    "url scheme": lambda a, p: parse_ledger_url("mysql://h/db"),
    "url port": lambda a, p: parse_ledger_url("postgresql://h:99999999/db"),
    "url password #": lambda a, p: parse_ledger_url("postgresql://u:p#w@h/db"),
    "url empty": lambda a, p: parse_ledger_url("  "),
    "url busy NaN": lambda a, p: parse_ledger_url("sqlite:///x.db?busy_timeout_s=nan"),
    "url pool": lambda a, p: parse_ledger_url("postgresql://h/db?pool_size=x"),
    "url schema": lambda a, p: parse_ledger_url("postgresql://h/db?schema=Robert'); DROP"),
    "open missing dir": lambda a, p: ratchet.open_ledger(f"sqlite:///{p}/no/such/dir/l.db"),
    "open not sqlite": lambda a, p: ratchet.open_ledger(f"sqlite:///{_garbage(p)}"),
    "open must exist": lambda a, p: ratchet.open_ledger(f"sqlite:///{p}/n.db", must_exist=True),
    # serde
    "dumps set": lambda a, p: dumps({1, 2}),
    "dumps deep": lambda a, p: dumps(_deep(100_000)),
    "loads garbage": lambda a, p: loads("{oops"),
    "loads deep": lambda a, p: loads("[" * 100_000 + "]" * 100_000),
    "loads surrogate": lambda a, p: loads('"\udcff"'),
    "identifier": lambda a, p: check_identifier(b"x", "name", 10),
    # control
    "control url": lambda a, p: ratchet.Control("ftp://x"),
    "control url int": lambda a, p: ratchet.Control(5),  # type: ignore[arg-type]
    "open_ledger url int": lambda a, p: ratchet.open_ledger(5),  # type: ignore[arg-type]
    "open_ledger durability int": lambda a, p: ratchet.open_ledger(
        f"sqlite:///{p}/d.db", durability=3),  # type: ignore[arg-type]
    "control status no ledger": lambda a, p: ratchet.Control(f"sqlite:///{p}/none.db").status(),
    "control inspect missing": lambda a, p: ratchet.Control(app=a).inspect("0" * 32),
    "control inspect bad id": lambda a, p: ratchet.Control(app=a).inspect(None),  # type: ignore[arg-type]
    "control resolve outcome": lambda a, p: ratchet.Control(app=a).resolve("x", "yes", reason="r"),
    "control resolve reason": lambda a, p: ratchet.Control(app=a).resolve("x", "done", reason=""),
    "control resolve result": lambda a, p: ratchet.Control(app=a).resolve(
        "x", "done", _deep(60_000), reason="r"),
    "control submit no app": lambda a, p: ratchet.Control().submit("t.ok"),
    # worker construction
    "worker concurrency 0": lambda a, p: ratchet.Worker(a, concurrency=0),
    "worker unknown name": lambda a, p: ratchet.Worker(a, names=["t.nope"]),
}


def _crash_skip_garbage() -> None:
    from ratchet import faults

    os.environ["RATCHET_CRASH_AT"] = "test.never_reached"
    os.environ["RATCHET_CRASH_SKIP"] = "two"
    try:
        faults.reset()
        faults.point("test.never_reached")
    finally:
        del os.environ["RATCHET_CRASH_AT"], os.environ["RATCHET_CRASH_SKIP"]
        faults.reset()


def _cycle() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


def _naive() -> Any:
    from datetime import datetime

    return datetime(2030, 1, 1)


def _garbage(path: Path) -> Path:
    target = path / "garbage.db"
    target.write_bytes(b"this is not a database" * 100)
    return target


@pytest.mark.parametrize("label", sorted(BAD_CALLS))
def test_bad_input_raises_only_ratchet_errors(label: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = _app(tmp_path)
    try:
        with pytest.raises(errors.RatchetError) as caught:
            BAD_CALLS[label](app, tmp_path)
    finally:
        app.close()
    message = str(caught.value)
    assert message.strip(), f"{label}: {type(caught.value).__name__} without a message"
    assert "\ud800" not in message and "\udcff" not in message  # printable
    assert len(message) < 2000, f"{label}: message of {len(message)} characters"


# ---------------------------------------------------------------------- the one table


def _subclasses(cls: type[errors.RatchetError]) -> set[type[errors.RatchetError]]:
    found: set[type[errors.RatchetError]] = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_error_class_has_a_row_in_the_table() -> None:
    """Each class of ``ratchet.errors`` has its own row (a new class needs a decision);
    every subclass anywhere (the dashboard's ``BadInput`` too) resolves to a row of an
    ancestor, never to the spec of a foreign exception."""
    every = _subclasses(errors.RatchetError) | {errors.RatchetError}
    ours = {cls for cls in every if cls.__module__ == errors.__name__}
    assert ours == {getattr(errors, name) for name in errors.__all__}
    missing = sorted(cls.__name__ for cls in ours if cls not in errors.ERROR_TABLE)
    assert not missing, f"no row in ERROR_TABLE for {missing}"
    assert set(errors.ERROR_TABLE) == ours
    for cls in every:
        spec = errors.error_spec(cls)
        assert spec is not errors.INTERNAL, cls
        assert spec.code.isidentifier() and spec.code == spec.code.lower(), cls
        assert 400 <= spec.http_status <= 599, cls
        assert spec.exit_code in (errors.EXIT_ERROR, errors.EXIT_LEDGER_CORRUPT), cls


def test_error_spec_walks_the_mro() -> None:
    class Mine(errors.TaskNotFound):
        pass

    assert errors.error_spec(Mine("x")) is errors.ERROR_TABLE[errors.TaskNotFound]
    assert errors.error_spec(errors.WriteRejected("x")).code == "write_rejected"
    assert errors.error_spec(ValueError("x")) is errors.INTERNAL
    assert errors.INTERNAL.exit_code == errors.EXIT_INTERNAL


@pytest.mark.parametrize(("cls", "status", "code", "exit_code"), [
    (errors.TaskNotFound, 404, "not_found", 2),
    (errors.IllegalTransition, 409, "wrong_state", 2),
    (errors.IdempotencyConflict, 409, "idempotency_conflict", 2),
    (errors.PayloadTooLarge, 413, "payload_too_large", 2),
    (errors.UnknownTask, 422, "invalid", 2),
    (errors.InvalidArguments, 422, "invalid", 2),
    (errors.UndecodableData, 422, "invalid", 2),
    (errors.LedgerUnavailable, 503, "ledger_unavailable", 2),
    (errors.LedgerCorrupt, 503, "ledger_corrupt", 5),
    (errors.SchemaTooOld, 503, "schema_too_old", 2),
    (errors.SchemaTooNew, 503, "schema_too_new", 2),
    (errors.WriteRejected, 409, "write_rejected", 2),
])
def test_the_rows_faces_rely_on(cls: type[errors.RatchetError], status: int, code: str,
                                exit_code: int) -> None:
    assert errors.ERROR_TABLE[cls] == errors.ErrorSpec(status, code, exit_code)


def test_unknown_task_carries_the_version_asked_for() -> None:
    app = ratchet.App("sqlite:///:memory:")

    @app.task(name="t.v", version=1)
    def v(ctx: ratchet.TaskContext) -> None:
        return None

    with pytest.raises(errors.UnknownTask) as by_version:
        app.definition("t.v", 7)
    assert (by_version.value.name, by_version.value.version) == ("t.v", 7)
    with pytest.raises(errors.UnknownTask) as by_name:
        app.definition("t.none")
    assert by_name.value.version is None


def test_app_task_without_parentheses_says_how_to_write_it(tmp_path: Path) -> None:
    app = ratchet.App(f"sqlite:///{tmp_path}/l.db")

    def fulfil(ctx: ratchet.TaskContext) -> None:
        return None

    with pytest.raises(ratchet.InvalidArguments, match=r"@app\.task needs parentheses"):
        app.task(fulfil)  # type: ignore[arg-type]
    assert app.tasks == {}
