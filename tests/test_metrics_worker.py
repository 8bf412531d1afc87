"""Worker Prometheus metrics (ratchet.observe.metrics): a real in-process worker on a real
ledger, scraped over real HTTP. Counters move for success, retry, unknown and lookup hit;
renewals are observed; the number of series does not grow with the tasks run; labels stay
inside the allow-list; ``ratchet worker --metrics-port 0`` serves /metrics."""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from ratchet import (
    App,
    CircuitBreaker,
    OutcomeUnknownError,
    State,
    SubmitRequest,
    TaskContext,
    TransientError,
)
from ratchet.control import Control
from ratchet.errors import ConfigError
from ratchet.observe.metrics import (
    ALLOWED_LABELS,
    MetricsServer,
    WorkerMetrics,
    check_label_names,
    check_labels,
)
from ratchet.testing import fast_retry_policy
from ratchet.testing.processes import ProcessGroup, wait_for
from ratchet.testing.worker import running_worker
from ratchet.worker import Worker

pytestmark = pytest.mark.timeout(120)

FAST = fast_retry_policy(max_delay_s=0.05)

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Series:
    """GET the exposition and parse it: ``{(sample name, labels): value}``."""
    reply = httpx.get(url, timeout=10.0)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    out: Series = {}
    for family in text_string_to_metric_families(reply.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(series: Series, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return series.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def metrics() -> Iterator[tuple[WorkerMetrics, MetricsServer]]:
    m = WorkerMetrics()
    server = MetricsServer(m.registry)  # 127.0.0.1, a free port
    try:
        yield m, server
    finally:
        server.close()


def test_counters_move_for_success_retry_unknown_and_lookup_hit(
    app: App, metrics: tuple[WorkerMetrics, MetricsServer]
) -> None:
    m, server = metrics
    app.downstream("psp", breaker=CircuitBreaker(failure_threshold=3))

    @app.task(name="m.ok", retry=FAST)
    def ok(ctx: TaskContext) -> int:
        return int(ctx.step("s", lambda: 1)) + int(
            ctx.effect("charge", key=f"charge-{ctx.task_id}", call=lambda k: 1,
                       downstream="psp"))

    @app.task(name="m.flaky", retry=FAST)
    def flaky(ctx: TaskContext) -> str:
        if ctx.attempt == 1:
            raise TransientError("first attempt fails")
        return "ok"

    def lost_reply(key: str) -> object:
        raise OutcomeUnknownError("reply lost")

    @app.task(name="m.unknown", retry=FAST)
    def unknown(ctx: TaskContext) -> object:
        return ctx.effect("ship", key=f"ship-{ctx.task_id}", call=lost_reply)

    @app.task(name="m.lookup", retry=FAST)
    def lookup(ctx: TaskContext) -> object:
        return ctx.effect("refund", key=f"refund-{ctx.task_id}", call=lost_reply,
                          lookup=lambda k: {"found": k})

    with running_worker(app, concurrency=4, middleware=[m]):
        handles = {name: app.submit(name, {}) for name in ("m.ok", "m.flaky", "m.unknown",
                                                             "m.lookup")}
        assert app.wait(handles["m.ok"].task_id, 30).state is State.SUCCEEDED
        assert app.wait(handles["m.flaky"].task_id, 30).state is State.SUCCEEDED
        assert app.wait(handles["m.unknown"].task_id, 30).state is State.UNKNOWN
        assert app.wait(handles["m.lookup"].task_id, 30).state is State.SUCCEEDED

        def settled() -> Series | None:
            s = scrape(server.url)
            done = sum(value(s, "ratchet_attempts_total", type=t, outcome=o) for t, o in [
                ("m.ok", "succeeded"), ("m.flaky", "succeeded"), ("m.unknown", "unknown"),
                ("m.lookup", "succeeded")])
            return s if done == 4 else None

        s = wait_for("every attempt counted", settled, 30)

    assert value(s, "ratchet_claims_total", type="m.flaky") == 2
    assert value(s, "ratchet_attempts_total", type="m.flaky", outcome="retry_wait") == 1
    assert value(s, "ratchet_retries_total", type="m.flaky") == 1
    assert value(s, "ratchet_retries_total", type="m.ok") == 0
    assert value(s, "ratchet_steps_total", type="m.ok", outcome="ran") == 1
    assert value(s, "ratchet_effects_total", type="m.ok", outcome="call") == 1
    assert value(s, "ratchet_effects_total", type="m.unknown", outcome="unknown") == 1
    assert value(s, "ratchet_effects_total", type="m.lookup", outcome="lookup") == 1
    assert value(s, "ratchet_effects_total", type="m.lookup", outcome="call") == 0
    assert value(s, "ratchet_effect_duration_seconds_count", type="m.ok") == 1
    assert value(s, "ratchet_attempt_duration_seconds_count", type="m.flaky") == 2
    assert value(s, "ratchet_downstream_requests_total", downstream="psp") == 1
    assert value(s, "ratchet_circuit_breaker_state", downstream="psp", state="closed") == 1
    assert value(s, "ratchet_circuit_breaker_state", downstream="psp", state="open") == 0
    assert value(s, "ratchet_commits_total", outcome="ok") > 0
    assert value(s, "ratchet_stale_rejections_total", type="m.ok") == 0
    assert value(s, "ratchet_stuck_threads") == 0
    check_labels(m.registry)


def test_renewals_are_observed_and_the_lease_window_is_shown(
    app: App, metrics: tuple[WorkerMetrics, MetricsServer]
) -> None:
    m, server = metrics
    release = threading.Event()

    @app.task(name="m.slow", lease_s=1.0)
    def slow(ctx: TaskContext) -> str:
        release.wait(30)  # renewed every lease_s / 3 meanwhile
        return "done"

    with running_worker(app, concurrency=1, middleware=[m]):
        handle = app.submit("m.slow", {})

        def renewed() -> Series | None:
            s = scrape(server.url)
            return s if value(s, "ratchet_lease_renewal_duration_seconds_count") >= 2 else None

        s = wait_for("two renewals observed", renewed, 30)
        assert value(s, "ratchet_leases_held") == 1
        remaining = value(s, "ratchet_lease_min_remaining_seconds")
        assert 0 < remaining <= 1.0
        assert value(s, "ratchet_lease_renewals_total", outcome="ok") >= 2
        assert value(s, "ratchet_lease_renewals_total", outcome="error") == 0
        assert value(s, "ratchet_leases_revoked_total") == 0
        # Every observation fell in some bucket: the +Inf bucket equals the count.
        assert value(s, "ratchet_lease_renewal_duration_seconds_bucket", le="+Inf") == value(
            s, "ratchet_lease_renewal_duration_seconds_count")
        release.set()
        assert app.wait(handle.task_id, 30).state is State.SUCCEEDED
        s = wait_for("the lease dropped", lambda: (lambda x: x if value(
            x, "ratchet_leases_held") == 0 else None)(scrape(server.url)), 30)
    assert ("ratchet_lease_min_remaining_seconds", frozenset()) not in s


def _submit(app: App, start: int, stop: int) -> None:
    """Submit tasks ``start`` .. ``stop - 1`` (each with its own business key)."""
    for lo in range(start, stop, 1000):
        app.submit_many([SubmitRequest("m.noop", {"n": i}, idempotency_key=f"order-{i}")
                         for i in range(lo, min(stop, lo + 1000))])


def test_series_do_not_grow_with_tasks_run(
    tmp_path: Path, metrics: tuple[WorkerMetrics, MetricsServer]
) -> None:
    m, server = metrics
    app = App(f"sqlite:///{tmp_path}/l.db")

    @app.task(name="m.noop")
    def noop(ctx: TaskContext, n: int) -> int:
        return n

    try:
        with running_worker(app, concurrency=8, middleware=[m]):

            def after(total: int) -> Series:
                def probe() -> Series | None:
                    s = scrape(server.url)
                    done = value(s, "ratchet_attempts_total", type="m.noop", outcome="succeeded")
                    return s if done == total and value(s, "ratchet_leases_held") == 0 else None

                return wait_for(f"{total} tasks counted", probe, 60)

            _submit(app, 0, 1000)
            first = after(1000)
            _submit(app, 1000, 10_000)
            second = after(10_000)
    finally:
        app.close()
    assert value(second, "ratchet_claims_total", type="m.noop") == 10_000
    assert set(first) == set(second), set(first) ^ set(second)
    assert len(second) == check_labels(m.registry)
    for name, labels in second:
        for label, text in labels:
            assert label in ALLOWED_LABELS | {"le"}, (name, label)
            assert not re.search(r"order-|[0-9a-f]{16,}", text), (name, label, text)


def test_label_allow_list_is_enforced() -> None:
    with pytest.raises(ConfigError, match=r"label\(s\) \['task_id'\] not in the allow-list"):
        check_label_names("ratchet_x", ["type", "task_id"])
    registry = CollectorRegistry()
    Counter("rogue", "a metric with a label outside the list", ["message_id"],
            registry=registry).labels("m1").inc()
    with pytest.raises(ConfigError, match=r"metric rogue_total: label\(s\) \['message_id'\]"):
        check_labels(registry)
    assert check_labels(WorkerMetrics(process=True).registry) > 0


def test_bad_metrics_port_is_a_config_error(
    metrics: tuple[WorkerMetrics, MetricsServer]
) -> None:
    m, server = metrics
    with pytest.raises(ConfigError, match=r"cannot serve metrics on 127\.0\.0\.1:"):
        MetricsServer(m.registry, "127.0.0.1", server.port)  # taken
    with pytest.raises(ConfigError, match="from 0 to 65535"):
        MetricsServer(m.registry, port=70000)


APP = '''
import ratchet

app = ratchet.App()


@app.task(name="mx.echo")
def echo(ctx, n):
    return n
'''


def test_worker_process_serves_metrics_on_port_zero(tmp_path: Path) -> None:
    (tmp_path / "mxapp.py").write_text(textwrap.dedent(APP))
    url = f"sqlite:///{tmp_path}/l.db"
    with ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path]) as procs:
        w = procs.worker("mxapp:app", url, args=["--metrics-port", "0"])
        w.holder()  # started (the metrics line comes first)
        found = re.search(r"metrics on (http://127\.0\.0\.1:(\d+)/metrics)", w.log())
        assert found, w.log()
        assert int(found.group(2)) > 0
        app = App(url)
        app.task(name="mx.echo")(lambda ctx, n: n)
        try:
            handle = app.submit("mx.echo", {"n": 1})
            assert app.wait(handle.task_id, 30).state is State.SUCCEEDED
        finally:
            app.close()

        def counted() -> Series | None:
            s = scrape(found.group(1))
            done = value(s, "ratchet_attempts_total", type="mx.echo", outcome="succeeded")
            return s if done == 1 else None

        s = wait_for("the worker process to count the attempt", counted, 30)
        assert value(s, "ratchet_claims_total", type="mx.echo") == 1
        assert value(s, "process_cpu_seconds_total") > 0  # process metrics of the worker
        assert not any(name.endswith("_created") for name, _ in s)
        assert w.stop() == 0, w.log()
    with pytest.raises(httpx.TransportError):
        httpx.get(found.group(1), timeout=2.0)


