"""``ratchet demo``, shortened, on both ledgers: real worker processes killed with SIGKILL
and restarted, one sender per kind of payment target frozen in the middle of a call
(SIGSTOP at ``effect.before_call``) past its lease and resumed, four faulty payment
services (one per kind of target).

The demo's own verdict (exit status 0) is not taken on trust: the test reads the ledger
and each payment service's own file itself, through :mod:`ratchet.testing`'s checks and
the control API, and requires each kind's guarantee, counted at the target:

* idempotent (the service honours the key) and fenced (the service refuses stale
  fencing tokens): every task succeeded with its charge executed exactly once and
  recorded in the ledger; the fenced service refused the frozen sender's late charge;
* lookup only: every task succeeded; a key executed twice only where a sender froze
  past its lease (the demo's frozen sender at least), each such duplicate recorded as a
  late effect of an older generation; every other key once;
* neither: no key executed more than once; the frozen sender's task is UNKNOWN (the new
  holder could not know its outcome), its late charge executed once and is recorded as a
  late effect;

* order workflows (reserve at the warehouse, charge with a refund as its compensation,
  wait for the warehouse's ``shipped`` event): counted in the warehouse's and the order
  payment service's own files, every reservation, release, charge and refund at most
  once; every order the warehouse shipped SUCCEEDED, reserved and charged once, neither
  refunded nor released; every order it never shipped COMPENSATED, refunded and
  released; events that arrived while their order waited (WAITING) woke it;

* the sharded job (reconcile yesterday's orders over a few shards, ``ctx.batches`` in
  each): SUCCEEDED, its totals the expected counts, and ``Control.check`` adding up;

and the ledger to be consistent.
"""

from __future__ import annotations

import io
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ratchet import Control, RatchetError, open_ledger
from ratchet.demo.billing import TASKS
from ratchet.demo.books import RECONCILE_TASK, expected_counts
from ratchet.demo.order_judging import OrderCounts, OrderResult, order_invariants
from ratchet.demo.runner import DemoSettings, run_demo
from ratchet.demo.settings import ORDER_TASK
from ratchet.demo.warehouse import Shipper, ShipPlan
from ratchet.errors import ConfigError
from ratchet.states import State
from ratchet.testing import (
    FaultSettings,
    check_exactly_once,
    check_ledger_consistent,
    list_task_ids,
    read_records,
    read_stored,
)
from ratchet.testing.services import CountingStore

TASKS_N = 120
ORDERS_N = 24
KILLS = 2

