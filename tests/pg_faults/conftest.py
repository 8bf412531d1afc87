"""Fixtures of the PostgreSQL fault suite ("faults that must be survived").

Every test gets a :class:`pgkit.PgRig`: a private schema on the test server (dropped
afterwards; skipped without a server, a failure under ``CI=true``), the payment service
and the step log of the crash suite. Every process is killed at the end and, on failure,
every process log is printed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pgkit import PgRig, private_cluster
from pgsupport import private_schema, with_params
from rigsupport import test_failed


@pytest.fixture
def pg_rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PgRig]:
    """A rig whose ledger is a fresh schema on the shared test server (fsync durability)."""
    with private_schema("rt_fault") as (url, schema):
        rig = PgRig(tmp_path, with_params(url, durability="fsync"), schema)
        try:
            yield rig
        finally:
            try:
                rig.cleanup()
            finally:
                if test_failed(request):
                    print(rig.dump())


@pytest.fixture
def cluster_rig(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PgRig]:
    """A rig whose ledger lives on a private PostgreSQL cluster this test started itself
    (``initdb`` + ``pg_ctl`` on its own port; ``rig.cluster``), never the shared server.
    The cluster is stopped and its directory removed afterwards."""
    with private_cluster() as cluster:
        url = with_params(cluster.url, schema="rt_restart", durability="fsync")
        rig = PgRig(tmp_path, url, "rt_restart")
        rig.cluster = cluster
        try:
            yield rig
        finally:
            try:
                rig.cleanup()
            finally:
                if test_failed(request):
                    print(rig.dump())
                    print(f"===== private PostgreSQL log\n{cluster.server_log()[-20000:]}")
