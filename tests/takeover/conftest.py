"""Fixtures of the fast-takeover tests: a ledger URL per backend."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgsupport import private_schema

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(params=["sqlite", "postgresql"])
def takeover_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh ledger of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.db"
        return
    with private_schema("rt_takeover") as (url, _):
        yield url
