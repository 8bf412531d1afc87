"""The engine's own policies, on both dialects: the re-send after a lost ``COMMIT`` reply.

A lost reply is injected by a dialect wrapper that lets the real transaction commit on the
real ledger and then raises :class:`CommitOutcomeUnknown`, as a dialect does when the
connection drops while ``COMMIT`` is in flight.
"""

from __future__ import annotations

from typing import Any

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.ledger.base import EffectState, EffectWrite, NewTask, TaskWrite, Transition
from ratchet.ledger.dialect import CommitOutcomeUnknown, Dialect
from ratchet.ledger.engine import LedgerEngine
from ratchet.serde import digest, dumps
from ratchet.states import State
from ratchet.testing import LedgerProxy

NAME = "engine.task"


def _lose_next_reply(inner: Dialect) -> LedgerProxy:
    """The dialect, wrapped: once ``armed`` is set, the next write transaction commits on the
    real ledger, then its reply is 'lost' (counted in ``lost``)."""
    proxy = LedgerProxy(inner)
    proxy.armed = False  # type: ignore[attr-defined]
    proxy.lost = 0  # type: ignore[attr-defined]

    def lose(result: Any, body: Any, *, write: bool = True,
             **_run_options: Any) -> BaseException | None:
        if proxy.armed and write:  # type: ignore[attr-defined]
            proxy.armed = False  # type: ignore[attr-defined]
            proxy.lost += 1  # type: ignore[attr-defined]
            return CommitOutcomeUnknown("injected: connection lost during COMMIT")
        return None

    proxy.after["run"] = lose
    return proxy


def _task() -> NewTask:
    params = dumps({})
    return NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), None, 3, 30.0)


def test_writes_whose_commit_reply_was_lost_are_resent_and_acknowledged(
    ledger_url: str,
) -> None:
    ledger = open_ledger(ledger_url)
    assert isinstance(ledger, LedgerEngine)
    lossy = _lose_next_reply(ledger.dialect)
    ledger.dialect = lossy
    try:
        ledger.submit([_task(), _task()])
        a, b = ledger.claim("w", [NAME], 2)
        writes = [
            TaskWrite(a.task_id, a.generation, "w", "complete", steps=[("s", dumps(1))],
                      transition=Transition(State.SUCCEEDED, result_json=dumps("ok"))),
            TaskWrite(b.task_id, b.generation, "w", "effect:pay",
                      effects=[EffectWrite("pay", "k-1", "d", EffectState.INTENT)]),
            TaskWrite(b.task_id, b.generation, "w", "retry",
                      transition=Transition(State.RETRY_WAIT, delay_s=60, error="later")),
        ]
        lossy.armed = True
        outcomes = ledger.commit(writes)
        assert lossy.lost == 1
        # Applied by the "lost" transaction: acknowledged, not reported stale.
        assert [(o.ok, o.stale) for o in outcomes] == [(True, False)] * 3
        assert ledger.get(a.task_id).state is State.SUCCEEDED
        assert ledger.get(a.task_id).result == "ok"
        info_b = ledger.timeline(b.task_id)
        assert info_b.task.state is State.RETRY_WAIT
        [effect] = info_b.effects
        assert effect.state is EffectState.INTENT and effect.calls == 1  # not counted twice
        transitions = [e for e in ledger.timeline(a.task_id).events if e.kind == "transition"]
        assert len(transitions) == 1
        assert not [e for e in info_b.events if e.kind == "stale_rejected"]
    finally:
        ledger.close()


def test_commit_and_claim_resends_the_writes_only(ledger_url: str) -> None:
    ledger = open_ledger(ledger_url)
    assert isinstance(ledger, LedgerEngine)
    lossy = _lose_next_reply(ledger.dialect)
    ledger.dialect = lossy
    try:
        ledger.submit([_task(), _task()])
        [a] = ledger.claim("w", [NAME], 1)
        lossy.armed = True
        outcomes, claims = ledger.commit_and_claim(
            [TaskWrite(a.task_id, a.generation, "w", "complete",
                       transition=Transition(State.SUCCEEDED))], "w", [NAME], 1)
        assert [o.ok for o in outcomes] == [True] and claims == []
        # The lost transaction's claim stays leased to "w" (taken over once it expires).
        running = [t for t in ledger.stats().counts[NAME].items() if t[0] == "RUNNING"]
        assert running == [("RUNNING", 1)]
    finally:
        ledger.close()


def test_a_submit_whose_commit_reply_was_lost_is_resent_once(ledger_url: str) -> None:
    """Rows the lost transaction wrote are reported created and not inserted again (task
    ids are unique per NewTask), with and without idempotency keys."""
    ledger = open_ledger(ledger_url)
    assert isinstance(ledger, LedgerEngine)
    lossy = _lose_next_reply(ledger.dialect)
    ledger.dialect = lossy
    try:
        params = dumps({})
        keyed = NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), "k-lost", 3, 30.0)
        batch = [_task(), keyed, _task()]
        lossy.armed = True
        results = ledger.submit(batch)
        assert lossy.lost == 1
        assert [(r.task_id, r.created) for r in results] == [(t.task_id, True) for t in batch]
        assert sorted(t.task_id for t in ledger.get_many([t.task_id for t in batch])) == sorted(
            t.task_id for t in batch)
        assert ledger.stats().counts[NAME]["PENDING"] == 3
        # A later submit of the same key is a duplicate, as always.
        again = ledger.submit([NewTask(new_task_id(), NAME, 1, params, digest(NAME, params),
                                       "k-lost", 3, 30.0)])
        assert [(r.task_id, r.created) for r in again] == [(keyed.task_id, False)]
    finally:
        ledger.close()
