"""App for the versioned-definition tests (tests/test_versions.py), in-process and in real
worker subprocesses.

``ver.run`` is defined once per version in ``VERSIONS_APP_VERSIONS`` (e.g. ``"1"``, ``"2"``,
``"1,2"``). Each version's function returns ``{"version": N, "pid": ...}`` and appends one
line per execution to the file named by ``VERSIONS_LOG`` (the count kept outside the
ledger). With ``hold=True`` the first attempt waits until the file named by
``VERSIONS_GATE`` exists (at most 120 s), so its worker holds the lease until the test
kills it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ratchet
from ratchet import RetryPolicy, TaskContext

NAME = "ver.run"


def _body(version: int) -> Callable[..., dict[str, Any]]:
    def run(ctx: TaskContext, i: int, hold: bool = False) -> dict[str, Any]:
        log = os.environ.get("VERSIONS_LOG")
        if log:
            with open(log, "a") as out:
                out.write(json.dumps({"task": ctx.task_id, "version": version, "i": i,
                                      "pid": os.getpid(), "attempt": ctx.attempt}) + "\n")
        if hold and ctx.attempt == 1:
            gate = os.environ.get("VERSIONS_GATE")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (gate and Path(gate).exists()):
                time.sleep(0.02)
        return {"version": version, "pid": os.getpid()}

    run.__qualname__ = f"run_v{version}"
    return run


def make_app(ledger: str | None, versions: Sequence[int]) -> ratchet.App:
    """An App defining ``ver.run`` in each of ``versions``."""
    app = ratchet.App(ledger)
    for version in versions:
        app.task(name=NAME, version=version, lease_s=60.0,
                 retry=RetryPolicy(max_attempts=5, base_delay_s=0.01, max_delay_s=0.05))(
            _body(version))
    return app


app = make_app(None, [int(v) for v in os.environ.get("VERSIONS_APP_VERSIONS", "1").split(",")])
