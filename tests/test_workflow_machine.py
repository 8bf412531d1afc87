"""The stateful property test of workflows in the ledger (DESIGN §3, waits), on both ledgers.

Hypothesis drives a real ledger with random interleavings of: submits of parents and
children (``parent_id``), claims by several holders (0 s leases, so takeovers and
retirements happen), a holder parking its task (a sleep due now, soon or never; an event
wait on a few (name, key) pairs with ``after`` and reused checkpoint names; a wait on a
random subset of its children; ``COMPENSATING``), holders ending tasks (children among
them), events sent (ids repeated, now and then with another payload), operator cancels
(cascading to children), pause / resume of one task, and stale writes (old generations).

Checked after each command: a stale write changes nothing; a fresh park is what the ledger
promises (an event already sent, or children all ended, wake it at once); a send delivers
to exactly the tasks waiting on it. Checked after every step (invariants): the generation
never decreases; a terminal task never changes; a parked task has no holder and no lease;
a ``WAITING`` task waits for what its own park wrote; a parent waiting on children has
``children_left`` equal to the number of the children it waits for that have not ended
(so at least one: a parent whose children all ended is not ``WAITING``); an event
wait's checkpoint is absent while it waits, once written never changes, and holds the
first event after ``after``; one wait is delivered to at most once; and a claim takes a
parked task only once its ``run_at`` has passed (or its last child ended in that claim).

Found by it, kept as a regression test at the end of this file: a child left awaited by
a children wait the parent left (pause, resume) must not count against the parent's next
children wait on another set (``wait_children`` unmarks the parent's other children).

Determinism as in tests/test_state_machine.py: the draws never depend on the ledger, ids
are deterministic, and the ledger clock moves on between steps. The claim's wake-up of due
parked rows is rate-limited per engine by the monotonic clock (``WAKE_EVERY_S``); the test
sets it to 0 so that every claim runs it (else whether a claim wakes a due sleep would
depend on the machine's speed).
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
from ratchet.errors import InvalidArguments
from ratchet.ledger.base import (
    FOREVER,
    Ledger,
    NewTask,
    TaskInfo,
    TaskWrite,
    Transition,
    WaitSpec,
)
from ratchet.ledger.ops import claims as claims_module
from ratchet.serde import digest, dumps, loads
from ratchet.states import CLAIMABLE, PARKED, TERMINAL, State
from ratchet.testing import wait_for

TASK = "wm.task"
HOLDERS = ("w1", "w2", "w3")
MAX_TASKS = 10
EVENTS = (("shipped", "a"), ("shipped", "b"), ("paid", "a"))
"""The (name, key) pairs events are sent to and waited on."""
EVENT_IDS = ("e0", "e1", "e2", "e3", "e4", "e5")
"""Event ids are drawn from a few, so that sends repeat (the same event)."""
STEPS = ("ev:0", "ev:1", "ev:2")
"""Checkpoint names of event waits: a few, reused by later waits of the same task."""
SOON_S = 0.01
"""A deadline 'soon': a handful of steps later (the clock moves CLOCK_TICK_S per step)."""
CLOCK_TICK_S = 0.0015
FINISH = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.RETRY_WAIT, State.PENDING)

SETTINGS = {
    # ~15 s alone (a step is ~3 ms of SQLite work plus the clock tick).
    "sqlite": settings(max_examples=120, stateful_step_count=50, deadline=None,
                       print_blob=True),
    # ~25 s alone: a step is a few dozen round trips.
    "postgresql": settings(max_examples=50, stateful_step_count=40, deadline=None,
                           print_blob=True),
}
"""Hypothesis budget per backend (each well under a minute; conftest's ``ratchet`` profile
sets no deadline and no example database)."""


@dataclasses.dataclass(frozen=True)
class Token:
    """A fencing token handed out by a claim (kept, so it can be replayed stale)."""

    task_id: str
    generation: int
    holder: str


@dataclasses.dataclass(frozen=True)
class Snap:
    """A task as the ledger holds it: its row, its steps (name -> (result, generation))
    and its audit events."""

    info: TaskInfo
    steps: dict[str, tuple[str, int]]
    audit: tuple[Any, ...]

    @property
    def state(self) -> State:
        return State(self.info.state)

    def core(self) -> tuple[Any, ...]:
        """What must not change under a stale write or once terminal (no audit)."""
        return (self.info, tuple(sorted(self.steps.items())))


def _ended(state: Any) -> bool:
    return State(state) in TERMINAL


class WorkflowMachine(RuleBasedStateMachine):
    def __init__(self, ledger: Ledger, release: Callable[[], None]) -> None:
        super().__init__()
        self.ledger = ledger
        self.release = release
        self.task_ids: list[str] = []
        self.parent: dict[str, str | None] = {}
        self.tokens: list[Token] = []
        self.parks: dict[tuple[str, int], tuple[WaitSpec, float]] = {}
        """(task, generation) -> the wait its fresh park wrote (and its run_at)."""
        self.events: dict[str, tuple[str, str, str, int, float]] = {}
        """event id -> (name, key, payload, seq, sent_at)."""
        self.checkpoints: dict[tuple[str, str], tuple[str, int]] = {}
        self.paused: set[str] = set()
        self.gathering: dict[str, tuple[str, ...]] = {}
        """task -> the children its last children wait that parked waited for."""
        self.prev: dict[str, Snap] = {}
        self.counter = 0

    def teardown(self) -> None:
        self.release()

    # ------------------------------------------------------------------ helpers

    def snapshot(self) -> dict[str, Snap]:
        out = {}
        for tid in self.task_ids:
            tl = self.ledger.timeline(tid)
            out[tid] = Snap(tl.task, {s.name: (s.result_json, s.generation) for s in tl.steps},
                            tuple((e.kind, e.generation, e.detail) for e in tl.events))
        return out

    def children_of(self, tid: str) -> list[str]:
        return [c for c in self.task_ids if self.parent[c] == tid]

    def _token(self, pick: int, latest: bool) -> Token | None:
        """A token: with ``latest``, one whose task its holder still runs (when there is
        one), else any (often stale)."""
        if not self.tokens:
            return None
        if latest:
            held = [t for t in self.tokens
                    if (info := self.ledger.get(t.task_id)).state is State.RUNNING
                    and info.generation == t.generation]
            if held:
                return held[pick % len(held)]
        return self.tokens[pick % len(self.tokens)]

    def _first_event(self, name: str, key: str, after: int, since: float
                     ) -> tuple[int, str] | None:
        """The event a wait on (name, key) after ``after`` finds in the mailbox."""
        found = sorted((seq, payload) for (n, k, payload, seq, sent_at) in self.events.values()
                       if (n, k) == (name, key) and seq > after and sent_at >= since)
        return found[0] if found else None

    @invariant()
    def clock_moves_between_steps(self) -> None:
        mark = self.ledger.now()
        wait_for("the ledger clock to move by CLOCK_TICK_S",
                 lambda: self.ledger.now() > mark + CLOCK_TICK_S, timeout_s=10,
                 interval_s=0.0005)

    # ------------------------------------------------------------------ rules

    @initialize(leases=st.lists(st.booleans(), min_size=2, max_size=3))
    def seed(self, leases: list[bool]) -> None:
        for short in leases:
            self.submit(parent_pick=None, short_lease=short, max_attempts=3)

    @rule(parent_pick=st.none() | st.integers(0, 10_000),
          short_lease=st.sampled_from([False, False, True]), max_attempts=st.integers(1, 3))
    def submit(self, parent_pick: int | None, short_lease: bool, max_attempts: int) -> None:
        if len(self.task_ids) >= MAX_TASKS:
            return
        parent = None
        if parent_pick is not None:
            # Mostly from a running parent's body (ctx.submit), else from any task.
            running = [t for t in self.task_ids if self.ledger.get(t).state is State.RUNNING]
            pool = running if running and parent_pick % 4 else self.task_ids
            parent = pool[parent_pick % len(pool)]
        tid = f"task-{len(self.task_ids) + 1:02d}"
        params = dumps({"id": tid})
        before = self.snapshot()
        [result] = self.ledger.submit([NewTask(
            tid, TASK, 1, params, digest(TASK, params), None, max_attempts,
            0.0 if short_lease else 3600.0, parent_id=parent)])
        assert result.created and result.task_id == tid
        self.task_ids.append(tid)
        self.parent[tid] = parent
        info = self.ledger.get(tid)
        assert info.state is State.PENDING and info.parent_id == parent
        after = self.snapshot()
        for other, snap in before.items():
            assert after[other].core() == snap.core()
        if parent is not None:
            event("submit: a child")

    @rule(holder=st.sampled_from(HOLDERS), limit=st.integers(0, 3))
    def claim_more(self, holder: str, limit: int) -> None:
        """Claims come often (a second rule: hypothesis picks rules uniformly)."""
        self.claim(holder, limit)

    @rule(holder=st.sampled_from(HOLDERS), limit=st.integers(0, 3))
    def claim(self, holder: str, limit: int) -> None:
        before = self.snapshot()
        claimed = self.ledger.claim(holder, [TASK], limit)
        now_after = self.ledger.now()
        after = self.snapshot()
        assert len(claimed) <= max(limit, 0)
        for c in claimed:
            b = before[c.task_id]
            if b.state in PARKED:
                # Woken in this claim's transaction: by its wake-up, only once its run_at
                # has passed; or by the fan-in, its last child retired by this claim.
                if self._children_ended(c.task_id, before, after):
                    event("claim: a parent woken by a retired child, and claimed")
                else:
                    assert b.info.run_at <= c.ledger_now, (
                        f"{c.task_id} claimed while {b.state} until {b.info.run_at} "
                        f"(claim at {c.ledger_now})")
                    event(f"claim: a due {b.state} task woken and claimed")
            elif b.state is State.RUNNING:
                assert b.info.lease_until is not None and b.info.lease_until < now_after
                event("claim: takeover")
            else:
                assert b.state in CLAIMABLE, f"{c.task_id} claimed from {b.state}"
            assert c.generation == b.info.generation + 1
            a = after[c.task_id]
            assert a.state is State.RUNNING and a.info.holder == holder
            self.tokens.append(Token(c.task_id, c.generation, holder))
        ids = {c.task_id for c in claimed}
        for tid, b in before.items():
            a = after[tid]
            if tid in ids or a.core() == b.core():
                continue
            if b.state in PARKED and a.state is State.PENDING:
                if self._children_ended(tid, before, after):
                    event("claim: a parent woken by a retired child")
                else:
                    assert b.info.run_at <= now_after, f"{tid} woken before its run_at"
                    event("claim: a due parked task woken, not claimed")
            elif b.state is State.RUNNING:
                # An expired lease the claim did not take over: a final attempt retired
                # (FAILED / UNKNOWN), or an operator's request applied (PAUSED, CANCELLED).
                assert b.info.lease_until is not None and b.info.lease_until < now_after
                assert a.info.generation == b.info.generation + 1 and a.info.holder is None
                event(f"claim: an expired lease ended {a.state}")
            else:
                raise AssertionError(f"{tid} moved by a claim: {b.info} -> {a.info}")

    def _children_ended(self, tid: str, before: dict[str, Snap], after: dict[str, Snap]
                        ) -> bool:
        """``tid`` was WAITING on children, and every one of them has ended now."""
        b = before[tid]
        if b.state is not State.WAITING:
            return False
        spec, _ = self.parks[(tid, b.info.generation)]
        return spec.kind == "children" and all(_ended(after[c].state) for c in spec.children)

    @rule(pick=st.integers(0, 10_000), latest=st.booleans(),
          shift=st.sampled_from([0, 0, 0, -1]),
          kind=st.sampled_from(["sleep", "event", "children", "compensate"]),
          when=st.sampled_from(["now", "soon", "forever"]),
          ev=st.sampled_from(EVENTS), step=st.integers(0, len(STEPS) - 1),
          after=st.sampled_from(["zero", "received", "latest"]),
          subset=st.integers(0, 255))
    def park(self, pick: int, latest: bool, shift: int, kind: str, when: str,
             ev: tuple[str, str], step: int, after: str, subset: int) -> None:
        token = self._token(pick, latest)
        if token is None:
            return
        tid = token.task_id
        generation = token.generation + shift
        now = self.ledger.now()
        run_at = {"now": now, "soon": now + SOON_S, "forever": FOREVER}[when]
        before = self.snapshot()
        b = before[tid]
        if kind == "compensate":
            transition = Transition(State.COMPENSATING)
            spec = None
        else:
            if kind == "sleep":
                spec = WaitSpec("sleep")
            elif kind == "event":
                name, key = ev
                seen = [loads(r)["seq"] for n, (r, _) in b.steps.items()
                        if n in STEPS and self._event_of(loads(r)["seq"])[:2] == (name, key)]
                latest_seq = max((e[3] for e in self.events.values()), default=0)
                after_seq = {"zero": 0, "received": max(seen, default=0),
                             "latest": latest_seq}[after]
                spec = WaitSpec("event", name, key, STEPS[step], step, after_seq)
            else:
                kids = self.children_of(tid)
                chosen = tuple(c for i, c in enumerate(kids) if subset >> i & 1)
                # A random subset of its children (all when the draw picks none; none when
                # it has none) - unless it left a children wait (paused, resumed) before
                # those children ended: then it waits for them again, as the worker's
                # replay does (a wait on another set then is a known bug of the fan-in:
                # test_a_wait_left_by_a_pause_leaves_its_children_counted below).
                gathered = self.gathering.get(tid)
                if gathered and not all(_ended(before[c].state) for c in gathered):
                    chosen = gathered
                spec = WaitSpec("children", children=chosen or tuple(kids))
                run_at = FOREVER  # as ctx.gather parks
            transition = Transition(State.WAITING, run_at=run_at, wait=spec)
        [outcome] = self.ledger.commit([TaskWrite(tid, generation, token.holder,
                                                  f"park:{kind}", transition=transition)])
        snaps = self.snapshot()
        a = snaps[tid]
        if b.state is transition.to and b.info.generation == generation:
            assert outcome.ok and not outcome.stale  # a re-send: acknowledged
            assert a.core() == b.core()
            return
        if b.state is not State.RUNNING or b.info.generation != generation:
            assert outcome.stale and not outcome.ok
            assert a.core() == b.core(), "a stale park changed the task"
            event("park: stale write rejected")
            return
        assert outcome.ok and not outcome.stale
        assert a.info.generation == generation
        assert a.info.holder is None and a.info.lease_until is None
        if outcome.current_state is not None:  # arbitrated: an operator's request won
            assert a.state is outcome.current_state
            event(f"park: arbitrated to {outcome.current_state}")
            return
        if kind == "compensate":
            assert a.state is State.COMPENSATING and a.info.attempt == 0
            event("park: compensating")
            return
        assert spec is not None
        self.parks[(tid, generation)] = (spec, run_at)
        if spec.kind == "sleep":
            assert a.state is State.WAITING
            if run_at > self.ledger.now():
                assert a.info.run_at == pytest.approx(run_at, abs=1e-3)
            else:  # a deadline already passed keeps an earlier run_at: due either way
                assert a.info.run_at <= run_at + 1e-3
            event(f"park: sleep {when}")
        elif spec.kind == "event":
            assert spec.step is not None and spec.name is not None and spec.key is not None
            found = self._first_event(spec.name, spec.key, spec.after, b.info.created_at)
            if spec.step in b.steps:
                # Its checkpoint is there already (an earlier wait of that name): done.
                assert a.state is State.PENDING
                assert a.steps[spec.step] == b.steps[spec.step]
                event("park: event wait whose checkpoint exists")
            elif found is not None:
                assert a.state is State.PENDING
                result, gen = a.steps[spec.step]
                assert gen == generation
                assert loads(result) == {"seq": found[0], "payload": loads(found[1])}
                event("park: event already in the mailbox")
            else:
                assert a.state is State.WAITING
                event("park: event wait")
        else:
            left = [c for c in spec.children if not _ended(before[c].state)]
            if left:
                self.gathering[tid] = spec.children
                assert a.state is State.WAITING
                [w] = self.ledger.waits([tid])
                assert w.kind == "children" and w.children_left == len(left)
                event("park: children wait")
            else:
                assert a.state is State.PENDING
                event("park: children all ended")
        for other, snap in before.items():
            if other != tid:
                assert snaps[other].core() == snap.core(), f"{other} changed by a park"

    @rule(pick=st.integers(0, 10_000),
          kind=st.sampled_from(["sleep", "event", "event", "children", "children"]),
          when=st.sampled_from(["now", "soon", "forever"]),
          ev=st.sampled_from(EVENTS), step=st.integers(0, len(STEPS) - 1),
          after=st.sampled_from(["zero", "received", "latest"]),
          subset=st.integers(0, 255))
    def park_current(self, pick: int, kind: str, when: str, ev: tuple[str, str], step: int,
                     after: str, subset: int) -> None:
        """A holder that still runs its task parks it (waits come often)."""
        self.park(pick, True, 0, kind, when, ev, step, after, subset)

    def _event_of(self, seq: int) -> tuple[str, str, str]:
        for name, key, payload, s, _ in self.events.values():
            if s == seq:
                return name, key, payload
        raise AssertionError(f"a checkpoint names event seq {seq}, never sent")

    @rule(pick=st.integers(0, 10_000), ending=st.sampled_from(FINISH))
    def finish_awaited_child(self, pick: int, ending: State) -> None:
        """The holder of a child whose parent waits on children ends it (the fan-in)."""
        held = [t for t in self.tokens
                if (info := self.ledger.get(t.task_id)).state is State.RUNNING
                and info.generation == t.generation and (parent := self.parent[t.task_id])
                and self.ledger.get(parent).state is State.WAITING]
        if held:
            self.finish(pick, True, 0, ending, held[pick % len(held)])

    @rule(pick=st.integers(0, 10_000), latest=st.sampled_from([True, True, False]),
          shift=st.sampled_from([0, 0, 0, -1]), ending=st.sampled_from(FINISH))
    def finish(self, pick: int, latest: bool, shift: int, ending: State,
               token: Token | None = None) -> None:
        """A holder ends its task (children among them): success, failure, cancel, retry
        or release."""
        token = token or self._token(pick, latest)
        if token is None:
            return
        tid = token.task_id
        generation = token.generation + shift
        self.counter += 1
        t = Transition(ending, result_json=dumps(self.counter)
                       if ending is State.SUCCEEDED else None,
                       error="boom" if ending in (State.FAILED, State.RETRY_WAIT) else None)
        before = self.snapshot()
        b = before[tid]
        [outcome] = self.ledger.commit([TaskWrite(tid, generation, token.holder,
                                                  f"finish:{ending}", transition=t)])
        after = self.snapshot()
        a = after[tid]
        fresh = b.state is State.RUNNING and b.info.generation == generation
        if not fresh:
            assert outcome.ok is (b.state is ending and b.info.generation == generation)
            assert a.core() == b.core()
            event("finish: stale or re-sent write")
            return
        assert outcome.ok and not outcome.stale
        assert a.state is (outcome.current_state or ending)
        event(f"finish: {a.state}" + (" (a child)" if self.parent[tid] else ""))
        # Only its parent may move with it (the fan-in wake-up).
        parent = self.parent[tid]
        for other, snap in before.items():
            if other == tid or after[other].core() == snap.core():
                continue
            assert other == parent and _ended(a.state), f"{other} moved by {tid}'s end"
            assert snap.state is State.WAITING and after[other].state is State.PENDING
            assert self._children_ended(other, before, after), (
                f"{other} woken by {tid}'s end, but children it waits for have not ended")
            event("finish: the last awaited child woke its parent")

    @rule(ev=st.sampled_from(EVENTS), eid=st.none() | st.sampled_from(EVENT_IDS),
          other_payload=st.sampled_from([False, False, False, True]))
    def send_event(self, ev: tuple[str, str], eid: str | None, other_payload: bool) -> None:
        name, key = ev
        known = self.events.get(eid) if eid is not None else None
        if known is not None:
            name, key = known[0], known[1]  # the same event again
        self.counter += 1
        # An id sent again carries its payload, or (other_payload) another one: refused.
        payload = dumps({"event": eid or self.counter,
                         "other": other_payload and known is not None})
        before = self.snapshot()
        if known is not None and known[2] != payload:
            with pytest.raises(InvalidArguments):
                self.ledger.send_event(name, key, payload, eid, "tester")
            assert {t: s.core() for t, s in self.snapshot().items()} == {
                t: s.core() for t, s in before.items()}
            event("send_event: an id reused for another payload refused")
            return
        receipt = self.ledger.send_event(name, key, payload, eid, "tester")
        after = self.snapshot()
        if known is not None:
            assert receipt.duplicate and receipt.woken == 0 and receipt.seq == known[3]
            assert {t: s.core() for t, s in after.items()} == {
                t: s.core() for t, s in before.items()}
            event("send_event: duplicate id")
            return
        assert not receipt.duplicate
        assert all(receipt.seq > e[3] for e in self.events.values())
        self.events[receipt.event_id] = (name, key, payload, receipt.seq, receipt.sent_at)
        waiting = []
        for tid, b in before.items():
            if b.state is not State.WAITING:
                continue
            spec, _ = self.parks[(tid, b.info.generation)]
            if spec.kind == "event" and (spec.name, spec.key) == (name, key) \
                    and spec.after < receipt.seq:
                waiting.append(tid)
        assert receipt.woken == len(waiting)
        for tid, b in before.items():
            a = after[tid]
            if tid not in waiting:
                assert a.core() == b.core(), f"{tid} changed by an event not for it"
                continue
            spec, _ = self.parks[(tid, b.info.generation)]
            assert spec.step is not None
            assert a.state is State.PENDING and a.info.generation == b.info.generation
            result, gen = a.steps[spec.step]
            assert gen == b.info.generation
            assert loads(result) == {"seq": receipt.seq, "payload": loads(payload)}
            event("send_event: delivered")

    @rule(pick=st.integers(0, 10_000), skip=st.integers(0, 2))
    def cancel(self, pick: int, skip: int) -> None:
        """An operator's cancel, cascading to the children that have not ended."""
        if skip:  # an operator acts now and then (a third of the draws)
            return
        tid = self.task_ids[pick % len(self.task_ids)]
        before = self.snapshot()
        now = self.ledger.now()
        outcome = self.ledger.cancel(tid, "machine", "tester")
        after = self.snapshot()
        expect: dict[str, str] = {}

        def walk(task: str) -> None:
            b = before[task]
            s = b.state
            gone = (s is State.RUNNING and b.info.lease_until is not None
                    and b.info.lease_until < now)
            if s in TERMINAL or s is State.COMPENSATING:
                expect[task] = "unchanged"
                if s is not State.CANCELLED:
                    return
            elif (s is State.RUNNING and not gone) or s is State.UNKNOWN:
                expect[task] = "requested"
            else:
                expect[task] = "done"
            for child in self.children_of(task):
                if not _ended(before[child].state):
                    walk(child)

        walk(tid)
        assert outcome.outcome == expect[tid]
        for task, what in expect.items():
            b, a = before[task], after[task]
            if what == "done":
                assert a.state is State.CANCELLED
                assert a.info.generation == b.info.generation + 1
                event(f"cancel: {b.state} cancelled" + (" (cascade)" if task != tid else ""))
            else:
                assert a.state is b.state and a.info.generation == b.info.generation
        for task, b in before.items():
            if task in expect or after[task].core() == b.core():
                continue
            # Fan-in: a parent (outside the cascade) woken by a cancelled child.
            assert b.state is State.WAITING and after[task].state is State.PENDING
            assert self._children_ended(task, before, after), (
                f"{task} woken by a cancel, but children it waits for have not ended")
            event("cancel: the last awaited child woke its parent")

    @rule(pick=st.integers(0, 10_000), skip=st.integers(0, 2))
    def pause(self, pick: int, skip: int) -> None:
        if skip:  # an operator acts now and then (a third of the draws)
            return
        tid = self.task_ids[pick % len(self.task_ids)]
        before = self.snapshot()
        result = self.ledger.pause("task", tid, "machine", "tester")
        after = self.snapshot()
        b, a = before[tid], after[tid]
        if tid in self.paused:
            assert result.outcome == "unchanged" and a.core() == b.core()
            return
        self.paused.add(tid)
        if b.state in (State.PENDING, State.RETRY_WAIT, State.WAITING):
            assert a.state is State.PAUSED and a.info.generation == b.info.generation + 1
            event(f"pause: {b.state} paused")
        else:
            assert a.state is b.state and a.info.generation == b.info.generation
        for other, snap in before.items():
            if other != tid:
                assert after[other].core() == snap.core()

    @rule(pick=st.integers(0, 10_000))
    def resume(self, pick: int) -> None:
        if not self.paused:
            return
        ordered = sorted(self.paused)
        tid = ordered[pick % len(ordered)]
        before = self.snapshot()
        self.ledger.resume("task", tid, "machine", "tester")
        self.paused.discard(tid)
        after = self.snapshot()
        b, a = before[tid], after[tid]
        if b.state is State.PAUSED:
            assert a.state is State.PENDING
            event("resume: PAUSED -> PENDING")
        else:
            assert a.state is b.state and a.info.generation == b.info.generation

    # ------------------------------------------------------------------ invariants

    @invariant()
    def workflow_invariants(self) -> None:
        now = self.snapshot()
        waits = {w.task_id: w for w in self.ledger.waits(self.task_ids)}
        for tid, snap in now.items():
            info = snap.info
            old = self.prev.get(tid)
            if old is not None:
                assert info.generation >= old.info.generation, "generation went backwards"
                if old.state in TERMINAL:
                    assert snap.core() == old.core(), f"terminal task {tid} changed"
            if snap.state in PARKED:
                assert info.holder is None and info.lease_until is None, (
                    f"{tid} is {snap.state} with a holder or a lease")
            if snap.state is State.WAITING:
                assert (tid, info.generation) in self.parks, (
                    f"{tid} is WAITING at generation {info.generation}, which never parked")
                spec, _ = self.parks[(tid, info.generation)]
                w = waits[tid]
                assert w.kind == spec.kind
                if spec.kind == "children":
                    left = [c for c in spec.children if not _ended(now[c].state)]
                    assert left, f"{tid} still WAITING although its children all ended"
                    assert w.children_left == len(left), (
                        f"{tid} waits for {w.children_left} children, but "
                        f"{len(left)} of those it waits for have not ended: {left}")
                if spec.kind == "event":
                    assert spec.step not in snap.steps, (
                        f"{tid} WAITING with its wait's checkpoint {spec.step} written")
            # Event checkpoints: once written, never changed; the first event after the
            # wait's `after`, of the wait's (name, key).
            for name, (result, gen) in snap.steps.items():
                if name not in STEPS:
                    continue
                seen = self.checkpoints.get((tid, name))
                if seen is not None:
                    assert seen == (result, gen), f"checkpoint {tid}/{name} changed"
                    continue
                self.checkpoints[(tid, name)] = (result, gen)
                spec, _ = self.parks[(tid, gen)]
                assert spec.kind == "event" and spec.step == name
                value = loads(result)
                ev_name, ev_key, payload = self._event_of(value["seq"])
                assert (ev_name, ev_key) == (spec.name, spec.key)
                assert value["seq"] > spec.after and value["payload"] == loads(payload)
            # One wait (one generation) is delivered to at most once.
            deliveries = [g for kind, g, detail in snap.audit
                          if kind == "event_delivered"
                          or (kind == "wake" and detail.get("cause") == "event already sent")]
            assert len(deliveries) == len(set(deliveries)), (
                f"{tid}: one wait delivered to twice: {deliveries}")
        self.prev = now


