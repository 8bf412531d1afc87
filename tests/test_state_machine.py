"""The stateful property test of the ledger (DESIGN §3, §4), on both ledgers.

Hypothesis drives a real ledger (a SQLite file, or a private PostgreSQL schema) with random
submits (idempotency keys), claims (0 s leases, so takeovers happen), fenced writes with
current, stale and future fencing generations (alone, in group-commit batches, and with the
next claim in the same transaction as the worker does), lease renewals, revocations of a
holder and operator resolutions of ``UNKNOWN`` tasks. After every command it compares the
ledger with what the contract promises, and checks that everything that decides
correctness only moves forward (generation, attempt) and that a terminal task never
changes again.

Determinism (so that hypothesis never reports a flaky strategy, whatever the load):

* the draws never depend on the ledger: no rule has a precondition on the model (a rule
  that has nothing to act on returns at once), so which of two tasks that tie on
  ``run_at`` / ``lease_until`` a claim picks (PostgreSQL breaks such ties by physical row
  order) cannot change the shape of the next example;
* task ids are deterministic (``task-0001``...), so replays address the same tasks;
* the ledger clock moves on between steps (:meth:`LedgerMachine.clock_moves_between_steps`),
  so a 0 s lease has expired at the next step and a 3600 s one never has, whatever the
  machine's speed.

Cost: one SQLite file per example; on PostgreSQL one private schema per test whose tables
are emptied between examples (a schema per example would cost its migration each time).
PostgreSQL runs fewer, shorter examples (:data:`SETTINGS`) to stay well under a minute.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from pgsupport import pg_base_url, private_schema

from ratchet import open_ledger
from ratchet.errors import IdempotencyConflict, IllegalTransition
from ratchet.ledger.base import (
    Claim,
    EffectState,
    EffectWrite,
    Ledger,
    NewTask,
    ResolveOutcome,
    TaskInfo,
    TaskWrite,
    Transition,
)
from ratchet.serde import digest, dumps
from ratchet.states import CLAIMABLE, PARKED, TERMINAL, State, is_allowed
from ratchet.testing import wait_for

TASK = "sm.task"
HOLDERS = ("w1", "w2", "w3")
KEYS = (None, "key-a", "key-b")
MAX_TASKS = 6
# "unknown_effect": an intent and the move to UNKNOWN in one commit (a lost reply).
WRITE_KINDS: list[Any] = ["step", "intent", "effect_done", "unknown_effect",
                          *(s for s in State if s not in PARKED)]
"""What a holder's write does. Not the parked states (WAITING, COMPENSATING): any claim
wakes those once due (a move of the ledger's own that this model does not predict);
tests/test_workflow_ledger.py holds their fencing, wake-ups and attempts."""
EPOCH_TOLERANCE_S = 1e-3
"""Tolerance when comparing ledger instants (epoch seconds): pytest.approx's default
relative tolerance would accept half an hour at today's epoch."""
CLOCK_TICK_S = 0.0015
"""Ledger-clock time (seconds) that passes between two steps: more than the ledger clock's
resolution (SQLite: 1 ms), so no two steps share an instant."""

SETTINGS = {
    # ~4 s alone on 2 cores, ~8 s while a second copy of the suite runs.
    "sqlite": settings(max_examples=60, stateful_step_count=40, deadline=None, print_blob=True),
    # A step is a few dozen round trips: ~15 s alone, ~35 s while a second copy runs.
    "postgresql": settings(
        max_examples=40, stateful_step_count=35, deadline=None, print_blob=True
    ),
}
"""Hypothesis budget per backend (the ``ratchet`` profile in conftest.py sets no deadline
and no example database)."""


@dataclasses.dataclass(frozen=True)
class Token:
    """A fencing token handed out by a claim (kept forever so it can be replayed stale)."""

    task_id: str
    generation: int
    holder: str


def _freeze(ledger: Ledger, task_id: str) -> tuple[Any, ...]:
    """Everything the ledger holds about a task except its audit log:
    ``(TaskInfo, sorted steps, sorted effects)``."""
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
    """Random command sequences against one empty ledger (built by the test per backend).

    Args:
        ledger: an open, empty, migrated ledger.
        release: called at teardown (closes the ledger, or empties it for the next example).
    """

    def __init__(self, ledger: Ledger, release: Callable[[], None]) -> None:
        super().__init__()
        self.ledger = ledger
        self.release = release
        self.task_ids: list[str] = []
        self.keys: dict[str, tuple[str, str]] = {}  # idempotency key -> (task id, digest)
        self.tokens: list[Token] = []
        self.prev: dict[str, tuple[Any, ...]] = {}
        self.counter = 0
        self.submits = 0

    def teardown(self) -> None:
        self.release()

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
        """Wait (on the ledger clock, with no fixed sleep) until it has moved by
        :data:`CLOCK_TICK_S`: 0 s leases are expired at the next step, and run_at /
        lease_until of two steps never tie (a tie would make the run depend on timing)."""
        mark = self.ledger.now()
        wait_for("the ledger clock to move by CLOCK_TICK_S",
                 lambda: self.ledger.now() > mark + CLOCK_TICK_S, timeout_s=10, interval_s=0.0005)

    # ------------------------------------------------------------------ rules

    @initialize(leases=st.lists(st.booleans(), min_size=2, max_size=4))
    def seed_tasks(self, leases: list[bool]) -> None:
        """Start with a few tasks (some with a 0 s lease, so takeovers happen)."""
        for i, short in enumerate(leases):
            self.submit(short_lease=short, key=None, param=i, max_attempts=3)

    @rule(
        short_lease=st.booleans(),
        key=st.sampled_from(KEYS),
        param=st.integers(0, 1),
        max_attempts=st.integers(1, 3),
    )
    def submit(self, short_lease: bool, key: str | None, param: int, max_attempts: int) -> None:
        if len(self.task_ids) >= MAX_TASKS:
            return
        params_json = dumps({"p": param})
        self.submits += 1
        task = NewTask(
            # Deterministic ids: a replay addresses the same tasks.
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
        ready = [tid for tid, snap in before.items() if snap[0].state in CLAIMABLE]
        infos = {tid: snap[0] for tid, snap in before.items()}
        moved = self._check_claims(infos, after, claims, holder, limit, now_after, len(ready))
        self.assert_others_unchanged(before, after, *moved)

    def _check_claims(
        self,
        infos: dict[str, TaskInfo],
        after: dict[str, tuple[Any, ...]],
        claims: list[Claim],
        holder: str,
        limit: int,
        now_after: float,
        ready: int,
    ) -> list[str]:
        """Check a claim against ``infos`` (the tasks as the claim found them) and return
        the ids it moved: claimed, or retired (an expired final attempt).

        ``ready``: how many tasks were certainly ready (the claim must take that many, up
        to ``limit``).
        """
        ids = [c.task_id for c in claims]
        assert len(ids) == len(set(ids)), "a task was handed out twice in one claim"
        assert len(claims) <= max(limit, 0)
        assert len(claims) >= min(limit, ready), "ready work was left unclaimed"
        for c in claims:
            b = infos[c.task_id]
            a: TaskInfo = after[c.task_id][0]
            assert b.state in CLAIMABLE or b.state is State.RUNNING
            if b.state is State.RUNNING:
                # Only an expired lease (ledger clock) may be taken over.
                assert b.lease_until is not None and b.lease_until < now_after
                assert c.takeover is True
                assert c.previous_holder == b.holder
                event("claim: takeover of an expired lease")
            else:
                assert c.takeover is False
            assert c.generation == b.generation + 1
            assert c.attempt == b.attempt + 1
            assert a.state is State.RUNNING
            assert a.holder == holder
            assert a.generation == c.generation
            assert a.attempt == c.attempt
            assert a.lease_until == pytest.approx(c.ledger_now + c.lease_s, abs=EPOCH_TOLERANCE_S)
            self.tokens.append(Token(c.task_id, c.generation, holder))
        # An expired lease on the final attempt is retired, not taken over: FAILED, or
        # UNKNOWN when an effect intent is open; the generation moves on (fences the holder).
        retired = []
        for tid, b in infos.items():
            a = after[tid][0]
            if tid in ids or a.generation == b.generation:
                continue
            assert b.state is State.RUNNING and b.attempt >= b.max_attempts
            assert b.lease_until is not None and b.lease_until < now_after
            open_intent = any(e[3] == "intent" for e in after[tid][2])
            assert a.state is (State.UNKNOWN if open_intent else State.FAILED)
            assert a.generation == b.generation + 1 and a.holder is None
            assert a.attempt == b.attempt
            retired.append(tid)
            event(f"claim: expired final attempt retired to {a.state}")
        return [*ids, *retired]

    @rule(
        pick=st.integers(0, 10_000),
        shift=st.sampled_from([0, 0, 0, -1, 1]),
        kind=st.sampled_from(WRITE_KINDS),
        latest=st.booleans(),
    )
    def write(self, pick: int, shift: int, kind: Any, latest: bool) -> None:
        if not self.tokens:
            return
        token = self.tokens[pick % len(self.tokens)]
        if latest:  # the newest token of that task: usually the current holder
            token = [t for t in self.tokens if t.task_id == token.task_id][-1]
        generation = token.generation + shift
        self._commit_and_check([self._make_write(token, generation, kind)])

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
        if len({t.task_id for t in self.tokens}) < 2:
            return
        first = self.tokens[picks[0] % len(self.tokens)]
        others = [t for t in self.tokens if t.task_id != first.task_id]
        second = others[picks[1] % len(others)]
        writes = [
            self._make_write(first, first.generation + shifts[0], kinds[0]),
            self._make_write(second, second.generation + shifts[1], kinds[1]),
        ]
        self._commit_and_check(writes)

    @rule(
        pick=st.integers(0, 10_000),
        shift=st.sampled_from([0, 0, -1]),
        kind=st.sampled_from(WRITE_KINDS),
        holder=st.sampled_from(HOLDERS),
        limit=st.integers(0, 2),
    )
    def commit_and_claim(
        self, pick: int, shift: int, kind: Any, holder: str, limit: int
    ) -> None:
        """The worker's group commit: a task's write and the next claim in one transaction.
        The write is fenced as in :meth:`commit`; the claim sees the task as written."""
        if not self.tokens:
            return
        token = self.tokens[pick % len(self.tokens)]
        token = [t for t in self.tokens if t.task_id == token.task_id][-1]
        self._commit_and_check(
            [self._make_write(token, token.generation + shift, kind)], claim=(holder, limit)
        )

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

    @staticmethod
    def _verdict(b: TaskInfo, write: TaskWrite) -> str:
        """What the ledger must do with ``write`` to a task now ``b``: ``"fresh"`` (apply
        it), ``"resend"`` (a transition already applied at this generation, re-sent after a
        lost reply: acknowledge, write nothing) or ``"stale"`` (reject, write nothing)."""
        t = write.transition
        if (
            t is not None
            and t.to is not State.RUNNING
            and b.state is t.to
            and b.generation == write.generation
        ):
            return "resend"
        if b.state is State.RUNNING and b.generation == write.generation:
            return "fresh"
        return "stale"

    @staticmethod
    def _as_written(b: TaskInfo, write: TaskWrite) -> TaskInfo:
        """The task ``b`` once the fresh ``write`` is applied (the fields a claim reads)."""
        t = write.transition
        if t is None:
            return b
        # A release, and a pause at a boundary, hand their attempt back; with no pause
        # active (none in this machine) a PAUSED write is applied as a release.
        released = t.to in (State.PENDING, State.PAUSED)
        return dataclasses.replace(
            b,
            state=State.PENDING if t.to is State.PAUSED else t.to,
            attempt=b.attempt - 1 if released else b.attempt,
            holder=b.holder if t.to is State.RUNNING else None,
            lease_until=b.lease_until if t.to is State.RUNNING else None,
        )

    @staticmethod
    def _check_parts(after: tuple[Any, ...], write: TaskWrite) -> None:
        """A fresh write's steps and effects are in the ledger."""
        steps = {s[0]: s[1] for s in after[1]}
        for name, result_json in write.steps:
            assert steps[name] == result_json
        effects = {e[0]: e for e in after[2]}
        for eff in write.effects:
            assert effects[eff.name][3] is eff.state
            assert effects[eff.name][1] == eff.key

    @staticmethod
    def _check_applied(b: TaskInfo, after: tuple[Any, ...], write: TaskWrite) -> None:
        """A fresh write is in the ledger: its steps, effects and transition."""
        LedgerMachine._check_parts(after, write)
        a: TaskInfo = after[0]
        assert a.generation == b.generation
        expected = LedgerMachine._as_written(b, write)
        assert a.attempt == expected.attempt
        assert a.state is expected.state
        assert a.holder == expected.holder
        assert a.lease_until == expected.lease_until
        t = write.transition
        if t is not None and t.to is State.SUCCEEDED:
            assert dumps(a.result) == t.result_json
        if t is not None and t.error is not None:
            assert a.last_error == t.error

    def _commit_and_check(
        self, writes: list[TaskWrite], claim: tuple[str, int] | None = None
    ) -> None:
        """Commit ``writes`` (with ``claim = (holder, limit)``: then claim, in the same
        transaction) and check every outcome against the state before."""
        before = self.snapshot()
        stale_before = self.ledger.stats().stale_rejections
        illegal = any(
            w.transition is not None and not is_allowed(State.RUNNING, w.transition.to)
            for w in writes
        )
        if illegal:
            # A move the transition table refuses out of RUNNING: the whole batch is
            # refused, whatever the fencing of each write.
            with pytest.raises(IllegalTransition):
                if claim is None:
                    self.ledger.commit(writes)
                else:
                    self.ledger.commit_and_claim(writes, claim[0], [TASK], claim[1])
            assert self.snapshot() == before
            event("commit: illegal transition refused")
            return
        claims: list[Claim] = []
        if claim is None:
            outcomes = self.ledger.commit(writes)
        else:
            outcomes, claims = self.ledger.commit_and_claim(writes, claim[0], [TASK], claim[1])
        now_after = self.ledger.now()
        after = self.snapshot()
        assert [o.task_id for o in outcomes] == [w.task_id for w in writes]
        written = {tid: snap[0] for tid, snap in before.items()}  # as the claim finds them
        fresh: dict[str, TaskWrite] = {}
        expected_stale = 0
        label = "commit" if claim is None else "commit_and_claim"
        for write, outcome in zip(writes, outcomes, strict=True):
            b: TaskInfo = before[write.task_id][0]
            verdict = self._verdict(b, write)
            event(f"{label}: {verdict} write" + (" in a batch" if len(writes) > 1 else ""))
            if verdict == "fresh":
                assert outcome.ok and not outcome.stale
                fresh[write.task_id] = write
                written[write.task_id] = self._as_written(b, write)
                continue
            assert outcome.ok is (verdict == "resend")
            assert outcome.stale is (verdict == "stale")
            if verdict == "stale":
                expected_stale += 1
                assert outcome.current_generation == b.generation
        moved: list[str] = []
        if claim is not None:
            ready = [
                tid
                for tid, snap in before.items()
                if snap[0].state in CLAIMABLE and tid not in {w.task_id for w in writes}
            ]
            moved = self._check_claims(
                written, after, claims, claim[0], claim[1], now_after, len(ready)
            )
        for write in writes:
            tid = write.task_id
            if tid in moved:  # claimed or retired after the write: its parts must stay
                if tid in fresh:
                    self._check_parts(after[tid], fresh[tid])
                else:
                    assert after[tid][1:] == before[tid][1:]
            elif tid in fresh:
                self._check_applied(before[tid][0], after[tid], fresh[tid])
            else:
                assert after[tid] == before[tid], (
                    "a stale or re-sent write changed the task"
                )
        self.assert_others_unchanged(before, after, *(w.task_id for w in writes), *moved)
        assert self.ledger.stats().stale_rejections == stale_before + expected_stale

    @rule(pick=st.integers(0, 10_000), wrong_holder=st.booleans(), shift=st.sampled_from([0, -1]))
    def renew(self, pick: int, wrong_holder: bool, shift: int) -> None:
        if not self.tokens:
            return
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
            event("renew: lease extended")
            assert b.lease_until is not None and a.lease_until is not None
            assert a.lease_until >= b.lease_until
            assert a.lease_until == pytest.approx(result.lease_until, abs=EPOCH_TOLERANCE_S)
        # Renewal moves lease_until forward and touches nothing else.
        assert dataclasses.replace(a, lease_until=b.lease_until) == b
        assert after[token.task_id][1:] == before[token.task_id][1:]
        self.assert_others_unchanged(before, after, token.task_id)

    @rule(holder=st.sampled_from(HOLDERS))
    def revoke(self, holder: str) -> None:
        """Fast takeover: every lease of ``holder`` is taken away (generation + 1), to
        ``RETRY_WAIT``, or retired like an expired final attempt."""
        before = self.snapshot()
        revoked = self.ledger.revoke_holder(holder, by="judge", reason="state machine")
        after = self.snapshot()
        held = [
            tid
            for tid, snap in before.items()
            if snap[0].state is State.RUNNING and snap[0].holder == holder
        ]
        assert sorted(revoked) == sorted(held)
        for tid in held:
            b: TaskInfo = before[tid][0]
            a: TaskInfo = after[tid][0]
            assert a.generation == b.generation + 1
            assert a.holder is None and a.lease_until is None
            assert a.attempt == b.attempt  # the revoked run counts as an attempt
            if b.attempt >= b.max_attempts:
                open_intent = any(e[3] == "intent" for e in before[tid][2])
                assert a.state is (State.UNKNOWN if open_intent else State.FAILED)
            else:
                assert a.state is State.RETRY_WAIT
            assert after[tid][1:] == before[tid][1:], "revocation changed steps or effects"
            event(f"revoke: lease taken away, now {a.state}")
        self.assert_others_unchanged(before, after, *held)

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
        event("resolve: UNKNOWN settled by an operator")
        after = self.snapshot()
        if outcome is ResolveOutcome.GIVE_UP:
            # The operator gives up: FAILED, generation + 1, the effects marked given up.
            assert info.state is State.FAILED
            assert info.generation == b.generation + 1
        else:
            assert info.state is State.PENDING
            assert info.generation == b.generation
        want = {ResolveOutcome.DONE: EffectState.DONE,
                ResolveOutcome.NOT_DONE: EffectState.NOT_DONE,
                ResolveOutcome.GIVE_UP: EffectState.GIVEN_UP}[outcome]
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
                and new[0].state in (State.PENDING, State.PAUSED)
                and new[0].attempt == old[0].attempt - 1
            )
            assert new[0].attempt >= old[0].attempt or released, "attempt went backwards"
            if old[0].state in TERMINAL:
                assert new == old, f"terminal task {tid} changed: {old[0]} -> {new[0]}"
        self.prev = now


# ---------------------------------------------------------------------- stores per backend


@contextmanager
def _sqlite_machines(tmp_path: Path) -> Iterator[Callable[[], LedgerMachine]]:
    """A fresh SQLite file per example (``buffered``: no fsync per commit; the test is
    about logic, not durability)."""
    numbers = itertools.count()

    def make() -> LedgerMachine:
        path = tmp_path / f"example-{next(numbers)}.db"
        ledger = open_ledger(f"sqlite:///{path}?durability=buffered")

        def release() -> None:
            ledger.close()
            path.unlink(missing_ok=True)

        return LedgerMachine(ledger, release)

    yield make


def _data_tables(conn: Any, schema: str) -> list[str]:
    """The ledger's tables in ``schema``, without its schema-version bookkeeping."""
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = %s AND table_type = 'BASE TABLE'",
        (schema,),
    ).fetchall()
    return sorted(
        str(r[0]) for r in rows if "version" not in str(r[0]) and "migration" not in str(r[0])
    )


