"""The crash-point matrix (DESIGN §6), row 9, with real processes and real signals: a
batch whose commit was lost while a later batch committed is processed again on resume
(the contiguous watermark cannot pass its hole); a batch whose commit landed is not (the
ledger keeps it, above the watermark or below it). Both ledgers.

Counted outside Ratchet: batch function calls in the append-only call log, delivered items
at the counting service (which does not deduplicate keys: an item delivered twice shows 2).
"""

from __future__ import annotations

import signal

import pytest
from batchapp import DELIVER, deliver_key
from batchkit import BatchRig, wait_for

from ratchet import Control, State
from ratchet.ledger.base import BatchRun, EffectState

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

SIGKILLED = -signal.SIGKILL
SIZE = 10


def _assert_finished(rig: BatchRig, task_id: str, n: int) -> BatchRun:
    """The task succeeded with every item committed once, each delivered once at the
    service, and the conservation check adds up."""
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED, info
    batches = -(-n // SIZE)
    assert info.result == {"name": "items", "items": n, "succeeded": n, "failed": 0,
                           "skipped": 0, "batches": batches}
    run = rig.run(task_id)
    assert run is not None
    assert (run.watermark, run.above, run.done) == (n, (), True)
    assert (run.succeeded, run.failed, run.skipped, run.batches, run.total) == (
        n, 0, 0, batches, n)
    records = rig.records()
    assert records.items == dict.fromkeys(range(n), 1), "an item delivered twice or never"
    assert records.executions == {deliver_key(task_id, p): 1 for p in range(0, n, SIZE)}
    with Control(rig.reader_url) as control:
        report = control.check(task_id)
    assert report.ok, report
    (line,) = report.lines
    assert (line.expected, line.succeeded, line.in_flight, line.difference) == (n, n, 0, 0)
    rig.check_consistent()
    return run


@pytest.mark.parametrize("how", ["fault_point", "sigkill"])
def test_row9_lost_commit_below_a_later_commit_is_processed_again(
        rig: BatchRig, how: str) -> None:
    """Two batches in flight; the batch at position 0 delivers its items and holds while the
    three batches after it commit. Then the worker dies with batch 0's commit not sent:
    at fault point ``batch.before_commit`` (after the three later batches passed it), or
    by SIGKILL from the test while batch 0 holds. The ledger's watermark stays at 0 with
    the three batches above it. A fresh worker runs batch 0 again (its delivery found by
    the service's lookup, not sent twice), skips the three, and finishes."""
    rig.start_service()
    n = 4 * SIZE
    task_id = rig.app.submit(DELIVER, {"n": n, "size": SIZE, "parallel": 2,
                                       "hold_first": True}).task_id
    if how == "fault_point":
        a = rig.worker("A", crash_at="batch.before_commit", skip=3)
    else:
        a = rig.worker("A")
    a.holder()
    later = ((SIZE, 2 * SIZE), (2 * SIZE, 3 * SIZE), (3 * SIZE, 4 * SIZE))

    def later_committed() -> BatchRun | None:
        run = rig.run(task_id)
        return run if run is not None and run.above == later else None

    run = wait_for("the three batches after batch 0 to commit", later_committed, 60.0)
    assert run.watermark == 0 and run.batches == 3 and run.succeeded == 3 * SIZE
    if how == "fault_point":
        rig.gate.touch()  # batch 0 returns and reaches batch.before_commit: the 4th time
        assert a.wait(30.0) == SIGKILLED, a.describe()
    else:
        wait_for("batch 0 to deliver", lambda: rig.records().items.get(0) == 1, 30.0)
        assert a.kill() == SIGKILLED
    # At the crash: batch 0 delivered (the service applied its items), not committed.
    assert rig.records().items == dict.fromkeys(range(n), 1)
    crashed = rig.run(task_id)
    assert crashed is not None
    assert (crashed.watermark, crashed.above, crashed.batches) == (0, later, 3)
    assert rig.call_counts(task_id) == {p: 1 for p in range(0, n, SIZE)}

    b = rig.worker("B")
    _assert_finished(rig, task_id, n)
    assert b.stop() == 0
    # Batch 0 ran again on resume (the second claim), the three later batches did not.
    assert rig.call_counts(task_id) == {0: 2, SIZE: 1, 2 * SIZE: 1, 3 * SIZE: 1}
    assert sorted(c.attempt for c in rig.calls(task_id) if c.pos == 0) == [1, 2]
    assert all(c.attempt == 1 for c in rig.calls(task_id) if c.pos != 0)
    # Its delivery is one effect, done: recorded by the first run (the second found the
    # record and made no call) or, had the record been lost with the commit, by the
    # second run from the service's lookup.
    effects = rig.ledger.timeline(task_id).effects
    first = [e for e in effects if e.key == deliver_key(task_id, 0)]
    assert len(first) == 1 and first[0].state is EffectState.DONE, first
    assert first[0].generation == 1 or first[0].via_lookup, first[0]


def test_batch_after_commit_kill_is_not_processed_again(rig: BatchRig) -> None:
    """One batch at a time; the worker dies at fault point ``batch.after_commit`` of the
    third batch (committed, not yet counted by the task). A fresh worker resumes past it:
    every batch ran once."""
    rig.start_service()
    n = 5 * SIZE
    task_id = rig.app.submit(DELIVER, {"n": n, "size": SIZE, "parallel": 1}).task_id
    a = rig.worker("A", crash_at="batch.after_commit", skip=2)
    assert a.wait(60.0) == SIGKILLED, a.describe()
    crashed = rig.run(task_id)
    assert crashed is not None
    assert (crashed.watermark, crashed.above, crashed.batches) == (3 * SIZE, (), 3)
    assert rig.call_counts(task_id) == {0: 1, SIZE: 1, 2 * SIZE: 1}
    assert rig.records().items == dict.fromkeys(range(3 * SIZE), 1)

    b = rig.worker("B")
    _assert_finished(rig, task_id, n)
    assert b.stop() == 0
    assert rig.call_counts(task_id) == {p: 1 for p in range(0, n, SIZE)}
    assert [c.attempt for c in rig.calls(task_id)] == [1, 1, 1, 2, 2]


@pytest.mark.parametrize("point", ["effect.after_intent", "effect.after_call"])
def test_kill_inside_a_batch_delivery_delivers_once(rig: BatchRig, point: str) -> None:
    """Rows 5 inside a batch: the worker dies in the third batch's delivery, its intent
    recorded and the request not sent (``after_intent``) or sent and executed, its result
    not recorded (``after_call``). The resumed task runs that batch again; the service's
    lookup decides whether to send: its items are applied once either way."""
    rig.start_service()
    n = 5 * SIZE
    task_id = rig.app.submit(DELIVER, {"n": n, "size": SIZE, "parallel": 1}).task_id
    a = rig.worker("A", crash_at=point, skip=2)
    assert a.wait(60.0) == SIGKILLED, a.describe()
    crashed = rig.run(task_id)
    assert crashed is not None and (crashed.watermark, crashed.batches) == (2 * SIZE, 2)
    sent = 3 * SIZE if point == "effect.after_call" else 2 * SIZE
    assert rig.records().items == dict.fromkeys(range(sent), 1)

    b = rig.worker("B")
    _assert_finished(rig, task_id, n)
    assert b.stop() == 0
    assert rig.call_counts(task_id) == {**{p: 1 for p in range(0, n, SIZE)}, 2 * SIZE: 2}
    (effect,) = [e for e in rig.ledger.timeline(task_id).effects
                 if e.key == deliver_key(task_id, 2 * SIZE)]
    assert effect.state is EffectState.DONE
    assert effect.via_lookup is (point == "effect.after_call"), effect
