"""A frozen sender, per kind of target (DESIGN §4-§5, matrix row 8).

Worker A stops itself (``RATCHET_PAUSE_AT``, a real SIGSTOP) inside a charge: by default
at ``effect.before_call``, after its last lease check and before its request leaves. Its
lease expires by the ledger clock; worker B takes the task over and settles it; then A
gets SIGCONT and its request leaves late. What happens then depends only on the target,
and every count is read at the target (the counting service's own file), never from our
logs:

============  ==========================  ============================================
target        service                     guarantee with a sender frozen before its send
============  ==========================  ============================================
idempotent    honours keys                exactly once (A's late request is a replay;
                                          not a late effect: the target deduplicated)
fenced        ``--check-tokens``          exactly once (A's late request is refused:
                                          stale token; A abandons, nothing recorded)
lookup        lookup, no dedupe           B charges after "not found"; A's late request
                                          executes again: 2 executions, the duplicate
                                          recorded as a late effect; B's result stands
none          no lookup, no dedupe        at least once: B cannot settle the open intent
                                          (UNKNOWN, no call); A's late request executes
                                          once and is recorded as a late effect
============  ==========================  ============================================

The scenario runs on any rig (tests/crash: the SQLite ledger; tests/pg_faults: a
PostgreSQL schema); :func:`assert_guarantee` asserts the row of its target exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from crashkit import KEY, PARAMS, Rig, WorkerProcess, wait_for

from ratchet import State, TaskInfo
from ratchet.ledger.base import LATE_POSSIBLE_DUPLICATE, EffectRecord, EffectState, LateEffect
from ratchet.testing import ServiceRecords

__all__ = [
    "FrozenRun",
    "Guarantee",
    "StartWorker",
    "assert_guarantee",
    "guarantee",
    "run_frozen_sender",
]

LEASE_S = 2.0
"""Lease of the frozen-sender tasks, seconds (short: the test waits for it to expire)."""

StartWorker = Callable[..., WorkerProcess]
"""``start(name, pause_at=None) -> WorkerProcess``: a worker of the rig's ledger."""


@dataclass(frozen=True)
class Guarantee:
    """What the target must show at the end of a frozen-sender run (one row of the table).

    Attributes:
        executions: executions of the key counted by the service.
        b_executed: B's own call executed (False: B reused A's charge, or made no call).
        a_sends_late: A's request leaves after the takeover.
        token_rejections: A's late requests the service refused for a stale token.
        replays: requests the service answered as a replay of the key (honours keys).
        late_effects: late-effect records in the ledger (A's reply came after its safe
            window, from a target that does not deduplicate keys, and its result write
            was rejected).
        final_state: the task's state once B is done (and after A's late write).
        stale_operation: the first of A's ledger writes rejected as stale (None: A wrote
            nothing after resuming).
        lookups: lookups the service answered (None: one for a target with a lookup).
        late_outcome: the outcome of the late-effect records.
    """

    executions: int
    b_executed: bool
    a_sends_late: bool
    token_rejections: int
    replays: int
    late_effects: int
    final_state: State
    stale_operation: str | None
    lookups: int | None = None
    late_outcome: str = "done"

    def expected_lookups(self, target: str) -> int:
        """Lookups the service answered: B's one at takeover (targets with a lookup)
        unless the row says otherwise; A, refused or rejected, never asks again."""
        if self.lookups is not None:
            return self.lookups
        return int(target in ("lookup", "fenced"))


SERVICE: dict[str, dict[str, bool]] = {
    "idempotent": {"honour_keys": True},
    "fenced": {"honour_keys": False, "check_tokens": True},
    "lookup": {"honour_keys": False},
    "none": {"honour_keys": False},
}
"""Counting-service settings per kind of target: only the target's own mechanism protects
the key (a fenced target does not also dedupe; a lookup-only one does not dedupe)."""


