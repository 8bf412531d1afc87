"""The capacity view of ``Control.status`` (DESIGN §9) and ``Control.throughput``, on both
ledgers: per-state counts are what the ledger holds and add up to the total, ready work
is split into backlog (ready now) and scheduled (later), rates come from the window's rows,
the drain ETA is shown only while the net rate is positive; plus the arithmetic itself."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

import pytest

from ratchet import App, Control, InvalidArguments, State, TaskContext, open_ledger
from ratchet.capacity import capacity_views
from ratchet.control import ALL_TYPES, ThroughputBucket, TypeStatusView
from ratchet.fingerprint import fingerprint
from ratchet.ledger.base import Ledger, TaskWrite, Transition, TypeCapacity
from ratchet.testing.processes import wait_for

A = "cap.a"
B = "cap.b"


@pytest.fixture
def capp(ledger_url: str) -> Iterator[App]:
    app = App(ledger_url)

    @app.task(name=A)
    def a(ctx: TaskContext, n: int) -> int:
        return n

    @app.task(name=B)
    def b(ctx: TaskContext, n: int) -> int:
        return n

    yield app
    app.close()


@pytest.fixture
def led(ledger_url: str, capp: App) -> Iterator[Ledger]:
    capp.submit(A, {"n": -1}, delay_s=1e6)  # migrate; a task far in the future (scheduled)
    ledger = open_ledger(ledger_url)
    yield ledger
    ledger.close()


def _finish(led: Ledger, name: str, to: State, *, fp: str | None = None) -> str:
    """Claim one ready task of ``name`` and write ``to`` for it, as a worker does."""
    [claim] = led.claim("w-cap", [name], 1)
    [ok] = led.commit([TaskWrite(
        claim.task_id, claim.generation, "w-cap", f"finish:{to.value}",
        transition=Transition(to, result_json="1" if to is State.SUCCEEDED else None,
                              error=None if to is State.SUCCEEDED else "RuntimeError: boom",
                              error_class=None if to is State.SUCCEEDED else "transient",
                              fingerprint=fp))])
    assert ok.ok
    return claim.task_id


def _view(report_types: list[TypeStatusView], name: str) -> TypeStatusView:
    [view] = [t for t in report_types if t.name == name]
    return view


def test_counts_backlog_scheduled_unknown_quarantined(capp: App, led: Ledger) -> None:
    for n in range(4):
        capp.submit(A, {"n": n})
    capp.submit(A, {"n": 10}, delay_s=3600)          # delayed: scheduled, not backlog
    cancelled = capp.submit(B, {"n": 1}, delay_s=3600)
    q = capp.submit(B, {"n": 3})
    _quarantine(led, q.task_id)                       # a quarantined FAILED (DESIGN §7)
    capp.submit(B, {"n": 2})
    _finish(led, A, State.SUCCEEDED)
    [running] = led.claim("w-cap", [A], 1)            # RUNNING, leased
    assert running.task_id
    # UNKNOWN: the worker could not tell whether its effect happened.
    [claim] = led.claim("w-cap", [A], 1)
    [ok] = led.commit([TaskWrite(claim.task_id, claim.generation, "w-cap", "unknown",
                                 transition=Transition(State.UNKNOWN, error="lost reply",
                                                       error_class="unknown_outcome"))])
    assert ok.ok
    with Control(app=capp) as control:
        # Cancelled before it started: finished, never active again.
        assert control.cancel(cancelled.task_id, reason="test").outcome == "done"
        report = control.status(window_s=3600)
    a, b, total = _view(report.types, A), _view(report.types, B), report.totals
    assert total is not None and total.name == ALL_TYPES
    assert report.window_s == 3600
    assert a.counts == {"PENDING": 3, "RUNNING": 1, "UNKNOWN": 1, "SUCCEEDED": 1}, a
    # One PENDING from the fixture and one here have a later run_at: scheduled.
    assert (a.backlog, a.scheduled, a.running, a.unknown) == (1, 2, 1, 1), a
    assert a.oldest_pending_age_s is not None and a.oldest_pending_age_s >= 0
    assert a.oldest_unknown_age_s is not None and a.oldest_unknown_age_s >= 0
    assert b.counts == {"PENDING": 1, "CANCELLED": 1, "FAILED": 1}, b
    assert (b.backlog, b.scheduled, b.running, b.quarantined) == (1, 0, 0, 1), b
    assert b.oldest_pending_age_s is not None and b.oldest_pending_age_s >= 0
    for view in (a, b, total):
        assert sum(view.counts.values()) == view.total
        waiting = view.counts.get("PENDING", 0) + view.counts.get("RETRY_WAIT", 0)
        assert view.backlog + view.scheduled == waiting
    assert total.total == a.total + b.total == 9
    assert report.counts == {A: a.counts, B: b.counts}
    # Every task arrived in the window; completions: succeeded, cancelled, quarantined,
    # and the task that went UNKNOWN (it waits for a person, not a worker).
    assert a.arrival_per_s == pytest.approx(6 / 3600)
    assert a.completion_per_s == pytest.approx(2 / 3600)
    assert b.arrival_per_s == pytest.approx(3 / 3600)
    assert b.completion_per_s == pytest.approx(2 / 3600)
    assert total.completion_per_s == pytest.approx(4 / 3600)
    assert total.net_drain_per_s == pytest.approx(-5 / 3600)
    assert total.drain_eta_s is None          # growing: no ETA
    assert (total.unknown, total.quarantined, total.backlog, total.scheduled) == (1, 1, 2, 2)
    assert total.running == 1


def _quarantine(led: Ledger, task_id: str) -> None:
    """Fail ``task_id`` with the same fingerprint until the ledger quarantines it (the
    App's default ``quarantine_after`` is 3)."""
    fp = fingerprint(B, "RuntimeError", "boom")
    for _ in range(10):
        [claim] = led.claim("w-cap", [B], 1)
        assert claim.task_id == task_id
        [ok] = led.commit([TaskWrite(
            task_id, claim.generation, "w-cap", "fail",
            transition=Transition(State.RETRY_WAIT, error="RuntimeError: boom",
                                  error_class="transient", reason="retry", fingerprint=fp))])
        assert ok.ok
        if led.get(task_id).state is State.FAILED:
            return
    raise AssertionError("never quarantined")


def test_drain_eta_when_completions_outpace_arrivals(capp: App, led: Ledger) -> None:
    """Tasks submitted before the window and finished inside it: the net rate is positive,
    the ETA is backlog / net (over the window's recent part: arrivals stopped)."""
    for n in range(5):
        capp.submit(A, {"n": n})
    created = max(t.created_at for t in capp.list_tasks(limit=10).tasks)
    window = 2.0
    with Control(app=capp) as control:
        wait_for("the submits to leave the window",
                 lambda: control.ledger_now() > created + window + 0.05, timeout_s=30)
        _finish(led, A, State.SUCCEEDED)
        _finish(led, A, State.FAILED)
        report = control.status(window_s=window)
    a = _view(report.types, A)
    if a.completion_per_s < 2 / window:  # the machine stalled past the window: no claim
        pytest.skip("the finishes fell out of the 2 s window on a stalled machine")
    assert a.arrival_per_s == 0 and a.completion_per_s == pytest.approx(2 / window)
    assert a.backlog == 3 and a.scheduled == 1
    # Nothing arrived in the window: the estimate is over its recent part (0.5 s), which
    # holds the finishes unless the machine stalled between them and the read.
    assert a.arrivals_stopped and a.drain_window_s == window / 4
    recent = a.net_drain_per_s * window / 4
    assert recent == pytest.approx(round(recent)) and 0 <= round(recent) <= 2
    if recent:
        assert a.drain_eta_s == pytest.approx(3 / a.net_drain_per_s)


def test_the_totals_verdict_accounts_for_paused_types(capp: App, led: Ledger) -> None:
    """The only backlog is a paused type's: the totals' row says it waits in a paused type,
    not that the backlog grows; with ready work elsewhere it says how much is held."""
    for n in range(5):
        capp.submit(B, {"n": n})
    with Control(app=capp) as control:
        control.pause("type", B, reason="trial", by="op")
        report = control.status(window_s=60.0)
        b = _view(report.types, B)
        assert b.paused is not None and b.held_back == 5
        assert report.totals.backlog == 5 and report.totals.net_drain_per_s < 0
        assert report.totals.held_back == 5 and report.totals.held_in == [f"{B} (paused)"]
        assert "growing" not in report.totals.drain, report.totals.drain
        assert report.totals.drain.endswith(
            f"5 ready wait in paused or limited types ({B} (paused))"), report.totals.drain
        assert report.totals.drain_eta_s is None
        for n in range(2):
            capp.submit(A, {"n": n})
        totals = control.status(window_s=60.0).totals
        assert totals.backlog == 7 and totals.held_back == 5
        assert totals.drain.startswith("backlog growing by "), totals.drain
        assert totals.drain.endswith(
            f"of them 5 ready wait in paused or limited types ({B} (paused))"), totals.drain


def _cap(name: str, **kw: object) -> TypeCapacity:
    return TypeCapacity(name, **kw)  # type: ignore[arg-type]


def test_capacity_arithmetic() -> None:
    counts = {"x": {"PENDING": 8, "RETRY_WAIT": 2, "RUNNING": 3, "SUCCEEDED": 50},
              "y": {"PENDING": 4, "UNKNOWN": 2, "FAILED": 1}}
    caps = [_cap("x", scheduled=3, oldest_ready_at=90.0, arrivals=60, completions=120,
                 recent_arrivals=15, recent_completions=30),
            _cap("y", scheduled=9, oldest_ready_at=None, oldest_unknown_at=40.0, unknown=2,
                 quarantined=1, arrivals=30, completions=6, recent_arrivals=7),
            _cap("z", arrivals=0, completions=6, recent_completions=2)]  # rows pruned
    views, total = capacity_views(counts, caps, now=100.0, window_s=60.0)
    x, y, z = views
    assert [v.name for v in views] == ["x", "y", "z"]
    # x: draining at 1/s with 7 ready -> 7 s.
    assert (x.backlog, x.scheduled, x.running, x.total) == (7, 3, 3, 63)
    assert x.arrival_per_s == 1.0 and x.completion_per_s == 2.0 and x.net_drain_per_s == 1.0
    assert x.drain_eta_s == 7.0 and x.oldest_pending_age_s == 10.0
    # y: growing (arrivals 0.5/s, completions 0.1/s): no ETA; the
    # scheduled count is clamped to what PENDING/RETRY_WAIT hold (another snapshot).
    assert y.net_drain_per_s == pytest.approx(-0.4) and y.drain_eta_s is None
    assert (y.backlog, y.scheduled) == (0, 4) and y.oldest_pending_age_s is None
    assert (y.unknown, y.oldest_unknown_age_s, y.quarantined) == (2, 60.0, 1)
    assert z.total == 0 and z.counts == {} and z.drain_eta_s == 0.0  # nothing left to drain
    # Totals: summed counts and rates, the oldest ages over all types.
    assert total.name == ALL_TYPES
    assert total.counts == {"PENDING": 12, "RETRY_WAIT": 2, "RUNNING": 3, "SUCCEEDED": 50,
                            "UNKNOWN": 2, "FAILED": 1}
    assert total.total == x.total + y.total == sum(total.counts.values())
    assert (total.backlog, total.scheduled) == (7, 7)
    assert total.arrival_per_s == 1.5 and total.completion_per_s == 2.2
    assert total.drain_eta_s == pytest.approx(7 / 0.7)
    assert total.oldest_pending_age_s == 10.0 and total.oldest_unknown_age_s == 60.0
    assert (total.unknown, total.quarantined) == (2, 1)
    # Net rate exactly zero: neither draining nor an ETA.
    [flat], _ = capacity_views({"f": {"PENDING": 1}},
                               [_cap("f", arrivals=5, completions=5, recent_arrivals=1)],
                               now=0.0, window_s=5.0)
    assert flat.net_drain_per_s == 0 and flat.drain_eta_s is None
    assert set(dataclasses.asdict(flat)) == {f.name for f in dataclasses.fields(TypeStatusView)}


def test_throughput_buckets(capp: App, led: Ledger) -> None:
    for n in range(4):
        capp.submit(A, {"n": n})
    capp.submit(B, {"n": 1})
    _finish(led, A, State.SUCCEEDED)
    _finish(led, B, State.SUCCEEDED)
    with Control(app=capp) as control:
        buckets = control.throughput(window_s=65, bucket_s=10)
        only_b = control.throughput(window_s=65, bucket_s=10, name=B)
        now = control.ledger_now()
        assert control.throughput(window_s=3, bucket_s=3) != []
        for kwargs in ({"window_s": 0}, {"window_s": math.inf}, {"bucket_s": -1},
                       {"window_s": 10, "bucket_s": 20}, {"window_s": 86400, "bucket_s": 1},
                       {"window_s": True}, {"name": "x\x00"}):
            with pytest.raises(InvalidArguments):
                control.throughput(**kwargs)  # type: ignore[arg-type]
    assert len(buckets) == 7 and all(isinstance(b, ThroughputBucket) for b in buckets)
    starts = [b.start for b in buckets]
    assert starts == sorted(starts)
    assert all(s2 - s1 == pytest.approx(10) for s1, s2 in itertools.pairwise(starts))
    assert starts[-1] + 10 <= now + 1e-6 and starts[-1] + 10 > now - 5
    # The fixture's task and these five arrived in the window; two finished.
    assert sum(b.arrivals for b in buckets) == 6
    assert sum(b.completions for b in buckets) == 2
    assert sum(b.arrivals for b in only_b) == 1 and sum(b.completions for b in only_b) == 1
    assert len(only_b) == len(buckets) and only_b[0].start >= starts[0]


def test_status_window_is_checked(capp: App, led: Ledger) -> None:
    with Control(app=capp) as control:
        for bad in (0, -1, math.nan, 86_401, "60", False):
            with pytest.raises(InvalidArguments):
                control.status(window_s=bad)  # type: ignore[arg-type]
        assert control.status(window_s=0.5).window_s == 0.5


def test_revoked_and_cancelled_work_is_not_active(capp: App, led: Ledger) -> None:
    """A dead holder's revoked lease puts its task back in the backlog (not running); a
    cancelled task is finished (a completion), never backlog, scheduled or running."""
    capp.submit(A, {"n": 1})
    doomed = capp.submit(A, {"n": 2}, delay_s=3600)
    [claim] = led.claim("w-dead", [A], 1)
    with Control(app=capp) as control:
        before = _view(control.status().types, A)
        assert (before.running, before.backlog, before.scheduled) == (1, 0, 2)
        assert led.revoke_holder("w-dead", by="test", reason="process gone") == [claim.task_id]
        assert control.cancel(doomed.task_id, reason="test").outcome == "done"
        after = _view(control.status().types, A)
    assert after.counts == {"RETRY_WAIT": 1, "PENDING": 1, "CANCELLED": 1}, after
    assert (after.running, after.backlog, after.scheduled) == (0, 1, 1)
    assert after.completion_per_s == pytest.approx(1 / 60)
