"""Judging a demo run's order workflows (:mod:`ratchet.demo.orders`): per order, its
reservation and release counted in the warehouse's own SQLite file, its charge and refund
counted in the order payment service's own file, whether the warehouse shipped it
(recorded in its file before the event left), against the task's end in the ledger; all
in an :class:`OrderResult` whose :attr:`~OrderResult.invariants` join the run's verdict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from .. import State
from ..control import EffectState, TaskInfo, Timeline
from ..storedtext import StoredState
from ..testing import ServiceRecords, check_exactly_once, read_stored
from .settings import ORDER_KIND
from .state import RunState
from .warehouse import NOTIFIED_PREFIX, RELEASE_PREFIX, RESERVE_PREFIX, SHIP_PREFIX

__all__ = [
    "CHARGE_PREFIX", "REFUND_PREFIX", "OrderCounts", "OrderResult", "judge_orders",
    "order_invariants",
]

CHARGE_PREFIX = "charge:"
"""Key prefix of an order's charge at the order payment service."""
REFUND_PREFIX = "compensate:charge:"
"""Key prefix of an order's refund: the compensation of its charge."""


@dataclass(frozen=True, slots=True)
class OrderCounts:
    """One order workflow, counted at the services and read from the ledger.

    Attributes:
        order_id: the order; task_id: its task; state: the task's state.
        reserved, released: executions of its reservation and release at the warehouse.
        charged, refunded: executions of its charge and refund at the payment service.
        shipped: the warehouse recorded a shipment for it.
        woke: the receipt of its ``shipped`` event: it woke a task waiting for it (True),
            it arrived before the wait (False), or none was recorded (None).
        compensations: its compensation effects the ledger recorded as done.
    """

    order_id: str
    task_id: str
    state: State | StoredState
    reserved: int
    released: int
    charged: int
    refunded: int
    shipped: bool
    woke: bool | None
    compensations: int

    @property
    def counts(self) -> tuple[int, int, int, int]:
        """``(reserved, released, charged, refunded)``."""
        return self.reserved, self.released, self.charged, self.refunded


@dataclass
class OrderResult:
    """The verdict on a run's order workflows.

    Attributes:
        orders: every order workflow of the run, counted.
        warehouse, payments: the two services' own records.
        stray: executions at either service under keys no order of this run accounts for.
        mismatched: succeeded orders whose charge id in the ledger is not the service's.
        invariants: ``(name, held, detail)`` of every check.
        injected: injected faults per service (``{}`` when it did not answer).
    """

    orders: list[OrderCounts]
    warehouse: ServiceRecords | None
    payments: ServiceRecords | None
    stray: dict[str, int] = field(default_factory=dict)
    mismatched: list[str] = field(default_factory=list)
    invariants: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def states(self) -> Counter[State | StoredState]:
        """The order tasks' states."""
        return Counter(o.state for o in self.orders)

    @property
    def shipped(self) -> list[OrderCounts]:
        """The orders the warehouse shipped."""
        return [o for o in self.orders if o.shipped]

    @property
    def not_shipped(self) -> list[OrderCounts]:
        """The orders the warehouse never shipped (their wait timed out)."""
        return [o for o in self.orders if not o.shipped]

    def total(self, what: str) -> int:
        """Executions of ``what`` (``reserved``, ``released``, ``charged``, ``refunded``)
        over every order."""
        return sum(int(getattr(o, what)) for o in self.orders)


def _listed(orders: list[OrderCounts], limit: int = 3) -> str:
    shown = ", ".join(
        f"{o.order_id} ({o.state.value}: reserved {o.reserved}, released {o.released}, "
        f"charged {o.charged}, refunded {o.refunded})"
        for o in orders[:limit]
    )
    return shown + (f" and {len(orders) - limit} more" if len(orders) > limit else "")


