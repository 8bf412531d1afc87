"""The scheduler of periodic tasks, a thread in every worker (DESIGN §8, periodic tasks).

No leader. Each worker whose app has schedules (``@app.periodic``) runs a
:class:`Scheduler`; at start it registers its schedules (:meth:`Ledger.register_schedules`:
a new schedule's cursor starts at ledger-now) and logs the stored schedules its code lacks.
Then it sleeps until the next tick of any of its schedules (at most ``max_sleep_s``) and
makes one pass over the schedules due by its clock: one transaction
(:meth:`Ledger.fire_schedules`) that reads their cursors, decides with the *ledger's* clock
(:func:`plan_pass`), moves each cursor by a compare-and-set read back, and submits the
due ticks, each with the key ``periodic:<name>:<tick>``. Two schedulers deciding the same
tick submit one task (the key), and only one moves the cursor (the compare-and-set).

Misfires: a tick at most ``misfire_grace_s`` older than the ledger's now is submitted
(once); an older one is recorded as missed, with the reason, in the schedule's row
(``missed``, ``last_missed_at``, ``last_missed_reason``; ``ratchet schedules``), never run
late. A pass submits at most ``max_tasks_per_pass`` ticks; the rest wait for the next
pass (at once), so a backlog never makes one huge transaction.

Ledger cost: nothing between ticks (the next tick of each schedule is known locally; a
schedule another scheduler fired is found so at its next tick); one transaction per tick
instant for all the schedules due at it; one ``schedule_seen`` statement every
``seen_every_s`` for all of them (so ``ratchet schedules`` tells a schedule no running code
has).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from ..app import PeriodicTask
from ..errors import LedgerCorrupt, RatchetError
from ..ledger.base import (
    Ledger,
    ScheduleAdvance,
    ScheduleFired,
    SchedulePlan,
    ScheduleRecord,
)
from ..schedule import utc_text

__all__ = ["MAX_TASKS_PER_PASS", "Scheduler", "log_lacking", "plan_pass"]

log = logging.getLogger("ratchet.worker")

MAX_TASKS_PER_PASS = 1000
"""The most ticks one pass submits (one transaction); more wait for the next pass."""


def plan_pass(schedules: Mapping[str, PeriodicTask], now_s: float,
              rows: Mapping[str, ScheduleRecord],
              max_tasks: int = MAX_TASKS_PER_PASS) -> SchedulePlan:
    """Decide one pass (pure): for each schedule of ``schedules`` whose row was read, the
    ticks after its cursor up to ``now_s`` (the ledger clock, epoch seconds).

    A tick ``t`` with ``now_s - t <= misfire_grace_s`` is submitted; an older one is
    missed (counted, with the newest missed tick and the reason). The cursor moves to the
    whole second of ``now_s``, or to the last submitted tick when ``max_tasks`` cut the
    pass short.
    """
    advances: list[ScheduleAdvance] = []
    budget = max_tasks
    for name in sorted(rows):
        periodic = schedules.get(name)
        row = rows[name]
        if periodic is None or budget <= 0:
            continue
        schedule = periodic.schedule
        cursor = row.cursor_s
        end = math.floor(now_s)
        if end <= cursor:
            continue  # not due, or the ledger clock stepped back
        # Missed: t < now - grace, i.e. t <= missed_end (ticks are whole seconds).
        missed_end = min(end, math.ceil(now_s - periodic.misfire_grace_s) - 1)
        missed, last_missed, reason = 0, None, None
        start = cursor
        if missed_end > cursor:
            missed, last_missed = schedule.count_last(cursor, missed_end)
            if missed:
                reason = (f"{missed} tick(s) up to {utc_text(last_missed or 0)} were more than "
                          f"misfire_grace_s={periodic.misfire_grace_s:g} s late when a "
                          f"scheduler ran at {utc_text(now_s)} (no scheduler ran in time)")
            start = missed_end
        ticks: list[int] = []
        for tick in schedule.iter_epoch(start, end):
            if len(ticks) >= budget:
                end = ticks[-1]  # the rest wait for the next pass
                break
            ticks.append(tick)
        budget -= len(ticks)
        advances.append(ScheduleAdvance(
            name=name, from_s=cursor, to_s=end,
            tasks=[periodic.new_task(t) for t in ticks], ticks=ticks,
            fired_s=ticks[-1] if ticks else None, missed=missed,
            last_missed_s=last_missed, missed_reason=reason))
    return SchedulePlan(advances)


def _log_lacking(rows: Iterable[ScheduleRecord], have: Mapping[str, object]) -> list[str]:
    lacking = sorted(r.name for r in rows if r.name not in have)
    if lacking:
        log.warning("schedules in the ledger that this worker's code lacks (not fired here; "
                    "removed from the code, or another app's or release's): %s",
                    ", ".join(lacking))
    return lacking


def log_lacking(ledger: Ledger) -> list[str]:
    """For a worker whose app has no schedules: log (a warning) the schedules stored in the
    ledger, which its code lacks, and return their names; a ledger error is logged, not
    raised (nothing depends on it)."""
    try:
        return _log_lacking(ledger.schedules(), {})
    except RatchetError as exc:
        log.warning("could not read the schedules in the ledger: %s", exc)
        return []


class Scheduler(threading.Thread):
    """Fires the app's schedules until stopped (a daemon thread of the worker).

    Args:
        ledger: the worker's ledger.
        schedules: the app's schedules by name (``App.periodic_tasks``).
        holder: the worker's id, recorded as who registered, saw and fired a schedule.
        clock: the local clock, epoch seconds (``time.time``), used only to know when to
            make a pass: what is due is decided with the ledger's clock. The scheduler
            reads the ledger's clock at registration and at every pass and looks at the
            local clock corrected by the difference, so a local clock ahead of or behind
            the ledger's neither makes extra passes nor fires late.
        max_sleep_s: the longest sleep between two looks at the clock, seconds.
        seen_every_s: seconds between two ``schedules_seen`` of the schedules.
        max_tasks_per_pass: see :data:`MAX_TASKS_PER_PASS`.
        on_pass: called with each pass's :class:`ScheduleFired` (metrics, tests).
    """

    def __init__(self, ledger: Ledger, schedules: Mapping[str, PeriodicTask], holder: str, *,
                 clock: Callable[[], float] = time.time, max_sleep_s: float = 1.0,
                 seen_every_s: float = 30.0, max_tasks_per_pass: int = MAX_TASKS_PER_PASS,
                 on_pass: Callable[[ScheduleFired], None] | None = None) -> None:
        super().__init__(name="ratchet-scheduler", daemon=True)
        self.ledger = ledger
        self.schedules = dict(schedules)
        self.holder = holder
        self.clock = clock
        self.max_sleep_s = max_sleep_s
        self.seen_every_s = seen_every_s
        self.max_tasks_per_pass = max_tasks_per_pass
        self.on_pass = on_pass
        self.next_tick: dict[str, int] = {}
        """The next tick of each schedule after its cursor as last read, epoch seconds."""
        self.rows: dict[str, ScheduleRecord] = {}
        """Each schedule's row as last read."""
        self.registered = False
        self.passes = 0
        self.corrupt: LedgerCorrupt | None = None
        self._last_seen = 0.0
        self.offset_s = 0.0
        """The ledger's clock minus the local clock, seconds, as last measured."""
        self._stop_event = threading.Event()

    # ------------------------------------------------------------------ steps

    def register(self) -> list[str]:
        """Register the schedules; return the stored schedules this code lacks (logged)."""
        rows = self.ledger.register_schedules(
            self.holder, [p.spec() for p in self.schedules.values()])
        self._last_seen = self.clock()
        self.offset_s = float(self.ledger.now()) - self._last_seen
        self._learn(r for r in rows if r.name in self.schedules)
        self.registered = True
        return _log_lacking(rows, self.schedules)

    def _now(self) -> float:
        """The ledger's clock as estimated from the local one, epoch seconds."""
        return self.clock() + self.offset_s

    def due(self, now_s: float | None = None) -> list[str]:
        """The schedules whose next tick is at or before ``now_s`` (default: the ledger's
        clock as estimated locally)."""
        now = self._now() if now_s is None else now_s
        return sorted(n for n, t in self.next_tick.items() if t <= now)

    def run_once(self, now_s: float | None = None) -> ScheduleFired | None:
        """One pass over the schedules due by the local clock (registering first if not
        done); None when none is due. Raises what the ledger raises."""
        if not self.registered:
            self.register()
        names = self.due(now_s)
        fired: ScheduleFired | None = None
        if names:
            schedules = self.schedules
            limit = self.max_tasks_per_pass
            fired = self.ledger.fire_schedules(
                self.holder, names,
                lambda now, rows: plan_pass(schedules, now, rows, limit))
            if now_s is None:
                self.offset_s = fired.now_s - self.clock()
            self.passes += 1
            self._learn(r for r in fired.rows.values() if r.name in self.schedules)
            for key in fired.submitted:
                log.debug("schedule tick submitted: %s", key)
            if self.on_pass is not None:
                self.on_pass(fired)
        now = self.clock() if now_s is None else now_s
        if now - self._last_seen >= self.seen_every_s:
            self.ledger.schedules_seen(self.holder, sorted(self.schedules))
            self._last_seen = now
        return fired

    def sleep_s(self, now_s: float | None = None) -> float:
        """Seconds until the next tick of any schedule, within ``[0, max_sleep_s]``."""
        now = self._now() if now_s is None else now_s
        nearest = min(self.next_tick.values(), default=now + self.max_sleep_s)
        return min(max(nearest - now, 0.0), self.max_sleep_s)

    def _learn(self, rows: Iterable[ScheduleRecord]) -> None:
        for row in rows:
            self.rows[row.name] = row
            self.next_tick[row.name] = self.schedules[row.name].schedule.next_epoch(
                row.cursor_s)

    # ------------------------------------------------------------------ thread

    def run(self) -> None:
        failures = 0
        while not self._stop_event.is_set():
            wait_s = 0.0
            try:
                fired = self.run_once()
                failures = 0
                wait_s = self.sleep_s()
                if fired is not None and not fired.advanced and self.due():
                    # Due locally but not by the ledger's clock (or held by another pass):
                    # do not spin; look again shortly.
                    wait_s = max(wait_s, min(0.1, self.max_sleep_s))
            except LedgerCorrupt as exc:
                self.corrupt = exc
                log.error("scheduler stopped: %s", exc)
                return
            except RatchetError as exc:
                failures += 1
                wait_s = min(0.1 * 2 ** min(failures, 6), 5.0)
                if failures == 1 or failures % 50 == 0:
                    log.warning("scheduler pass failed (%d in a row; retried in %.1f s): %s",
                                failures, wait_s, exc)
            self._stop_event.wait(wait_s)

    def stop(self) -> None:
        """Stop the thread (a pass in flight finishes first)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=30)
