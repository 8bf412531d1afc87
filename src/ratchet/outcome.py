"""Where an attempt ends: the outcome table (DESIGN §3, §7, "the outcome table").

One pure function, :func:`decide`, turns what happened to an attempt (:class:`AttemptFacts`)
into where it ends (:class:`Ending`): the target state, the error class recorded and the
``run_at`` (seconds since the epoch, on the clock of ``facts.now``). No I/O, no clock: the
worker and the ledger engine gather the facts and apply the result.

The decision has two halves, through the same table:

* the **worker** proposes (``RETURNED``, ``RAISED``, ``TIME_LIMIT``): its facts are the
  failure class, the attempts and its open effect intents; the ledger facts keep their
  defaults, so only the ``end`` rules apply. It passes ``now=0.0``: the ``run_at`` it gets
  is the delay its write asks for, applied at the commit's ledger clock;
* the **ledger** completes a holder's fenced write (``ASKED``, with ``proposed``) with the
  facts only it has: a pending operator request, whether a pause still covers the task,
  the quarantine streak and the retry budget; and it ends the attempts whose holder is
  gone (``HOLDER_GONE``: lease expired, holder revoked).

The rules are ordered stages (``end``, ``request``, ``pause``, ``quarantine``,
``budget``); in each stage the first rule that matches applies, and a stage where none
matches leaves the ending as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .retry import TIME_LIMIT, FailureClass
from .states import State

__all__ = ["REQUEST_CLASS", "RULES", "AttemptFacts", "Ending", "Happened", "Rule", "asked_as_is",
           "decide", "walk"]


class Happened(StrEnum):
    """What ended the attempt, as the side deciding sees it."""

    RETURNED = "returned"
    """Worker: the task function returned."""
    RAISED = "raised"
    """Worker: the task function raised; ``failure`` is its class."""
    TIME_LIMIT = "time_limit"
    """Worker: the watchdog ended it at its time limit (a transient failure)."""
    ASKED = "asked"
    """Ledger: a holder's fenced write asks for ``proposed`` (the worker's half)."""
    HOLDER_GONE = "holder_gone"
    """Ledger: the holder is gone (lease expired, holder revoked) with the task RUNNING."""


REQUEST_CLASS: dict[str, str] = {"cancel": "cancelled", "pause": "paused"}
"""``error_class`` recorded when an operator request (``cancel`` / ``pause``) ends a run."""

_REQUEST_TARGET: dict[str, State] = {"cancel": State.CANCELLED, "pause": State.PAUSED}
_ENDED = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATING,
                    State.COMPENSATED})


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What happened to one attempt (every field a plain value; no I/O behind any).

    Attributes:
        happened: what ended it (:class:`Happened`).
        now: the clock ``run_at`` is on, seconds since the epoch (the commit's ledger
            clock; ``0.0`` for the worker, whose delays the commit applies).
        failure: ``RAISED``: the failure class (:func:`ratchet.retry.classify` or the
            worker's override).
        error_class: the class to record: ``RAISED`` defaults to ``failure.value``;
            ``ASKED``: the proposal's.
        attempt: attempts used, this one included (1-based).
        max_attempts: attempts allowed (``RetryPolicy.max_attempts``).
        delay_s: ``RAISED``: the policy's backoff, seconds; ``ASKED``: the proposal's delay.
        intent_open: an effect intent of the task is open (its call may have happened):
            the worker's context; the ledger's rows, after this write's effects.
        proposed: ``ASKED``: the state the holder's write asks for.
        request: the operator request pending on the task (``"cancel"`` / ``"pause"``).
        pause_active: ``ASKED`` ``PAUSED``: a pause still covers the task.
        streak: failures in a row with this error fingerprint (``ASKED``, a failure that
            counts) or deliveries whose worker died (``HOLDER_GONE``), this one included;
            0: not counted.
        quarantine_after: ``RetryPolicy.quarantine_after`` (None: quarantine off).
        budget_at: the first second the retry budgets admit the retry, seconds since the
            epoch (None: no budget asked).
    """

    happened: Happened
    now: float = 0.0
    failure: FailureClass | None = None
    error_class: str | None = None
    attempt: int = 1
    max_attempts: int = 1
    delay_s: float = 0.0
    intent_open: bool = False
    proposed: State | None = None
    request: str | None = None
    pause_active: bool = True
    streak: int = 0
    quarantine_after: int | None = None
    budget_at: float | None = None


@dataclass(frozen=True, slots=True)
class Ending:
    """Where an attempt ends.

    Attributes:
        state: the target state.
        error_class: the error class recorded (None for a success).
        run_at: ``RETRY_WAIT`` / ``PENDING``: when it is claimable again, seconds on the
            clock of ``facts.now``; None otherwise.
        request: the operator request the task keeps afterwards (None: cleared).
        quarantined: the task is quarantined (``FAILED`` with the flag).
        replaced: an operator request (or a lifted pause) replaced the holder's outcome:
            its fingerprint and budget uses are not counted.
        rules: the names of the rules that applied, in order (audit texts key on them).
    """

    state: State
    error_class: str | None = None
    run_at: float | None = None
    request: str | None = None
    quarantined: bool = False
    replaced: bool = False
    rules: tuple[str, ...] = ()