def guarantee(
    target: str, pause_at: str = "effect.before_call", a_reply_lost: bool = False
) -> Guarantee:
    """The row of the guarantee table for ``target`` with A frozen at ``pause_at``
    (``a_reply_lost``: the reply to A's late request is lost on the way back).

    Raises:
        KeyError: a combination no test runs.
    """
    done = "effect_done:charge"
    if a_reply_lost:
        # A's late request executes but its reply is lost: A settles it by lookup (it
        # finds a record), and its write of that is rejected: the late effect's outcome
        # is "unknown" (A cannot know whether its own request executed), still detected.
        if pause_at == "effect.before_call" and target == "lookup":
            return Guarantee(2, True, True, 0, 0, 1, State.SUCCEEDED, done,
                             lookups=2, late_outcome="unknown")
        if pause_at == "effect.before_call" and target == "none":
            # Nothing to settle by: A's attempt ends UNKNOWN, a write rejected as stale.
            return Guarantee(1, False, True, 0, 0, 1, State.UNKNOWN, "finish:UNKNOWN",
                             lookups=0, late_outcome="unknown")
        raise KeyError((target, pause_at, a_reply_lost))
    if pause_at == "effect.before_call":
        return {
            "idempotent": Guarantee(1, True, True, 0, 1, 0, State.SUCCEEDED, done),
            "fenced": Guarantee(1, True, True, 1, 0, 0, State.SUCCEEDED, None),
            "lookup": Guarantee(2, True, True, 0, 0, 1, State.SUCCEEDED, done),
            "none": Guarantee(1, False, True, 0, 0, 1, State.UNKNOWN, done),
        }[target]
    if pause_at == "effect.after_call":
        # A charged inside its lease, then froze: B finds the charge by lookup and reuses
        # it; A's result write is rejected. Its call was not late: no late effect.
        return {
            "lookup": Guarantee(1, False, False, 0, 0, 0, State.SUCCEEDED, done),
            "fenced": Guarantee(1, False, False, 0, 0, 0, State.SUCCEEDED, done),
        }[target]
    if pause_at == "effect.after_intent":
        # A froze before its last lease check: resumed, it cannot confirm the lease, never
        # sends, and its release is rejected. Exactly once whatever the target.
        return {
            t: Guarantee(1 if t != "none" else 0, t != "none", False, 0, 0, 0,
                         State.SUCCEEDED if t != "none" else State.UNKNOWN, "finish:PENDING")
            for t in SERVICE
        }[target]
    raise KeyError(pause_at)


@dataclass
class FrozenRun:
    """What one frozen-sender run produced (read after both workers stopped).

    Attributes:
        target: the kind of target (:data:`crashapp.TARGETS`).
        pause_at: where A froze.
        a_reply_lost: the reply to A's late request was dropped.
        task_id: the task.
        a_holder, b_holder: the two holders.
        held: the task while A was frozen (generation 1, A's lease).
        by_b: the task once B was done, before A resumed.
        b_effect: the effect row once B was done (None if B recorded none).
        before_resume: the service's records once B was done, before A resumed.
        resumed_at: wall-clock time A was resumed, epoch seconds.
        final: the task at the end.
        records: the service's records at the end.
        late: the ledger's late-effect records of the task.
        stale: the ``stale_rejected`` audit events of the task.
        late_events: the ``late_effect`` audit events of the task.
        effect: the effect row at the end.
        service_stats: the service's ``/stats`` at the end.
    """

    target: str
    pause_at: str
    a_reply_lost: bool
    task_id: str
    a_holder: str
    b_holder: str
    held: TaskInfo
    by_b: TaskInfo
    b_effect: EffectRecord | None
    before_resume: ServiceRecords
    resumed_at: float
    final: TaskInfo
    records: ServiceRecords
    late: list[LateEffect]
    stale: list[Any]
    late_events: list[Any]
    effect: EffectRecord | None
    service_stats: dict[str, Any]


def _only_effect(rig: Rig, task_id: str) -> EffectRecord | None:
    effects = rig.ledger.timeline(task_id).effects
    assert len(effects) <= 1, effects
    return effects[0] if effects else None


