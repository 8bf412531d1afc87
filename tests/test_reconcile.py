"""``ratchet reconcile`` (DESIGN §5, reconciliation) against a real counting service over
loopback HTTP, on both ledgers.

Every finding is produced for real: a charge whose reply the service dropped after
charging (the ledger: ``UNKNOWN``; the service: charged), a charge sent to a listener that
never answers (``UNKNOWN``; never charged), a done charge deleted from the service's own
SQLite file, a late charge of a holder whose claim was taken over (the worker's late-effect
path: the target charged twice), a lookup whose service is down, an effect with no
registered lookup. The report is asserted, then that nothing changed without ``--apply``,
then that ``--apply`` resolved the two unambiguous tasks (states, effects and the audit
rows, via Control) and left the rest, and that the resolved tasks finish with exactly one
charge each.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import socket
import sqlite3
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from reconcile_app import TASK, close, make_app
from typer.testing import CliRunner

from ratchet import App, ConfigError, Control, InvalidArguments, State, Worker
from ratchet.cli.main import cli
from ratchet.reconcile import reconcile
from ratchet.testing import CountingService, start_counting_service

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    """A lookup-only counting service (no key dedupe), its own process and file."""
    with start_counting_service(tmp_path / "service.db", honour_keys=False) as svc:
        yield svc


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A URL whose listener accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def _run(app: App) -> None:
    """Run a worker until the ledger has nothing ready for it."""
    Worker(app, concurrency=1, poll_interval_s=0.01).run(idle_exit_s=0.5)


def _app_module(tmp_path: Path, ledger_url: str, service_url: str) -> str:
    """A module the CLI can load (``--app``) that builds the reconcile app."""
    name = f"rc_app_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        from reconcile_app import make_app
        app = make_app({ledger_url!r}, {service_url!r}, lookups=True)
    """))
    sys.path.insert(0, str(tmp_path))
    return f"{name}:app"


def _snapshot(control: Control, ids: dict[str, str]) -> dict[str, Any]:
    """Every task's state, generation and effects (what reconcile must not change)."""
    out = {}
    for order, task_id in ids.items():
        tl = control.inspect(task_id)
        out[order] = (tl.task.state, tl.task.generation,
                      [dataclasses.astuple(e) for e in tl.effects])
    return out


