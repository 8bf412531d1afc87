"""Rows 8 and 9 of the crash-point matrix (DESIGN §6): a holder paused past its lease
(SIGSTOP) whose late write is fenced off, and a batch commit lost below later committed
batches (``ctx.batches``' contiguous watermark)."""

from __future__ import annotations

import signal
from typing import Any

from ...ledger.base import BatchRun
from ...states import State
from ..processes import wait_for
from .app import CHARGE, DELIVER
from .context import BATCH_PARAMS, CHARGE_PARAMS, RowContext
from .rig import SIGKILLED, expect
from .rows_submit import check_like_control

__all__ = ["row8", "row9"]


def row8(ctx: RowContext) -> str:
    """Holder paused past its lease, then resumed: A stops itself (SIGSTOP) after the
    charge executed, its result not recorded (``effect.after_call``); its lease expires; B
    takes over and finishes (finding the charge by lookup); A is resumed and its late write
    is rejected by the fencing generation, changing nothing."""
    control = ctx.control_charge()
    rig = ctx.world("row8")
    rig.start_service()
    task_id = rig.app.submit(CHARGE, CHARGE_PARAMS).task_id
    a = rig.worker("A", pause_at="effect.after_call")
    a_holder = a.holder(60.0)
    a.wait_stopped()
    rig.wait_lease_expired(task_id)
    b = rig.worker("B")
    info = rig.wait_state(task_id)
    expect(info.generation == 2, f"B finished at generation {info.generation}, not 2")
    a.signal(signal.SIGCONT)

    def rejected() -> list[Any]:
        events = rig.ledger.timeline(task_id).events
        return [e for e in events if e.kind == "stale_rejected"]

    stale = wait_for("the resumed holder's late write to be rejected", rejected, 20.0)
    expect(all(e.holder == a_holder and e.generation == 1 for e in stale),
           f"a rejected write not of the paused holder's generation 1: {stale}")
    expect(a.returncode is None, "the paused holder did not survive its rejected write")
    expect(a.stop() == 0 and b.stop() == 0, "a worker did not stop gracefully")
    after = rig.get(task_id)
    check_like_control(rig, task_id, after.state, after.result, control)
    expect(after.generation == 2 and after.result == info.result,
           "the late write changed the task")
    ctx.counts.update(rig.counts(task_id), stale_rejections=len(stale))
    return ("holder paused after the charge, past its lease; the new holder found the "
            "charge by lookup; the late write was rejected by generation")


def row9(ctx: RowContext) -> str:
    """A batch of items: a later batch committed, an earlier one lost. Two batches in
    flight; batch 0 delivers and holds while the three later batches commit; the worker
    dies at ``batch.before_commit`` of batch 0. The watermark stays below the hole; the
    resumed task runs batch 0 again (its delivery found by lookup) and not the later ones;
    every item is applied once at the service."""
    control = ctx.control_batches()
    rig = ctx.world("row9")
    rig.lease_s = 2.0
    rig.start_service()
    n, size = BATCH_PARAMS["n"], BATCH_PARAMS["size"]
    task_id = rig.app.submit(DELIVER, {**BATCH_PARAMS, "hold_first": True}).task_id
    a = rig.worker("A", crash_at="batch.before_commit", skip=3, fast_takeover=True)
    later = tuple((p, p + size) for p in range(size, n, size))

    def later_committed() -> BatchRun | None:
        runs = rig.ledger.batch_runs([task_id])
        return runs[0] if runs and runs[0].above == later else None

    run = wait_for("the batches after batch 0 to commit", later_committed, 45.0)
    expect(run.watermark == 0, f"the watermark passed the uncommitted batch 0: {run.watermark}")
    rig.gate.touch()
    status = a.wait(30.0)
    expect(status == SIGKILLED, f"the worker was to die at batch.before_commit, exited {status}")
    crashed = rig.ledger.batch_runs([task_id])[0]
    expect((crashed.watermark, crashed.above) == (0, later),
           f"after the kill: watermark {crashed.watermark}, above {crashed.above}")
    b = rig.worker("B", fast_takeover=True)
    info = rig.wait_state(task_id)
    expect(b.stop() == 0, "the clean worker did not stop gracefully")
    expect(info.state is State.SUCCEEDED, f"the task ended {info.state.value}")
    expect(info.result == control.result,
           f"the report differs from the control run's: {info.result} != {control.result}")
    items = rig.items()
    expect(items == control.items,
           f"items applied at the service differ from the control run's: {items}")
    per_batch = {k.split("@")[1]: v for k, v in rig.executions().items()}
    expect(per_batch == control.executions, f"deliveries per batch {per_batch}")
    calls = rig.step_counts(task_id)
    wanted = {f"batch@{p}": 2 if p == 0 else 1 for p in range(0, n, size)}
    expect(calls == wanted, f"batch function calls {calls} != {wanted}")
    ctx.counts.update(items_applied=sum(items.values()), items=n,
                      deliveries=per_batch, batch_calls=calls)
    return ("batch 0's commit lost below three committed batches: batch 0 ran again, the "
            "others did not; every item applied once")
