"""The outcome table (ratchet.outcome, DESIGN "Where an attempt ends: the outcome table").

Every combination of the finite facts is walked (itertools.product), the numbers by
hypothesis; each ending is checked against the invariants of DESIGN §3 / §7 and against a
transcription of the rules the worker and the engine applied on their own before the table
(so moving them into one place changed nothing users see), plus explicit rows.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.outcome import RULES, AttemptFacts, Ending, Happened, decide, walk
from ratchet.retry import TIME_LIMIT, FailureClass
from ratchet.states import TERMINAL, State, is_allowed

NOW = 1_700_000_000.0
FAILURES = [None, *FailureClass]
PROPOSALS = [s for s in State if s is not State.RUNNING]
REQUESTS = [None, "cancel", "pause"]
ATTEMPTS = [(1, 1), (1, 3), (2, 3), (3, 3)]
STREAKS = [(0, None), (1, 3), (3, 3), (4, 3), (2, None)]
BUDGETS = [None, NOW - 1.0, NOW + 7.0]


def _reference(f: AttemptFacts) -> tuple[State, str | None, float | None, str | None, bool]:
    """The rules as the worker and the engine applied them before the table:
    ``(state, error_class, run_at, request kept, quarantined)``."""
    reached = bool(f.quarantine_after) and f.streak >= (f.quarantine_after or 0)
    if f.happened is Happened.RETURNED:
        return State.SUCCEEDED, None, None, None, False
    if f.happened in (Happened.RAISED, Happened.TIME_LIMIT):
        failure = FailureClass.TRANSIENT if f.happened is Happened.TIME_LIMIT else f.failure
        assert failure is not None
        cls = f.error_class or (TIME_LIMIT if f.happened is Happened.TIME_LIMIT
                                else failure.value)
        if failure is FailureClass.PERMANENT or f.attempt >= f.max_attempts:
            return (State.UNKNOWN if f.intent_open else State.FAILED), cls, None, None, False
        return State.RETRY_WAIT, cls, f.now + f.delay_s, None, False
    if f.happened is Happened.HOLDER_GONE:  # _apply_requests, _holder_gone, _retire
        if f.request is not None and not f.intent_open:
            target = State.CANCELLED if f.request == "cancel" else State.PAUSED
            return target, {"cancel": "cancelled", "pause": "paused"}[f.request], None, None, False
        if reached or f.attempt >= f.max_attempts:
            target = State.UNKNOWN if f.intent_open else State.FAILED
            return (target, "lease_expired", None,
                    f.request if target is State.UNKNOWN else None,
                    reached and target is State.FAILED)
        return State.RETRY_WAIT, "holder_gone", f.now, f.request, False
    # ASKED: _arbitrate, the pause check, _count_failure, BudgetBook.charge
    assert f.proposed is not None
    to, delay = f.proposed, f.delay_s
    klass: str | None = f.error_class
    request: str | None = None
    replaced = False
    if f.request is not None:
        if to in (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATING,
                  State.COMPENSATED):
            # The holder's terminal outcome (or its own cancel) stands; so does a failure's
            # compensation (a cancel never skips undoing what the task did).
            pass
        elif to is State.UNKNOWN or f.intent_open:
            request = f.request
        else:
            target = State.CANCELLED if f.request == "cancel" else State.PAUSED
            if target is not to:
                to, klass, replaced = target, klass or {"cancel": "cancelled",
                                                    "pause": "paused"}[f.request], True
    if to is State.PAUSED and f.request != "pause" and not f.pause_active:
        to, klass, delay, replaced = State.PENDING, None, 0.0, True
    quarantined = False
    if not replaced and reached and to in (State.RETRY_WAIT, State.FAILED):
        quarantined = True
        if to is State.RETRY_WAIT:
            to = State.UNKNOWN if f.intent_open else State.FAILED
            quarantined = to is State.FAILED
    run_at = f.now + delay if to in (State.RETRY_WAIT, State.PENDING) else None
    if (not replaced and to is State.RETRY_WAIT and f.budget_at is not None
            and run_at is not None and f.budget_at > run_at):
        run_at = f.budget_at
    return to, klass, run_at, request, quarantined


def _all_facts(now: float = NOW, delay: float = 2.5) -> list[AttemptFacts]:
    out = []
    for (happened, failure, intent, proposed, request, pause_active, (attempt, most),
         (streak, after), budget) in itertools.product(
            Happened, FAILURES, [False, True], [None, *PROPOSALS], REQUESTS, [True, False],
            ATTEMPTS, STREAKS, BUDGETS):
        if happened is Happened.RAISED and failure is None:
            continue
        if (happened is Happened.ASKED) != (proposed is not None):
            continue
        out.append(AttemptFacts(
            happened, now=now, failure=failure, attempt=attempt, max_attempts=most,
            delay_s=delay, intent_open=intent, proposed=proposed, request=request,
            pause_active=pause_active, streak=streak, quarantine_after=after,
            budget_at=None if budget is None else budget - NOW + now))
    return out


ALL = _all_facts()


def _check_invariants(f: AttemptFacts, e: Ending) -> None:
    # Only a returned body succeeds; a failure never ends SUCCEEDED.
    assert (e.state is State.SUCCEEDED) == (
        f.happened is Happened.RETURNED
        or (f.happened is Happened.ASKED and f.proposed is State.SUCCEEDED))
    # Every ending is a legal move out of RUNNING (DESIGN §3).
    assert is_allowed(State.RUNNING, e.state)
    # run_at: when claimable again, never before now; only for RETRY_WAIT / PENDING.
    if e.state in (State.RETRY_WAIT, State.PENDING):
        assert e.run_at is not None and e.run_at >= f.now
    else:
        assert e.run_at is None
    # A quarantined task is a FAILED one; quarantine needs the streak at its threshold.
    if e.quarantined:
        assert e.state is State.FAILED and f.quarantine_after is not None
        assert f.streak >= f.quarantine_after
    # An open intent: the call may have happened. No dead-letter or operator stop hides it,
    # unless the holder itself asked for that state (its own knowledge).
    if f.intent_open and f.happened is not Happened.ASKED:
        assert e.state not in (State.FAILED, State.CANCELLED, State.PAUSED)
    if f.intent_open and f.happened is Happened.ASKED and e.state is not f.proposed:
        assert e.state not in (State.FAILED, State.CANCELLED, State.PAUSED)
    # A worker's failure never ends silently: final -> FAILED/UNKNOWN, else a retry.
    if f.happened in (Happened.RAISED, Happened.TIME_LIMIT):
        assert e.state in (State.FAILED, State.UNKNOWN, State.RETRY_WAIT)
        assert e.error_class is not None
        if e.state is State.RETRY_WAIT:
            assert f.attempt < f.max_attempts
            assert f.failure is not FailureClass.PERMANENT or f.happened is Happened.TIME_LIMIT
    # A request is kept only where it can still apply: UNKNOWN (the resolution applies
    # it) or a task an open intent holds for the next holder; never on a terminal state.
    if e.request is not None:
        assert e.state not in TERMINAL and e.request == f.request
        assert e.state is State.UNKNOWN or f.intent_open
    # The operator's cancel wins over a release, a retry, a pause, quarantine and the budget
    # (nothing in flight, outcome not terminal yet).
    if (f.request == "cancel" and not f.intent_open and (
            f.happened is Happened.HOLDER_GONE
            or (f.happened is Happened.ASKED
                and f.proposed in (State.PENDING, State.RETRY_WAIT, State.PAUSED)))):
        assert e.state is State.CANCELLED and e.error_class
    # A terminal outcome the holder committed first stands against any request.
    if f.happened is Happened.ASKED and f.proposed in (State.SUCCEEDED, State.CANCELLED):
        assert e.state is f.proposed
    # The budget only ever delays a retry.
    if f.budget_at is not None and e.state is State.RETRY_WAIT:
        without = decide(dataclasses.replace(f, budget_at=None))
        assert without.run_at is not None and e.run_at is not None
        assert e.run_at >= without.run_at
    # The ledger's endings of a holder gone always record why.
    if f.happened is Happened.HOLDER_GONE:
        assert e.error_class is not None


def test_every_combination_matches_the_rules_and_invariants() -> None:
    assert len(ALL) > 10_000
    for f in ALL:
        e = decide(f)
        _check_invariants(f, e)
        assert (e.state, e.error_class, e.run_at, e.request, e.quarantined) == _reference(f), f
        assert decide(f) == e  # pure
        assert walk(f) == e  # the shortcut for the common final write is exact


@given(now=st.floats(min_value=0.0, max_value=4e9, allow_nan=False),
       delay=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
       index=st.integers(min_value=0, max_value=len(ALL) - 1))
def test_numbers(now: float, delay: float, index: int) -> None:
    base = ALL[index]
    budget = None if base.budget_at is None else base.budget_at - NOW + now
    f = dataclasses.replace(base, now=now, delay_s=delay, budget_at=budget)
    e = decide(f)
    _check_invariants(f, e)
    assert (e.state, e.error_class, e.run_at, e.request, e.quarantined) == _reference(f)


def test_every_rule_is_reachable_and_named_once() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert all(r.reason for r in RULES)
    fired = {name for f in ALL for name in decide(f).rules}
    assert fired == set(names)


def _raised(failure: FailureClass, attempt: int = 1, most: int = 3, intent: bool = False,
            **kw: object) -> Ending:
    return decide(AttemptFacts(Happened.RAISED, failure=failure, attempt=attempt,
                               max_attempts=most, intent_open=intent, **kw))  # type: ignore[arg-type]


def _asked(proposed: State, **kw: object) -> Ending:
    return decide(AttemptFacts(Happened.ASKED, now=NOW, proposed=proposed, **kw))  # type: ignore[arg-type]


def _gone(**kw: object) -> Ending:
    return decide(AttemptFacts(Happened.HOLDER_GONE, now=NOW, **kw))  # type: ignore[arg-type]


def test_rows() -> None:
    assert decide(AttemptFacts(Happened.RETURNED)).state is State.SUCCEEDED
    # worker's half
    e = _raised(FailureClass.TRANSIENT, delay_s=4.0)
    assert (e.state, e.error_class, e.run_at) == (State.RETRY_WAIT, "transient", 4.0)
    assert _raised(FailureClass.OVERLOAD).error_class == "overload"
    assert _raised(FailureClass.UNKNOWN_OUTCOME).state is State.RETRY_WAIT
    assert _raised(FailureClass.PERMANENT).state is State.FAILED
    assert _raised(FailureClass.PERMANENT, intent=True).state is State.UNKNOWN
    assert _raised(FailureClass.TRANSIENT, 3, 3).state is State.FAILED
    assert _raised(FailureClass.TRANSIENT, 3, 3, True).state is State.UNKNOWN
    # a transient failure with an open intent and attempts left retries: the next holder
    # looks the key up before anything else (DESIGN §5)
    assert _raised(FailureClass.TRANSIENT, intent=True).state is State.RETRY_WAIT
    assert _raised(FailureClass.PERMANENT, error_class="undecodable").error_class == "undecodable"
    e = decide(AttemptFacts(Happened.TIME_LIMIT, attempt=1, max_attempts=2, delay_s=1.0))
    assert (e.state, e.error_class) == (State.RETRY_WAIT, TIME_LIMIT)
    e = decide(AttemptFacts(Happened.TIME_LIMIT, attempt=2, max_attempts=2, intent_open=True))
    assert (e.state, e.error_class) == (State.UNKNOWN, TIME_LIMIT)
    with pytest.raises(ValueError):
        decide(AttemptFacts(Happened.RAISED))
    # arbitration
    assert _asked(State.RETRY_WAIT, request="cancel").state is State.CANCELLED
    assert _asked(State.RETRY_WAIT, request="cancel").error_class == "cancelled"
    assert _asked(State.PAUSED, request="cancel").state is State.CANCELLED  # cancel wins
    assert _asked(State.PENDING, request="pause").state is State.PAUSED
    e = _asked(State.RETRY_WAIT, request="cancel", intent_open=True, delay_s=3.0)
    assert (e.state, e.request, e.run_at) == (State.RETRY_WAIT, "cancel", NOW + 3.0)
    e = _asked(State.SUCCEEDED, request="cancel")
    assert (e.state, e.request, e.rules[-1]) == (State.SUCCEEDED, None, "request_dropped")
    assert _asked(State.UNKNOWN, request="pause").request == "pause"
    assert _asked(State.CANCELLED, request="cancel").rules == ("cancel_applied",)
    # a pause lifted before the boundary: released
    e = _asked(State.PAUSED, pause_active=False)
    assert (e.state, e.run_at, e.replaced) == (State.PENDING, NOW, True)
    assert _asked(State.PAUSED, request="pause", pause_active=False).state is State.PAUSED
    # quarantine
    e = _asked(State.RETRY_WAIT, streak=3, quarantine_after=3, delay_s=2.0)
    assert (e.state, e.run_at, e.quarantined) == (State.FAILED, None, True)
    e = _asked(State.RETRY_WAIT, streak=3, quarantine_after=3, intent_open=True)
    assert (e.state, e.quarantined) == (State.UNKNOWN, False)
    assert _asked(State.FAILED, streak=5, quarantine_after=3).quarantined
    assert not _asked(State.UNKNOWN, streak=5, quarantine_after=3).quarantined
    assert _asked(State.RETRY_WAIT, streak=2, quarantine_after=3).state is State.RETRY_WAIT
    assert _asked(State.RETRY_WAIT, streak=9).state is State.RETRY_WAIT  # quarantine off
    # cancel wins over quarantine (the request replaced the failure: nothing counted)
    e = _asked(State.RETRY_WAIT, request="cancel", streak=3, quarantine_after=3)
    assert (e.state, e.quarantined, e.replaced) == (State.CANCELLED, False, True)
    # budget
    e = _asked(State.RETRY_WAIT, delay_s=1.0, budget_at=NOW + 5)
    assert (e.run_at, e.rules[-1]) == (NOW + 5, "budget_wait")
    assert _asked(State.RETRY_WAIT, delay_s=9.0, budget_at=NOW + 5).run_at == NOW + 9.0
    assert _asked(State.RETRY_WAIT, streak=3, quarantine_after=3,
                  budget_at=NOW + 5).state is State.FAILED  # quarantine before budget
    # the holder gone
    assert _gone(attempt=1, max_attempts=3).state is State.RETRY_WAIT
    e = _gone(attempt=3, max_attempts=3)
    assert (e.state, e.error_class) == (State.FAILED, "lease_expired")
    e = _gone(attempt=3, max_attempts=3, intent_open=True, request="cancel")
    assert (e.state, e.request) == (State.UNKNOWN, "cancel")
    e = _gone(attempt=1, max_attempts=3, streak=3, quarantine_after=3)
    assert (e.state, e.quarantined) == (State.FAILED, True)
    e = _gone(attempt=1, max_attempts=3, streak=3, quarantine_after=3, intent_open=True)
    assert (e.state, e.quarantined) == (State.UNKNOWN, False)
    e = _gone(attempt=3, max_attempts=3, streak=3, quarantine_after=3, request="pause")
    assert (e.state, e.error_class) == (State.PAUSED, "paused")  # request before quarantine