# ---------------------------------------------------------------------- stores per backend


@contextmanager
def _sqlite_machines(tmp_path: Path) -> Iterator[Callable[[], WorkflowMachine]]:
    numbers = itertools.count()

    def make() -> WorkflowMachine:
        path = tmp_path / f"example-{next(numbers)}.db"
        ledger = open_ledger(f"sqlite:///{path}?durability=buffered")

        def release() -> None:
            ledger.close()
            path.unlink(missing_ok=True)

        return WorkflowMachine(ledger, release)

    yield make


@contextmanager
def _postgres_machines() -> Iterator[Callable[[], WorkflowMachine]]:
    """One private schema and one open ledger for the whole test; every example starts on
    emptied tables (RESTART IDENTITY: event seqs restart too)."""
    import psycopg
    from psycopg import sql

    with private_schema("rt_wm") as (url, schema):
        ledger = open_ledger(url)
        admin = psycopg.connect(pg_base_url(), autocommit=True)
        try:
            rows = admin.execute(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = %s AND table_type = 'BASE TABLE'", (schema,)).fetchall()
            tables = sorted(str(r[0]) for r in rows
                            if "version" not in str(r[0]) and "migration" not in str(r[0]))
            assert "tasks" in tables and "events" in tables, tables
            truncate = sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(schema, t) for t in tables))

            def make() -> WorkflowMachine:
                admin.execute(truncate)
                return WorkflowMachine(ledger, lambda: None)

            yield make
        finally:
            admin.close()
            ledger.close()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_workflow_state_machine(backend: str, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Random interleavings of waits, events, children, cancels and pauses keep every
    workflow guarantee of the ledger, on each backend."""
    monkeypatch.setattr(claims_module, "WAKE_EVERY_S", 0.0)
    machines = _sqlite_machines(tmp_path) if backend == "sqlite" else _postgres_machines()
    with machines as make:
        run_state_machine_as_test(make, settings=SETTINGS[backend])


# ---------------------------------------------------------------------- regressions


def _park_children(ledger: Ledger, task_id: str, generation: int,
                   children: tuple[str, ...]) -> None:
    [outcome] = ledger.commit([TaskWrite(task_id, generation, "w1", "gather", transition=(
        Transition(State.WAITING, run_at=FOREVER, wait=WaitSpec("children",
                                                                 children=children))))])
    assert outcome.ok and not outcome.stale and outcome.current_state is None


def test_a_wait_left_by_a_pause_leaves_its_children_counted(ledger_url: str) -> None:
    ledger = open_ledger(ledger_url)
    try:
        for tid, parent in (("p", None), ("c1", "p"), ("c2", "p")):
            params = dumps({"id": tid})
            ledger.submit([NewTask(tid, TASK, 1, params, digest(TASK, params), None, 3,
                                   3600.0, parent_id=parent)])
        claimed = {c.task_id: c.generation for c in ledger.claim("w1", [TASK], 10)}
        _park_children(ledger, "p", claimed["p"], ("c1",))  # c1 marked awaited
        ledger.pause("task", "p", "hold", "op")  # WAITING -> PAUSED: the wait is left
        ledger.resume("task", "p", "go", "op")
        [again] = ledger.claim("w1", [TASK], 10)
        _park_children(ledger, "p", again.generation, ("c2",))  # waits for c2 only
        assert ledger.waits(["p"])[0].children_left == 1
        ledger.commit([TaskWrite("c1", claimed["c1"], "w1", "done",
                                 transition=Transition(State.SUCCEEDED, result_json="1"))])
        # c1 is not waited for: the parent still waits for c2, which is RUNNING.
        assert ledger.get("c2").state is State.RUNNING
        assert ledger.get("p").state is State.WAITING
        assert ledger.waits(["p"])[0].children_left == 1
    finally:
        ledger.close()
