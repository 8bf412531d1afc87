"""App for the fast-takeover tests, run by real worker subprocesses.

``takeover.hold`` appends one line per execution (pid, generation, attempt) to the file
named by ``TAKEOVER_LOG`` — the external count — and then, on its first attempt only,
sleeps far longer than the test waits, so its worker is holding the lease when it is
killed. Leases are long (``TAKEOVER_LEASE_S``, default 60 s): a takeover within a couple
of seconds can only come from revocation, not from lease expiry.
"""

from __future__ import annotations

import json
import os
import time

import ratchet
from ratchet import RetryPolicy, TaskContext

LEASE_S = float(os.environ.get("TAKEOVER_LEASE_S", "60"))

app = ratchet.App()


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
        time.sleep(float(os.environ.get("TAKEOVER_HOLD_S", "120")))
    return {"n": n, "pid": os.getpid()}
