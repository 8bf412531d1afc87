"""App for the operator-control tests, run by real worker subprocesses.

``control.loop`` makes ``n`` steps of ``CONTROL_STEP_S`` seconds each (default 0.05),
appending one line per step it runs to the file named by ``CONTROL_LOG`` (the count kept
outside the ledger), so a test sees the body running and can stop it (cancel, pause,
SIGKILL) in the middle.
"""

from __future__ import annotations

import os
import time

import ratchet
from ratchet import RetryPolicy, TaskContext

LEASE_S = float(os.environ.get("CONTROL_LEASE_S", "2"))
STEP_S = float(os.environ.get("CONTROL_STEP_S", "0.05"))

app = ratchet.App()


def _log(line: str) -> None:
    path = os.environ.get("CONTROL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


@app.task(name="control.loop", lease_s=LEASE_S,
          retry=RetryPolicy(max_attempts=5, base_delay_s=0.01, max_delay_s=0.05))
def loop(ctx: TaskContext, n: int) -> int:
    def one(i: int) -> int:
        _log(f"{ctx.task_id} {os.getpid()} {ctx.generation} {i}")
        time.sleep(STEP_S)
        return i

    return sum(ctx.step("tick", one, i) for i in range(n))
