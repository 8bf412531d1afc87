"""Occurrences: the same step or effect name called more than once (DESIGN §5).

Each call is its own checkpoint, identified by kind, name and occurrence (the N-th call of
that name in the task's code path) and by its position among all checkpoints. A replay
reuses exactly the checkpoints it reaches in the recorded order; a replay that diverges
(another name at a position, another key at an occurrence) stops with
``NonDeterministicReplay`` and never reuses another occurrence's value.

Every test runs on both ledgers; external targets are counted on their side (a dict here,
the counting service over HTTP in the crash test).
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ratchet import (
    NOT_FOUND,
    App,
    NonDeterministicReplay,
    PermanentError,
    RetryPolicy,
    State,
    TaskContext,
    TransientError,
    Worker,
    open_ledger,
)
from ratchet.ledger.base import EffectState, TaskWrite
from ratchet.serde import dumps
from ratchet.testing import ProcessGroup, fast_retry_policy, start_counting_service, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(60)

FAST = fast_retry_policy()


def drain(app: App) -> None:
    Worker(app, concurrency=2, poll_interval_s=0.01).run(idle_exit_s=0.4)


def test_loop_step_gives_each_call_its_own_checkpoint(app: App) -> None:
    """The issue's ``loop_step``: ``[0, 10, 20]``, not ``[0, 0, 0]``."""

    @app.task(name="loop_step")
    def loop_step(ctx: TaskContext) -> list[int]:
        return [ctx.step("item", lambda i=i: i * 10) for i in range(3)]

    handle = app.submit("loop_step", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == [0, 10, 20]
    steps = app.ledger.timeline(handle.task_id).steps
    assert [(s.name, s.seq, s.result_json) for s in steps] == [
        ("item", 0, "0"), ("item#2", 1, "10"), ("item#3", 2, "20")]


def test_loop_effect_runs_each_occurrence_once_with_its_own_key(app: App) -> None:
    """The issue's ``loop_effect``: three charges, each with its key, each once."""
    charged: Counter[str] = Counter()

    def charge(key: str) -> dict[str, str]:
        charged[key] += 1
        return {"charged": key}

    @app.task(name="loop_effect")
    def loop_effect(ctx: TaskContext) -> list[Any]:
        return [ctx.effect("charge", charge, key=f"loop:{i}", lookup=lambda key: NOT_FOUND)
                for i in range(3)]

    handle = app.submit("loop_effect", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == [{"charged": f"loop:{i}"} for i in range(3)]
    assert charged == Counter({"loop:0": 1, "loop:1": 1, "loop:2": 1})
    effects = app.ledger.timeline(handle.task_id).effects
    assert sorted((e.name, e.key, e.seq, e.state) for e in effects) == [
        ("charge", "loop:0", 0, EffectState.DONE),
        ("charge#2", "loop:1", 1, EffectState.DONE),
        ("charge#3", "loop:2", 2, EffectState.DONE),
    ]


def test_replay_resumes_after_iteration_two_and_runs_three_once(app: App) -> None:
    """Attempt 1 fails after iteration 2; attempt 2 reuses iterations 1-2 (step values and
    charges) and runs iteration 3 once."""
    charged: Counter[str] = Counter()
    computed: Counter[int] = Counter()

    def charge(key: str) -> str:
        charged[key] += 1
        return f"ch-{key}"

    def price(i: int) -> int:
        computed[i] += 1
        return 100 + i

    @app.task(name="t.loop_resume", retry=FAST)
    def loop_resume(ctx: TaskContext) -> list[Any]:
        out = []
        for i in range(3):
            amount = ctx.step("price", price, i)
            out.append(ctx.effect("charge", charge, key=f"order-7:{i}",
                                  lookup=lambda key: NOT_FOUND, params=amount))
            if i == 1 and ctx.attempt == 1:
                raise TransientError("crash after iteration 2")
        return out

    handle = app.submit("t.loop_resume", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.attempt == 2
    assert info.result == ["ch-order-7:0", "ch-order-7:1", "ch-order-7:2"]
    assert charged == Counter({"order-7:0": 1, "order-7:1": 1, "order-7:2": 1})
    assert computed == Counter({0: 1, 1: 1, 2: 1})
    tl = app.ledger.timeline(handle.task_id)
    assert [(e.name, e.generation) for e in tl.effects] == [
        ("charge", 1), ("charge#2", 1), ("charge#3", 2)]


def test_replay_in_another_order_is_a_non_determinism_error(app: App) -> None:
    """Attempt 1 records steps a then b; attempt 2 calls b first: it fails permanently,
    naming the position, the recorded and the new checkpoint, and b's value is not reused
    for a."""
    ran: list[str] = []

    @app.task(name="t.reorder", retry=FAST)
    def reorder(ctx: TaskContext) -> str:
        order = ("a", "b") if ctx.attempt == 1 else ("b", "a")
        def run_step(n: str) -> str:
            ran.append(n)
            return n

        for name in order:
            ctx.step(name, run_step, name, durable=True)
        if ctx.attempt == 1:
            raise TransientError("fail once")
        return "done"

    handle = app.submit("t.reorder", {})
    drain(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert info.error_class == "permanent"
    error = info.last_error or ""
    assert "non-deterministic replay" in error and "checkpoint 1 of its code path" in error
    assert "step 'a' (occurrence 1)" in error and "step 'b' (occurrence 1)" in error
    assert ran == ["a", "b"], "attempt 2 ran or reused nothing"


def test_changed_key_at_an_occurrence_is_a_non_determinism_error(app: App) -> None:
    """Occurrence 2 of ``charge`` was recorded with key k:1; a replay asking occurrence 2
    with k:9 fails naming the occurrence and both keys, and charges nothing more."""
    charged: Counter[str] = Counter()

    def charge(key: str) -> str:
        charged[key] += 1
        return key

    @app.task(name="t.rekey", retry=FAST)
    def rekey(ctx: TaskContext) -> list[Any]:
        keys = ["k:0", "k:1"] if ctx.attempt == 1 else ["k:0", "k:9"]
        out = [ctx.effect("charge", charge, key=k, lookup=lambda key: NOT_FOUND) for k in keys]
        if ctx.attempt == 1:
            raise TransientError("fail once")
        return out

    handle = app.submit("t.rekey", {})
    drain(app)
    info = handle.get()
    assert info.state is State.FAILED
    error = info.last_error or ""
    assert "effect 'charge' (occurrence 2)" in error, error
    assert "'k:1'" in error and "'k:9'" in error, error
    assert charged == Counter({"k:0": 1, "k:1": 1})


def test_a_call_beyond_the_history_runs_and_a_shorter_replay_is_fine(app: App) -> None:
    """Only differences are errors: a replay may stop earlier or go further than the
    recorded history (attempt 1 failed part-way)."""

    @app.task(name="t.grow", retry=FAST)
    def grow(ctx: TaskContext) -> list[int]:
        n = 2 if ctx.attempt == 1 else 4
        values = [ctx.step("n", lambda i=i: i, durable=True) for i in range(n)]
        if ctx.attempt == 1:
            raise TransientError("fail once")
        return values

    handle = app.submit("t.grow", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == [0, 1, 2, 3]


def test_a_name_ending_in_hash_digits_is_refused(app: App) -> None:
    @app.task(name="t.badname", retry=FAST)
    def badname(ctx: TaskContext) -> int:
        return int(ctx.step("item#2", lambda: 1))

    handle = app.submit("t.badname", {})
    drain(app)
    info = handle.get()
    assert info.state is State.FAILED
    assert "reserved for occurrences" in (info.last_error or "")


def test_rows_without_a_position_are_reused_by_name(app: App, ledger_url: str) -> None:
    """A step written by a release that recorded no position (a ``(name, result)`` pair)
    is still reused for the first occurrence of its name (rolling upgrade)."""
    ran: Counter[str] = Counter()

    @app.task(name="t.legacy", retry=FAST)
    def legacy(ctx: TaskContext) -> list[Any]:
        ran["body"] += 1
        return [ctx.step("s", lambda: ran.update(["s"]) or "new"),
                ctx.step("s", lambda: "second")]

    handle = app.submit("t.legacy", {})
    ledger = open_ledger(ledger_url)
    try:
        [claim] = ledger.claim("old-release", ["t.legacy"], 1)
        [ok] = ledger.commit([TaskWrite(claim.task_id, claim.generation, "old-release",
                                        "step:s", steps=[("s", dumps("old"))])])
        assert ok.ok
        ledger.revoke_holder("old-release", "test", "simulated old worker gone")
    finally:
        ledger.close()
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == ["old", "second"]
    assert ran["s"] == 0


def test_fenced_effect_hands_the_token_to_call_and_lookup(app: App) -> None:
    """``fenced=True``: call and lookup get the claim's fencing token (the generation), and
    a fenced lookup's NOT_FOUND is proof at once (no in_flight_s wait)."""
    seen: list[tuple[str, str, int]] = []
    lost_reply = {"left": 1}

    def call(key: str, token: int) -> str:
        seen.append(("call", key, token))
        if lost_reply["left"]:
            lost_reply["left"] -= 1
            raise TimeoutError("reply lost")  # unknown outcome: look up first
        return f"ok-{token}"

    def lookup(key: str, token: int) -> Any:
        seen.append(("lookup", key, token))
        return NOT_FOUND

    @app.task(name="t.fenced", retry=FAST)
    def fenced(ctx: TaskContext) -> Any:
        assert ctx.fencing_token == ctx.generation
        return ctx.effect("pay", call, key="pay:1", lookup=lookup, fenced=True,
                          in_flight_s=3600.0)

    handle = app.submit("t.fenced", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == "ok-2"
    # Attempt 1: the reply is lost, the fenced lookup proves absence at once (despite
    # in_flight_s=3600) and the attempt retries; attempt 2 looks up first, then calls.
    assert seen == [("call", "pay:1", 1), ("lookup", "pay:1", 1),
                    ("lookup", "pay:1", 2), ("call", "pay:1", 2)]


def test_token_rejected_while_the_claim_is_current_fails_clearly(app: App) -> None:
    """The target refuses the token of the task's current claim (its tokens for the key
    come from elsewhere: another task shares the key). Not a stale holder: the effect is
    recorded as not done and the task fails at once, naming the token and the key, instead
    of idling until its lease expires. (A refused token of a stale holder is the
    frozen-sender tests' case: that attempt is dropped.)"""
    from ratchet import TokenRejected

    @app.task(name="t.rejected", retry=RetryPolicy(max_attempts=3))
    def rejected(ctx: TaskContext) -> Any:
        def call(key: str, token: int) -> str:
            raise TokenRejected(key, token, token + 5)
        return ctx.effect("pay", call, key="pay:2", fenced=True)

    handle = app.submit("t.rejected", {})
    drain(app)
    info = handle.get()
    assert info.state is State.FAILED and info.attempt == 1
    assert info.error_class == "permanent"
    assert "refused fencing token 1 for key 'pay:2'" in (info.last_error or "")
    [effect] = app.ledger.timeline(handle.task_id).effects
    assert effect.state is EffectState.NOT_DONE
    assert app.ledger.late_effects(handle.task_id) == []


@pytest.mark.parametrize("fenced", [True, False])
def test_a_call_of_the_wrong_shape_is_refused_before_the_intent(app: App, fenced: bool) -> None:
    """``fenced=True`` calls ``call(key, token)``: a one-argument call is refused up front
    (InvalidArguments, FAILED), not after its intent (which would need an operator)."""

    @app.task(name="t.shape", retry=FAST)
    def shape(ctx: TaskContext) -> Any:
        call = (lambda key: key) if fenced else (lambda key, token: key)
        return ctx.effect("pay", call, key="pay:3", fenced=fenced)

    handle = app.submit("t.shape", {})
    drain(app)
    info = handle.get()
    assert info.state is State.FAILED and info.attempt == 1
    expected = "call(key, token)" if fenced else "call(key)"
    assert expected in (info.last_error or ""), info.last_error
    assert app.ledger.timeline(handle.task_id).effects == []


@pytest.mark.parametrize("case", ["frozen", "frozen_then_outage", "in_window"])
def test_a_stale_holders_sent_call_is_recorded_as_a_late_effect(app: App, case: str) -> None:
    """The holder's claim is taken over while its call is out. ``frozen``: the reply comes
    after the holder's safe window closed (what a holder frozen past its lease sees when it
    wakes): its result write is fenced out and the call it sent is kept, unfenced, as a
    late effect (listed, counted in stats, shown in the timeline, audited).
    ``frozen_then_outage``: the same, but the result write meets an outage instead of a
    stale rejection: the record is still made once the ledger answers. ``in_window``: the
    reply came while the lease was still confirmed, so the request executed before any
    takeover by expiry could happen: no late effect, only the stale rejection."""
    window_closed = case != "in_window"
    failed = _fail_once(app, "effect_done:charge") if case == "frozen_then_outage" else []
    charged: Counter[str] = Counter()

    @app.task(name="t.late", retry=FAST)
    def late(ctx: TaskContext) -> Any:
        def call(key: str) -> str:
            charged[key] += 1
            if ctx.generation == 1:
                app.ledger.revoke_holder(ctx.holder, "test", "simulated takeover")
                if window_closed:
                    ctx.lease.mark_lost()
            return f"charge-{ctx.generation}"

        def lookup(key: str) -> Any:
            return f"charge-found-{charged[key]}" if charged[key] else NOT_FOUND

        return ctx.effect("charge", call, key="late:1", lookup=lookup)

    handle = app.submit("t.late", {})
    drain(app)
    info = handle.get()
    assert info.state is State.SUCCEEDED, info.last_error
    assert info.result == "charge-found-1", "generation 2 found the stale holder's charge"
    assert charged == Counter({"late:1": 1})
    tl = app.ledger.timeline(handle.task_id)
    stale = [e.detail["operation"] for e in tl.events if e.kind == "stale_rejected"]
    if case == "frozen_then_outage":
        # The outage hands the attempt back: that release is what the fence rejects.
        assert failed == ["effect_done:charge"] and stale == ["finish:PENDING"]
    else:
        assert stale == ["effect_done:charge"]
    if not window_closed:
        assert app.ledger.late_effects() == [] and app.ledger.stats().late_effects == 0
        return
    [record] = app.ledger.late_effects(handle.task_id)
    assert (record.task_id, record.effect, record.key, record.generation, record.outcome) == (
        handle.task_id, "charge", "late:1", 1, "done")
    assert record.detail == dumps("charge-1") and record.seq > 0 and record.at > 0
    assert app.ledger.late_effects() == [record]
    assert app.ledger.stats().late_effects == 1
    assert app.ledger.timeline(handle.task_id).late_effects == [record]
    assert [e.generation for e in tl.events if e.kind == "late_effect"] == [1]


def test_occurrences_survive_a_real_crash_after_iteration_two(tmp_path: Path,
                                                              ledger_url: str) -> None:
    """A worker process is SIGKILLed right after the target executed iteration 2's charge
    (before its result was recorded). A new worker resumes: iteration 1 from the ledger,
    iteration 2 found by lookup, iteration 3 charged once. Counted at the target."""
    service = start_counting_service(tmp_path / "svc", honour_keys=False)
    try:
        (tmp_path / "occapp.py").write_text(textwrap.dedent(f"""
            from ratchet import App, RetryPolicy
            from ratchet.testing import CountingClient

            app = App({ledger_url!r})
            client = CountingClient({service.url!r}, timeout_s=5.0)

            @app.task(name="occ.loop", lease_s=2.0,
                      retry=RetryPolicy(max_attempts=5, base_delay_s=0.05, jitter=0.0))
            def loop(ctx):
                out = []
                for i in range(3):
                    amount = ctx.step("price", lambda i=i: 100 + i)
                    record = ctx.effect(
                        "charge", lambda key, a=amount: client.execute(key, {{"a": a}}),
                        key=f"occ:{{i}}", lookup=client.lookup, params=amount)
                    out.append(record["key"])
                return out
        """))
        spec = importlib.util.spec_from_file_location("occapp_submitter", tmp_path / "occapp.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        app: App = module.app
        try:
            handle = app.submit("occ.loop", {})
            with ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path]) as group:
                crashing = group.worker("occapp:app", ledger_url, name="A", env={
                    "RATCHET_CRASH_AT": "effect.after_call", "RATCHET_CRASH_SKIP": "1"})
                wait_for("worker A to die at the crash point",
                         lambda: crashing.returncode is not None, timeout_s=30.0)
                assert service.executions() == {"occ:0": 1, "occ:1": 1}
                group.worker("occapp:app", ledger_url, name="B", fast_takeover=True)
                info = app.wait(handle.task_id, timeout_s=40.0)
            assert info.state is State.SUCCEEDED, info.last_error
            assert info.result == ["occ:0", "occ:1", "occ:2"]
            assert service.executions() == {"occ:0": 1, "occ:1": 1, "occ:2": 1}
            effects = {e.name: e for e in app.ledger.timeline(handle.task_id).effects}
            assert effects["charge#2"].via_lookup and not effects["charge#3"].via_lookup
        finally:
            app.close()
    finally:
        service.stop()


def test_permanent_error_base_class_is_kept() -> None:
    """``NonDeterministicReplay`` is a ``PermanentError``: code that catches the latter
    keeps working."""
    assert issubclass(NonDeterministicReplay, PermanentError)
    assert sys.modules["ratchet"].NonDeterministicReplay is NonDeterministicReplay


def _fail_once(app: App, operation: str) -> list[str]:
    """Make the ledger's next commit that carries ``operation`` fail as an outage
    (``LedgerUnavailable``), once; returns the list the injection appends to."""
    from ratchet.errors import LedgerUnavailable

    ledger = app.ledger
    failed: list[str] = []
    for method in ("commit", "commit_and_claim"):
        original = getattr(ledger, method)

        def wrapped(writes: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not failed and any(w.operation == operation for w in writes):
                failed.append(operation)
                raise LedgerUnavailable("injected outage")
            return _original(writes, *args, **kwargs)

        setattr(ledger, method, wrapped)
    return failed


def test_a_flush_lost_to_an_outage_leaves_no_hole_in_the_history(app: App) -> None:
    """Step a's pipelined write is lost to an outage; the next flush must carry a again
    with b, so the durable history is always a prefix of the code path (never b without
    a: a crash then would re-run a and reuse a b computed from the old a)."""
    import threading

    release = threading.Event()
    observed: list[list[str]] = []

    @app.task(name="t.prefix")
    def prefix(ctx: TaskContext) -> int:
        ctx.step("a", lambda: 1)
        ctx.step("b", lambda: 2)  # starting b hands a's write to the writer: it fails
        wait_for("the injected outage", lambda: failed)
        for _ in range(20):  # each step start hands the pending steps to the writer
            ctx.step("c", time.sleep, 0.01)
        release.wait(20)
        return 0

    failed = _fail_once(app, "step:a")
    handle = app.submit("t.prefix", {})
    with running_worker(app, concurrency=1):
        def durable() -> list[str] | None:
            names = [s.name for s in app.ledger.timeline(handle.task_id).steps]
            observed.append(names)
            return names if len(names) >= 2 else None

        names = wait_for("steps a and b to be durable", durable)
        release.set()
        wait_for("the task to finish", lambda: handle.get().state is State.SUCCEEDED)
    assert failed == ["step:a"], "the outage was injected"
    assert names[:2] == ["a", "b"]
    expected = ["a", "b", "c", *[f"c#{n}" for n in range(2, 21)]]
    assert all(seen == expected[: len(seen)] for seen in observed), observed
