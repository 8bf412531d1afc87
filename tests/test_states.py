"""The transition table (``ratchet/states.py``, DESIGN §3) as a real ledger enforces it, on
both ledgers: a move the table refuses is refused with ``IllegalTransition`` and writes
nothing; a terminal task never moves again by any worker write, claim, renewal,
revocation or operator command, except ``FAILED`` by an operator's retry (the separate
table of operator moves, ``OPERATOR_MOVES``); ``UNKNOWN`` is left only by an operator.

(The random walk over every operation is ``tests/test_state_machine.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ratchet import open_ledger
from ratchet.errors import IllegalTransition, LedgerError, RatchetError
from ratchet.ledger.base import (
    EffectState,
    EffectWrite,
    Ledger,
    NewTask,
    ResolveOutcome,
    TaskWrite,
    Transition,
)
from ratchet.serde import digest, dumps
from ratchet.states import (
    OPERATOR_MOVES,
    TERMINAL,
    TRANSITIONS,
    State,
    check_operator_move,
    is_allowed,
)

TASK = "states.task"


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """An open, empty ledger of each backend."""
    opened = open_ledger(ledger_url)
    try:
        yield opened
    finally:
        opened.close()


def _submit(ledger: Ledger, task_id: str, *, key: str | None = None,
            max_attempts: int = 3) -> None:
    params = dumps({"id": task_id})
    [result] = ledger.submit(
        [NewTask(task_id, TASK, 1, params, digest(TASK, params), key, max_attempts, 3600.0)]
    )
    assert result.created


def _running(ledger: Ledger, task_id: str, holder: str = "w1", **kw: Any) -> int:
    """Submit ``task_id`` and claim it for ``holder``; return the claim's generation."""
    _submit(ledger, task_id, **kw)
    [claim] = ledger.claim(holder, [TASK], 1)
    assert claim.task_id == task_id
    return claim.generation


def _transition(target: State) -> Transition:
    return Transition(
        target,
        result_json=dumps("r") if target is State.SUCCEEDED else None,
        error="e" if target in (State.FAILED, State.RETRY_WAIT, State.UNKNOWN) else None,
    )


def _frozen(ledger: Ledger, task_id: str) -> tuple[Any, ...]:
    """The task row, its steps and its effects (not the audit log, which records refusals)."""
    tl = ledger.timeline(task_id)
    return (tl.task, tl.steps, tl.effects)


@pytest.mark.parametrize("target", list(State))
def test_a_move_out_of_running_is_applied_or_refused_as_the_table_says(
    ledger: Ledger, target: State
) -> None:
    """The holder's commit carries a step and a transition: an allowed one is applied with
    its step; a refused one raises ``IllegalTransition`` (a ``LedgerError``) naming both
    states, and nothing of the commit is written."""
    generation = _running(ledger, "t1")
    if target is State.PAUSED:
        # A holder stops PAUSED for a pause that covers its task; without one (resumed
        # before the boundary) the ledger applies the write as a release (DESIGN §3).
        ledger.pause("task", "t1", "test", "op")
    before = _frozen(ledger, "t1")
    write = TaskWrite("t1", generation, "w1", "finish", steps=[("s", dumps(1))],
                      transition=_transition(target))
    if is_allowed(State.RUNNING, target):
        [outcome] = ledger.commit([write])
        assert outcome.ok and not outcome.stale
        info = ledger.get("t1")
        assert info.state is target
        assert info.generation == generation
        assert [s.name for s in ledger.timeline("t1").steps] == ["s"]
        return
    with pytest.raises(IllegalTransition) as refused:
        ledger.commit([write])
    assert isinstance(refused.value, LedgerError) and isinstance(refused.value, RatchetError)
    assert str(State.RUNNING) in str(refused.value) and str(target) in str(refused.value)
    assert _frozen(ledger, "t1") == before


