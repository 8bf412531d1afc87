"""Speculative claims on PostgreSQL (ledger/ops/claims.py): after a plain claim, the next
claim of the same kinds sends its walk with its reads (``claim_fifo``, checked), one round
trip less. The walk takes nothing once the picture changed, and the claim then decides
from its reads as before: a pause, a concurrency limit, a rate limit, a task with a
priority, an expired lease (takeovers first) and a new queue each keep their rule."""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgsupport import pg_base_url, private_schema, with_params
from psycopg import sql

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.errors import LedgerUnavailable
from ratchet.ledger import pgtx
from ratchet.ledger.base import Claim, ClaimScope, NewTask, TaskWrite, Transition
from ratchet.ledger.engine import LedgerEngine
from ratchet.ledger.records_ops import LimitScope
from ratchet.serde import digest, dumps
from ratchet.states import State
from ratchet.testing import wait_for

NAME = "spec.task"
ONE_SHOT = ("claim_expired+claim_gate+pauses_active+limits_all+claim_flow+claim_fifo"
            "+claim_steps_taken+claim_effects_taken+COMMIT")
"""The statements of a claim in one round trip: its reads, its walk, the steps and effects
of what the walk took that ran before, and COMMIT."""


@pytest.fixture
def ledger() -> Iterator[LedgerEngine]:
    with private_schema("rt_spec") as (url, _schema):
        opened = open_ledger(url)
        assert isinstance(opened, LedgerEngine)
        try:
            yield opened
        finally:
            opened.close()


@pytest.fixture
def url_one() -> Iterator[str]:
    """A ledger URL with one pooled connection."""
    with private_schema("rt_spec") as (url, _schema):
        yield with_params(url, pool_size="1")


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statement groups (round trips) the ledger sends, by their statements' names."""
    sent: list[str] = []
    send = pgtx.PgTx._send

    def spy(self: pgtx.PgTx, *args: Any, **kwargs: Any) -> Any:
        out = send(self, *args, **kwargs)
        sent.append(self.statement)
        return out

    monkeypatch.setattr(pgtx.PgTx, "_send", spy)
    return sent


def _submit(ledger: LedgerEngine, n: int = 1, *, queue: str = "default", priority: int = 0,
            lease_s: float = 30.0) -> list[str]:
    tasks = []
    for _ in range(n):
        params = dumps({})
        tasks.append(NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), None, 3,
                             lease_s, queue=queue, priority=priority))
        # One at a time: created (and run_at) in submission order.
        ledger.submit(tasks[-1:])
    return [t.task_id for t in tasks]


def _claim(ledger: LedgerEngine, limit: int, holder: str = "h1") -> list[Claim]:
    return ledger.claim(holder, [NAME], limit)


def _no_wake_up(ledger: LedgerEngine) -> None:
    """Put the wake-up of parked tasks (a claim's extra reads, at most every 50 ms) off, so
    that the round trips counted do not depend on the machine's speed."""
    ledger._claims._next_wake = float("inf")


def _after_a_plain_claim(ledger: LedgerEngine) -> list[str]:
    """Three tasks submitted, the first claimed by a plain claim (the next claim alone goes
    in one round trip); their ids."""
    ids = _submit(ledger, 3)
    _no_wake_up(ledger)
    assert [c.task_id for c in _claim(ledger, 1)] == ids[:1]
    return ids


def test_a_claim_after_a_plain_one_takes_its_walk_with_its_reads(
    ledger: LedgerEngine, groups: list[str]
) -> None:
    ids = _submit(ledger, 3)
    _no_wake_up(ledger)
    assert [c.task_id for c in _claim(ledger, 1)] == ids[:1]
    groups.clear()
    assert [c.task_id for c in _claim(ledger, 1)] == ids[1:2]
    # The whole transaction in one round trip: BEGIN, the reads, the walk (which writes its
    # own audit rows) and COMMIT in one string.
    assert groups == [ONE_SHOT], groups
    (info,) = [ledger.get(ids[1])]
    assert info.state is State.RUNNING and info.holder == "h1"
    # Audited as a claim written by the engine is: one row, with the attempt and lease.
    (event,) = [e for e in ledger.timeline(ids[1]).events if e.kind == "claim"]
    assert (event.from_state, event.to_state, event.generation, event.holder) == (
        "PENDING", "RUNNING", 1, "h1")
    assert event.detail == {"attempt": 1, "lease_s": 30.0}
    # The picture changed (a second queue): the claim after a failed check decides from
    # fresh reads in a transaction of its own, and the one after it is whole again.
    (other,) = _submit(ledger, 1, queue="other")
    groups.clear()
    assert [c.task_id for c in _claim(ledger, 5)] == [ids[2], other]
    reads = "claim_expired+claim_gate+pauses_active+limits_all+claim_flow"
    assert groups == [ONE_SHOT,  # took the default queue's task
                      reads, "claim_fifo", "audit_insert+COMMIT"], groups  # then the rest
    groups.clear()
    assert _claim(ledger, 5) == []
    assert groups == [ONE_SHOT], groups