_Test = Callable[[AttemptFacts, Ending], bool]
_Then = Callable[[AttemptFacts, Ending], Ending]


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table: in ``stage``, ``when`` the facts match, ``then`` applies."""

    stage: str
    name: str
    when: _Test
    then: _Then
    reason: str


def _to(state: State, **kw: object) -> _Then:
    return lambda f, e: dataclasses.replace(e, state=state, **kw)  # type: ignore[arg-type]


def _final(f: AttemptFacts) -> bool:
    return f.failure is FailureClass.PERMANENT or f.attempt >= f.max_attempts


def _reached(f: AttemptFacts) -> bool:
    return bool(f.quarantine_after) and f.streak >= (f.quarantine_after or 0)


def _raised(f: AttemptFacts) -> bool:
    return f.happened in (Happened.RAISED, Happened.TIME_LIMIT)


def _asked(f: AttemptFacts, e: Ending) -> bool:
    return f.happened is Happened.ASKED and not e.replaced


def _gone(f: AttemptFacts) -> bool:
    return f.happened is Happened.HOLDER_GONE


def _by_request(f: AttemptFacts, e: Ending) -> Ending:
    return Ending(_REQUEST_TARGET[f.request or ""], e.error_class or REQUEST_CLASS[f.request or ""],
                  None, None, replaced=True)


def _gone_end(state: State, quarantined: bool = False) -> _Then:
    return lambda f, e: Ending(state, "lease_expired", None,
                               f.request if state is State.UNKNOWN else None, quarantined)


RULES: tuple[Rule, ...] = (
    # stage, rule, when the facts say ..., then the attempt ends ..., reason
    # -- end: the worker's half (what the body did) ---------------------------------------
    Rule("end", "returned", lambda f, e: f.happened is Happened.RETURNED,
         _to(State.SUCCEEDED, error_class=None), "the task function returned"),
    Rule("end", "final_intent_open", lambda f, e: _raised(f) and _final(f) and f.intent_open,
         _to(State.UNKNOWN), "the call may have happened: a dead-letter would hide it"),
    Rule("end", "final", lambda f, e: _raised(f) and _final(f),
         _to(State.FAILED), "permanent, or attempts exhausted: dead-letter"),
    Rule("end", "retry", lambda f, e: _raised(f),
         lambda f, e: dataclasses.replace(e, state=State.RETRY_WAIT, run_at=f.now + f.delay_s),
         "retryable with attempts left: back off"),
    # -- end: the ledger, the holder gone (lease expired, revoked) ------------------------
    Rule("end", "gone_request", lambda f, e: _gone(f) and f.request is not None
         and not f.intent_open,
         lambda f, e: Ending(_REQUEST_TARGET[f.request or ""], REQUEST_CLASS[f.request or ""]),
         "nothing can be in flight: the operator's request applies"),
    Rule("end", "gone_quarantine_intent_open",
         lambda f, e: _gone(f) and _reached(f) and f.intent_open,
         _gone_end(State.UNKNOWN), "its worker died too often, but a call may have happened"),
    Rule("end", "gone_quarantine", lambda f, e: _gone(f) and _reached(f),
         _gone_end(State.FAILED, quarantined=True), "its worker died quarantine_after times"),
    Rule("end", "gone_final_intent_open",
         lambda f, e: _gone(f) and f.attempt >= f.max_attempts and f.intent_open,
         _gone_end(State.UNKNOWN), "last attempt, and a call may have happened"),
    Rule("end", "gone_final", lambda f, e: _gone(f) and f.attempt >= f.max_attempts,
         _gone_end(State.FAILED), "last attempt: dead-letter"),
    Rule("end", "gone_redeliver", lambda f, e: _gone(f),
         lambda f, e: Ending(State.RETRY_WAIT, "holder_gone", f.now, f.request),
         "attempts left: redelivered now (an expired lease is taken over by the claim)"),
    # -- request: an operator request against the holder's write (arbitration) -----------
    Rule("request", "cancel_applied", lambda f, e: _asked(f, e) and f.request == "cancel"
         and e.state is State.CANCELLED, _to(State.CANCELLED, request=None),
         "the holder applied the cancel itself"),
    Rule("request", "request_dropped", lambda f, e: _asked(f, e) and f.request is not None
         and e.state in _ENDED, lambda f, e: dataclasses.replace(e, request=None),
         "a terminal outcome committed first stands"),
    Rule("request", "request_waits_unknown", lambda f, e: _asked(f, e)
         and f.request is not None and e.state is State.UNKNOWN,
         lambda f, e: dataclasses.replace(e, request=f.request),
         "the resolution of UNKNOWN applies the request"),
    Rule("request", "request_waits_intent", lambda f, e: _asked(f, e)
         and f.request is not None and f.intent_open,
         lambda f, e: dataclasses.replace(e, request=f.request),
         "an intent is open: the next holder settles it by lookup first"),
    Rule("request", "request_same", lambda f, e: _asked(f, e) and f.request is not None
         and _REQUEST_TARGET[f.request] is e.state,
         lambda f, e: dataclasses.replace(e, request=None), "the holder did what was asked"),
    Rule("request", "request_applied", lambda f, e: _asked(f, e) and f.request is not None,
         _by_request, "a release, retry or pause yields to the request (cancel wins)"),
    # -- pause: a holder stopping for a pause lifted meanwhile --------------------------------
    Rule("pause", "pause_lifted", lambda f, e: _asked(f, e) and e.state is State.PAUSED
         and f.request != "pause" and not f.pause_active,
         lambda f, e: Ending(State.PENDING, None, f.now, e.request, replaced=True),
         "resumed before the boundary: released, attempt handed back"),
    # -- quarantine: the same error quarantine_after times in a row ---------------------------
    Rule("quarantine", "quarantine_intent_open", lambda f, e: _asked(f, e) and _reached(f)
         and e.state is State.RETRY_WAIT and f.intent_open,
         _to(State.UNKNOWN, run_at=None), "poisoned, but a call may have happened"),
    Rule("quarantine", "quarantine", lambda f, e: _asked(f, e) and _reached(f)
         and e.state is State.RETRY_WAIT,
         _to(State.FAILED, run_at=None, quarantined=True), "poisoned: never redelivered"),
    Rule("quarantine", "quarantine_flag", lambda f, e: _asked(f, e) and _reached(f)
         and e.state is State.FAILED,
         _to(State.FAILED, quarantined=True), "dead-lettered anyway: flagged"),
    # -- budget: the retry budgets admit the retry later --------------------------------------
    Rule("budget", "budget_wait", lambda f, e: _asked(f, e) and e.state is State.RETRY_WAIT
         and f.budget_at is not None and e.run_at is not None and f.budget_at > e.run_at,
         lambda f, e: dataclasses.replace(e, run_at=f.budget_at),
         "over budget: waits for the first second with room"),
)
"""The outcome table, in order (DESIGN §3 arbitration, §7 retry governance)."""

_STAGES = ("end", "request", "pause", "quarantine", "budget")
_BY_STAGE: tuple[tuple[Rule, ...], ...] = tuple(
    tuple(rule for rule in RULES if rule.stage == stage) for stage in _STAGES)


def asked_as_is(request: str | None, pause_active: bool, streak: int,
                quarantine_after: int | None, budget_at: float | None = None) -> bool:
    """Whether no rule of the table can change an ``ASKED`` write with these ledger facts
    (see :class:`AttemptFacts` for each), so the proposal stands as asked: no ``end`` rule
    is about an ``ASKED`` write, every ``request`` rule needs an operator request, the
    ``pause`` rule a lifted pause, every ``quarantine`` rule the streak at its threshold,
    and the ``budget`` rule a budget second. This is the common final write, which the
    commit path meets for every task: the engine asks this before it gathers the facts,
    and :func:`decide` skips the walk; ``tests/test_outcome.py`` checks that the shortcut
    gives the walk's ending for every combination of facts."""
    return (request is None and pause_active and budget_at is None
            and not (quarantine_after and streak >= quarantine_after))


