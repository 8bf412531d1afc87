"""The demo's Ratchet app: ``billing.charge`` charges an order on the payment service.

Three steps per task::

    quote   = ctx.step("quote", ...)       # amount + fee, deterministic, committed once
    charge  = ctx.effect("charge", ...)    # POST /charges, key "charge:<order_id>",
                                           # lookup-first on an unknown outcome
    receipt = ctx.step("receipt", ...)     # the task's result

Environment (read by every worker process):

* ``RATCHET_LEDGER_URL`` — the ledger (``ratchet.App()`` default);
* ``RATCHET_DEMO_PAYMENTS_URL`` — base URL of :mod:`ratchet.demo.payments`;
* ``RATCHET_DEMO_LEASE_S`` — lease length of ``billing.charge`` in seconds (default 3.0),
  read at import time; the submitting process must see the same value, because the lease
  length is stored with each task when it is submitted.

Run a worker with ``ratchet worker ratchet.demo.billing:app``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..app import App
from ..errors import ConfigError
from ..retry import RetryPolicy
from ..worker.context import TaskContext
from .payments import PaymentClient

__all__ = [
    "CLIENT_TIMEOUT_S",
    "FEE_FIXED_CENTS",
    "FEE_RATE",
    "RETRY",
    "app",
    "charge",
    "lease_s_from_env",
    "payment_client",
    "quote",
]

CLIENT_TIMEOUT_S = 1.0
"""Read timeout of the payment client, seconds: a slower reply is an unknown outcome."""

FEE_RATE = 0.029
"""Proportional processing fee (2.9 %)."""

FEE_FIXED_CENTS = 30
"""Fixed processing fee per charge, cents."""

RETRY = RetryPolicy(max_attempts=20, base_delay_s=0.05, max_delay_s=1.0, overload_min_delay_s=0.2)
"""Retry policy of ``billing.charge``: fast backoff, a 0.2 s floor after a 503."""


def lease_s_from_env(default: float = 3.0) -> float:
    """``RATCHET_DEMO_LEASE_S`` in seconds (``default`` when unset).

    Raises:
        ConfigError: the value is not a positive number.
    """
    raw = os.environ.get("RATCHET_DEMO_LEASE_S")
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"RATCHET_DEMO_LEASE_S must be seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError("RATCHET_DEMO_LEASE_S must be > 0 seconds")
    return value


app = App()
"""The demo app; its ledger comes from ``RATCHET_LEDGER_URL`` (or ``App.configure``)."""

_client: PaymentClient | None = None
_client_lock = threading.Lock()


def payment_client() -> PaymentClient:
    """This process's payment client, created on first use (httpx clients are thread-safe).

    Raises:
        ConfigError: ``RATCHET_DEMO_PAYMENTS_URL`` is not set.
    """
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                url = os.environ.get("RATCHET_DEMO_PAYMENTS_URL")
                if not url:
                    raise ConfigError(
                        "RATCHET_DEMO_PAYMENTS_URL is not set; start the payment service "
                        "(python -m ratchet.demo.payments) and export its URL"
                    )
                _client = PaymentClient(url, timeout_s=CLIENT_TIMEOUT_S)
    return _client


def quote(order_id: str, amount_cents: int) -> dict[str, Any]:
    """The price to charge: amount plus fee (2.9 % + 30 ¢, rounded half up), in cents."""
    fee = (amount_cents * 29 + 500) // 1000 + FEE_FIXED_CENTS
    return {
        "order_id": order_id,
        "amount_cents": amount_cents,
        "fee_cents": fee,
        "total_cents": amount_cents + fee,
    }


def _receipt(order_id: str, quoted: dict[str, Any], charged: dict[str, Any]) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "charge_id": charged["charge_id"],
        "charge_key": charged["key"],
        "total_cents": quoted["total_cents"],
        "receipt_no": f"R-{order_id}",
    }


@app.task(name="billing.charge", version=1, retry=RETRY, lease_s=lease_s_from_env())
def charge(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge one order once, however often the task is retried, taken over or killed.

    Args:
        ctx: the task context.
        order_id: the business id; the charge's idempotency key is ``charge:<order_id>``.
        amount_cents: order amount before fees, cents.

    Returns:
        The receipt: ``{"order_id", "charge_id", "charge_key", "total_cents", "receipt_no"}``.
    """
    quoted = ctx.step("quote", quote, order_id, amount_cents)
    total = int(quoted["total_cents"])
    client = payment_client()
    charged = ctx.effect(
        "charge",
        lambda key: client.charge(key, order_id, total),
        key=f"charge:{order_id}",
        lookup=client.lookup,
        idempotent=True,
        params={"order_id": order_id, "amount_cents": total},
    )
    receipt: dict[str, Any] = ctx.step("receipt", _receipt, order_id, quoted, charged)
    return receipt