def test_a_commit_and_claim_after_a_plain_claim_takes_two_round_trips(
    ledger: LedgerEngine, groups: list[str]
) -> None:
    ids = _submit(ledger, 3)
    _no_wake_up(ledger)
    (first,) = _claim(ledger, 1)
    groups.clear()
    outcomes, claims = ledger.commit_and_claim(
        [TaskWrite(first.task_id, first.generation, "h1", "complete",
                   transition=Transition(State.SUCCEEDED, result_json=dumps(None)))],
        "h1", [NAME], 5)
    assert [o.ok for o in outcomes] == [True]
    assert [c.task_id for c in claims] == ids[1:]
    # The fence read with the claim's reads and walk; the writes, the audit and COMMIT.
    assert len(groups) == 2 and groups[0].endswith("+claim_fifo"), groups
    assert groups[1].endswith("+COMMIT"), groups
    kinds = [e.kind for i in ids[1:] for e in ledger.timeline(i).events]
    assert kinds.count("claim") == 2, kinds


def _speculated(groups: list[str]) -> bool:
    return any((g.startswith("claim_expired+") and g.endswith("+claim_fifo")) or g == ONE_SHOT
               for g in groups)


def test_a_pause_after_a_plain_claim_stops_the_next(
    ledger: LedgerEngine, groups: list[str]
) -> None:
    ids = _submit(ledger, 2)
    assert len(_claim(ledger, 1)) == 1
    ledger.pause("type", NAME, "test", "op")
    groups.clear()
    assert _claim(ledger, 5) == []
    assert _speculated(groups), groups  # sent, and it took nothing
    assert ledger.get(ids[1]).state is State.PENDING
    ledger.resume("type", NAME, "test", "op")
    assert [c.task_id for c in _claim(ledger, 5)] == ids[1:]


def test_a_limit_set_after_a_plain_claim_holds(ledger: LedgerEngine) -> None:
    ids = _submit(ledger, 3)
    assert len(_claim(ledger, 1)) == 1
    ledger.set_limit(LimitScope.TYPE, NAME, 0, 1, "op", "test")
    assert _claim(ledger, 5) == []  # the one slot is taken
    assert {ledger.get(i).state for i in ids[1:]} == {State.PENDING}


def test_a_prioritised_task_goes_first_after_a_plain_claim(ledger: LedgerEngine) -> None:
    _submit(ledger, 3)
    assert len(_claim(ledger, 1)) == 1
    (urgent,) = _submit(ledger, 1, priority=5)
    assert [c.task_id for c in _claim(ledger, 1)] == [urgent]


def test_a_new_queue_is_claimed_after_a_plain_claim(ledger: LedgerEngine) -> None:
    ids = _submit(ledger, 2)
    assert len(_claim(ledger, 1)) == 1
    (other,) = _submit(ledger, 1, queue="q2")
    assert {c.task_id for c in _claim(ledger, 5)} == {ids[1], other}


def test_a_rate_limit_set_after_a_plain_claim_holds(ledger: LedgerEngine) -> None:
    _submit(ledger, 6)
    assert len(_claim(ledger, 1)) == 1
    ledger.set_rate_limit(NAME, 0.001, 2, None, "op", "test")
    assert len(_claim(ledger, 5)) <= 2
    assert _claim(ledger, 5) == []


def test_an_expired_lease_is_taken_over_before_fresh_work(
    ledger: LedgerEngine, groups: list[str]
) -> None:
    (short,) = _submit(ledger, 1, lease_s=1.0)
    fresh = _submit(ledger, 2)
    (first,) = _claim(ledger, 1, holder="dead")
    assert first.task_id == short
    assert [c.task_id for c in _claim(ledger, 1)] == fresh[:1]  # a plain claim
    wait_for("the lease to expire on the ledger clock",
             lambda: ledger.now() > first.lease_until or None, timeout_s=30)
    groups.clear()
    (taken,) = _claim(ledger, 1)
    assert _speculated(groups), groups
    assert taken.task_id == short and taken.takeover
    assert ledger.get(fresh[1]).state is State.PENDING


