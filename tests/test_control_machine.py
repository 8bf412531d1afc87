"""A stateful property test of operator control against holders (DESIGN §3
arbitration), on both ledgers.

Hypothesis drives a real ledger with random interleavings of claims (0 s and 1 h leases,
so leases expire and are taken over), holders' fenced writes with their generation (current
or stale: complete, fail / retry, release, stop at a boundary for a request, effect intents
and results), renewals, revocations, and operator commands: cancel, pause and resume (of
the type, of everything, of one task), retry of a FAILED task and resolve (done,
not-done, give-up). Holders behave like workers: a holder completes only after settling
its open intents, and stops for a request only with none open.

After every step it checks:

* a terminal state, once reached, is never left, except ``FAILED`` by an operator retry
  (the only operator move out of it), and ``SUCCEEDED`` / ``CANCELLED`` never change at all;
* generation never goes back; attempt never goes back except a release or a pause at a
  boundary (one handed back) and a retry (reset to 0);
* effects agree with the state: a ``SUCCEEDED`` or ``CANCELLED`` task has no open intent,
  and nothing about its effects changes afterwards (no intent is written after a cancel);
* no claim takes a task in a paused scope.

Determinism as in tests/test_state_machine.py: rules have no preconditions on the ledger,
ids are deterministic, and the ledger clock moves between steps.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
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
from ratchet.errors import IllegalTransition
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
from ratchet.states import State
from ratchet.testing import wait_for

TASKS = ("cm.a", "cm.b")
HOLDERS = ("w1", "w2")
MAX_TASKS = 5
CLOCK_TICK_S = 0.0015

SETTINGS = {
    "sqlite": settings(max_examples=40, stateful_step_count=35, deadline=None,
                       print_blob=True),
    "postgresql": settings(max_examples=20, stateful_step_count=30, deadline=None,
                           print_blob=True),
}


@dataclasses.dataclass
class Holding:
    """A claim as its holder knows it (kept after it goes stale, to write stale)."""

    task_id: str
    name: str
    generation: int
    holder: str
    intents: set[str]


def _freeze(ledger: Ledger, task_id: str) -> tuple[Any, ...]:
    tl = ledger.timeline(task_id)
    effects = tuple(sorted((e.name, e.key, e.state, e.result_json, e.generation, e.calls)
                           for e in tl.effects))
    return (tl.task, effects)


class ControlMachine(RuleBasedStateMachine):
    def __init__(self, ledger: Ledger, release: Callable[[], None]) -> None:
        super().__init__()
        self.ledger = ledger
        self.release = release
        self.task_ids: list[str] = []
        self.names: dict[str, str] = {}
        self.holdings: list[Holding] = []
        self.prev: dict[str, tuple[Any, ...]] = {}
        self.retried: set[str] = set()  # FAILED -> PENDING by an operator retry this step
        self.submits = 0
        self.effects = 0

    def teardown(self) -> None:
        self.release()

    # ------------------------------------------------------------------ helpers

    def snapshot(self) -> dict[str, tuple[Any, ...]]:
        return {tid: _freeze(self.ledger, tid) for tid in self.task_ids}

    def _pick(self, pick: int) -> str | None:
        return self.task_ids[pick % len(self.task_ids)] if self.task_ids else None

    def _holding(self, pick: int) -> Holding | None:
        return self.holdings[pick % len(self.holdings)] if self.holdings else None

    def _commit(self, h: Holding, write: TaskWrite) -> None:
        [outcome] = self.ledger.commit([write])
        if outcome.ok:
            for e in write.effects:
                if e.state is EffectState.INTENT:
                    h.intents.add(e.name)
                else:
                    h.intents.discard(e.name)

    # ------------------------------------------------------------------ rules

    @initialize(shorts=st.lists(st.booleans(), min_size=2, max_size=3))
    def seed(self, shorts: list[bool]) -> None:
        for i, short in enumerate(shorts):
            self.submit(short=short, kind=i % 2, max_attempts=2)

    @rule(short=st.booleans(), kind=st.integers(0, 1), max_attempts=st.integers(1, 3))
    def submit(self, short: bool, kind: int, max_attempts: int) -> None:
        if len(self.task_ids) >= MAX_TASKS:
            return
        self.submits += 1
        name = TASKS[kind]
        params = dumps({"n": self.submits})
        task_id = f"task-{self.submits:04d}"
        self.ledger.submit([NewTask(task_id, name, 1, params, digest(name, params), None,
                                    max_attempts, 0.0 if short else 3600.0)])
        self.task_ids.append(task_id)
        self.names[task_id] = name

    @rule(holder=st.sampled_from(HOLDERS), limit=st.integers(1, 3))
    def claim(self, holder: str, limit: int) -> None:
        paused = self.ledger.pauses()
        claims = self.ledger.claim(holder, list(TASKS), limit)
        for c in claims:
            assert not any(p.scope == "all" or (p.scope == "type" and p.target == c.name)
                           for p in paused), f"claimed {c.task_id} in a paused scope"
            intents = {n for n, e in c.effects.items() if e.state is EffectState.INTENT}
            self.holdings.append(Holding(c.task_id, c.name, c.generation, holder, intents))

    @rule(pick=st.integers(0, 100))
    def intent(self, pick: int) -> None:
        h = self._holding(pick)
        if h is None or h.intents:
            return
        self.effects += 1
        name = f"e{self.effects}"
        self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "intent", effects=[
            EffectWrite(name, f"key-{name}", "d", EffectState.INTENT)]))

    @rule(pick=st.integers(0, 100),
          end=st.sampled_from(["succeed", "fail", "retry", "release", "boundary",
                               "unknown", "settle"]))
    def holder_writes(self, pick: int, end: str) -> None:
        """The holder's next write, at its generation (stale or not)."""
        h = self._holding(pick)
        if h is None:
            return
        settle = [EffectWrite(n, f"key-{n}", "d", EffectState.DONE, dumps(1))
                  for n in sorted(h.intents)]
        if end == "settle":
            if settle:
                self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "settle",
                                          effects=settle))
            return
        if end == "succeed":
            # A worker settles its effects before it returns.
            t = Transition(State.SUCCEEDED, result_json=dumps(1))
            self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "finish",
                                      effects=settle, transition=t))
        elif end == "fail":
            state = State.UNKNOWN if h.intents else State.FAILED
            self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "finish",
                                      transition=Transition(state, error="boom")))
        elif end == "retry":
            self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "finish",
                                      transition=Transition(State.RETRY_WAIT, error="x")))
        elif end == "release":
            self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "finish",
                                      transition=Transition(State.PENDING)))
        elif end == "unknown":
            if h.intents:
                self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "finish",
                                          transition=Transition(State.UNKNOWN, error="?")))
        else:
            # Stop at a boundary for the request the heartbeat would read (none open).
            if h.intents:
                return
            asked = {t: r for t, g, r in self.ledger.control_requests(h.holder)
                     if g == h.generation}
            request = asked.get(h.task_id)
            if request is None:
                return
            to = State.CANCELLED if request == "cancel" else State.PAUSED
            self._commit(h, TaskWrite(h.task_id, h.generation, h.holder, "boundary",
                                      transition=Transition(to)))

    @rule(holder=st.sampled_from(HOLDERS))
    def renew(self, holder: str) -> None:
        leases = [(h.task_id, h.generation) for h in self.holdings if h.holder == holder]
        if leases:
            self.ledger.renew(holder, leases)

    @rule(holder=st.sampled_from(HOLDERS))
    def revoke(self, holder: str) -> None:
        self.ledger.revoke_holder(holder, by="judge", reason="test")

    @rule(pick=st.integers(0, 100))
    def cancel(self, pick: int) -> None:
        tid = self._pick(pick)
        if tid is None:
            return
        before = self.ledger.get(tid)
        out = self.ledger.cancel(tid, "test", "op")
        if before.state in (State.SUCCEEDED, State.FAILED, State.CANCELLED):
            assert out.outcome == "unchanged"

    @rule(pick=st.integers(0, 100), scope=st.sampled_from(["all", "type", "task"]),
          resume=st.booleans(), rate=st.sampled_from([None, 100.0]))
    def pause_or_resume(self, pick: int, scope: str, resume: bool, rate: float | None) -> None:
        tid = self._pick(pick)
        if tid is None:
            return
        target = {"all": "", "type": self.names[tid], "task": tid}[scope]
        if resume:
            self.ledger.resume(scope, target, "test", "op", rate)
        else:
            self.ledger.pause(scope, target, "test", "op")

    @rule(pick=st.integers(0, 100))
    def operator_retry(self, pick: int) -> None:
        tid = self._pick(pick)
        if tid is None:
            return
        out = self.ledger.retry(tid, "test", "op")
        if out.outcome == "done":
            self.retried.add(tid)

    @rule(pick=st.integers(0, 100), outcome=st.sampled_from(list(ResolveOutcome)))
    def resolve(self, pick: int, outcome: ResolveOutcome) -> None:
        tid = self._pick(pick)
        if tid is None:
            return
        state = self.ledger.get(tid).state
        if state is not State.UNKNOWN:
            with pytest.raises(IllegalTransition):
                self.ledger.resolve(tid, outcome, "test", "op")
            return
        self.ledger.resolve(tid, outcome, "test", "op",
                            dumps(1) if outcome is ResolveOutcome.DONE else None)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def clock_moves(self) -> None:
        mark = self.ledger.now()
        wait_for("the ledger clock to move by CLOCK_TICK_S",
                 lambda: self.ledger.now() > mark + CLOCK_TICK_S, timeout_s=10, interval_s=0.0005)

    @invariant()
    def never_back(self) -> None:
        now = self.snapshot()
        for tid, (task, effects) in now.items():
            if task.state in (State.SUCCEEDED, State.CANCELLED):
                assert all(e[2] is not EffectState.INTENT for e in effects), (
                    f"{task.state} task {tid} has an open effect intent: {effects}")
            old = self.prev.get(tid)
            if old is None:
                continue
            was, _old_effects = old
            assert task.generation >= was.generation, f"{tid}: generation went back"
            handed_back = (was.state is State.RUNNING
                           and task.state in (State.PENDING, State.PAUSED)
                           and task.attempt == was.attempt - 1)
            reset = tid in self.retried and task.attempt == 0
            assert task.attempt >= was.attempt or handed_back or reset, (
                f"{tid}: attempt went back {was} -> {task}")
            if was.state in (State.SUCCEEDED, State.CANCELLED):
                assert (task, effects) == old, f"{tid} left {was.state}: {task}"
            if was.state is State.FAILED and (task, effects) != old:
                assert tid in self.retried and task.state in (
                    State.PENDING, State.RUNNING), f"{tid} left FAILED without a retry"
        self.retried = set()
        self.prev = now