SHORT = DemoSettings(
    arrival_s=2.0,
    batches=4,
    chaos_from=0.1,
    chaos_to=0.8,
    min_kill_gap_s=0.5,
    stall_s=30.0,
    books_orders=1200,
)
JOB_TASKS = 1 + SHORT.books_shards  # the sharded job's parent and its shards


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_holds_each_kinds_guarantee(ledger_url: str, tmp_path: Path) -> None:
    out = io.StringIO()
    workdir = tmp_path / "demo"
    code = run_demo(
        ledger_url,
        tasks=TASKS_N,
        workers=2,
        kills=KILLS,
        seed=7,
        workdir=workdir,
        orders=ORDERS_N,
        settings=SHORT,
        console=Console(file=out, width=160, color_system=None),
    )
    report = out.getvalue()
    assert code == 0, report
    assert f"{KILLS}/{KILLS}" in report, report  # the chaos happened

    # The external truth, read independently of the demo's report.
    ids = list_task_ids(ledger_url)
    assert len(ids) == TASKS_N + ORDERS_N + JOB_TASKS, report
    led = open_ledger(ledger_url, migrate=False, must_exist=True)
    try:
        infos = {i.task_id: i for i in led.get_many(ids)}
        books = {t: infos.pop(t) for t in list(infos) if infos[t].name == RECONCILE_TASK}
        late = [le for le in led.late_effects(None, 10_000) if le.task_id in infos]
        assert led.stats().late_effects == len(late), report
    finally:
        led.close()
    of_kind = {
        kind: [tid for tid, i in infos.items() if i.name == name] for kind, name in TASKS.items()
    }
    assert sorted(len(v) for v in of_kind.values()) == [TASKS_N // 4] * 4, report
    key_of = {tid: f"charge:{i.params['order_id']}" for tid, i in infos.items()}
    late_keys = Counter(le.key for le in late)

    # Honours the key / checks fencing tokens: exactly once, every task succeeded.
    for kind in ("idempotent", "fenced"):
        records = read_records(workdir / f"payments-{kind}.db")
        once = check_exactly_once(
            ledger_url, records, task_ids=of_kind[kind], effect="charge",
            result_id_field="charge_id",
        )  # fmt: skip
        assert once.states == {"SUCCEEDED": TASKS_N // 4}, report
        assert once.succeeded_once == TASKS_N // 4 and not once.duplicated, report
    fenced = read_records(workdir / "payments-fenced.db")
    assert fenced.rejections, report  # the frozen sender's late charge was refused
    assert {r.key for r in fenced.rejections} <= {key_of[t] for t in of_kind["fenced"]}

    # Lookup only: a duplicate only where a sender was frozen past its lease (the demo's
    # frozen sender, at least), and every one recorded as late effects of older generations.
    lookup = read_records(workdir / "payments-lookup.db")
    assert all(infos[t].state is State.SUCCEEDED for t in of_kind["lookup"]), report
    dups = {k: n for k, n in lookup.executions.items() if n > 1}
    assert dups, report
    task_of = {key_of[t]: t for t in of_kind["lookup"]}
    for key, n in dups.items():
        recorded = [le for le in late if le.key == key and le.outcome == "done"]
        assert len(recorded) >= n - 1, report
        assert all(le.generation < infos[task_of[key]].generation for le in recorded), report
    assert all(lookup.executions.get(key_of[t]) == 1 for t in of_kind["lookup"]
               if key_of[t] not in dups), report  # fmt: skip

    # Neither: at most once per key here; the frozen sender's task waits in UNKNOWN and its
    # late charge (one execution) is recorded as a late effect.
    neither = read_records(workdir / "payments-neither.db")
    assert max(neither.executions.values()) == 1, report
    unknown = [t for t in of_kind["neither"] if infos[t].state is State.UNKNOWN]
    assert any(late_keys[key_of[t]] and neither.executions.get(key_of[t]) == 1 for t in unknown)
    for tid in of_kind["neither"]:
        assert infos[tid].state in (State.SUCCEEDED, State.UNKNOWN), report
        if infos[tid].state is State.SUCCEEDED:
            assert neither.executions.get(key_of[tid]) == 1, report

    _check_orders(workdir, [i for i in infos.values() if i.name == ORDER_TASK], report)
    _check_books(ledger_url, list(books.values()), report)
    assert check_ledger_consistent(ledger_url).tasks == TASKS_N + ORDERS_N + JOB_TASKS


def _check_books(ledger_url: str, tasks: list[Any], report: str) -> None:
    """The sharded job: its totals are the day's expected counts, and the ledger's counts
    per shard and for the job add up."""
    [job] = [i for i in tasks if "ratchet:shards" in i.params]
    assert job.state is State.SUCCEEDED, report
    assert len(tasks) == JOB_TASKS, report
    want = expected_counts(job.params["day"], job.params["count"])
    assert {k: job.result["totals"][k] for k in want} == want, report
    with Control(ledger_url) as control:
        check = control.check(job.task_id)
    assert check.ok and check.shards == SHORT.books_shards, check
    assert check.lines[-1].expected == SHORT.books_orders, check


def _check_orders(workdir: Path, orders: list[Any], report: str) -> None:
    """The order workflows, counted at the warehouse's and the payment service's files."""
    assert len(orders) == ORDERS_N, report
    warehouse = read_records(workdir / "warehouse.db").executions
    payments = read_records(workdir / "payments-orders.db").executions
    assert max(warehouse.values()) == 1 and max(payments.values()) == 1, report
    shipped = [i for i in orders if f"ship:{i.params['order_id']}" in warehouse]
    timed_out = [i for i in orders if i not in shipped]
    assert shipped and timed_out, report
    for info in orders:
        o = info.params["order_id"]
        counts = (warehouse.get(f"reserve:{o}", 0), warehouse.get(f"compensate:reserve:{o}", 0),
                  payments.get(f"charge:{o}", 0), payments.get(f"compensate:charge:{o}", 0))
        if info in shipped:
            assert (info.state, counts) == (State.SUCCEEDED, (1, 0, 1, 0)), (o, report)
            assert info.result["charge_id"] == read_stored(
                workdir / "payments-orders.db")[f"charge:{o}"]["id"], report
        else:
            assert (info.state, counts) == (State.COMPENSATED, (1, 1, 1, 1)), (o, report)
    # Events came late, while their order was parked (WAITING), and woke it.
    receipts = [r["body"] for k, r in read_stored(workdir / "warehouse.db").items()
                if k.startswith("notified:")]
    assert len(receipts) == len(shipped), report
    assert any(r["woken"] == 1 for r in receipts), report


def test_billing_kinds_tasks_guarantees_and_service_urls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ratchet.demo import billing
    from ratchet.demo.payments import KINDS, SERVICE_OPTIONS

    assert set(billing.TASKS) == set(billing.GUARANTEES) == set(SERVICE_OPTIONS) == set(KINDS)
    assert set(billing.TASKS.values()) <= set(billing.app.tasks)
    monkeypatch.setattr(billing, "_clients", {})
    monkeypatch.setenv("RATCHET_DEMO_PAYMENTS_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("RATCHET_DEMO_PAYMENTS_URL_FENCED", "http://127.0.0.1:2")
    try:
        assert billing.payment_client("fenced").base_url == "http://127.0.0.1:2"
        assert billing.payment_client("lookup").base_url == "http://127.0.0.1:1"
        assert billing.payment_client("fenced") is billing.payment_client("fenced")
        with pytest.raises(ConfigError, match="unknown payment target kind"):
            billing.payment_client("cheque")
    finally:
        for client in billing._clients.values():
            client.close()
    # in_flight_s of the lookup-only charge covers the slowest processing at the service.
    assert DemoSettings(slow_s=1.5, latency_s=0.35).effective_in_flight_s == 2.5
    assert DemoSettings(in_flight_s=7.0).effective_in_flight_s == 7.0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_fails_on_a_duplicate_its_kind_does_not_allow(ledger_url: str, tmp_path: Path) -> None:
    """The checks follow each kind's guarantee, not a blanket "no duplicates": with the
    ``idempotent`` service no longer honouring keys (``billing.charge`` still declares it
    idempotent), the frozen sender's late charge executes a second time and, the target
    being declared idempotent, no late effect explains it: the demo must fail on that kind
    alone."""
    out = io.StringIO()
    workdir = tmp_path / "demo"
    code = run_demo(
        ledger_url,
        tasks=40,
        workers=2,
        kills=0,
        seed=3,
        workdir=workdir,
        orders=0,
        settings=DemoSettings(
            arrival_s=1.0,
            batches=2,
            stall_s=30.0,
            honour_keys=False,
            reply_lost=0.0,
            burst_503=0.0,
            slow=0.0,
        ),
        console=Console(file=out, width=200, color_system=None),
    )
    report = out.getvalue()
    assert code == 1, report
    failed = [line for line in report.splitlines() if "FAIL" in line]
    assert any("idempotent:" in line and "executed more than once" in line for line in failed), (
        report
    )
    for kind in ("fenced", "lookup", "neither"):
        assert not any(f"{kind}:" in line for line in failed), report
    # At the service: the frozen sender's key was charged again by its late call...
    frozen = re.search(r"SIGSTOP idempotent: worker pid \d+ froze itself at .*: "
                       r"(charge:[\w-]+), generation \d+", report)
    assert frozen is not None, report
    assert "idempotent: the frozen sender's late charge: the service executed it" in report
    executions = read_records(workdir / "payments-idempotent.db").executions
    assert executions[frozen.group(1)] >= 2, (executions, report)
    # ...and no attempt charged twice: a key's executions are at most its task's claims (a
    # worker starved past its lease on a loaded machine is one more claim, and one more
    # charge, at a target that no longer deduplicates).
    led = open_ledger(ledger_url, migrate=False, must_exist=True)
    try:
        infos = [i for i in led.get_many(list_task_ids(ledger_url))
                 if i.name == TASKS["idempotent"]]
    finally:
        led.close()
    generations = {f"charge:{i.params['order_id']}": i.generation for i in infos}
    assert set(executions) <= set(generations), report
    assert all(n <= generations[k] for k, n in executions.items()), (executions, generations)


def test_warehouse_ships_by_its_plan_never_a_released_order(tmp_path: Path) -> None:
    """The shipper ships a reserved order once it is due by the plan, records the shipment
    before the event and the receipt after it, sends again after a failed send, and never
    ships an order whose reservation was released."""
    store = CountingStore(tmp_path / "warehouse.db", FaultSettings())
    sent: list[str] = []
    failing = {"b"}

    class Receipt:
        def __init__(self, order_id: str) -> None:
            self.event_id, self.seq, self.woken, self.duplicate = (
                f"shipped:{order_id}", len(sent), 1, False)

    def send(order_id: str, payload: dict[str, Any]) -> Receipt:
        assert payload == {"order_id": order_id, "tracking": f"TRK-{order_id}"}
        if order_id in failing:
            raise RatchetError("ledger away")
        sent.append(order_id)
        return Receipt(order_id)

    try:
        for o in ("a", "b", "c"):
            store.execute(f"reserve:{o}", {"order_id": o, "sku": "widget", "qty": 1})
        store.execute("compensate:reserve:c", {"order_id": "c", "release_of": "rs_1"})
        shipper = Shipper(store, tmp_path / "warehouse.db", ShipPlan(1.0, 1.0, 2.0, 5),
                          send=send)
        now = time.time()
        assert shipper.tick(now) == []  # not due yet
        assert shipper.tick(now + 3.0) == ["a"]  # b's send failed; c was released
        stored = read_stored(tmp_path / "warehouse.db")
        assert {"ship:a", "ship:b", "notified:a"} <= set(stored)
        assert "notified:b" not in stored and "ship:c" not in stored
        failing.clear()
        assert shipper.tick(now + 3.0) == ["b"]  # sent again, not shipped again
        assert shipper.tick(now + 9.0) == []
        assert read_records(tmp_path / "warehouse.db").executions["ship:b"] == 1
    finally:
        store.close()
    # The plan is a pure function of its seed and the order id.
    plan = ShipPlan(0.5, 1.0, 3.0, 11)
    draws = [plan.delay_s(f"o-{i}") for i in range(200)]
    assert draws == [ShipPlan(0.5, 1.0, 3.0, 11).delay_s(f"o-{i}") for i in range(200)]
    assert 60 < sum(1 for d in draws if d is None) < 140
    assert all(1.0 <= d <= 3.0 for d in draws if d is not None)


def test_the_warehouse_sends_shipped_to_the_ledger(ledger_url: str, tmp_path: Path) -> None:
    """The shipper's own sender (``App.send_event`` on the run's ledger, either backend):
    the event is stored under ``shipped:<order>``, and the receipt is recorded in the
    warehouse's file; nothing waited for it, so it woke nobody."""
    control = Control(ledger_url)
    control.migrate()  # create the ledger, as the demo's runner does first
    control.close()
    store = CountingStore(tmp_path / "warehouse.db", FaultSettings())
    shipper = Shipper(store, tmp_path / "warehouse.db", ShipPlan(1.0, 0.0, 0.0, 1),
                      ledger_url=ledger_url)
    try:
        store.execute("reserve:o-1", {"order_id": "o-1", "sku": "widget", "qty": 1})
        assert shipper.tick() == ["o-1"]
        assert shipper.tick() == []
    finally:
        shipper.stop()
        store.close()
    receipt = read_stored(tmp_path / "warehouse.db")["notified:o-1"]["body"]
    assert receipt["event_id"] == "shipped:o-1" and receipt["woken"] == 0, receipt
    assert receipt["duplicate"] is False


def test_the_demo_refuses_a_wait_shorter_than_the_warehouse(tmp_path: Path) -> None:
    out = io.StringIO()
    code = run_demo(None, tasks=4, workdir=tmp_path / "demo", orders=4,
                    settings=DemoSettings(ship_timeout_s=2.0, ship_max_s=3.0),
                    console=Console(file=out, width=160, color_system=None))
    assert code == 2 and "must be longer than the warehouse's latest shipment" in out.getvalue()


def test_the_order_verdict_breaks_on_each_violation() -> None:
    """The order invariants bite: an order counted wrong at the services, or ended in the
    wrong state, breaks exactly the invariant about it (so the demo exits 1)."""
    def order(i: int, state: State, counts: tuple[int, int, int, int],
              shipped: bool) -> OrderCounts:
        return OrderCounts(f"o-{i}", f"t-{i}", state, *counts, shipped=shipped, woke=None,
                           compensations=2 * counts[1])

    good = [order(i, State.SUCCEEDED, (1, 0, 1, 0), True) for i in range(15)] + [
        order(i, State.COMPENSATED, (1, 1, 1, 1), False) for i in range(15, 20)]

    def broken(orders: list[OrderCounts], stray: dict[str, int] | None = None) -> list[str]:
        r = OrderResult(orders, None, None, stray=stray or {})
        return [name.split(": ", 1)[1][:24] for name, ok, _ in order_invariants(r) if not ok]

    assert broken(good) == []
    cases = {
        "every reservation, relea": (1, order(1, State.SUCCEEDED, (1, 0, 2, 0), True)),
        "a refund only for a char": (16, order(16, State.COMPENSATED, (1, 1, 0, 1), False)),
        "every shipped order SUCC": (2, order(2, State.COMPENSATED, (1, 1, 1, 1), True)),
        "every order never shippe": (17, order(17, State.COMPENSATED, (1, 0, 1, 1), False)),
    }
    for name, (i, bad) in cases.items():
        assert name in broken([*good[:i], bad, *good[i + 1:]]), name
    assert broken(good, {"charge:elsewhere": 1}) == ["nothing reserved or char"]
    assert broken(good[:15] + [order(20, State.SUCCEEDED, (1, 0, 1, 0), True)] * 5) == [
        "both endings happened (s"]
