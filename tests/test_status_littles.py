"""Capacity by Little's law in ``Control.status`` (DESIGN §9): the mean attempt duration W
read from the audit's claim/end pairs, the slots of the live workers serving each type,
L = λ·W against them, and the slots that drain a backlog within a given time, on both
ledgers (a real SQLite file, a real PostgreSQL schema), through ``ratchet status`` (text,
``--json``, ``--drain-within``; the HTTP faces: tests/web/test_status_littles_web.py).
Plus the pure arithmetic (:mod:`ratchet.littles`) as properties."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from ratchet import App, Control, InvalidArguments, State, TaskContext, open_ledger
from ratchet.capacity import ALL_TYPES, capacity_views
from ratchet.cli.main import cli
from ratchet.ledger.base import DefinitionSpec, TaskWrite, Transition, TypeCapacity, WorkerInfo
from ratchet.ledger.base import WorkerSlots as Slots
from ratchet.littles import (
    drain_work_s,
    in_flight,
    mean_attempt_s,
    slots_by_type,
    slots_for,
    slots_needed,
    slots_total,
)
from ratchet.testing.worker import running_worker
from ratchet.worker.registry import host_identity

SLOW = "littles.slow"
OTHER = "littles.other"
BODY_S = 0.3
"""The known service time of a :data:`SLOW` attempt: its body sleeps this long."""

# ------------------------------------------------------------------ the arithmetic

backlogs = st.integers(min_value=0, max_value=10**6)
rates = st.floats(min_value=0, max_value=1e4, allow_nan=False, allow_infinity=False)
means = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
withins = st.floats(min_value=1e-2, max_value=1e7, allow_nan=False, allow_infinity=False)


@given(backlogs, rates, means, withins)
def test_slots_needed_drain_the_backlog_and_no_fewer_would(
        backlog: int, rate: float, mean: float, within: float) -> None:
    n = slots_needed(backlog, rate, mean, within)
    work = (backlog + rate * within) * mean
    # n slots serve n·T/W attempts in T: the backlog and what arrives meanwhile ...
    assert n * within / mean >= (backlog + rate * within) * (1 - 1e-6)
    # ... and one slot fewer would not.
    if n > 0:
        assert (n - 1) * within < work
    assert n == slots_for(drain_work_s(backlog, rate, mean, within), within)


@given(backlogs, rates, means, withins, st.integers(min_value=1, max_value=1000))
def test_slots_needed_grows_with_the_work_and_shrinks_with_time(
        backlog: int, rate: float, mean: float, within: float, more: int) -> None:
    n = slots_needed(backlog, rate, mean, within)
    assert slots_needed(backlog + more, rate, mean, within) >= n
    assert slots_needed(backlog, rate, mean * 2, within) >= n
    assert slots_needed(backlog, rate, mean, within * 2) <= max(n, math.ceil(rate * mean))
    # Arrivals alone need at least L = λW slots however long the time.
    assert slots_needed(backlog, rate, mean, within) >= math.floor(in_flight(rate, mean))


@given(rates, means)
def test_l_is_the_arrival_rate_times_w(rate: float, mean: float) -> None:
    assert in_flight(rate, mean) == rate * mean
    assert mean_attempt_s(4, 4 * mean) == pytest.approx(mean)


def test_the_arithmetic_refuses_what_means_nothing() -> None:
    assert mean_attempt_s(0, 0.0) is None
    assert slots_needed(0, 0.0, 5.0, 60.0) == 0
    assert slots_needed(10, 0.0, 6.0, 60.0) == 1  # 60 slot-seconds in 60 s: exactly one
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            in_flight(bad, 1.0)
        with pytest.raises(ValueError):
            slots_needed(1, 1.0, bad, 60.0)
    with pytest.raises(ValueError):
        slots_needed(1, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        capacity_views({}, [], 0.0, 60.0, drain_within_s=0.0)


def test_slots_count_each_worker_once_per_type_and_once_overall() -> None:
    workers = [Slots("w1", 4, ("a", "b")), Slots("w2", 8, ("a",)), Slots("w3", None, ("b",)),
               Slots("w4", 2, ())]
    by = slots_by_type(workers)
    assert (by["a"].slots, by["a"].workers, by["a"].unrecorded) == (12, 2, 0)
    assert (by["b"].slots, by["b"].workers, by["b"].unrecorded) == (4, 2, 1)
    total = slots_total(workers)
    assert (total.slots, total.workers, total.unrecorded) == (12, 3, 1)


def test_the_capacity_verdicts() -> None:
    counts = {"a": {"PENDING": 30}, "b": {"PENDING": 5}, "c": {"SUCCEEDED": 1}}
    # a: 60 arrivals in 60 s, 10 attempts of 3 s: L = 3 of 2 slots; b: L = 0.25 of 4.
    caps = [TypeCapacity("a", arrivals=60, recent_arrivals=10, attempts=10, attempt_s=30.0),
            TypeCapacity("b", arrivals=5, recent_arrivals=1, attempts=2, attempt_s=6.0),
            TypeCapacity("c", completions=1)]
    workers = [Slots("w1", 2, ("a", "b")), Slots("w2", 2, ("b",))]
    views, totals = capacity_views(counts, caps, 1000.0, 60.0, workers=workers,
                                   drain_within_s=600.0)
    a, b, c = views
    assert a.mean_attempt_s == pytest.approx(3.0) and a.in_flight == pytest.approx(3.0)
    assert (a.slots, a.workers, a.over_capacity) == (2, 1, True)
    assert a.capacity.startswith("needs ~3 of 2 slots; cannot keep up: the backlog cannot "
                                 "converge at this arrival rate"), a.capacity
    # (30 + 1/s · 600 s) · 3 s / 600 s = 3.15: 4 slots.
    assert a.slots_needed == 4 and a.capacity.endswith("4 slots drain the backlog within "
                                                        "10m00s"), a.capacity
    assert (b.slots, b.workers, b.over_capacity) == (4, 2, False)
    assert b.capacity.startswith("needs ~0.25 of 4 slots;"), b.capacity
    assert c.mean_attempt_s is None and c.in_flight is None and c.slots_needed is None
    assert c.capacity == ("no live worker serves it; W unknown (no attempt ended in the "
                          "window)"), c.capacity
    assert totals.name == ALL_TYPES and (totals.slots, totals.workers) == (4, 2)
    assert totals.attempts == 12 and totals.mean_attempt_s == pytest.approx(3.0)
    assert totals.in_flight == pytest.approx(3.25) and not totals.over_capacity
    assert totals.slots_needed == math.ceil((30 * 3 + 600 * 3 + 5 * 3 + 50 * 3) / 600)
    # Not asked: no slots needed anywhere.
    views, totals = capacity_views(counts, caps, 1000.0, 60.0, workers=workers)
    assert all(v.slots_needed is None and v.drain_within_s is None
               for v in (*views, totals))


# ------------------------------------------------------------------ on real ledgers


@pytest.fixture
def lapp(ledger_url: str) -> Iterator[App]:
    app = App(ledger_url)

    @app.task(name=SLOW)
    def slow(ctx: TaskContext, n: int) -> int:
        threading.Event().wait(BODY_S)  # the attempt's known service time
        return n

    @app.task(name=OTHER)
    def other(ctx: TaskContext, n: int) -> int:
        return n

    yield app
    app.close()


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_w_slots_and_l_from_real_attempts_and_a_real_worker(
        ledger_url: str, lapp: App) -> None:
    handles = [lapp.submit(SLOW, {"n": n}) for n in range(6)]
    backlog = [lapp.submit(OTHER, {"n": n}) for n in range(3)]
    led = open_ledger(ledger_url)
    try:
        # A worker of another release (no slots record) and one that runs two versions of
        # SLOW on 5 slots shared with OTHER: counted once per type.
        here = host_identity()
        led.register_worker(WorkerInfo("w-two", here, "h", os.getpid(), None))
        led.record_worker_slots("w-two", 5)
        led.register_definitions("w-two", [DefinitionSpec(SLOW, 1, "{}"),
                                           DefinitionSpec(SLOW, 2, "{}"),
                                           DefinitionSpec(OTHER, 1, "{}")])
        led.register_worker(WorkerInfo("w-old", here, "h", os.getpid(), None))
        led.register_definitions("w-old", [DefinitionSpec(OTHER, 1, "{}")])
        # prefetch 0: a task is claimed only for a free thread, so W is its body's time.
        with running_worker(lapp, concurrency=3, prefetch=0, names=[SLOW]):
            for h in handles:
                assert lapp.wait(h.task_id, timeout_s=60).state is State.SUCCEEDED
            with Control(ledger_url) as control:
                report = control.status(window_s=600, drain_within_s=60)
            as_json = json.loads(_cli("status", "--ledger", ledger_url, "--window", "10m",
                                      "--drain-within", "1m", "--json"))
            text = _cli("status", "--ledger", ledger_url, "--window", "10m",
                        "--drain-within", "90s")
    finally:
        led.close()
    slow = next(v for v in report.types if v.name == SLOW)
    other = next(v for v in report.types if v.name == OTHER)
    assert slow.attempts == 6
    assert slow.mean_attempt_s is not None
    assert BODY_S <= slow.mean_attempt_s < BODY_S + 2.0, slow.mean_attempt_s
    # The running worker (3 slots) and w-two (5 slots, two versions: once).
    assert (slow.slots, slow.workers, slow.slots_unrecorded) == (8, 2, 0)
    assert slow.in_flight == pytest.approx(slow.arrival_per_s * slow.mean_attempt_s)
    assert slow.in_flight == pytest.approx(6 / 600 * slow.mean_attempt_s)
    assert not slow.over_capacity and slow.capacity.startswith("needs ~"), slow.capacity
    assert slow.slots_needed == slots_needed(0, slow.arrival_per_s, slow.mean_attempt_s, 60)
    # OTHER: nothing ran; w-two and w-old serve it, w-old recorded no slots.
    assert other.attempts == 0 and other.mean_attempt_s is None and other.in_flight is None
    assert (other.slots, other.workers, other.slots_unrecorded) == (5, 2, 1)
    assert other.backlog == len(backlog) and other.slots_needed is None
    assert "W unknown" in other.capacity, other.capacity
    assert report.drain_within_s == 60
    assert report.totals is not None and report.totals.slots == 8
    assert report.totals.workers == 3 and report.totals.slots_unrecorded == 1
    # --json: the same record, --drain-within 1m as 60 s.
    assert as_json["drain_within_s"] == 60
    [js] = [t for t in as_json["types"] if t["name"] == SLOW]
    assert js["attempts"] == 6 and js["slots"] == 8 and js["workers"] == 2
    assert BODY_S <= js["mean_attempt_s"] < BODY_S + 2.0
    assert js["in_flight"] == pytest.approx(js["arrival_per_s"] * js["mean_attempt_s"])
    assert js["slots_needed"] == 1 and js["capacity"].startswith("needs ~")
    # The table: its own title, the figures and the verdict.
    assert "capacity by Little's law" in text and "slots needed" in text, text
    assert "drain within 1m30s" in text, text


def test_w_counts_every_outcome_but_a_release_and_not_a_wait(ledger_url: str,
                                                               lapp: App) -> None:
    for n in range(4):
        lapp.submit(OTHER, {"n": n})
    led = open_ledger(ledger_url)
    try:
        claims = led.claim("w-w", [OTHER], 4)
        assert len(claims) == 4
        ends = [Transition(State.SUCCEEDED, result_json="1"),
                Transition(State.FAILED, error="E: x", error_class="permanent"),
                Transition(State.RETRY_WAIT, error="E: y", error_class="transient",
                           delay_s=3600),
                Transition(State.PENDING)]  # a release: handed back, not service
        outcomes = led.commit([TaskWrite(c.task_id, c.generation, "w-w", "end", transition=t)
                               for c, t in zip(claims, ends, strict=True)])
        assert all(o.ok for o in outcomes), outcomes
        stats = led.stats(window_s=600)
    finally:
        led.close()
    [cap] = [c for c in stats.capacity if c.name == OTHER]
    assert cap.attempts == 3 and cap.attempt_s >= 0.0


def test_bad_drain_within_is_refused(ledger_url: str, lapp: App) -> None:
    assert lapp.ledger is not None
    for bad in ("10x", "0", "-5m", "soon"):
        result = CliRunner().invoke(cli, ["status", "--ledger", ledger_url,
                                          "--drain-within", bad])
        assert result.exit_code == 2, (bad, result.output)
        assert "--drain-within" in result.output, result.output
    with Control(ledger_url) as control:
        for value in (0, -1.0, math.inf, math.nan):
            with pytest.raises(InvalidArguments, match="drain_within_s"):
                control.status(drain_within_s=value)
