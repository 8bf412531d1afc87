"""Fixtures of the ledger contract suite (DESIGN §10).

Every test in ``tests/contract/`` talks to a ledger only through the
:class:`~ratchet.ledger.base.Ledger` protocol, and runs once per backend in
``BACKENDS`` (tests/conftest.py). A new backend is done when it passes this suite.

To add a backend: append its name to ``BACKENDS`` in ``tests/conftest.py`` and teach
its ``ledger_url`` how to
give each test a fresh, empty store of that kind. That is the only place to change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.ledger.base import Ledger, NewTask
from ratchet.serde import digest, dumps

TASK = "contract.task"


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
