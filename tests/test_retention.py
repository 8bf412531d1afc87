"""Retention: ``Ledger.prune``, ``Control.prune``, ``ratchet prune`` and the
worker's periodic prune, on both ledgers. Ages are respected and non-terminal tasks are
never deleted; a dry run changes nothing; the export holds each task with its history and
is written before the delete; batches; two prunes at once; prunes while real workers
drain; the audit row; the dedupe window (a pruned key submits a new task); status counts
that stay exact across prunes and the counts rollup (DESIGN §9, §10.2)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from typer.testing import CliRunner

from ratchet import (
    App,
    Control,
    InvalidArguments,
    RetryPolicy,
    State,
    SubmitRequest,
    TaskContext,
    Worker,
)
from ratchet.cli.main import cli
from ratchet.config import parse_ledger_url
from ratchet.ledger import open_ledger
from ratchet.ledger.postgres import libpq_url
from ratchet.testing import check_ledger_consistent, running_worker, wait_for

pytestmark = pytest.mark.timeout(180)

TABLES = ("tasks", "steps", "effects", "late_effects", "audit")


def sql_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """Rows of a read-only query on the ledger's own tables (either backend)."""
    config = parse_ledger_url(url)
    if config.scheme == "sqlite":
        conn = sqlite3.connect(config.path)
        try:
            return conn.execute(query).fetchall()
        finally:
            conn.close()
    with psycopg.connect(libpq_url(config)) as pg:
        pg.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(config.options.get("schema", "ratchet"))))
        return pg.execute(query).fetchall()  # type: ignore[arg-type]


def table_counts(url: str) -> dict[str, int]:
    return {t: int(sql_rows(url, f"SELECT COUNT(*) FROM {t}")[0][0]) for t in TABLES}


def true_counts(url: str) -> dict[str, dict[str, int]]:
    """What the ledger holds, per task name and state, by a full count."""
    out: dict[str, dict[str, int]] = {}
    for name, state, n in sql_rows(url, "SELECT name, state, COUNT(*) FROM tasks"
                                        " GROUP BY name, state"):
        out.setdefault(name, {})[state] = int(n)
    return out


def register(app: App, ran: Counter[str] | None = None) -> None:
    """``t.ok`` (a step and an idempotent effect), ``t.bad`` (fails at once), ``t.later``
    (never run by the tests' workers)."""
    lock = threading.Lock()

    @app.task(name="t.ok")
    def ok(ctx: TaskContext, i: int) -> int:
        if ran is not None:
            with lock:
                ran[ctx.task_id] += 1
        ctx.step("double", lambda: 2 * i)
        return int(ctx.effect("send", lambda key: i, key=f"send:{i}:{ctx.task_id}",
                              idempotent=True))

    @app.task(name="t.bad", retry=RetryPolicy(max_attempts=1))
    def bad(ctx: TaskContext, i: int) -> int:
        raise ValueError(f"bad input {i}")

    @app.task(name="t.later")
    def later(ctx: TaskContext) -> None:
        return None


def drain(app: App) -> None:
    Worker(app, concurrency=2, poll_interval_s=0.01, names=["t.ok", "t.bad"],
           fast_takeover=False).run(idle_exit_s=0.4)


def wait_clock(app: App, after: float) -> None:
    """Wait until the ledger clock is past ``after`` (epoch seconds)."""
    wait_for("the ledger clock to move on", lambda: app.ledger.now() > after, timeout_s=10)


def test_prune_respects_the_age_and_never_touches_unfinished_tasks(
    app: App, ledger_url: str
) -> None:
    register(app)
    old = [app.submit("t.ok", {"i": i}).task_id for i in range(4)]
    old += [app.submit("t.bad", {"i": i}).task_id for i in range(2)]
    drain(app)
    t0 = app.ledger.now()
    later = [app.submit("t.later", {}, idempotency_key=f"later-{i}").task_id for i in range(2)]
    wait_clock(app, t0 + 1.5)
    new = [app.submit("t.ok", {"i": 10 + i}).task_id for i in range(3)]
    drain(app)
    with Control(ledger_url) as control:
        # A cutoff between the two groups (the old finished before t0, the new 1.5 s
        # later), from the ledger clock read just before the prune: time the machine takes
        # until the prune reads its own clock only moves the cutoff later, with 1.25 s to
        # spare (a cutoff from the new tasks' end failed on a loaded machine).
        age = control.ledger_now() - (t0 + 0.25)
        report = control.prune(age, by="alice")
        assert (report.tasks, report.steps, report.effects) == (6, 4, 4)
        assert report.audit == 12 and not report.dry_run and report.by == "alice"
        assert report.cutoff > t0
        left = {t.task_id for t in control.list_tasks(limit=100).tasks}
        assert left == set(later) | set(new)
        # Age 0: every finished task, still never a pending one.
        assert control.prune(0.0).tasks == 3
        tasks = control.list_tasks(limit=100).tasks
        assert {t.task_id for t in tasks} == set(later)
        assert all(t.state is State.PENDING for t in tasks)
        status = control.status()
        assert status.counts == {"t.later": {"PENDING": 2}} == true_counts(ledger_url)
        assert status.claims == 9  # counted for ever, although their audit rows are gone
    assert table_counts(ledger_url)["steps"] == 0


