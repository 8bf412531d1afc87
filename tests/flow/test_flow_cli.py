"""Flow control at the command line: `ratchet submit --queue --priority` store what they
say, a queue name no worker could serve is refused with exit status 2 and nothing
written, and `ratchet status` names a queue that no live worker serves."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ratchet import App, Control
from ratchet.cli.main import cli
from ratchet.ledger.base import DefinitionSpec, WorkerInfo
from ratchet.worker.registry import host_identity

APP_SOURCE = """
from ratchet import App

app = App()


@app.task(name="fc.cli")
def work(ctx, n: int = 0) -> int:
    return n
"""


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> str:
    """An app module of its own (each command loads and configures a fresh App)."""
    (tmp_path / f"{name}.py").write_text(APP_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return f"{name}:app"


def test_submit_takes_a_queue_and_a_priority(ledger_url: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["submit", _module(tmp_path, monkeypatch, "fcli_a"),
                                 "fc.cli", "--params", '{"n": 1}', "--queue", "critical",
                                 "--priority", "7", "--json", "--ledger", ledger_url])
    assert result.exit_code == 0, result.output
    task_id = json.loads(result.output)["task_id"]
    bad = runner.invoke(cli, ["submit", _module(tmp_path, monkeypatch, "fcli_b"), "fc.cli",
                              "--queue", "a,b",
                              "--ledger", ledger_url])
    assert bad.exit_code == 2 and "queue name" in bad.output, bad.output
    with Control(ledger_url) as control:
        [only] = control.list_tasks().tasks
        assert (only.task_id, only.queue, only.priority) == (task_id, "critical", 7)


def test_status_names_a_queue_no_live_worker_serves(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task("fc.orphan", queue="critical")
    def orphan(ctx: object) -> None:
        return None

    app.submit("fc.orphan")
    # A live worker of this app whose --queues is misspelt.
    app.ledger.register_worker(WorkerInfo("w-typo", host_identity(), "h", os.getpid(), None))
    app.ledger.register_definitions("w-typo", [DefinitionSpec("fc.orphan", 1, "{}")])
    app.ledger.record_worker_slots("w-typo", 4, ["critcal"])
    with Control(ledger_url) as control:
        [queue] = [q for q in control.status().queues if q.queue == "critical"]
    assert (queue.workers, queue.unserved) == (0, True)
    result = CliRunner().invoke(cli, ["status", "--ledger", ledger_url])
    assert result.exit_code == 0, result.output
    assert "no live worker serves queue" in " ".join(result.output.split())
    app.close()
