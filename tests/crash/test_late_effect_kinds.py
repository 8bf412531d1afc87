"""A late effect's kind, on both ledgers, with real worker processes and a real SIGSTOP
(DESIGN §5, "a frozen sender"). Worker A freezes after its last lease check and before its
charge leaves (``RATCHET_PAUSE_AT=effect.before_call``) at a lookup-only target; its lease
expires and worker B takes the task over.

* B's lookup finds nothing and B charges: A's late request executes a second time, and its
  late effect stays a *possible duplicate* (the lookup row of tests/crash/frozenkit.py);
* B's lookup finds nothing while A's request may still be in flight (``in_flight_s``), so B
  retries later instead of charging; A resumes, its request executes, and B's next lookup
  finds it and settles the effect with it: one execution at the target, and A's late
  effect is *accounted for*.

The two kinds are counted apart by the ledger's stats, ``ratchet late-effects --json``,
the ledger metrics and ``ratchet reconcile``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from crashapp import CHARGE
from crashkit import Rig, wait_for
from frozenkit import assert_guarantee, run_frozen_sender
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from ratchet import Control, State
from ratchet.cli.main import cli
from ratchet.ledger.base import LATE_ACCOUNTED_FOR, LATE_POSSIBLE_DUPLICATE, EffectState
from ratchet.observe.ledger_metrics import render_ledger_metrics
from ratchet.reconcile import reconcile

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

HIT_PARAMS: dict[str, Any] = {"order_id": "o-2", "amount_cents": 1234, "target": "lookup"}
HIT_KEY = "charge:o-2"
IN_FLIGHT = {"CRASH_IN_FLIGHT_S": "600"}
"""B's lookup "not found" within this many seconds of A's intent proves nothing (A's request
may still arrive): B retries later instead of charging."""


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), terminal_width=400)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


def _gauges(body: bytes) -> dict[str, float]:
    return {s.name: s.value for family in text_string_to_metric_families(body.decode())
            for s in family.samples if not s.labels}


def test_late_effect_after_a_lookup_hit_is_accounted_for_and_counted_apart(rig: Rig) -> None:
    # ---- B called: A's late request is a possible duplicate
    called = run_frozen_sender(
        rig, "lookup", lambda name, pause_at=None: rig.worker(name, pause_at=pause_at))
    assert_guarantee(rig, called)

    # ---- B's lookup hit: A's late request was the only execution
    hit_id = rig.submit(HIT_PARAMS)
    a = rig.worker("A2", pause_at="effect.before_call", env=IN_FLIGHT)
    a_holder = a.holder()
    a.wait_stopped()
    rig.wait_lease_expired(hit_id)
    lookups = rig.client.stats()["lookups"]
    b = rig.worker("B2", env=IN_FLIGHT)
    wait_for("B's lookup (not found: A's request may still be in flight)",
             lambda: rig.client.stats()["lookups"] > lookups)
    assert rig.executions().get(HIT_KEY, 0) == 0
    a.resume()
    final = rig.wait_state(hit_id, (State.SUCCEEDED,))
    wait_for("A's late request to be recorded",
             lambda: len(rig.ledger.late_effects(hit_id)) == 1)
    assert a.stop() == 0, a.log()
    assert b.stop() == 0, b.log()

    assert rig.executions()[HIT_KEY] == 1, "B's lookup found A's charge and did not call"
    (effect,) = rig.ledger.timeline(hit_id).effects
    assert (effect.state, effect.via_lookup, effect.calls) == (EffectState.DONE, True, 1)
    assert final.generation >= 2 and effect.generation == final.generation
    (late,) = rig.ledger.late_effects(hit_id)
    assert (late.generation, late.holder, late.outcome, late.kind) == (
        1, a_holder, "done", LATE_ACCOUNTED_FOR)
    (duplicate,) = rig.ledger.late_effects(called.task_id)
    assert duplicate.kind == LATE_POSSIBLE_DUPLICATE

    # ---- the two kinds, counted apart
    stats = rig.ledger.stats()
    assert (stats.late_effects, stats.late_effects_accounted_for) == (2, 1)
    listed = json.loads(_cli("late-effects", "--json", "--ledger", rig.ledger_url))
    assert {r["task_id"]: r["kind"] for r in listed} == {
        called.task_id: "possible_duplicate", hit_id: "accounted_for"}
    table = _cli("late-effects", "--ledger", rig.ledger_url)
    assert "1 possible duplicate(s)" in table and "1 accounted for" in table
    shown = _cli("inspect", hit_id, "--ledger", rig.ledger_url)
    assert "accounted for" in shown and "check the target for a duplicate" not in shown
    assert "check the target for a duplicate" in _cli(
        "inspect", called.task_id, "--ledger", rig.ledger_url)
    with Control(rig.ledger_url) as control:
        gauges = _gauges(render_ledger_metrics(control)[0])
        report = reconcile(control, rig.app, CHARGE, record=False)
    assert gauges["ratchet_ledger_late_effects"] == 2
    assert gauges["ratchet_ledger_late_effects_possible_duplicates"] == 1
    assert gauges["ratchet_ledger_late_effects_accounted_for"] == 1
    assert (report.counts["late"], report.counts["late_accounted_for"]) == (1, 1)
    [accounted] = [f for f in report.findings if f.outcome == "late_accounted_for"]
    [possible] = [f for f in report.findings if f.outcome == "late"]
    assert (accounted.task_id, possible.task_id) == (hit_id, called.task_id)
    # Only the possible duplicate is left open (with the effects no lookup checked).
    assert report.open_findings == report.counts["late"] + report.counts["no_lookup"]
    rig.check_consistent()
