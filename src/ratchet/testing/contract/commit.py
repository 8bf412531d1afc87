"""Ledger contract: fenced commits, steps and effects, transitions, operator resolve, reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from ...errors import IllegalTransition, TaskNotFound
from ...ledger.base import (
    Claim,
    EffectState,
    EffectWrite,
    Ledger,
    NewTask,
    ResolveOutcome,
    TaskWrite,
    Transition,
)
from ...states import State

TASK = "contract.task"
OTHER = "contract.other"
MakeTask = Callable[..., NewTask]
SleepUntil = Callable[[Ledger, float], None]


def claimed(ledger: Ledger, make_task: MakeTask, holder: str = "a", **kw: Any) -> Claim:
    """Submit one task and claim it."""
    task = make_task({"n": 1}, **kw)
    ledger.submit([task])
    claims = [c for c in ledger.claim(holder, [task.name], 100) if c.task_id == task.task_id]
    assert len(claims) == 1
    return claims[0]


def finish(claim: Claim, transition: Transition, holder: str = "a", **kw: Any) -> TaskWrite:
    return TaskWrite(claim.task_id, claim.generation, holder, "finish", transition=transition, **kw)


def frozen(ledger: Ledger, task_id: str) -> tuple[Any, ...]:
    """Task row, steps and effects (not the audit log) for before/after comparisons."""
    tl = ledger.timeline(task_id)
    return (tl.task, sorted(map(repr, tl.steps)), sorted(map(repr, tl.effects)))


def stolen(ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil) -> tuple[Claim, Claim]:
    """A task claimed by "a", whose lease expired and was taken over by "b"."""
    old = claimed(ledger, make_task, "a", lease_s=0.2)
    sleep_until(ledger, old.lease_until)
    [new] = ledger.claim("b", [TASK], 1)
    assert new.task_id == old.task_id and new.takeover
    return old, new


# ---------------------------------------------------------------------- fencing


def test_commit_with_current_generation_is_ok(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    [outcome] = ledger.commit(
        [TaskWrite(claim.task_id, claim.generation, "a", "step:s", steps=[("s", '{"v":1}')])]
    )
    assert outcome.ok is True
    assert outcome.stale is False
    assert outcome.task_id == claim.task_id
    [step] = ledger.timeline(claim.task_id).steps
    assert (step.name, step.result_json, step.generation) == ("s", '{"v":1}', claim.generation)
    assert ledger.get(claim.task_id).state is State.RUNNING


def test_stale_generation_changes_nothing_and_is_audited(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    old, new = stolen(ledger, make_task, sleep_until)
    before = frozen(ledger, old.task_id)
    write = TaskWrite(
        old.task_id,
        old.generation,
        "a",
        "finish:SUCCEEDED",
        steps=[("s", "1")],
        effects=[EffectWrite("pay", "pay:1", "d", EffectState.DONE, '"ok"')],
        transition=Transition(State.SUCCEEDED, result_json='"late"'),
    )
    [outcome] = ledger.commit([write])
    assert outcome.ok is False
    assert outcome.stale is True
    assert outcome.current_generation == new.generation
    assert outcome.current_state is State.RUNNING
    assert frozen(ledger, old.task_id) == before
    rejected = [e for e in ledger.timeline(old.task_id).events if e.kind == "stale_rejected"]
    assert len(rejected) == 1
    assert rejected[0].generation == old.generation
    assert rejected[0].holder == "a"
    assert ledger.stats().stale_rejections == 1
    # The new holder still commits normally.
    [ok] = ledger.commit([finish(new, Transition(State.SUCCEEDED, result_json='"b"'), "b")])
    assert ok.ok
    assert ledger.get(old.task_id).result == "b"


@pytest.mark.parametrize("shift", [-1, 1, 100])
def test_any_non_current_generation_is_stale(
    ledger: Ledger, make_task: MakeTask, shift: int
) -> None:
    claim = claimed(ledger, make_task)
    before = frozen(ledger, claim.task_id)
    [outcome] = ledger.commit(
        [TaskWrite(claim.task_id, claim.generation + shift, "a", "step", steps=[("s", "1")])]
    )
    assert outcome.stale and not outcome.ok
    assert outcome.current_generation == claim.generation
    assert frozen(ledger, claim.task_id) == before


def test_commit_on_a_task_that_is_not_running_is_stale(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit([finish(claim, Transition(State.SUCCEEDED, result_json="1"))])
    before = frozen(ledger, claim.task_id)
    # Same generation, but the task is terminal: a late duplicate is dropped.
    [outcome] = ledger.commit([finish(claim, Transition(State.FAILED, error="late"))])
    assert outcome.stale
    assert outcome.current_state is State.SUCCEEDED
    assert frozen(ledger, claim.task_id) == before
    # A PENDING task (never claimed) cannot be written with generation 0 either.
    pending = make_task()
    ledger.submit([pending])
    [outcome] = ledger.commit([TaskWrite(pending.task_id, 0, "a", "step", steps=[("s", "1")])])
    assert outcome.stale
    assert ledger.timeline(pending.task_id).steps == []


def test_resending_an_applied_transition_is_acknowledged_and_writes_nothing(
    ledger: Ledger, make_task: MakeTask
) -> None:
    """A commit whose reply was lost (connection dropped during COMMIT) is sent again: the
    transition already applied at that generation is acknowledged, not counted as stale,
    and nothing is written twice."""
    claim = claimed(ledger, make_task)
    write = finish(claim, Transition(State.SUCCEEDED, result_json='{"r":1}'))
    [first] = ledger.commit([write])
    before = frozen(ledger, claim.task_id)
    events = len(ledger.timeline(claim.task_id).events)
    [again] = ledger.commit([write])
    assert (first.ok, again.ok, again.stale) == (True, True, False)
    assert frozen(ledger, claim.task_id) == before
    assert len(ledger.timeline(claim.task_id).events) == events
    assert ledger.stats().stale_rejections == 0


def test_two_writes_of_one_task_in_one_batch_apply_in_order(
    ledger: Ledger, make_task: MakeTask
) -> None:
    """A batch is applied as if its writes committed one after the other: a second write
    of the same task sees the first (here: a step, then the completion, then a late
    duplicate completion with another result, which is stale)."""
    claim = claimed(ledger, make_task)
    outcomes = ledger.commit([
        TaskWrite(claim.task_id, claim.generation, "a", "step", steps=[("s", "1")]),
        finish(claim, Transition(State.SUCCEEDED, result_json='{"r":1}')),
        finish(claim, Transition(State.FAILED, error="late")),
    ])
    assert [(o.ok, o.stale) for o in outcomes] == [(True, False), (True, False), (False, True)]
    info = ledger.get(claim.task_id)
    assert info.state is State.SUCCEEDED and info.result == {"r": 1}
    assert [s.name for s in ledger.timeline(claim.task_id).steps] == ["s"]


def test_commit_on_an_unknown_task_is_stale(ledger: Ledger) -> None:
    [outcome] = ledger.commit([TaskWrite("no-such-task", 1, "a", "step", steps=[("s", "1")])])
    assert outcome.stale
    assert outcome.current_generation is None
    assert outcome.current_state is None


def test_group_commit_isolates_a_stale_write(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    old, _new = stolen(ledger, make_task, sleep_until)
    fresh = claimed(ledger, make_task, "a")
    stale_before = frozen(ledger, old.task_id)
    outcomes = ledger.commit(
        [
            TaskWrite(old.task_id, old.generation, "a", "step", steps=[("s", "1")]),
            TaskWrite(
                fresh.task_id,
                fresh.generation,
                "a",
                "finish",
                steps=[("s", "2")],
                transition=Transition(State.SUCCEEDED, result_json='"fresh"'),
            ),
        ]
    )
    assert [(o.task_id, o.ok, o.stale) for o in outcomes] == [
        (old.task_id, False, True),
        (fresh.task_id, True, False),
    ]
    assert frozen(ledger, old.task_id) == stale_before
    info = ledger.get(fresh.task_id)
    assert info.state is State.SUCCEEDED
    assert info.result == "fresh"
    assert [s.result_json for s in ledger.timeline(fresh.task_id).steps] == ["2"]
    assert ledger.stats().stale_rejections == 1


def test_group_commit_of_many_tasks(ledger: Ledger, make_task: MakeTask) -> None:
    tasks = [make_task({"i": i}) for i in range(25)]
    ledger.submit(tasks)
    claims = ledger.claim("a", [TASK], 25)
    outcomes = ledger.commit(
        [finish(c, Transition(State.SUCCEEDED, result_json=json.dumps(c.task_id))) for c in claims]
    )
    assert all(o.ok for o in outcomes)
    for info in ledger.get_many([t.task_id for t in tasks]):
        assert info.state is State.SUCCEEDED
        assert info.result == info.task_id


# ---------------------------------------------------------------------- steps and effects


def test_steps_and_effects_come_back_on_the_next_claim(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "step:quote",
                steps=[("quote", '{"cents":1200}')],
            )
        ]
    )
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "intent:charge",
                effects=[EffectWrite("charge", "charge:o-1", "d1", EffectState.INTENT)],
            )
        ]
    )
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "intent:mail",
                effects=[EffectWrite("mail", "mail:o-1", "d2", EffectState.INTENT)],
            )
        ]
    )
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "done:mail",
                effects=[EffectWrite("mail", "mail:o-1", "d2", EffectState.DONE, '{"id":"m-9"}')],
            )
        ]
    )
    ledger.commit([finish(claim, Transition(State.RETRY_WAIT, delay_s=0.0, error="blip"))])
    [again] = ledger.claim("b", [TASK], 1)
    assert again.task_id == claim.task_id
    assert again.attempt == 2
    assert again.generation == claim.generation + 1
    assert set(again.steps) == {"quote"}
    assert again.steps["quote"].result_json == '{"cents":1200}'
    assert again.steps["quote"].generation == claim.generation
    assert set(again.effects) == {"charge", "mail"}
    charge = again.effects["charge"]
    assert charge.state is EffectState.INTENT
    assert charge.key == "charge:o-1"
    assert charge.params_digest == "d1"
    assert charge.result_json is None
    assert charge.generation == claim.generation
    assert charge.attempt == 1
    assert charge.calls == 1
    mail = again.effects["mail"]
    assert mail.state is EffectState.DONE
    assert mail.result_json == '{"id":"m-9"}'
    assert mail.via_lookup is False


def test_effect_intent_recorded_again_counts_calls(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task, max_attempts=5)
    intent = EffectWrite("charge", "charge:o-1", "d", EffectState.INTENT)
    ledger.commit([TaskWrite(claim.task_id, claim.generation, "a", "i", effects=[intent])])
    ledger.commit([finish(claim, Transition(State.RETRY_WAIT))])
    [again] = ledger.claim("a", [TASK], 1)
    ledger.commit([TaskWrite(again.task_id, again.generation, "a", "i", effects=[intent])])
    [effect] = ledger.timeline(claim.task_id).effects
    assert effect.calls == 2
    assert effect.attempt == 2
    assert effect.generation == again.generation
    assert effect.state is EffectState.INTENT


def test_effect_result_from_lookup_is_marked_and_counted(
    ledger: Ledger, make_task: MakeTask
) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "i",
                effects=[EffectWrite("charge", "k", "d", EffectState.INTENT)],
            )
        ]
    )
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "lookup",
                effects=[
                    EffectWrite("charge", "k", "d", EffectState.DONE, '"found"', via_lookup=True)
                ],
            )
        ]
    )
    [effect] = ledger.timeline(claim.task_id).effects
    assert effect.state is EffectState.DONE
    assert effect.via_lookup is True
    assert effect.result_json == '"found"'
    assert ledger.stats().lookup_hits == 1


def test_first_claim_has_no_steps_or_effects(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    assert claim.attempt == 1
    assert claim.steps == {} and claim.effects == {}


# ---------------------------------------------------------------------- transitions


def test_succeeded_stores_result_and_releases_lease(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit([finish(claim, Transition(State.SUCCEEDED, result_json='{"total":3}'))])
    info = ledger.get(claim.task_id)
    assert info.state is State.SUCCEEDED
    assert info.terminal
    assert info.result == {"total": 3}
    assert info.holder is None
    assert info.lease_until is None
    assert info.generation == claim.generation
    assert ledger.claim("b", [TASK], 1) == []


def test_retry_wait_sets_run_at_from_ledger_clock(
    ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil
) -> None:
    claim = claimed(ledger, make_task)
    before = ledger.now()
    ledger.commit(
        [
            finish(
                claim,
                Transition(State.RETRY_WAIT, delay_s=0.3, error="boom", error_class="transient"),
            )
        ]
    )
    after = ledger.now()
    info = ledger.get(claim.task_id)
    assert info.state is State.RETRY_WAIT
    assert before + 0.3 <= info.run_at <= after + 0.3
    assert info.last_error == "boom"
    assert info.error_class == "transient"
    assert info.holder is None
    assert ledger.claim("b", [TASK], 1) == []
    sleep_until(ledger, info.run_at)
    [again] = ledger.claim("b", [TASK], 1)
    assert again.attempt == 2


def test_failed_stores_error(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit(
        [finish(claim, Transition(State.FAILED, error="card declined", error_class="permanent"))]
    )
    info = ledger.get(claim.task_id)
    assert info.state is State.FAILED
    assert info.last_error == "card declined"
    assert info.error_class == "permanent"
    assert info.result is None
    assert ledger.claim("b", [TASK], 1) == []


def test_release_to_pending_is_claimable_at_once(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit([finish(claim, Transition(State.PENDING, reason="shutdown"))])
    info = ledger.get(claim.task_id)
    assert info.state is State.PENDING
    assert info.holder is None
    [again] = ledger.claim("b", [TASK], 1)
    assert again.generation == claim.generation + 1
    assert again.takeover is False


def test_transition_is_audited(ledger: Ledger, make_task: MakeTask) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit([finish(claim, Transition(State.FAILED, error="x", reason="permanent"))])
    [event] = [e for e in ledger.timeline(claim.task_id).events if e.kind == "transition"]
    assert event.from_state == State.RUNNING
    assert event.to_state == State.FAILED
    assert event.generation == claim.generation
    assert event.holder == "a"


# ---------------------------------------------------------------------- operator resolve


def unknown_task(ledger: Ledger, make_task: MakeTask) -> Claim:
    claim = claimed(ledger, make_task)
    ledger.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "a",
                "intent",
                effects=[EffectWrite("charge", "charge:o-1", "d", EffectState.INTENT)],
            )
        ]
    )
    ledger.commit(
        [
            finish(
                claim, Transition(State.UNKNOWN, error="reply lost", error_class="unknown_outcome")
            )
        ]
    )
    assert ledger.get(claim.task_id).state is State.UNKNOWN
    return claim


def test_unknown_is_not_claimable(ledger: Ledger, make_task: MakeTask) -> None:
    unknown_task(ledger, make_task)
    assert ledger.claim("b", [TASK], 1) == []
    stats = ledger.stats()
    assert stats.unknown_count == 1


def test_resolve_done_marks_effect_and_makes_task_ready(
    ledger: Ledger, make_task: MakeTask
) -> None:
    claim = unknown_task(ledger, make_task)
    info = ledger.resolve(
        claim.task_id,
        ResolveOutcome.DONE,
        "bank says paid",
        "alice",
        result_json='{"charge":"ch_1"}',
    )
    assert info.state is State.PENDING
    assert ledger.get(claim.task_id).state is State.PENDING
    [effect] = ledger.timeline(claim.task_id).effects
    assert effect.state is EffectState.DONE
    assert effect.result_json == '{"charge":"ch_1"}'
    assert effect.key == "charge:o-1"
    [event] = [e for e in ledger.timeline(claim.task_id).events if e.kind == "operator_resolve"]
    assert event.from_state == State.UNKNOWN
    assert event.to_state == State.PENDING
    assert event.detail["operator"] == "alice"
    assert event.detail["reason"] == "bank says paid"
    assert event.detail["outcome"] == ResolveOutcome.DONE.value
    stats = ledger.stats()
    assert stats.operator_actions == 1
    assert stats.unknown_count == 0
    [again] = ledger.claim("b", [TASK], 1)
    assert again.effects["charge"].state is EffectState.DONE
    assert again.effects["charge"].result_json == '{"charge":"ch_1"}'


def test_resolve_not_done_marks_effect_not_done(ledger: Ledger, make_task: MakeTask) -> None:
    claim = unknown_task(ledger, make_task)
    info = ledger.resolve(claim.task_id, ResolveOutcome.NOT_DONE, "no such charge", "bob")
    assert info.state is State.PENDING
    [effect] = ledger.timeline(claim.task_id).effects
    assert effect.state is EffectState.NOT_DONE
    assert effect.result_json is None
    [again] = ledger.claim("b", [TASK], 1)
    assert again.effects["charge"].state is EffectState.NOT_DONE
    assert again.effects["charge"].key == "charge:o-1"


@pytest.mark.parametrize("state", [State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED])
def test_resolve_refuses_a_task_that_is_not_unknown(
    ledger: Ledger, make_task: MakeTask, state: State
) -> None:
    task = make_task()
    ledger.submit([task])
    if state is not State.PENDING:
        [claim] = ledger.claim("a", [TASK], 1)
        if state is not State.RUNNING:
            ledger.commit([finish(claim, Transition(state, result_json="1", error="e"))])
    assert ledger.get(task.task_id).state is state
    before = frozen(ledger, task.task_id)
    with pytest.raises(IllegalTransition):
        ledger.resolve(task.task_id, ResolveOutcome.DONE, "why", "alice")
    assert frozen(ledger, task.task_id) == before
    assert ledger.stats().operator_actions == 0


def test_resolve_unknown_id(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.resolve("no-such-task", ResolveOutcome.NOT_DONE, "why", "alice")


# ---------------------------------------------------------------------- reads


def test_get_and_timeline_of_unknown_id(ledger: Ledger) -> None:
    with pytest.raises(TaskNotFound):
        ledger.get("no-such-task")
    with pytest.raises(TaskNotFound):
        ledger.timeline("no-such-task")


def test_get_many_skips_missing(ledger: Ledger, make_task: MakeTask) -> None:
    tasks = [make_task({"i": i}) for i in range(3)]
    ledger.submit(tasks)
    found = ledger.get_many([tasks[0].task_id, "missing", tasks[2].task_id])
    assert {i.task_id for i in found} == {tasks[0].task_id, tasks[2].task_id}
    assert ledger.get_many([]) == []


def test_timeline_is_in_order(ledger: Ledger, make_task: MakeTask, sleep_until: SleepUntil) -> None:
    claim = claimed(ledger, make_task)
    ledger.commit([TaskWrite(claim.task_id, claim.generation, "a", "step", steps=[("s1", "1")])])
    ledger.commit([finish(claim, Transition(State.RETRY_WAIT, delay_s=0.0, error="e"))])
    [second] = ledger.claim("b", [TASK], 1)
    ledger.commit([TaskWrite(second.task_id, second.generation, "b", "step", steps=[("s2", "2")])])
    ledger.commit([TaskWrite(second.task_id, claim.generation, "a", "late", steps=[("x", "0")])])
    ledger.commit([finish(second, Transition(State.SUCCEEDED, result_json="3"), "b")])
    tl = ledger.timeline(claim.task_id)
    assert tl.task.state is State.SUCCEEDED
    kinds = [(e.kind, e.to_state, e.generation) for e in tl.events]
    assert kinds == [
        ("claim", State.RUNNING, 1),
        ("transition", State.RETRY_WAIT, 1),
        ("claim", State.RUNNING, 2),
        ("stale_rejected", None, 1),
        ("transition", State.SUCCEEDED, 2),
    ]
    seqs = [e.seq for e in tl.events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    ats = [e.at for e in tl.events]
    assert ats == sorted(ats)
    assert all(e.task_id == claim.task_id for e in tl.events)
    assert [s.name for s in tl.steps] == ["s1", "s2"]


def test_stats_counts_per_name_and_state(ledger: Ledger, make_task: MakeTask) -> None:
    ledger.submit([make_task({"i": i}, name=TASK) for i in range(4)])
    ledger.submit([make_task({"i": i}, name=OTHER) for i in range(2)])
    ledger.submit([make_task({"later": True}, name=OTHER, delay_s=3600.0)])
    claims = ledger.claim("a", [TASK], 3)
    ledger.commit([finish(claims[0], Transition(State.SUCCEEDED, result_json="1"))])
    ledger.commit([finish(claims[1], Transition(State.FAILED, error="e"))])
    stats = ledger.stats()
    assert stats.counts == {
        TASK: {"PENDING": 1, "RUNNING": 1, "SUCCEEDED": 1, "FAILED": 1},
        OTHER: {"PENDING": 3},
    }
    assert stats.claims == 3
    assert stats.unknown_count == 0
    assert stats.schema_version == ledger.schema_version()
    assert abs(stats.ledger_now - ledger.now()) < 5.0


def test_stats_oldest_pending_age(ledger: Ledger, make_task: MakeTask) -> None:
    assert ledger.stats().oldest_pending_age_s is None
    ledger.submit([make_task({"later": True}, delay_s=3600.0)])
    assert ledger.stats().oldest_pending_age_s is None  # scheduled work is not backlog
    t0 = ledger.now()
    ledger.submit([make_task({"now": True})])
    time.sleep(0.25)
    ledger.submit([make_task({"newer": True})])
    stats = ledger.stats()
    assert stats.oldest_pending_age_s is not None
    assert 0.25 <= stats.oldest_pending_age_s <= stats.ledger_now - t0 + 0.01
    ledger.claim("a", [TASK], 2)
    assert ledger.stats().oldest_pending_age_s is None


# ---------------------------------------------------------------------- schema and clock


def test_schema_version_and_idempotent_migrate(
    open_store: Callable[[], Ledger], make_task: MakeTask
) -> None:
    ledger = open_store()
    version = ledger.schema_version()
    assert version >= 1
    assert ledger.migrate() == version
    assert ledger.migrate() == version
    task = make_task({"keep": 1})
    ledger.submit([task])
    reopened = open_store()
    assert reopened.schema_version() == version
    assert reopened.migrate() == version
    assert reopened.get(task.task_id).params == {"keep": 1}


def test_ledger_clock_is_wall_clock_epoch_seconds(ledger: Ledger) -> None:
    a = ledger.now()
    b = ledger.now()
    assert abs(a - time.time()) < 5.0
    assert b >= a


def test_commit_and_claim_is_one_fenced_transaction(ledger: Ledger, make_task: Any) -> None:
    """Finishing tasks and claiming their successors in one call: each write still fenced
    on its own generation (a stale one is rejected and audited), and the claim sees the
    ledger as the writes left it."""
    ids = [r.task_id for r in ledger.submit([make_task({"i": i}) for i in range(3)])]
    first, second = ledger.claim("w", [TASK], 2)
    done = TaskWrite(first.task_id, first.generation, "w", "finish",
                     transition=Transition(State.SUCCEEDED, result_json="1"))
    stale = TaskWrite(second.task_id, second.generation - 1, "w", "finish",
                      transition=Transition(State.SUCCEEDED, result_json="2"))
    outcomes, claims = ledger.commit_and_claim([done, stale], "w", [TASK], 5)
    assert [o.ok for o in outcomes] == [True, False] and outcomes[1].stale
    assert [c.task_id for c in claims] == [t for t in ids if t not in (first.task_id,
                                                                        second.task_id)]
    assert ledger.get(first.task_id).state is State.SUCCEEDED
    assert ledger.get(second.task_id).state is State.RUNNING  # the stale write changed nothing
    assert ledger.stats().stale_rejections == 1
