"""``ratchet.Schedule``: the instants a cron expression or an interval names (pure, no
ledger), its daylight saving policy and its argument checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from ratchet import InvalidArguments, Schedule
from ratchet.schedule import tick_key, utc_text


def local(ticks: list[datetime], tz: str) -> list[str]:
    return [t.astimezone(ZoneInfo(tz)).strftime("%m-%d %H:%M %Z") for t in ticks]


def test_every_s_ticks_are_multiples_of_the_interval_from_the_epoch() -> None:
    s = Schedule(every_s=60)
    start = datetime(2026, 12, 4, 13, 0, 30, tzinfo=UTC)
    ticks = s.ticks(start, start + timedelta(minutes=3))
    assert ticks == [datetime(2026, 12, 4, 13, m, tzinfo=UTC) for m in (1, 2, 3)]
    assert all(t.tzinfo is UTC for t in ticks)
    # The bounds: after start, up to and including end.
    on_tick = datetime(2026, 12, 4, 13, 1, tzinfo=UTC)
    assert s.ticks(on_tick, on_tick + timedelta(minutes=1)) == [on_tick + timedelta(minutes=1)]
    # Anchored to the epoch: the same ticks whatever zone the bounds are given in.
    berlin = start.astimezone(ZoneInfo("Europe/Berlin"))
    assert s.ticks(berlin, berlin + timedelta(minutes=3)) == ticks
    assert Schedule(every_s=7).ticks(datetime.fromtimestamp(0, UTC),
                                     datetime.fromtimestamp(30, UTC))[0].timestamp() == 7
    assert s.next_after(start) == ticks[0]
    assert s.count(start.timestamp(), start.timestamp() + 3600) == 60


def test_every_s_ignores_daylight_saving_changes() -> None:
    s = Schedule(every_s=1800, tz="Europe/Berlin")
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    ticks = s.ticks(start, start + timedelta(hours=6))
    assert len(ticks) == 12
    assert all((b - a) == timedelta(minutes=30) for a, b in pairwise(ticks))


def test_cron_ticks_in_a_time_zone() -> None:
    s = Schedule(cron="0 9 * * MON-FRI", tz="America/New_York")
    ticks = s.ticks(datetime(2026, 12, 4, tzinfo=UTC), datetime(2026, 12, 9, tzinfo=UTC))
    assert [t.isoformat() for t in ticks] == [
        "2026-12-04T14:00:00+00:00", "2026-12-07T14:00:00+00:00", "2026-12-08T14:00:00+00:00"]
    assert s.spec() == "cron 0 9 * * MON-FRI" and s.tz == "America/New_York"


@pytest.mark.parametrize(("tz", "day"), [
    ("Europe/Berlin", datetime(2026, 10, 25, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 4, tzinfo=UTC)),
])
def test_autumn_a_repeated_wall_clock_time_fires_once_at_its_first_occurrence(
    tz: str, day: datetime
) -> None:
    daily = Schedule(cron="30 1,2 * * *", tz=tz)
    ticks = daily.ticks(day - timedelta(hours=4), day + timedelta(hours=20))
    walls = [t.astimezone(ZoneInfo(tz)).replace(tzinfo=None) for t in ticks]
    assert len(walls) == len(set(walls))
    assert [w.strftime("%H:%M") for w in walls] == ["01:30", "02:30"]
    # The repeated hour (01:xx in New York, 02:xx in Berlin) fires at its first pass, in
    # summer time.
    repeated = ticks[1] if tz == "Europe/Berlin" else ticks[0]
    assert repeated.astimezone(ZoneInfo(tz)).fold == 0
    assert ZoneInfo(tz).dst(repeated.astimezone(ZoneInfo(tz)).replace(tzinfo=None)) != \
        timedelta(0)
    # A schedule every 15 minutes: no wall-clock time twice, so an hour of real time passes
    # without a tick while the clock repeats the hour.
    quarter = Schedule(cron="*/15 * * * *", tz=tz)
    ticks = quarter.ticks(day - timedelta(hours=4), day + timedelta(hours=20))
    walls = [t.astimezone(ZoneInfo(tz)).replace(tzinfo=None) for t in ticks]
    assert len(walls) == len(set(walls))
    gaps = [b - a for a, b in pairwise(ticks)]
    assert gaps.count(timedelta(hours=1, minutes=15)) == 1
    assert all(g == timedelta(minutes=15) for g in gaps if g != timedelta(hours=1, minutes=15))


@pytest.mark.parametrize(("tz", "day", "after_gap"), [
    ("Europe/Berlin", datetime(2026, 3, 29, tzinfo=UTC), "03-29 03:00 CEST"),
    ("America/New_York", datetime(2026, 3, 8, 4, tzinfo=UTC), "03-08 03:00 EDT"),
])
def test_spring_a_missing_wall_clock_time_fires_at_the_first_instant_after_the_gap(
    tz: str, day: datetime, after_gap: str
) -> None:
    daily = Schedule(cron="30 2 * * *", tz=tz)
    ticks = daily.ticks(day - timedelta(days=1), day + timedelta(hours=36))
    shown = local(ticks, tz)
    assert len(ticks) == 3  # not skipped
    assert shown[1] == after_gap
    assert shown[0].endswith("02:30 " + ("CET" if tz == "Europe/Berlin" else "EST"))
    assert shown[2].endswith("02:30 " + ("CEST" if tz == "Europe/Berlin" else "EDT"))
    # Several missing times and the time at the end of the gap are one instant: one tick.
    quarter = Schedule(cron="*/15 1-3 * * *", tz=tz)
    ticks = quarter.ticks(day, day + timedelta(hours=12))
    walls = local(ticks, tz)
    assert walls.count(after_gap) == 1
    assert len(ticks) == len(set(ticks))
    assert ticks == sorted(ticks)


def test_ticks_are_strictly_increasing_across_a_year_of_changes() -> None:
    for tz in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        ticks = Schedule(cron="*/30 * * * *", tz=tz).ticks(
            datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
        assert all(a < b for a, b in pairwise(ticks)), tz
        walls = [t.astimezone(ZoneInfo(tz)).replace(tzinfo=None) for t in ticks]
        assert len(walls) == len(set(walls)), tz


def test_keys_name_the_schedule_and_the_utc_instant() -> None:
    at = datetime(2026, 12, 4, 14, 0, tzinfo=timezone(timedelta(hours=1))).timestamp()
    assert utc_text(at) == "2026-12-04T13:00:00Z"
    assert tick_key("report", at) == "periodic:report:2026-12-04T13:00:00Z"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "exactly one of cron"),
    ({"cron": "* * * * *", "every_s": 60}, "exactly one of cron"),
    ({"cron": "61 * * * *"}, "bad cron expression '61 \\* \\* \\* \\*'"),
    ({"cron": "every monday"}, "bad cron expression"),
    ({"cron": "*/5 * * * * *"}, "it has 6 field\\(s\\); give five"),  # no seconds field
    ({"cron": "0 2 * * * 2027"}, "it has 6 field\\(s\\); give five"),  # no year field
    ({"cron": "@daily"}, "it has 1 field\\(s\\); give five"),
    ({"cron": 5}, "cron must be a string"),
    ({"every_s": 0}, "every_s must be a whole number of seconds >= 1"),
    ({"every_s": -5}, "every_s must be a whole number of seconds >= 1"),
    ({"every_s": 1.5}, "every_s must be a whole number of seconds >= 1"),
    ({"every_s": float("inf")}, "every_s must be a whole number"),
    ({"every_s": True}, "every_s must be a whole number"),
    ({"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "unknown time zone 'Mars/Olympus_Mons'"),
    ({"cron": "* * * * *", "tz": ""}, "tz must be an IANA time zone name"),
])
def test_bad_arguments_are_refused_with_a_specific_message(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArguments, match=message):
        Schedule(**kwargs)  # type: ignore[arg-type]


def test_naive_bounds_are_refused() -> None:
    s = Schedule(every_s=60)
    with pytest.raises(InvalidArguments, match="aware datetime"):
        s.ticks(datetime(2026, 1, 1), datetime(2026, 1, 2, tzinfo=UTC))
    with pytest.raises(InvalidArguments, match="aware datetime"):
        s.next_after(datetime(2026, 1, 1))
