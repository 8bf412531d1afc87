"""Bulkheads with real worker processes on both ledgers (DESIGN §8).

Each task body writes its start and end to an ``O_APPEND`` file (tests/bulkheads/bhapp.py),
so what is checked is what executed, not what the ledger says: the intervals of a type
with a limit of k never overlap more than k, with several worker processes claiming at
once, right after a worker is SIGKILLed and restarted (its RUNNING row keeps its slot
until the revocation or the lease's expiry), and while a worker's heartbeat stops briefly
(the lease has not expired: the slot stays taken). The documented exception, a holder
frozen past its lease, is tested on both sides: its successor does run (the slot is
handed on at expiry), the frozen body overlaps it, and the frozen holder's writes are
fenced. Last, the critical type's oldest pending age stays bounded while a capped flooding
type backs up.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ratchet import App, Control, State
from ratchet.testing import ConditionTimeout, ProcessGroup, wait_for

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

pytestmark = pytest.mark.timeout(240)

Interval = tuple[float, float, dict[str, Any]]


class Rig:
    """A ledger, an interval log and a group of worker processes."""

    def __init__(self, tmp: Path, ledger_url: str, lease_s: float = 2.0) -> None:
        self.url = ledger_url
        self.log = tmp / "intervals.jsonl"
        self.group = ProcessGroup(tmp / "logs", pythonpath=[HERE],
                                  env={"BH_LOG": str(self.log), "BH_LEASE_S": str(lease_s)})
        os.environ["BH_LEASE_S"] = str(lease_s)  # read by bhapp at import
        self.app: App = importlib.reload(importlib.import_module("bhapp")).app
        self.app.configure(ledger=ledger_url)
        self.control = Control(ledger_url)
        self.control.migrate()

    def worker(self, name: str, concurrency: int = 3, **kw: Any) -> Any:
        return self.group.worker("bhapp:app", self.url, name=name, concurrency=concurrency,
                                 poll_interval_s=0.02, **kw)

    def submit(self, name: str, n: int, ms: int, tenant: str | None = None) -> list[str]:
        return [self.app.submit(name, {"ms": ms, "i": i}, tenant=tenant).task_id
                for i in range(n)]

    def lines(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines() if x]

    def intervals(self, name: str, open_end: float | None = None) -> list[Interval]:
        starts: dict[tuple[str, int, int], dict[str, Any]] = {}
        out: list[Interval] = []
        for rec in self.lines():
            if rec["name"] != name:
                continue
            key = (rec["task"], rec["generation"], rec["pid"])
            if rec["kind"] == "start":
                starts[key] = rec
            else:
                out.append((starts.pop(key)["at"], rec["at"], rec))
        for rec in starts.values():
            out.append((rec["at"], open_end if open_end is not None else float("inf"), rec))
        return out

    def wait_done(self, ids: list[str], timeout_s: float = 120.0,
                  sample: Any = None) -> None:
        def done() -> bool:
            if sample is not None:
                sample()
            infos = self.control.get_many(ids)
            return len(infos) == len(ids) and all(t.state is State.SUCCEEDED for t in infos)

        self.wait("the tasks to succeed", done, timeout_s)

    def wait(self, what: str, probe: Any, timeout_s: float = 30.0) -> None:
        try:
            wait_for(what, probe, timeout_s=timeout_s, interval_s=0.02)
        except ConditionTimeout as exc:
            raise AssertionError(f"{exc}\n{self.group.dump()}") from None

    def close(self) -> None:
        try:
            self.group.cleanup()
        finally:
            self.control.close()
            self.app.close()


@pytest.fixture
def rig_factory(tmp_path: Path, ledger_url: str) -> Iterator[Any]:
    made: list[Rig] = []

    def make(lease_s: float = 2.0) -> Rig:
        r = Rig(tmp_path, ledger_url, lease_s)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def max_overlap(intervals: list[Interval]) -> int:
    """The largest number of intervals open at one instant (an end before a start at the
    same instant)."""
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def running_of(control: Control, name: str) -> int:
    return next((u.running for u in control.limits().usage if u.name == name), 0)


@pytest.mark.parametrize("k", [1, 3])
def test_limit_holds_with_several_worker_processes(rig_factory: Any, k: int) -> None:
    rig = rig_factory()
    rig.control.set_limit("type", "bh.limited", maximum=k, reason="test", by="t")
    # Four processes of two threads and no prefetch: more capacity than the limit, and no
    # single process can hold all of a limit of 3 (a process that holds the slots keeps
    # winning them: its completion and its next claim are one transaction). All are up
    # before the work is submitted: on a loaded machine a late starter can find nothing
    # left (one process doing every task, within its 2 slots, proves nothing).
    workers = [rig.worker(f"w{i}", concurrency=2, args=["--prefetch", "0"]) for i in range(4)]
    for w in workers:
        w.holder()
    ids = rig.submit("bh.limited", 12 * k, 40)
    filler = rig.submit("bh.flood", 20, 10)
    seen: list[int] = []
    rig.wait_done(ids + filler, sample=lambda: seen.append(running_of(rig.control,
                                                                      "bh.limited")))
    assert max(seen) <= k
    intervals = rig.intervals("bh.limited")
    assert len(intervals) == len(ids)
    assert max_overlap(intervals) <= k
    if k > 1:
        assert len({iv[2]["pid"] for iv in intervals}) >= 2  # several processes took part


def started_long_task(rig: Rig, workers: list[Any]) -> Any:
    """The worker (of ``workers``) that started the first task body. Both workers are up
    before the long task is submitted, so no worker start-up (seconds on a loaded machine)
    falls between the body's start and what the test does to its holder."""
    rig.wait("the long task to start", lambda: any(r["kind"] == "start" for r in rig.lines()))
    pid = next(r["pid"] for r in rig.lines() if r["kind"] == "start")
    return next(w for w in workers if w.pid == pid)


