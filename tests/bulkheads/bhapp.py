"""The Ratchet app of the bulkhead process tests (tests/bulkheads/): every task body
appends a ``start`` and an ``end`` line (one ``os.write`` each on an ``O_APPEND`` file, so
lines from many processes never interleave) to the file named by ``BH_LOG``, with the
wall clock (one host: one clock), pid, task id and generation. The test reads the file and
checks that the intervals of a limited type never overlap more than its limit.

Tasks: ``bh.limited``, ``bh.flood``, ``bh.critical``, each sleeping ``ms`` milliseconds.
The lease is ``BH_LEASE_S`` (default 2 s); the ledger comes from ``RATCHET_LEDGER_URL``.
"""

from __future__ import annotations

import json
import os
import time

import ratchet
from ratchet import RetryPolicy, TaskContext

LEASE_S = float(os.environ.get("BH_LEASE_S", "2.0"))
RETRY = RetryPolicy(max_attempts=20, base_delay_s=0.05, max_delay_s=0.5, jitter=0.5)

app = ratchet.App()


def record(kind: str, ctx: TaskContext, name: str) -> None:
    """Append one line to the interval log."""
    path = os.environ.get("BH_LOG")
    if not path:
        return
    line = json.dumps({"kind": kind, "name": name, "task": ctx.task_id, "pid": os.getpid(),
                       "generation": ctx.generation, "at": time.time()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def body(ctx: TaskContext, name: str, ms: int) -> int:
    record("start", ctx, name)
    time.sleep(ms / 1000)
    record("end", ctx, name)
    return ms


@app.task(name="bh.limited", retry=RETRY, lease_s=LEASE_S)
def limited(ctx: TaskContext, ms: int, i: int = 0) -> int:
    return body(ctx, "bh.limited", ms)


@app.task(name="bh.flood", retry=RETRY, lease_s=LEASE_S)
def flood(ctx: TaskContext, ms: int, i: int = 0) -> int:
    return body(ctx, "bh.flood", ms)


@app.task(name="bh.critical", retry=RETRY, lease_s=LEASE_S)
def critical(ctx: TaskContext, ms: int, i: int = 0) -> int:
    return body(ctx, "bh.critical", ms)
