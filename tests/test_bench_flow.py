"""``bench/flow.py`` runs: its ``--help``, and its ``--quick`` mode on SQLite (every section
with tiny sizes: the drains of each flow feature and the three flood shapes). The figures
are not checked, only that the script runs through and prints its tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "flow.py"


def test_flow_bench_help() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_flow_bench_quick_on_sqlite() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--ledgers", "sqlite"],
                          capture_output=True, text=True, timeout=170, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for line in ("after plain", "after rate", "after keyed", "after fair",
                 "queues, 2 workers", "queues, 1 worker", "priority, 1 worker"):
        assert line in done.stdout, done.stdout
