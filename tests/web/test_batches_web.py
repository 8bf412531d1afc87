"""The web faces of batches and sharded jobs over real HTTP on both ledgers, with a real
worker: ``GET /api/tasks/{id}/batches`` (a task's runs; a sharded job's: its shards'),
``GET /api/tasks/{id}/check`` (200 either way, ``ok`` in the body; 404 for no such task),
the batch runs on ``GET /api/tasks/{id}``, and the task page's progress bars (a run held
at its watermark, a run without a total, a sharded job whose one shard FAILED midway)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from apisupport import api_server
from batchsupport import Gates, held, register, shard_items

from ratchet import App, Control, State
from ratchet.testing import running_worker
from ratchet.web import WebSettings, batchview

pytestmark = pytest.mark.timeout(120)


@dataclass
class Served:
    app: App
    control: Control
    client: httpx.Client
    gates: Gates


@pytest.fixture
def served(ledger_url: str) -> Iterator[Served]:
    app = App(ledger_url)
    gates = Gates()
    register(app, gates)
    app.ledger.schema_version()  # migrated before the service reads it
    control = Control(ledger_url)
    try:
        with running_worker(app, concurrency=4), \
                api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            try:
                yield Served(app, control, client, gates)
            finally:
                gates.release.set()
    finally:
        control.close()
        app.close()


def _bars(html: str) -> list[dict[str, str]]:
    """The ``data-*`` attributes of each ``div.batch`` of a task page, with its
    ``<progress>`` element's attributes (``value``, ``max``) and its text."""
    found = []
    for m in re.finditer(r'<div class="batch" ([^>]*)>(.*?)</div>\s*</div>', html, re.S):
        attrs = dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))
        bar = re.search(r"<progress ([^>]*)>", m.group(2))
        assert bar, m.group(0)
        attrs.update({f"bar-{k}": v for k, v in re.findall(r'(\w[\w-]*)="([^"]*)"',
                                                            bar.group(1))})
        attrs["text"] = re.sub(r"<[^>]+>", "", m.group(2))
        found.append(attrs)
    return found


def test_a_held_run_and_a_run_without_a_total(served: Served) -> None:
    app, control, client = served.app, served.control, served.client
    tid = app.submit("bt.items", {"n": 100, "size": 10, "parallel": 2,
                                  "hold": [20, 40]}).task_id
    stream = app.submit("bt.stream", {"n": 50, "size": 10, "hold": [30]}).task_id
    run = held(control, tid, 20, above=1)
    held(control, stream, 30)

    r = client.get(f"/api/tasks/{tid}/batches")
    assert r.status_code == 200, r.text
    [p] = r.json()
    assert (p["task_id"], p["name"], p["watermark"], p["total"], p["above"]) == (
        tid, "items", 20, 100, [[30, 40]])
    assert p["succeeded"] == 30 and p["rate_per_s"] == run.rate_per_s
    assert client.get(f"/api/tasks/{tid}").json()["batches"] == [p]
    r = client.get(f"/api/tasks/{tid}/check")
    assert r.status_code == 200 and r.json()["ok"] is True

    [bar] = _bars(client.get(f"/tasks/{tid}").text)
    assert (bar["run"], bar["watermark"], bar["total"]) == ("items", "20", "100")
    assert (bar["bar-value"], bar["bar-max"]) == ("20", "100")
    assert "20 / 100 (20.0%)" in bar["text"] and "1 committed above the watermark" in bar["text"]
    assert "30 succeeded" in bar["text"] and "3 batches" in bar["text"]
    [bar] = _bars(client.get(f"/tasks/{stream}").text)
    assert bar["total"] == "" and "bar-value" not in bar and "bar-max" not in bar
    assert "30 (total unknown)" in bar["text"] and "ETA -" in bar["text"]

    served.gates.release.set()
    assert app.wait(tid, timeout_s=60).state is State.SUCCEEDED
    [bar] = _bars(client.get(f"/tasks/{tid}").text)
    assert (bar["bar-value"], bar["bar-max"]) == ("100", "100") and "ETA done" in bar["text"]


def test_a_sharded_job_whose_shard_failed_midway(served: Served,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    app, client = served.app, served.client
    job = app.submit_sharded("bt.shard", {"n": 90, "fail_shard": 1}, shards=3).task_id
    assert app.wait(job, timeout_s=60).state is State.FAILED
    mine = shard_items(90, 3, 1)

    r = client.get(f"/api/tasks/{job}/check")
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["ok"] is False and report["shards"] == 3
    [line] = [x for x in report["lines"] if x["scope"] == "job"]
    assert line["difference"] == mine - 5 and line["expected"] == 90

    r = client.get(f"/api/tasks/{job}/batches")
    assert r.status_code == 200
    runs = r.json()
    children = {c.task_id: c for c in served.control.children(job)}
    assert sorted(p["task_id"] for p in runs) == sorted(children)
    assert sorted(p["total"] for p in runs) == sorted(shard_items(90, 3, i) for i in range(3))

    page = client.get(f"/tasks/{job}").text
    assert "Sharded job: 3 shards" in page
    bars = {b["shard"]: b for b in _bars(page)}
    assert sorted(bars) == ["0/3", "1/3", "2/3"]
    failed = bars["1/3"]
    assert (failed["bar-value"], failed["bar-max"]) == ("5", str(mine))
    assert "FAILED" in failed["text"] and "ETA stopped" in failed["text"]
    for index in (0, 2):
        n = shard_items(90, 3, index)
        assert (bars[f"{index}/3"]["bar-value"], bars[f"{index}/3"]["bar-max"]) == (
            str(n), str(n))
    # A job with more shard runs than the page draws counts the rest.
    monkeypatch.setattr(batchview, "MAX_SHARD_BARS", 2)
    page = client.get(f"/tasks/{job}").text
    assert [b["shard"] for b in _bars(page)] == ["0/3", "1/3"]
    assert "and 1 more shard run(s)" in page
    # A shard's own page says where it stands.
    shard_page = client.get(f"/tasks/{failed['task']}").text
    assert "Shard 1/3 of its job" in shard_page


def test_missing_task_is_a_404(served: Served) -> None:
    for path in ("/api/tasks/no-such-task/batches", "/api/tasks/no-such-task/check"):
        r = served.client.get(path)
        assert r.status_code == 404 and r.json()["error"] == "not_found", path
