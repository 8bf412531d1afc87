"""The demo's Ratchet app: charge an order on a payment service, one task per kind of target.

Three steps per task::

    quote   = ctx.step("quote", ...)       # amount + fee, deterministic, committed once
    charge  = ctx.effect("charge", ...)    # POST /charges, key "charge:<order_id>"
    receipt = ctx.step("receipt", ...)     # the task's result

The four tasks differ only in what the charge's target offers against a duplicate (see
:data:`TASKS` and :data:`GUARANTEES`):

* ``billing.charge`` — the service honours the idempotency key: ``idempotent=True`` (plus
  a lookup first after an unknown outcome). Exactly once.
* ``billing.charge_fenced`` — the service checks a fencing token: ``fenced=True``, so the
  call and the lookup get ``ctx.fencing_token`` and a frozen holder's late request is
  refused (``ratchet.TokenRejected``). Exactly once.
* ``billing.charge_lookup`` — the service only answers lookups: ``lookup=`` with
  ``in_flight_s``. Exactly once unless a sender was frozen past its lease; then the
  duplicate is recorded as a late effect (``ratchet late-effects``), never silent.
* ``billing.charge_neither`` — no dedupe, no lookup: an unknown outcome goes to ``UNKNOWN``
  for a person (never re-sent blindly); at-least-once if they resolve it "not-done".

Environment (read by every worker process):

* ``RATCHET_LEDGER_URL`` — the ledger (``ratchet.App()`` default);
* ``RATCHET_DEMO_PAYMENTS_URL_<KIND>`` (``IDEMPOTENT``, ``FENCED``, ``LOOKUP``,
  ``NEITHER``) — base URL of that kind's :mod:`ratchet.demo.payments` service, else
  ``RATCHET_DEMO_PAYMENTS_URL`` (one service for every kind);
* ``RATCHET_DEMO_LEASE_S`` — lease length of the tasks in seconds (default 3.0), read at
  import time; the submitting process must see the same value, because the lease length
  is stored with each task when it is submitted;
* ``RATCHET_DEMO_IN_FLIGHT_S`` — ``in_flight_s`` of the lookup-only charge, seconds
  (default 4.0): how long a charge can stay in flight at the service (client timeout plus
  the service's slowest processing).

Run a worker with ``ratchet worker ratchet.demo.billing:app``.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import App, ConfigError, RetryPolicy, TaskContext
from .payments import KINDS, PaymentClient
from .settings import GUARANTEES, TASKS

__all__ = [
    "CLIENT_TIMEOUT_S",
    "FEE_FIXED_CENTS",
    "FEE_RATE",
    "GUARANTEES",
    "KINDS",
    "RETRY",
    "TASKS",
    "app",
    "charge",
    "charge_fenced",
    "charge_lookup",
    "charge_neither",
    "in_flight_s_from_env",
    "lease_s_from_env",
    "lookup_charge",
    "lookup_charge_fenced",
    "lookup_charge_lookup",
    "lookup_charge_neither",
    "payment_client",
    "quote",
    "seconds_from_env",
]

CLIENT_TIMEOUT_S = 1.0
"""Read timeout of the payment client, seconds: a slower reply is an unknown outcome."""

FEE_RATE = 0.029
"""Proportional processing fee (2.9 %)."""

FEE_FIXED_CENTS = 30
"""Fixed processing fee per charge, cents."""

RETRY = RetryPolicy(max_attempts=20, base_delay_s=0.05, max_delay_s=1.0, overload_min_delay_s=0.2,
                    quarantine_after=10)
"""Retry policy of every demo task: fast backoff, a 0.2 s floor after a 503; quarantine only
after 10 identical failures or lost workers (the demo SIGKILLs workers on purpose, so one
task can lose several holders without being poison)."""

def seconds_from_env(name: str, default: float) -> float:
    """The environment variable ``name`` as seconds (``default`` when unset or blank).

    Raises:
        ConfigError: the value is not a positive number.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be seconds, got {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{name} must be > 0 seconds")
    return value


def lease_s_from_env(default: float = 3.0) -> float:
    """``RATCHET_DEMO_LEASE_S`` in seconds (``default`` when unset).

    Raises:
        ConfigError: the value is not a positive number.
    """
    return seconds_from_env("RATCHET_DEMO_LEASE_S", default)


def in_flight_s_from_env(default: float = 4.0) -> float:
    """``RATCHET_DEMO_IN_FLIGHT_S`` in seconds (``default`` when unset): the lookup-only
    charge's ``in_flight_s``.

    Raises:
        ConfigError: the value is not a positive number.
    """
    return seconds_from_env("RATCHET_DEMO_IN_FLIGHT_S", default)


app = App()
"""The demo app; its ledger comes from ``RATCHET_LEDGER_URL`` (or ``App.configure``)."""

_clients: dict[str, PaymentClient] = {}
_client_lock = threading.Lock()


def payment_client(kind: str = "idempotent") -> PaymentClient:
    """This process's client of ``kind``'s payment service, created on first use (httpx
    clients are thread-safe). The URL is ``RATCHET_DEMO_PAYMENTS_URL_<KIND>``, else
    ``RATCHET_DEMO_PAYMENTS_URL``.

    Raises:
        ConfigError: neither variable is set, or ``kind`` is not one of :data:`KINDS`.
    """
    client = _clients.get(kind)
    if client is not None:
        return client
    if kind not in KINDS:
        raise ConfigError(f"unknown payment target kind {kind!r}; known: {', '.join(KINDS)}")
    with _client_lock:
        client = _clients.get(kind)
        if client is None:
            var = f"RATCHET_DEMO_PAYMENTS_URL_{kind.upper()}"
            url = os.environ.get(var) or os.environ.get("RATCHET_DEMO_PAYMENTS_URL")
            if not url:
                raise ConfigError(
                    f"neither {var} nor RATCHET_DEMO_PAYMENTS_URL is set; start the payment "
                    "service (python -m ratchet.demo.payments) and export its URL"
                )
            client = _clients[kind] = PaymentClient(url, timeout_s=CLIENT_TIMEOUT_S)
    return client


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


def _charge(ctx: TaskContext, kind: str, order_id: str, amount_cents: int) -> dict[str, Any]:
    """The body of every demo task: quote, charge (as ``kind`` requires), receipt."""
    quoted = ctx.step("quote", quote, order_id, amount_cents)
    total = int(quoted["total_cents"])
    client = payment_client(kind)
    key = f"charge:{order_id}"
    params = {"order_id": order_id, "amount_cents": total}
    charged: dict[str, Any]
    if kind == "idempotent":
        charged = ctx.effect(
            "charge", lambda k: client.charge(k, order_id, total), key=key,
            lookup=client.lookup, idempotent=True, params=params,
        )  # fmt: skip
    elif kind == "fenced":
        charged = ctx.effect(
            "charge", lambda k, token: client.charge(k, order_id, total, token=token),
            key=key, lookup=client.lookup, fenced=True, params=params,
        )  # fmt: skip
    elif kind == "lookup":
        charged = ctx.effect(
            "charge", lambda k: client.charge(k, order_id, total), key=key,
            lookup=client.lookup, in_flight_s=IN_FLIGHT_S, params=params,
        )  # fmt: skip
    else:
        charged = ctx.effect(
            "charge", lambda k: client.charge(k, order_id, total), key=key, params=params
        )
    receipt: dict[str, Any] = ctx.step("receipt", _receipt, order_id, quoted, charged)
    return receipt


IN_FLIGHT_S = in_flight_s_from_env()
"""``in_flight_s`` of the lookup-only charge, seconds (``RATCHET_DEMO_IN_FLIGHT_S``)."""

_LEASE_S = lease_s_from_env()


@app.task(name=TASKS["idempotent"], version=1, retry=RETRY, lease_s=_LEASE_S)
def charge(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge one order on the service that honours idempotency keys: exactly once,
    however often the task is retried, taken over, killed or frozen.

    Args:
        ctx: the task context.
        order_id: the business id; the charge's idempotency key is ``charge:<order_id>``.
        amount_cents: order amount before fees, cents.

    Returns:
        The receipt: ``{"order_id", "charge_id", "charge_key", "total_cents", "receipt_no"}``.
    """
    return _charge(ctx, "idempotent", order_id, amount_cents)


@app.task(name=TASKS["fenced"], version=1, retry=RETRY, lease_s=_LEASE_S)
def charge_fenced(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge one order on the service that checks fencing tokens (``fenced=True``):
    exactly once; a frozen holder's late charge is refused by the service. Same arguments
    and receipt as :func:`charge`."""
    return _charge(ctx, "fenced", order_id, amount_cents)


@app.task(name=TASKS["lookup"], version=1, retry=RETRY, lease_s=_LEASE_S)
def charge_lookup(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge one order on the service that only answers lookups: exactly once unless a
    holder froze past its lease between its lease check and its send; that late charge is
    a duplicate recorded as a late effect. Same arguments and receipt as :func:`charge`."""
    return _charge(ctx, "lookup", order_id, amount_cents)


@app.task(name=TASKS["neither"], version=1, retry=RETRY, lease_s=_LEASE_S)
def charge_neither(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge one order on a service with neither key dedupe nor a lookup: a charge whose
    outcome is unknown is never sent again; the task goes to ``UNKNOWN`` for a person
    (``ratchet resolve``). Same arguments and receipt as :func:`charge`."""
    return _charge(ctx, "neither", order_id, amount_cents)


# Lookups registered by task type (App.lookup), for `ratchet reconcile` (DESIGN §5.1): the
# first three tasks pass their lookup to ctx.effect anyway; `billing.charge_neither`'s is
# for reconciliation only (worker=False), so that task still goes UNKNOWN rather than ask.
@app.lookup(TASKS["idempotent"], "charge")
def lookup_charge(key: str) -> Any:
    """The idempotent service's charge for ``key``, or ``NOT_FOUND``."""
    return payment_client("idempotent").lookup(key)


@app.lookup(TASKS["fenced"], "charge", fenced=True)
def lookup_charge_fenced(key: str, token: int) -> Any:
    """The fenced service's charge for ``key`` (``token`` recorded first), or ``NOT_FOUND``."""
    return payment_client("fenced").lookup(key, token)


@app.lookup(TASKS["lookup"], "charge", in_flight_s=IN_FLIGHT_S)
def lookup_charge_lookup(key: str) -> Any:
    """The lookup-only service's charge for ``key``, or ``NOT_FOUND``."""
    return payment_client("lookup").lookup(key)


@app.lookup(TASKS["neither"], "charge", worker=False)
def lookup_charge_neither(key: str) -> Any:
    """The charge for ``key`` at the service the ``neither`` task never asks (its worker
    leaves an unknown outcome to a person; ``ratchet reconcile`` may ask), or
    ``NOT_FOUND``."""
    return payment_client("neither").lookup(key)
