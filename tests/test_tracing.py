"""OpenTelemetry spans (ratchet.observe.tracing, DESIGN §9): a submit span whose trace
context is stored with the task (tasks.trace_context, both dialects) and comes back with
every claim; attempt spans of a real in-process worker that link to it (a retry's second
attempt to the same submit span), step and effect spans under the attempt, with their
attributes; the no-op path when OpenTelemetry cannot be imported."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ratchet import App, RetryPolicy, State, TaskContext
from ratchet.observe import tracing
from ratchet.testing import running_worker
from ratchet.testing.processes import wait_for

TYPE = "tr.work"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Ratchet's spans go to an in-memory exporter for this test (not the global
    provider, so no other test's worker traces)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure(provider)
    yield exporter
    tracing.configure()
    provider.shutdown()


def _register(app: App) -> None:
    @app.task(name=TYPE, version=3, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01,
                                                      max_delay_s=0.02, jitter=0.0))
    def work(ctx: TaskContext, n: int, fail_first: bool = False) -> int:
        doubled = ctx.step("double", lambda: n * 2)
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("first attempt fails")
        return int(ctx.effect("send", lambda key: doubled + 1, key=f"order-{n}",
                              idempotent=True))


def _by_name(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


def _wait_spans(exporter: InMemorySpanExporter, name: str, n: int) -> list[ReadableSpan]:
    """The spans called ``name`` once ``n`` have ended (the last attempt span ends on the
    writer thread after the final commit, which the test may see first)."""
    def probe() -> list[ReadableSpan] | None:
        found = _by_name(exporter.get_finished_spans(), name)
        return found if len(found) >= n else None

    return wait_for(f"{n} span(s) {name!r}", probe, timeout_s=20)


def test_attempt_step_effect_spans_link_to_the_submit_span(
    spans: InMemorySpanExporter, app: App
) -> None:
    _register(app)
    handle = app.submit(TYPE, {"n": 20}, idempotency_key="sub-1")
    [submit] = _by_name(spans.get_finished_spans(), f"submit {TYPE}")
    assert submit.kind is SpanKind.PRODUCER
    assert submit.attributes is not None
    assert submit.attributes["ratchet.task.id"] == handle.task_id
    assert submit.attributes["ratchet.idempotency_key"] == "sub-1"
    assert submit.attributes["ratchet.created"] is True
    assert submit.attributes["ratchet.task.version"] == 3
    with running_worker(app) as worker:
        assert isinstance(worker.middleware[0], tracing.TracingMiddleware)  # auto, first
        assert app.wait(handle.task_id, timeout_s=30).result == 41
        [attempt] = _wait_spans(spans, f"attempt {TYPE}", 1)
    sub = submit.get_span_context()
    assert sub is not None
    assert attempt.kind is SpanKind.CONSUMER
    [link] = attempt.links
    assert (link.context.trace_id, link.context.span_id) == (sub.trace_id, sub.span_id)
    assert attempt.parent is None  # link mode: a trace of its own
    attrs = dict(attempt.attributes or {})
    assert attrs["ratchet.task.id"] == handle.task_id
    assert attrs["ratchet.task.type"] == TYPE
    assert attrs["ratchet.task.version"] == 3
    assert attrs["ratchet.task.generation"] == 1 and attrs["ratchet.task.attempt"] == 1
    assert attrs["ratchet.worker.holder"] == worker.holder
    assert attrs["ratchet.outcome"] == "SUCCEEDED"
    assert attempt.status.status_code is StatusCode.UNSET
    ctx = attempt.get_span_context()
    assert ctx is not None
    [step] = _by_name(spans.get_finished_spans(), "step double")
    [effect] = _by_name(spans.get_finished_spans(), "effect send")
    for child in (step, effect):
        assert child.parent is not None and child.parent.span_id == ctx.span_id
        assert child.get_span_context().trace_id == ctx.trace_id  # type: ignore[union-attr]
        assert (child.attributes or {})["ratchet.task.id"] == handle.task_id
    assert (step.attributes or {})["ratchet.step.cached"] is False
    assert effect.kind is SpanKind.CLIENT
    assert (effect.attributes or {})["ratchet.effect.key"] == "order-20"
    assert (effect.attributes or {})["ratchet.effect.settled"] == "call"


def test_a_retry_links_to_the_same_submit_span(spans: InMemorySpanExporter, app: App) -> None:
    _register(app)
    handle = app.submit(TYPE, {"n": 1, "fail_first": True})
    [submit] = _by_name(spans.get_finished_spans(), f"submit {TYPE}")
    sub = submit.get_span_context()
    assert sub is not None
    with running_worker(app):
        assert app.wait(handle.task_id, timeout_s=30).state is State.SUCCEEDED
        attempts = _wait_spans(spans, f"attempt {TYPE}", 2)
    attempts.sort(key=lambda s: (s.attributes or {})["ratchet.task.attempt"])
    first, second = attempts
    for span in attempts:
        [link] = span.links
        assert (link.context.trace_id, link.context.span_id) == (sub.trace_id, sub.span_id)
    assert (first.attributes or {})["ratchet.outcome"] == "RETRY_WAIT"
    assert first.status.status_code is StatusCode.ERROR
    [event] = [e for e in first.events if e.name == "exception"]
    assert "first attempt fails" in str((event.attributes or {})["exception.message"])
    assert (second.attributes or {})["ratchet.outcome"] == "SUCCEEDED"
    assert (second.attributes or {})["ratchet.task.generation"] == 2
    # the retry found the first attempt's step committed: its span says cached
    steps = sorted(_by_name(spans.get_finished_spans(), "step double"),
                   key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})["ratchet.step.cached"] for s in steps] == [False, True]


def test_takeover_and_limited_claims_return_the_trace_context(
    spans: InMemorySpanExporter, app: App
) -> None:
    """The other two claim statements (claim_takeover, claim_limited) hand the stored
    context over as well."""
    from ratchet import Control

    @app.task(name="tr.short", lease_s=1.0)
    def short(ctx: TaskContext) -> str:
        return "ok"

    taken = app.submit("tr.short")
    [dead] = app.ledger.claim("dead-holder", [("tr.short", 1)], 1)  # its lease expires
    assert dead.trace_context is not None
    with Control(app=app) as control:
        control.set_limit("type", TYPE, maximum=4, reason="test: limited claim")
    _register(app)
    limited = app.submit(TYPE, {"n": 5})
    with running_worker(app):
        app.wait(taken.task_id, timeout_s=30)
        app.wait(limited.task_id, timeout_s=30)
        found = [*_wait_spans(spans, "attempt tr.short", 1),
                 *_wait_spans(spans, f"attempt {TYPE}", 1)]
    submits = {(s.attributes or {})["ratchet.task.id"]: s.get_span_context()
               for s in spans.get_finished_spans() if s.name.startswith("submit ")}
    for attempt in found:
        sub = submits[(attempt.attributes or {})["ratchet.task.id"]]
        assert sub is not None
        assert [link.context.span_id for link in attempt.links] == [sub.span_id]
    assert (found[0].attributes or {})["ratchet.takeover"] is True


def test_parent_mode_keeps_one_trace_per_task(spans: InMemorySpanExporter, app: App) -> None:
    _register(app)
    with running_worker(app, middleware=[tracing.TracingMiddleware(parent=True)]) as worker:
        assert sum(isinstance(m, tracing.TracingMiddleware) for m in worker.middleware) == 1
        handle = app.submit(TYPE, {"n": 2})
        app.wait(handle.task_id, timeout_s=30)
        [attempt] = _wait_spans(spans, f"attempt {TYPE}", 1)
    [submit] = _by_name(spans.get_finished_spans(), f"submit {TYPE}")
    sub = submit.get_span_context()
    assert sub is not None and attempt.parent is not None
    assert attempt.parent.span_id == sub.span_id
    assert attempt.get_span_context().trace_id == sub.trace_id  # type: ignore[union-attr]
    assert [link.context.span_id for link in attempt.links] == [sub.span_id]


def test_submit_many_is_one_span_for_the_batch(spans: InMemorySpanExporter, app: App) -> None:
    from ratchet import SubmitRequest

    _register(app)
    handles = app.submit_many([SubmitRequest(TYPE, {"n": i}) for i in range(3)])
    [batch] = _by_name(spans.get_finished_spans(), "submit_many")
    assert (batch.attributes or {})["ratchet.task.count"] == 3
    with running_worker(app):
        for h in handles:
            app.wait(h.task_id, timeout_s=30)
        attempts = _wait_spans(spans, f"attempt {TYPE}", 3)
    sub = batch.get_span_context()
    assert sub is not None
    assert {link.context.span_id for a in attempts for link in a.links} == {sub.span_id}


def test_submit_inside_a_span_continues_its_trace(spans: InMemorySpanExporter,
                                                  app: App) -> None:
    _register(app)
    provider = tracing._provider()
    with provider.get_tracer("test").start_as_current_span("request") as outer:
        app.submit(TYPE, {"n": 3})
    [submit] = _by_name(spans.get_finished_spans(), f"submit {TYPE}")
    assert submit.parent is not None
    assert submit.parent.span_id == outer.get_span_context().span_id


def test_no_provider_stores_no_trace_context(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path}/l.db")
    _register(app)
    try:
        assert not tracing.enabled()  # the API's proxy provider: nothing records
        handle = app.submit(TYPE, {"n": 1})
        with running_worker(app) as worker:
            assert not any(isinstance(m, tracing.TracingMiddleware) for m in worker.middleware)
            app.wait(handle.task_id, timeout_s=30)
    finally:
        app.close()
    with sqlite3.connect(tmp_path / "l.db") as db:
        assert db.execute("SELECT trace_context FROM tasks").fetchall() == [(None,)]


def test_switched_off_by_env(spans: InMemorySpanExporter, app: App,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_TRACE", "0")
    assert not tracing.enabled()
    _register(app)
    app.submit(TYPE, {"n": 1})
    assert spans.get_finished_spans() == ()


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"traceparent": 5}',
                                  '{"traceparent": "00-zz-yy-01"}', "\udcff"])
def test_bad_stored_context_is_ignored(text: str | None) -> None:
    assert tracing.parse_trace_context(text) is None


NO_OTEL = r'''
import sqlite3, sys
sys.modules["opentelemetry"] = None  # every "import opentelemetry..." raises ImportError
import ratchet
from ratchet.observe import tracing
from ratchet.testing import running_worker

db = sys.argv[1]
app = ratchet.App("sqlite:///" + db)

@app.task(name="tr.plain")
def plain(ctx, n):
    return ctx.effect("e", lambda key: ctx.step("s", lambda: n + 1), key="k", idempotent=True)

assert not tracing.available() and not tracing.enabled()
with tracing.submit_span("x") as span:
    assert span.trace_context is None
assert tracing.current_ids() is None
h = app.submit("tr.plain", {"n": 1})
with running_worker(app) as w:
    assert w.middleware == ()
    assert app.wait(h.task_id, timeout_s=30).result == 2
app.close()
print(sqlite3.connect(db).execute("SELECT trace_context FROM tasks").fetchall())
try:
    tracing.TracingMiddleware()
except ratchet.ConfigError as exc:
    print("ConfigError:", exc)
'''


def test_runs_as_a_no_op_without_opentelemetry(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", NO_OTEL, str(tmp_path / "l.db")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[(None,)]"
    assert "pip install 'ratchet[otel]'" in lines[1]


def test_cli_trace_without_opentelemetry_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "trproj.py").write_text("import ratchet\napp = ratchet.App()\n")
    # The SDK is what the ``otel`` extra adds: the API alone comes with FastAPI (a
    # dependency of the HTTP face the CLI imports), so "not installed" means no SDK.
    code = ("import sys; sys.modules['opentelemetry.sdk'] = None\n"
            "from ratchet.cli.main import main\n"
            "sys.argv = ['ratchet', 'worker', 'trproj:app', '--trace', '--ledger', "
            f"'sqlite:///{tmp_path}/l.db']\nmain()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False, cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr
    assert "OpenTelemetry is not installed (pip install 'ratchet[otel]')" in out.stderr


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_step_span_is_current_and_records_its_error(spans: InMemorySpanExporter,
                                                    app: App) -> None:
    tracer = tracing._provider().get_tracer("user-code")

    @app.task(name="tr.nested", retry=RetryPolicy(max_attempts=1))
    def nested(ctx: TaskContext) -> None:
        def inner() -> int:
            with tracer.start_as_current_span("user call"):
                return 1

        ctx.step("outer", inner)
        ctx.step("boom", lambda: 1 / 0)

    handle = app.submit("tr.nested")
    with running_worker(app):
        assert app.wait(handle.task_id, timeout_s=30).state is State.FAILED
        [attempt] = _wait_spans(spans, "attempt tr.nested", 1)
    finished = spans.get_finished_spans()
    [outer] = _by_name(finished, "step outer")
    [user] = _by_name(finished, "user call")
    [boom] = _by_name(finished, "step boom")
    assert user.parent is not None and outer.get_span_context() is not None
    assert user.parent.span_id == outer.get_span_context().span_id  # type: ignore[union-attr]
    assert boom.status.status_code is StatusCode.ERROR
    assert [e.name for e in boom.events] == ["exception"]
    assert (attempt.attributes or {})["ratchet.outcome"] == "FAILED"
    assert attempt.status.status_code is StatusCode.ERROR


def test_cli_trace_without_a_provider_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "trproj.py").write_text("import ratchet\napp = ratchet.App()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "worker", "trproj:app", "--trace",
         "--ledger", f"sqlite:///{tmp_path}/l.db"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env)
    assert out.returncode == 2, out.stderr
    assert "--trace: no TracerProvider is configured" in out.stderr
