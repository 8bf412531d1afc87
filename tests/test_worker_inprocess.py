"""The worker in this process (no subprocesses): steps, retries, dead-letter, the effect
protocol (intent, lookup first, same key, UNKNOWN and operator resolve) and lease loss.

Every test runs on both ledgers (the ``ledger_url`` fixture of tests/conftest.py: a fresh
SQLite file or a private PostgreSQL schema), and reads the ledger only through its API.
External systems are plain dicts that count what "really happened" on the other side.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ratchet import (
    NOT_FOUND,
    App,
    OverloadError,
    PermanentError,
    RetryPolicy,
    State,
    TaskContext,
    TransientError,
    Worker,
    open_ledger,
)
from ratchet.app import MIN_LEASE_S
from ratchet.errors import LedgerUnavailable
from ratchet.ledger.base import (
    EffectState,
    EffectWrite,
    Ledger,
    ResolveOutcome,
    TaskInfo,
    TaskWrite,
)
from ratchet.serde import digest, dumps
from ratchet.testing import LedgerProxy, fast_retry_policy, wait_for
from ratchet.testing.worker import WorkerCrashed, running_worker, worker_fixture
from ratchet.worker import WorkerStats

pytestmark = pytest.mark.timeout(30)

FAST = fast_retry_policy()
LEASE_S = MIN_LEASE_S
"""The shortest lease a task may have (seconds): tests that wait for an expiry use it."""


@pytest.fixture
def url(ledger_url: str) -> str:
    """The ledger of this test, on each backend in turn."""
    return ledger_url


@pytest.fixture
def app(url: str) -> Iterator[App]:
    app = App(url)
    yield app
    app.close()


def run(
    app: App, *, max_tasks: int | None = None, idle_exit_s: float = 0.4, concurrency: int = 2
) -> tuple[Worker, WorkerStats]:
    worker = Worker(app, concurrency=concurrency, poll_interval_s=0.01)
    stats = worker.run(max_tasks=max_tasks, idle_exit_s=None if max_tasks else idle_exit_s)
    return worker, stats


def read_timeout() -> httpx.ReadTimeout:
    return httpx.ReadTimeout("reply lost", request=httpx.Request("POST", "https://pay.example"))


# ---------------------------------------------------------------------- steps


def test_steps_run_once_and_replay_from_the_ledger(app: App) -> None:
    calls: Counter[str] = Counter()
    seen: list[Any] = []

    def quote(n: int) -> tuple[int, int]:
        calls["quote"] += 1
        return (n, n * 2)  # a tuple: stored and returned as a JSON list

    def reserve() -> str:
        calls["reserve"] += 1
        if calls["reserve"] == 1:
            raise TransientError("inventory service blipped")
        return "r-1"

    @app.task(name="t.steps", retry=FAST)
    def steps(ctx: TaskContext, n: int) -> dict[str, Any]:
        calls["body"] += 1
        q = ctx.step("quote", quote, n)
        seen.append(q)
        r = ctx.step("reserve", reserve)
        return {"quote": q, "reserve": r, "attempt": ctx.attempt}

    handle = app.submit("t.steps", {"n": 21})
    _, stats = run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert info.result == {"quote": [21, 42], "reserve": "r-1", "attempt": 2}
    assert calls == Counter(body=2, quote=1, reserve=2)
    assert seen == [[21, 42], [21, 42]]  # first run and replay see the same value
    steps_by_name = {s.name: s for s in app.ledger.timeline(handle.task_id).steps}
    assert steps_by_name["quote"].generation == 1
    assert steps_by_name["reserve"].generation == 2
    assert stats.succeeded == 1
    assert stats.retried == 1


def test_pipelined_step_is_durable_before_the_effect_call(app: App, url: str) -> None:
    """DESIGN §5: a step's write rides on the effect intent's transaction, so by the time
    the call leaves the process the step value it may carry is in the ledger."""
    reader = open_ledger(url)
    seen_at_call: list[Any] = []

    @app.task(name="t.pipelined")
    def pipelined(ctx: TaskContext) -> str:
        amount = ctx.step("quote", lambda: 42)

        def call(key: str) -> str:
            timeline = reader.timeline(ctx.task_id)
            seen_at_call.append(
                ({s.name: s.result_json for s in timeline.steps},
                 [(e.name, e.state) for e in timeline.effects])
            )
            return f"charged {amount}"

        return ctx.effect("charge", call, key="charge:p", idempotent=True)

    handle = app.submit("t.pipelined")
    try:
        run(app)
        assert handle.get().state is State.SUCCEEDED
        assert seen_at_call == [({"quote": "42"}, [("charge", EffectState.INTENT)])]
    finally:
        reader.close()


def test_durable_step_is_committed_before_it_returns(app: App, url: str) -> None:
    reader = open_ledger(url)
    seen: list[list[str]] = []

    @app.task(name="t.durable")
    def durable(ctx: TaskContext) -> int:
        first = ctx.step("expensive", lambda: 7, durable=True)
        seen.append([s.name for s in reader.timeline(ctx.task_id).steps])
        return int(ctx.step("cheap", lambda: first + 1))

    handle = app.submit("t.durable")
    try:
        run(app)
        assert handle.get().state is State.SUCCEEDED and handle.get().result == 8
        assert seen == [["expensive"]]
        steps = {s.name: s.result_json for s in reader.timeline(handle.task_id).steps}
        assert steps == {"expensive": "7", "cheap": "8"}  # "cheap" rode on the completion
    finally:
        reader.close()


def test_on_finished_fires_after_the_completion_committed(app: App, url: str) -> None:
    """Completions are handed to the writer without waiting; the outcome is reported (and
    the slot freed) only once the ledger has it."""
    reader = open_ledger(url)
    at_finish: list[tuple[str, State, str | None]] = []

    @app.task(name="t.reported")
    def reported(ctx: TaskContext, i: int) -> int:
        return int(ctx.step("square", lambda: i * i))

    class Checking(Worker):
        def on_finished(self, claim: Any, outcome: str) -> None:
            info = reader.get(claim.task_id)
            at_finish.append((outcome, info.state, info.holder))
            super().on_finished(claim, outcome)

    for i in range(12):
        app.submit("t.reported", {"i": i})
    worker = Checking(app, concurrency=3, poll_interval_s=0.01)
    try:
        stats = worker.run(max_tasks=12)
        assert stats.succeeded == 12
        assert at_finish == [("SUCCEEDED", State.SUCCEEDED, None)] * 12
    finally:
        reader.close()


def test_step_result_not_json_fails_the_task(app: App) -> None:
    @app.task(name="t.badstep", retry=FAST)
    def bad(ctx: TaskContext) -> None:
        ctx.step("s", lambda: {1, 2})

    handle = app.submit("t.badstep")
    run(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert info.attempt == 1
    assert "JSON" in (info.last_error or "")


def test_many_tasks_each_run_once(app: App) -> None:
    runs: Counter[int] = Counter()
    lock = threading.Lock()

    @app.task(name="t.many")
    def many(ctx: TaskContext, i: int) -> int:
        with lock:
            runs[i] += 1
        return ctx.step("square", lambda: i * i)

    handles = [app.submit("t.many", {"i": i}) for i in range(30)]
    _, stats = run(app, concurrency=4)
    assert stats.succeeded == 30
    assert runs == Counter(range(30))
    for i, h in enumerate(handles):
        info = h.get()
        assert info.state is State.SUCCEEDED
        assert info.result == i * i


# ---------------------------------------------------------------------- retries


def test_transient_failure_waits_then_succeeds(app: App) -> None:
    attempts: list[int] = []

    @app.task(name="t.flaky", retry=RetryPolicy(max_attempts=3, base_delay_s=0.3, jitter=0.0))
    def flaky(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise TransientError("connection reset by upstream")
        return "ok"

    handle = app.submit("t.flaky")
    _, stats = run(app, max_tasks=1)
    info = handle.get()
    assert info.state is State.RETRY_WAIT
    assert "connection reset by upstream" in (info.last_error or "")
    assert info.error_class == "transient"
    assert info.holder is None
    assert info.run_at == pytest.approx(info.updated_at + 0.3, abs=0.01)
    assert stats.retried == 1
    run(app, idle_exit_s=0.6)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert info.result == "ok"
    assert attempts == [1, 2]


def test_overload_backs_off_at_least_retry_after(app: App) -> None:
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, overload_min_delay_s=0.0)

    @app.task(name="t.busy", retry=policy)
    def busy(ctx: TaskContext) -> None:
        raise OverloadError("429 from partner", retry_after_s=0.5)

    handle = app.submit("t.busy")
    run(app, max_tasks=1)
    info = handle.get()
    assert info.state is State.RETRY_WAIT
    assert info.error_class == "overload"
    assert info.run_at - info.updated_at >= 0.5 - 1e-6


def test_attempts_exhausted_is_dead_lettered(app: App) -> None:
    attempts: list[int] = []

    @app.task(name="t.doomed", retry=FAST)
    def doomed(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        raise TransientError(f"boom on attempt {ctx.attempt}")

    handle = app.submit("t.doomed")
    _, stats = run(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert attempts == [1, 2, 3]
    assert info.attempt == 3
    assert "boom on attempt 3" in (info.last_error or "")
    assert info.error_class == "transient"
    assert stats.failed == 1
    assert stats.retried == 2


@pytest.mark.parametrize(
    ("exc", "error_class"),
    [(PermanentError("card declined"), "permanent"), (ValueError("bad amount"), "permanent")],
)
def test_permanent_error_fails_at_first_attempt(app: App, exc: Exception, error_class: str) -> None:
    attempts: list[int] = []

    @app.task(name="t.perm", retry=FAST)
    def perm(ctx: TaskContext) -> None:
        attempts.append(ctx.attempt)
        raise exc

    handle = app.submit("t.perm")
    run(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert attempts == [1]
    assert info.error_class == error_class
    assert str(exc) in (info.last_error or "")


# ---------------------------------------------------------------------- effects


class Bank:
    """The external side: executes each idempotency key at most once, counts everything."""

    def __init__(self) -> None:
        self.executed: dict[str, dict[str, str]] = {}
        self.calls: list[str] = []
        self.lookups: list[str] = []
        self.lose_reply_after: set[int] = set()  # call numbers whose reply is lost
        self.fail_before: set[int] = set()  # call numbers that time out before executing

    def charge(self, key: str) -> dict[str, str]:
        self.calls.append(key)
        n = len(self.calls)
        if n in self.fail_before:
            raise read_timeout()
        result = self.executed.setdefault(key, {"charge_id": f"ch_{len(self.executed) + 1}"})
        if n in self.lose_reply_after:
            raise read_timeout()
        return result

    def lookup(self, key: str) -> Any:
        self.lookups.append(key)
        return self.executed.get(key, NOT_FOUND)


def register_charge(
    app: App,
    bank: Bank,
    *,
    use_lookup: bool = True,
    idempotent: bool = False,
    lease_s: float = 15.0,
) -> None:
    @app.task(name="t.charge", retry=FAST, lease_s=lease_s)
    def charge(ctx: TaskContext, order_id: str) -> Any:
        return ctx.effect(
            "charge",
            bank.charge,
            key=f"charge:{order_id}",
            lookup=bank.lookup if use_lookup else None,
            idempotent=idempotent,
            params={"order_id": order_id},
        )


def effect_record(app: App, task_id: str) -> Any:
    [record] = app.ledger.timeline(task_id).effects
    return record


def test_lost_reply_is_settled_by_lookup_without_calling_again(app: App) -> None:
    bank = Bank()
    bank.lose_reply_after = {1}
    register_charge(app, bank)
    handle = app.submit("t.charge", {"order_id": "o-1"})
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert info.attempt == 1
    assert info.result == {"charge_id": "ch_1"}
    assert bank.calls == ["charge:o-1"]
    assert bank.lookups == ["charge:o-1"]
    assert len(bank.executed) == 1
    record = effect_record(app, handle.task_id)
    assert record.state is EffectState.DONE
    assert record.via_lookup is True
    assert app.ledger.stats().lookup_hits == 1


def test_lookup_not_found_calls_again_with_the_same_key(app: App) -> None:
    bank = Bank()
    bank.fail_before = {1}
    register_charge(app, bank)
    handle = app.submit("t.charge", {"order_id": "o-2"})
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert bank.calls == ["charge:o-2", "charge:o-2"]
    assert bank.lookups, "the lookup must be asked before calling again"
    assert set(bank.lookups) == {"charge:o-2"}
    assert len(bank.executed) == 1
    record = effect_record(app, handle.task_id)
    assert record.state is EffectState.DONE
    assert record.via_lookup is False
    assert record.key == "charge:o-2"


def _ghost_left_an_intent(app: App, url: str) -> tuple[str, Ledger]:
    """A worker claimed the task, committed the effect's intent, then died silently."""
    handle = app.submit("t.charge", {"order_id": "o-3"})
    ghost = open_ledger(url)
    [claim] = ghost.claim("ghost", ["t.charge"], 1)
    [ok] = ghost.commit(
        [
            TaskWrite(
                claim.task_id,
                claim.generation,
                "ghost",
                "intent",
                # The digest the effect itself records for this key and params.
                effects=[EffectWrite("charge", "charge:o-3", digest("charge", "charge:o-3",
                                     dumps({"order_id": "o-3"})), EffectState.INTENT)],
            )
        ]
    )
    assert ok.ok
    wait_for("the ghost's lease to expire", lambda: ghost.now() > claim.lease_until,
             timeout_s=5, interval_s=0.02)
    return handle.task_id, ghost


