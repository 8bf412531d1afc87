"""The Ratchet app the crash-point tests run in real worker subprocesses.

Everything that must be counted is counted *outside* Ratchet:

* every execution of a step function appends one JSON line to the file named by
  ``CRASH_STEP_LOG`` (``{"task", "step", "pid", "generation", "attempt"}``) before it
  returns, so a step that ran but whose commit was lost still shows up;
* every charge goes over real HTTP to the counting service (:mod:`ratchet.testing`) at
  ``CRASH_PAY_URL``, which counts executions per key in its own SQLite file.

The charge task's ``target`` param picks the kind of target its effect assumes
(:data:`TARGETS`: lookup only, honours keys, checks fencing tokens, neither); the default
is the lookup-only charge every crash-matrix row uses.

The ledger comes from ``RATCHET_LEDGER_URL`` (the worker CLI's ``--ledger`` overrides it).
Leases are short (``CRASH_LEASE_S``, default 1 s) and retries fast, so a crash test spends
its time on recovery, not on waiting.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import ratchet
from ratchet import RetryPolicy, TaskContext
from ratchet.testing import CountingClient

__all__ = ["CHARGE", "HANG", "LEASE_S", "TARGETS", "app", "build_app", "charge_effect"]

CHARGE = "crash.charge"
HANG = "crash.hang"
LEASE_S = float(os.environ.get("CRASH_LEASE_S", "1.0"))
# No quarantine: these tests kill workers on purpose, so a task may lose several holders
# without being poison (quarantine has its own test, test_quarantine_crash.py).
FAST_RETRY = RetryPolicy(
    max_attempts=30, base_delay_s=0.05, max_delay_s=2.0, jitter=0.5, overload_min_delay_s=0.2,
    quarantine_after=None,
)
# How long a charge can stay in flight at the payment service (client timeout plus the
# service's processing bound), seconds; unset: the service answers at once (no slow faults).
IN_FLIGHT_S = (
    float(os.environ["CRASH_IN_FLIGHT_S"]) if os.environ.get("CRASH_IN_FLIGHT_S") else None
)

# Time limit of the hang task in this process (a definition setting: the worker's own
# app decides); unset: no limit.
TIME_LIMIT_S = (
    float(os.environ["CRASH_TIME_LIMIT_S"]) if os.environ.get("CRASH_TIME_LIMIT_S") else None
)

_client: Any = None


def payment_client() -> Any:
    """The counting-service client of this process (created on first use)."""
    global _client
    if _client is None:
        _client = CountingClient(os.environ["CRASH_PAY_URL"])
    return _client


def record_step(ctx: TaskContext, step: str) -> None:
    """Append one line to the external step log: this step function is executing."""
    path = os.environ.get("CRASH_STEP_LOG")
    if not path:
        return
    line = json.dumps(
        {
            "task": ctx.task_id,
            "step": step,
            "pid": os.getpid(),
            "generation": ctx.generation,
            "attempt": ctx.attempt,
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def build_app(ledger: str | None = None, lease_s: float | None = None) -> ratchet.App:
    """A fresh App with the crash tasks registered.

    Args:
        ledger: ledger URL (``None``: ``RATCHET_LEDGER_URL``).
        lease_s: lease of the tasks this app submits (default ``LEASE_S``); the lease is
            stored with each task at submit, so the submitter's value is the one used.
    """
    app = ratchet.App(ledger)

    @app.task(name=CHARGE, retry=FAST_RETRY, lease_s=lease_s or LEASE_S)
    def charge(
        ctx: TaskContext,
        order_id: str,
        amount_cents: int,
        slow_s: float = 0.0,
        work_s: float = 0.0,
        target: str = "lookup",
    ) -> dict[str, Any]:
        def prepare() -> dict[str, Any]:
            record_step(ctx, "prepare")
            if slow_s and ctx.attempt == 1:
                # Only the first attempt is slow: the test pauses that worker in here.
                time.sleep(slow_s)
            if work_s:
                time.sleep(work_s)
            return {"order_id": order_id, "amount_cents": amount_cents, "currency": "EUR"}

        quote = ctx.step("prepare", prepare)
        client = payment_client()
        key = f"charge:{order_id}"
        body = {"order_id": order_id, "amount_cents": amount_cents}
        receipt = charge_effect(ctx, client, target, key, body)

        def finalize() -> dict[str, Any]:
            record_step(ctx, "finalize")
            return {"order_id": order_id, "status": "paid"}

        # "prepare" is pipelined (it rides on the effect intent's transaction), "finalize"
        # waits for its own commit (durable=True): the crash matrix covers both kinds.
        final = ctx.step("finalize", finalize, durable=True)
        # Only deterministic parts: a crash-free control run must return exactly this.
        return {
            "quote": quote,
            "final": final,
            "charged_key": key,
            "charged": receipt_amount(receipt),
        }

    @app.task(name=HANG, retry=FAST_RETRY, lease_s=lease_s or LEASE_S,
              time_limit_s=TIME_LIMIT_S)
    def hang(
        ctx: TaskContext,
        order_id: str,
        amount_cents: int,
        hang_s: float = 25.0,
        where: str = "in_call",
    ) -> dict[str, Any]:
        """A charge whose first claim (generation 1) hangs in task code without a step
        boundary: inside the effect's call after the service executed it (``in_call``: the
        intent stays open) or after the effect (``after_effect``). Logs a ``hang`` step
        run when it starts hanging. In a process with a time limit every claim hangs: on a
        loaded machine the limit can end an attempt before it reaches the hang (its thread
        then comes back at once, not stuck), and the next attempt must hang in its place."""
        client = payment_client()
        key = f"charge:{order_id}"
        body = {"order_id": order_id, "amount_cents": amount_cents}
        stuck = ctx.generation == 1 or TIME_LIMIT_S is not None

        def hang_here() -> None:
            record_step(ctx, "hang")
            time.sleep(hang_s)

        def call(k: str) -> Any:
            record = client.execute(k, body)
            if stuck and where == "in_call":
                hang_here()
            return record

        receipt = ctx.effect("charge", call, key=key, lookup=client.lookup, params=body)
        if stuck and where == "after_effect":
            hang_here()
        return {"charged_key": key, "charged": receipt_amount(receipt)}

    return app


TARGETS = ("lookup", "idempotent", "fenced", "none")
"""The kinds of target the ``target`` param of a charge selects (DESIGN §5, README):

