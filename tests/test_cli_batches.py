"""The command-line faces of batches and sharded jobs on both ledgers, with a real worker:
``ratchet check`` (exit 0 when a task's counts add up, 1 with the difference when a shard
FAILED midway left items unprocessed, 2 for no such task or no ledger) and what
``ratchet inspect`` shows of a batch run (watermark / total, counts, batches committed above
the watermark, rate, ETA), of a shard and of a sharded job (text and ``--json``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batchsupport import Gates, held, register, shard_items
from typer.testing import CliRunner

from ratchet import App, Control, State
from ratchet.cli import batches as cli_batches
from ratchet.cli.batches import eta_text, progress_text, rate_text
from ratchet.cli.main import cli
from ratchet.testing import running_worker

pytestmark = pytest.mark.timeout(120)


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture
def gates(app: App) -> Gates:
    made = Gates()
    register(app, made)
    return made


def test_check_of_a_finished_sharded_job_adds_up(app: App, gates: Gates,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    url = app.ledger_url
    job = app.submit_sharded("bt.shard", {"n": 60}, shards=3).task_id
    with running_worker(app):
        assert app.wait(job, timeout_s=60).state is State.SUCCEEDED
    code, out = _run("check", job, "--ledger", url)
    assert code == 0, out
    assert "job" in out and "every line adds up" in out and "shard 2/3" in out
    code, out = _run("check", job, "--ledger", url, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] and report["shards"] == 3 and len(report["lines"]) == 4
    [job_line] = [x for x in report["lines"] if x["scope"] == "job"]
    assert job_line["expected"] == 60 and job_line["succeeded"] == 60
    assert job_line["difference"] == 0 and job_line["in_flight"] == 0

    # inspect of the job: its shard count and one line per shard.
    code, out = _run("inspect", job, "--ledger", url)
    assert code == 0, out
    assert "sharded job: 3 shards" in out
    for index in range(3):
        mine = shard_items(60, 3, index)
        assert f"{index}/3" in out and f"mine {mine} / {mine} (100.0%) done" in out
    monkeypatch.setattr(cli_batches, "MAX_SHARD_ROWS", 2)
    code, out = _run("inspect", job, "--ledger", url)
    assert "2/3" not in out and "... and 1 more (--json lists every one)" in out
    code, out = _run("inspect", job, "--ledger", url, "--json")
    tl = json.loads(out)
    assert tl["shards"] == 3 and tl["batches"] == []
    assert sorted(p["total"] for p in tl["shard_batches"]) == sorted(
        shard_items(60, 3, i) for i in range(3))
    # inspect of a shard: its place and its run.
    child = next(c for c in tl["children"] if c["params"]["ratchet:shard"]["index"] == 1)
    code, out = _run("inspect", child["task_id"], "--ledger", url)
    assert code == 0, out
    assert "shard: 1/3" in out and "batch runs (1)" in out


def test_check_exits_1_with_the_difference_when_a_shard_fails_midway(
        app: App, gates: Gates) -> None:
    url = app.ledger_url
    job = app.submit_sharded("bt.shard", {"n": 90, "fail_shard": 1}, shards=3).task_id
    with running_worker(app):
        assert app.wait(job, timeout_s=60).state is State.FAILED
    mine = shard_items(90, 3, 1)
    assert mine > 5  # the shard fails in its second batch: items are left over
    code, out = _run("check", job, "--ledger", url, "--json")
    assert code == 1, out
    report = json.loads(out)
    assert not report["ok"]
    [failed] = [x for x in report["lines"] if x["scope"].startswith("shard 1/3")]
    processed = failed["succeeded"] + failed["failed"] + failed["skipped"]
    assert processed == 5 and failed["expected"] == mine and failed["in_flight"] == 0
    assert failed["difference"] == mine - 5 and not failed["ok"]
    assert "FAILED" in failed["note"]
    [job_line] = [x for x in report["lines"] if x["scope"] == "job"]
    assert not job_line["ok"] and job_line["difference"] == mine - 5
    assert all(x["ok"] for x in report["lines"]
               if x["scope"].startswith(("shard 0/3", "shard 2/3")))
    code, out = _run("check", job, "--ledger", url)
    assert code == 1
    assert "does not add up" in out and f"difference {mine - 5}" in out
    code, out = _run("inspect", job, "--ledger", url)
    assert code == 0 and f"mine 5 / {mine} ({100 * 5 / mine:.1f}%), stopped" in out
    # The failed shard itself: its own run does not add up either.
    code, out = _run("check", failed["task_id"], "--ledger", url)
    assert code == 1 and f"difference {mine - 5}" in out


def test_inspect_shows_a_run_standing_at_its_watermark(app: App, gates: Gates) -> None:
    url = app.ledger_url
    # parallel 2, size 10: the batch at 20 holds, the one at 30 commits above the
    # watermark, the one at 40 holds too: watermark 20, one batch above it.
    tid = app.submit("bt.items", {"n": 100, "size": 10, "parallel": 2,
                                  "hold": [20, 40]}).task_id
    stream = app.submit("bt.stream", {"n": 50, "size": 10, "hold": [30]}).task_id
    with running_worker(app, concurrency=2):
        try:
            with Control(url) as control:
                run = held(control, tid, 20, above=1)
                held(control, stream, 30)
            code, out = _run("inspect", tid, "--ledger", url)
            assert code == 0, out
            assert "batch runs (1)" in out and "20 / 100 (20.0%)" in out
            assert "1: 30-40" in out  # the batch committed above the watermark
            assert rate_text(run) in out and eta_text(run) in out
            code, out = _run("inspect", tid, "--ledger", url, "--json")
            [p] = json.loads(out)["batches"]
            assert (p["name"], p["watermark"], p["total"], p["above"], p["done"]) == (
                "items", 20, 100, [[30, 40]], False)
            assert p["succeeded"] == 30 and p["batches"] == 3
            assert p["rate_per_s"] == run.rate_per_s
            code, out = _run("inspect", stream, "--ledger", url)
            assert "30 (total unknown)" in out
            # A task that is not done has nothing it failed to process: check is ok.
            code, out = _run("check", tid, "--ledger", url)
            assert code == 0, out
        finally:
            gates.release.set()
        assert app.wait(tid, timeout_s=60).state is State.SUCCEEDED
        assert app.wait(stream, timeout_s=60).state is State.SUCCEEDED
    code, out = _run("inspect", tid, "--ledger", url)
    assert "100 / 100 (100.0%) done" in out
    with Control(url) as control:
        [p] = control.batch_progress(tid)
    assert progress_text(p) == "100 / 100 (100.0%) done" and p.eta_s == 0.0


def test_check_of_a_missing_task_and_of_no_ledger(app: App, tmp_path: Path) -> None:
    app.ledger.schema_version()  # the ledger exists
    code, out = _run("check", "no-such-task", "--ledger", app.ledger_url)
    assert code == 2 and "TaskNotFound" in out
    code, out = _run("check", "t1", "--ledger", f"sqlite:///{tmp_path}/absent/l.db")
    assert code == 2 and "LedgerUnavailable" in out
