"""Crash points of an ``async def`` body, on both ledgers: the worker rows of the
crash-point matrix (rows 4-8: claimed and killed; killed after the effect's intent and
after its call; killed after a durable step committed; killed inside the commit of the
effect's result; holder frozen past its lease) with the charge task as an ``async def``
body (``ratchet crash-matrix --async``): real ``ratchet worker`` processes killed with
SIGKILL at each fault point, a clean worker finishing like the crash-free control run,
executions counted by the counting service, step runs by the external step log (which
also shows the step functions ran in async bodies)."""

from __future__ import annotations

import pytest

from ratchet.testing.matrix import run_matrix

pytestmark = [pytest.mark.crash, pytest.mark.slow, pytest.mark.timeout(600)]


def test_worker_rows_of_the_matrix_with_async_bodies(ledger_url: str) -> None:
    report = run_matrix(ledger_url, rows="4-8", async_bodies=True, parallel=2)
    failed = [f"row {r.row}: {r.status} {r.detail}" for r in report.rows if not r.passed]
    assert not failed, "\n".join(failed)
    assert [r.row for r in report.rows] == [4, 5, 6, 7, 8]
