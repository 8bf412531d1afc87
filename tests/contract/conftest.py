"""Fixtures of the ledger contract suite (DESIGN §10).

Every test in ``tests/contract/`` talks to a ledger only through the
:class:`~ratchet.ledger.base.Ledger` protocol, and runs once per backend in
:data:`BACKENDS`. A new backend is done when it passes this suite.

To add a backend: append its name to :data:`BACKENDS` and teach :func:`ledger_url` how to
give each test a fresh, empty store of that kind. That is the only place to change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pgsupport import private_schema

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.ledger.base import Ledger, NewTask
from ratchet.serde import digest, dumps

BACKENDS = ["sqlite", "postgresql"]

TASK = "contract.task"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test."""
    return str(request.param)


@pytest.fixture
def ledger_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, empty store for this test: a SQLite file, or a private PostgreSQL
    schema (dropped afterwards; skipped with a message when no server is reachable, a
    failure under ``CI=true``)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/l.db"
        return
    if backend == "postgresql":
        with private_schema("rt_contract") as (url, _schema):
            yield url
        return
    raise NotImplementedError(f"no store factory for backend {backend!r} yet")


@pytest.fixture
def open_store(ledger_url: str) -> Iterator[Callable[[], Ledger]]:
    """Open another, independent ledger object on this test's store (as another process
    would); every object opened is closed at the end of the test."""
    opened: list[Ledger] = []

    def factory() -> Ledger:
        ledger = open_ledger(ledger_url)
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


@pytest.fixture
def ledger(open_store: Callable[[], Ledger]) -> Ledger:
    """The ledger under test (fresh store, migrated)."""
    return open_store()


@pytest.fixture
def make_task() -> Callable[..., NewTask]:
    """Build a :class:`NewTask` the way ``App`` does (canonical JSON, name+params digest)."""

    def factory(
        params: Any = None,
        *,
        name: str = TASK,
        key: str | None = None,
        lease_s: float = 30.0,
        max_attempts: int = 3,
        delay_s: float = 0.0,
        run_at_epoch_s: float | None = None,
        task_id: str | None = None,
    ) -> NewTask:
        params_json = dumps(params if params is not None else {})
        return NewTask(
            task_id=task_id or new_task_id(),
            name=name,
            version=1,
            params_json=params_json,
            params_digest=digest(name, params_json),
            idempotency_key=key,
            max_attempts=max_attempts,
            lease_s=lease_s,
            delay_s=delay_s,
            run_at_epoch_s=run_at_epoch_s,
        )

    return factory


@pytest.fixture
def sleep_until() -> Callable[[Ledger, float], None]:
    """Wait until the *ledger clock* has passed ``instant`` (epoch seconds); at most 5 s."""

    def wait(ledger: Ledger, instant: float) -> None:
        deadline = time.monotonic() + 5.0
        while ledger.now() <= instant:
            assert time.monotonic() < deadline, "ledger clock did not advance"
            time.sleep(0.01)

    return wait
