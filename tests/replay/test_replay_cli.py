"""``ratchet replay`` on histories a real worker recorded: exit status 0 when the history
reproduces (or ends before the code does), 1 when a task diverges, 2 on bad input; the
text names the position and both calls; ``--json`` prints the report's fields; ``--type
--version --sample`` replays the recent tasks of a type."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import replayapp
from typer.testing import CliRunner

from ratchet import State
from ratchet.cli.main import cli
from ratchet.testing import running_worker, start_counting_service, wait_for

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent


@pytest.fixture
def recorded(ledger_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The test's ledger URL and the ids of an ``order`` (succeeded) and a ``pipeline``
    (failed in its third step) a real worker ran with version 1."""
    with start_counting_service(tmp_path / "service.db") as svc:
        replayapp.SERVICE_URL = svc.url
        app = replayapp.make_app(ledger_url)
        ids = {"order": app.submit("order", {"order_id": "o-17"}, version=1).task_id,
               "pipeline": app.submit("pipeline", {"n": 4}, version=1).task_id,
               "order2": app.submit("order", {"order_id": "o-2"}, version=1).task_id}
        with running_worker(app, concurrency=2):
            for task_id in ids.values():
                wait_for(f"task {task_id} to end",
                         lambda t=task_id: app.get(t).state in (State.SUCCEEDED, State.FAILED),
                         timeout_s=60)
        app.close()
        yield ledger_url, ids


def _replay(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["replay", *args, "--app", "replayapp:app",
                                      "--ledger", url])
    return result.exit_code, result.output


def test_exit_status_and_text(recorded: tuple[str, dict[str, str]]) -> None:
    url, ids = recorded
    code, out = _replay(url, ids["order"])
    assert code == 0, out
    assert "reproduces the recorded history" in out and "3 of 3" in out

    code, out = _replay(url, ids["order"], "--version", "4")
    assert code == 1, out
    assert "DIVERGES at position 1" in out
    assert "recorded: effect 'charge' (occurrence 1) key 'charge:o-17'" in out
    assert "new code: calls effect 'charge' (occurrence 1) key 'pay:o-17'" in out

    code, out = _replay(url, ids["pipeline"], "--version", "2")
    assert code == 0, out
    assert ("history ends at position 2; the new code would next call step 'three' "
            "(occurrence 1)") in out


def test_json(recorded: tuple[str, dict[str, str]]) -> None:
    url, ids = recorded
    code, out = _replay(url, ids["order"], "--version", "3", "--json")
    assert code == 1, out
    data = json.loads(out)
    assert data["task_id"] == ids["order"] and data["version"] == 3
    assert data["recorded_version"] == 1 and data["reproduced"] is False
    assert data["divergence"] == {"position": 0, "recorded": "step 'quote' (occurrence 1)",
                                  "new": "calls step 'price' (occurrence 1)"}

    code, out = _replay(url, "--type", "order", "--version", "7", "--sample", "5", "--json")
    assert code == 1, out
    assert {(r["task_id"], r["reproduced"], r["divergence"] is None)
            for r in json.loads(out)} == {(ids["order"], True, True),
                                          (ids["order2"], False, False)}


def test_a_sample_of_a_type(recorded: tuple[str, dict[str, str]]) -> None:
    url, ids = recorded
    code, out = _replay(url, "--type", "order", "--version", "2", "--sample", "100")
    assert code == 0, out
    assert ids["order"] in out and "2 order tasks replayed: 2 reproduce, 0 diverge" in out
    code, out = _replay(url, "--type", "order", "--version", "7")
    assert code == 1, out
    assert "2 order tasks replayed: 1 reproduce, 1 diverge" in out
    [diverged] = [row for row in out.splitlines() if row.startswith("DIVERGES")]
    assert ids["order2"] in diverged and "diverges at position 0" in diverged
    code, out = _replay(url, "--type", "order", "--version", "7", "--sample", "1")
    assert code == 1 and "1 order tasks replayed" in out  # the newest: o-2
    assert ids["order2"] in out and ids["order"] not in out
    code, out = _replay(url, "--type", "pipeline", "--version", "2")
    assert code == 0, out
    assert "1 reach the end of their history" in out


@pytest.mark.parametrize(("args", "message"), [
    (["00000000000000000000000000000000"], "TaskNotFound"),
    (["{order}", "--version", "9"], "version 9"),
    (["--type", "nope", "--version", "1"], "UnknownTask"),
    (["--type", "order", "--sample", "0"], "sample"),
    (["{order}", "--type", "order"], "not both"),
    ([], "give a TASK id or --type TYPE"),
], ids=["unknown-task", "unknown-version", "unknown-type", "bad-sample", "both", "neither"])
def test_bad_input_exits_2(recorded: tuple[str, dict[str, str]], args: list[str],
                           message: str) -> None:
    url, ids = recorded
    code, out = _replay(url, *[a.format(order=ids["order"]) for a in args])
    assert code == 2, out
    assert message in out


@pytest.mark.parametrize("spec", ["nosuchmodule:app", "replayapp:nothing", "replayapp",
                                  "replayapp:make_app"])
def test_an_app_that_cannot_be_loaded_exits_2(recorded: tuple[str, dict[str, str]],
                                              spec: str) -> None:
    url, ids = recorded
    result = CliRunner().invoke(cli, ["replay", ids["order"], "--app", spec, "--ledger", url])
    assert result.exit_code == 2, result.output
    assert "ConfigError" in result.output
    result = CliRunner().invoke(cli, ["replay", ids["order"], "--ledger", url])
    assert result.exit_code == 2 and "--app" in result.output


def test_the_command_in_a_process_of_its_own(recorded: tuple[str, dict[str, str]]) -> None:
    url, ids = recorded
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    command = [sys.executable, "-m", "ratchet.cli.main", "replay", ids["order"], "--app",
               "replayapp:app", "--ledger", url]
    same = subprocess.run([*command, "--version", "2"], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=60)
    assert same.returncode == 0, same.stderr
    changed = subprocess.run([*command, "--version", "6"], cwd=HERE, env=env,
                             capture_output=True, text=True, timeout=60)
    assert changed.returncode == 1, changed.stderr
    assert "DIVERGES at position 3" in changed.stdout
