"""The demo's warehouse: reserves stock for an order, releases it, and ships it later.

Like the payment service (:mod:`ratchet.demo.payments`) it is :mod:`ratchet.testing`'s
counting service — its own process, real HTTP on loopback, its own SQLite file counting
every execution per idempotency key, the same injected faults — in the demo's vocabulary:

* a reservation is an execution under key ``reserve:<order_id>`` whose body is
  ``{"order_id": str, "sku": str, "qty": int}`` (record ids ``rs_...``);
* a release (the order workflow's compensation of its reservation) is an execution under
  key ``compensate:reserve:<order_id>``, body ``{"order_id", "release_of": <reservation
  id>}``;
* a shipment is an execution under key ``ship:<order_id>``, body ``{"order_id",
  "tracking"}``, written by the warehouse itself (not over HTTP, so no injected fault).

What makes it more than a counter is its shipper (:class:`Shipper`), a thread of the
service process: it reads the reservations from the service's own file and, for each, by a
seeded plan (:class:`ShipPlan`), either ships it ``min_s`` to ``max_s`` seconds after the
reservation or never. Shipping is: record the shipment (``ship:<order_id>``), then send
the ledger the event ``shipped`` with key ``<order_id>`` (:meth:`ratchet.App.send_event`,
event id ``shipped:<order_id>``, so a resend is a duplicate; audited as sent by
``warehouse``), then record the receipt
(``notified:<order_id>``, body ``{"order_id", "event_id", "seq", "woken", "duplicate"}``:
``woken`` 1 when the event woke a task that was waiting for it). A reservation already
released is never shipped.

Run it as::

    python -m ratchet.demo.warehouse --port 0 --db warehouse.db --ledger URL \\
        [--ship-ratio P] [--ship-min-s S] [--ship-max-s S] [--ship-seed N] \\
        [the options of python -m ratchet.testing.services]

(it prints ``READY <port>``). :class:`WarehouseClient` speaks its HTTP API.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from .. import NOT_FOUND, App, RatchetError
from ..testing.services import (
    CountingClient,
    CountingService,
    CountingStore,
    read_stored,
    start_counting_service,
)
from ..testing.services import main as _service_main

__all__ = [
    "NOTIFIED_PREFIX",
    "RELEASE_PREFIX",
    "RESERVATION_ID_PREFIX",
    "RESERVE_PREFIX",
    "SHIPPED_EVENT",
    "SHIP_PREFIX",
    "ShipPlan",
    "Shipper",
    "WarehouseClient",
    "main",
    "record_of",
    "start_warehouse",
]

RESERVATION_ID_PREFIX = "rs_"
RESERVE_PREFIX = "reserve:"
"""Key prefix of a reservation (the order workflow's ``reserve`` effect)."""
RELEASE_PREFIX = "compensate:reserve:"
"""Key prefix of a release: the compensation of ``reserve`` (``compensate:<its key>``)."""
SHIP_PREFIX = "ship:"
"""Key prefix of a shipment, recorded by the warehouse before it sends the event."""
NOTIFIED_PREFIX = "notified:"
"""Key prefix of the receipt of a shipment's event, recorded after it was sent."""
SHIPPED_EVENT = "shipped"
"""The event the warehouse sends when it ships an order (key: the order id)."""


def record_of(record: dict[str, Any]) -> dict[str, Any]:
    """A counting-service record as the warehouse's answer: ``{"id", "key", "created_at"}``
    plus the fields of its body (``order_id``, and ``sku``, ``qty`` or ``release_of``)."""
    body = record.get("body") or {}
    found = {"id": record["id"], "key": record["key"], "created_at": record.get("created_at")}
    return {**body, **found}


class WarehouseClient:
    """A client of the warehouse: a :class:`~ratchet.testing.CountingClient` (same
    arguments, thread safety and errors) speaking in reservations and releases.

    Args:
        base_url: e.g. ``http://127.0.0.1:54321``.
        timeout_s: read timeout per request, seconds (a slower reply is an unknown outcome).
        connect_timeout_s: TCP connect timeout, seconds.
    """

    def __init__(
        self, base_url: str, timeout_s: float = 1.0, connect_timeout_s: float = 2.0
    ) -> None:
        self.base_url = base_url
        self._client = CountingClient(base_url, timeout_s, connect_timeout_s)

    def reserve(self, key: str, order_id: str, sku: str, qty: int) -> dict[str, Any]:
        """Reserve ``qty`` of ``sku`` for ``order_id`` under idempotency key ``key``.

        Returns:
            The reservation: ``{"id", "key", "order_id", "sku", "qty", "created_at"}``.

        Raises:
            httpx.HTTPStatusError: 4xx/5xx (503 carries ``Retry-After``; 422 for a key
                reused with another body).
            httpx.TransportError: timeouts, dropped replies, refused connections.
        """
        body = {"order_id": order_id, "sku": sku, "qty": qty}
        return record_of(self._client.execute(key, body))

    def release(self, key: str, order_id: str, reservation_id: str) -> dict[str, Any]:
        """Release reservation ``reservation_id`` of ``order_id`` under idempotency key
        ``key`` (the order workflow's compensation: ``compensate:reserve:<order_id>``).

        Returns:
            The release: ``{"id", "key", "order_id", "release_of", "created_at"}``.

        Raises:
            httpx.HTTPStatusError, httpx.TransportError: as :meth:`reserve`.
        """
        body = {"order_id": order_id, "release_of": reservation_id}
        return record_of(self._client.execute(key, body))

    def lookup(self, key: str) -> object:
        """The stored reservation or release for ``key``, or ``ratchet.NOT_FOUND`` when the
        warehouse confirms the key never executed.

        Raises:
            httpx.HTTPStatusError: an error status (the lookup is inconclusive).
            httpx.TransportError: the warehouse could not answer.
        """
        found = self._client.lookup(key)
        return record_of(found) if isinstance(found, dict) else NOT_FOUND

    def stats(self) -> dict[str, Any]:
        """The service's counters (see :meth:`~ratchet.testing.CountingClient.stats`)."""
        return self._client.stats()

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault settings (:class:`~ratchet.testing.FaultSettings` fields)."""
        return self._client.set_faults(**changes)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> WarehouseClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class ShipPlan:
    """Which reserved orders the warehouse ships, and when: a draw per order from a
    generator seeded with ``seed`` and the order id (the same answer in every process).

    Attributes:
        ratio: share of orders shipped, in [0, 1]; the others are never shipped.
        min_s, max_s: a shipped order leaves this many seconds after its reservation
            (uniform between the two).
        seed: the plan's seed.
    """

    ratio: float = 0.75
    min_s: float = 1.0
    max_s: float = 3.0
    seed: int = 0

    def delay_s(self, order_id: str) -> float | None:
        """Seconds after its reservation at which ``order_id`` ships; None: never."""
        rng = random.Random(f"{self.seed}:{order_id}")
        ships = rng.random() < self.ratio
        delay = rng.uniform(self.min_s, self.max_s)
        return delay if ships else None


Sender = Callable[[str, dict[str, Any]], Any]
"""Sends the ``shipped`` event for an order: ``send(order_id, payload)``, returning the
ledger's :class:`EventReceipt`-like answer (``event_id``, ``seq``, ``woken``,
``duplicate``)."""


class Shipper:
    """The warehouse's shipping thread: ships reserved orders by the plan (module doc).

    Args:
        store: the warehouse's store (the shipper records through it, in the same file).
        db_path: the warehouse's SQLite file (the reservations are read from it).
        plan: which orders ship, and when.
        send: sends the event (default: :meth:`ratchet.App.send_event` on ``ledger_url``).
        ledger_url: the ledger the default ``send`` writes to.
        tick_s: how often the file is read, seconds.
    """

    def __init__(
        self,
        store: CountingStore,
        db_path: str | Path,
        plan: ShipPlan,
        *,
        send: Sender | None = None,
        ledger_url: str | None = None,
        tick_s: float = 0.1,
    ) -> None:
        self.store = store
        self.db_path = Path(db_path)
        self.plan = plan
        self.tick_s = tick_s
        self._ledger_url = ledger_url
        self._app: App | None = None
        self._send = send or self._send_with_app
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _send_with_app(self, order_id: str, payload: dict[str, Any]) -> Any:
        if self._app is None:
            self._app = App(ledger=self._ledger_url)
        return self._app.send_event(
            SHIPPED_EVENT, key=order_id, payload=payload, event_id=f"shipped:{order_id}",
            by="warehouse",
        )

    def tick(self, now: float | None = None) -> list[str]:
        """Ship every order that is due and not shipped or released yet, and send the
        event of every shipment whose receipt is not recorded yet (a failed send is
        tried again at the next tick).

        Returns:
            The orders whose event was sent in this tick.

        Raises:
            ratchet.testing.ServiceError: the warehouse's file is missing.
        """
        now = time.time() if now is None else now
        stored = read_stored(self.db_path)
        sent: list[str] = []
        for key, record in stored.items():
            if not key.startswith(RESERVE_PREFIX):
                continue
            order_id = key[len(RESERVE_PREFIX) :]
            if NOTIFIED_PREFIX + order_id in stored:
                continue
            tracking = f"TRK-{order_id}"
            if SHIP_PREFIX + order_id not in stored:
                delay = self.plan.delay_s(order_id)
                if delay is None or RELEASE_PREFIX + order_id in stored:
                    continue
                if now < float(record["created_at"]) + delay:
                    continue
                self.store.execute(SHIP_PREFIX + order_id,
                                   {"order_id": order_id, "tracking": tracking})  # fmt: skip
            try:
                receipt = self._send(order_id, {"order_id": order_id, "tracking": tracking})
            except RatchetError as exc:  # the ledger is busy or away: next tick
                print(f"shipper: event for {order_id} not sent: {exc}", file=sys.stderr)
                continue
            self.store.execute(NOTIFIED_PREFIX + order_id, {
                "order_id": order_id, "event_id": str(receipt.event_id),
                "seq": int(receipt.seq), "woken": int(receipt.woken),
                "duplicate": bool(receipt.duplicate),
            })  # fmt: skip
            sent.append(order_id)
        return sent

    def start(self) -> None:
        """Run :meth:`tick` every :attr:`tick_s` seconds in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name="shipper", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread (waits up to ``timeout_s`` seconds) and close the ledger."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._app is not None:
            self._app.close()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:
                print(f"shipper: {type(exc).__name__}: {exc}", file=sys.stderr)


