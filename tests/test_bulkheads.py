"""Bulkheads (DESIGN §8) at the ledger: cluster-wide caps per task type and per
tenant, a total of slots, reservations that are lent while idle and handed back (new claims
of borrowers refused) as soon as their owner has work, on both ledgers; the limits' control
API (audited) and its errors. Real processes: tests/test_bulkheads_processes.py."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, InvalidArguments, State, TaskContext, open_ledger
from ratchet.app import new_task_id
from ratchet.cli.main import cli
from ratchet.ledger.base import (
    Claim,
    EffectState,
    EffectWrite,
    Ledger,
    Limit,
    LimitScope,
    NewTask,
    TaskWrite,
    Transition,
)
from ratchet.ledger.bulkheads import UNLIMITED, allowance
from ratchet.serde import digest, dumps
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)

ALL = ["payment", "billing", "tracking", "bulk"]


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = open_ledger(ledger_url)
    yield led
    led.close()


def submit(ledger: Ledger, name: str, n: int, tenant: str | None = None) -> list[str]:
    tasks = []
    for _ in range(n):
        params = dumps({})
        tasks.append(NewTask(new_task_id(), name, 1, params, digest(name, params), None, 3,
                             30.0, tenant=tenant))
    ledger.submit(tasks)
    return [t.task_id for t in tasks]


def finish(ledger: Ledger, claims: list[Claim]) -> None:
    ledger.commit([TaskWrite(c.task_id, c.generation, "h", "complete",
                             transition=Transition(State.SUCCEEDED, result_json="null"))
                   for c in claims])


def names_of(claims: list[Claim]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in claims:
        out[c.name] = out.get(c.name, 0) + 1
    return out


def running(ledger: Ledger) -> dict[str, int]:
    out: dict[str, int] = {}
    for (name, _tenant), n in ledger.slot_usage().running.items():
        out[name] = out.get(name, 0) + n
    return out


def test_type_cap_holds_across_claimers_and_frees_on_the_fenced_write(
        ledger: Ledger, ledger_url: str) -> None:
    other = open_ledger(ledger_url)
    try:
        ledger.set_limit(LimitScope.TYPE, "tracking", 0, 2, "alice", "cap tracking")
        submit(ledger, "tracking", 6)
        submit(ledger, "bulk", 3)
        first = ledger.claim("a", ["tracking", "bulk"], 10)
        assert names_of(first) == {"tracking": 2, "bulk": 3}
        assert other.claim("b", ["tracking"], 10) == []
        finish(ledger, [c for c in first if c.name == "tracking"][:1])
        again = other.claim("b", ["tracking"], 10)
        assert names_of(again) == {"tracking": 1}
        assert other.claim("b", ["tracking"], 10) == []
        assert running(ledger) == {"tracking": 2, "bulk": 3}
    finally:
        other.close()


def test_expired_lease_keeps_its_slot_and_a_takeover_reuses_it(ledger: Ledger) -> None:
    ledger.set_limit(LimitScope.TYPE, "tracking", 0, 1, "alice", "one at a time")
    params = dumps({})
    short = NewTask(new_task_id(), "tracking", 1, params, digest("tracking", params), None, 3,
                    0.0)
    ledger.submit([short])
    [held] = ledger.claim("a", ["tracking"], 5)
    submit(ledger, "tracking", 3)
    # The lease (0 s) has expired: the slot is still the expired row's until someone takes
    # it over; the takeover is the one claim, no fresh task starts beside it.
    [taken] = ledger.claim("b", ["tracking"], 5)
    assert taken.task_id == held.task_id and taken.takeover
    assert running(ledger) == {"tracking": 1}
    # The old holder's write is fenced: it frees nothing.
    [stale] = ledger.commit([TaskWrite(held.task_id, held.generation, "a", "complete",
                                       transition=Transition(State.SUCCEEDED))])
    assert stale.stale and running(ledger) == {"tracking": 1}


def test_revocation_frees_the_slot(ledger: Ledger) -> None:
    ledger.set_limit(LimitScope.TYPE, "tracking", 0, 1, "alice", "one at a time")
    submit(ledger, "tracking", 2)
    assert len(ledger.claim("dead", ["tracking"], 5)) == 1
    assert ledger.claim("b", ["tracking"], 5) == []
    ledger.revoke_holder("dead", "test", "process gone")
    assert len(ledger.claim("b", ["tracking"], 5)) == 1


def test_tenant_cap_counts_every_type_and_does_not_hide_other_tenants(ledger: Ledger) -> None:
    ledger.set_limit(LimitScope.TENANT, "acme", 0, 2, "alice", "noisy tenant")
    submit(ledger, "tracking", 5, tenant="acme")
    submit(ledger, "billing", 5, tenant="acme")
    submit(ledger, "tracking", 3, tenant="globex")
    submit(ledger, "tracking", 2)
    claims = ledger.claim("a", ["tracking", "billing"], 20)
    info = {t.task_id: t for t in ledger.get_many([c.task_id for c in claims])}
    tenants: dict[str | None, int] = {}
    for c in claims:
        tenants[info[c.task_id].tenant] = tenants.get(info[c.task_id].tenant, 0) + 1
    assert tenants == {"acme": 2, "globex": 3, None: 2}
    assert ledger.claim("a", ["tracking", "billing"], 20) == []


def test_reserved_slots_are_lent_while_idle_and_handed_back(ledger: Ledger) -> None:
    """The 200 / payment 60 / billing 40 / tracking max 70 example, scaled down by 10."""
    for scope, name, reserved, maximum in [(LimitScope.TOTAL, "", 0, 20),
                                           (LimitScope.TYPE, "payment", 6, None),
                                           (LimitScope.TYPE, "billing", 4, None),
                                           (LimitScope.TYPE, "tracking", 0, 7)]:
        ledger.set_limit(scope, name, reserved, maximum, "alice", "bulkheads")
    # A burst of tracking work: capped at 7, payment's 6 (and billing's 4) stay free.
    submit(ledger, "tracking", 30)
    tracking = ledger.claim("w1", ALL, 50)
    assert names_of(tracking) == {"tracking": 7}
    submit(ledger, "payment", 8)
    payment = ledger.claim("w2", ["payment"], 50)
    assert len(payment) == 8  # its 6, plus 2 of the 13 free slots (billing is idle)
    finish(ledger, payment)
    # Idle reservations are lent: bulk (no limit of its own) borrows every free slot.
    submit(ledger, "bulk", 30)
    bulk = ledger.claim("w1", ["bulk"], 50)
    assert len(bulk) == 13 and running(ledger) == {"tracking": 7, "bulk": 13}
    # Payment gets work: no free slot (borrowers are not preempted)...
    submit(ledger, "payment", 10)
    assert ledger.claim("w2", ["payment"], 50) == []
    # ...and from now on each slot a borrower frees goes to payment, not to new borrowers,
    # until payment runs its 6.
    finish(ledger, bulk[:3])
    assert ledger.claim("w1", ["bulk", "tracking"], 50) == []
    assert len(ledger.claim("w2", ["payment"], 50)) == 3
    finish(ledger, bulk[3:6])
    assert ledger.claim("w1", ["bulk"], 50) == []
    assert len(ledger.claim("w2", ALL, 50)) == 3
    assert running(ledger)["payment"] == 6
    # Payment has its 6: a freed slot may be borrowed again (billing is still idle).
    finish(ledger, bulk[6:8])
    assert names_of(ledger.claim("w1", ["bulk"], 50)) == {"bulk": 2}
    # Billing gets work: its 4 are owed too; borrowers wait, billing takes what frees up.
    submit(ledger, "billing", 5)
    finish(ledger, bulk[8:10])
    assert ledger.claim("w1", ["bulk", "payment"], 50) == []
    assert names_of(ledger.claim("w3", ["billing"], 50)) == {"billing": 2}


@pytest.mark.parametrize("interleaved", [False, True])
def test_several_names_in_one_claim_share_the_pool(ledger: Ledger, interleaved: bool) -> None:
    """The claim takes every free slot: the owed ones and the pool. ``interleaved``: both
    names submitted in one transaction (equal ``run_at``, ordered by id), which once made
    the claim take 4 of 5 (the tenant dimension, without tenant limits, ranked rows the
    name filter dropped)."""
    ledger.set_limit(LimitScope.TOTAL, "", 0, 5, "alice", "five slots")
    ledger.set_limit(LimitScope.TYPE, "payment", 3, None, "alice", "keep three")
    if interleaved:
        params = dumps({})
        ledger.submit([NewTask(new_task_id(), name, 1, params, digest(name, params), None, 3,
                               30.0) for _ in range(10) for name in ("payment", "bulk")])
    else:
        submit(ledger, "payment", 10)
        submit(ledger, "bulk", 10)
    claims = ledger.claim("w", ["bulk", "payment"], 50)
    counts = names_of(claims)
    assert sum(counts.values()) == 5 and counts.get("payment", 0) >= 3


def test_concurrent_claimers_never_exceed_the_cap(ledger: Ledger, ledger_url: str) -> None:
    """Many claimers at once (threads with their own ledger objects; PostgreSQL READ
    COMMITTED): the RUNNING count of a capped type never goes over its cap."""
    ledger.set_limit(LimitScope.TYPE, "tracking", 0, 3, "alice", "three")
    for _ in range(4):
        submit(ledger, "tracking", 50)
    stop = threading.Event()
    errors: list[BaseException] = []
    over: list[int] = []

    def claimer(i: int) -> None:
        led = open_ledger(ledger_url)
        try:
            while not stop.is_set():
                got = led.claim(f"h{i}", ["tracking"], 4)
                if got:
                    finish(led, got)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            led.close()

    def observer() -> None:
        while not stop.is_set():
            n = running(ledger).get("tracking", 0)
            if n > 3:
                over.append(n)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)]
    threads.append(threading.Thread(target=observer))
    for t in threads:
        t.start()
    try:
        # Until every task ran (each claimer finishes what it claims at once).
        wait_for("the 200 tasks to finish", lambda: not ledger.slot_usage().ready
                 and not running(ledger), timeout_s=90)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert not over


def test_limits_control_api_is_audited_and_refuses_bad_limits(ledger_url: str,
                                                             ledger: Ledger) -> None:
    with Control(ledger_url) as control:
        control.set_limit("total", maximum=10, reason="cluster size", by="alice")
        lim = control.set_limit("type", "payment", reserved=6, reason="critical", by="bob")
        assert (lim.scope, lim.name, lim.reserved, lim.maximum, lim.version) == (
            LimitScope.TYPE, "payment", 6, None, 1)
        lim = control.set_limit("type", "payment", reserved=5, maximum=8, reason="tune",
                                by="bob")
        assert lim.version == 2 and lim.updated_by == "bob"
        with pytest.raises(InvalidArguments, match="add up to 12"):
            control.set_limit("type", "billing", reserved=7, reason="x", by="bob")
        with pytest.raises(InvalidArguments, match="exceeds maximum"):
            control.set_limit("type", "billing", reserved=3, maximum=2, reason="x", by="bob")
        with pytest.raises(InvalidArguments,
                           match=r"^maximum must be an integer from 1 to 2147483647, got 0 "
                                 r"\(to stop a type, pause it\)$"):
            control.set_limit("tenant", "acme", maximum=0, reason="x", by="bob")
        with pytest.raises(InvalidArguments, match="unknown limit scope"):
            control.set_limit("shard", "a", maximum=1, reason="x", by="bob")
        with pytest.raises(InvalidArguments, match="reason"):
            control.set_limit("type", "a", maximum=1, reason=" ", by="bob")
        with pytest.raises(InvalidArguments, match="no type limit 'nope'"):
            control.clear_limit("type", "nope", reason="x", by="bob")
        submit(ledger, "payment", 2)
        report = control.limits()
        by_name = {(v.scope, v.name): v for v in report.limits}
        assert by_name[("type", "payment")].ready == 2
        assert by_name[("total", "")].maximum == 10
        control.clear_limit("type", "payment", reason="done", by="carol")
        report = control.limits()
        assert [(v.scope, v.name) for v in report.limits] == [("total", "")]
        changes = [(e.kind, e.task_id, e.detail["operator"], e.detail["reason"])
                   for e in report.changes]
        assert changes == [
            ("limit_cleared", "limit:type:payment", "carol", "done"),
            ("limit_set", "limit:type:payment", "bob", "tune"),
            ("limit_set", "limit:type:payment", "bob", "critical"),
            ("limit_set", "limit:total", "alice", "cluster size"),
        ]
        assert report.changes[1].detail["previous"] == {"reserved": 6, "maximum": None}


def test_allowance_owes_reservations_and_pools_the_rest() -> None:
    limits = [Limit(LimitScope.TOTAL, "", 0, 10, 1, 0.0, "", ""),
              Limit(LimitScope.TYPE, "payment", 4, None, 1, 0.0, "", "")]
    plan = allowance(limits, ["a", "b", "payment"], 32, {("a", None): 2}, {"payment"}, set())
    # free 8, owed to payment 4: the pool others may take is 4.
    assert (plan.limit, plan.pool, plan.name_reserved) == (8, 4, [0, 0, 4])
    full = allowance(limits, ["a"], 32, {("a", None): 6}, {"payment"}, set())
    assert (full.pool, full.limit) == (0, 4)
    idle = allowance(limits, ["a"], 32, {("a", None): 6}, set(), set())
    # No tenant limit: the tenant dimension does not filter (the total is in ``limit``).
    assert idle.pool == 4 and idle.tenant_pool == UNLIMITED and idle.limit == 4
    uncapped = allowance([], ["a"], 32, {}, set(), set())
    assert uncapped.pool == UNLIMITED and uncapped.name_limits == [32]


def test_submit_with_tenant_and_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    app = App(url)

    @app.task(name="t")
    def t(ctx: TaskContext) -> None:
        return None

    handle = app.submit("t", {}, tenant="acme")
    assert handle.get().tenant == "acme"
    with pytest.raises(InvalidArguments, match="tenant"):
        app.submit("t", {}, tenant="")
    runner = CliRunner()
    out = runner.invoke(cli, ["limits", "set", "--type", "t", "--max", "2", "--reason",
                              "cap", "--operator", "alice", "--ledger", url])
    assert out.exit_code == 0, out.output
    out = runner.invoke(cli, ["limits", "--ledger", url])
    assert out.exit_code == 0 and "t" in out.output and "2" in out.output, out.output
    out = runner.invoke(cli, ["limits", "--json", "--ledger", url])
    assert '"maximum": 2' in out.output
    out = runner.invoke(cli, ["limits", "clear", "--type", "t", "--reason", "x",
                              "--ledger", url])
    assert out.exit_code == 0, out.output
    app.close()



def test_a_capped_name_does_not_shrink_the_claim_of_the_others(ledger: Ledger) -> None:
    ledger.set_limit(LimitScope.TYPE, "tracking", 0, 3, "alice", "cap")
    ledger.set_limit(LimitScope.TENANT, "acme", 0, 100, "alice", "a tenant limit too")
    for _ in range(20):  # interleaved in run_at order
        submit(ledger, "tracking", 1)
        submit(ledger, "bulk", 1, tenant="acme")
    claims = ledger.claim("w", ["tracking", "bulk"], 20)
    assert names_of(claims) == {"tracking": 3, "bulk": 17}


def submit_version(ledger: Ledger, name: str, version: int, n: int) -> list[str]:
    tasks = []
    for _ in range(n):
        params = dumps({})
        tasks.append(NewTask(new_task_id(), name, version, params, digest(name, params),
                             None, 3, 30.0))
    ledger.submit(tasks)
    return [t.task_id for t in tasks]


def test_a_type_cap_holds_across_versions(ledger: Ledger, ledger_url: str) -> None:
    """Versioned definitions (DESIGN §8) with bulkheads: a type's cap counts every version
    of it, whichever (name, version) pairs the claimers send."""
    ledger.set_limit(LimitScope.TYPE, "tracking", 0, 2, "alice", "cap across versions")
    v1 = submit_version(ledger, "tracking", 1, 3)
    v2 = submit_version(ledger, "tracking", 2, 3)
    other = open_ledger(ledger_url)
    try:
        # A claimer of both versions takes at most the cap in all.
        first = ledger.claim("a", [("tracking", 1), ("tracking", 2)], 10)
        assert len(first) == 2 and {c.task_id for c in first} <= set(v1 + v2)
        # The cap is full: a claimer of version 2 only gets nothing, though v2 is ready.
        assert other.claim("b", [("tracking", 2)], 10) == []
        finish(ledger, first[:1])
        [again] = other.claim("b", [("tracking", 2)], 10)
        assert again.task_id in v2 and again.version == 2
        # A bare name (every version) beside a pair of it: still the cap, never a task
        # counted twice.
        assert ledger.claim("c", ["tracking", ("tracking", 1)], 10) == []
        finish(ledger, [again])
        [third] = ledger.claim("c", ["tracking", ("tracking", 1)], 10)
        assert third.task_id in set(v1 + v2) - {c.task_id for c in [*first, again]}
        assert running(ledger) == {"tracking": 2}
    finally:
        other.close()


def test_a_type_capped_at_one_never_runs_two_versions_at_once(ledger_url: str) -> None:
    """Real workers, one per version of a type capped at 1 (each with several task
    threads): the executed intervals never overlap, and both versions run."""
    intervals: list[tuple[float, float, int]] = []
    lock = threading.Lock()

    def make(version: int) -> App:
        app = App(ledger_url)

        @app.task(name="bh.versioned", version=version, lease_s=30.0)
        def run(ctx: TaskContext, i: int) -> int:
            start = time.monotonic()
            time.sleep(0.02)  # long enough for the other worker's claim to race it
            with lock:
                intervals.append((start, time.monotonic(), version))
            return version

        return app

    app1, app2 = make(1), make(2)
    with Control(ledger_url) as control:
        control.migrate()
        control.set_limit("type", "bh.versioned", maximum=1, reason="one at a time",
                          by="alice")
    ids = [app.submit("bh.versioned", {"i": i}).task_id
           for i in range(6) for app in (app1, app2)]
    with running_worker(app1, concurrency=3, holder="w-v1"), \
            running_worker(app2, concurrency=3, holder="w-v2"):
        wait_for("every task to succeed",
                 lambda: all(app1.get(i).state is State.SUCCEEDED for i in ids), 60.0)
    assert sorted(app1.get(i).result for i in ids) == [1] * 6 + [2] * 6
    assert {v for _, _, v in intervals} == {1, 2} and len(intervals) == 12
    ordered = sorted(intervals)
    for (_, end, _), (start, _, _) in itertools.pairwise(ordered):
        assert end <= start, ordered  # one at a time, across versions
    app1.close()
    app2.close()


# ---------------------------------------------------------------------- bulkheads x control


def test_a_paused_capped_type_claims_nothing_and_resume_readmits_it_within_its_cap(
        ledger: Ledger, ledger_url: str) -> None:
    """A type capped at 2 and paused: no claimer gets its tasks (alone or beside an
    uncapped type, which still runs); after resume it is claimed again, at most its cap at
    once across claimers, and a finished task frees exactly one slot."""
    other = open_ledger(ledger_url)
    try:
        ledger.set_limit(LimitScope.TYPE, "capped", 0, 2, "alice", "cap it")
        submit(ledger, "capped", 5)
        submit(ledger, "free", 2)
        paused = ledger.pause("type", "capped", "incident", "bob")
        assert paused.outcome == "done"
        assert ledger.claim("a", ["capped"], 10) == []
        assert names_of(ledger.claim("a", ["capped", "free"], 10)) == {"free": 2}
        assert other.claim("b", ["capped", "free"], 10) == []
        assert running(ledger) == {"free": 2}
        assert ledger.resume("type", "capped", "fixed", "bob").outcome == "done"
        first = ledger.claim("a", ["capped", "free"], 10)
        assert names_of(first) == {"capped": 2}
        assert other.claim("b", ["capped"], 10) == []
        finish(ledger, first[:1])
        assert names_of(other.claim("b", ["capped"], 10)) == {"capped": 1}
        assert other.claim("b", ["capped"], 10) == []
        assert running(ledger) == {"capped": 2, "free": 2}
    finally:
        other.close()


def test_a_limited_claim_carries_the_tasks_control_request(ledger: Ledger) -> None:
    """A cancel requested while an effect intent is open (the task waits to retry) is
    handed to the next holder with the claim: claim_limited returns control_request as
    claim_ready does, so the holder settles the effect by lookup and then cancels."""
    ledger.set_limit(LimitScope.TYPE, "capped", 0, 1, "alice", "one at a time")
    [task_id] = submit(ledger, "capped", 1)
    [claim] = ledger.claim("a", ["capped"], 1)
    assert claim.control_request is None
    intent = EffectWrite("charge", "k-1", "d", EffectState.INTENT)
    [ok] = ledger.commit([TaskWrite(task_id, claim.generation, "a", "fail", effects=[intent],
                                    transition=Transition(State.RETRY_WAIT, error="x"))])
    assert ok.ok
    out = ledger.cancel(task_id, "customer left", "bob")
    assert (out.outcome, out.state) == ("requested", State.RETRY_WAIT)
    [again] = ledger.claim("b", ["capped"], 1)
    assert again.task_id == task_id and again.control_request == "cancel"



@pytest.mark.parametrize("scope", [LimitScope.TYPE, LimitScope.TENANT])
def test_a_paused_types_reservation_is_lent_out_like_an_idle_one(
        ledger: Ledger, scope: LimitScope) -> None:
    """A total of 4 with 3 reserved for payment (by type, or by its tenant): while payment
    is paused its PENDING backlog is not ready work, so borrowers may take every slot (a
    paused owner is not owed its reservation); after resume it is owed again: borrowers
    get nothing more and payment takes the free slots."""
    ledger.set_limit(LimitScope.TOTAL, "", 0, 4, "alice", "four slots")
    ledger.set_limit(scope, "payment" if scope is LimitScope.TYPE else "acme", 3, None,
                     "alice", "keep three")
    submit(ledger, "payment", 4, tenant="acme")
    submit(ledger, "bulk", 10)
    first = ledger.claim("w1", ["bulk"], 10)
    assert names_of(first) == {"bulk": 1}  # 3 of the 4 owed to payment
    finish(ledger, first)
    assert ledger.pause("type", "payment", "psp incident", "bob").outcome == "done"
    lent = ledger.claim("w1", ["bulk", "payment"], 10)
    assert names_of(lent) == {"bulk": 4}
    finish(ledger, lent[:2])
    assert ledger.resume("type", "payment", "psp back", "bob").outcome == "done"
    assert ledger.claim("w1", ["bulk"], 10) == []  # the 2 free slots are owed to payment
    assert names_of(ledger.claim("w2", ["bulk", "payment"], 10)) == {"payment": 2}
