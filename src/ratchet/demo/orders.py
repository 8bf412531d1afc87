"""The demo's order workflow: reserve stock, charge, wait for the warehouse to ship the
order; when it does not ship in time, undo the charge and the reservation.

One task, ``order.fulfil`` (:data:`~ratchet.demo.settings.ORDER_TASK`), registered on the
billing app (:data:`app` is :data:`ratchet.demo.billing.app`, so one worker runs both)::

    reserved = ctx.effect("reserve", ..., compensate=release)  # warehouse, reserve:<order>
    charged  = ctx.effect("charge", ..., compensate=refund)    # payments, charge:<order>
    shipped  = ctx.wait_for_event("shipped", key=order_id, timeout_s=SHIP_TIMEOUT_S)
    return ctx.step("confirmation", ...)

While it waits the task is ``WAITING``: no lease, no worker slot; the warehouse
(:mod:`ratchet.demo.warehouse`) sends ``shipped`` for most orders a few seconds after the
reservation, and never for some. When the wait times out (``ratchet.EventTimeout``) the
task raises :class:`NotShipped`, a permanent error: it fails, and its completed effects'
compensations run in reverse order — the refund (``compensate:charge:<order>`` at the
payment service), then the release (``compensate:reserve:<order>`` at the warehouse),
each an effect with its own idempotency key and lookup — and it ends ``COMPENSATED``.
Both services honour idempotency keys and answer lookups, so every reservation, charge,
refund and release executes at most once however often a worker is killed.

Environment (read by every worker process, besides :mod:`ratchet.demo.billing`'s):

* ``RATCHET_DEMO_WAREHOUSE_URL`` — base URL of the warehouse;
* ``RATCHET_DEMO_ORDER_PAYMENTS_URL`` — base URL of the order workflow's payment service
  (a :mod:`ratchet.demo.payments` service of its own);
* ``RATCHET_DEMO_SHIP_TIMEOUT_S`` — how long an order waits for ``shipped``, seconds
  (default 6.0), read at import time.

Run a worker with ``ratchet worker ratchet.demo.orders:app`` (billing tasks, orders and
the sharded job of :mod:`ratchet.demo.books`).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from .. import ConfigError, EventTimeout, PermanentError, TaskContext
from . import books  # noqa: F401 - registers the sharded job's task on the same app
from .billing import CLIENT_TIMEOUT_S, RETRY, app, lease_s_from_env, seconds_from_env
from .payments import PaymentClient
from .settings import ORDER_TASK
from .warehouse import SHIPPED_EVENT, WarehouseClient

__all__ = [
    "SHIP_TIMEOUT_S",
    "SKU",
    "NotShipped",
    "app",
    "fulfil",
    "order_payment_client",
    "ship_timeout_s_from_env",
    "warehouse_client",
]

SKU = "widget"
"""What every order reserves (one of it)."""

_lock = threading.Lock()
_warehouse: list[WarehouseClient] = []
_payments: list[PaymentClient] = []


class NotShipped(PermanentError):
    """The warehouse did not ship the order within the wait's timeout: the workflow gives
    up (a permanent error, so it fails at once and its compensations run)."""


def ship_timeout_s_from_env(default: float = 6.0) -> float:
    """``RATCHET_DEMO_SHIP_TIMEOUT_S`` in seconds (``default`` when unset).

    Raises:
        ConfigError: the value is not a positive number.
    """
    return seconds_from_env("RATCHET_DEMO_SHIP_TIMEOUT_S", default)


def _url(var: str, what: str) -> str:
    url = os.environ.get(var)
    if not url:
        raise ConfigError(f"{var} is not set: start {what} and export its URL")
    return url


def warehouse_client() -> WarehouseClient:
    """This process's client of the warehouse (``RATCHET_DEMO_WAREHOUSE_URL``), created on
    first use (thread-safe).

    Raises:
        ConfigError: the variable is not set.
    """
    with _lock:
        if not _warehouse:
            url = _url("RATCHET_DEMO_WAREHOUSE_URL",
                       "the warehouse (python -m ratchet.demo.warehouse)")  # fmt: skip
            _warehouse.append(WarehouseClient(url, timeout_s=CLIENT_TIMEOUT_S))
        return _warehouse[0]


def order_payment_client() -> PaymentClient:
    """This process's client of the order workflow's payment service
    (``RATCHET_DEMO_ORDER_PAYMENTS_URL``), created on first use (thread-safe).

    Raises:
        ConfigError: the variable is not set.
    """
    with _lock:
        if not _payments:
            url = _url("RATCHET_DEMO_ORDER_PAYMENTS_URL",
                       "a payment service (python -m ratchet.demo.payments)")  # fmt: skip
            _payments.append(PaymentClient(url, timeout_s=CLIENT_TIMEOUT_S))
        return _payments[0]


def _confirmation(
    order_id: str, reserved: dict[str, Any], charged: dict[str, Any], shipped: Any
) -> dict[str, Any]:
    tracking = shipped.get("tracking") if isinstance(shipped, dict) else None
    return {
        "order_id": order_id,
        "reservation_id": reserved["id"],
        "charge_id": charged["charge_id"],
        "amount_cents": charged["amount_cents"],
        "tracking": tracking,
    }


SHIP_TIMEOUT_S = ship_timeout_s_from_env()
"""How long an order waits for its ``shipped`` event, seconds (``RATCHET_DEMO_SHIP_TIMEOUT_S``)."""


@app.task(name=ORDER_TASK, version=1, retry=RETRY, lease_s=lease_s_from_env())
def fulfil(ctx: TaskContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    """Fulfil one order: reserve one :data:`SKU` at the warehouse, charge
    ``amount_cents``, wait for the warehouse's ``shipped`` event.

    Args:
        ctx: the task context.
        order_id: the business id; the effects' keys are ``reserve:<order_id>`` and
            ``charge:<order_id>`` (their compensations' ``compensate:<key>``), the event's
            key is the order id.
        amount_cents: what to charge, cents.

    Returns:
        The confirmation: ``{"order_id", "reservation_id", "charge_id", "amount_cents",
        "tracking"}``.

    Raises:
        NotShipped: no ``shipped`` event within :data:`SHIP_TIMEOUT_S` seconds (the task
            fails, the refund and the release run, it ends ``COMPENSATED``).
    """
    warehouse = warehouse_client()
    payments = order_payment_client()
    reserved: dict[str, Any] = ctx.effect(
        "reserve", lambda k: warehouse.reserve(k, order_id, SKU, 1),
        key=f"reserve:{order_id}", lookup=warehouse.lookup, idempotent=True,
        params={"order_id": order_id, "sku": SKU, "qty": 1},
        compensate=lambda k, r: warehouse.release(k, order_id, str(r["id"])),
        compensate_lookup=warehouse.lookup,
    )  # fmt: skip
    charged: dict[str, Any] = ctx.effect(
        "charge", lambda k: payments.charge(k, order_id, amount_cents),
        key=f"charge:{order_id}", lookup=payments.lookup, idempotent=True,
        params={"order_id": order_id, "amount_cents": amount_cents},
        compensate=lambda k, r: payments.refund(
            k, order_id, int(r["amount_cents"]), str(r["charge_id"])),
        compensate_lookup=payments.lookup,
    )  # fmt: skip
    try:
        shipped = ctx.wait_for_event(SHIPPED_EVENT, key=order_id, timeout_s=SHIP_TIMEOUT_S)
    except EventTimeout:
        raise NotShipped(
            f"order {order_id} not shipped within {SHIP_TIMEOUT_S:g} s"
        ) from None
    confirmation: dict[str, Any] = ctx.step(
        "confirmation", _confirmation, order_id, reserved, charged, shipped
    )
    return confirmation