def test_intent_without_result_call_happened_lookup_finds_it(app: App, url: str) -> None:
    bank = Bank()
    register_charge(app, bank, lease_s=LEASE_S)
    task_id, ghost = _ghost_left_an_intent(app, url)
    bank.executed["charge:o-3"] = {"charge_id": "ch_ghost"}  # the ghost's call went through
    _, stats = run(app)
    ghost.close()
    info = app.get(task_id)
    assert info.state is State.SUCCEEDED
    assert info.result == {"charge_id": "ch_ghost"}
    assert bank.calls == []
    assert bank.lookups == ["charge:o-3"]
    assert stats.takeovers == 1
    assert info.attempt == 2
    assert effect_record(app, task_id).via_lookup is True


def test_intent_without_result_call_lost_is_made_again(app: App, url: str) -> None:
    bank = Bank()
    register_charge(app, bank, lease_s=LEASE_S)
    task_id, ghost = _ghost_left_an_intent(app, url)
    run(app)
    ghost.close()
    info = app.get(task_id)
    assert info.state is State.SUCCEEDED
    assert bank.lookups == ["charge:o-3"]
    assert bank.calls == ["charge:o-3"]
    assert len(bank.executed) == 1


def test_no_lookup_not_idempotent_goes_unknown_then_operator_not_done(app: App) -> None:
    bank = Bank()
    bank.fail_before = {1}
    register_charge(app, bank, use_lookup=False)
    handle = app.submit("t.charge", {"order_id": "o-4"})
    _, stats = run(app)
    info = app.wait(handle.task_id, timeout_s=1)
    assert info.state is State.UNKNOWN
    assert info.error_class == "unknown_outcome"
    assert "charge:o-4" in (info.last_error or "")
    assert bank.calls == ["charge:o-4"]
    assert stats.unknown == 1
    assert effect_record(app, handle.task_id).state is EffectState.INTENT
    # Nobody retries an UNKNOWN task on their own.
    run(app, idle_exit_s=0.2)
    assert bank.calls == ["charge:o-4"]
    resolved = app.ledger.resolve(
        handle.task_id, ResolveOutcome.NOT_DONE, "bank has no such charge", "alice"
    )
    assert resolved.state is State.PENDING
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert bank.calls == ["charge:o-4", "charge:o-4"]  # again, with the same key
    assert len(bank.executed) == 1