def test_an_illegal_move_refuses_the_whole_group_commit(ledger: Ledger) -> None:
    """Group commit is all-or-nothing for a refused transition: the other task's valid
    write in the same batch is not applied either."""
    illegal = [s for s in State if not is_allowed(State.RUNNING, s)]
    if not illegal:
        pytest.skip("the transition table allows every move out of RUNNING")
    g1 = _running(ledger, "t1")
    g2 = _running(ledger, "t2")
    before = (_frozen(ledger, "t1"), _frozen(ledger, "t2"))
    with pytest.raises(IllegalTransition):
        ledger.commit([
            TaskWrite("t1", g1, "w1", "finish", steps=[("s", dumps(1))],
                      transition=_transition(State.SUCCEEDED)),
            TaskWrite("t2", g2, "w1", "finish", transition=_transition(illegal[0])),
        ])
    assert (_frozen(ledger, "t1"), _frozen(ledger, "t2")) == before


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_a_terminal_task_never_moves(ledger: Ledger, terminal: State) -> None:
    """After SUCCEEDED, FAILED or CANCELLED nothing changes the task: not its holder's
    writes at any generation, not a claim, a renewal, a revocation, an operator's resolve
    or a resubmit with its idempotency key."""
    generation = _running(ledger, "t1", key="k1")
    [done] = ledger.commit(
        [TaskWrite("t1", generation, "w1", "finish", transition=_transition(terminal))]
    )
    assert done.ok
    frozen = _frozen(ledger, "t1")
    assert frozen[0].state is terminal and frozen[0].holder is None

    stale_before = ledger.stats().stale_rejections
    attempts = [
        TaskWrite("t1", g, "w1", "late", steps=steps, effects=effects, transition=transition)
        for g in (generation - 1, generation, generation + 1)
        for steps, effects, transition in (
            ([("s", dumps(1))], (), None),
            ((), [EffectWrite("e", "key-e", "d", EffectState.INTENT)], None),
            ((), (), _transition(State.RETRY_WAIT)),
            ((), (), _transition(State.CANCELLED if terminal is not State.CANCELLED
                                 else State.SUCCEEDED)),
        )
    ]
    for write in attempts:
        [outcome] = ledger.commit([write])
        assert outcome.stale and not outcome.ok, write
        assert outcome.current_state is terminal
    assert ledger.stats().stale_rejections == stale_before + len(attempts)
    # The holder re-sending the very commit that finished the task (its reply was lost) is
    # acknowledged and writes nothing.
    [resent] = ledger.commit(
        [TaskWrite("t1", generation, "w1", "finish", transition=_transition(terminal))]
    )
    assert resent.ok and not resent.stale

    assert ledger.claim("w2", [TASK], 5) == []
    [renewed] = ledger.renew("w1", [("t1", generation)])
    assert renewed.ok is False and renewed.lease_until is None
    assert ledger.revoke_holder("w1", by="judge", reason="test") == []
    for outcome_ in ResolveOutcome:
        with pytest.raises(IllegalTransition):
            ledger.resolve("t1", outcome_, "test", "op")
    assert ledger.cancel("t1", "test", "op").outcome == "unchanged"
    if terminal is not State.FAILED:  # FAILED: the operator's retry, tested below
        assert ledger.retry("t1", "test", "op").outcome == "unchanged"
    params = dumps({"id": "t1"})
    [again] = ledger.submit(
        [NewTask("t1-again", TASK, 1, params, digest(TASK, params), "k1", 3, 3600.0)]
    )
    assert (again.task_id, again.created) == ("t1", False)
    assert _frozen(ledger, "t1") == frozen


@pytest.mark.parametrize(
    "state", [State.PENDING, State.RUNNING, State.RETRY_WAIT, State.SUCCEEDED]
)
def test_resolve_refuses_a_task_that_is_not_unknown(ledger: Ledger, state: State) -> None:
    """Only an ``UNKNOWN`` task can be resolved; anything else is an ``IllegalTransition``
    that leaves the task as it was."""
    if state is State.PENDING:
        _submit(ledger, "t1")
    else:
        generation = _running(ledger, "t1")
        if state is not State.RUNNING:
            [ok] = ledger.commit(
                [TaskWrite("t1", generation, "w1", "finish", transition=_transition(state))]
            )
            assert ok.ok
    before = _frozen(ledger, "t1")
    assert before[0].state is state
    with pytest.raises(IllegalTransition) as refused:
        ledger.resolve("t1", ResolveOutcome.DONE, "test", "op", dumps("x"))
    assert str(state) in str(refused.value)
    assert _frozen(ledger, "t1") == before


