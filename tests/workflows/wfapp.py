"""The Ratchet app the workflow crash tests run in real ``ratchet worker`` subprocesses.

Everything that must be counted is counted *outside* Ratchet:

* every external effect goes over real HTTP to the counting service
  (:mod:`ratchet.testing`) at ``WF_PAY_URL``, which counts executions per key in its own
  SQLite file (the tests start it with ``honour_keys=False``, so a second request with the
  same key executes again and is counted twice);
* every execution of a step function appends one JSON line to the file named by
  ``WF_STEP_LOG`` before it returns (``{"task", "step", "pid", "generation"}``).

Fault points under ``test.`` (``ratchet.faults``) sit in the task code at the places the
tests kill (``RATCHET_CRASH_AT``) or freeze (``RATCHET_PAUSE_AT``) a worker: right before a
durable sleep, right after it returns (the wake-up), before and after an event wait,
between child submissions.

The ledger comes from ``RATCHET_LEDGER_URL`` (the worker CLI's ``--ledger`` overrides it).
Leases are short (``WF_LEASE_S``, default 2 s) and retries fast.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ratchet
from ratchet import RetryPolicy, TaskContext, faults
from ratchet.testing import CountingClient

__all__ = [
    "CHILD",
    "PARENT",
    "RACER",
    "RACE_PARENT",
    "SAGA",
    "SAGA_STEPS",
    "SLEEPER",
    "WAITER",
    "app",
    "build_app",
]

SLEEPER = "wf.sleeper"
WAITER = "wf.waiter"
PARENT = "wf.parent"
CHILD = "wf.child"
RACE_PARENT = "wf.race_parent"
RACER = "wf.racer"
SAGA = "wf.saga"

SAGA_STEPS = ("book", "reserve", "charge")
"""The saga's effects, in the order they run (compensations run in the reverse order)."""

LEASE_S = float(os.environ.get("WF_LEASE_S", "2.0"))
# No quarantine: these tests kill workers on purpose, so a task may lose several holders
# without being poison.
FAST_RETRY = RetryPolicy(
    max_attempts=30, base_delay_s=0.05, max_delay_s=1.0, jitter=0.5, overload_min_delay_s=0.2,
    quarantine_after=None,
)

_client: CountingClient | None = None


def pay() -> CountingClient:
    """The counting-service client of this process (created on first use)."""
    global _client
    if _client is None:
        _client = CountingClient(os.environ["WF_PAY_URL"], timeout_s=5.0)
    return _client


