"""Periodic schedules in the ledger: what schedulers register (:class:`ScheduleSpec`), the
stored row with its cursor (:class:`ScheduleRecord`), and one scheduler pass's plan and
answer (:class:`SchedulePlan`, :class:`ScheduleAdvance`, :class:`ScheduleFired`).

All instants are epoch seconds of the ledger clock; tick instants and cursors are whole
seconds (a schedule's ticks are, :mod:`ratchet.schedule`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .records_tasks import NewTask

__all__ = [
    "ScheduleAdvance",
    "ScheduleFired",
    "SchedulePlan",
    "SchedulePlanner",
    "ScheduleRecord",
    "ScheduleSpec",
]


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One schedule a scheduler registers (:meth:`Ledger.register_schedules`).

    Attributes:
        name: the schedule's name (its ticks' idempotency keys start ``periodic:NAME:``).
        task: the task type it submits.
        spec: the schedule as text (``"cron 0 13 * * *"``, ``"every 60s"``).
        tz: the IANA time zone of a cron expression.
        misfire_grace_s: how late, in seconds, a tick may still be submitted.
    """

    name: str
    task: str
    spec: str
    tz: str
    misfire_grace_s: float


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A schedule as stored: its registration, its cursor and its counts.

    Attributes:
        name, task, spec, tz, misfire_grace_s: as last registered (:class:`ScheduleSpec`).
        cursor_s: every tick at or before this instant is decided (submitted or missed);
            set to the registration instant when the schedule is first registered (no
            tick before it is ever fired).
        last_fired_s: the intended instant of the last tick submitted, or None.
        fired: ticks submitted, in all.
        missed: ticks recorded as missed (later than the grace), in all.
        last_missed_s: the intended instant of the last missed tick, or None.
        last_missed_reason: why it was missed, or None.
        first_registered_s: when a scheduler first registered it.
        registered_s, registered_by: the last registration (a scheduler's start) and the
            worker id that made it.
        seen_s, seen_by: the last time a running scheduler that has it in its code said so
            (every pass that advances it, and every 30 s: ``Scheduler.seen_every_s``), and
            which worker.
    """

    name: str
    task: str
    spec: str
    tz: str
    misfire_grace_s: float
    cursor_s: int
    last_fired_s: int | None
    fired: int
    missed: int
    last_missed_s: int | None
    last_missed_reason: str | None
    first_registered_s: float
    registered_s: float
    registered_by: str
    seen_s: float
    seen_by: str


@dataclass(frozen=True, slots=True)
class ScheduleAdvance:
    """What one pass decided for one schedule (a part of :class:`SchedulePlan`).

    Attributes:
        name: the schedule.
        from_s: the cursor the decision was made from (the compare of the compare-and-set).
        to_s: the new cursor (every tick up to it is decided).
        tasks: the ticks to submit, one :class:`NewTask` each, keyed ``periodic:NAME:T``.
        ticks: the instants of those ticks, aligned with ``tasks``.
        fired_s: the newest of those ticks' instants, or None when there are none.
        missed: how many ticks between ``from_s`` and ``to_s`` are missed.
        last_missed_s: the newest missed tick, or None.
        missed_reason: why they were missed, or None.
    """

    name: str
    from_s: int
    to_s: int
    tasks: Sequence[NewTask] = ()
    ticks: Sequence[int] = ()
    fired_s: int | None = None
    missed: int = 0
    last_missed_s: int | None = None
    missed_reason: str | None = None


@dataclass(frozen=True, slots=True)
class SchedulePlan:
    """A pass's decisions, from the cursors it read (:data:`SchedulePlanner`)."""

    advances: Sequence[ScheduleAdvance] = ()


SchedulePlanner = Callable[[float, Mapping[str, ScheduleRecord]], SchedulePlan]
"""``plan(ledger_now_s, rows_by_name)``: called inside the pass's transaction with the
ledger clock and the rows it read (those no other scheduler holds at that moment); pure, as
the transaction may run it again."""


@dataclass(frozen=True, slots=True)
class ScheduleFired:
    """What one pass did (:meth:`Ledger.fire_schedules`).

    Attributes:
        now_s: the ledger clock of the pass.
        rows: the rows after the pass, by name: those advanced with their new cursor and
            counts, the others as read.
        advanced: names whose compare-and-set took (read back from the update).
        lost: names whose cursor another scheduler moved between the read and the update.
        submitted: the submitted tasks' ids by idempotency key (created or already there).
        created: how many of them this pass created.
    """

    now_s: float
    rows: Mapping[str, ScheduleRecord] = field(default_factory=dict)
    advanced: frozenset[str] = frozenset()
    lost: frozenset[str] = frozenset()
    submitted: Mapping[str, str] = field(default_factory=dict)
    created: int = 0