def test_reconcile_finds_applies_and_leaves_the_ambiguous(
        ledger_url: str, service: CountingService, black_hole: str, tmp_path: Path) -> None:
    worker_app = make_app(ledger_url, service.url, black_hole_url=black_hole)
    ids: dict[str, str] = {}
    for order, mode in (("o-ok", "ok"), ("o-wiped", "ok"), ("o-notify", "notify"),
                        ("o-never", "never")):
        ids[order] = worker_app.submit(TASK, {"order": order, "mode": mode}).task_id
    _run(worker_app)
    with service.client() as c:
        c.set_faults(reply_lost_next=1)  # the next charge executes, its reply is dropped
    ids["o-lost"] = worker_app.submit(TASK, {"order": "o-lost"}).task_id
    _run(worker_app)
    ids["o-late"] = worker_app.submit(TASK, {"order": "o-late", "mode": "late"}).task_id
    _run(worker_app)
    states = {o: worker_app.get(t).state for o, t in ids.items()}
    assert states == {"o-ok": State.SUCCEEDED, "o-wiped": State.SUCCEEDED,
                      "o-notify": State.SUCCEEDED, "o-never": State.UNKNOWN,
                      "o-lost": State.UNKNOWN, "o-late": State.SUCCEEDED}, states
    executions = service.executions()
    assert executions.get("charge:o-never", 0) == 0 and executions["charge:o-lost"] == 1
    assert executions["charge:o-late"] == 2, "the duplicate of the late sender"
    # A done charge the service no longer has: deleted from its own file.
    conn = sqlite3.connect(service.db_path, timeout=30)
    with conn:
        conn.execute("DELETE FROM records WHERE key = 'charge:o-wiped'")
    conn.close()

    rc_app = make_app(ledger_url, service.url, lookups=True)
    with Control(ledger_url) as control:
        before = _snapshot(control, ids)
        report = reconcile(control, rc_app, TASK, newer_than_s=3600, rate_per_s=None)
        assert report.counts == {"absent": 1, "unrecorded": 1, "not_executed": 1,
                                 "unknown": 1, "late": 1, "late_accounted_for": 0,
                                 "no_lookup": 1}, report
        by = {(f.outcome, f.task_id): f for f in report.findings}
        lost = by[("unrecorded", ids["o-lost"])]
        assert lost.action == "resolve done" and not lost.applied
        assert lost.target["key"] == "charge:o-lost" and lost.recorded == "intent"
        assert by[("not_executed", ids["o-never"])].action == "resolve not-done"
        assert by[("absent", ids["o-wiped"])].action == "none"
        unknown = by[("unknown", ids["o-notify"])]
        assert unknown.effect == "notify" and "ConnectError" in unknown.note
        [no_lookup] = [f for f in report.findings if f.outcome == "no_lookup"]
        assert (no_lookup.effect, no_lookup.count) == ("mail", 1)
        late = by[("late", ids["o-late"])]
        assert late.generation == 1 and late.recorded == "done"
        assert late.task_state == "SUCCEEDED" and late.target["key"] == "charge:o-late"
        # agree: the charges of o-ok, o-notify and o-late (done, and the service has them)
        assert (report.effects, report.lookups, report.agreed) == (8, 7, 3)
        assert report.resolved == 0 and report.open_findings == 6
        # Nothing changed without --apply, and the run is audited.
        assert _snapshot(control, ids) == before
        kinds = [e.kind for e in control.inspect(ids["o-lost"]).events]
        assert "reconcile_unrecorded" in kinds and "operator_resolve" not in kinds
        counts = control.reconcile_counts()
        assert counts.runs == 1 and counts.findings == {
            "absent": 1, "late": 1, "no_lookup": 1, "not_executed": 1, "unknown": 1,
            "unrecorded": 1}

    spec = _app_module(tmp_path, ledger_url, service.url)
    runner = CliRunner()
    refused = runner.invoke(cli, ["reconcile", TASK, "--app", spec, "--apply"])
    assert refused.exit_code == 2 and "--reason" in refused.output, refused.output
    applied = runner.invoke(cli, [
        "reconcile", TASK, "--app", spec, "--ledger", ledger_url, "--apply", "--reason",
        "PSP dashboard checked", "--operator", "alice", "--rate", "none", "--json"])
    assert applied.exit_code == 1, applied.output  # findings are left for a person
    out = json.loads(applied.stdout)
    assert out["resolved"] == 2 and out["open_findings"] == 4, out
    assert {f["task_id"] for f in out["findings"] if f["applied"]} == {
        ids["o-lost"], ids["o-never"]}

    with Control(ledger_url) as control:
        after = _snapshot(control, ids)
        for order in ("o-ok", "o-wiped", "o-notify", "o-late"):
            assert after[order] == before[order], order
        for order, verdict in (("o-lost", "done"), ("o-never", "not-done")):
            tl = control.inspect(ids[order])
            assert tl.task.state is State.PENDING
            [resolve] = [e for e in tl.events if e.kind == "operator_resolve"]
            assert resolve.detail["operator"] == "alice"
            assert resolve.detail["outcome"] == verdict
            assert "PSP dashboard checked" in resolve.detail["reason"]
            assert "reconcile_resolved" in [e.kind for e in tl.events]
        [lost_charge] = control.inspect(ids["o-lost"]).effects
        assert lost_charge.state == "done" and lost_charge.result["key"] == "charge:o-lost"
        assert control.reconcile_counts().findings["resolved"] == 2

    _run(worker_app)  # the resolved tasks finish
    for order in ("o-lost", "o-never"):
        info = worker_app.get(ids[order])
        assert info.state is State.SUCCEEDED, (order, info.last_error)
    executions = service.executions()
    assert executions["charge:o-lost"] == 1 and executions["charge:o-never"] == 1
    assert worker_app.get(ids["o-lost"]).result == {
        "charge": service.stored()["charge:o-lost"]["id"]}

    again = runner.invoke(cli, ["reconcile", TASK, "--app", spec, "--ledger", ledger_url,
                                "--rate", "none"])
    assert again.exit_code == 1, again.output
    assert "absent: 1" in again.output and "not_executed: 0" in again.output, again.output
    close(worker_app)
    close(rc_app)


