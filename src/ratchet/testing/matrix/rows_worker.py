"""Rows 4-7 of the crash-point matrix (DESIGN §6): a worker killed with SIGKILL at a fault
point while it holds the charge task; a clean worker, started after, takes the task over
once the dead holder's lease expired by the ledger clock and finishes it. The end must
equal the crash-free control run, counted at the counting service and the step log."""

from __future__ import annotations

from ...ledger.base import EffectState
from ...states import State
from .app import CHARGE
from .context import CHARGE_PARAMS, RowContext
from .rig import SIGKILLED, MatrixRig, expect
from .rows_submit import finish_like_control

__all__ = ["WRITER_THREAD", "row4", "row5", "row6", "row7"]

KEY = f"charge:{CHARGE_PARAMS['order_id']}"
"""The charge's key as the rig reads it (the world's prefix stripped)."""


def _killed_worker(rig: MatrixRig, point: str, skip: int | None = None,
                   after: str | None = None) -> str:
    """Submit the charge and run a worker that SIGKILLs itself at ``point`` (the ``skip`` +
    1-th time, counted from when point ``after`` was reached if named); its task id."""
    task_id = rig.app.submit(CHARGE, CHARGE_PARAMS).task_id
    dead = rig.worker("A", crash_at=point, skip=skip, after=after)
    status = dead.wait(30.0)
    expect(status == SIGKILLED, f"the worker was to die at {point}, exited {status}:\n"
                                f"{dead.log()[-800:]}")
    return task_id


def row4(ctx: RowContext) -> str:
    """Claimed, nothing executed (``claim.after_commit``): the task is held by a dead
    worker until its lease expires; the new holder's generation is one higher."""
    control = ctx.control_charge()
    rig = ctx.world("row4")
    rig.start_service()
    task_id = _killed_worker(rig, "claim.after_commit")
    held = rig.get(task_id)
    expect(held.state is State.RUNNING and held.generation == 1,
           f"after the kill the task is {held.state.value}, generation {held.generation}")
    expect(rig.executions() == {} and rig.step_runs() == [], "something ran before the kill")
    finish_like_control(rig, task_id, control)
    takeovers = [e for e in rig.ledger.timeline(task_id).events if e.kind == "takeover"]
    expect(len(takeovers) == 1, f"{len(takeovers)} takeovers, not one")
    takeover = takeovers[0]
    expect(takeover.generation == 2, f"taken over at generation {takeover.generation}, not 2")
    expect(held.lease_until is not None and takeover.at >= held.lease_until,
           "the task was taken over before the dead holder's lease expired")
    ctx.counts.update(rig.counts(task_id), generation=2)
    return "worker killed after its claim; taken over after lease expiry at generation 2"


def row5(ctx: RowContext) -> str:
    """External effect done, not recorded: killed after the effect's intent committed, the
    call not made (``effect.after_intent``), and after the call executed, its result not
    recorded (``effect.after_call``). The new holder looks up first: it calls only when the
    service says the charge was not made."""
    control = ctx.control_charge()
    counts: dict[str, object] = {}
    for point, executed in (("effect.after_intent", False), ("effect.after_call", True)):
        rig = ctx.world(f"row5-{point.split('.')[1]}")
        rig.start_service()
        task_id = _killed_worker(rig, point)
        effects = rig.ledger.timeline(task_id).effects
        expect(len(effects) == 1 and effects[0].state is EffectState.INTENT,
               f"at {point} the effect must be an open intent: {effects}")
        seen = rig.executions()
        expect(seen == ({KEY: 1} if executed else {}),
               f"at {point} the service counted {seen}")
        finish_like_control(rig, task_id, control)
        (effect,) = rig.ledger.timeline(task_id).effects
        expect(effect.via_lookup is executed,
               f"at {point}: the result {'must' if executed else 'must not'} come from the "
               "lookup")
        counts[point] = rig.counts(task_id)
        ctx.worlds.release(rig)
    ctx.counts.update(counts)
    return ("killed before the call: the new holder's lookup found nothing and it charged "
            "once; killed after the call: the lookup found the charge, no second call")


def row6(ctx: RowContext) -> str:
    """Step recorded, not acknowledged (``step.after_commit`` after the durable step
    ``finalize`` committed): the new holder runs no committed step again."""
    control = ctx.control_charge()
    rig = ctx.world("row6")
    rig.start_service()
    task_id = _killed_worker(rig, "step.after_commit", skip=1)
    steps = sorted(s.name for s in rig.ledger.timeline(task_id).steps)
    expect(steps == ["finalize", "prepare"], f"committed steps at the kill: {steps}")
    expect(rig.step_counts(task_id) == {"prepare": 1, "finalize": 1},
           f"step runs at the kill: {rig.step_counts(task_id)}")
    finish_like_control(rig, task_id, control, steps={"prepare": 1, "finalize": 1})
    info = rig.get(task_id)
    expect(info.generation == 2, f"finished at generation {info.generation}, not 2")
    ctx.counts.update(rig.counts(task_id))
    return "killed after both steps committed: the new holder ran neither again"


WRITER_THREAD = "ratchet-writer"
"""The worker's writer thread: its claims and task writes (:mod:`ratchet.worker.writer`)."""


def row7(ctx: RowContext) -> str:
    """In the middle of a commit (``commit.before_commit`` of the transaction that records
    the charge's result, the first write transaction after its call): none of it is
    visible, everything before it is; the new holder finds the charge by lookup."""
    control = ctx.control_charge()
    rig = ctx.world("row7")
    rig.start_service()
    # The first write transaction once the charge's call returned: the one that records
    # its result, or a poll or lease renewal that came first (killed there, the result is
    # not recorded either: what is visible is the same).
    task_id = _killed_worker(rig, "commit.before_commit", skip=0, after="effect.after_call")
    timeline = rig.ledger.timeline(task_id)
    steps = sorted(s.name for s in timeline.steps)
    effects = {e.name: e.state for e in timeline.effects}
    expect(timeline.task.state is State.RUNNING and timeline.task.generation == 1,
           f"after the kill the task is {timeline.task.state.value}")
    expect(steps == ["prepare"] and effects == {"charge": EffectState.INTENT},
           f"half a commit is visible: steps {steps}, effects {effects}")
    expect(rig.executions() == {KEY: 1}, f"the service counted {rig.executions()}")
    finish_like_control(rig, task_id, control)
    expect(rig.ledger.timeline(task_id).effects[0].via_lookup,
           "the charge's result was not recovered by lookup")
    ctx.counts.update(rig.counts(task_id))
    return ("killed inside the commit of the charge's result: nothing of it visible; "
            "recovered by lookup, one execution")