def test_dry_run_changes_nothing_and_counts_what_a_prune_deletes(
    app: App, ledger_url: str
) -> None:
    register(app)
    for i in range(5):
        app.submit("t.ok", {"i": i})
    app.submit("t.bad", {"i": 0})
    app.submit("t.later", {})
    drain(app)
    before = table_counts(ledger_url)
    with Control(ledger_url) as control:
        status = control.status()
        dry = control.prune(0.0, dry_run=True)
        assert dry.dry_run and dry.batches == 0
        assert (dry.tasks, dry.steps, dry.effects) == (6, 5, 5)
        assert table_counts(ledger_url) == before
        assert control.status().counts == status.counts
        assert not sql_rows(ledger_url, "SELECT 1 FROM audit WHERE kind = 'prune'")
        real = control.prune(0.0)
        assert (real.tasks, real.steps, real.effects, real.late_effects, real.audit) == (
            dry.tasks, dry.steps, dry.effects, dry.late_effects, dry.audit)
    assert table_counts(ledger_url)["tasks"] == 1


def test_export_holds_each_task_with_its_history_before_the_delete(
    app: App, ledger_url: str, tmp_path: Path
) -> None:
    register(app)
    ids = {app.submit("t.ok", {"i": i}, idempotency_key=f"k{i}").task_id: i for i in range(7)}
    drain(app)
    led = open_ledger(ledger_url)
    try:
        before = table_counts(ledger_url)

        def refuse(records: list[dict[str, Any]]) -> None:
            raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):
            led.prune(0.0, by="t", batch_size=3, export=refuse)
        assert table_counts(ledger_url) == before  # the batch was rolled back
    finally:
        led.close()
    path = tmp_path / "pruned.jsonl"
    with Control(ledger_url) as control:
        report = control.prune(0.0, batch_size=3, export=path)
    assert report.exported == report.tasks == 7 and report.batches == 3
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["task"]["id"] for r in records) == sorted(ids)
    for r in records:
        task = r["task"]
        i = ids[task["id"]]
        assert task["state"] == "SUCCEEDED" and task["idempotency_key"] == f"k{i}"
        assert json.loads(task["params"]) == {"i": i} and json.loads(task["result"]) == i
        assert [(s["name"], json.loads(s["result"])) for s in r["steps"]] == [("double", 2 * i)]
        [effect] = r["effects"]
        assert effect["key"] == f"send:{i}:{task['id']}" and effect["state"] == "done"
        assert [a["kind"] for a in r["audit"]] == ["claim", "transition"]
        assert r["audit"][-1]["to_state"] == "SUCCEEDED" and r["late_effects"] == []


def test_batches_and_two_prunes_at_once(app: App, ledger_url: str) -> None:
    register(app)
    app.submit_many([SubmitRequest("t.ok", {"i": i}) for i in range(60)])
    drain(app)
    with Control(ledger_url) as control:
        report = control.prune(0.0, batch_size=7)
    assert report.tasks == 60 and report.batches == 9
    app.submit_many([SubmitRequest("t.ok", {"i": i}) for i in range(300)])
    drain(app)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def prune() -> None:
        try:
            with Control(ledger_url) as mine:
                reports.append(mine.prune(0.0, batch_size=10))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=prune) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # Together they deleted every task once (one may have found nothing left).
    assert sum(r.tasks for r in reports) == 300
    assert table_counts(ledger_url)["tasks"] == 0
    with Control(ledger_url) as control:
        assert control.status().counts == {}


def test_a_key_deduplicates_only_while_its_task_exists(app: App, ledger_url: str) -> None:
    ran: Counter[str] = Counter()
    register(app, ran)
    first = app.submit("t.ok", {"i": 1}, idempotency_key="order-1")
    drain(app)
    again = app.submit("t.ok", {"i": 1}, idempotency_key="order-1")
    assert again.task_id == first.task_id and not again.created
    with Control(ledger_url) as control:
        assert control.prune(0.0).tasks == 1
    # The dedupe window is over: the same key is a new task, and it runs (its effect too).
    third = app.submit("t.ok", {"i": 1}, idempotency_key="order-1")
    assert third.created and third.task_id != first.task_id
    drain(app)
    assert app.get(third.task_id).state is State.SUCCEEDED
    assert ran == {first.task_id: 1, third.task_id: 1}