def _nothing_applies(f: AttemptFacts) -> bool:
    return f.happened is Happened.ASKED and asked_as_is(
        f.request, f.pause_active, f.streak, f.quarantine_after, f.budget_at)


def _start(f: AttemptFacts) -> Ending:
    """The ending before any rule: the proposal (``ASKED``) or the recorded class."""
    if f.happened is Happened.ASKED:
        state = f.proposed if f.proposed is not None else State.FAILED
        run_at = f.now + f.delay_s if state in (State.RETRY_WAIT, State.PENDING) else None
        return Ending(state, f.error_class, run_at)
    if f.happened is Happened.TIME_LIMIT:
        return Ending(State.FAILED, f.error_class or TIME_LIMIT)
    cls = f.error_class or (f.failure.value if f.failure is not None else None)
    return Ending(State.FAILED, cls)


def decide(facts: AttemptFacts) -> Ending:
    """Where the attempt described by ``facts`` ends: the table :data:`RULES`, stage by
    stage, first match per stage. Pure: the same facts always give the same ending.

    Raises:
        ValueError: ``RAISED`` without a failure class.
    """
    if facts.happened is Happened.RAISED and facts.failure is None:
        raise ValueError("a RAISED attempt needs its failure class")
    if _nothing_applies(facts):
        return _start(facts)
    return walk(facts)


def walk(facts: AttemptFacts) -> Ending:
    """:func:`decide` without its shortcut: every stage of :data:`RULES` in order, first
    match per stage (what the shortcut must equal; callers use :func:`decide`)."""
    if facts.happened is Happened.TIME_LIMIT:
        facts = dataclasses.replace(facts, failure=FailureClass.TRANSIENT)
    ending = _start(facts)
    for rules in _BY_STAGE:
        for rule in rules:
            if rule.when(facts, ending):
                ending = dataclasses.replace(rule.then(facts, ending),
                                             rules=(*ending.rules, rule.name))
                break
    return ending
