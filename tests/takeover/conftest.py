"""The takeover tests import their app module (``takeover_app``) from this directory, as
the worker subprocesses do (``PYTHONPATH``). Ledgers come from tests/conftest.py
(``ledger_url``: a SQLite file or a private PostgreSQL schema)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_call``), so a fixture can print the
    worker logs of a failed test."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)
