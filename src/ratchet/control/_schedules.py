"""The periodic schedules as :meth:`ratchet.Control.schedules` answers them
(:class:`ScheduleView`, ``ratchet schedules``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..errors import InvalidArguments
from ..ledger.base import ScheduleRecord
from ..schedule import Schedule

__all__ = ["STALE_SCHEDULE_S", "ScheduleView", "schedule_view"]

STALE_SCHEDULE_S = 90.0
"""A schedule no running scheduler has said it has for this long (seconds) is stale:
schedulers say so every 30 s (``Scheduler.seen_every_s``)."""


@dataclass(frozen=True, slots=True)
class ScheduleView:
    """One periodic schedule (``ratchet schedules``, ``GET /api/schedules``).

    Attributes:
        name: the schedule's name (its ticks' keys are ``periodic:NAME:<UTC instant>``).
        task: the task type it submits.
        spec: ``"cron <expression>"`` or ``"every <N>s"``.
        tz: the IANA time zone of a cron expression.
        misfire_grace_s: how late a tick may still be submitted, seconds.
        next_tick_at: the first tick after the cursor, epoch seconds (in the past when no
            scheduler has fired it yet: overdue), or None if the stored spec cannot be read
            by this release.
        cursor_at: every tick up to this instant is decided (epoch seconds).
        last_fired_at: the last submitted tick's instant, or None.
        fired: ticks submitted, in all.
        missed: ticks recorded as missed, in all.
        last_missed_at: the last missed tick's instant, or None.
        last_missed_reason: why it was missed, or None.
        registered_at, registered_by: the last scheduler start that had it (ledger clock,
            worker id).
        seen_at, seen_by: the last time a running scheduler said its code has it.
        seen_age_s: seconds since ``seen_at`` by the ledger clock.
        stale: no running scheduler has said so for :data:`STALE_SCHEDULE_S` seconds: it
            is not fired (removed from the code, or no worker runs a scheduler).
        in_code: whether the App given to :class:`~ratchet.Control` has it; None when
            Control was given a ledger URL only.
    """

    name: str
    task: str
    spec: str
    tz: str
    misfire_grace_s: float
    next_tick_at: float | None
    cursor_at: float
    last_fired_at: float | None
    fired: int
    missed: int
    last_missed_at: float | None
    last_missed_reason: str | None
    registered_at: float
    registered_by: str
    seen_at: float
    seen_by: str
    seen_age_s: float
    stale: bool
    in_code: bool | None


def parse_spec(spec: str, tz: str) -> Schedule | None:
    """The :class:`Schedule` of a stored spec text (``"cron ..."``, ``"every Ns"``), or
    None when this release cannot read it."""
    kind, _, rest = spec.partition(" ")
    try:
        if kind == "cron":
            return Schedule(cron=rest, tz=tz)
        if kind == "every" and rest.endswith("s"):
            return Schedule(every_s=int(rest[:-1]), tz=tz)
    except (InvalidArguments, ValueError):
        return None
    return None


def schedule_view(row: ScheduleRecord, now_s: float,
                  in_code: Collection[str] | None) -> ScheduleView:
    """The view of a stored schedule at ledger-now ``now_s``; ``in_code``: the schedule
    names of the App, if any."""
    schedule = parse_spec(row.spec, row.tz)
    age = max(0.0, now_s - row.seen_s)
    return ScheduleView(
        row.name, row.task, row.spec, row.tz, row.misfire_grace_s,
        None if schedule is None else float(schedule.next_epoch(row.cursor_s)),
        float(row.cursor_s),
        None if row.last_fired_s is None else float(row.last_fired_s),
        row.fired, row.missed,
        None if row.last_missed_s is None else float(row.last_missed_s),
        row.last_missed_reason, row.registered_s, row.registered_by, row.seen_s,
        row.seen_by, age, age > STALE_SCHEDULE_S,
        None if in_code is None else row.name in in_code)
