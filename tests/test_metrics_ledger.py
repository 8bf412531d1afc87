"""The ledger collector (ratchet.observe.ledger_metrics) served by the web app's
``/metrics`` over real HTTP (uvicorn on loopback): per-state gauges and audit totals equal
what ``Control.status`` holds, on both ledgers; a ledger it cannot read is
``ratchet_ledger_up 0``, not a failed scrape."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from ratchet import App, OutcomeUnknownError, PermanentError, RetryPolicy, State, TaskContext
from ratchet.control import Control
from ratchet.errors import InvalidArguments
from ratchet.observe.ledger_metrics import ledger_metrics_registry, render_ledger_metrics
from ratchet.observe.metrics import check_labels
from ratchet.testing.processes import wait_for
from ratchet.testing.worker import running_worker
from ratchet.web.app import WebSettings, create_app

pytestmark = pytest.mark.timeout(120)

ONCE = RetryPolicy(max_attempts=1)

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(series: Series, name: str, **labels: str) -> float | None:
    return series.get((name, frozenset(labels.items())))


@pytest.fixture
def served(ledger_url: str) -> Iterator[tuple[str, Control]]:
    """The web app on ``ledger_url``, served by uvicorn on a free loopback port:
    ``(metrics URL, its Control)``."""
    control = Control(ledger_url)
    app = create_app(WebSettings(ledger_url=ledger_url), control=control)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for("uvicorn to start", lambda: server.started, 20)
        yield f"http://127.0.0.1:{port}/metrics", control
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def _fill(app: App) -> None:
    """Tasks in several states: succeeded, failed, unknown, ready and scheduled pending."""

    @app.task(name="lm.ok", retry=ONCE)
    def ok(ctx: TaskContext, n: int) -> int:
        return n

    @app.task(name="lm.bad", retry=ONCE)
    def bad(ctx: TaskContext) -> None:
        raise PermanentError("no")

    def lost(key: str) -> object:
        raise OutcomeUnknownError("reply lost")

    @app.task(name="lm.unknown", retry=ONCE)
    def unknown(ctx: TaskContext) -> object:
        return ctx.effect("ship", key=f"ship-{ctx.task_id}", call=lost)

    @app.task(name="lm.idle")
    def idle(ctx: TaskContext) -> None:
        return None

    ran = [app.submit("lm.ok", {"n": i}) for i in range(5)]
    ran += [app.submit("lm.bad", {}), app.submit("lm.unknown", {})]
    app.submit("lm.ok", {"n": 99}, delay_s=3600)  # scheduled, not ready
    for _ in range(3):
        app.submit("lm.idle", {})  # no worker runs it: ready backlog
    with running_worker(app, concurrency=2, names=["lm.ok", "lm.bad", "lm.unknown"]):
        for handle in ran:
            app.wait(handle.task_id, 30)


def test_ledger_gauges_equal_control_status(app: App, served: tuple[str, Control]) -> None:
    url, control = served
    _fill(app)
    reply = httpx.get(url, timeout=10.0)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    s = parse(reply.text)
    report = control.status()  # nothing runs now: the same figures
    assert value(s, "ratchet_ledger_up") == 1
    assert report.counts["lm.ok"]["SUCCEEDED"] == 5
    for name, states in report.counts.items():
        for state in State:
            assert value(s, "ratchet_ledger_tasks", type=name, state=state.value.lower()) == \
                states.get(state.value, 0), (name, state)
    assert value(s, "ratchet_ledger_tasks", type="lm.unknown", state="unknown") == 1
    assert value(s, "ratchet_ledger_tasks", type="lm.bad", state="failed") == 1
    assert value(s, "ratchet_ledger_tasks", type="lm.idle", state="pending") == 3
    for attr in ("claims", "takeovers", "revocations", "stale_rejections", "lookup_hits",
                 "idempotency_conflicts", "operator_actions"):
        assert value(s, f"ratchet_ledger_{attr}_total") == getattr(report, attr), attr
    assert report.claims >= 7
    assert value(s, "ratchet_ledger_late_effects") == report.late_effects
    by_name = {t.name: t for t in report.types}
    assert set(by_name) == {"lm.ok", "lm.bad", "lm.unknown", "lm.idle"}
    for t in report.types:
        for metric, attr in [
            ("ratchet_ledger_backlog_tasks", "backlog"),
            ("ratchet_ledger_scheduled_tasks", "scheduled"),
            ("ratchet_ledger_unknown_tasks", "unknown"),
            ("ratchet_ledger_quarantined_tasks", "quarantined"),
        ]:
            assert value(s, metric, type=t.name) == getattr(t, attr), (metric, t.name)
        assert sum(t.counts.values()) == t.total
    assert by_name["lm.idle"].backlog == 3
    assert by_name["lm.ok"].scheduled == 1
    assert by_name["lm.unknown"].unknown == 1
    assert value(s, "ratchet_ledger_unknown_tasks", type="lm.unknown") == 1
    # Ages and rates move with the clock: present, and in range.
    assert value(s, "ratchet_ledger_oldest_pending_age_seconds", type="lm.idle") > 0  # type: ignore[operator]
    assert value(s, "ratchet_ledger_oldest_pending_age_seconds", type="lm.ok") == 0
    assert value(s, "ratchet_ledger_oldest_unknown_age_seconds", type="lm.unknown") > 0  # type: ignore[operator]
    assert value(s, "ratchet_ledger_arrivals_per_second", type="lm.ok") > 0  # type: ignore[operator]
    assert value(s, "ratchet_ledger_completions_per_second", type="lm.ok") > 0  # type: ignore[operator]
    assert value(s, "ratchet_ledger_rate_window_seconds") == 60
    for name in by_name:  # the ETA is there only while a backlog drains
        eta = value(s, "ratchet_ledger_drain_eta_seconds", type=name)
        assert (eta is None) == (by_name[name].drain_eta_s is None), name
    assert check_labels(ledger_metrics_registry(control)) == len(s)


def test_bad_window_is_refused_at_once(tmp_path: Path) -> None:
    control = Control(f"sqlite:///{tmp_path}/l.db")
    try:
        with pytest.raises(InvalidArguments, match="window_s must be a number of seconds"):
            ledger_metrics_registry(control, window_s=0)
    finally:
        control.close()


def test_unreadable_ledger_is_up_zero(tmp_path: Path) -> None:
    control = Control(f"sqlite:///{tmp_path}/missing.db")  # nothing there; none is created
    try:
        body, content_type = render_ledger_metrics(control)
    finally:
        control.close()
    assert content_type.startswith("text/plain")
    s = parse(body.decode())
    assert value(s, "ratchet_ledger_up") == 0
    assert not any(name.startswith("ratchet_ledger_tasks") for name, _ in s)
    assert not (tmp_path / "missing.db").exists()


def test_reconcile_findings_are_counted_from_the_ledger(
        app: App, served: tuple[str, Control]) -> None:
    url, control = served
    _fill(app)
    before = parse(httpx.get(url, timeout=10.0).text)
    assert value(before, "ratchet_reconcile_runs_total") == 0
    assert value(before, "ratchet_reconcile_findings_total", outcome="absent") == 0
    task = control.list_tasks(name="lm.ok").tasks[0]
    control.record_reconcile(
        "lm.ok", {"checked": 2},
        [(task.task_id, "absent", task.generation, {"key": "k1"}),
         (task.task_id, "unrecorded", task.generation, {"key": "k2"})], by="test")
    after = parse(httpx.get(url, timeout=10.0).text)
    assert value(after, "ratchet_reconcile_runs_total") == 1
    assert value(after, "ratchet_reconcile_findings_total", outcome="absent") == 1
    assert value(after, "ratchet_reconcile_findings_total", outcome="unrecorded") == 1
    assert value(after, "ratchet_reconcile_findings_total", outcome="late") == 0
    assert check_labels(ledger_metrics_registry(control)) == len(after)


def test_a_flood_of_task_types_is_capped_with_an_other_bucket(
        ledger_url: str, served: tuple[str, Control], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ledger metrics label values come from the ledger's task names: a ledger holding
    more distinct types than ``MAX_TYPE_SERIES`` reports the first by name and sums the
    rest (a real type named ``other`` included) under ``type="other"``: bounded series,
    nothing lost from the totals."""
    from ratchet.observe import ledger_metrics

    monkeypatch.setattr(ledger_metrics, "MAX_TYPE_SERIES", 5)
    url, _control = served
    flood = App(ledger_url)
    names = [f"flood.t{i:02d}" for i in range(12)] + ["other"]
    try:
        for name in names:
            flood.task(name=name)(lambda ctx: None)
            flood.submit(name, {})
        s = parse(httpx.get(url, timeout=30.0).text)
    finally:
        flood.close()
    types = {dict(labels)["type"] for name, labels in s
             if name == "ratchet_ledger_tasks"}
    assert types == {"flood.t00", "flood.t01", "flood.t02", "flood.t03", "other"}
    assert value(s, "ratchet_ledger_tasks", type="other", state="pending") == 9
    assert sum(v for (name, labels), v in s.items() if name == "ratchet_ledger_backlog_tasks"
               ) == len(names)
    for (name, labels) in s:
        if name.startswith("ratchet_ledger_") and "type" in dict(labels):
            assert dict(labels)["type"] in types