@pytest.mark.parametrize("where", ["queue", "version"])
def test_an_expired_lease_the_claim_does_not_take_never_stops_it(
    ledger: LedgerEngine, groups: list[str], where: str
) -> None:
    """An expired lease of the same name in a queue this worker does not serve, or of a
    version it does not claim: not its takeover, so its speculative walk and its reads
    agree that the picture is plain, and every claim takes its ready work."""
    params = dumps({})
    version = 1 if where == "queue" else 2
    scope = ClaimScope(queues=("default",)) if where == "queue" else None
    kinds: list[Any] = [NAME] if where == "queue" else [(NAME, 2)]
    other = NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), None, 3, 1.0,
                    queue="q2" if where == "queue" else "default")
    ledger.submit([other])
    (dead,) = ledger.claim("dead", [NAME] if where == "queue" else [(NAME, 1)], 1,
                           ClaimScope(queues=("q2",)) if where == "queue" else None)
    mine = []
    for _ in range(4):
        mine.append(NewTask(new_task_id(), NAME, version, params, digest(NAME, params), None,
                            3, 30.0))
        ledger.submit(mine[-1:])
    wait_for("the lease to expire on the ledger clock",
             lambda: ledger.now() > dead.lease_until or None, timeout_s=30)
    groups.clear()
    taken = [c.task_id for _ in range(4) for c in ledger.claim("h1", kinds, 1, scope)]
    assert taken == [t.task_id for t in mine]
    assert _speculated(groups), groups
    assert ledger.get(other.task_id).state is State.RUNNING  # still the dead holder's


@pytest.mark.parametrize("via", ["claim", "commit_and_claim"])
@pytest.mark.parametrize("scope", ["type", "all"])
def test_a_resume_between_the_reads_and_the_walk_loses_no_claimed_task(
    ledger: LedgerEngine, scope: str, via: str
) -> None:
    """The reads see a pause, a resume commits, then the speculative walk (after it, in
    the same round trip) sees none and claims: what it claimed is returned, never left
    RUNNING unseen. The window is held open by locking ``task_queues``, which the claim's
    ``claim_flow`` read (between the pause read and the walk) must wait for. A claim alone
    sends it all with COMMIT; a commit's claim decides in the same transaction."""
    ids = _submit(ledger, 3)
    assert [c.task_id for c in _claim(ledger, 1)] == ids[:1]
    ledger.pause(scope, NAME if scope == "type" else "*", "test", "op")
    schema = ledger.dialect.schema
    base = pg_base_url()
    got: list[list[Claim]] = []
    with psycopg.connect(base) as blocker:
        blocker.execute(sql.SQL("LOCK TABLE {}.task_queues IN ACCESS EXCLUSIVE MODE")
                        .format(sql.Identifier(schema)))
        claimer = threading.Thread(target=lambda: got.append(
            _claim(ledger, 1) if via == "claim"
            else ledger.commit_and_claim([], "h1", [NAME], 1)[1]))
        claimer.start()
        with psycopg.connect(base, autocommit=True) as watch:
            wait_for("the claim waiting on task_queues", lambda: watch.execute(
                "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE NOT l.granted AND c.relname = 'task_queues' AND n.nspname = %s",
                (schema,)).fetchone(), timeout_s=20)
            # The resume's row update (Control.resume would wait on the lock too).
            watch.execute(sql.SQL("UPDATE {}.pauses SET resumed_at = extract(epoch FROM "
                                  "now()), resumed_by = 'op' WHERE resumed_at IS NULL")
                          .format(sql.Identifier(schema)))
        blocker.commit()
    claimer.join(20)
    (claims,) = got
    running = [i for i in ids[1:] if ledger.get(i).state is State.RUNNING]
    assert [c.task_id for c in claims] == running  # all it claimed, and only that


def test_a_resumed_task_comes_with_its_steps_in_the_one_round_trip(
    ledger: LedgerEngine, groups: list[str]
) -> None:
    """A task claimed again (a retry: generation 2) needs its steps and effects; a claim
    in one round trip reads them in its own string, after its walk."""
    (task,) = _submit(ledger, 1)
    _no_wake_up(ledger)
    (first,) = _claim(ledger, 1)
    (outcome,) = ledger.commit([TaskWrite(
        task, first.generation, "h1", "retry", steps=[("s1", dumps(1), 0)],
        effects=[], transition=Transition(State.RETRY_WAIT, delay_s=0.0, error="boom"))])
    assert outcome.ok
    groups.clear()
    (again,) = _claim(ledger, 1)
    assert groups == [ONE_SHOT], groups
    assert (again.task_id, again.generation) == (task, 2)
    assert set(again.steps) == {"s1"} and again.steps["s1"].result_json == dumps(1)


