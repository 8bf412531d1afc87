"""A stale holder's late batch commit (DESIGN §6 rows 8 and 9 together), real processes,
both ledgers: worker A stops itself (SIGSTOP, fault point ``batch.before_commit``) after
its third batch delivered its items and before that batch's commit is sent; its lease
expires; worker B takes the task over and finishes it (the third batch again: its delivery
found, not sent twice); then A resumes (SIGCONT) and sends its late commit. The ledger
rejects it by generation (audited ``stale_rejected``); the run's watermark and counts do
not change, and every item counts once, in the ledger and at the counting service.
"""

from __future__ import annotations

import dataclasses

import pytest
from batchapp import DELIVER, deliver_key
from batchkit import BatchRig, wait_for

from ratchet import Control, State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

SIZE = 10
BATCHES = 6


def test_late_batch_commit_of_a_paused_holder_is_rejected(rig: BatchRig) -> None:
    n = BATCHES * SIZE
    rig.lease_s = 2.0
    rig.start_service()
    task_id = rig.app.submit(DELIVER, {"n": n, "size": SIZE, "parallel": 1}).task_id
    a = rig.worker("A", pause_at="batch.before_commit", skip=2)
    a_holder = a.holder()
    a.wait_stopped(30.0)
    assert not rig.ledger_locked(), "the stopped worker froze holding ledger locks"
    paused = rig.run(task_id)
    assert paused is not None and (paused.watermark, paused.batches) == (2 * SIZE, 2)
    # The third batch delivered its items before A stopped; its commit was not sent.
    assert rig.records().items == dict.fromkeys(range(3 * SIZE), 1)
    rig.wait_lease_expired(task_id)

    b = rig.worker("B")
    b_holder = b.holder()
    info = rig.wait_state(task_id)
    assert info.state is State.SUCCEEDED and info.generation == 2, info
    assert info.holder is None
    timeline = rig.ledger.timeline(task_id)
    (takeover,) = [e for e in timeline.events if e.kind == "takeover"]
    assert takeover.holder == b_holder and takeover.detail["previous_holder"] == a_holder
    finished = rig.run(task_id)
    assert finished is not None
    assert (finished.watermark, finished.above, finished.done, finished.batches,
            finished.succeeded) == (n, (), True, BATCHES, n)

    a.resume()

    def rejected() -> list[object]:
        return [e for e in rig.ledger.timeline(task_id).events if e.kind == "stale_rejected"]

    stale = wait_for("A's late batch commit to be rejected", rejected, 30.0)
    assert all(e.holder == a_holder and e.generation == 1 for e in stale), stale
    first = stale[0].detail
    assert first["operation"] == f"batch:{finished.run}@{2 * SIZE}", first
    assert first["current_generation"] == 2
    assert a.returncode is None, "the stale holder must survive its rejected write"
    assert a.stop() == 0 and b.stop() == 0
    # A's attempt ended on the rejection (StaleGeneration): its worker counts it stale.
    assert "by_outcome={'stale': 1}" in a.log(), a.log()[-2000:]

    # Nothing of the late commit landed: the run, the task and the counts stand.
    after = rig.run(task_id)
    assert after is not None
    assert dataclasses.replace(after, updated_at=finished.updated_at) == finished
    assert after.updated_at == finished.updated_at, "the late commit touched the run"
    assert rig.get(task_id).result == info.result
    assert info.result == {"name": "items", "items": n, "succeeded": n, "failed": 0,
                           "skipped": 0, "batches": BATCHES}
    # Batch 2 ran twice (A's commit was rejected, B ran it again); once at the service.
    assert rig.call_counts(task_id) == {**{p: 1 for p in range(0, n, SIZE)}, 2 * SIZE: 2}
    records = rig.records()
    assert records.items == dict.fromkeys(range(n), 1)
    assert records.executions == {deliver_key(task_id, p): 1 for p in range(0, n, SIZE)}
    with Control(rig.reader_url) as control:
        report = control.check(task_id)
    assert report.ok, report
    assert rig.ledger.stats().stale_rejections == len(stale)
    rig.check_consistent()
