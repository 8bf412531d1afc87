"""Contract: periodic schedules (DESIGN §8, periodic tasks).

* Registration inserts a schedule with its cursor at the ledger clock's whole second, and a
  second registration keeps the cursor (and counts) while it replaces the spec.
* A pass moves a cursor only from the cursor it read (compare-and-set, read back) and
  submits the ticks of the schedules it moved, with their keys, in the same transaction;
  a plan made from another cursor moves nothing and submits nothing.
* Two ledger objects (two schedulers) passing at once over the same schedules: each cursor
  moves once, each tick is one task, the counts add up.
* ``schedules_seen`` moves ``seen_at``; ``schedules`` reads every row.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from ...ledger.base import (
    Ledger,
    NewTask,
    ScheduleAdvance,
    ScheduleFired,
    SchedulePlan,
    ScheduleRecord,
    ScheduleSpec,
)

SPEC = ScheduleSpec("contract.every10", "contract.task", "every 10s", "UTC", 60.0)


def _plan(make_task: Callable[..., NewTask], to_s: int, from_s: int | None = None,
          name: str = SPEC.name) -> Callable[[float, Mapping[str, ScheduleRecord]], SchedulePlan]:
    """A plan that fires the one tick ``to_s`` of ``name`` from the cursor it reads (or from
    ``from_s`` when given: a plan made from a cursor that is not the stored one)."""

    def plan(now: float, rows: Mapping[str, ScheduleRecord]) -> SchedulePlan:
        row = rows.get(name)
        if row is None:
            return SchedulePlan()
        task = make_task({"tick": to_s}, key=f"periodic:{name}:{to_s}")
        start = row.cursor_s if from_s is None else from_s
        return SchedulePlan([ScheduleAdvance(name, start, to_s, [task], [to_s], to_s)])

    return plan


def test_registration_starts_the_cursor_at_ledger_now_and_keeps_it_after(
    ledger: Ledger
) -> None:
    before = ledger.now()
    (row,) = ledger.register_schedules("w1", [SPEC])
    assert row.name == SPEC.name and row.task == "contract.task" and row.spec == "every 10s"
    assert int(before) <= row.cursor_s <= int(ledger.now())
    assert (row.fired, row.missed, row.last_fired_s) == (0, 0, None)
    assert row.registered_by == "w1" and row.seen_by == "w1"
    changed = ScheduleSpec(SPEC.name, "contract.task", "every 20s", "UTC", 5.0)
    (again,) = ledger.register_schedules("w2", [changed])
    assert again.cursor_s == row.cursor_s  # kept
    assert again.spec == "every 20s" and again.misfire_grace_s == 5.0
    assert again.registered_by == "w2" and again.first_registered_s == row.first_registered_s
    assert [r.name for r in ledger.schedules()] == [SPEC.name]


def test_a_pass_moves_the_cursor_it_read_and_submits_the_ticks(
    ledger: Ledger, make_task: Callable[..., NewTask]
) -> None:
    (row,) = ledger.register_schedules("w1", [SPEC])
    tick = row.cursor_s + 10
    fired: ScheduleFired = ledger.fire_schedules("w1", [SPEC.name], _plan(make_task, tick))
    assert fired.advanced == {SPEC.name} and not fired.lost
    assert fired.created == 1
    key = f"periodic:{SPEC.name}:{tick}"
    assert ledger.get(fired.submitted[key]).idempotency_key == key
    moved = fired.rows[SPEC.name]
    assert (moved.cursor_s, moved.last_fired_s, moved.fired) == (tick, tick, 1)
    # A plan made from the old cursor (another scheduler's stale read) changes nothing.
    stale = ledger.fire_schedules("w2", [SPEC.name],
                                  _plan(make_task, tick + 10, from_s=row.cursor_s))
    assert not stale.advanced and not stale.submitted and stale.created == 0
    (now,) = ledger.schedules()
    assert (now.cursor_s, now.fired) == (tick, 1)


def test_a_missed_tick_is_counted_with_its_reason(ledger: Ledger) -> None:
    (row,) = ledger.register_schedules("w1", [SPEC])

    def plan(now: float, rows: Mapping[str, ScheduleRecord]) -> SchedulePlan:
        start = rows[SPEC.name].cursor_s
        return SchedulePlan([ScheduleAdvance(SPEC.name, start, start + 30, missed=3,
                                             last_missed_s=start + 30,
                                             missed_reason="3 ticks late")])

    fired = ledger.fire_schedules("w1", [SPEC.name], plan)
    assert fired.advanced == {SPEC.name} and not fired.submitted
    (now,) = ledger.schedules()
    assert (now.missed, now.last_missed_s, now.last_missed_reason) == (
        3, row.cursor_s + 30, "3 ticks late")
    assert now.cursor_s == row.cursor_s + 30 and now.fired == 0


def test_two_schedulers_at_once_move_each_cursor_once(
    open_store: Callable[[], Ledger], make_task: Callable[..., NewTask]
) -> None:
    specs = [ScheduleSpec(f"contract.s{i}", "contract.task", "every 10s", "UTC", 60.0)
             for i in range(10)]
    ledgers = [open_store() for _ in range(2)]
    ledgers[0].register_schedules("w0", specs)
    rows = {r.name: r for r in ledgers[0].schedules()}

    def plan(now: float, read: Mapping[str, ScheduleRecord]) -> SchedulePlan:
        return SchedulePlan([
            ScheduleAdvance(name, r.cursor_s, rows[name].cursor_s + 10,
                            [make_task({}, key=f"periodic:{name}:x")],
                            [rows[name].cursor_s + 10], rows[name].cursor_s + 10)
            for name, r in read.items() if r.cursor_s == rows[name].cursor_s])

    barrier = threading.Barrier(2)
    results: list[ScheduleFired | None] = [None, None]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=20)
            results[i] = ledgers[i].fire_schedules(f"w{i}", sorted(rows), plan)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    done = [r for r in results if r is not None]
    assert len(done) == 2
    assert sorted(n for r in done for n in r.advanced) == sorted(rows)  # each exactly once
    assert sum(r.created for r in done) == len(rows)
    assert all(r.fired == 1 for r in ledgers[0].schedules())


def test_seen_moves_the_seen_time(ledger: Ledger) -> None:
    (row,) = ledger.register_schedules("w1", [SPEC])
    ledger.schedules_seen("w9", [SPEC.name])
    (now,) = ledger.schedules()
    assert now.seen_by == "w9" and now.seen_s >= row.seen_s