def run_frozen_sender(
    rig: Rig,
    target: str,
    start: StartWorker,
    *,
    pause_at: str = "effect.before_call",
    a_reply_lost: bool = False,
    on_frozen: Callable[[WorkerProcess], None] | None = None,
) -> FrozenRun:
    """Freeze A at ``pause_at`` inside the charge of a task of kind ``target``, let its
    lease expire, let B take over and settle the task, resume A, wait (on conditions)
    until A's late request has ended at the target and in the ledger, stop both.

    Args:
        rig: the test's rig (its ledger decides the backend).
        target: kind of target (:data:`crashapp.TARGETS`).
        start: starts a worker: ``start(name)``, ``start(name, pause_at=...)``.
        pause_at: A's fault point.
        a_reply_lost: drop the service's reply to A's late request (it executes).
        on_frozen: extra checks while A is frozen (before B starts).

    Returns:
        The run, for :func:`assert_guarantee` and backend-specific checks.
    """
    expect = guarantee(target, pause_at, a_reply_lost)
    rig.lease_s = LEASE_S
    rig.start_service(**SERVICE[target])
    task_id = rig.submit({**PARAMS, "target": target})

    a = start("A", pause_at=pause_at)
    a_holder = a.holder()
    a.wait_stopped()
    charged_by_a = pause_at == "effect.after_call"
    assert rig.executions() == ({KEY: 1} if charged_by_a else {}), "A sent before freezing"
    assert not rig.ledger_locked(), "A froze holding ledger locks"
    held = rig.get(task_id)
    assert held.state is State.RUNNING and held.holder == a_holder and held.generation == 1
    (intent,) = rig.ledger.timeline(task_id).effects
    assert intent.state is EffectState.INTENT and intent.generation == 1, intent
    if on_frozen is not None:
        on_frozen(a)
    rig.wait_lease_expired(task_id)

    b = start("B")
    b_holder = b.holder()
    by_b = rig.wait_state(task_id, (expect.final_state,))
    b_effect = _only_effect(rig, task_id)
    before_resume = rig.service.records() if rig.service is not None else None
    assert before_resume is not None
    assert rig.ledger.stats().late_effects == 0

    if a_reply_lost:
        rig.client.set_faults(reply_lost_next=1)
    resumed_at = time.time()
    a.resume()
    _wait_for_late_request(rig, task_id, expect)
    assert a.returncode is None, "the stale holder must survive its rejected request/write"
    # A graceful stop lets A write whatever it still had to; everything is read after.
    assert a.stop() == 0, a.log()
    assert b.stop() == 0, b.log()

    timeline = rig.ledger.timeline(task_id)
    assert rig.service is not None
    with rig.service.client(timeout_s=5.0) as c:
        service_stats = c.stats()
    return FrozenRun(
        target=target, pause_at=pause_at, a_reply_lost=a_reply_lost, task_id=task_id,
        a_holder=a_holder, b_holder=b_holder, held=held, by_b=by_b, b_effect=b_effect,
        before_resume=before_resume, resumed_at=resumed_at, final=rig.get(task_id),
        records=rig.service.records(), late=rig.ledger.late_effects(task_id),
        stale=[e for e in timeline.events if e.kind == "stale_rejected"],
        late_events=[e for e in timeline.events if e.kind == "late_effect"],
        effect=_only_effect(rig, task_id), service_stats=service_stats,
    )  # fmt: skip


def _wait_for_late_request(rig: Rig, task_id: str, expect: Guarantee) -> None:
    """Wait until A, resumed, has done all it will: its request ended at the target
    (executed, replayed or refused) and its ledger writes were rejected or recorded."""
    if expect.replays:
        wait_for(
            "the target to answer A's late request as a replay",
            lambda: rig.client.stats()["replays"] >= expect.replays,
        )
    if expect.token_rejections:
        wait_for(
            "the target to refuse A's stale token",
            lambda: len(rig.service.records().rejections) >= expect.token_rejections
            if rig.service is not None else False,
        )  # fmt: skip
    if expect.late_effects:
        wait_for(
            "A's late request to be recorded as a late effect",
            lambda: rig.ledger.stats().late_effects >= expect.late_effects,
        )
    if expect.stale_operation is not None:
        wait_for(
            "A's late write to be rejected by generation",
            lambda: rig.ledger.stats().stale_rejections >= 1,
        )


