"""Fixtures of the ledger contract suite (DESIGN §10): built on the one fixture a runner
provides, ``ledger_factory`` (see :mod:`ratchet.testing.contract`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ...app import new_task_id
from ...ledger.base import Ledger, NewTask
from ...serde import digest, dumps
from ..processes import wait_for

__all__ = ["LedgerFactory", "ledger", "make_task", "open_store", "sleep_until"]

TASK = "contract.task"


LedgerFactory = Callable[[], Ledger]
"""What a runner's ``ledger_factory`` fixture returns: each call opens another, independent
:class:`~ratchet.ledger.base.Ledger` object on the *same* fresh, migrated store of one test
(as another process would); the suite closes every object it opened."""


@pytest.fixture
def open_store(ledger_factory: LedgerFactory) -> Iterator[LedgerFactory]:
    """Open another, independent ledger object on this test's store (as another process
    would), through the runner's ``ledger_factory``; every object opened is closed at the
    end of the test."""
    opened: list[Ledger] = []

    def factory() -> Ledger:
        ledger = ledger_factory()
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
        wait_for(
            f"the ledger clock to pass {instant}",
            lambda: ledger.now() > instant,
            timeout_s=5.0,
            interval_s=0.01,
        )

    return wait