* ``"lookup"`` (the default): the target offers a lookup and does not dedupe
  (``lookup=``, not idempotent);
* ``"idempotent"``: the target honours the idempotency key (``idempotent=True``, no lookup);
* ``"fenced"``: the target checks a fencing token (``fenced=True``: call and lookup get
  ``ctx.fencing_token``; the service runs with ``--check-tokens``);
* ``"none"``: neither (no lookup, not idempotent): at-least-once, UNKNOWN when unsure.
"""


def charge_effect(
    ctx: TaskContext, client: Any, target: str, key: str, body: dict[str, Any]
) -> Any:
    """The charge as ``ctx.effect`` of the kind of target ``target`` (:data:`TARGETS`)."""
    if target == "fenced":
        return ctx.effect(
            "charge",
            lambda k, token: client.execute(k, body, token),
            key=key,
            lookup=client.lookup,
            fenced=True,
            params=body,
            in_flight_s=IN_FLIGHT_S,
        )
    if target not in TARGETS:
        raise ratchet.PermanentError(f"unknown target kind {target!r}; known: {TARGETS}")
    return ctx.effect(
        "charge",
        lambda k: client.execute(k, body),
        key=key,
        lookup=client.lookup if target == "lookup" else None,
        idempotent=target == "idempotent",
        params=body,
        in_flight_s=IN_FLIGHT_S,
    )


def receipt_amount(receipt: Any) -> Any:
    """The amount a receipt says was charged (the deterministic part of a receipt: the
    counting service's record is ``{"id", "key", "body", "created_at", ...}``)."""
    if isinstance(receipt, dict) and isinstance(receipt.get("body"), dict):
        return receipt["body"].get("amount_cents")
    return receipt


app = build_app()
if os.environ.get("CRASH_PAY_URL"):
    # Build the HTTP client at import, before the worker starts its clock-driven threads,
    # so the first task runs its whole pipeline in a few tens of milliseconds.
    payment_client()