@contextmanager
def _sqlite_machines(tmp_path: Path) -> Iterator[Callable[[], ControlMachine]]:
    numbers = itertools.count()

    def make() -> ControlMachine:
        path = tmp_path / f"example-{next(numbers)}.db"
        ledger = open_ledger(f"sqlite:///{path}?durability=buffered")

        def release() -> None:
            ledger.close()
            path.unlink(missing_ok=True)

        return ControlMachine(ledger, release)

    yield make


@contextmanager
def _postgres_machines() -> Iterator[Callable[[], ControlMachine]]:
    import psycopg
    from psycopg import sql

    with private_schema("rt_cm") as (url, schema):
        ledger = open_ledger(url)
        admin = psycopg.connect(pg_base_url(), autocommit=True)
        try:
            rows = admin.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
                " AND table_type = 'BASE TABLE'", (schema,)).fetchall()
            tables = sorted(str(r[0]) for r in rows if "version" not in str(r[0]))
            truncate = sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables))

            def make() -> ControlMachine:
                admin.execute(truncate)
                return ControlMachine(ledger, lambda: None)

            yield make
        finally:
            admin.close()
            ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_control_state_machine(backend: str, tmp_path: Path) -> None:
    """Random interleavings of holders and operators keep the arbitration rules."""
    machines = _sqlite_machines(tmp_path) if backend == "sqlite" else _postgres_machines()
    with machines as make:
        run_state_machine_as_test(make, settings=SETTINGS[backend])
