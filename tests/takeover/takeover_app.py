"""App for the fast-takeover tests, run by real worker subprocesses.

``takeover.hold`` appends one line per execution (task, pid, generation, attempt) to the
file named by ``TAKEOVER_LOG`` — the count kept outside the ledger — and then, on its
first attempt only, waits until the file named by ``TAKEOVER_GATE`` exists (at most
``TAKEOVER_HOLD_S`` seconds, default 120), so its worker holds the lease for as long as the
test needs, without any timing assumption. Leases are long (``TAKEOVER_LEASE_S``, default
60 s): a takeover before that can only come from revocation, not from lease expiry.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import ratchet
from ratchet import RetryPolicy, TaskContext
from ratchet.testing import ConditionTimeout, wait_for

LEASE_S = float(os.environ.get("TAKEOVER_LEASE_S", "60"))

app = ratchet.App()


def _wait_for_gate() -> None:
    """Hold until the test opens the gate file, at most TAKEOVER_HOLD_S seconds (then go on)."""
    gate = os.environ.get("TAKEOVER_GATE")
    with contextlib.suppress(ConditionTimeout):
        wait_for("the test to open the gate", lambda: bool(gate and Path(gate).exists()),
                 timeout_s=float(os.environ.get("TAKEOVER_HOLD_S", "120")), interval_s=0.02)


@app.task(
    name="takeover.hold",
    lease_s=LEASE_S,
    retry=RetryPolicy(max_attempts=5, base_delay_s=0.01, max_delay_s=0.05),
)
def hold(ctx: TaskContext, n: int) -> dict[str, int]:
    with open(os.environ["TAKEOVER_LOG"], "a", encoding="utf-8") as out:
        out.write(json.dumps({"task": ctx.task_id, "pid": os.getpid(),
                              "generation": ctx.generation, "attempt": ctx.attempt}) + "\n")
        out.flush()
        os.fsync(out.fileno())
    if ctx.attempt == 1:
        _wait_for_gate()
        ctx.step("after-gate", lambda: os.getpid())
    return {"n": n, "pid": os.getpid()}