def test_clean_run_exits_zero_and_unknown_type_is_refused(
        tmp_path: Path, service: CountingService) -> None:
    ledger_url = f"sqlite:///{tmp_path}/l.db"
    app = make_app(ledger_url, service.url)
    app.submit(TASK, {"order": "o-1"})
    _run(app)
    spec = _app_module(tmp_path, ledger_url, service.url)
    runner = CliRunner()
    clean = runner.invoke(cli, ["reconcile", TASK, "--app", spec, "--ledger", ledger_url,
                                "--no-record"])
    assert clean.exit_code == 0, clean.output
    assert "1 agree" in clean.output
    with Control(ledger_url) as control:
        assert control.reconcile_counts().runs == 0  # --no-record wrote nothing
    unknown = runner.invoke(cli, ["reconcile", "rc.nope", "--app", spec, "--ledger",
                                  ledger_url])
    assert unknown.exit_code == 2 and "no task type 'rc.nope'" in unknown.output
    for args, words in ((["--since", "yesterday"], "--since"),
                        (["--rate", "fast"], "--rate"),
                        (["--lookup-timeout", "0"], "--lookup-timeout must be above 0"),
                        (["--lookup-timeout", "2h"],
                         "--lookup-timeout must be at most 1h (3600 s), got 2h")):
        bad = runner.invoke(cli, ["reconcile", TASK, "--app", spec, "--ledger", ledger_url,
                                  *args])
        assert bad.exit_code == 2 and words in bad.output, (args, bad.output)
    close(app)


def test_lookups_are_paced_and_timed_out(tmp_path: Path, service: CountingService) -> None:
    ledger_url = f"sqlite:///{tmp_path}/l.db"
    app = make_app(ledger_url, service.url)
    for i in range(5):
        app.submit(TASK, {"order": f"o-{i}"})
    _run(app)
    rc_app = make_app(ledger_url, service.url, lookups=True)
    with Control(ledger_url) as control:
        wall0 = time.time()
        report = reconcile(control, rc_app, TASK, rate_per_s=10.0, concurrency=4)
        assert report.agreed == 5 and report.open_findings == 0
    conn = sqlite3.connect(service.db_path, timeout=30)
    times = [at for (at,) in conn.execute("SELECT at FROM lookups ORDER BY at")]
    conn.close()
    assert len(times) == 5
    # 10/s with 4 threads: the k-th lookup (0-based) starts no earlier than 0.1 * k s after
    # the run began, so the service cannot have answered it before (a loaded machine may
    # delay some and bunch them after, never before).
    for k, at in enumerate(times):
        assert at - wall0 >= 0.1 * k - 0.01, (k, [t - wall0 for t in times])

    slow = App(ledger_url)
    slow.task(name=TASK)(lambda ctx, order, mode="ok": None)

    @slow.lookup(TASK, "charge")
    def hangs(key: str) -> Any:
        time.sleep(3.0)
        return None

    with Control(ledger_url) as control:
        t0 = time.monotonic()
        report = reconcile(control, slow, TASK, lookup_timeout_s=0.2, concurrency=5,
                           rate_per_s=None, record=False)
        assert time.monotonic() - t0 < 2.5
    assert report.counts["unknown"] == 5
    assert all("timed out after 0.2 s" in f.note for f in report.findings)
    close(app)
    close(rc_app)
    slow.close()