def test_sigkill_and_restart_keep_the_slot_until_revoked(rig_factory: Any) -> None:
    rig = rig_factory(lease_s=3.0)
    rig.control.set_limit("type", "bh.limited", maximum=1, reason="test", by="t")
    workers = [rig.worker("a", concurrency=2), rig.worker("b", concurrency=2)]
    for w in workers:
        w.holder()
    [long_id] = rig.submit("bh.limited", 1, 5000)
    a = started_long_task(rig, workers)
    # Killed at once, the short tasks submitted after: on a loaded machine their submits
    # can take longer than the long body, which would then end before the kill.
    a.kill()
    killed_at = time.time()
    short = rig.submit("bh.limited", 6, 50)
    rig.worker("a2", concurrency=2)
    rig.wait_done([long_id, *short])
    intervals = rig.intervals("bh.limited", open_end=killed_at)
    assert max_overlap(intervals) <= 1
    # Nothing else started while the killed attempt held the slot.
    first = min(iv[0] for iv in intervals)
    assert all(s >= killed_at for s, _, rec in intervals if s > first)
    assert rig.control.get(long_id).attempt == 2


def test_brief_heartbeat_outage_keeps_the_slot(rig_factory: Any) -> None:
    rig = rig_factory(lease_s=4.0)
    rig.control.set_limit("type", "bh.limited", maximum=1, reason="test", by="t")
    workers = [rig.worker("a", concurrency=2), rig.worker("b", concurrency=2)]
    for w in workers:
        w.holder()
    [long_id] = rig.submit("bh.limited", 1, 2500)
    a = started_long_task(rig, workers)
    short = rig.submit("bh.limited", 4, 50)
    # The holder stops renewing for 1.2 s (well inside its 4 s lease): the slot stays its.
    a.signal(signal.SIGSTOP)
    a.wait_stopped()
    stopped = time.time()
    wait_for("1.2 s stopped", lambda: time.time() - stopped >= 1.2, timeout_s=5)
    assert running_of(rig.control, "bh.limited") == 1
    a.signal(signal.SIGCONT)
    rig.wait_done([long_id, *short])
    intervals = rig.intervals("bh.limited")
    assert max_overlap(intervals) <= 1
    assert rig.control.get(long_id).attempt == 1  # never taken over


