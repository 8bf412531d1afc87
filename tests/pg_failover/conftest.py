"""Fixtures of the failover suite: a private primary with a synchronous standby
(:mod:`pairkit`) and the crash rig (:mod:`pgkit`, tests/crash) on a multi-host URL over
both. Everything is torn down afterwards, also when the test fails; on failure the process
logs and both server logs are printed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for _p in (HERE, HERE.parent / "pg_faults", HERE.parent / "crash"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from pairkit import ReplicatedPair, replicated_pair  # noqa: E402
from rigsupport import test_failed  # noqa: E402


@pytest.fixture
def pair(request: pytest.FixtureRequest) -> Iterator[ReplicatedPair]:
    """A started primary + synchronous standby; both killed and removed afterwards."""
    with replicated_pair() as started:
        try:
            yield started
        finally:
            if test_failed(request):
                print(started.logs())