def test_every_prune_is_audited_and_an_idle_worker_prune_is_not(
    app: App, ledger_url: str
) -> None:
    register(app)
    for i in range(3):
        app.submit("t.ok", {"i": i})
    drain(app)
    with Control(ledger_url) as control:
        control.prune(0.0, dry_run=True, by="alice")
        control.prune(0.0, by="alice")
        control.prune(3600.0, by="bob")  # nothing to delete: still audited (an operator's)
    rows = sql_rows(ledger_url, "SELECT task_id, kind, holder, detail FROM audit"
                                " WHERE kind = 'prune' ORDER BY seq")
    assert [(r[0], r[2]) for r in rows] == [("", "alice"), ("", "bob")]
    detail = json.loads(rows[0][3])
    assert detail["tasks"] == 3 and detail["older_than_s"] == 0.0 and detail["audit"] == 6
    assert json.loads(rows[1][3])["older_than_s"] == 3600.0
    led = open_ledger(ledger_url)
    try:
        led.prune(3600.0, by="worker-1", audit_empty=False)
    finally:
        led.close()
    assert len(sql_rows(ledger_url, "SELECT 1 FROM audit WHERE kind = 'prune'")) == 2


def test_prunes_while_real_workers_drain(app: App, ledger_url: str) -> None:
    """Two workers (one pruning every 50 ms) drain 400 tasks while a third prune loops
    and more tasks arrive: every task runs exactly once, none is deleted before it
    finished, and the counts stay what the ledger holds."""
    ran: Counter[str] = Counter()
    register(app, ran)
    ids = [h.task_id for h in app.submit_many(
        [SubmitRequest("t.ok", {"i": i}) for i in range(200)])]
    stop = threading.Event()
    pruned: list[int] = []
    errors: list[BaseException] = []

    def operator() -> None:
        try:
            with Control(ledger_url) as control:
                while not stop.is_set():
                    pruned.append(control.prune(0.0, batch_size=16).tasks)
        except BaseException as exc:  # reported below
            errors.append(exc)

    other = App(ledger_url)
    register(other, ran)
    thread = threading.Thread(target=operator)
    with running_worker(app, concurrency=4, names=["t.ok"], prune_older_than_s=0.0,
                        prune_every_s=0.05) as w1, \
            running_worker(other, concurrency=4, names=["t.ok"]):
        thread.start()
        for _ in range(4):
            ids += [h.task_id for h in app.submit_many(
                [SubmitRequest("t.ok", {"i": i}) for i in range(50)])]
        wait_for("every task to run", lambda: set(ran) >= set(ids), timeout_s=120)
        wait_for("every task to finish", lambda: not any(
            s != "SUCCEEDED" for _, s, _ in
            sql_rows(ledger_url, "SELECT name, state, 1 FROM tasks")), timeout_s=60)
        wait_for("the worker's pruner to run", lambda: w1.pruner is not None
                 and w1.pruner.runs > 0, timeout_s=30)
        stop.set()
        thread.join(60)
    other.close()
    assert not errors, errors
    assert len(ids) == 400 and all(ran[i] == 1 for i in ids), Counter(ran.values())
    assert pruned  # the operator's prunes ran beside the workers' (who deleted what is a race)
    left = [r[0] for r in sql_rows(ledger_url, "SELECT id FROM tasks")]
    check_ledger_consistent(ledger_url, task_ids=left)
    with Control(ledger_url) as control:
        assert control.status().counts == true_counts(ledger_url)
        control.prune(0.0)
        status = control.status()
        assert status.counts == {} and status.claims == 400


def test_status_counts_stay_exact_across_prunes_and_the_rollup(
    app: App, ledger_url: str
) -> None:
    register(app)
    with Control(ledger_url) as control:
        for round_ in range(3):
            app.submit_many([SubmitRequest("t.ok", {"i": i}) for i in range(20)]
                            + [SubmitRequest("t.bad", {"i": i}) for i in range(5)]
                            + [SubmitRequest("t.later", {})])
            drain(app)
            assert control.status().counts == true_counts(ledger_url), round_
            t = app.ledger.now()
            wait_clock(app, t + 1.2)  # past the PostgreSQL horizon (now - 1 s)
            assert control.status().counts == true_counts(ledger_url), round_
        mark = float(sql_rows(ledger_url, "SELECT upto FROM counts_mark")[0][0])
        assert mark > 0  # the rollup holds the older rounds
        # Prune about half: tasks on both sides of the mark.
        app.submit_many([SubmitRequest("t.ok", {"i": i}) for i in range(10)])
        drain(app)
        control.prune(0.0, batch_size=7)
        status = control.status()
        assert status.counts == true_counts(ledger_url) == {"t.later": {"PENDING": 3}}
        assert status.claims == 85 and status.unknown == 0