def test_frozen_holder_past_its_lease_is_the_documented_exception(rig_factory: Any) -> None:
    """Fencing stops a frozen holder's writes, not its CPU: after its lease expires the slot
    passes to a successor while the frozen body may still be executing."""
    rig = rig_factory(lease_s=1.0)
    rig.control.set_limit("type", "bh.limited", maximum=1, reason="test", by="t")
    [long_id] = rig.submit("bh.limited", 1, 1500)
    a = rig.worker("a", concurrency=1)
    rig.wait("the long task to start", lambda: any(r["kind"] == "start" for r in rig.lines()))
    a.signal(signal.SIGSTOP)
    a.wait_stopped()
    rig.worker("b", concurrency=1)
    # The slot is handed on at the lease's expiry: the successor runs the task to its end.
    rig.wait_done([long_id])
    a.signal(signal.SIGCONT)
    frozen_pid = a.pid
    rig.wait("the frozen body to end",
             lambda: sum(1 for r in rig.lines() if r["kind"] == "end") >= 2)
    intervals = rig.intervals("bh.limited")
    frozen = [iv for iv in intervals if iv[2]["pid"] == frozen_pid]
    others = [iv for iv in intervals if iv[2]["pid"] != frozen_pid]
    assert len(frozen) == 1 and others
    assert max_overlap(others) <= 1
    assert max_overlap(intervals) == 2  # the frozen body overlapped its successor
    # ...and its writes were fenced: its completion is a stale rejection.
    rig.wait("the frozen holder's completion to be fenced",
             lambda: any(e.kind == "stale_rejected"
                         for e in rig.control.history(long_id).events))
    events = rig.control.history(long_id).events
    assert [e.kind for e in events].count("takeover") == 1
    info = rig.control.get(long_id)
    assert info.state is State.SUCCEEDED and info.generation == 2


def test_critical_oldest_pending_age_stays_bounded_under_a_flood(rig_factory: Any) -> None:
    rig = rig_factory()
    rig.control.set_limit("type", "bh.flood", maximum=2, reason="bulkhead", by="t")
    flood = rig.submit("bh.flood", 400, 40)
    workers = [rig.worker(f"w{i}", concurrency=3) for i in range(2)]
    for w in workers:
        w.holder()
    rig.wait("the flood to run at its cap", lambda: running_of(rig.control, "bh.flood") == 2)
    waits: list[float] = []
    critical: list[str] = []
    # Critical tasks one after the other (at least 8) until the flood has backed up for
    # more than 2 s (a condition with a deadline, not a fixed number of rounds: how long 8
    # rounds take depends on the machine's load).
    deadline = time.monotonic() + 60.0
    while True:
        submitted = time.time()
        [task_id] = rig.submit("bh.critical", 1, 20)
        critical.append(task_id)
        rig.wait_done([task_id], timeout_s=30)
        start = next(r["at"] for r in rig.lines()
                     if r["task"] == task_id and r["kind"] == "start")
        waits.append(start - submitted)
        status = rig.control.status()
        if len(waits) >= 8 and (status.oldest_pending_age_s or 0) > 2.0:
            break
        assert time.monotonic() < deadline, (status.oldest_pending_age_s, waits)
    flood_left = sum(1 for t in rig.control.get_many(flood) if t.state is not State.SUCCEEDED)
    # The flood backs up (its oldest pending task waits for seconds, most of it left)...
    assert flood_left > 100, flood_left
    # ...while every critical task starts within a bound (a poll interval plus a claim).
    assert max(waits) < 1.0, waits


def test_borrowed_reservation_is_handed_back_as_borrowers_finish(rig_factory: Any) -> None:
    """Total 4 slots, bh.critical reserved 2, the flood unlimited: while the critical type
    is idle the flood borrows all 4; once critical work is ready, the flood's new claims are
    refused and each slot a flood task frees goes to the critical type (no preemption)."""
    rig = rig_factory()
    rig.control.set_limit("total", maximum=4, reason="test", by="t")
    rig.control.set_limit("type", "bh.critical", reserved=2, reason="test", by="t")
    flood = rig.submit("bh.flood", 200, 400)
    for i in range(2):
        rig.worker(f"w{i}", concurrency=3, args=["--prefetch", "0"])
    rig.wait("the flood to borrow every slot",
             lambda: running_of(rig.control, "bh.flood") == 4)
    critical = rig.submit("bh.critical", 2, 50)
    seen: list[int] = []
    rig.wait_done(critical, sample=lambda: seen.append(rig.control.limits().running))
    assert max(seen) <= 4
    submitted = min(t.created_at for t in rig.control.get_many(critical))
    claimed = sorted(next(e.at for e in rig.control.history(c).events if e.kind == "claim")
                     for c in critical)
    # Each critical task got a slot as soon as a borrowed one ended (flood tasks: 0.4 s).
    assert claimed[-1] - submitted < 1.5, (submitted, claimed)
    # No new borrower in between (0.3 s of grace for a flood claim already in flight when
    # the critical tasks became ready).
    flood_claims = [e.at for f in rig.control.get_many(flood) if f.attempt
                    for e in rig.control.history(f.task_id).events if e.kind == "claim"]
    assert not [at for at in flood_claims if submitted + 0.3 < at < claimed[-1]], (
        submitted, claimed, sorted(flood_claims))