def assert_guarantee(rig: Rig, run: FrozenRun) -> None:
    """Assert the guarantee table's row of ``run.target`` exactly, at the target first."""
    expect = guarantee(run.target, run.pause_at, run.a_reply_lost)
    kind = f"{run.target} target, A frozen at {run.pause_at}" + (
        ", A's reply lost" if run.a_reply_lost else "")

    print(
        f"{kind} ({rig.backend}): executions {run.records.executions}, token rejections "
        f"{len(run.records.rejections)}, replays {run.service_stats['replays']}, late effects "
        f"{[(x.generation, x.outcome) for x in run.late]}, stale writes "
        f"{[e.detail['operation'] for e in run.stale]}, final {run.final.state.value}"
    )
    # ---- the target's own count (the external truth)
    expected = {KEY: expect.executions} if expect.executions else {}
    assert run.records.executions == expected, f"{kind}: executions {run.records.executions}"
    before = run.before_resume.executions.get(KEY, 0)
    assert before == (1 if expect.b_executed or run.pause_at == "effect.after_call" else 0), (
        f"{kind}: executions before A resumed: {run.before_resume.executions}"
    )
    late_times = [at for at, key in run.records.times[before:] if key == KEY]
    assert all(at >= run.resumed_at for at in late_times), (late_times, run.resumed_at)
    assert [(r.key, r.token, r.highest, r.op) for r in run.records.rejections] == (
        [(KEY, 1, 2, "execute")] * expect.token_rejections
    ), f"{kind}: token rejections {run.records.rejections}"
    assert run.service_stats["stale_tokens_rejected"] == expect.token_rejections
    assert run.service_stats["replays"] == expect.replays, run.service_stats
    assert run.service_stats["lookups"] == expect.expected_lookups(run.target), (
        run.service_stats)  # fmt: skip
    assert run.service_stats["injected"]["reply_lost"] == int(run.a_reply_lost)
    assert run.service_stats["duplicate_keys"] == (1 if expect.executions > 1 else 0)

    # ---- B took over after the lease expired, and its outcome stands
    timeline = rig.ledger.timeline(run.task_id)
    (takeover,) = [e for e in timeline.events if e.kind == "takeover"]
    assert takeover.holder == run.b_holder and takeover.generation == 2
    assert takeover.detail["previous_holder"] == run.a_holder
    assert run.held.lease_until is not None and takeover.at >= run.held.lease_until
    assert not [e for e in timeline.events if e.kind == "revoke"], "A is alive: no revoke"
    assert run.by_b.state is expect.final_state and run.by_b.generation == 2
    assert (run.final.state, run.final.generation, run.final.result) == (
        run.by_b.state, run.by_b.generation, run.by_b.result,
    ), f"{kind}: A's late request changed B's outcome"  # fmt: skip
    assert run.effect == run.b_effect, f"{kind}: the effect row changed after A resumed"
    if expect.final_state is State.SUCCEEDED:
        effect = run.effect
        assert effect is not None and effect.state is EffectState.DONE
        assert effect.generation == 2 and effect.key == KEY
        b_id = json.loads(effect.result_json or "null")["id"]
        assert b_id == run.before_resume.ids[KEY], "the ledger records B's execution"
        assert effect.via_lookup is (not expect.b_executed), effect
        assert run.final.result is not None and run.final.result["charged"] == PARAMS[
            "amount_cents"]
    else:  # UNKNOWN: B found the open intent, could not settle it, made no call
        assert run.effect is not None and run.effect.state is EffectState.INTENT
        assert run.effect.generation == 1, "B recorded no intent of its own: it never called"
        assert run.final.holder is None

    # ---- what A's late request left in the ledger: evidence, never a change
    stats = rig.ledger.stats()
    assert stats.takeovers == 1
    assert stats.late_effects == expect.late_effects == len(run.late), run.late
    # B called (or could not settle the intent): A's late request is not accounted for by
    # a lookup hit, whatever the target counted.
    assert stats.late_effects_accounted_for == 0, run.late
    assert all(late.kind == LATE_POSSIBLE_DUPLICATE for late in run.late), run.late
    assert len(run.late_events) == expect.late_effects, run.late_events
    for late in run.late:
        assert (late.task_id, late.effect, late.key) == (run.task_id, "charge", KEY), late
        assert (late.generation, late.holder, late.outcome) == (
            1, run.a_holder, expect.late_outcome,
        ), late  # fmt: skip
        assert late.at >= takeover.at, (late, takeover)
        if expect.late_outcome == "unknown":  # the error A's call raised
            assert late.detail and "RemoteProtocolError" in late.detail, late
            continue
        # The detail is A's own execution: the service's latest record for the key.
        detail = json.loads(late.detail or "null")
        assert detail["key"] == KEY and detail["replayed"] is False, detail
        assert detail["id"] == run.records.ids[KEY] != run.before_resume.ids.get(KEY), detail
    for event in run.late_events:
        assert event.holder == run.a_holder and event.generation == 1, event
    if expect.stale_operation is None:
        assert run.stale == [] and stats.stale_rejections == 0, run.stale
    else:
        assert run.stale and all(
            e.holder == run.a_holder and e.generation == 1 for e in run.stale
        ), run.stale
        assert run.stale[0].detail["operation"] == expect.stale_operation, run.stale
        assert all(e.detail["current_generation"] == 2 for e in run.stale), run.stale
        assert stats.stale_rejections == len(run.stale)
    rig.check_consistent()
