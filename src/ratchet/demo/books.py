"""The demo's sharded job: reconcile the books of yesterday's orders, in batches, over a
fixed shard space, while workers are killed.

One task, ``books.reconcile`` (:data:`RECONCILE_TASK`), registered on the billing app
(:data:`app` is :data:`ratchet.demo.billing.app`, so the demo's workers run it too). The
demo submits it once per run with ``App.submit_sharded(..., shards=4)``: the parent fans
out one task per shard, and each shard walks the orders it owns (``ctx.shard.owns(order
id)``) with ``ctx.batches``::

    mine = [o for o in day_orders(day, count) if ctx.shard.owns(o[0])]
    return ctx.batches("orders", mine, check, size=BATCH_SIZE)

``check`` compares each order of the batch with the bank's statement line: a refunded
order is *skipped*, an order whose amount the bank settled differently *failed* (a
mismatch for a person), the rest *succeeded*; it returns ``ratchet.BatchCounts``. Each
batch takes :data:`BATCH_PAUSE_S` (the bank's statement API, say), so the job runs through
the demo's chaos: a worker killed in the middle of a shard loses that shard's lease, a
peer takes it over, and its ``ctx.batches`` resumes from the watermark; the batches it
had committed are not counted again, the one in flight is.

Which orders are refunded or mismatched is a pure function of the order id
(:func:`day_orders`), so the run knows the expected counts before the job starts, and the
report compares them with the job's totals and with ``Control.check`` (conservation per
shard and for the job, from the ledger's own counts).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from .. import BatchCounts, Control, PermanentError, State, TaskContext
from .billing import RETRY, app, lease_s_from_env

__all__ = [
    "BATCH_PAUSE_S",
    "BATCH_SIZE",
    "RECONCILE_TASK",
    "BooksResult",
    "app",
    "day_orders",
    "expected_counts",
    "judge_books",
    "reconcile",
]

RECONCILE_TASK = "books.reconcile"
"""The sharded job's task name."""

BATCH_SIZE = 50
"""Orders per batch."""

BATCH_PAUSE_S = 0.3
"""What one batch takes (the bank's statement lines for 50 orders), seconds: with the
demo's 4,000 orders over 4 shards, each shard runs about 6 s."""

REFUNDED_EVERY = 23
"""About one order in this many was refunded: skipped."""

MISMATCH_EVERY = 97
"""About one order in this many was settled for another amount: failed."""


def _draw(order_id: str) -> int:
    return int.from_bytes(hashlib.sha256(order_id.encode()).digest()[:8], "big")


def day_orders(day: str, count: int) -> list[tuple[str, int, str]]:
    """The ``count`` orders of ``day``: ``(order id, amount in cents, status)``, status
    ``"ok"``, ``"refunded"`` or ``"mismatch"``; a pure function of the arguments."""
    out: list[tuple[str, int, str]] = []
    for i in range(count):
        order_id = f"{day}-{i:05d}"
        draw = _draw(order_id)
        status = ("refunded" if draw % REFUNDED_EVERY == 0
                  else "mismatch" if draw % MISMATCH_EVERY == 1 else "ok")
        out.append((order_id, 500 + draw % 49_500, status))
    return out


def expected_counts(day: str, count: int) -> dict[str, int]:
    """What a correct job reports: ``items``, ``succeeded``, ``failed``, ``skipped``."""
    statuses = [s for _, _, s in day_orders(day, count)]
    skipped, failed = statuses.count("refunded"), statuses.count("mismatch")
    return {"items": count, "succeeded": count - skipped - failed, "failed": failed,
            "skipped": skipped}


def _check(batch: list[tuple[str, int, str]], position: int) -> BatchCounts | None:
    """One batch against the bank's statement: refunded orders skipped, mismatches failed."""
    time.sleep(BATCH_PAUSE_S)
    skipped = sum(1 for _, _, status in batch if status == "refunded")
    failed = sum(1 for _, _, status in batch if status == "mismatch")
    return BatchCounts(failed=failed, skipped=skipped) if failed or skipped else None


@app.task(name=RECONCILE_TASK, version=1, retry=RETRY, lease_s=lease_s_from_env())
def reconcile(ctx: TaskContext, day: str, count: int) -> dict[str, Any]:
    """One shard of the reconciliation of ``day``'s ``count`` orders (see the module
    docstring): the orders it owns, in batches of :data:`BATCH_SIZE`.

    Raises:
        PermanentError: submitted on its own, not with ``App.submit_sharded``.
    """
    shard = ctx.shard
    if shard is None:
        raise PermanentError(f"{RECONCILE_TASK} runs as a sharded job (App.submit_sharded)")
    mine = [o for o in day_orders(day, count) if shard.owns(o[0])]
    return ctx.batches("orders", mine, _check, size=BATCH_SIZE)


@dataclass
class BooksResult:
    """The sharded job as the report shows it.

    Attributes:
        job_id: the parent task; state: its state.
        shards: the shard count; expected: :func:`expected_counts`.
        totals: the totals the job returned (``{}`` unless it succeeded).
        ledger: items succeeded / failed / skipped / in flight summed over the shards'
            committed batches (the job line of ``Control.check``).
        check_ok: ``Control.check`` found every line adding up; notes: why not.
        attempts: the claims of each shard (more than one: it was taken over or retried,
            and resumed from its watermark).
        batches: batches committed over every shard.
    """

    job_id: str
    state: str
    shards: int
    expected: dict[str, int]
    totals: dict[str, int] = field(default_factory=dict)
    ledger: dict[str, int | None] = field(default_factory=dict)
    check_ok: bool = False
    notes: list[str] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    batches: int = 0

    @property
    def problems(self) -> list[str]:
        """What is wrong with the job (empty: it succeeded and its totals are conserved)."""
        found = list(self.notes)
        if self.state != State.SUCCEEDED.value:
            found.append(f"the job ended {self.state}")
        if not self.check_ok:
            found.append("Control.check: the counts do not add up")
        for key, want in self.expected.items():
            if self.totals.get(key) != want:
                found.append(f"{key}: the job reported {self.totals.get(key)}, "
                             f"expected {want}")
        return found


def judge_books(control: Control, job_id: str, day: str, count: int,
                shards: int) -> BooksResult:
    """Read the finished job through ``control``: its state and totals, the conservation
    check (``Control.check``), each shard's attempts and batches."""
    info = control.get(job_id)
    result = BooksResult(job_id, str(info.state.value if isinstance(info.state, State)
                                     else info.state), shards, expected_counts(day, count))
    if info.state is State.SUCCEEDED and isinstance(info.result, dict):
        result.totals = {k: int(v) for k, v in (info.result.get("totals") or {}).items()}
    report = control.check(job_id)
    result.check_ok = report.ok
    result.notes = [f"{x.scope}: {x.note}" for x in report.lines if not x.ok and x.note]
    job = next((x for x in report.lines if x.scope == "job"), None)
    if job is not None:
        result.ledger = {"succeeded": job.succeeded, "failed": job.failed,
                         "skipped": job.skipped, "in_flight": job.in_flight}
    shard_ids = sorted({x.task_id for x in report.lines if x.scope != "job"})
    result.attempts = [sum(1 for e in control.history(t).events if e.kind == "claim")
                       for t in shard_ids]
    result.batches = sum(p.batches for p in control.batch_progress_many(shard_ids))
    return result

