"""The app of tests/crash/test_quarantine_crash.py: a task whose worker dies every time.

``poison.hang`` posts one execution per run to the counting service at ``POISON_PAY_URL``
(key ``run:<task id>``; the service is started with ``--no-honour-keys``, so every run is
counted), then hangs until its worker is SIGKILLed — unless the file ``POISON_HEAL_FILE``
exists, then it returns. ``poison.marker`` returns at once. Leases are 1 s, retries fast,
and three dead deliveries quarantine a task.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ratchet import App, RetryPolicy, TaskContext
from ratchet.testing import CountingClient

__all__ = ["app"]

app = App()
POLICY = RetryPolicy(max_attempts=10, base_delay_s=0.05, max_delay_s=0.2, quarantine_after=3)
_client: Any = None


@app.task(name="poison.hang", retry=POLICY, lease_s=1.0)
def hang(ctx: TaskContext) -> str:
    global _client
    if _client is None:
        _client = CountingClient(os.environ["POISON_PAY_URL"])
    _client.execute(f"run:{ctx.task_id}", {"generation": ctx.generation})
    while not Path(os.environ["POISON_HEAL_FILE"]).exists():
        time.sleep(0.05)  # until SIGKILL
    return "healed"


@app.task(name="poison.marker", retry=POLICY, lease_s=1.0)
def marker(ctx: TaskContext) -> str:
    return "done"
