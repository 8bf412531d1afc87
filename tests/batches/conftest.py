"""Fixtures of the batch crash tests (DESIGN §6 row 9, §8 logical shards): a fresh rig per
test and per ledger backend (the ``ledger_url`` fixture of tests/conftest.py: a SQLite
file, or a private PostgreSQL schema, skipped when no server is reachable). On failure
every process log is printed."""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batchkit import BatchRig


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ledger_url: str) -> Iterator[BatchRig]:
    r = BatchRig(tmp_path, ledger_url)
    try:
        yield r
    finally:
        try:
            r.cleanup()
        finally:
            failed = any(
                getattr(getattr(request.node, f"rep_{w}", None), "failed", False)
                for w in ("setup", "call")
            )
            if failed:
                print(r.dump())