def test_failed_lookups_are_tried_again(ledger_url: str, service: CountingService,
                                        tmp_path: Path) -> None:
    """A target that answers 503 to a fixed run of lookups: without retries those effects
    are left unknown, each note one line (the error's type and first line, not httpx's
    whole message); with --lookup-retries every effect is checked and agrees."""
    app = make_app(ledger_url, service.url)
    for i in range(3):
        app.submit(TASK, {"order": f"o-{i}"})
    _run(app)
    rc_app = make_app(ledger_url, service.url, lookups=True)
    with service.client() as c, Control(ledger_url) as control:
        c.set_faults(fail_next_503=2)
        report = reconcile(control, rc_app, TASK, concurrency=1, rate_per_s=None,
                           lookup_retries=0, record=False)
        assert report.counts["unknown"] == 2 and report.agreed == 1, report
        for f in report.findings:
            assert f.note.startswith("the lookup could not tell: HTTPStatusError: Server "
                                     "error '503 Service Unavailable' for url "), f.note
            assert "\n" not in f.note and "For more information" not in f.note, f.note
        c.set_faults(fail_next_503=4)  # the first lookup's 3 tries fail, then the next's 1st
        report = reconcile(control, rc_app, TASK, concurrency=1, rate_per_s=None,
                           lookup_retries=2, record=False)
        assert report.counts["unknown"] == 1 and report.agreed == 2, report
        [f] = report.findings
        assert f.note.startswith("the lookup could not tell: 3 tries failed, the last: "
                                 "HTTPStatusError: Server error '503"), f.note
        with pytest.raises(InvalidArguments, match="lookup_retries"):
            reconcile(control, rc_app, TASK, lookup_retries=11)
        c.set_faults(fail_next_503=4)
        module = _app_module(tmp_path, ledger_url, service.url)
        result = CliRunner().invoke(cli, [
            "reconcile", TASK, "--app", module, "--lookup-retries", "4",
            "--concurrency", "2", "--rate", "none", "--ledger", ledger_url])
        assert result.exit_code == 0, result.output
        assert "3 agree" in result.stdout and "left: 0" in result.stdout, result.stdout
        assert c.set_faults()["fail_next_503"] == 0  # every injected 503 was asked
    close(app)
    close(rc_app)


def test_worker_uses_the_registered_lookup(
        ledger_url: str, service: CountingService) -> None:
    app = make_app(ledger_url, service.url, lookups=True)
    with service.client() as c:
        c.set_faults(reply_lost_next=1)
    handle = app.submit(TASK, {"order": "o-1"})
    _run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error  # settled by App.lookup's lookup
    assert service.executions() == {"charge:o-1": 1}
    with Control(ledger_url) as control:
        [charge] = control.inspect(handle.task_id).effects
        assert charge.via_lookup
    close(app)
    # Registered for reconciliation only: the worker does not use it.
    app = make_app(ledger_url, service.url, lookups=True, worker_lookups=False)
    with service.client() as c:
        c.set_faults(reply_lost_next=1)
    handle = app.submit(TASK, {"order": "o-2"})
    _run(app)
    assert handle.get().state is State.UNKNOWN
    with Control(ledger_url) as control:
        report = reconcile(control, app, TASK, apply=True, reason="seen at the PSP")
        assert report.resolved == 1 and control.get(handle.task_id).state is State.PENDING
    close(app)


def test_lookup_registration_is_checked(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path}/l.db")
    app.lookup("t", "charge")(lambda key: None)
    with pytest.raises(ConfigError, match="registered twice"):
        app.lookup("t", "charge")(lambda key: None)
    with pytest.raises(ConfigError, match="fenced=True passes the fencing token"):
        app.lookup("t", "other", fenced=True)(lambda key: None)
    with pytest.raises(InvalidArguments, match="#"):
        app.lookup("t", "charge#2")
    with pytest.raises(ConfigError, match="in_flight_s"):
        app.lookup("t", "x", in_flight_s=-1)
    assert app.registered_lookup("t", "charge#3") is app.lookups[("t", "charge")]
    with Control(app=app) as control, pytest.raises(InvalidArguments, match="cursor"):
        control.effects("t", cursor="nope")


