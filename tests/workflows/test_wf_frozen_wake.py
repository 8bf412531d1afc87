"""A holder frozen (SIGSTOP) past its lease while waking from a durable sleep is fenced.

Worker A runs a ``wf.sleeper`` task to its sleep, parks it, claims it again at the
deadline and freezes itself there (``RATCHET_PAUSE_AT``: a real SIGSTOP): right after the
wake-up claim committed, right after ``ctx.sleep`` returned, or (fenced target) between
its last lease check and the send of the effect after the sleep. Its lease expires by the
ledger clock, worker B takes the task over and finishes it. Then A gets SIGCONT and goes
on: its late writes are rejected by the fencing generation and change nothing, and the
effect after the sleep is counted once at the service (which does not deduplicate keys;
in fenced mode it refuses A's stale token). Both ledgers.
"""

from __future__ import annotations

import pytest
from wfapp import SLEEPER
from wfkit import WfRig, wait_for

from ratchet import State

pytestmark = [pytest.mark.crash, pytest.mark.timeout(90)]

LEASE_S = 2.0


@pytest.mark.parametrize(
    ("target", "pause_at", "skip"),
    [("lookup", "claim.after_commit", 1), ("lookup", "test.after_wake", 0),
     ("fenced", "effect.before_call", 1)],
    ids=["frozen-at-the-wake-claim", "frozen-after-sleep-returned",
         "frozen-before-the-send-fenced-target"],
)
def test_holder_frozen_past_its_lease_while_waking(
    rig: WfRig, target: str, pause_at: str, skip: int
) -> None:
    nap_s = 1.5
    order = "f1"
    rig.lease_s = LEASE_S
    rig.start_service(check_tokens=target == "fenced")
    task_id = rig.submit(SLEEPER, {"order": order, "nap_s": nap_s, "target": target})
    # Revocation is for dead holders; A is alive (stopped): only lease expiry frees it.
    a = rig.worker("A", pause_at=pause_at, skip=skip, fast_takeover=False)
    a_holder = a.holder()
    rig.wait_waiting(task_id)
    a.wait_stopped(30)
    assert not rig.ledger_locked(), "A froze holding ledger locks"
    held = rig.get(task_id)
    assert held.state is State.RUNNING and held.holder == a_holder, held
    assert rig.executions() == {f"before:{order}": 1}, "A froze before the effect after"
    rig.wait_lease_expired(task_id)

    b = rig.worker("B", fast_takeover=False)
    b_holder = b.holder()
    by_b = rig.wait_state(task_id)
    assert by_b.state is State.SUCCEEDED, by_b
    assert by_b.generation > held.generation
    assert rig.executions() == {f"before:{order}": 1, f"after:{order}": 1}
    stale_before = rig.ledger.stats().stale_rejections

    a.resume()
    if target == "fenced":
        # A's request leaves late with its old token: the service refuses it (nothing
        # executes); A abandons the attempt without a ledger write (DESIGN §5).
        wait_for("the service to refuse A's stale token", lambda: rig.records().rejections)
    else:
        # A goes on after the sleep: its next boundary cannot confirm the lease, and the
        # end of its attempt is written at its old generation: rejected.
        wait_for(
            "A's late write to be rejected by generation",
            lambda: rig.ledger.stats().stale_rejections > stale_before,
        )
    assert a.returncode is None, "the stale holder must survive its rejected write"
    rig.stop_all([a, b])

    final = rig.get(task_id)
    assert (final.state, final.generation, final.result) == (
        by_b.state, by_b.generation, by_b.result), "A's late writes changed B's outcome"
    records = rig.records()
    assert records.executions == {f"before:{order}": 1, f"after:{order}": 1}, (
        records.executions)
    assert final.result["after"] == records.ids[f"after:{order}"]
    assert rig.step_counts(task_id)["finish"] == 1, "only B finished"
    takeovers = rig.events(task_id, "takeover")
    assert [e.holder for e in takeovers] == [b_holder], takeovers
    stale = rig.events(task_id, "stale_rejected")
    assert all(e.holder == a_holder for e in stale), stale
    if target == "fenced":
        (refused,) = records.rejections
        assert refused.key == f"after:{order}" and refused.op == "execute", refused
        assert refused.token < refused.highest == final.generation, refused
    else:
        assert stale, "A's late write must have reached the ledger and been rejected"
    rig.check_consistent()