@contextmanager
def _postgres_machines() -> Iterator[Callable[[], LedgerMachine]]:
    """One private schema and one open ledger for the whole test; every example starts on
    emptied tables (TRUNCATE ... RESTART IDENTITY: audit sequence numbers restart too)."""
    import psycopg
    from psycopg import sql

    with private_schema("rt_sm") as (url, schema):
        ledger = open_ledger(url)
        admin = psycopg.connect(pg_base_url(), autocommit=True)
        try:
            tables = _data_tables(admin, schema)
            assert "tasks" in tables, tables
            truncate = sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables)
            )

            def make() -> LedgerMachine:
                admin.execute(truncate)
                return LedgerMachine(ledger, lambda: None)

            yield make
        finally:
            admin.close()
            ledger.close()


# A passing run takes well under a minute; a failing one shrinks for up to 300 s
# (hypothesis's MAX_SHRINKING_SECONDS). The suite-wide 300 s timeout would fire during that
# shrink and hypothesis would report the interruption as a FlakyFailure, hiding the bug.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ledger_state_machine(backend: str, tmp_path: Path) -> None:
    """Random command sequences keep every ledger guarantee, on each backend."""
    machines = _sqlite_machines(tmp_path) if backend == "sqlite" else _postgres_machines()
    with machines as make:
        run_state_machine_as_test(make, settings=SETTINGS[backend])