def test_what_one_round_trip_claimed_is_returned_when_the_rest_fails(
    ledger: LedgerEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one round trip committed its claims; the transaction for the rest (a new queue
    here) fails: the committed claims are still returned, never left RUNNING unseen."""
    ids = _submit(ledger, 2)
    _no_wake_up(ledger)
    assert [c.task_id for c in _claim(ledger, 1)] == ids[:1]
    (other,) = _submit(ledger, 1, queue="other")

    def down(body: Any) -> Any:
        raise LedgerUnavailable("the server went away")
    monkeypatch.setattr(ledger._claims.core, "run_repairing", down)
    assert [c.task_id for c in _claim(ledger, 5)] == ids[1:]
    monkeypatch.undo()
    assert ledger.get(other).state is State.PENDING  # claimed by the next claim
    assert [c.task_id for c in _claim(ledger, 5)] == [other]


def test_a_pooled_connection_the_server_ended_is_retried_not_unknown(url_one: str) -> None:
    """A claim in one round trip on a pooled connection whose backend the server ended
    while it was idle never began: it is retried on a new connection (not reported as a
    lost COMMIT)."""
    ledger = open_ledger(url_one)
    assert isinstance(ledger, LedgerEngine)
    try:
        ids = _after_a_plain_claim(ledger)
        (pid,) = ledger.dialect.run(
            lambda tx: tx.cur.execute("SELECT pg_backend_pid()").fetchone(), write=False)
        with psycopg.connect(pg_base_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_for("the backend to end", lambda: admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None)
        assert [c.task_id for c in _claim(ledger, 1)] == ids[1:2]
    finally:
        ledger.close()


def test_user_code_in_a_transaction_plans_with_the_default_mode(ledger: LedgerEngine) -> None:
    """The ledger's sessions run its prepared statements on generic plans; a transaction
    step's code gets the server's default (its parameterised queries planned with their
    values)."""
    _submit(ledger, 1)
    _claim(ledger, 1)  # the pooled connection has prepared (and set its mode)

    def body(tx: Any) -> tuple[str, str, str]:
        (ours,) = tx.cur.execute("SHOW plan_cache_mode").fetchone()
        with ledger.dialect.user_connection(tx) as conn:
            (theirs,) = conn.execute("SHOW plan_cache_mode").fetchone()
        (after,) = tx.cur.execute("SHOW plan_cache_mode").fetchone()
        return str(ours), str(theirs), str(after)
    assert ledger.dialect.run(body) == ("force_generic_plan", "auto", "force_generic_plan")


def test_a_one_round_trip_claim_the_server_cancelled_is_retried(ledger: LedgerEngine) -> None:
    """A statement of the one string fails on a live connection (here a cancel while it
    waits on a lock): the server stopped there, before COMMIT, so the claim is retried,
    not reported as a lost COMMIT."""
    ids = _submit(ledger, 2)
    _no_wake_up(ledger)
    assert [c.task_id for c in _claim(ledger, 1)] == ids[:1]
    schema = ledger.dialect.schema
    got: list[list[Claim]] = []
    failed: list[BaseException] = []

    def claim() -> None:
        try:
            got.append(_claim(ledger, 1))
        except BaseException as exc:
            failed.append(exc)

    with psycopg.connect(pg_base_url()) as blocker:
        blocker.execute(sql.SQL("LOCK TABLE {}.task_queues IN ACCESS EXCLUSIVE MODE")
                        .format(sql.Identifier(schema)))
        claimer = threading.Thread(target=claim)
        claimer.start()
        with psycopg.connect(pg_base_url(), autocommit=True) as watch:
            (pid,) = wait_for("the claim waiting on task_queues", lambda: watch.execute(
                "SELECT l.pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE NOT l.granted AND c.relname = 'task_queues' AND n.nspname = %s",
                (schema,)).fetchone(), timeout_s=20)
            watch.execute("SELECT pg_cancel_backend(%s)", (pid,))
        blocker.commit()
    claimer.join(20)
    assert failed == [] and [[c.task_id for c in cs] for cs in got] == [ids[1:]]


def test_a_connection_numbered_past_1024_is_checked(url_one: str) -> None:
    """The check of an idle pooled connection works whatever its descriptor's number
    (select() refuses 1024 and above; a worker may hold that many files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-files limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    ledger = open_ledger(url_one)
    assert isinstance(ledger, LedgerEngine)
    try:
        ids = _after_a_plain_claim(ledger)
        (fd,) = ledger.dialect.run(lambda tx: (tx.conn.pgconn.socket,), write=False)
        assert fd >= 1024
        assert [c.task_id for c in _claim(ledger, 2)] == ids[1:]
    finally:
        ledger.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