def record_step(ctx: TaskContext, step: str) -> None:
    """Append one line to the external step log: this step function is executing."""
    path = os.environ.get("WF_STEP_LOG")
    if not path:
        return
    line = json.dumps(
        {"task": ctx.task_id, "step": step, "pid": os.getpid(), "generation": ctx.generation}
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def counted_effect(
    ctx: TaskContext, name: str, key: str, body: dict[str, Any], target: str = "lookup"
) -> Any:
    """One external effect counted at the service: lookup-only (the default; the service
    does not deduplicate, so only Ratchet's protocol keeps it once) or fenced (the
    service checks the fencing token, ``--check-tokens``)."""
    client = pay()
    if target == "fenced":
        return ctx.effect(
            name, lambda k, token: client.execute(k, body, token), key=key,
            lookup=client.lookup, fenced=True, params=body,
        )  # fmt: skip
    return ctx.effect(name, lambda k: client.execute(k, body), key=key, lookup=client.lookup,
                      params=body)


def build_app(ledger: str | None = None, lease_s: float | None = None) -> ratchet.App:
    """A fresh App with the workflow tasks registered.

    Args:
        ledger: ledger URL (``None``: ``RATCHET_LEDGER_URL``).
        lease_s: lease of the tasks this app submits (default ``LEASE_S``).
    """
    app = ratchet.App(ledger)
    lease = lease_s or LEASE_S

    # ------------------------------------------------------------------ durable sleep

    @app.task(name=SLEEPER, retry=FAST_RETRY, lease_s=lease)
    def sleeper(ctx: TaskContext, order: str, nap_s: float, target: str = "lookup") -> Any:
        """An effect, a durable sleep, an effect. Steps around each, logged outside."""

        def prepare() -> dict[str, Any]:
            record_step(ctx, "prepare")
            return {"order": order}

        ctx.step("prepare", prepare)
        before = counted_effect(ctx, "before", f"before:{order}", {"order": order}, target)
        faults.point("test.before_sleep")
        ctx.sleep("nap", nap_s)
        faults.point("test.after_wake")
        after = counted_effect(ctx, "after", f"after:{order}", {"order": order}, target)

        def finish() -> dict[str, Any]:
            record_step(ctx, "finish")
            return {"order": order, "done": True}

        final = ctx.step("finish", finish)
        return {"before": before["id"], "after": after["id"], "final": final}

    # ------------------------------------------------------------------ events

    @app.task(name=WAITER, retry=FAST_RETRY, lease_s=lease)
    def waiter(ctx: TaskContext, order: str, marks: str | None = None) -> Any:
        """Wait for the event ``shipped`` keyed ``order-<order>``, then one effect keyed on
        the payload's parcel (so a second delivery would be a second key or a second
        execution at the service). ``marks``: first write the mark ``<order>`` there and
        reach the wait at its time plus 0.5 s (a test sends the event, or kills the worker,
        at that instant)."""
        if marks is not None:
            mark = Path(marks) / order
            Path(marks).mkdir(parents=True, exist_ok=True)
            mark.write_text(str(os.getpid()))
            _until(mark.stat().st_mtime + 0.5)
        faults.point("test.before_wait")
        payload = ctx.wait_for_event("shipped", key=f"order-{order}", timeout_s=None)
        faults.point("test.after_event")
        parcel = str(payload["parcel"])
        receipt = counted_effect(ctx, "ship", f"ship:{parcel}", {"order": order,
                                                                 "parcel": parcel})
        return {"payload": payload, "receipt": receipt["id"]}

    # ------------------------------------------------------------------ children

    @app.task(name=CHILD, retry=FAST_RETRY, lease_s=lease)
    def child(ctx: TaskContext, i: int, work_s: float = 0.0) -> Any:
        if work_s:
            time.sleep(work_s)  # the child's work: kills land while children run
        return {"i": i, "v": 2 * i}

    @app.task(name=PARENT, retry=FAST_RETRY, lease_s=lease)
    def parent(
        ctx: TaskContext, tag: str, n: int, mode: str = "many", batch: int = 0,
        work_s: float = 0.0,
    ) -> Any:
        """Submit ``n`` children (``mode``: ``"many"``: ``ctx.submit_many`` in batches of
        ``batch`` (0: all at once), with the fault point ``test.after_batch`` after each
        batch and ``test.between_batches`` before every batch but the first; ``"loop"``:
        one ``ctx.submit`` per child, with ``test.mid_submit`` before the middle one),
        gather them, then the fan-in effect."""
        handles: list[Any] = []
        if mode == "loop":
            for i in range(n):
                if i == n // 2:
                    faults.point("test.mid_submit")
                handles.append(ctx.submit(CHILD, {"i": i, "work_s": work_s}))
        else:
            size = batch or n
            for start in range(0, n, size):
                if start:
                    faults.point("test.between_batches")
                chunk = [{"i": i, "work_s": work_s} for i in range(start, min(n, start + size))]
                handles.extend(ctx.submit_many(CHILD, chunk))
                # The batch is committed; the checkpoint of its ids is not durable yet.
                faults.point("test.after_batch")
        results = ctx.gather(handles)
        values = [r["v"] for r in results]
        fanin = counted_effect(ctx, "fanin", f"fanin:{tag}", {"tag": tag, "n": len(values)})
        return {"values": values, "fanin": fanin["id"]}

    # ------------------------------------------------------------------ the fan-in race

    @app.task(name=RACER, retry=FAST_RETRY, lease_s=lease)
    def racer(ctx: TaskContext, tag: str, i: int, of: int, marks: str) -> Any:
        """A child that finishes at the same instant as its siblings: it marks that it
        runs, waits until all ``of`` siblings run (each on its own worker), then returns
        at one common instant (the latest mark plus a margin)."""
        Path(marks).mkdir(parents=True, exist_ok=True)
        (Path(marks) / f"{tag}-{i}").write_text(str(os.getpid()))
        _until_common_instant(marks, tag, of)
        return {"i": i}

    @app.task(name=RACE_PARENT, retry=FAST_RETRY, lease_s=lease)
    def race_parent(
        ctx: TaskContext, tag: str, of: int, marks: str, sync_gather: bool = False
    ) -> Any:
        """Submit ``of`` racers and gather them. ``sync_gather``: first wait (in task code,
        holding its own worker) for the instant the racers return, so the parent's wait
        on its children commits while their completions do."""
        Path(marks).mkdir(parents=True, exist_ok=True)
        handles = ctx.submit_many(
            RACER, [{"tag": tag, "i": i, "of": of, "marks": marks} for i in range(of)]
        )
        if sync_gather:
            _until_common_instant(marks, tag, of)
        results = ctx.gather(handles)

        def fanin_step() -> list[int]:
            record_step(ctx, "fanin")
            return [r["i"] for r in results]

        got = ctx.step("fanin", fanin_step)
        fanin = counted_effect(ctx, "fanin", f"fanin:{tag}", {"tag": tag, "got": got})
        return {"got": got, "fanin": fanin["id"]}

    # ------------------------------------------------------------------ compensation

    @app.task(name=SAGA, retry=FAST_RETRY, lease_s=lease)
    def saga(ctx: TaskContext, order: str) -> Any:
        """Three effects, each with a compensation, then a permanent failure: the task
        ends FAILED, so its compensations run in reverse order (each counted at the
        service under ``compensate:<key>``), and it ends COMPENSATED."""
        client = pay()
        for step in SAGA_STEPS:
            body = {"order": order, "step": step}
            ctx.effect(
                step, _caller(client, body), key=f"{step}:{order}", lookup=client.lookup,
                params=body, compensate=_compensator(client, order, step),
                compensate_lookup=client.lookup,
            )  # fmt: skip
        raise ratchet.PermanentError(f"order {order} declined after {list(SAGA_STEPS)}")

    return app


def _until_common_instant(marks: str, tag: str, of: int) -> None:
    """Wait until ``of`` marks ``<tag>-*`` exist in ``marks``, then until the latest
    mark's time plus 0.3 s: every caller returns at that one instant."""
    directory = Path(marks)
    deadline = time.monotonic() + 20.0
    while True:
        mine = sorted(directory.glob(f"{tag}-*"))
        if len(mine) >= of:
            break
        if time.monotonic() > deadline:
            raise ratchet.PermanentError(f"the racers of {tag} never all ran: {mine}")
        time.sleep(0.002)
    _until(max(p.stat().st_mtime for p in mine) + 0.3)


def _until(instant: float) -> None:
    """Return at ``instant`` (epoch seconds): one sleep to just before it, then a short
    spin (so that several threads of one process waiting do not fight for the GIL)."""
    ahead = instant - time.time() - 0.003
    if ahead > 0:
        time.sleep(ahead)
    while time.time() < instant:
        time.sleep(0.0002)


def _caller(client: CountingClient, body: dict[str, Any]) -> Callable[[str], Any]:
    return lambda key: client.execute(key, body)


def _compensator(client: CountingClient, order: str, step: str) -> Callable[[str, Any], Any]:
    def compensate(key: str, result: Any) -> Any:
        faults.point("test.before_undo")
        record = client.execute(key, {"order": order, "undo": step, "of": result["id"]})
        faults.point("test.after_undo")  # executed at the service, result not recorded
        return record

    return compensate


app = build_app()
