"""The crash-point matrix (DESIGN §6), rows 3-8, with real processes and real signals.

Each test kills (SIGKILL) or pauses (SIGSTOP) a real worker process at a named fault
point (``ratchet.faults``), restarts a clean worker, and checks the end state against the
crash-free control run. Every row runs on both ledgers (the ``rig`` fixture takes
``ledger_url``: a SQLite file or a private PostgreSQL schema). "How often did it happen"
is always counted outside Ratchet: the counting service's own SQLite file for charges, the
append-only step log for steps.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest
from crashkit import (
    KEY,
    PARAMS,
    SIGKILLED,
    Outcome,
    Rig,
    wait_for,
)

from ratchet import State
from ratchet.ledger.base import EffectState
from ratchet.testing import list_task_ids
from ratchet.testing.matrix.rows_worker import WRITER_THREAD

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]


def assert_like_control(
    rig: Rig,
    task_id: str,
    control: Outcome,
    steps: dict[str, int] | None = None,
    other_keys: frozenset[str] = frozenset(),
) -> None:
    """Same final state and result as the crash-free run, one execution per key at the
    service, and each step executed as often as ``steps`` says (default: like control).
    ``other_keys``: keys of other tasks of the test, executed once each."""
    out = rig.outcome(task_id)
    assert out.info.state is State.SUCCEEDED, out.info
    assert out.info.result == control.info.result
    assert control.executions == {KEY: 1}
    assert out.executions == {KEY: 1, **dict.fromkeys(other_keys, 1)}
    assert dict(out.steps) == (steps if steps is not None else dict(control.steps))
    timeline = rig.ledger.timeline(task_id)
    assert sorted(s.name for s in timeline.steps) == ["finalize", "prepare"]
    (effect,) = timeline.effects
    assert effect.state is EffectState.DONE and effect.key == KEY
    # The recorded result is the service's own record of the one execution.
    assert json.loads(effect.result_json or "null")["id"] == rig.record_ids()[KEY]
    rig.check_consistent()


def finish_with_clean_worker(rig: Rig, task_id: str, name: str = "clean") -> Any:
    worker = rig.worker(name)
    info = rig.wait_state(task_id)
    assert worker.stop() == 0, "the clean worker must stop gracefully on SIGTERM"
    return info


# --------------------------------------------------------------------- row 3

SUBMIT = """
import json, sys
import crashapp
handle = crashapp.app.submit(crashapp.CHARGE, json.loads(sys.argv[1]), idempotency_key=sys.argv[2])
print("ANSWER " + json.dumps({"task_id": handle.task_id, "created": handle.created}), flush=True)
"""


def test_row3_submit_committed_client_not_answered(rig: Rig, control: Any) -> None:
    ctl = control()
    rig.start_service(honour_keys=False)
    key = "order:o-1"
    crashed = rig.python(
        "submit-crash", SUBMIT, json.dumps(PARAMS), key, RATCHET_CRASH_AT="submit.after_commit"
    )
    assert crashed.wait() == SIGKILLED
    assert "ANSWER" not in crashed.log(), "the client must not have been answered"
    ids = list_task_ids(rig.ledger_url)
    assert len(ids) == 1, "the task row was committed before the crash"
    (task_id,) = ids
    assert rig.get(task_id).idempotency_key == key

    # The client retries with the same key, from a new process: same task, nothing new.
    retry = rig.python("submit-retry", SUBMIT, json.dumps(PARAMS), key)
    assert retry.wait() == 0
    answer = json.loads(retry.log().split("ANSWER ", 1)[1])
    assert answer == {"task_id": task_id, "created": False}
    again = rig.app.submit("crash.charge", PARAMS, idempotency_key=key)
    assert (again.task_id, again.created) == (task_id, False)
    assert list_task_ids(rig.ledger_url) == [task_id]

    info = finish_with_clean_worker(rig, task_id)
    assert info.generation == 1
    assert_like_control(rig, task_id, ctl)


# --------------------------------------------------------------------- row 4


def test_row4_claimed_then_killed_lease_expiry_takeover(rig: Rig, control: Any) -> None:
    """A claims and dies; B, already up and polling before A's claim, must wait for A's
    lease to expire by the ledger clock before it takes the task over.

    B is started first (while there is nothing to claim) and frozen with SIGSTOP, outside
    any ledger transaction; it is resumed right after A died. So B polls during A's whole
    lease however slowly processes start on a loaded machine."""
    ctl = control()
    rig.lease_s = 3.0
    rig.start_service(honour_keys=False)
    rig.app.ledger.migrate()
    clean = rig.worker("B")
    b_holder = clean.holder()
    freeze_outside_a_transaction(rig, clean)

    task_id = rig.submit()
    dead = rig.worker("A", crash_at="claim.after_commit")
    assert dead.wait() == SIGKILLED
    held = rig.get(task_id)
    assert held.state is State.RUNNING and held.generation == 1
    assert held.holder is not None and f":{dead.pid}:" in held.holder
    assert held.lease_until is not None
    assert rig.step_runs() == [] and rig.executions() == {}, "nothing executed yet"
    clean.resume()
    b_polling_at = rig.ledger.now()
    info = rig.wait_state(task_id)
    assert clean.stop() == 0

    takeovers = [e for e in rig.ledger.timeline(task_id).events if e.kind == "takeover"]
    assert len(takeovers) == 1, takeovers
    ev = takeovers[0]
    assert ev.generation == 2 and ev.holder == b_holder
    assert ev.detail["previous_holder"] == held.holder
    assert ev.detail["previous_generation"] == 1
    assert ev.at >= held.lease_until, "taken over before the lease expired"
    # Not a vacuous check: B was polling while the lease was still live.
    assert b_polling_at < held.lease_until, (b_polling_at, held.lease_until)
    assert (info.generation, info.attempt) == (2, 2)
    stats = rig.ledger.stats()
    assert stats.takeovers == 1 and stats.claims == 2
    assert_like_control(rig, task_id, ctl)


def freeze_outside_a_transaction(rig: Rig, proc: Any) -> None:
    """SIGSTOP ``proc``, retrying until it is not frozen inside a ledger transaction
    (SQLite's write lock would stall every other process; on PostgreSQL, row locks held by
    a frozen session would keep its tasks from being claimed until the server ends it)."""
    for _ in range(50):
        proc.pause()
        if not rig.ledger_locked():
            return
        proc.resume()
        time.sleep(0.01)
    pytest.fail(f"could not stop {proc.name} outside a ledger transaction")


# --------------------------------------------------------------------- row 5


def test_row5a_intent_committed_call_not_made(rig: Rig, control: Any) -> None:
    ctl = control()
    svc = rig.start_service(honour_keys=False)  # every POST executes: only lookup protects
    task_id = rig.submit()
    dead = rig.worker("A", crash_at="effect.after_intent")
    assert dead.wait() == SIGKILLED
    (effect,) = rig.ledger.timeline(task_id).effects
    assert effect.state is EffectState.INTENT and effect.key == KEY
    assert rig.executions() == {}, "the call was not made"

    info = finish_with_clean_worker(rig, task_id)
    assert info.generation == 2
    (effect,) = rig.ledger.timeline(task_id).effects
    assert not effect.via_lookup, "lookup said not found, so the result came from the call"
    assert effect.calls == 2, "a second intent was recorded before calling again"
    svc_stats = rig.client.stats()
    assert svc_stats["lookups"] >= 1 and svc_stats["lookups_found"] == 0
    assert rig.ledger.stats().lookup_hits == 0
    assert svc.alive()
    assert_like_control(rig, task_id, ctl)


def test_row5b_call_made_result_not_recorded(rig: Rig, control: Any) -> None:
    ctl = control()
    rig.start_service(honour_keys=False)
    task_id = rig.submit()
    dead = rig.worker("A", crash_at="effect.after_call")
    assert dead.wait() == SIGKILLED
    (effect,) = rig.ledger.timeline(task_id).effects
    assert effect.state is EffectState.INTENT, "the result was not recorded"
    assert rig.executions() == {KEY: 1}, "the charge did execute"

    info = finish_with_clean_worker(rig, task_id)
    assert info.generation == 2
    timeline = rig.ledger.timeline(task_id)
    (effect,) = timeline.effects
    assert effect.via_lookup, "the result must come from the lookup, not a second call"
    hits = [e for e in timeline.events if e.kind == "lookup_hit"]
    assert len(hits) == 1 and hits[0].generation == 2 and hits[0].detail["key"] == KEY
    assert rig.ledger.stats().lookup_hits == 1
    assert rig.client.stats()["lookups_found"] == 1
    assert_like_control(rig, task_id, ctl)


def test_row5c_killed_while_call_in_flight_at_slow_target(rig: Rig, control: Any) -> None:
    """Row 5 with a slow target: A is killed after its request reached the service but
    before the service executed it. B takes over after the lease and looks up: "not found"
    is not proof yet, because the request may still be in flight (the effect declares
    ``in_flight_s``), so B retries the lookup later instead of calling, finds A's late
    execution and reuses it: one execution (DESIGN §1.3, §5: never gamble)."""
    ctl = control()
    # B's first lookup must come before the slow request executes: B's start-up (a Python
    # process: seconds on a loaded machine, e.g. two suites at once) and A's 1 s lease fit
    # well inside it.
    slow_s = 8.0
    rig.start_service(honour_keys=False)
    rig.client.set_faults(slow_next=1, slow_s=slow_s)
    env = {"CRASH_IN_FLIGHT_S": str(slow_s + 1.5)}  # client timeout 1 s + processing bound
    task_id = rig.submit()
    a = rig.worker("A", env=env)
    wait_for("A's charge to reach the service", lambda: rig.client.stats()["injected"]["slow"])
    arrived = time.monotonic()
    assert a.kill() == SIGKILLED
    (effect,) = rig.ledger.timeline(task_id).effects
    assert effect.state is EffectState.INTENT
    assert rig.executions() == {}, "the service has not executed the charge yet"

    b = rig.worker("B", env=env)
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED
    assert time.monotonic() >= arrived + slow_s, "B must not finish before A's request landed"
    assert b.stop() == 0
    assert rig.executions() == {KEY: 1}, "the charge executed twice"
    (effect,) = rig.ledger.timeline(task_id).effects
    assert effect.via_lookup and effect.calls == 1, "B found A's late charge, never called"
    svc = rig.client.stats()
    assert svc["lookups_found"] == 1 and svc["lookups"] >= 2, svc
    assert "may still be in flight" in b.log()
    assert_like_control(rig, task_id, ctl)


# --------------------------------------------------------------------- row 6


@pytest.mark.parametrize(("skip", "committed"), [(0, ["prepare"]), (1, ["finalize", "prepare"])])
def test_row6_step_recorded_not_acknowledged(
    rig: Rig, control: Any, skip: int, committed: list[str]
) -> None:
    ctl = control()
    rig.start_service(honour_keys=False)
    task_id = rig.submit()
    dead = rig.worker("A", crash_at="step.after_commit", skip=skip)
    assert dead.wait() == SIGKILLED
    timeline = rig.ledger.timeline(task_id)
    assert sorted(s.name for s in timeline.steps) == committed
    assert timeline.task.state is State.RUNNING
    before = rig.step_counts(task_id)
    assert dict(before) == dict.fromkeys(committed, 1)

    info = finish_with_clean_worker(rig, task_id)
    assert info.generation == 2
    # Done markers: no committed step ran again; each step ran exactly once overall.
    assert_like_control(rig, task_id, ctl, steps={"prepare": 1, "finalize": 1})
    for run in rig.step_runs(task_id):
        assert run.step not in committed or run.generation == 1


def test_row6_task_completed_not_rerun(rig: Rig, control: Any) -> None:
    """Killed right after the completion committed: a fresh worker never claims the task
    again. Proof that the fresh worker did poll with the completed task in the ledger: it
    claims and finishes a second task submitted after it started."""
    ctl = control()
    rig.start_service(honour_keys=False)
    task_id = rig.submit()
    dead = rig.worker("A", crash_at="task.after_complete")
    assert dead.wait() == SIGKILLED
    assert rig.get(task_id).state is State.SUCCEEDED

    clean = rig.worker("B")
    clean.holder()
    probe_id = rig.submit({"order_id": "o-2", "amount_cents": 99})
    assert rig.wait_state(probe_id).state is State.SUCCEEDED
    assert clean.stop() == 0
    assert rig.ledger.stats().claims == 2, "a completed task must never be claimed again"
    info = rig.get(task_id)
    assert (info.generation, info.attempt) == (1, 1)
    assert_like_control(rig, task_id, ctl, other_keys=frozenset({"charge:o-2"}))


# --------------------------------------------------------------------- row 7

# The n-th write transaction of a fresh worker's writer thread (0-based; its start-up
# writes run in the main thread, its lease renewals in the heartbeat's): claim, prepare
# step + effect intent (the pipelined step rides on the intent's transaction), effect
# result, finalize step (durable=True), completion.
_CLAIM, _STEP, _INTENT, _RESULT, _FINAL, _COMPLETE = 0, 1, 1, 2, 3, 4


@pytest.mark.parametrize("target", ["claim", "step", "effect_result", "completion"])
def test_row7_killed_inside_the_commit_transaction(rig: Rig, control: Any, target: str) -> None:
    ctl = control()
    rig.start_service(honour_keys=False)
    task_id = rig.submit()
    nth = {"claim": _CLAIM, "step": _STEP, "effect_result": _RESULT, "completion": _COMPLETE}
    dead = rig.worker("A", crash_at="commit.before_commit", skip=nth[target],
                      thread=WRITER_THREAD)
    assert dead.wait() == SIGKILLED

    # Nothing of the killed transaction is visible; everything before it is.
    timeline = rig.ledger.timeline(task_id)
    steps = sorted(s.name for s in timeline.steps)
    effects = {e.name: e.state for e in timeline.effects}
    kinds = [e.kind for e in timeline.events]
    if target == "claim":
        # Killed in the claim, not in a start-up transaction: the worker had logged its
        # start-up line (after opening the ledger, before claiming).
        assert dead.started(), dead.log()
        # The claim itself was lost: the task is still plainly ready, nobody holds it.
        assert timeline.task.state is State.PENDING and timeline.task.generation == 0
        assert timeline.task.holder is None and kinds == [] and steps == [] and effects == {}
        rig.check_consistent()
        info = finish_with_clean_worker(rig, task_id)
        assert info.generation == 1, "a lost claim leaves no lease behind to expire"
        assert_like_control(rig, task_id, ctl)
        return
    assert timeline.task.state is State.RUNNING and timeline.task.generation == 1
    assert kinds == ["claim"], kinds
    if target == "step":
        assert steps == [] and effects == {}
        assert rig.executions() == {}
        assert dict(rig.step_counts(task_id)) == {"prepare": 1}, "the step ran, uncommitted"
    elif target == "effect_result":
        assert steps == ["prepare"] and effects == {"charge": EffectState.INTENT}
        assert rig.executions() == {KEY: 1}
    else:
        assert steps == ["finalize", "prepare"] and effects == {"charge": EffectState.DONE}
        assert timeline.task.result is None
    rig.check_consistent()

    info = finish_with_clean_worker(rig, task_id)
    assert info.generation == 2
    expected_steps = {"prepare": 2 if target == "step" else 1, "finalize": 1}
    assert_like_control(rig, task_id, ctl, steps=expected_steps)
    if target == "step":
        reruns = [r for r in rig.step_runs(task_id) if r.step == "prepare"]
        assert [r.generation for r in reruns] == [1, 2]
    if target == "effect_result":
        assert rig.ledger.timeline(task_id).effects[0].via_lookup


# --------------------------------------------------------------------- row 8


def _assert_stale_write_rejected(
    rig: Rig, task_id: str, a_holder: str, operation: str, b_result: Any
) -> None:
    wait_for(
        "the stale holder's write to be rejected", lambda: rig.ledger.stats().stale_rejections >= 1
    )
    timeline = rig.ledger.timeline(task_id)
    stale = [e for e in timeline.events if e.kind == "stale_rejected"]
    assert stale, timeline.events
    assert all(e.holder == a_holder and e.generation == 1 for e in stale), stale
    assert stale[0].detail["operation"] == operation
    assert stale[0].detail["current_generation"] == 2
    # The late write changed nothing: B's outcome stands.
    info = rig.get(task_id)
    assert info.state is State.SUCCEEDED and info.generation == 2
    assert info.result == b_result


@pytest.mark.parametrize("pause_at", ["effect.after_call", "effect.after_intent"])
def test_row8_paused_holder_is_fenced(rig: Rig, control: Any, pause_at: str) -> None:
    """A pauses itself (SIGSTOP) inside the effect, past its lease; B takes over and
    finishes; A resumes. ``after_call``: A had charged; B finds it by lookup and A's late
    result write is rejected by generation. ``after_intent``: A had not called; B's lookup
    says not found and B charges; A, resumed, cannot confirm its lease, makes no call, and
    its release is rejected by generation."""
    ctl = control()
    rig.start_service(honour_keys=False)
    task_id = rig.submit()
    a = rig.worker("A", pause_at=pause_at)
    a_holder = a.holder()
    a.wait_stopped()
    charged_by_a = pause_at == "effect.after_call"
    assert rig.executions() == ({KEY: 1} if charged_by_a else {})
    assert not rig.ledger_locked(), "the stopped worker froze holding ledger locks"
    rig.wait_lease_expired(task_id)

    b = rig.worker("B")
    b_holder = b.holder()
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED and info.generation == 2
    assert info.holder is None
    timeline = rig.ledger.timeline(task_id)
    (takeover,) = [e for e in timeline.events if e.kind == "takeover"]
    assert takeover.holder == b_holder and takeover.detail["previous_holder"] == a_holder
    (effect,) = timeline.effects
    assert effect.generation == 2
    assert effect.via_lookup is charged_by_a, "B reuses A's charge only if A made it"

    a.signal(signal.SIGCONT)
    operation = "effect_done:charge" if charged_by_a else "finish:PENDING"
    _assert_stale_write_rejected(rig, task_id, a_holder, operation, info.result)
    assert a.returncode is None, "the stale holder must survive its rejected write"
    assert a.stop() == 0 and b.stop() == 0
    stats = rig.ledger.stats()
    assert stats.stale_rejections >= 1 and stats.takeovers == 1
    assert stats.lookup_hits == (1 if charged_by_a else 0)
    # Not a late effect either way: A's reply came inside its lease (after_call), or A,
    # unable to confirm its lease once resumed, never sent (after_intent).
    assert stats.late_effects == 0 and rig.ledger.late_effects(task_id) == []
    assert_like_control(rig, task_id, ctl)


def test_row8_sigstop_during_slow_step_is_fenced(rig: Rig, control: Any) -> None:
    params = {**PARAMS, "slow_s": 1.5}
    ctl = control(params)
    rig.start_service(honour_keys=False)
    task_id = rig.submit(params)
    a = rig.worker("A")
    a_holder = a.holder()
    wait_for("A to start the slow step", lambda: rig.step_runs(task_id))
    # Stop A from outside while it is inside the step. Never leave it stopped while it holds
    # ledger locks (a heartbeat mid-commit): that would stall every worker.
    freeze_outside_a_transaction(rig, a)
    assert rig.get(task_id).generation == 1
    rig.wait_lease_expired(task_id)

    b = rig.worker("B")
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED and info.generation == 2
    assert rig.executions() == {KEY: 1}
    assert rig.ledger.stats().stale_rejections == 0

    # A's sleep is long over. Its step is pipelined (it rides on A's next write); A cannot
    # confirm its lease before the effect, so that next write is the release, carrying the
    # step: rejected by generation, nothing of it lands.
    a.signal(signal.SIGCONT)
    _assert_stale_write_rejected(rig, task_id, a_holder, "finish:PENDING", info.result)
    assert a.returncode is None
    assert a.stop() == 0 and b.stop() == 0
    assert rig.ledger.stats().late_effects == 0, "A never sent its charge"
    # A ran the step but its commit was rejected; B ran it again: two runs, one commit.
    runs = [(r.step, r.generation) for r in rig.step_runs(task_id)]
    assert sorted(runs) == [("finalize", 2), ("prepare", 1), ("prepare", 2)]
    assert_like_control(rig, task_id, ctl, steps={"prepare": 2, "finalize": 1})
