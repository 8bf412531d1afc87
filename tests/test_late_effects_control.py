"""Late effects as the operator sees them (DESIGN §5): ``Control.late_effects``, the count in
``Control.status`` / ``ratchet status``, the rows in ``ratchet inspect`` and the
``ratchet late-effects`` listing, on both ledgers.

The late effect is made by a real stale holder in this process: its claim is revoked while
its call is out and its safe window is closed when the reply comes (what a holder frozen
past its lease sees when it wakes), so its result write is fenced out and the call it sent
is recorded. Processes frozen with SIGSTOP are in tests/crash and tests/pg_faults.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from typer.testing import CliRunner

from ratchet import NOT_FOUND, App, Control, InvalidArguments, State, TaskContext, Worker
from ratchet.cli.main import cli

pytestmark = pytest.mark.timeout(60)


def make_late_effect(app: App) -> str:
    charged: Counter[str] = Counter()

    @app.task(name="t.late")
    def late(ctx: TaskContext, order: str) -> Any:
        def call(key: str) -> dict[str, Any]:
            charged[key] += 1
            if ctx.generation == 1:
                app.ledger.revoke_holder(ctx.holder, "test", "simulated takeover")
                ctx.lease.mark_lost()
            return {"charge": f"ch-{charged[key]}"}

        def lookup(key: str) -> Any:
            return NOT_FOUND  # a target that cannot see the first charge (it was late)

        return ctx.effect("charge", call, key=f"charge:{order}", lookup=lookup)

    handle = app.submit("t.late", {"order": "o-9"})
    Worker(app, concurrency=1, poll_interval_s=0.01).run(idle_exit_s=0.4)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == {"charge": "ch-2"}
    assert charged == Counter({"charge:o-9": 2}), "the duplicate this test wants visible"
    return handle.task_id


def test_control_lists_counts_and_inspects_late_effects(app: App, ledger_url: str) -> None:
    task_id = make_late_effect(app)
    with Control(ledger_url) as control:
        assert control.status().late_effects == 1
        [view] = control.late_effects()
        assert (view.task_id, view.task_name, view.effect, view.key) == (
            task_id, "t.late", "charge", "charge:o-9")
        assert (view.generation, view.outcome, view.detail) == (1, "done", {"charge": "ch-1"})
        # What the ledger recorded for the same effect: the new holder's charge (the
        # revocation took generation 2, the next claim is generation 3).
        assert (view.recorded_key, view.recorded_generation) == ("charge:o-9", 3)
        assert control.late_effects(task_id) == [view]
        assert control.late_effects("0" * 32) == []
        timeline = control.inspect(task_id)
        assert timeline.late_effects == [view]
        with pytest.raises(InvalidArguments, match="limit"):
            control.late_effects(limit=0)


def test_cli_shows_late_effects(app: App, ledger_url: str) -> None:
    task_id = make_late_effect(app)
    runner = CliRunner()
    listed = runner.invoke(cli, ["late-effects", "--ledger", ledger_url, "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert row["task_id"] == task_id and row["key"] == "charge:o-9" and row["generation"] == 1
    text = runner.invoke(cli, ["late-effects", "--ledger", ledger_url])
    assert text.exit_code == 0 and "charge:o-9" in text.output, text.output
    status = runner.invoke(cli, ["status", "--ledger", ledger_url])
    assert status.exit_code == 0
    assert "late effects (possible duplicates" in status.output
    assert json.loads(runner.invoke(cli, ["status", "--ledger", ledger_url, "--json"])
                      .output)["late_effects"] == 1
    inspect = runner.invoke(cli, ["inspect", task_id, "--ledger", ledger_url])
    assert inspect.exit_code == 0
    assert "LATE effect charge" in inspect.output and "1 late effect(s)" in inspect.output
