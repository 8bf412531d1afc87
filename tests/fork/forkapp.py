"""A task of two versions whose params differ, for ``ratchet fork --app`` (loaded as
``forkapp:app`` by a CLI subprocess; the ledger comes from ``--ledger``)."""

from __future__ import annotations

from ratchet import App, PermanentError, RetryPolicy, TaskContext

TASK = "fork.priced"

app = App()


@app.task(name=TASK, version=1, retry=RetryPolicy(max_attempts=1))
def priced_v1(ctx: TaskContext, n: int) -> int:
    ctx.step("a", lambda: n)
    raise PermanentError("version 1 is broken")


@app.task(name=TASK, version=2, retry=RetryPolicy(max_attempts=1))
def priced_v2(ctx: TaskContext, n: int, currency: str) -> str:
    ctx.step("a", lambda: n)
    return currency