def start_warehouse(
    db_path: str | Path, ledger_url: str, plan: ShipPlan, **options: Any
) -> CountingService:
    """Start the warehouse in its own process (:func:`ratchet.testing.start_counting_service`
    with ``rs_`` record ids and the shipper on ``ledger_url``); ``options`` are that
    function's keyword arguments (faults, seed, latency).

    Raises:
        ratchet.testing.ServiceError: it did not become ready (it is killed).
    """
    extra = [
        "--ledger", ledger_url, "--ship-ratio", repr(plan.ratio),
        "--ship-min-s", repr(plan.min_s), "--ship-max-s", repr(plan.max_s),
        "--ship-seed", str(plan.seed),
    ]  # fmt: skip
    return start_counting_service(
        db_path, id_prefix=RESERVATION_ID_PREFIX, module="ratchet.demo.warehouse",
        extra_args=extra, **options,
    )  # fmt: skip


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], str]:
    p = argparse.ArgumentParser(prog="python -m ratchet.demo.warehouse", add_help=False)
    p.add_argument("--ledger", required=True, help="the ledger the shipped events go to")
    p.add_argument("--ship-ratio", type=float, default=0.75)
    p.add_argument("--ship-min-s", type=float, default=1.0)
    p.add_argument("--ship-max-s", type=float, default=3.0)
    p.add_argument("--ship-seed", type=int, default=0)
    ours, rest = p.parse_known_args(argv)
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", required=True)
    return ours, rest, db.parse_known_args(argv)[0].db


def main(argv: list[str] | None = None) -> int:
    """Run the warehouse (the counting service with ``rs_`` ids, plus its shipper) until
    SIGTERM; returns the exit status (2 on bad arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--id-prefix" not in args:
        args += ["--id-prefix", RESERVATION_ID_PREFIX]
    try:
        ours, rest, db_path = _parse(args)
    except SystemExit as exc:
        return int(exc.code or 2)
    plan = ShipPlan(ours.ship_ratio, ours.ship_min_s, ours.ship_max_s, ours.ship_seed)
    shippers: list[Shipper] = []

    def started(store: CountingStore) -> None:
        shipper = Shipper(store, db_path, plan, ledger_url=ours.ledger)
        shippers.append(shipper)
        shipper.start()

    try:
        return _service_main(rest, prog="python -m ratchet.demo.warehouse", started=started)
    finally:
        for shipper in shippers:
            shipper.stop()


if __name__ == "__main__":
    raise SystemExit(main())
