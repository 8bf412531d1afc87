"""Quarantine of poison tasks (DESIGN §7) with a real worker, on both ledgers.

A task that fails the same way every time is quarantined after ``quarantine_after``
attempts and never redelivered; ``Control.quarantine_list`` groups it by fingerprint;
``Control.quarantine_replay`` re-runs it with fresh attempt counters at a rate (a dry run
changes nothing). Runs are counted at the counting service (its own process and file), not
from Ratchet's records. The worker-death case with real SIGKILLed processes is in
tests/crash/test_quarantine_crash.py.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.cli.main import cli
from ratchet.errors import ConfigError, InvalidArguments
from ratchet.fingerprint import fingerprint, normalise, of_exception
from ratchet.testing import CountingService, fast_retry_policy, start_counting_service, wait_for
from ratchet.testing.worker import running_worker
from ratchet.validation import parse_rate_per_s

pytestmark = pytest.mark.timeout(90)

POLICY = fast_retry_policy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05,
                           quarantine_after=3)


# ---------------------------------------------------------------------- unit


@pytest.mark.parametrize(("a", "b"), [
    ("order 123 timed out", "order 456 timed out"),
    ("user 3fa85f64-5717-4562-b3fc-2c963f66afa6 missing",
     "user 9b2e0c1d-0000-4aaa-8bbb-123456789abc missing"),
    ("<Obj at 0x7f3a2c11d0>: bad", "<Obj at 0x55e0aa>: bad"),
    ("no key 'abc' in row 7", 'no key "xyz" in row 12'),
    ("hash deadbeef01 refused", "hash 0123abcdef refused"),
    ("took 1.5 s", "took 22 s"),
    ("can't reach 'db-1'", "can't reach 'replica'"),
])
def test_variable_parts_are_masked(a: str, b: str) -> None:
    assert normalise(a) == normalise(b)
    assert fingerprint("t", "E", a) == fingerprint("t", "E", b)


def test_words_type_and_class_make_different_fingerprints() -> None:
    base = fingerprint("t", "RuntimeError", "connection refused")
    assert base != fingerprint("t", "RuntimeError", "connection reset")
    assert base != fingerprint("u", "RuntimeError", "connection refused")
    assert base != fingerprint("t", "OSError", "connection refused")
    assert re.fullmatch(r"[0-9a-f]{16}", base), f"not 16 lowercase hex digits: {base!r}"
    assert of_exception("t", RuntimeError("connection refused")) == base


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3", 2_000_000])
def test_quarantine_after_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="quarantine_after"):
        RetryPolicy(quarantine_after=bad)  # type: ignore[arg-type]
    assert RetryPolicy(quarantine_after=None).quarantine_after is None
    assert RetryPolicy().quarantine_after == 3


@pytest.mark.parametrize(("text", "rate"), [("5/s", 5.0), ("300/m", 5.0), ("7200/h", 2.0),
                                            ("2.5", 2.5), (" 1 / s ", 1.0)])
def test_rates_parse(text: str, rate: float) -> None:
    assert parse_rate_per_s(text, "--rate") == pytest.approx(rate)


@pytest.mark.parametrize("text", ["0/s", "-1/s", "5/d", "fast", "", "1e9", "1e-320", "1/d"])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(InvalidArguments, match="--rate"):
        parse_rate_per_s(text, "--rate")


# ---------------------------------------------------------------------- real worker


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    with start_counting_service(tmp_path / "service.db", honour_keys=False) as svc:
        yield svc


@pytest.fixture
def poison_app(ledger_url: str, service: CountingService, tmp_path: Path) -> Iterator[App]:
    """``q.poison`` posts one execution per run to the service (key = task id), then fails
    with the same error (different numbers each run) until ``healed`` exists."""
    app = App(ledger_url)
    client = service.client()
    healed = tmp_path / "healed"

    @app.task(name="q.poison", retry=POLICY)
    def poison(ctx: TaskContext, order: int) -> str:
        client.execute(f"run:{ctx.task_id}", {"generation": ctx.generation})
        if not healed.exists():
            raise RuntimeError(f"order {order} timed out after {ctx.attempt * 1.5} s")
        return "ok"

    @app.task(name="q.marker", retry=POLICY)
    def marker(ctx: TaskContext) -> str:
        return "done"

    yield app
    client.close()
    app.close()


def _runs(service: CountingService, task_id: str) -> int:
    return service.executions().get(f"run:{task_id}", 0)


def _events(control: Control, task_id: str) -> list[str]:
    return [e.kind for e in control.history(task_id).events]


def test_poison_task_is_quarantined_after_n_attempts_and_not_redelivered(
    poison_app: App, service: CountingService, ledger_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ratchet.worker")
    poisoned = [poison_app.submit("q.poison", {"order": n}) for n in (101, 202)]
    with running_worker(poison_app, concurrency=2):
        for h in poisoned:
            wait_for("quarantine", lambda h=h: h.get().state is State.FAILED, 30)
        # Not redelivered: work submitted after the quarantine runs, the poison does not.
        marker = poison_app.submit("q.marker", {})
        wait_for("the marker", lambda: marker.get().state is State.SUCCEEDED, 30)
    for h in poisoned:
        assert _runs(service, h.task_id) == 3  # counted at the service
        info = h.get()
        assert info.attempt == 3 and info.max_attempts == 10
        assert info.error_class == "transient"
    with Control(ledger_url) as control:
        [group] = control.quarantine_list()
        assert group.task_type == "q.poison" and group.count == 2
        assert sorted(group.task_ids) == sorted(h.task_id for h in poisoned)
        assert group.example_message.startswith("RuntimeError: order ")
        assert group.fingerprint == fingerprint("q.poison", "RuntimeError",
                                                "order 1 timed out after 4.5 s")
        assert group.first_seen <= group.last_seen
        assert "quarantine" in _events(control, poisoned[0].task_id)
    # The worker's log says what the ledger did, not only what the attempt asked for.
    told = [r.getMessage() for r in caplog.records if "the ledger made it" in r.getMessage()]
    assert len(told) == 2 and all("FAILED (asked RETRY_WAIT)" in m for m in told), told


def test_replay_reruns_with_fresh_counters_at_a_rate_and_dry_run_changes_nothing(
    poison_app: App, service: CountingService, ledger_url: str, tmp_path: Path
) -> None:
    handles = [poison_app.submit("q.poison", {"order": n}) for n in range(3)]
    with running_worker(poison_app, concurrency=3):
        for h in handles:
            wait_for("quarantine", lambda h=h: h.get().state is State.FAILED, 30)
    with Control(ledger_url) as control:
        [group] = control.quarantine_list()
        before = [h.get() for h in handles]
        dry = control.quarantine_replay(group.fingerprint, 5.0, dry_run=True, by="alice")
        assert dry.dry_run and sorted(t.task_id for t in dry.tasks) == sorted(
            h.task_id for h in handles)
        assert all(t.failures == 3 and t.crashes == 0 for t in dry.tasks)
        assert [h.get() for h in handles] == before
        assert all("operator_replay" not in _events(control, h.task_id) for h in handles)
        with pytest.raises(InvalidArguments, match="reason"):
            control.quarantine_replay(group.fingerprint, 5.0, by="alice")
        with pytest.raises(InvalidArguments, match="fingerprint"):
            control.quarantine_replay("not-hex", 5.0, reason="x")
        with pytest.raises(InvalidArguments, match="rate_per_s"):
            control.quarantine_replay(group.fingerprint, 0, reason="x")

        (tmp_path / "healed").touch()
        report = control.quarantine_replay(group.fingerprint, 5.0, reason="parser fixed",
                                           by="alice")
        assert not report.dry_run and len(report.tasks) == 3
        starts = sorted(t.run_at for t in report.tasks)
        assert [b - a for a, b in itertools.pairwise(starts)] == pytest.approx(
            [0.2, 0.2])
        for h in handles:
            info = h.get()
            assert info.state is State.PENDING and info.attempt == 0
        assert control.quarantine_list() == []
    with running_worker(poison_app, concurrency=3):
        for h in handles:
            wait_for("the replay", lambda h=h: h.get().state is State.SUCCEEDED, 30)
    with Control(ledger_url) as control:
        for h in handles:
            assert _runs(service, h.task_id) == 4  # three poisoned runs + the replay
            assert h.get().attempt == 1  # fresh attempt counter
            events = control.history(h.task_id).events
            [replay] = [e for e in events if e.kind == "operator_replay"]
            assert replay.detail["operator"] == "alice"
            assert replay.detail["reason"] == "parser fixed"
            # Admitted at the rate: no claim before its staggered run_at.
            planned_at = {t.task_id: t.run_at for t in report.tasks}[h.task_id]
            [claim] = [e for e in events if e.kind == "claim" and e.seq > replay.seq]
            assert claim.at >= planned_at - 1e-3


def test_operator_retry_of_a_quarantined_task_gives_fresh_quarantine_counters(
    poison_app: App, service: CountingService, ledger_url: str
) -> None:
    """``ratchet retry`` of a quarantined task resets its streak as a replay does: still
    poisoned, it runs quarantine_after more times before it is quarantined again (not
    at its first failure)."""
    h = poison_app.submit("q.poison", {"order": 7})
    with running_worker(poison_app, concurrency=1):
        wait_for("quarantine", lambda: h.get().state is State.FAILED, 30)
        assert _runs(service, h.task_id) == 3
        with Control(ledger_url) as control:
            assert control.retry(h.task_id, reason="try once more", by="bob").outcome == "done"
            assert control.quarantine_list() == []
        wait_for("quarantine again", lambda: h.get().state is State.FAILED
                 and _runs(service, h.task_id) >= 6, 30)
    assert _runs(service, h.task_id) == 6
    with Control(ledger_url) as control:
        [group] = control.quarantine_list()
        assert group.task_ids == [h.task_id]


def test_cli_lists_and_replays(poison_app: App, ledger_url: str, tmp_path: Path) -> None:
    handle = poison_app.submit("q.poison", {"order": 7})
    with running_worker(poison_app, concurrency=1):
        wait_for("quarantine", lambda: handle.get().state is State.FAILED, 30)
    runner = CliRunner()
    listed = runner.invoke(cli, ["quarantine", "list", "--json", "--ledger", ledger_url])
    assert listed.exit_code == 0, listed.output
    [group] = json.loads(listed.stdout)
    assert group["task_ids"] == [handle.task_id] and group["count"] == 1
    text = runner.invoke(cli, ["quarantine", "list", "--ledger", ledger_url])
    assert text.exit_code == 0 and group["fingerprint"] in text.stdout
    shown = runner.invoke(cli, ["inspect", handle.task_id, "--ledger", ledger_url])
    assert shown.exit_code == 0 and "quarantine" in shown.stdout
    assert group["fingerprint"] in shown.stdout
    dry = runner.invoke(cli, ["quarantine", "replay", "--fingerprint", group["fingerprint"],
                              "--rate", "5/s", "--dry-run", "--ledger", ledger_url])
    assert dry.exit_code == 0, dry.output
    assert "would replay 1 task" in dry.stdout and handle.get().state is State.FAILED
    bad = runner.invoke(cli, ["quarantine", "replay", "--fingerprint", group["fingerprint"],
                              "--rate", "fast", "--ledger", ledger_url])
    assert bad.exit_code == 2 and "--rate" in bad.stderr
    done = runner.invoke(cli, ["quarantine", "replay", "--fingerprint", group["fingerprint"],
                               "--rate", "300/m", "--reason", "retry it", "--operator", "bob",
                               "--json", "--ledger", ledger_url])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["operator"] == "bob" and report["rate_per_s"] == 5.0
    assert [t["task_id"] for t in report["tasks"]] == [handle.task_id]
    assert handle.get().state is State.PENDING


def test_an_unreachable_downstream_is_retried_to_max_attempts_not_quarantined(
    ledger_url: str, service: CountingService,
) -> None:
    """A downstream outage (connection refused) fails every attempt with the same error,
    but says nothing about the task: it is retried up to ``max_attempts`` and dead-lettered
    unflagged, never quarantined after ``quarantine_after`` quick retries (a fresh user's
    2-second outage quarantined every task in flight). The same task's own error is still
    quarantined (the poison test above)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: connection refused
    app = App(ledger_url)
    client = service.client()

    @app.task(name="q.outage", retry=RetryPolicy(max_attempts=5, base_delay_s=0.01,
                                                 max_delay_s=0.02, jitter=0.0,
                                                 quarantine_after=3))
    def outage(ctx: TaskContext) -> None:
        client.execute(f"run:{ctx.task_id}", {})  # counted at the service, which is up
        with httpx.Client(timeout=5.0) as down:
            down.post(f"http://127.0.0.1:{port}/charge")

    try:
        h = app.submit("q.outage", {})
        with running_worker(app):
            wait_for("the dead letter", lambda: h.get().state is State.FAILED, 30)
        info = h.get()
        assert info.attempt == 5 and info.quarantined is False
        assert "ConnectError" in (info.last_error or "")
        assert _runs(service, h.task_id) == 5  # every attempt ran, counted at the service
        with Control(ledger_url) as control:
            assert control.quarantine_list() == []
    finally:
        client.close()
        app.close()