def test_effects_pages_neither_skip_nor_repeat(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task(name="rc.many")
    def many(ctx: Any, n: int) -> Any:
        for i in range(n):
            ctx.effect("send", lambda k: {"sent": k}, key=f"send:{ctx.task_id}:{i}")
        return ctx.effect("bill", lambda k: {"billed": k}, key=f"bill:{ctx.task_id}")

    @app.task(name="rc.other")
    def other(ctx: Any) -> Any:
        return ctx.effect("send", lambda k: k, key=f"other:{ctx.task_id}")

    ids = [app.submit("rc.many", {"n": n}).task_id for n in (0, 1, 3)]
    app.submit("rc.other", {})
    _run(app)
    with Control(ledger_url) as control:
        whole = control.effects("rc.many", limit=1000)
        assert whole.next_cursor is None
        seen = [(v.task_id, v.effect.name) for v in whole.effects]
        # newest task first, by effect name within a task (occurrences as name#N)
        names = {ids[0]: ["bill"], ids[1]: ["bill", "send"],
                 ids[2]: ["bill", "send", "send#2", "send#3"]}
        newest = sorted(ids, key=lambda t: (control.get(t).created_at, t), reverse=True)
        assert seen == [(t, n) for t in newest for n in names[t]]
        assert {v.task_state for v in whole.effects} == {"SUCCEEDED"}
        paged, cursor = [], None
        while True:
            page = control.effects("rc.many", limit=2, cursor=cursor)
            paged += [(v.task_id, v.effect.name) for v in page.effects]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert paged == seen
        assert control.effects("rc.many", newer_than_s=0.0).effects == []
        assert control.effects("rc.none").effects == []
        with pytest.raises(InvalidArguments, match="limit"):
            control.effects("rc.many", limit=0)
    app.close()


def test_fenced_lookup_gets_the_tasks_generation(ledger_url: str, tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "fenced.db", honour_keys=False,
                                check_tokens=True) as svc:
        client = svc.client(timeout_s=2.0)
        app = App(ledger_url)

        @app.task(name="rc.fenced")
        def fenced(ctx: Any, order: str) -> Any:
            return ctx.effect("charge", lambda k, t: client.execute(k, {"o": order}, token=t),
                              key=f"charge:{order}", fenced=True)

        @app.lookup("rc.fenced", "charge", fenced=True, worker=False)
        def ask(key: str, token: int) -> Any:
            return client.lookup(key, token)

        client.set_faults(reply_lost_next=1)
        handle = app.submit("rc.fenced", {"order": "o-1"})
        _run(app)
        info = handle.get()
        assert info.state is State.UNKNOWN, info.last_error
        with Control(ledger_url) as control:
            report = reconcile(control, app, "rc.fenced", apply=True, reason="fenced check")
            [found] = report.findings
            assert (found.outcome, found.applied) == ("unrecorded", True)
        conn = sqlite3.connect(svc.db_path, timeout=30)
        [(highest,)] = conn.execute("SELECT highest FROM tokens WHERE key = 'charge:o-1'")
        conn.close()
        assert highest == info.generation  # the task's current generation was sent
        _run(app)  # resumes with the resolved result: no second charge, no refusal
        assert handle.get().state is State.SUCCEEDED
        assert svc.executions() == {"charge:o-1": 1} and svc.rejections() == []
        client.close()
        app.close()


def test_sqlite_walk_is_an_index_range(tmp_path: Path) -> None:
    """Control.effects on SQLite: tasks_created as a range bounded by the window and the
    cursor (not a scan of the window from its newest end for every page)."""
    from ratchet import open_ledger
    from ratchet.ledger.catalogue import load_catalogue

    path = tmp_path / "l.db"
    open_ledger(f"sqlite:///{path}").close()
    (statement,) = load_catalogue("sqlite")["effects_of_type"]
    conn = sqlite3.connect(path)
    for cursor in ((None, None, None), (5.0, "a", "b")):
        params = {"name": "t", "created_from": 1.0, "limit": 10,
                  **dict(zip(("cursor_at", "cursor_id", "cursor_name"), cursor, strict=True))}
        plan = " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + statement, params))
        assert "SEARCH t USING INDEX tasks_created (created_at>? AND created_at<?)" in plan, plan
        assert "SEARCH e USING PRIMARY KEY" in plan, plan
    conn.close()


def test_demo_app_registers_its_charges_lookups() -> None:
    from ratchet.demo import billing

    lookups = billing.app.lookups
    assert set(lookups) == {(name, "charge") for name in billing.TASKS.values()}
    assert lookups[(billing.TASKS["fenced"], "charge")].fenced
    assert lookups[(billing.TASKS["lookup"], "charge")].in_flight_s == billing.IN_FLIGHT_S
    # the "neither" task must still go UNKNOWN rather than ask: reconciliation only
    assert not lookups[(billing.TASKS["neither"], "charge")].worker
