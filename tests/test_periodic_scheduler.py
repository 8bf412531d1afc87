"""The scheduler of periodic tasks with injected clocks (no waiting), on both ledgers.

The ledger clock is frozen with ``ratchet.testing.inject_clock`` and the scheduler's local
clock is a variable of the test, so a pass "at" any instant is one call of
``Scheduler.run_once``. Checked: each tick is one task with the key
``periodic:<name>:<UTC instant>``; misfires within and beyond the grace; a restart keeps the
next tick; two schedulers on one ledger fire each tick once; a schedule removed from the code
stops firing and says so; daylight saving changes through the scheduler; the cursor's
compare-and-set, alone and raced by eight schedulers behind a barrier."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from ratchet import (
    App,
    ConfigError,
    Control,
    InvalidArguments,
    Schedule,
    TaskContext,
    open_ledger,
)
from ratchet.ledger.base import Ledger, ScheduleAdvance, SchedulePlan
from ratchet.testing import inject_clock, wait_for
from ratchet.testing.clock import LedgerClock
from ratchet.worker.scheduler import Scheduler

T0 = datetime(2026, 12, 4, 13, 0, 0, tzinfo=UTC).timestamp()


class Clocks:
    """The ledger clock (frozen) and the scheduler's local clock, moved together."""

    def __init__(self, ledger: Ledger, at: float) -> None:
        self.ledger_clock: LedgerClock = inject_clock(ledger)
        self.now = at
        self.ledger_clock.freeze(at)

    def set(self, at: float) -> None:
        self.now = at
        self.ledger_clock.freeze(at)

    def __call__(self) -> float:
        return self.now


def make_app(url: str | Ledger, *, every_s: float | None = 60, cron: str | None = None,
             tz: str = "UTC", grace: float = 60, name: str = "tick") -> App:
    app = App(url)

    @app.periodic(name, every_s=every_s, cron=cron, tz=tz, misfire_grace_s=grace,
                  params={"n": 1})
    @app.task("periodic.job")
    def job(ctx: TaskContext, n: int) -> int:
        return n

    return app


@pytest.fixture
def app(ledger_url: str) -> Iterator[App]:
    """An App on a ledger object, so that Control(app=app) reads through it, with the
    injected clock (its ages and staleness are the test's, not the wall clock's)."""
    ledger = open_ledger(ledger_url)
    opened = make_app(ledger)
    yield opened
    opened.close()
    ledger.close()


def tick_of(key: str) -> int:
    """The tick instant of a key ``periodic:<name>:<UTC instant>``."""
    text = key.split(":", 2)[2]
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())


def keys(app: App) -> list[str]:
    page = app.list_tasks(limit=1000)
    return sorted(t.idempotency_key or "" for t in page.tasks)


def scheduler(app: App, clocks: Clocks, holder: str = "w1") -> Scheduler:
    return Scheduler(app.ledger, app.periodic_tasks, holder, clock=clocks)


def test_each_tick_is_one_task_keyed_by_the_schedule_and_the_utc_instant(app: App) -> None:
    clocks = Clocks(app.ledger, T0 - 1)
    s = scheduler(app, clocks)
    assert s.run_once() is None  # registered at T0 - 1; the first tick is T0
    assert s.sleep_s() == pytest.approx(1.0)
    clocks.set(T0 + 0.2)
    fired = s.run_once()
    assert fired is not None and fired.created == 1
    assert keys(app) == ["periodic:tick:2026-12-04T13:00:00Z"]
    task = app.get(next(iter(fired.submitted.values())))
    assert task.idempotency_key == "periodic:tick:2026-12-04T13:00:00Z"
    assert task.name == "periodic.job"
    assert s.run_once() is None  # nothing due before T0 + 60
    clocks.set(T0 + 180)  # three minutes later: 13:01, 13:02, 13:03, all within the grace
    fired = s.run_once()
    assert fired is not None and fired.created == 2  # 13:01 is 120 s late: missed
    assert keys(app) == ["periodic:tick:2026-12-04T13:00:00Z",
                         "periodic:tick:2026-12-04T13:02:00Z",
                         "periodic:tick:2026-12-04T13:03:00Z"]


