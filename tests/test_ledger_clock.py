"""The ledger clock's step watch (ratchet.ledger.clock) and the repair's audit row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.ledger.base import Ledger, NewTask
from ratchet.ledger.clock import ClockWatch
from ratchet.serde import digest
from ratchet.testing import inject_clock


class _Mono:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_new_watch_is_pending_once() -> None:
    mono = _Mono()
    watch = ClockWatch(tolerance_s=2.0, monotonic=mono)
    assert watch.observe(1000.0)  # a process that starts has not seen the clock before
    watch.repaired()
    mono.t += 5.0
    assert not watch.observe(1005.0)


def test_lag_below_the_tolerance_is_not_a_step_and_a_fall_beyond_it_is() -> None:
    mono = _Mono()
    watch = ClockWatch(tolerance_s=2.0, monotonic=mono)
    watch.observe(1000.0)
    watch.repaired()
    mono.t += 10.0
    assert not watch.observe(1008.5)  # read 1.5 s before it was observed: lag
    assert not watch.observe(1010.0)
    mono.t += 1.0
    assert watch.observe(1011.0 - 60.0)  # stepped back 60 s
    assert watch.steps_seen == 1 and watch.last_step_s == pytest.approx(60.0)
    assert watch.observe(952.0)  # pending until a repair commits
    watch.repaired()
    mono.t += 1.0
    assert not watch.observe(952.0)  # the stepped clock is the reference now
    mono.t += 1.0
    assert not watch.observe(1100.0)  # a forward step is not repaired (nothing idles)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    opened = open_ledger(ledger_url)
    yield opened
    opened.close()


def test_the_repair_after_a_step_back_is_audited(ledger: Ledger) -> None:
    clock = inject_clock(ledger)
    assert ledger.claim("w1", ["t"], 1) == []  # the first claim's check: nothing to do
    clock.step(60.0)
    assert ledger.claim("w1", ["t"], 1) == []  # a polling worker sees the stepped clock
    ledger.submit([NewTask(new_task_id(), "t", 1, "{}", digest("t", "{}"), None, 3, 30.0,
                           delay_s=3.0)])
    clock.step(-60.0)
    assert ledger.claim("w1", ["t"], 1) == []  # re-anchored at its 3 s, not ready yet
    assert ledger.audit_kind_counts().get("clock_step") == 1
    assert ledger.claim("w1", ["t"], 1) == []  # once per step
    assert ledger.audit_kind_counts().get("clock_step") == 1
