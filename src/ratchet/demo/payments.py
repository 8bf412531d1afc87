"""The demo's payment service: :mod:`ratchet.testing.services` dressed as a payment API.

The counting service does the work — its own process, real HTTP on loopback, its own
SQLite file counting every execution per idempotency key, fault injection (lost replies,
503 bursts, slow replies). This module only gives it the demo's vocabulary: a charge is an
execution whose body is ``{"order_id": str, "amount_cents": int}``, and its record id
(``ch_...``) is the ``charge_id``.

Run it as::

    python -m ratchet.demo.payments --port 0 --db payments.db \\
        [--no-honour-keys] [--check-tokens] [--reply-lost P] [--burst-503 P] [--slow P] \\
        [--slow-s S] [--seed N]

(the options of ``python -m ratchet.testing.services``; it prints ``READY <port>``). The
HTTP API is the counting service's (``POST /effects``, ``GET /effects/{key}``, ``GET
/stats``, ``/admin/faults``); :class:`PaymentClient` speaks it.

One service process is one kind of payment target (``ratchet demo`` runs one of each,
see :data:`KINDS`):

* ``idempotent`` — honours the ``Idempotency-Key`` (the default, like Stripe);
* ``fenced`` — ``--no-honour-keys --check-tokens``: no key dedupe, but every charge and
  lookup carries a fencing token (``Fencing-Token`` header) and a token lower than the
  highest the service has seen for the key is refused (``409``, raised by the client as
  :class:`ratchet.TokenRejected`);
* ``lookup`` — ``--no-honour-keys``: no dedupe, but ``GET /effects/{key}`` answers whether
  a key was charged;
* ``neither`` — ``--no-honour-keys``, and the caller does not use the lookup either.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import NOT_FOUND
from ..testing.services import (
    CountingClient,
    CountingService,
    FaultSettings,
    ServiceError,
    read_records,
    read_stored,
    start_counting_service,
)
from ..testing.services import main as _service_main

__all__ = [
    "KINDS",
    "FaultSettings",
    "PaymentClient",
    "PaymentService",
    "PaymentServiceError",
    "SERVICE_OPTIONS",
    "charge_of",
    "main",
    "read_charges",
    "read_executions",
    "read_replays",
    "start_payment_service",
]

PaymentService = CountingService
"""A running payment service process (a :class:`~ratchet.testing.CountingService`)."""

PaymentServiceError = ServiceError
"""The payment service could not be started (a :class:`~ratchet.testing.ServiceError`)."""

CHARGE_ID_PREFIX = "ch_"

KINDS: tuple[str, ...] = ("idempotent", "fenced", "lookup", "neither")
"""The kinds of payment target, by what the target offers against a duplicate charge:
it honours the idempotency key; it checks a fencing token; it answers lookups only;
neither."""

SERVICE_OPTIONS: dict[str, dict[str, bool]] = {
    "idempotent": {"honour_keys": True, "check_tokens": False},
    "fenced": {"honour_keys": False, "check_tokens": True},
    "lookup": {"honour_keys": False, "check_tokens": False},
    "neither": {"honour_keys": False, "check_tokens": False},
}
""":func:`start_payment_service` options of each kind's service (``neither`` and
``lookup`` run the same service; they differ in what the task asks of it)."""


def charge_of(record: dict[str, Any]) -> dict[str, Any]:
    """A counting-service record as a charge: ``{"charge_id", "key", "order_id",
    "amount_cents", "created_at"}`` (plus ``"refund_of"`` for a refund and ``"replayed"``
    when the record has them)."""
    body = record.get("body") or {}
    charge = {
        "charge_id": record["id"],
        "key": record["key"],
        "order_id": body.get("order_id"),
        "amount_cents": body.get("amount_cents"),
        "created_at": record.get("created_at"),
    }
    if "refund_of" in body:
        charge["refund_of"] = body["refund_of"]
    if "replayed" in record:
        charge["replayed"] = record["replayed"]
    return charge


def start_payment_service(db_path: str | Path, **options: Any) -> CountingService:
    """Start the payment service (:func:`~ratchet.testing.start_counting_service` with
    ``ch_`` record ids); ``options`` are that function's keyword arguments.

    Raises:
        PaymentServiceError: it did not become ready (it is killed).
    """
    return start_counting_service(
        db_path, id_prefix=CHARGE_ID_PREFIX, module="ratchet.demo.payments", **options
    )


class PaymentClient:
    """A client of the payment service: a :class:`~ratchet.testing.CountingClient` (same
    arguments, thread safety and errors) speaking in charges."""

    def __init__(
        self, base_url: str, timeout_s: float = 1.0, connect_timeout_s: float = 2.0
    ) -> None:
        self.base_url = base_url
        self._client = CountingClient(base_url, timeout_s, connect_timeout_s)

    def charge(
        self, key: str, order_id: str, amount_cents: int, token: int | None = None
    ) -> dict[str, Any]:
        """Charge ``amount_cents`` for ``order_id`` under idempotency key ``key``.

        Args:
            key: the idempotency key (``Idempotency-Key`` header).
            order_id: the order; amount_cents: the amount, cents.
            token: fencing token (``Fencing-Token`` header; ``ctx.fencing_token`` of a
                ``fenced=True`` effect); None sends none.

        Returns:
            The charge: ``{"charge_id", "key", "order_id", "amount_cents", "created_at",
            "replayed"}``.

        Raises:
            ratchet.TokenRejected: a fenced service refused ``token`` as stale (nothing
                was charged).
            httpx.HTTPStatusError: other 4xx/5xx (503 carries ``Retry-After``; 422 for a
                key reused with another order or amount).
            httpx.TransportError: timeouts, dropped replies, refused connections.
        """
        body = {"order_id": order_id, "amount_cents": amount_cents}
        if token is None:
            return charge_of(self._client.execute(key, body))
        return charge_of(self._client.execute(key, body, token=token))

    def refund(self, key: str, order_id: str, amount_cents: int, charge_id: str) -> dict[str, Any]:
        """Refund charge ``charge_id`` of ``order_id`` (``amount_cents``) under idempotency
        key ``key``: an execution of its own at the service, counted like a charge (the
        order workflow's compensation of its charge, key ``compensate:charge:<order_id>``).

        Returns:
            The refund: ``{"charge_id"`` (the refund's own record id), ``"key", "order_id",
            "amount_cents", "refund_of", "created_at", "replayed"}``.

        Raises:
            httpx.HTTPStatusError: 4xx/5xx (503 carries ``Retry-After``; 422 for a key
                reused with another body).
            httpx.TransportError: timeouts, dropped replies, refused connections.
        """
        body = {"order_id": order_id, "amount_cents": amount_cents, "refund_of": charge_id}
        return charge_of(self._client.execute(key, body))

    def lookup(self, key: str, token: int | None = None) -> object:
        """The stored charge for ``key``, or ``NOT_FOUND`` when the service confirms the
        key never executed. A fenced service records ``token`` as seen before it answers,
        so a ``NOT_FOUND`` to token T means no request with a lower token will execute.

        Raises:
            ratchet.TokenRejected: a fenced service refused ``token`` as stale.
            httpx.HTTPStatusError: any other error status (the lookup is inconclusive).
            httpx.TransportError: the service could not answer.
        """
        found = self._client.lookup(key) if token is None else self._client.lookup(key, token)
        return charge_of(found) if isinstance(found, dict) else NOT_FOUND

    def stats(self) -> dict[str, Any]:
        """The service's counters (see :meth:`~ratchet.testing.CountingClient.stats`)."""
        return self._client.stats()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings (:class:`FaultSettings` fields); returns all of them."""
        return self._client.set_faults(**changes)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> PaymentClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_executions(db_path: str | Path) -> dict[str, int]:
    """Charges executed per key, from the service's own SQLite file.

    Raises:
        PaymentServiceError: no such file.
    """
    return read_records(db_path).executions


def read_charges(db_path: str | Path) -> dict[str, dict[str, Any]]:
    """The stored charge per key (the latest execution's), from the service's own file.

    Raises:
        PaymentServiceError: no such file.
    """
    return {key: charge_of(record) for key, record in read_stored(db_path).items()}


def read_replays(db_path: str | Path) -> dict[str, int]:
    """Charges answered as replays per key (a key already executed, sent again to a service
    that honours keys: nothing charged), from the service's own file.

    Raises:
        PaymentServiceError: no such file.
    """
    path = Path(db_path)
    if not path.exists():
        raise PaymentServiceError(f"payment service database {str(path)!r} does not exist")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30.0)
    try:
        return {str(k): int(n) for k, n in conn.execute(
            "SELECT key, COUNT(*) FROM replays GROUP BY key")}  # fmt: skip
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """Run the payment service (the counting service with ``ch_`` ids) until SIGTERM."""
    args = list(argv) if argv is not None else None
    if args is None:
        args = sys.argv[1:]
    if "--id-prefix" not in args:
        args = [*args, "--id-prefix", CHARGE_ID_PREFIX]
    return _service_main(args, prog="python -m ratchet.demo.payments")


if __name__ == "__main__":
    raise SystemExit(main())