def test_unknown_resolved_done_is_not_called_again(app: App) -> None:
    bank = Bank()
    bank.fail_before = {1}
    register_charge(app, bank, use_lookup=False)
    handle = app.submit("t.charge", {"order_id": "o-5"})
    run(app)
    assert handle.get().state is State.UNKNOWN
    app.ledger.resolve(
        handle.task_id,
        ResolveOutcome.DONE,
        "seen in bank console",
        "alice",
        result_json='{"charge_id":"ch_manual"}',
    )
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert info.result == {"charge_id": "ch_manual"}
    assert bank.calls == ["charge:o-5"]


def test_inconclusive_lookup_without_idempotency_goes_unknown(app: App) -> None:
    bank = Bank()
    bank.lose_reply_after = {1}

    def broken_lookup(key: str) -> Any:
        bank.lookups.append(key)
        raise read_timeout()

    @app.task(name="t.charge", retry=FAST)
    def charge(ctx: TaskContext, order_id: str) -> Any:
        return ctx.effect("charge", bank.charge, key=f"charge:{order_id}", lookup=broken_lookup)

    handle = app.submit("t.charge", {"order_id": "o-6"})
    run(app)
    assert handle.get().state is State.UNKNOWN
    assert bank.calls == ["charge:o-6"]
    assert bank.lookups == ["charge:o-6"]


