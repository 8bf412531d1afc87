"""The ledger contract suite (:mod:`ratchet.testing.contract`) on SQLite: each test gets a
fresh file, and every ledger object the suite opens is another connection to it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ratchet import open_ledger
from ratchet.ledger.base import Ledger
from ratchet.testing.contract import *  # noqa: F403  (the suite's tests and fixtures)


@pytest.fixture
def ledger_factory(tmp_path: Path) -> Callable[[], Ledger]:
    """Open another ledger object on this test's fresh SQLite file (migrated on open)."""
    url = f"sqlite:///{tmp_path}/l.db"
    return lambda: open_ledger(url)