def test_ticks_beyond_the_grace_are_missed_with_the_reason_and_never_run(app: App) -> None:
    clocks = Clocks(app.ledger, T0 - 1)
    s = scheduler(app, clocks)
    s.run_once()
    clocks.set(T0 + 3600 + 30)  # an hour of downtime: only 14:00 is within 60 s
    fired = s.run_once()
    assert fired is not None
    assert keys(app) == ["periodic:tick:2026-12-04T14:00:00Z"]
    (view,) = Control(app=app).schedules()
    assert view.fired == 1 and view.missed == 60  # 13:00 .. 13:59
    assert view.last_missed_at == T0 + 3540
    assert view.last_missed_reason is not None
    assert "60 tick(s) up to 2026-12-04T13:59:00Z" in view.last_missed_reason
    assert "misfire_grace_s=60" in view.last_missed_reason
    assert view.last_fired_at == T0 + 3600
    assert view.next_tick_at == T0 + 3660
    assert view.in_code is True and not view.stale


def test_a_restart_keeps_the_cursor_and_fires_the_next_tick(ledger_url: str) -> None:
    first = make_app(ledger_url)
    clocks = Clocks(first.ledger, T0 - 1)
    s = scheduler(first, clocks, "w1")
    s.run_once()
    clocks.set(T0 + 1)
    s.run_once()
    first.close()
    # A new process (new App, new scheduler, new holder) 70 s later: 13:01 is due.
    second = make_app(ledger_url)
    clocks = Clocks(second.ledger, T0 + 70)
    again = scheduler(second, clocks, "w2")
    again.register()
    assert again.next_tick == {"tick": int(T0 + 60)}
    fired = again.run_once()
    assert fired is not None and fired.created == 1
    assert keys(second) == ["periodic:tick:2026-12-04T13:00:00Z",
                            "periodic:tick:2026-12-04T13:01:00Z"]
    second.close()


def test_two_schedulers_fire_each_tick_once(ledger_url: str) -> None:
    a, b = make_app(ledger_url), make_app(ledger_url)
    clocks_a, clocks_b = Clocks(a.ledger, T0 - 1), Clocks(b.ledger, T0 - 1)
    sa, sb = scheduler(a, clocks_a, "wa"), scheduler(b, clocks_b, "wb")
    sa.register()
    sb.register()
    for minute in range(5):
        at = T0 + 60 * minute + 0.5
        clocks_a.set(at)
        clocks_b.set(at)
        first = sa.run_once()
        second = sb.run_once()
        assert first is not None and first.created == 1
        # b read the cursor a moved: nothing to decide, nothing submitted.
        assert second is not None and second.created == 0 and not second.advanced
    assert len(keys(a)) == 5
    (view,) = Control(app=a).schedules()
    assert view.fired == 5 and view.missed == 0
    a.close()
    b.close()


def test_the_compare_and_set_refuses_a_cursor_that_moved(app: App) -> None:
    clocks = Clocks(app.ledger, T0 - 1)
    s = scheduler(app, clocks)
    s.register()
    cursor = s.rows["tick"].cursor_s
    periodic = app.periodic_tasks["tick"]
    clocks.set(T0 + 1)

    def stale_plan(now: float, rows: object) -> SchedulePlan:
        # Decided from a cursor other than the one stored (another scheduler moved it).
        return SchedulePlan([ScheduleAdvance("tick", cursor - 5, int(T0),
                                             [periodic.new_task(int(T0))], [int(T0)],
                                             int(T0))])

    fired = app.ledger.fire_schedules("w1", ["tick"], stale_plan)  # type: ignore[arg-type]
    assert not fired.advanced and not fired.submitted
    assert keys(app) == []


def test_a_schedule_removed_from_the_code_stops_firing_and_says_so(ledger_url: str) -> None:
    old = make_app(ledger_url, name="old-report")
    clocks = Clocks(old.ledger, T0 - 1)
    scheduler(old, clocks, "w-old").register()
    old.close()
    # An App on a ledger object: Control reads through it, with the injected clock.
    opened = open_ledger(ledger_url)
    new = make_app(opened, name="new-report")
    clocks = Clocks(new.ledger, T0 - 1)
    s = scheduler(new, clocks, "w-new")
    assert s.register() == ["old-report"]  # logged: the ledger has it, this code lacks it
    clocks.set(T0 + 120)
    s.run_once()
    assert all(k.startswith("periodic:new-report:") for k in keys(new))
    views = {v.name: v for v in Control(app=new).schedules()}
    assert views["old-report"].in_code is False
    assert views["old-report"].stale  # nobody has said it has it for 121 s
    assert views["old-report"].fired == 0
    assert views["new-report"].in_code is True and not views["new-report"].stale
    new.close()
    opened.close()