def test_unsettled_effect_is_never_dead_lettered_as_failed(app: App) -> None:
    # The reply was lost and the lookup service is down on every attempt: the charge may
    # have happened, so the task must not end FAILED as if nothing happened (DESIGN §3:
    # "a timeout is not a failure: it goes to UNKNOWN, then to lookup").
    bank = Bank()
    bank.lose_reply_after = {1}

    def lookup_down(key: str) -> Any:
        bank.lookups.append(key)
        raise httpx.ConnectError("lookup API refused", request=httpx.Request("GET", "https://x"))

    @app.task(name="t.charge", retry=RetryPolicy(max_attempts=2, base_delay_s=0.01))
    def charge(ctx: TaskContext, order_id: str) -> Any:
        return ctx.effect("charge", bank.charge, key=f"charge:{order_id}", lookup=lookup_down)

    handle = app.submit("t.charge", {"order_id": "o-9"})
    run(app)
    info = handle.get()
    assert bank.calls == ["charge:o-9"]
    assert len(bank.executed) == 1
    assert effect_record(app, handle.task_id).state is EffectState.INTENT
    assert info.state is State.UNKNOWN, (
        f"task ended {info.state} although its effect may have executed"
    )


def test_call_that_provably_was_not_sent_is_retried_not_unknown(app: App) -> None:
    # httpx.ConnectError means the request never left: the outcome is known (not done),
    # so the next attempt may call again instead of parking the task for a person.
    bank = Bank()
    connect_failures = [1]

    def charge_call(key: str) -> Any:
        if connect_failures:
            connect_failures.pop()
            raise httpx.ConnectError(
                "connection refused", request=httpx.Request("POST", "https://pay.example")
            )
        return bank.charge(key)

    @app.task(name="t.charge", retry=FAST)
    def charge(ctx: TaskContext, order_id: str) -> Any:
        return ctx.effect("charge", charge_call, key=f"charge:{order_id}")

    handle = app.submit("t.charge", {"order_id": "o-10"})
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, f"{info.state}: {info.last_error}"
    assert bank.calls == ["charge:o-10"]


