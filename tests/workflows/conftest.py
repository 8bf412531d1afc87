"""Fixtures of the workflow crash tests: a fresh rig per test and per ledger backend (the
``ledger_url`` fixture of tests/conftest.py: a SQLite file, or a private PostgreSQL schema,
skipped when no server is reachable). On failure every process log is printed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rigsupport import rig_session
from wfkit import WfRig


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ledger_url: str) -> Iterator[WfRig]:
    with rig_session(request, WfRig(tmp_path, ledger_url)) as r:
        yield r