def judge_orders(
    st: RunState, infos: Mapping[str, TaskInfo], timelines: Mapping[str, Timeline]
) -> OrderResult:
    """Count every order workflow of the run at the two services and check the order
    invariants (see :mod:`ratchet.demo.runner`).

    Args:
        st: the run (its warehouse and order payment service must have been started when
            it has orders).
        infos: the run's tasks by id (from the ledger).
        timelines: each task's :meth:`ratchet.Control.history`.

    Returns:
        The :class:`OrderResult` (no invariants when the run has no orders).

    Raises:
        ratchet.testing.ServiceError: a service's file is missing.
    """
    ids = [tid for tid in infos if st.kind_of.get(tid) == ORDER_KIND]
    if not ids or st.warehouse is None or st.order_payments is None:
        return OrderResult([], None, None)
    wh = st.warehouse.records()
    pay = st.order_payments.records()
    notified = {k: r for k, r in read_stored(st.warehouse.db_path).items()
                if k.startswith(NOTIFIED_PREFIX)}  # fmt: skip
    orders: list[OrderCounts] = []
    for tid in ids:
        info = infos[tid]
        oid = str(info.params["order_id"])
        receipt = notified.get(NOTIFIED_PREFIX + oid)
        comps = sum(
            1 for e in timelines[tid].effects
            if e.name.startswith("compensate:") and e.state is EffectState.DONE
        )  # fmt: skip
        orders.append(OrderCounts(
            oid, tid, info.state,
            wh.executions.get(RESERVE_PREFIX + oid, 0), wh.executions.get(RELEASE_PREFIX + oid, 0),
            pay.executions.get(CHARGE_PREFIX + oid, 0), pay.executions.get(REFUND_PREFIX + oid, 0),
            SHIP_PREFIX + oid in wh.executions,
            None if receipt is None else bool(receipt["body"].get("woken")),
            comps,
        ))  # fmt: skip
    r = OrderResult(orders, wh, pay)
    mine = {o.order_id for o in orders}
    for records in (wh, pay):
        for key, n in records.executions.items():
            if key.split(":")[-1] not in mine:
                r.stray[key] = n
    once = check_exactly_once(
        st.ledger_url, pay, task_ids=ids, keys={o.task_id: CHARGE_PREFIX + o.order_id
                                                for o in orders},
        effect="charge", result_id_field="charge_id", require_terminal=False,
        allow_unexpected=True, raise_on_violation=False, timelines=timelines,
    )  # fmt: skip
    r.mismatched = list(once.mismatched)
    r.invariants = order_invariants(r)
    return r


def order_invariants(r: OrderResult) -> list[tuple[str, bool, str]]:
    """The order invariants of ``r``'s counts, as ``(name, held, detail)`` (see
    :mod:`ratchet.demo.runner`; "both endings happened" only with 20 orders or more)."""
    n = len(r.orders)
    twice = [o for o in r.orders if max(o.counts) > 1]
    orphan = [o for o in r.orders if o.refunded > o.charged or o.released > o.reserved]
    bad_shipped = [o for o in r.shipped if not (
        o.state is State.SUCCEEDED and o.counts == (1, 0, 1, 0))]  # fmt: skip
    bad_timed_out = [o for o in r.not_shipped if not (
        o.state is State.COMPENSATED and o.counts == (1, 1, 1, 1))]  # fmt: skip
    shipped, timed_out = len(r.shipped), len(r.not_shipped)
    invariants = [
        ("orders: every reservation, release, charge and refund at most once (counted at "
         "the warehouse and the payment service)", not twice,
         _listed(twice) if twice else f"{r.total('reserved')} reservations, "
         f"{r.total('released')} releases, {r.total('charged')} charges, "
         f"{r.total('refunded')} refunds over {n} orders"),
        ("orders: a refund only for a charge, a release only for a reservation", not orphan,
         _listed(orphan) if orphan else f"{r.total('refunded')} refunds, "
         f"{r.total('released')} releases"),
        ("orders: every shipped order SUCCEEDED, reserved and charged once, neither "
         "refunded nor released", not bad_shipped and not r.mismatched,
         _listed(bad_shipped) if bad_shipped
         else f"{len(r.mismatched)} succeeded orders whose ledger charge id is not the "
         "service's" if r.mismatched else f"{shipped} of {shipped}"),
        ("orders: every order never shipped timed out and ended COMPENSATED: its charge "
         "refunded, its reservation released", not bad_timed_out,
         _listed(bad_timed_out) if bad_timed_out else f"{timed_out} of {timed_out}"),
        ("orders: nothing reserved or charged for an order outside this run", not r.stray,
         f"{len(r.stray)} stray keys: {', '.join(list(r.stray)[:3])}" if r.stray
         else "0 stray keys"),
    ]  # fmt: skip
    if n >= 20:
        invariants.append((
            "orders: both endings happened (shipped, timed out and compensated)",
            shipped > 0 and timed_out > 0, f"{shipped} shipped, {timed_out} timed out",
        ))  # fmt: skip
    return invariants
