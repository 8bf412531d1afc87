"""``ratchet demo``, shortened, on both ledgers: real worker processes killed with SIGKILL
and restarted, one frozen with SIGSTOP past its lease, a faulty payment service.

The demo's own verdict (exit status 0) is not taken on trust: the test reads the ledger
and the payment service's own file itself, through :mod:`ratchet.testing`'s checks, and
requires every task of the run to have succeeded with its charge executed exactly once
and recorded in the ledger, and the ledger to be consistent.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from ratchet.demo.runner import DemoSettings, run_demo
from ratchet.testing import (
    check_exactly_once,
    check_ledger_consistent,
    list_task_ids,
    read_records,
)

TASKS = 120
KILLS = 2

SHORT = DemoSettings(
    arrival_s=2.0,
    batches=4,
    chaos_from=0.1,
    chaos_to=0.8,
    min_kill_gap_s=0.5,
    stall_s=30.0,
)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_charges_every_task_exactly_once(ledger_url: str, tmp_path: Path) -> None:
    out = io.StringIO()
    workdir = tmp_path / "demo"
    code = run_demo(
        ledger_url,
        tasks=TASKS,
        workers=2,
        kills=KILLS,
        seed=7,
        workdir=workdir,
        settings=SHORT,
        console=Console(file=out, width=140, color_system=None),
    )
    report = out.getvalue()
    assert code == 0, report
    assert f"{KILLS}/{KILLS}" in report, report  # the chaos happened

    # The external truth, read independently of the demo's report.
    records = read_records(workdir / "payments.db")
    ids = list_task_ids(ledger_url)
    assert len(ids) == TASKS, report
    once = check_exactly_once(
        ledger_url, records, effect="charge", result_id_field="charge_id"
    )
    assert once.states == {"SUCCEEDED": TASKS}, report
    assert once.succeeded_once == TASKS and len(records.executions) == TASKS
    assert check_ledger_consistent(ledger_url).tasks == TASKS
