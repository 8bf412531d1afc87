"""The ledger contract suite (:mod:`ratchet.testing.contract`) on PostgreSQL: each test gets
a private schema (dropped afterwards; skipped with a message when no server is reachable,
a failure under ``CI=true``), and every ledger object the suite opens is another
connection to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from pgsupport import private_schema

from ratchet import open_ledger
from ratchet.ledger.base import Ledger
from ratchet.testing.contract import *  # noqa: F403  (the suite's tests and fixtures)


@pytest.fixture
def ledger_factory() -> Iterator[Callable[[], Ledger]]:
    """Open another ledger object on this test's private schema (migrated on open)."""
    with private_schema("rt_test") as (url, _schema):
        yield lambda: open_ledger(url)
