"""Fixtures of the flow-control process tests: a fresh rig per test and per ledger backend
(the ``ledger_url`` fixture of tests/conftest.py: a SQLite file, or a private PostgreSQL
schema). On failure every process log is printed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from flowkit import FlowRig  # noqa: E402
from rigsupport import rig_session  # noqa: E402


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ledger_url: str) -> Iterator[FlowRig]:
    with rig_session(request, FlowRig(tmp_path, ledger_url)) as r:
        yield r
