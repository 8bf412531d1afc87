"""Listing tasks: ``Control.list_tasks``, ``App.list_tasks`` and
``ratchet tasks`` on both ledgers: filters by state, type, key and age, newest first,
keyset pages that neither skip nor repeat tasks while more are submitted, JSON output, and
clear errors for bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, InvalidArguments, RetryPolicy, State, TaskContext, Worker
from ratchet.cli.main import cli
from ratchet.validation import parse_duration_s

pytestmark = pytest.mark.timeout(60)


def make_tasks(app: App) -> dict[str, list[str]]:
    """Five ``t.ok`` tasks that succeed, three ``t.bad`` that fail, two keyed pending."""

    @app.task(name="t.ok")
    def ok(ctx: TaskContext, i: int) -> int:
        return i

    @app.task(name="t.bad", retry=RetryPolicy(max_attempts=1))
    def bad(ctx: TaskContext, i: int) -> int:
        raise ValueError(f"bad input {i}")

    @app.task(name="t.later")
    def later(ctx: TaskContext) -> None:
        return None

    ids = {
        "ok": [app.submit("t.ok", {"i": i}).task_id for i in range(5)],
        "bad": [app.submit("t.bad", {"i": i}).task_id for i in range(3)],
    }
    Worker(app, concurrency=2, poll_interval_s=0.01, names=["t.ok", "t.bad"]).run(
        idle_exit_s=0.4)
    ids["later"] = [app.submit("t.later", {}, idempotency_key=f"later-{i}").task_id
                    for i in range(2)]
    return ids


def test_filters_by_state_type_key_and_age(app: App, ledger_url: str) -> None:
    ids = make_tasks(app)
    with Control(ledger_url) as control:
        failed = control.list_tasks(state="failed")
        assert sorted(t.task_id for t in failed.tasks) == sorted(ids["bad"])
        assert all(t.state is State.FAILED and "bad input" in (t.last_error or "")
                   for t in failed.tasks)
        assert failed.next_cursor is None
        both = control.list_tasks(state=[State.SUCCEEDED, "PENDING"])
        assert sorted(t.task_id for t in both.tasks) == sorted(ids["ok"] + ids["later"])
        by_type = control.list_tasks(name="t.later")
        assert sorted(t.task_id for t in by_type.tasks) == sorted(ids["later"])
        everything = control.list_tasks().tasks
        # Newest first (tasks created in the same clock tick come in id order).
        assert [t.created_at for t in everything] == sorted(
            (t.created_at for t in everything), reverse=True)
        [keyed] = control.list_tasks(key="later-1").tasks
        assert keyed.task_id == ids["later"][1]
        assert len(control.list_tasks(newer_than_s=3600).tasks) == 10
        assert control.list_tasks(older_than_s=3600).tasks == []
        assert control.list_tasks(name=["t.ok", "t.bad"], state="SUCCEEDED").tasks == \
            control.list_tasks(name="t.ok").tasks
    page = app.list_tasks(state="FAILED", limit=2)
    assert len(page.tasks) == 2 and page.next_cursor is not None


def test_pages_neither_skip_nor_repeat_while_tasks_arrive(app: App, ledger_url: str) -> None:
    @app.task(name="t.many")
    def many(ctx: TaskContext, i: int) -> int:
        return i

    first = [app.submit("t.many", {"i": i}).task_id for i in range(23)]
    seen: list[str] = []
    cursor = None
    with Control(ledger_url) as control:
        while True:
            page = control.list_tasks(name="t.many", limit=5, cursor=cursor)
            seen += [t.task_id for t in page.tasks]
            if len(seen) == 5:  # tasks submitted meanwhile are newer: not on later pages
                app.submit("t.many", {"i": 99})
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    assert len(seen) == len(set(seen)) == 23, "a page skipped or repeated a task"
    assert set(seen) == set(first), "the task submitted meanwhile is newer: not listed"


def test_bad_input_is_refused_clearly(app: App, ledger_url: str) -> None:
    with Control(ledger_url) as control:
        control.migrate()
        with pytest.raises(InvalidArguments, match="unknown state 'DONE'"):
            control.list_tasks(state="DONE")
        with pytest.raises(InvalidArguments, match="limit"):
            control.list_tasks(limit=0)
        with pytest.raises(InvalidArguments, match="older_than_s"):
            control.list_tasks(older_than_s=-1)
        with pytest.raises(InvalidArguments, match="malformed cursor"):
            control.list_tasks(cursor="nonsense")
    assert parse_duration_s("90", "x") == 90.0
    assert parse_duration_s("1.5h", "x") == 5400.0
    assert parse_duration_s("7d", "x") == 7 * 86400.0
    with pytest.raises(InvalidArguments, match="--older-than must be a duration"):
        parse_duration_s("5 weeks", "--older-than")


def test_cli_lists_tasks_as_text_and_json(app: App, ledger_url: str) -> None:
    ids = make_tasks(app)
    runner = CliRunner()
    as_json = runner.invoke(cli, ["tasks", "--ledger", ledger_url, "--state", "FAILED",
                                  "--json"])
    assert as_json.exit_code == 0, as_json.output
    page = json.loads(as_json.output)
    assert sorted(t["task_id"] for t in page["tasks"]) == sorted(ids["bad"])
    assert page["next_cursor"] is None
    text = runner.invoke(cli, ["tasks", "--ledger", ledger_url, "--type", "t.bad",
                               "--limit", "2"])
    assert text.exit_code == 0, text.output
    assert "ValueError: bad input" in text.output and "--cursor" in text.output
    bad = runner.invoke(cli, ["tasks", "--ledger", ledger_url, "--older-than", "soon"])
    assert bad.exit_code == 2 and "--older-than must be a duration" in bad.output
