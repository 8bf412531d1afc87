"""``ratchet worker --log-format json --trace-file PATH`` as a real process on a SQLite
ledger (DESIGN §9): every stderr line is one JSON object; each attempt has exactly one
outcome line (success included) with the correlation fields, its duration and the ids of
its span; a task's own log lines carry the task's fields (``key`` inside an effect);
httpx's per-request INFO lines are off; the spans the worker wrote to the file link to
the submit spans of this (other) process."""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ratchet import App, State
from ratchet.observe import logs, tracing
from ratchet.testing.processes import wait_for

MODULE = '''
import logging

import httpx

import ratchet
from ratchet.testing import fast_retry_policy

app = ratchet.App()
log = logging.getLogger("logproj")
QUICK = fast_retry_policy(base_delay_s=0.01, max_delay_s=0.02)


@app.task(name="lg.ok", version=2)
def ok(ctx, url):
    log.info("inside ok")

    def fetch(key):
        log.info("fetching")
        return httpx.get(url).status_code

    return ctx.effect("fetch", fetch, key="fetch-1", idempotent=True)


@app.task(name="lg.flaky", retry=QUICK)
def flaky(ctx):
    if ctx.attempt == 1:
        raise RuntimeError("flaky once")
    return "ok"


@app.task(name="lg.bad", retry=ratchet.RetryPolicy(max_attempts=1))
def bad(ctx):
    raise ValueError("always bad")
'''


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def submit_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.configure()
    provider.shutdown()


def test_json_logs_and_file_spans_of_a_worker_process(
    tmp_path: Path, http_url: str, submit_spans: InMemorySpanExporter
) -> None:
    (tmp_path / "logproj.py").write_text(MODULE)
    url = f"sqlite:///{tmp_path}/l.db"
    span_file = tmp_path / "spans.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("RATCHET_TRACE", None)
    err_path = tmp_path / "worker.err"
    with err_path.open("wb") as err, (tmp_path / "worker.out").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli.main", "worker", "logproj:app", "--ledger", url,
             "--log-format", "json", "--trace-file", str(span_file),
             "--poll-interval-s", "0.02", "--concurrency", "2"],
            cwd=tmp_path, env=env, stdout=out, stderr=err,
        )
        app = App(ledger=url)
        for name in ("lg.ok", "lg.flaky", "lg.bad"):
            app.task(name=name, version=2 if name == "lg.ok" else 1)(lambda ctx, **kw: None)
        try:
            ids = {
                "ok": app.submit("lg.ok", {"url": http_url}).task_id,
                "flaky": app.submit("lg.flaky").task_id,
                "bad": app.submit("lg.bad").task_id,
            }
            final = {k: app.wait(v, timeout_s=60).state for k, v in ids.items()}
            assert final == {"ok": State.SUCCEEDED, "flaky": State.SUCCEEDED,
                             "bad": State.FAILED}
            # the last outcome line follows the final commit: wait for it, not a sleep
            wait_for("three outcome lines of SUCCEEDED/FAILED", lambda: sum(
                '"outcome": "SUCCEEDED"' in ln or '"outcome": "FAILED"' in ln
                for ln in err_path.read_text().splitlines()) >= 3, timeout_s=30)
        finally:
            app.close()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err_path.read_text()

    text = err_path.read_text()
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # every line is one JSON object
        assert {"ts", "level", "logger", "message"} <= record.keys(), record
        assert record["ts"].endswith("Z")
        records.append(record)
    assert not [r for r in records if r["logger"].startswith(("httpx", "httpcore"))]

    outcomes = [r for r in records if r.get("event") == "attempt"]
    per_attempt = Counter((r["task_id"], r["generation"]) for r in outcomes)
    assert set(per_attempt.values()) == {1}, per_attempt  # exactly one line per attempt
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(outcomes, key=lambda r: r["generation"]):
        by_task.setdefault(r["task_id"], []).append(r)
    assert [r["outcome"] for r in by_task[ids["ok"]]] == ["SUCCEEDED"]
    assert [r["outcome"] for r in by_task[ids["flaky"]]] == ["RETRY_WAIT", "SUCCEEDED"]
    assert [r["outcome"] for r in by_task[ids["bad"]]] == ["FAILED"]
    for r in outcomes:
        assert r["logger"] == "ratchet.attempt"
        assert {"type", "generation", "attempt", "version", "holder", "duration_s",
                "trace_id", "span_id"} <= r.keys(), r
        assert r["duration_s"] >= 0
    [ok_line] = by_task[ids["ok"]]
    assert (ok_line["type"], ok_line["version"], ok_line["level"]) == ("lg.ok", 2, "INFO")
    [bad_line] = by_task[ids["bad"]]
    assert bad_line["level"] == "ERROR" and "ValueError: always bad" in bad_line["error"]
    assert by_task[ids["flaky"]][0]["level"] == "WARNING"

    [inside] = [r for r in records if r["message"] == "inside ok"]
    assert inside["task_id"] == ids["ok"] and inside["holder"] == ok_line["holder"]
    assert inside["trace_id"] == ok_line["trace_id"]
    [fetching] = [r for r in records if r["message"] == "fetching"]
    assert (fetching["effect"], fetching["key"], fetching["task_id"]) == (
        "fetch", "fetch-1", ids["ok"])
    assert fetching["span_id"] != ok_line["span_id"]  # the effect's span is current there

    # spans: written by the worker process, linked to the submit spans made here
    submits = {(s.attributes or {})["ratchet.task.id"]: s.get_span_context()
               for s in submit_spans.get_finished_spans() if s.name.startswith("submit ")}
    attempts = [s for s in (json.loads(ln) for ln in span_file.read_text().splitlines())
                if s["name"].startswith("attempt ")]
    assert len(attempts) == 4
    for span in attempts:
        task_id = span["attributes"]["ratchet.task.id"]
        sub = submits[task_id]
        assert sub is not None
        assert span["links"] == [{"trace_id": f"{sub.trace_id:032x}",
                                  "span_id": f"{sub.span_id:016x}"}]
        [line] = [r for r in outcomes if (r["task_id"], r["generation"]) == (
            task_id, span["attributes"]["ratchet.task.generation"])]
        assert (line["trace_id"], line["span_id"]) == (span["trace_id"], span["span_id"])
        assert span["attributes"]["ratchet.outcome"] == line["outcome"]
        assert span["resource"]["service.name"] == "ratchet-worker"


def test_json_formatter_fields_and_exceptions() -> None:
    formatter = logs.JsonFormatter()
    record = logging.LogRecord("x.y", logging.WARNING, __file__, 1, "hello %s", ("w\nz",),
                               None)
    record.task_id = "t1"
    record.generation = 3
    out = json.loads(formatter.format(record))
    assert out["message"] == "hello w\nz" and out["task_id"] == "t1"
    assert out["generation"] == 3 and out["level"] == "WARNING" and out["logger"] == "x.y"
    assert "\n" not in formatter.format(record)
    try:
        raise KeyError("boom")
    except KeyError:
        record.exc_info = sys.exc_info()
    assert "KeyError: 'boom'" in json.loads(formatter.format(record))["exc"]


def test_bad_log_format_is_one_clear_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "worker", "x:app", "--log-format", "xml"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert out.returncode == 2
    assert "--log-format must be text or json" in out.stderr
