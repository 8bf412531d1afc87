"""Fixtures of the crash-point suite (DESIGN §6): a fresh rig per test and per ledger
backend (the ``ledger_url`` fixture of tests/conftest.py: a SQLite file, or a private
PostgreSQL schema), and a crash-free control run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crashkit import PARAMS, Outcome, Rig
from rigsupport import rig_session


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ledger_url: str) -> Iterator[Rig]:
    """A fresh ledger (each backend), step log and (lazily) counting service; every process
    is killed at the end, and on failure every process log is printed."""
    with rig_session(request, Rig(tmp_path, ledger_url)) as r:
        yield r


_controls: dict[str, Outcome] = {}


@pytest.fixture(scope="session")
def control(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``control(params)``: the crash-free run of one task with ``params`` (cached): its
    final task row, step runs and service executions. Every crash test must end like it."""

    def run(params: dict[str, Any] | None = None) -> Outcome:
        params = params or PARAMS
        ident = repr(sorted(params.items()))
        if ident not in _controls:
            r = Rig(tmp_path_factory.mktemp("control"))
            try:
                r.start_service(honour_keys=False)
                task_id = r.submit(params)
                w = r.worker("control")
                r.wait_state(task_id)
                assert w.stop() == 0
                _controls[ident] = r.outcome(task_id)
            except BaseException:
                print(r.dump())
                raise
            finally:
                r.cleanup()
        return _controls[ident]

    return run