def test_operator_retry_of_a_task_in_the_rollup_keeps_the_counts_exact(
    app: App, ledger_url: str
) -> None:
    """A FAILED task counted in the finished rollup (finished before the mark) that an
    operator re-queues leaves the rollup in the same transaction: counted once, as
    PENDING, then once more as FAILED when it fails again."""
    register(app)
    with Control(ledger_url) as control:
        failed = [app.submit("t.bad", {"i": i}).task_id for i in range(3)]
        drain(app)
        wait_clock(app, app.ledger.now() + 1.2)  # past the PostgreSQL horizon (now - 1 s)
        assert control.status().counts == true_counts(ledger_url) == {"t.bad": {"FAILED": 3}}
        assert float(sql_rows(ledger_url, "SELECT upto FROM counts_mark")[0][0]) > 0
        outcome = control.retry(failed[0], reason="downstream fixed", by="ops")
        assert outcome.outcome == "done"
        assert control.status().counts == true_counts(ledger_url) == {
            "t.bad": {"FAILED": 2, "PENDING": 1}}
        drain(app)
        wait_clock(app, app.ledger.now() + 1.2)
        assert control.status().counts == true_counts(ledger_url) == {"t.bad": {"FAILED": 3}}


def test_bad_prune_arguments_are_refused(ledger_url: str) -> None:
    open_ledger(ledger_url).close()
    with Control(ledger_url) as control:
        for bad in (-1.0, float("nan"), float("inf"), "30d", True):
            with pytest.raises(InvalidArguments, match="older_than_s"):
                control.prune(bad)  # type: ignore[arg-type]
        for size in (0, 10001, 2.5):
            with pytest.raises(InvalidArguments, match="batch_size"):
                control.prune(1.0, batch_size=size)  # type: ignore[arg-type]
        with pytest.raises(InvalidArguments, match="dry run"):
            control.prune(1.0, dry_run=True, export="x.jsonl")
    with pytest.raises(Exception, match="prune_every_s"):
        Worker(App(ledger_url), prune_older_than_s=1.0, prune_every_s=0.0)


def test_cli_prune(app: App, ledger_url: str, tmp_path: Path) -> None:
    register(app)
    for i in range(4):
        app.submit("t.ok", {"i": i})
    drain(app)
    runner = CliRunner()
    dry = runner.invoke(cli, ["prune", "--older-than", "0s", "--dry-run", "--json",
                              "--ledger", ledger_url])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["tasks"] == 4 and json.loads(dry.output)["dry_run"]
    export = tmp_path / "out.jsonl"
    done = runner.invoke(cli, ["prune", "--older-than", "0", "--batch-size", "3", "--export",
                               str(export), "--operator", "carol", "--ledger", ledger_url])
    assert done.exit_code == 0, done.output
    assert "deleted 4 finished task(s)" in done.output and "2 batch(es)" in done.output
    assert len(export.read_text().splitlines()) == 4
    bad = runner.invoke(cli, ["prune", "--older-than", "soon", "--ledger", ledger_url])
    assert bad.exit_code == 2 and "--older-than must be a duration" in bad.output
    bare = runner.invoke(cli, ["prune", "--older-than", "30", "--ledger", ledger_url])
    assert bare.exit_code == 2 and "--older-than needs a unit: 30s, 30m" in bare.output
    missing = runner.invoke(cli, ["prune", "--ledger", ledger_url])
    assert missing.exit_code != 0
    # The worker's options are checked before the app is loaded.
    for options, message in (
            (["--prune-older-than", "30d", "--prune-every", "0s"], "--prune-every must be above 0"),
            (["--prune-older-than", "soon"], "--prune-older-than must"),
            (["--prune-older-than", "30"], "--prune-older-than needs a unit"),
            (["--prune-every", "1h"], "--prune-every needs --prune-older-than")):
        bad = runner.invoke(cli, ["worker", "no_such_module:app", *options,
                                  "--ledger", ledger_url])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_cli_prune_to_an_export_it_cannot_write_is_one_line_and_prunes_nothing(
    app: App, ledger_url: str, tmp_path: Path
) -> None:
    register(app)
    app.submit_many([SubmitRequest("t.ok", {"i": i}) for i in range(3)])
    drain(app)
    before = table_counts(ledger_url)
    for target in (tmp_path / "missing" / "x.jsonl", tmp_path):
        out = CliRunner().invoke(cli, ["prune", "--older-than", "0s", "--export", str(target),
                                       "--ledger", ledger_url])
        assert out.exit_code == 2, out.output
        assert "Traceback" not in out.output and "nothing was pruned" in out.output
        assert len(out.output.strip().splitlines()) == 1
    assert table_counts(ledger_url) == before