@pytest.mark.parametrize(("tz", "autumn_day"), [
    ("Europe/Berlin", datetime(2026, 10, 25, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, tzinfo=UTC)),
])
def test_autumn_change_through_the_scheduler_fires_each_wall_clock_time_once(
    ledger_url: str, tz: str, autumn_day: datetime
) -> None:
    app = make_app(ledger_url, every_s=None, cron="*/30 * * * *", tz=tz, grace=3600)
    start = autumn_day.timestamp() - 6 * 3600
    clocks = Clocks(app.ledger, start)
    s = scheduler(app, clocks)
    s.register()
    fired_ticks: list[int] = []
    at = start
    while at < start + 18 * 3600:  # a pass at every half hour of real time
        at += 1800
        clocks.set(at)
        fired = s.run_once()
        if fired is not None:
            fired_ticks += [tick_of(k) for k in fired.submitted]
    expected = [int(t.timestamp()) for t in Schedule(cron="*/30 * * * *", tz=tz).ticks(
        datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(at, UTC))]
    assert sorted(fired_ticks) == expected
    walls = [datetime.fromtimestamp(t, UTC).astimezone(ZoneInfo(tz))
             .replace(tzinfo=None) for t in fired_ticks]
    assert len(walls) == len(set(walls))  # no wall-clock time twice
    assert len(fired_ticks) == 18 * 2 - 2  # 18 h of real time, one hour repeated
    app.close()


