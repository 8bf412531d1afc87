"""The state machine (DESIGN §3): the transition table, and a stateful property test that
drives a real SQLite ledger with random claims, fenced writes, takeovers and operator
resolutions and checks that everything that decides correctness only moves forward.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import tempfile
import time
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ratchet import open_ledger
from ratchet.errors import IdempotencyConflict, IllegalTransition, LedgerError
from ratchet.ledger.base import (
    EffectState,
    EffectWrite,
    NewTask,
    ResolveOutcome,
    TaskInfo,
    TaskWrite,
    Transition,
)
from ratchet.serde import digest, dumps
from ratchet.states import CLAIMABLE, TERMINAL, TRANSITIONS, State, check_transition, is_allowed

ALL_STATES = list(State)
NON_TERMINAL = [s for s in State if s not in TERMINAL]


# ---------------------------------------------------------------------- the table


def test_table_covers_every_state_and_only_states() -> None:
    assert set(TRANSITIONS) == set(State)
    for targets in TRANSITIONS.values():
        assert all(isinstance(t, State) for t in targets)


def test_terminal_states_are_exactly_succeeded_failed_cancelled() -> None:
    assert {State.SUCCEEDED, State.FAILED, State.CANCELLED} == TERMINAL


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_have_no_outgoing_edges(state: State) -> None:
    assert TRANSITIONS[state] == frozenset()
    for target in State:
        assert not is_allowed(state, target)
        with pytest.raises(IllegalTransition):
            check_transition(state, target)


@pytest.mark.parametrize(("current", "target"), list(itertools.product(State, State)))
def test_check_transition_raises_exactly_for_pairs_not_in_table(
    current: State, target: State
) -> None:
    if target in TRANSITIONS[current]:
        check_transition(current, target)  # must not raise
        assert is_allowed(current, target)
    else:
        assert not is_allowed(current, target)
        with pytest.raises(IllegalTransition) as info:
            check_transition(current, target)
        # The message names both ends so an operator can see what was refused.
        assert str(current) in str(info.value)
        assert str(target) in str(info.value)
        assert isinstance(info.value, LedgerError)


def test_claimable_states_are_non_terminal_and_can_start_running() -> None:
    assert {State.PENDING, State.RETRY_WAIT} == CLAIMABLE
    for state in CLAIMABLE:
        assert state not in TERMINAL
        assert is_allowed(state, State.RUNNING)


def test_only_a_running_task_can_succeed_or_become_unknown() -> None:
    # A result or an unknown effect outcome can only come from the holder of a lease.
    for state in State:
        if state is State.RUNNING:
            continue
        assert not is_allowed(state, State.SUCCEEDED)
        assert not is_allowed(state, State.UNKNOWN)
        assert not is_allowed(state, State.RETRY_WAIT)


def test_every_non_terminal_state_reaches_a_terminal_state() -> None:
    # No trap states: from anywhere that is not finished, a finish is reachable.
    for start in NON_TERMINAL:
        seen = {start}
        frontier = [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL, f"{start} cannot reach a terminal state"
        assert State.CANCELLED in seen


def test_unknown_is_left_only_by_an_operator_decision() -> None:
    # UNKNOWN waits for a person: it never goes back to RUNNING or RETRY_WAIT by itself.
    assert not is_allowed(State.UNKNOWN, State.RUNNING)
    assert not is_allowed(State.UNKNOWN, State.RETRY_WAIT)
    assert is_allowed(State.UNKNOWN, State.PENDING)


@pytest.mark.parametrize("state", ALL_STATES)
def test_taskinfo_terminal_matches_table(state: State) -> None:
    info = TaskInfo(
        "t", "n", 1, state, 0, 0, 1, None, None, 0.0, 0.0, 0.0, None, {}, "d", None, None, None
    )
    assert info.terminal is (state in TERMINAL)


# ---------------------------------------------------------------------- stateful test

TASK = "sm.task"
HOLDERS = ("w1", "w2", "w3")
KEYS = (None, "key-a", "key-b")
# "unknown_effect": an intent and the move to UNKNOWN in one commit (a lost reply).
WRITE_KINDS: list[Any] = ["step", "intent", "effect_done", "unknown_effect", *ALL_STATES]


@dataclasses.dataclass(frozen=True)
class Token:
    """A fencing token handed out by a claim (kept forever so it can be replayed stale)."""

    task_id: str
    generation: int
    holder: str


def _freeze(ledger: Any, task_id: str) -> tuple[Any, ...]:
    """Everything the ledger holds about a task except its audit log."""
    tl = ledger.timeline(task_id)
    steps = tuple(sorted((s.name, s.result_json, s.generation) for s in tl.steps))
    effects = tuple(
        sorted(
            (e.name, e.key, e.params_digest, e.state, e.result_json, e.generation, e.calls)
            for e in tl.effects
        )
    )
    return (tl.task, steps, effects)


class LedgerMachine(RuleBasedStateMachine):
    """Random command sequences against a real SQLite ledger file."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="ratchet-states-")
        # buffered: no fsync per commit, the test is about logic, not durability.
        self.ledger = open_ledger(f"sqlite:///{self.dir}/l.db?durability=buffered")
        self.task_ids: list[str] = []
        self.keys: dict[str, tuple[str, str]] = {}  # idempotency key -> (task id, digest)
        self.tokens: list[Token] = []
        self.prev: dict[str, tuple[Any, ...]] = {}
        self.counter = 0
        self.submits = 0

    def teardown(self) -> None:
        self.ledger.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers

    def snapshot(self) -> dict[str, tuple[Any, ...]]:
        return {tid: _freeze(self.ledger, tid) for tid in self.task_ids}

    def assert_others_unchanged(
        self, before: dict[str, tuple[Any, ...]], after: dict[str, tuple[Any, ...]], *skip: str
    ) -> None:
        for tid, snap in before.items():
            if tid not in skip:
                assert after[tid] == snap, f"task {tid} changed although not addressed"

    @invariant()
    def clock_moves_between_steps(self) -> None:
        """Let the ledger clock (millisecond resolution) advance between steps, so that no
        two steps share an instant: 0 s leases are expired at the next step, and run_at /
        lease_until never tie, so claims pick tasks in one order on every replay (a tie
        would make the run, and hypothesis's replay of it, depend on timing)."""
        mark = self.ledger.now()
        while self.ledger.now() <= mark + 0.0015:
            time.sleep(0.0005)

    # ------------------------------------------------------------------ rules

    @initialize(leases=st.lists(st.booleans(), min_size=2, max_size=4))
    def seed_tasks(self, leases: list[bool]) -> None:
        """Start with a few tasks (some with a 0 s lease, so takeovers happen)."""
        for i, short in enumerate(leases):
            self.submit(short_lease=short, key=None, param=i, max_attempts=3)

    @precondition(lambda self: len(self.task_ids) < 6)
    @rule(
        short_lease=st.booleans(),
        key=st.sampled_from(KEYS),
        param=st.integers(0, 1),
        max_attempts=st.integers(1, 3),
    )
    def submit(self, short_lease: bool, key: str | None, param: int, max_attempts: int) -> None:
        params_json = dumps({"p": param})
        self.submits += 1
        task = NewTask(
            # Deterministic ids: tasks that tie on run_at / lease_until are claimed in id
            # order, so a replay claims the same tasks (random ids made it timing-free but
            # order-random, which hypothesis reports as a flaky strategy).
            task_id=f"task-{self.submits:04d}",
            name=TASK,
            version=1,
            params_json=params_json,
            params_digest=digest(TASK, params_json),
            idempotency_key=key,
            max_attempts=max_attempts,
            # lease 0 s: the lease is expired as soon as the ledger clock ticks (takeovers).
            lease_s=0.0 if short_lease else 3600.0,
        )
        before = self.snapshot()
        conflicts_before = self.ledger.stats().idempotency_conflicts
        existing = self.keys.get(key) if key is not None else None
        if existing is not None and existing[1] != task.params_digest:
            with pytest.raises(IdempotencyConflict):
                self.ledger.submit([task])
            assert self.snapshot() == before
            assert self.ledger.stats().idempotency_conflicts == conflicts_before + 1
            return
        [result] = self.ledger.submit([task])
        if existing is not None:
            assert result.created is False
            assert result.task_id == existing[0]
            assert self.snapshot() == before
            return
        assert result.created is True
        assert result.task_id == task.task_id
        info = self.ledger.get(task.task_id)
        assert info.state is State.PENDING
        assert info.generation == 0
        assert info.attempt == 0
        self.task_ids.append(task.task_id)
        if key is not None:
            self.keys[key] = (task.task_id, task.params_digest)
        self.assert_others_unchanged(before, self.snapshot(), task.task_id)

    @rule(holder=st.sampled_from(HOLDERS), limit=st.integers(0, 3))
    def claim(self, holder: str, limit: int) -> None:
        before = self.snapshot()
        claims = self.ledger.claim(holder, [TASK], limit)
        now_after = self.ledger.now()
        after = self.snapshot()
        ids = [c.task_id for c in claims]
        assert len(ids) == len(set(ids)), "a task was handed out twice in one claim"
        assert len(claims) <= max(limit, 0)
        ready = [tid for tid, snap in before.items() if snap[0].state in CLAIMABLE]
        assert len(claims) >= min(limit, len(ready)), "ready work was left unclaimed"
        for c in claims:
            b: TaskInfo = before[c.task_id][0]
            a: TaskInfo = after[c.task_id][0]
            assert b.state in CLAIMABLE or b.state is State.RUNNING
            if b.state is State.RUNNING:
                # Only an expired lease (ledger clock) may be taken over.
                assert b.lease_until is not None and b.lease_until < now_after
                assert c.takeover is True
                assert c.previous_holder == b.holder
            else:
                assert c.takeover is False
            assert c.generation == b.generation + 1
            assert c.attempt == b.attempt + 1
            assert a.state is State.RUNNING
            assert a.holder == holder
            assert a.generation == c.generation
            assert a.attempt == c.attempt
            assert a.lease_until == pytest.approx(c.ledger_now + c.lease_s)
            self.tokens.append(Token(c.task_id, c.generation, holder))
        # An expired lease on the final attempt is retired, not taken over: FAILED, or
        # UNKNOWN when an effect intent is open; the generation moves on (fences the holder).
        retired = []
        for tid, snap in before.items():
            b, a = snap[0], after[tid][0]
            if tid in ids or a == b:
                continue
            assert b.state is State.RUNNING and b.attempt >= b.max_attempts
            assert b.lease_until is not None and b.lease_until < now_after
            open_intent = any(e[3] == "intent" for e in snap[2])
            assert a.state is (State.UNKNOWN if open_intent else State.FAILED)
            assert a.generation == b.generation + 1 and a.holder is None
            retired.append(tid)
        self.assert_others_unchanged(before, after, *ids, *retired)

    @precondition(lambda self: bool(self.tokens))
    @rule(
        pick=st.integers(0, 10_000),
        shift=st.sampled_from([0, 0, 0, -1, 1]),
        kind=st.sampled_from(WRITE_KINDS),
        latest=st.booleans(),
    )
    def write(self, pick: int, shift: int, kind: Any, latest: bool) -> None:
        token = self.tokens[pick % len(self.tokens)]
        if latest:  # the newest token of that task: usually the current holder
            token = [t for t in self.tokens if t.task_id == token.task_id][-1]
        generation = token.generation + shift
        self._commit_and_check([self._make_write(token, generation, kind)])

    @precondition(lambda self: len({t.task_id for t in self.tokens}) >= 2)
    @rule(
        picks=st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
        shifts=st.tuples(st.sampled_from([0, -1]), st.sampled_from([0, -1])),
        kinds=st.tuples(st.sampled_from(WRITE_KINDS), st.sampled_from(WRITE_KINDS)),
    )
    def write_batch(
        self, picks: tuple[int, int], shifts: tuple[int, int], kinds: tuple[Any, Any]
    ) -> None:
        """Group commit: each task's write is fenced on its own; one stale one does not
        block a fresh one in the same transaction."""
        first = self.tokens[picks[0] % len(self.tokens)]
        others = [t for t in self.tokens if t.task_id != first.task_id]
        second = others[picks[1] % len(others)]
        writes = [
            self._make_write(first, first.generation + shifts[0], kinds[0]),
            self._make_write(second, second.generation + shifts[1], kinds[1]),
        ]
        self._commit_and_check(writes)

    def _make_write(self, token: Token, generation: int, kind: Any) -> TaskWrite:
        self.counter += 1
        name = f"n{self.counter % 3}"
        if kind == "step":
            return TaskWrite(
                token.task_id, generation, token.holder, "step", steps=[(name, dumps(self.counter))]
            )
        if kind == "intent":
            eff = EffectWrite(name, f"key:{token.task_id}:{name}", "d", EffectState.INTENT)
            return TaskWrite(token.task_id, generation, token.holder, "intent", effects=[eff])
        if kind == "effect_done":
            eff = EffectWrite(
                name, f"key:{token.task_id}:{name}", "d", EffectState.DONE, dumps(self.counter)
            )
            return TaskWrite(token.task_id, generation, token.holder, "done", effects=[eff])
        if kind == "unknown_effect":
            eff = EffectWrite(name, f"key:{token.task_id}:{name}", "d", EffectState.INTENT)
            return TaskWrite(
                token.task_id,
                generation,
                token.holder,
                "unknown",
                effects=[eff],
                transition=Transition(State.UNKNOWN, error="reply lost"),
            )
        target = State(kind)
        transition = Transition(
            target,
            delay_s=0.0,
            result_json=dumps({"r": self.counter}) if target is State.SUCCEEDED else None,
            error=f"error {self.counter}" if target in (State.FAILED, State.RETRY_WAIT) else None,
        )
        return TaskWrite(
            token.task_id, generation, token.holder, f"finish:{target}", transition=transition
        )

    def _commit_and_check(self, writes: list[TaskWrite]) -> None:
        before = self.snapshot()
        stale_before = self.ledger.stats().stale_rejections
        illegal = any(
            w.transition is not None and not is_allowed(State.RUNNING, w.transition.to)
            for w in writes
        )
        if illegal:
            with pytest.raises(IllegalTransition):
                self.ledger.commit(writes)
            assert self.snapshot() == before
            return
        outcomes = self.ledger.commit(writes)
        after = self.snapshot()
        assert [o.task_id for o in outcomes] == [w.task_id for w in writes]
        expected_stale = 0
        for write, outcome in zip(writes, outcomes, strict=True):
            b: TaskInfo = before[write.task_id][0]
            a: TaskInfo = after[write.task_id][0]
            fresh = b.state is State.RUNNING and b.generation == write.generation
            t = write.transition
            if (
                t is not None and t.to is not State.RUNNING and b.state is t.to
                and b.generation == write.generation
            ):
                # A re-send of a transition already applied at this generation (a commit
                # whose reply was lost): acknowledged, and nothing is written again.
                assert outcome.ok and not outcome.stale
                assert after[write.task_id] == before[write.task_id]
                continue
            if not fresh:
                expected_stale += 1
                assert outcome.stale and not outcome.ok
                assert outcome.current_generation == b.generation
                assert after[write.task_id] == before[write.task_id], (
                    "a write with a non-current generation changed the task"
                )
                continue
            assert outcome.ok and not outcome.stale
            assert a.generation == b.generation
            released = write.transition is not None and write.transition.to is State.PENDING
            # A release hands its attempt back; every other write leaves it alone.
            assert a.attempt == (b.attempt - 1 if released else b.attempt)
            steps = dict((s[0], s[1]) for s in after[write.task_id][1])
            for name, result_json in write.steps:
                assert steps[name] == result_json
            effects = {e[0]: e for e in after[write.task_id][2]}
            for eff in write.effects:
                assert effects[eff.name][3] is eff.state
                assert effects[eff.name][1] == eff.key
            if write.transition is None:
                assert a.state is State.RUNNING
                assert a.holder == b.holder
                continue
            t = write.transition
            assert a.state is t.to
            if t.to is State.RUNNING:
                assert a.holder == b.holder
                assert a.lease_until == b.lease_until
            else:
                assert a.holder is None
                assert a.lease_until is None
            if t.to is State.SUCCEEDED:
                assert dumps(a.result) == t.result_json
            if t.error is not None:
                assert a.last_error == t.error
        self.assert_others_unchanged(before, after, *(w.task_id for w in writes))
        assert self.ledger.stats().stale_rejections == stale_before + expected_stale

    @precondition(lambda self: bool(self.tokens))
    @rule(pick=st.integers(0, 10_000), wrong_holder=st.booleans(), shift=st.sampled_from([0, -1]))
    def renew(self, pick: int, wrong_holder: bool, shift: int) -> None:
        token = self.tokens[pick % len(self.tokens)]
        holder = "intruder" if wrong_holder else token.holder
        generation = token.generation + shift
        before = self.snapshot()
        [result] = self.ledger.renew(holder, [(token.task_id, generation)])
        after = self.snapshot()
        b: TaskInfo = before[token.task_id][0]
        a: TaskInfo = after[token.task_id][0]
        current = b.state is State.RUNNING and b.generation == generation and b.holder == holder
        if not current:
            assert result.ok is False
            assert result.lease_until is None
        if result.ok:
            assert b.lease_until is not None and a.lease_until is not None
            assert a.lease_until >= b.lease_until
            assert a.lease_until == pytest.approx(result.lease_until)
        # Renewal moves lease_until forward and touches nothing else.
        assert dataclasses.replace(a, lease_until=b.lease_until) == b
        assert after[token.task_id][1:] == before[token.task_id][1:]
        self.assert_others_unchanged(before, after, token.task_id)

    @precondition(lambda self: bool(self.task_ids))
    @rule(
        pick=st.integers(0, 10_000),
        outcome=st.sampled_from(list(ResolveOutcome)),
        prefer_unknown=st.booleans(),
    )
    def resolve(self, pick: int, outcome: ResolveOutcome, prefer_unknown: bool) -> None:
        candidates = self.task_ids
        if prefer_unknown:
            unknown = [t for t in self.task_ids if self.ledger.get(t).state is State.UNKNOWN]
            candidates = unknown or candidates
        task_id = candidates[pick % len(candidates)]
        before = self.snapshot()
        b: TaskInfo = before[task_id][0]
        if b.state is not State.UNKNOWN:
            with pytest.raises(IllegalTransition):
                self.ledger.resolve(task_id, outcome, "test", "tester", dumps("op"))
            assert self.snapshot() == before
            return
        info = self.ledger.resolve(task_id, outcome, "test", "tester", dumps("op"))
        after = self.snapshot()
        assert info.state is State.PENDING
        assert info.generation == b.generation
        want = EffectState.DONE if outcome is ResolveOutcome.DONE else EffectState.NOT_DONE
        old_effects = {e[0]: e for e in before[task_id][2]}
        for e in after[task_id][2]:
            if old_effects[e[0]][3] is EffectState.INTENT:
                assert e[3] is want
            else:
                assert e == old_effects[e[0]]
        self.assert_others_unchanged(before, after, task_id)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def only_forward(self) -> None:
        now = self.snapshot()
        for tid, old in self.prev.items():
            new = now[tid]
            assert new[0].generation >= old[0].generation, "generation went backwards"
            released = (
                old[0].state is State.RUNNING
                and new[0].state is State.PENDING
                and new[0].attempt == old[0].attempt - 1
            )
            assert new[0].attempt >= old[0].attempt or released, "attempt went backwards"
            if old[0].state in TERMINAL:
                assert new == old, f"terminal task {tid} changed: {old[0]} -> {new[0]}"
        self.prev = now


TestLedgerStateMachine = LedgerMachine.TestCase
TestLedgerStateMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
