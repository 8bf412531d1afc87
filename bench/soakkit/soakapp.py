"""The app the soak's ``ratchet worker`` subprocesses run (``soakkit.soakapp:app``).

One task type, ``soak.charge(n, target, work_s)``: a pipelined step, one charge at the
counting service of its kind of target, optionally one outbox message (when
``TaskContext.emit`` exists and ``SOAK_EMIT=1``), and a durable final step. The three
kinds of target (DESIGN §5; tests/crash/crashapp.py ``TARGETS``):

* ``idempotent``: the service honours the idempotency key (``idempotent=True``);
* ``fenced``: the service checks fencing tokens (``fenced=True``, lookup with the token);
* ``lookup``: the service has a lookup and does not dedupe (``lookup=``): a frozen or
  partitioned holder's late request may execute a second time, recorded as a late effect.

Environment: ``SOAK_URL_<TARGET>`` (the service of each kind, as seen from the worker's
namespace), ``SOAK_LEASE_S`` (lease of the tasks, seconds), ``SOAK_EMIT``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ratchet
from ratchet import RetryPolicy, TaskContext
from ratchet.testing import CountingClient

__all__ = ["CHARGE", "KINDS", "TOPIC", "app", "build_app", "key_of", "message_key_of"]

CHARGE = "soak.charge"
KINDS = ("idempotent", "fenced", "lookup")
TOPIC = "soak.charged"
LEASE_S = float(os.environ.get("SOAK_LEASE_S", "2.0"))
EMIT = os.environ.get("SOAK_EMIT") == "1" and hasattr(TaskContext, "emit")
ORDER_KEYS = 64
"""Outbox messages carry one of this many keys (order is checked per key)."""

# Workers are killed, stopped and cut off on purpose: a task may lose many holders.
RETRY = RetryPolicy(max_attempts=200, base_delay_s=0.05, max_delay_s=1.0, jitter=0.5,
                    overload_min_delay_s=0.2, quarantine_after=None)

_clients: dict[str, CountingClient] = {}


def key_of(n: int, target: str) -> str:
    """The charge's idempotency key of task number ``n``."""
    return f"soak:{target}:{n}"


def message_key_of(n: int) -> str:
    """The outbox ordering key of task number ``n``."""
    return f"k{n % ORDER_KEYS}"


def _client(target: str) -> CountingClient:
    client = _clients.get(target)
    if client is None:
        client = _clients[target] = CountingClient(os.environ[f"SOAK_URL_{target.upper()}"])
    return client


def _charge(ctx: TaskContext, target: str, key: str, body: dict[str, Any]) -> Any:
    client = _client(target)
    if target == "fenced":
        return ctx.effect("charge", lambda k, token: client.execute(k, body, token), key=key,
                          lookup=client.lookup, fenced=True, params=body)
    if target == "idempotent":
        return ctx.effect("charge", lambda k: client.execute(k, body), key=key,
                          idempotent=True, params=body)
    if target == "lookup":
        return ctx.effect("charge", lambda k: client.execute(k, body), key=key,
                          lookup=client.lookup, params=body)
    raise ratchet.PermanentError(f"unknown target kind {target!r}; known: {KINDS}")


def build_app(ledger: str | None = None) -> ratchet.App:
    """A fresh App with ``soak.charge`` registered (ledger: ``RATCHET_LEDGER_URL``)."""
    app = ratchet.App(ledger)

    @app.task(name=CHARGE, retry=RETRY, lease_s=LEASE_S)
    def charge(ctx: TaskContext, n: int, target: str, work_s: float = 0.0) -> dict[str, Any]:
        quote = ctx.step("prepare", lambda: {"n": n, "amount_cents": 100 + n % 900})
        if work_s:
            time.sleep(work_s)
        key = key_of(n, target)
        receipt = _charge(ctx, target, key, {"n": n, "amount_cents": quote["amount_cents"]})
        if EMIT:
            ctx.emit(TOPIC, {"n": n, "key": key}, key=message_key_of(n))
        ctx.step("finalize", lambda: {"n": n}, durable=True)
        return {"n": n, "key": key, "id": receipt.get("id") if isinstance(receipt, dict) else None}

    return app


app = build_app()
if os.environ.get("SOAK_URL_LOOKUP"):
    for _target in KINDS:  # build the HTTP clients before the worker's threads start
        _client(_target)