def test_idempotent_target_without_lookup_is_called_again_with_same_key(app: App) -> None:
    bank = Bank()
    bank.lose_reply_after = {1}
    register_charge(app, bank, use_lookup=False, idempotent=True)
    handle = app.submit("t.charge", {"order_id": "o-7"})
    run(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED
    assert bank.calls == ["charge:o-7", "charge:o-7"]
    assert len(bank.executed) == 1  # the target deduplicated the key
    assert info.result == {"charge_id": "ch_1"}


def test_done_effect_is_not_repeated_on_a_later_attempt(app: App) -> None:
    bank = Bank()
    attempts: list[int] = []

    @app.task(name="t.charge", retry=FAST)
    def charge(ctx: TaskContext, order_id: str) -> Any:
        attempts.append(ctx.attempt)
        result = ctx.effect("charge", bank.charge, key=f"charge:{order_id}", lookup=bank.lookup)
        if ctx.attempt == 1:
            raise TransientError("mail server down after charging")
        return result

    handle = app.submit("t.charge", {"order_id": "o-8"})
    run(app)
    assert handle.get().state is State.SUCCEEDED
    assert attempts == [1, 2]
    assert bank.calls == ["charge:o-8"]
    assert bank.lookups == []  # a done effect needs no lookup


def test_effect_key_change_between_attempts_fails(app: App) -> None:
    bank = Bank()

    @app.task(name="t.badkey", retry=FAST)
    def badkey(ctx: TaskContext) -> Any:
        # Wrong: the key comes from the attempt, not from the business intent.
        ctx.effect("charge", bank.charge, key=f"charge:attempt-{ctx.attempt}")
        raise TransientError("fail after the effect, to force a second attempt")

    handle = app.submit("t.badkey")
    run(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert info.attempt == 2
    assert info.error_class == "permanent"
    assert "idempotency key" in (info.last_error or "")
    assert bank.calls == ["charge:attempt-1"]


# ---------------------------------------------------------------------- lease loss


class RenewSwitch(LedgerProxy):
    """A ledger whose renewals can be cut off (the heartbeat's path to the ledger fails)
    while ``blocked`` is set; everything else goes to the real ledger."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner, fail={"renew": self._cut_off})
        self.blocked = threading.Event()

    def _cut_off(self, *args: Any) -> BaseException | None:
        if self.blocked.is_set():
            return LedgerUnavailable("renewals cut off by the test")
        return None


def _lease_scenario(
    url: str,
) -> tuple[App, RenewSwitch, threading.Event, threading.Event, list[str], Counter[str]]:
    switch = RenewSwitch(open_ledger(url))
    app = App(switch)  # type: ignore[arg-type]
    in_body, go = threading.Event(), threading.Event()
    calls: list[str] = []
    runs: Counter[str] = Counter()

    @app.task(name="t.lease", lease_s=LEASE_S, retry=FAST)
    def leased(ctx: TaskContext) -> str:
        ctx.step("prepare", lambda: runs.update(["prepare"]))
        if ctx.attempt == 1:
            in_body.set()
            assert go.wait(10)
        ctx.effect("charge", lambda key: calls.append(key) or "ok", key="charge:lease")
        return "done"

    return app, switch, in_body, go, calls, runs


def _wait_expired(ledger: Ledger, task_id: str) -> TaskInfo:
    def probe() -> TaskInfo | None:
        info = ledger.get(task_id)
        assert info.lease_until is not None
        return info if ledger.now() > info.lease_until else None

    return wait_for("the lease to expire", probe, timeout_s=5, interval_s=0.02)


def test_lease_lost_to_a_takeover_stops_new_effects(url: str) -> None:
    app, switch, in_body, go, calls, _ = _lease_scenario(url)
    handle = app.submit("t.lease")
    worker = Worker(app, concurrency=1, poll_interval_s=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"max_tasks": 1})
    thread.start()
    thief = open_ledger(url)
    try:
        assert in_body.wait(5)
        switch.blocked.set()
        stolen = wait_for("the lease to be taken over",
                          lambda: thief.claim("thief", ["t.lease"], 1),
                          timeout_s=5, interval_s=0.02)
        assert stolen[0].takeover and stolen[0].generation == 2
        switch.blocked.clear()  # the heartbeat reaches the ledger again: it hears "lost"
        go.set()
        thread.join(10)
        assert not thread.is_alive()
        assert calls == [], "an effect started after the lease was lost"
        assert worker.stats.lease_lost == 1
        assert worker.stats.succeeded == 0
        info = thief.get(handle.task_id)
        assert info.state is State.RUNNING
        assert info.holder == "thief"
        assert info.generation == 2
        rejected = [e for e in thief.timeline(handle.task_id).events if e.kind == "stale_rejected"]
        assert [e.holder for e in rejected] == [worker.holder]
        assert thief.timeline(handle.task_id).effects == []
    finally:
        go.set()
        thread.join(10)
        thief.close()
        switch.close()


def test_unconfirmed_lease_stops_new_effects_and_releases(url: str) -> None:
    app, switch, in_body, go, calls, runs = _lease_scenario(url)
    handle = app.submit("t.lease")
    worker = Worker(app, concurrency=1, poll_interval_s=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"max_tasks": 1})
    thread.start()
    try:
        assert in_body.wait(5)
        switch.blocked.set()
        _wait_expired(switch, handle.task_id)
        go.set()  # renewals still failing: the worker cannot confirm its lease
        thread.join(10)
        assert not thread.is_alive()
        assert calls == []
        assert worker.stats.lease_lost == 1
        info = handle.get()
        assert info.state is State.PENDING  # released under the still-current generation
        assert info.holder is None
        switch.blocked.clear()
        run(app)
        info = handle.get()
        assert info.state is State.SUCCEEDED
        assert calls == ["charge:lease"]
        assert runs["prepare"] == 1  # the committed step was not re-run
    finally:
        go.set()
        thread.join(10)
        switch.close()


def test_stop_releases_the_task_at_the_next_boundary(app: App) -> None:
    in_body, go = threading.Event(), threading.Event()
    runs: Counter[str] = Counter()

    @app.task(name="t.stop")
    def stoppable(ctx: TaskContext) -> str:
        ctx.step("first", lambda: runs.update(["first"]))
        if ctx.generation == 1:
            in_body.set()
            assert go.wait(10)
        ctx.step("second", lambda: runs.update(["second"]))
        return "done"

    handle = app.submit("t.stop")
    worker = Worker(app, concurrency=1, poll_interval_s=0.01)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert in_body.wait(5)
        worker.stop()
        go.set()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        go.set()
        thread.join(10)
    info = handle.get()
    assert info.state is State.PENDING
    assert info.holder is None
    assert worker.stats.released == 1
    assert info.attempt == 0, "a graceful release must hand its attempt back"
    assert runs == Counter(first=1)
    run(app)
    final = handle.get()
    assert final.state is State.SUCCEEDED
    assert (final.attempt, final.generation) == (1, 2)
    assert runs == Counter(first=1, second=1)


def test_timeline_of_a_worker_run_is_complete(app: App) -> None:
    @app.task(name="t.audit")
    def audited(ctx: TaskContext) -> int:
        return ctx.step("one", lambda: 1)

    handle = app.submit("t.audit")
    worker, _ = run(app)
    tl = app.ledger.timeline(handle.task_id)
    kinds = [(e.kind, e.to_state) for e in tl.events]
    assert kinds == [("claim", State.RUNNING), ("transition", State.SUCCEEDED)]
    assert all(e.holder == worker.holder for e in tl.events)
    assert tl.task.result == 1


def test_short_leases_are_renewed_before_they_expire(url: str) -> None:
    """A lease claimed while the heartbeat sleeps (idle, or holding a long lease) must get
    its first renewal within a third of its own length, not after the heartbeat's old wait."""
    app = App(url)
    try:

        long_running = threading.Event()

        @app.task(name="t.long", lease_s=15.0)
        def long_lease(ctx: TaskContext) -> int:
            long_running.set()
            return ctx.step("wait", lambda: time.sleep(3.0) or 1)

        @app.task(name="t.short", lease_s=LEASE_S, retry=RetryPolicy(max_attempts=1))
        def short_lease(ctx: TaskContext) -> int:
            return ctx.step("wait", lambda: time.sleep(2.5 * LEASE_S) or 2)

        first = app.submit("t.long")
        worker = Worker(app, concurrency=4, poll_interval_s=0.01)
        thread = threading.Thread(target=worker.run, kwargs={"idle_exit_s": 0.5})
        thread.start()
        # Once the long task runs, the heartbeat plans its next round 5 s away (15 s / 3).
        assert long_running.wait(10)
        shorts = [app.submit("t.short", idempotency_key=f"s{i}") for i in range(3)]
        thread.join(20)
        assert not thread.is_alive()
        for handle in [first, *shorts]:
            info = handle.get()
            assert info.state is State.SUCCEEDED, info.last_error
            assert info.generation == 1, "a live holder's lease lapsed and was taken over"
        assert worker.stats.takeovers == 0
    finally:
        app.close()


def test_same_effect_key_with_other_params_is_refused(app: App, url: str) -> None:
    """DESIGN §5: same key + different params is rejected, never silently re-sent."""
    bank = Bank()
    register_charge(app, bank, lease_s=LEASE_S)
    task_id, ghost = _ghost_left_an_intent(app, url)
    # Rewrite the recorded intent as if an earlier attempt had asked for something else.
    [claim] = ghost.claim("ghost2", ["t.charge"], 1)
    [ok] = ghost.commit([TaskWrite(claim.task_id, claim.generation, "ghost2", "intent",
                                   effects=[EffectWrite("charge", "charge:o-3", "other",
                                                        EffectState.INTENT)])])
    assert ok.ok
    wait_for("the ghost's lease to expire", lambda: ghost.now() > claim.lease_until,
             timeout_s=5, interval_s=0.02)
    run(app)
    ghost.close()
    info = app.get(task_id)
    # The intent is open (the earlier request may have run): UNKNOWN, not FAILED, no call.
    assert info.state is State.UNKNOWN
    assert "same key must always carry the same request" in (info.last_error or "")
    assert bank.calls == []


# ---------------------------------------------------------------------- ratchet.testing.worker

@pytest.fixture
def fixture_app(url: str) -> Iterator[App]:
    """An app whose tasks are registered before any worker starts (as at import time)."""
    app = App(url)

    @app.task(name="t.fixture")
    def fixture_task(ctx: TaskContext, i: int) -> int:
        return int(ctx.step("double", lambda: 2 * i))

    yield app
    app.close()


ratchet_worker = worker_fixture("fixture_app", concurrency=2)
"""The in-process worker fixture as a user's conftest would declare it."""


def test_worker_fixture_runs_tasks_for_the_test(fixture_app: App, ratchet_worker: Worker) -> None:
    app = fixture_app
    handles = [app.submit("t.fixture", {"i": i}) for i in range(5)]
    infos = [app.wait(h.task_id, timeout_s=20) for h in handles]
    assert [i.state for i in infos] == [State.SUCCEEDED] * 5
    assert [i.result for i in infos] == [0, 2, 4, 6, 8]
    assert ratchet_worker.stats.succeeded == 5
    assert {e.holder for h in handles for e in app.ledger.timeline(h.task_id).events} == {
        ratchet_worker.holder
    }


def no_subscriptions(inner: Ledger) -> LedgerProxy:
    """A real ledger whose wake-up subscription fails: Worker.run raises at start."""
    return LedgerProxy(inner, fail={"subscribe": LedgerUnavailable("cannot subscribe (test)")})


def test_running_worker_reports_a_crashed_worker_thread(url: str) -> None:
    app = App(no_subscriptions(open_ledger(url)))  # type: ignore[arg-type]
    try:
        with (
            pytest.raises(WorkerCrashed, match="crashed") as caught,
            running_worker(app) as worker,
        ):
            pass
        assert isinstance(caught.value.__cause__, LedgerUnavailable)
        assert isinstance(caught.value, AssertionError)  # pytest shows it as a failure
        # The threads the worker had started were stopped again.
        assert not worker.writer.is_alive() and not worker.heartbeat.is_alive()
    finally:
        app.close()