def test_no_middleware_costs_nothing_on_the_heartbeat(app: App) -> None:
    """Without middleware the heartbeat keeps no hooks (the 'is None' rule)."""

    @app.task(name="m.n")
    def n(ctx: TaskContext) -> int:
        return 1

    with running_worker(app, concurrency=1) as w:
        assert w.heartbeat.hooks is None
        assert app.wait(app.submit("m.n", {}).task_id, 30).state is State.SUCCEEDED


def test_takeover_late_effect_and_stale_rejection_are_counted(app: App) -> None:
    """Holder A freezes its heartbeat inside an effect call; B takes the task over after
    the lease expires and settles the effect by lookup; A's call then fails after its
    window closed (a late effect) and its writes are fenced out (stale). Two workers in one
    process, each with its own registry."""
    ma, mb = WorkerMetrics(), WorkerMetrics()
    workers: dict[str, Worker] = {}

    @app.task(name="m.takeover", lease_s=1.0, retry=FAST)
    def takeover(ctx: TaskContext) -> object:
        a = workers["a"]

        def call(key: str) -> object:
            if ctx.holder != a.holder:
                return "b"
            a.heartbeat.stop()  # A stops renewing: frozen, as far as the ledger can tell
            wait_for("B's takeover", lambda: app.get(ctx.task_id).generation > ctx.generation,
                     30)
            raise OutcomeUnknownError("reply lost")

        return ctx.effect("charge", key=f"charge-{ctx.task_id}", call=call,
                          lookup=lambda k: {"charged": k})

    with running_worker(app, concurrency=1, middleware=[ma], fast_takeover=False) as wa:
        workers["a"] = wa
        handle = app.submit("m.takeover", {})
        wait_for("A to hold the lease", lambda: wa.heartbeat.held(), 30)
        with running_worker(app, concurrency=1, middleware=[mb], fast_takeover=False):
            assert app.wait(handle.task_id, 30).state is State.SUCCEEDED

            def sample(m: WorkerMetrics, name: str, **labels: str) -> float:
                return m.registry.get_sample_value(name, labels) or 0.0

            wait_for("A's stale attempt counted", lambda: sample(
                ma, "ratchet_attempts_total", type="m.takeover", outcome="stale") == 1, 30)
            wait_for("B's attempt counted", lambda: sample(
                mb, "ratchet_attempts_total", type="m.takeover", outcome="succeeded") == 1, 30)
    assert sample(ma, "ratchet_late_effects_total", type="m.takeover") == 1
    assert sample(ma, "ratchet_stale_rejections_total", type="m.takeover") == 1
    assert sample(ma, "ratchet_takeovers_total", type="m.takeover") == 0
    assert sample(mb, "ratchet_takeovers_total", type="m.takeover") == 1
    assert sample(mb, "ratchet_claims_total", type="m.takeover") == 1
    assert sample(mb, "ratchet_effects_total", type="m.takeover", outcome="lookup") == 1
    assert sample(mb, "ratchet_late_effects_total", type="m.takeover") == 0
    status = Control(app.ledger_url).status()  # the ledger agrees
    assert status.late_effects == 1 and status.takeovers == 1


