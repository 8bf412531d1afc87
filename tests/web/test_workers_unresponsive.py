"""A worker frozen by SIGSTOP is shown unresponsive once its last heartbeat is older than
its lease (``WorkerView.unresponsive``), by ``Control.workers``, ``ratchet workers`` (text
and ``--json``), ``GET /api/workers`` and the dashboard, on both ledgers: a real
``ratchet worker`` subprocess, stopped and continued with real signals."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import httpx
import pytest
from dashsupport import serve
from typer.testing import CliRunner

from ratchet import Control, WorkerView
from ratchet.cli.main import cli
from ratchet.testing.processes import ProcessGroup, wait_for
from ratchet.web import WebSettings
from ratchet.worker.registry import UNRESPONSIVE_FLOOR_S

pytestmark = pytest.mark.timeout(180)

APP = '''
from ratchet import App, TaskContext

app = App()


@app.task(name="frozen.echo", lease_s=2.0)
def echo(ctx: TaskContext, n: int) -> int:
    return n


@app.task(name="frozen.slow", lease_s=30.0)
def slow(ctx: TaskContext, n: int) -> int:
    return n
'''


def test_a_sigstopped_worker_is_unresponsive_past_its_lease(ledger_url: str,
                                                              tmp_path: Path) -> None:
    (tmp_path / "frozenapp.py").write_text(textwrap.dedent(APP))
    Control(ledger_url).migrate()
    with ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path]) as procs, \
            Control(ledger_url) as control:
        w = procs.worker("frozenapp:app", ledger_url)
        holder = w.holder()

        def mine() -> WorkerView | None:
            return next((v for v in control.workers() if v.holder == holder), None)

        def registered() -> WorkerView | None:
            v = mine()
            return v if v is not None and v.lease_s == 2.0 else None

        def unresponsive() -> WorkerView | None:
            v = mine()
            return v if v is not None and v.unresponsive else None

        # Registered with its definitions: judged by its shortest lease, at least the floor.
        seen = wait_for("the worker to register its definitions", registered, timeout_s=60)
        assert not seen.unresponsive and seen.state == "alive", seen
        w.pause()  # SIGSTOP, and the kernel says it is stopped
        try:
            frozen = wait_for("the frozen worker to be shown unresponsive", unresponsive,
                              timeout_s=90, interval_s=0.5)
            assert frozen.state == "alive" and frozen.process == "stopped"
            assert frozen.last_seen_age_s > max(frozen.lease_s, UNRESPONSIVE_FLOOR_S)
            result = CliRunner().invoke(cli, ["workers", "--ledger", ledger_url])
            assert result.exit_code == 0, result.output
            [row] = [ln for ln in result.stdout.splitlines() if holder in ln]
            assert "alive, UNRESPONSIVE" in row and "past its 2s lease" in row, row
            assert "stopped" in row and "running" not in row, row
            assert "1 alive (1 unresponsive" in result.stdout, result.stdout
            result = CliRunner().invoke(cli, ["workers", "--json", "--ledger", ledger_url])
            [j] = [x for x in json.loads(result.stdout) if x["holder"] == holder]
            assert j["unresponsive"] is True and j["lease_s"] == 2.0
            with serve(WebSettings(ledger_url=ledger_url), Control(ledger_url)) as base, \
                    httpx.Client(base_url=base, timeout=30) as client:
                [a] = [x for x in client.get("/api/workers").json() if x["holder"] == holder]
                assert a["unresponsive"] is True
                assert "unresponsive: past its" in client.get("/").text
        finally:
            w.resume()  # SIGCONT: it heartbeats again
        wait_for("the continued worker to be responsive again",
                 lambda: (v := mine()) is not None and not v.unresponsive, timeout_s=60)
        assert w.stop() == 0, w.log()
        [gone] = [v for v in control.workers() if v.holder == holder]
        assert gone.state == "stopped" and not gone.unresponsive
