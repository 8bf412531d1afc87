"""Schedules of periodic tasks: which instants a cron expression or an interval names.

Pure (no I/O, no clock): :class:`Schedule` answers "which instants are ticks between
``start`` and ``end``", so a schedule can be checked without waiting for it, and the
worker's scheduler (:mod:`ratchet.worker.scheduler`) asks it the same question with the
ledger's clock.

Every tick is one UTC instant, with whole seconds. Two kinds:

* ``every_s=N``: every N seconds (a whole number >= 1), anchored to the Unix epoch: the
  ticks are the instants whose epoch seconds are multiples of N, so every worker computes
  the same ones whenever it starts. The time zone plays no part (an interval of real time
  is the same in every zone, across daylight saving changes too).
* ``cron="m h dom mon dow"``: a five-field cron expression (parsed and matched by
  ``cronsim``), read as wall-clock times of ``tz`` (an IANA name, default ``"UTC"``).

Daylight saving time (the policy; each case is a test):

* **Repeated hour** (autumn, clocks go back): a wall-clock time that occurs twice fires
  once, at its first occurrence (``fold=0``). Nothing fires twice for one wall-clock
  time: ``*/15 * * * *`` in Europe/Berlin fires 02:00, 02:15, 02:30, 02:45 CEST, then
  03:00 CET, one hour of real time later.
* **Missing hour** (spring, clocks go forward): a wall-clock time that does not exist fires
  at the first instant after the gap (``30 2 * * *`` in Europe/Berlin fires 03:00 CEST on
  that day). Several missing times fall on that one instant and are one tick (a tick is an
  instant: one task), together with a tick the expression names at the end of the gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .errors import InvalidArguments

__all__ = ["MAX_EVERY_S", "Schedule", "tick_key", "utc_text"]

_LOOKBACK = timedelta(minutes=1)
"""How far before ``start``'s wall-clock time the walk of a cron expression begins. The
map from wall-clock time to instant never goes back (a repeated time fires at its first
occurrence, a missing one at the end of its gap), so no tick before that wall-clock time
is after ``start``; the minute only guards the walk's own start (whole minutes)."""


MAX_EVERY_S = 100 * 366 * 86400
"""The longest interval ``every_s`` may name, seconds (about 100 years: its ticks stay
within the years a datetime can hold)."""


