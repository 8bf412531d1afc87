"""What the parts of one demo run share (:class:`RunState`): the settings, the app and its
:class:`~ratchet.Control`, the payment services, the warehouse, the submitted tasks, the
event log; and what the ledger says about this run's tasks at one instant
(:class:`Snapshot`)."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .. import App, ConfigError, Control, State
from ..config import parse_ledger_url
from ..control import LateEffectView
from ..storedtext import StoredState
from ..testing import CountingService, sqlite_write_locked
from .payments import KINDS, PaymentService
from .settings import ORDER_KIND, SETTLED, DemoSettings

__all__ = ["RunState", "Snapshot", "holder_pid"]


def holder_pid(holder: str | None) -> int | None:
    """The pid inside a ``host:pid:random`` holder id (None if it has another shape)."""
    if not holder:
        return None
    parts = holder.split(":")
    if len(parts) < 3:
        return None
    try:
        return int(parts[-2])
    except ValueError:
        return None


@dataclass
class Snapshot:
    """What the ledger says about this run's tasks at one instant.

    Attributes:
        states: the tasks' states.
        inflight: ``{worker pid: [task ids it holds RUNNING]}``.
        settled_of: settled tasks (:data:`~ratchet.demo.settings.SETTLED`) per kind.
        takeovers, stale, lookup_hits, revocations, late_effects: the ledger's counts
            (:class:`~ratchet.StatusReport`).
        orders: the order workflows' states.
    """

    states: Counter[State | StoredState]
    inflight: dict[int, list[str]]
    settled_of: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    stale: int = 0
    lookup_hits: int = 0
    revocations: int = 0
    late_effects: int = 0
    orders: Counter[State | StoredState] = field(default_factory=Counter)


@dataclass
class RunState:
    """One demo run as its parts (chaos, judging, display, the main loop) share it.

    Attributes:
        settings: the run's knobs.
        ledger_url: the ledger the workers and :attr:`control` use.
        workdir: the work dir (ledger, the services' files, logs).
        seed: the random seed (printed; :attr:`rng` is seeded with it).
        n_tasks: tasks to submit: billing tasks and order workflows.
        app: the demo's app (billing tasks and the order workflow,
            :data:`~ratchet.demo.settings.DEMO_APP`), configured on the ledger.
        control: operator reads of the ledger.
        lease_s: the billing tasks' lease, seconds.
        orders: ``(order id, amount in cents, kind)`` per task to submit, in order (kind:
            one of :data:`~ratchet.demo.payments.KINDS`, or
            :data:`~ratchet.demo.settings.ORDER_KIND` for an order workflow).
        services: the payment service of each kind, once started.
        warehouse: the order workflows' warehouse, once started.
        order_payments: the order workflows' payment service, once started.
        task_ids: the submitted tasks, in order; kind_of: the kind of each.
        submitted: orders submitted so far.
        resubmit_checks: ``(expected task id, returned task id, created)`` per resubmitted
            key.
        events: ``(seconds since the start, message)`` for the chaos timeline (Rich
            markup).
        elapsed_s: the run's length, seconds (set when the loop ends).
        stalled, deadline_hit: how the loop ended, when not by every task settling.
        books_job: the sharded job's parent task (None before it is submitted, or
            without one); books_day: the day it reconciles.
    """

    settings: DemoSettings
    ledger_url: str
    workdir: Path
    seed: int
    n_tasks: int
    app: App
    control: Control
    lease_s: float
    rng: random.Random
    orders: list[tuple[str, int, str]]
    services: dict[str, PaymentService] = field(default_factory=dict)
    warehouse: CountingService | None = None
    order_payments: PaymentService | None = None
    task_ids: list[str] = field(default_factory=list)
    kind_of: dict[str, str] = field(default_factory=dict)
    submitted: int = 0
    resubmit_checks: list[tuple[str, str, bool]] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    t0: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    stalled: bool = False
    deadline_hit: bool = False
    books_job: str | None = None
    books_day: str = ""

    @property
    def total_of(self) -> Counter[str]:
        """Tasks to submit per kind."""
        return Counter(kind for _, _, kind in self.orders)

    @property
    def n_billing(self) -> int:
        """Billing tasks to submit (every kind of payment target)."""
        total = self.total_of
        return sum(total[kind] for kind in KINDS)

    @property
    def n_orders(self) -> int:
        """Order workflows to submit."""
        return self.total_of[ORDER_KIND]

    def all_services(self) -> dict[str, CountingService]:
        """Every service of the run by name: the payment service of each kind, then
        ``warehouse`` and ``order-payments`` (those started)."""
        found: dict[str, CountingService] = dict(self.services)
        if self.warehouse is not None:
            found["warehouse"] = self.warehouse
        if self.order_payments is not None:
            found["order-payments"] = self.order_payments
        return found

    def now(self) -> float:
        """Seconds since the run started (:attr:`t0`)."""
        return time.monotonic() - self.t0

    def log(self, message: str) -> None:
        """Add ``message`` (Rich markup) to the chaos timeline."""
        self.events.append((self.now(), message))

    def snapshot(self) -> Snapshot:
        infos = self.control.get_many(self.task_ids) if self.task_ids else []
        states: Counter[State | StoredState] = Counter(i.state for i in infos)
        settled_of: Counter[str] = Counter(
            self.kind_of[i.task_id] for i in infos if i.state in SETTLED
        )
        inflight: dict[int, list[str]] = {}
        for info in infos:
            if info.state is State.RUNNING:
                pid = holder_pid(info.holder)
                if pid is not None:
                    inflight.setdefault(pid, []).append(info.task_id)
        orders: Counter[State | StoredState] = Counter(
            i.state for i in infos if self.kind_of[i.task_id] == ORDER_KIND
        )
        st = self.control.status()
        return Snapshot(
            states, inflight, settled_of, st.takeovers, st.stale_rejections, st.lookup_hits,
            st.revocations, st.late_effects, orders,
        )  # fmt: skip

    def late_effects(self, task_id: str | None = None) -> list[LateEffectView]:
        """Late effects the ledger recorded (for ``task_id``, or all of this run's)."""
        found = self.control.late_effects(task_id=task_id, limit=10_000)
        if task_id is not None:
            return list(found)
        mine = set(self.task_ids)
        return [le for le in found if le.task_id in mine]

    def sqlite_write_lock_held(self) -> bool:
        """True when another process holds the SQLite ledger's write lock for > 0.5 s.

        Only used right after a sender froze: a process frozen while one of its threads is
        *inside* a write transaction (a lease renewal) holds SQLite's single write lock, so
        every other writer would wait for the whole freeze. That is a property of the
        embedded backend, not the scenario this demo wants to show (a sender outliving its
        lease), so that freeze is retried.
        """
        try:
            config = parse_ledger_url(self.ledger_url)
        except ConfigError:
            return False
        if config.scheme != "sqlite":
            return False
        return sqlite_write_locked(config.path, timeout_s=0.5)