def test_revoked_lease_is_counted(app: App) -> None:
    m = WorkerMetrics()
    release = threading.Event()

    @app.task(name="m.revoked", lease_s=1.0, retry=FAST)
    def revoked(ctx: TaskContext) -> str:
        release.wait(30)
        return "late"

    with running_worker(app, concurrency=1, middleware=[m], fast_takeover=False) as w:
        handle = app.submit("m.revoked", {})
        wait_for("the lease to be held", lambda: w.heartbeat.held(), 30)
        assert app.ledger.revoke_holder(w.holder, "test", "revocation test") == [handle.task_id]
        wait_for("the refused renewal counted",
                 lambda: m.registry.get_sample_value("ratchet_leases_revoked_total") == 1, 30)
        release.set()
        wait_for("the fenced-out attempt counted", lambda: m.registry.get_sample_value(
            "ratchet_stale_rejections_total", {"type": "m.revoked"}) == 1, 30)


def test_worker_cli_refuses_a_taken_metrics_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    metrics: tuple[WorkerMetrics, MetricsServer],
) -> None:
    from typer.testing import CliRunner

    from ratchet.cli.main import cli

    _m, server = metrics
    (tmp_path / "mxapp2.py").write_text(textwrap.dedent(APP))
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, ["worker", "mxapp2:app", "--ledger",
                                      f"sqlite:///{tmp_path}/l.db", "--metrics-port",
                                      str(server.port)])
    assert result.exit_code == 2, result.output
    assert f"cannot serve metrics on 127.0.0.1:{server.port}" in result.output
    assert not (tmp_path / "l.db").exists()  # refused before the ledger was opened