class Schedule:
    """The ticks of a periodic task: a cron expression in a time zone, or an interval.

    Args:
        cron: a five-field cron expression (``"0 13 * * MON-FRI"``), read as wall-clock
            times of ``tz``. Exactly one of ``cron`` and ``every_s``.
        every_s: an interval in seconds, a whole number >= 1; ticks are the multiples of it
            counted from the Unix epoch (every worker agrees on them).
        tz: the IANA time zone of ``cron`` (``"Europe/Berlin"``); default ``"UTC"``.

    Raises:
        InvalidArguments: neither or both of ``cron`` / ``every_s``; a cron expression
            ``cronsim`` refuses (the message quotes it and its error); ``every_s`` not a
            whole number of seconds >= 1; ``tz`` not a known IANA time zone.
    """

    __slots__ = ("_cron_text", "_every_s", "_tz", "_zone")

    def __init__(self, *, cron: str | None = None, every_s: float | None = None,
                 tz: str = "UTC") -> None:
        if (cron is None) == (every_s is None):
            raise InvalidArguments(
                "a schedule takes exactly one of cron= (a cron expression) and every_s= (an "
                f"interval in seconds); got cron={cron!r}, every_s={every_s!r}")
        if not isinstance(tz, str) or not tz:
            raise InvalidArguments(f"tz must be an IANA time zone name such as "
                                   f"'Europe/Berlin', got {tz!r}")
        try:
            self._zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidArguments(f"unknown time zone {tz!r}: give an IANA name such as "
                                   "'UTC' or 'Europe/Berlin'") from None
        self._tz = tz
        self._cron_text: str | None = None
        self._every_s: int | None = None
        if cron is not None:
            if not isinstance(cron, str):
                raise InvalidArguments(f"cron must be a string, got {type(cron).__name__}")
            fields = cron.split()
            if len(fields) != 5:
                # cronsim would read a sixth field as seconds, a Quartz-style expression
                # as something else: refuse instead of firing at another rate.
                raise InvalidArguments(
                    f"bad cron expression {cron!r}: it has {len(fields)} field(s); give five "
                    "(minute hour day-of-month month day-of-week, e.g. '0 13 * * MON-FRI'): "
                    "there is no seconds or year field (use every_s= for sub-minute ticks)")
            try:
                CronSim(cron, datetime(2000, 1, 1))
            except CronSimError as exc:
                raise InvalidArguments(f"bad cron expression {cron!r}: {exc}") from None
            self._cron_text = " ".join(cron.split())
        else:
            valid = (isinstance(every_s, int | float) and not isinstance(every_s, bool)
                     and math.isfinite(every_s) and 1 <= every_s <= MAX_EVERY_S
                     and every_s == int(every_s))
            if not valid:
                raise InvalidArguments(
                    f"every_s must be a whole number of seconds >= 1 (at most "
                    f"{MAX_EVERY_S}, 100 years), got {every_s!r}")
            self._every_s = int(every_s)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ what it is

    @property
    def cron(self) -> str | None:
        """The cron expression (whitespace normalised), or None for an interval."""
        return self._cron_text

    @property
    def every_s(self) -> int | None:
        """The interval in seconds, or None for a cron expression."""
        return self._every_s

    @property
    def tz(self) -> str:
        """The IANA time zone name."""
        return self._tz

    def spec(self) -> str:
        """A one-line text of the schedule: ``"cron 0 13 * * *"`` or ``"every 60s"``."""
        if self._cron_text is not None:
            return f"cron {self._cron_text}"
        return f"every {self._every_s}s"

    def __repr__(self) -> str:
        kind = (f"cron={self._cron_text!r}" if self._cron_text is not None
                else f"every_s={self._every_s}")
        return f"Schedule({kind}, tz={self._tz!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Schedule) and other._cron_text == self._cron_text
                and other._every_s == self._every_s and other._tz == self._tz)

    def __hash__(self) -> int:
        return hash((self._cron_text, self._every_s, self._tz))

    # ------------------------------------------------------------------ ticks

    def ticks(self, start: datetime, end: datetime) -> list[datetime]:
        """The ticks after ``start`` up to and including ``end``, oldest first.

        Args:
            start: an aware datetime (any zone); the ticks are after it.
            end: an aware datetime; the ticks are at or before it.

        Returns:
            Aware UTC datetimes, strictly increasing, whole seconds.

        Raises:
            InvalidArguments: ``start`` or ``end`` is naive (no time zone).
        """
        return [_utc(t) for t in self.iter_epoch(_epoch(start, "start"), _epoch(end, "end"))]

    def next_after(self, at: datetime) -> datetime:
        """The first tick after ``at`` (an aware datetime), as an aware UTC datetime.

        Raises:
            InvalidArguments: ``at`` is naive.
        """
        return _utc(self.next_epoch(_epoch(at, "at")))

    def next_epoch(self, after_s: float) -> int:
        """The first tick after ``after_s`` (epoch seconds), in epoch seconds."""
        if self._every_s is not None:
            return (math.floor(after_s) // self._every_s + 1) * self._every_s
        return next(self._cron_epochs(after_s))

    def iter_epoch(self, start_s: float, end_s: float) -> Iterator[int]:
        """The ticks ``start_s < tick <= end_s`` (epoch seconds), oldest first, as epoch
        seconds (whole)."""
        if self._every_s is not None:
            step = self._every_s
            first = (math.floor(start_s) // step + 1) * step
            yield from range(first, math.floor(end_s) + 1, step)
            return
        for tick in self._cron_epochs(start_s):
            if tick > end_s:
                return
            yield tick

    def count(self, start_s: float, end_s: float) -> int:
        """How many ticks ``start_s < tick <= end_s`` (epoch seconds) there are (an
        interval counts without listing them; a cron expression walks them)."""
        if end_s <= start_s:
            return 0
        if self._every_s is not None:
            step = self._every_s
            return max(0, math.floor(end_s) // step - math.floor(start_s) // step)
        return sum(1 for _ in self.iter_epoch(start_s, end_s))

    def count_last(self, start_s: float, end_s: float) -> tuple[int, int | None]:
        """How many ticks ``start_s < tick <= end_s`` there are, and the newest of them
        (None when there are none), epoch seconds."""
        if self._every_s is not None:
            n = self.count(start_s, end_s)
            return n, ((math.floor(end_s) // self._every_s) * self._every_s if n else None)
        n, last = 0, None
        for tick in self.iter_epoch(start_s, end_s):
            n, last = n + 1, tick
        return n, last

    def _cron_epochs(self, after_s: float) -> Iterator[int]:
        """Cron ticks after ``after_s``, forever, under the daylight saving policy of the
        module docstring: the expression is walked over naive wall-clock times (every
        wall-clock time matches once), and each is mapped to one instant."""
        assert self._cron_text is not None
        zone = self._zone
        begin = datetime.fromtimestamp(math.floor(after_s), zone).replace(tzinfo=None)
        last = -1
        for wall in CronSim(self._cron_text, begin - _LOOKBACK):
            instant = _instant_of(wall, zone)
            if instant > after_s and instant != last:
                last = instant
                yield instant


def _instant_of(wall: datetime, zone: ZoneInfo) -> int:
    """The epoch second a naive wall-clock time of ``zone`` fires at: its first occurrence
    when it occurs twice; the first instant after the gap when it does not exist."""
    first = int(wall.replace(tzinfo=zone, fold=0).timestamp())
    if datetime.fromtimestamp(first, zone).replace(tzinfo=None) == wall:
        return first  # exists (fold=0 is its first occurrence when it repeats)
    # In a gap: fold=1 reads it with the offset after the change (an earlier instant),
    # fold=0 with the one before (a later one); the change lies between them.
    lo = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    hi = first
    offset_after = wall.replace(tzinfo=zone, fold=1).utcoffset()
    while lo < hi:  # first second whose offset is the one after the change
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == offset_after:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _epoch(value: datetime, name: str) -> float:
    if not isinstance(value, datetime):
        raise InvalidArguments(f"{name} must be an aware datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArguments(f"{name} must be an aware datetime (with a time zone), got "
                               f"the naive {value.isoformat()}")
    return value.timestamp()


def _utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


def utc_text(epoch_s: float) -> str:
    """An instant as ISO 8601 UTC text with whole seconds: ``2026-12-04T13:00:00Z``."""
    return _utc(math.floor(epoch_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_key(schedule_name: str, tick_s: float) -> str:
    """The idempotency key of one tick of a schedule: ``periodic:<name>:<UTC instant>``
    (``periodic:report:2026-12-04T13:00:00Z``)."""
    return f"periodic:{schedule_name}:{utc_text(tick_s)}"