def test_unknown_is_left_only_by_an_operator(ledger: Ledger) -> None:
    """A task whose effect outcome is unknown is claimed by nobody and its holder is fenced;
    an operator's resolve makes it ready again (same generation) with the effect settled,
    and the next claim sees the effect's recorded result."""
    generation = _running(ledger, "t1")
    intent = EffectWrite("charge", "key-charge", "d", EffectState.INTENT)
    [lost] = ledger.commit([TaskWrite("t1", generation, "w1", "unknown", effects=[intent],
                                      transition=Transition(State.UNKNOWN, error="lost"))])
    assert lost.ok
    assert ledger.get("t1").state is State.UNKNOWN
    assert ledger.claim("w2", [TASK], 5) == []
    [late] = ledger.commit([TaskWrite("t1", generation, "w1", "late", steps=[("s", "1")])])
    assert late.stale
    assert ledger.revoke_holder("w1", by="judge", reason="test") == []

    info = ledger.resolve("t1", ResolveOutcome.DONE, "seen at the provider", "op", dumps("ok"))
    assert info.state is State.PENDING
    assert info.generation == generation
    [claim] = ledger.claim("w2", [TASK], 5)
    assert claim.task_id == "t1" and claim.generation == generation + 1
    assert claim.effects["charge"].state is EffectState.DONE
    assert claim.effects["charge"].result_json == dumps("ok")


def test_operator_moves_are_a_table_of_their_own() -> None:
    """Operator commands have their own table: SUCCEEDED, CANCELLED and COMPENSATED have
    no edge in either; FAILED has two, to PENDING (retry) and COMPENSATING (compensate), in
    the operator's table only; a RUNNING task is never moved by an operator directly (a
    request is recorded for its holder)."""
    for state in (State.SUCCEEDED, State.CANCELLED, State.COMPENSATED):
        assert TRANSITIONS[state] == OPERATOR_MOVES[state] == frozenset()
    assert TRANSITIONS[State.FAILED] == frozenset()
    assert OPERATOR_MOVES[State.FAILED] == frozenset({State.PENDING, State.COMPENSATING})
    assert OPERATOR_MOVES[State.RUNNING] == frozenset()
    assert set(OPERATOR_MOVES) == set(State)
    with pytest.raises(IllegalTransition):
        check_operator_move(State.SUCCEEDED, State.PENDING)
    check_operator_move(State.FAILED, State.PENDING)


def test_failed_moves_only_by_an_operator_retry(ledger: Ledger) -> None:
    """A FAILED task ignores its holder's writes at every generation, claims, renewals and
    revocations; only ``retry`` moves it (to PENDING, attempts reset, generation + 1,
    steps kept), and the retried task is claimed again."""
    generation = _running(ledger, "t1", max_attempts=1)
    [done] = ledger.commit([TaskWrite("t1", generation, "w1", "finish",
                                      steps=[("s", dumps(1))],
                                      transition=_transition(State.FAILED))])
    assert done.ok
    for g in (generation - 1, generation, generation + 1):
        [late] = ledger.commit([TaskWrite("t1", g, "w1", "late",
                                          transition=_transition(State.RETRY_WAIT))])
        assert late.stale
    assert ledger.claim("w2", [TASK], 5) == []
    assert ledger.cancel("t1", "test", "op").outcome == "unchanged"
    assert ledger.get("t1").state is State.FAILED
    out = ledger.retry("t1", "the downstream is fixed", "op")
    assert (out.outcome, out.state, out.generation) == ("done", State.PENDING, generation + 1)
    info = ledger.get("t1")
    assert (info.state, info.attempt, info.generation) == (State.PENDING, 0, generation + 1)
    [claim] = ledger.claim("w2", [TASK], 5)
    assert (claim.attempt, claim.generation) == (1, generation + 2)
    assert "s" in claim.steps
    # The stale holder of the failed attempt still changes nothing.
    [stale] = ledger.commit([TaskWrite("t1", generation, "w1", "late",
                                       transition=_transition(State.SUCCEEDED))])
    assert stale.stale and ledger.get("t1").state is State.RUNNING


def test_a_pause_write_without_an_active_pause_is_a_release(ledger: Ledger) -> None:
    """A holder that stops PAUSED after the pause was resumed is released instead (its
    attempt handed back), so no task stays PAUSED with no pause to resume it."""
    generation = _running(ledger, "t1")
    [ok] = ledger.commit([TaskWrite("t1", generation, "w1", "boundary",
                                    transition=Transition(State.PAUSED))])
    assert ok.ok
    info = ledger.get("t1")
    assert (info.state, info.attempt, info.holder) == (State.PENDING, 0, None)