@pytest.mark.parametrize(("tz", "spring_day"), [
    ("Europe/Berlin", datetime(2026, 3, 29, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 3, 8, tzinfo=UTC)),
])
def test_spring_change_through_the_scheduler_fires_the_missing_time_after_the_gap(
    ledger_url: str, tz: str, spring_day: datetime
) -> None:
    app = make_app(ledger_url, every_s=None, cron="30 2 * * *", tz=tz, grace=60)
    zone = ZoneInfo(tz)
    start = spring_day.timestamp() - 3600
    clocks = Clocks(app.ledger, start)
    s = scheduler(app, clocks)
    s.register()
    # Pass exactly at the instant the scheduler sleeps to (its next tick).
    at = float(s.next_tick["tick"])
    clocks.set(at)
    fired = s.run_once()
    assert fired is not None and fired.created == 1
    wall = datetime.fromtimestamp(at, zone)
    assert (wall.hour, wall.minute) == (3, 0)  # 02:30 does not exist that day
    (key,) = fired.submitted
    assert key.endswith(datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    app.close()


def test_periodic_checks_its_arguments(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task("periodic.other")
    def other(ctx: TaskContext) -> None:
        return None

    with pytest.raises(InvalidArguments, match="exactly one of cron"):
        app.periodic("a")(other)
    with pytest.raises(InvalidArguments, match="unknown time zone"):
        app.periodic("a", cron="* * * * *", tz="Mars/Olympus")(other)
    with pytest.raises(InvalidArguments, match="misfire_grace_s"):
        app.periodic("a", every_s=5, misfire_grace_s=-1)(other)
    with pytest.raises(InvalidArguments, match="misfire_grace_s of schedule 'b' must be "
                       "seconds from 1"):
        app.periodic("b", every_s=5, misfire_grace_s=0)(other)
    with pytest.raises(InvalidArguments, match="at most"):
        app.periodic("c", every_s=10**12)(other)
    with pytest.raises(InvalidArguments, match="params"):
        app.periodic("a", every_s=5, params={"unexpected": 1})(other)
    def not_a_task(ctx: TaskContext) -> None:
        return None

    with pytest.raises(ConfigError, match=r"above @app\.task"):
        app.periodic("a", every_s=5)(not_a_task)
    app.periodic("a", every_s=5)(other)
    with pytest.raises(ConfigError, match="registered twice"):
        app.periodic("a", every_s=5)(other)
    app.close()


def test_racing_schedulers_behind_a_barrier_advance_each_cursor_once(ledger_url: str) -> None:
    """Eight schedulers (each its own App and ledger connection) make their pass at the same
    instant, released together by a barrier: every tick is one task, every cursor moved by
    exactly one of them, the counts add up."""
    apps = [make_app(ledger_url, every_s=10) for _ in range(8)]
    for extra in range(1, 20):  # 20 schedules in all, the same in every app
        for a in apps:
            a.periodic(f"tick{extra:02d}", every_s=10, params={"n": extra})(
                a.versions["periodic.job"][1].fn)
    clocks = [Clocks(a.ledger, T0 - 1) for a in apps]
    schedulers = [scheduler(a, c, f"w{i}") for i, (a, c) in enumerate(zip(apps, clocks,
                                                                             strict=True))]
    for s in schedulers:
        s.register()
    for c in clocks:
        c.set(T0 + 25)  # ticks T0, T0 + 10, T0 + 20 of 20 schedules: 60 tasks
    barrier = threading.Barrier(len(schedulers))
    results: list[object] = [None] * len(schedulers)
    errors: list[BaseException] = []

    def race(i: int) -> None:
        try:
            barrier.wait(timeout=20)
            results[i] = schedulers[i].run_once()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(schedulers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    advanced: list[str] = []
    created = 0
    for fired in results:
        assert fired is not None
        advanced += sorted(fired.advanced)  # type: ignore[attr-defined]
        created += fired.created  # type: ignore[attr-defined]
    assert sorted(advanced) == sorted(apps[0].periodic_tasks)  # each once, no more
    assert created == 60
    assert len(keys(apps[0])) == 60
    views = Control(app=apps[0]).schedules()
    assert all(v.fired == 3 and v.missed == 0 for v in views)
    for a in apps:
        a.close()


def test_a_tick_whose_key_was_taken_with_other_params_is_missed_not_blocking(app: App) -> None:
    clocks = Clocks(app.ledger, T0 - 1)
    s = scheduler(app, clocks)
    s.register()
    # Another release (other params) already submitted the 13:00 tick.
    app.submit("periodic.job", {"n": 2}, idempotency_key="periodic:tick:2026-12-04T13:00:00Z")
    clocks.set(T0 + 60)  # 13:00 is 60 s late: within the grace
    fired = s.run_once()
    assert fired is not None and fired.created == 1  # 13:01 fired
    (view,) = Control(app=app).schedules()
    assert view.fired == 1 and view.missed == 1
    assert view.last_missed_at == T0
    assert view.last_missed_reason is not None
    assert "idempotency conflict" in view.last_missed_reason
    assert view.cursor_at == T0 + 60
    assert keys(app) == ["periodic:tick:2026-12-04T13:00:00Z",
                         "periodic:tick:2026-12-04T13:01:00Z"]


def test_a_local_clock_off_the_ledgers_neither_spins_nor_fires_late(ledger_url: str) -> None:
    """The scheduler looks at its local clock corrected by the ledger's: an hour ahead, it
    does not see a tick as due before the ledger's clock reaches it (no pass per look);
    an hour behind, it sees the next tick due when the ledger's clock reaches it."""
    app = App(ledger_url)

    @app.periodic("skewed", every_s=1)
    @app.task(name="periodic.skewed")
    def skewed(ctx: TaskContext) -> None:
        return None

    try:
        for skew in (3600.0, -3600.0):
            s = Scheduler(app.ledger, app.periodic_tasks, f"w{skew}",
                          clock=lambda skew=skew: time.time() + skew)
            s.register()
            assert abs(s.offset_s + skew) < 5.0
            next_tick = s.next_tick["skewed"]
            if float(app.ledger.now()) < next_tick - 0.2:
                assert s.due() == []  # uncorrected, an hour ahead would say due
            wait_for("the tick to be due by the ledger's clock", lambda s=s: s.due(),
                     timeout_s=10)  # uncorrected, an hour behind would wait an hour
            assert float(app.ledger.now()) >= next_tick - 0.5
    finally:
        app.close()
