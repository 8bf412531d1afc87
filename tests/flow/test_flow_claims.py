"""Flow control at claim, on both ledgers (DESIGN §8, flow control): named queues,
priorities, concurrency keys (and their order), fairness across tenants, and rate
limits. Claims are made through the ledger the way a worker makes them
(``Ledger.claim`` with the worker's :class:`ClaimScope`); one test runs real workers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ratchet import App, RateLimit, State
from ratchet.control import Control
from ratchet.ledger.base import ClaimScope, TaskWrite, Transition
from ratchet.testing.processes import wait_for
from ratchet.testing.worker import running_worker

ALL = ClaimScope()


def _finish(app: App, claims: list[Any], to: State = State.SUCCEEDED) -> None:
    """End each claimed task with its holder's fenced final write."""
    outcomes = app.ledger.commit([
        TaskWrite(c.task_id, c.generation, c.task_id and "w", "complete",
                  transition=Transition(to, result_json="null")
                  if to is State.SUCCEEDED else Transition(to, error="boom"))
        for c in claims])
    assert all(o.ok for o in outcomes), outcomes


def _ids(claims: list[Any]) -> list[str]:
    return [c.task_id for c in claims]


def test_a_worker_serving_one_queue_never_claims_another(app: App) -> None:
    @app.task("bulk.reindex", queue="bulk")
    def reindex(ctx: Any, n: int) -> None:
        return None

    @app.task("web.notify")
    def notify(ctx: Any, n: int) -> None:
        return None

    bulk = [app.submit("bulk.reindex", {"n": i}).task_id for i in range(20)]
    moved = app.submit("web.notify", {"n": 0}, queue="critical").task_id
    plain = app.submit("web.notify", {"n": 1}).task_id
    names = ["bulk.reindex", "web.notify"]
    critical = app.ledger.claim("w-crit", names, 50, ClaimScope(queues=("critical",)))
    assert _ids(critical) == [moved]
    default = app.ledger.claim("w-def", names, 50, ClaimScope(queues=("default",)))
    assert _ids(default) == [plain]
    assert app.ledger.claim("w-def", names, 50, ClaimScope(queues=("default",))) == []
    rest = app.ledger.claim("w-any", names, 50, ALL)
    assert sorted(_ids(rest)) == sorted(bulk)
    assert {app.get(t).queue for t in bulk} == {"bulk"}


def test_higher_priority_first_then_fifo(app: App) -> None:
    @app.task("p.work")
    def work(ctx: Any, n: int) -> None:
        return None

    low = [app.submit("p.work", {"n": i}).task_id for i in range(5)]
    neg = app.submit("p.work", {"n": 90}, priority=-1).task_id
    high = [app.submit("p.work", {"n": 100 + i}, priority=5).task_id for i in range(2)]
    top = app.submit("p.work", {"n": 200}, priority=9).task_id
    order = [c.task_id for _ in range(9) for c in app.ledger.claim("w", ["p.work"], 1, ALL)]
    assert order == [top, *high, *low, neg]


def test_a_later_high_priority_task_goes_before_a_big_backlog(app: App) -> None:
    @app.task("p.bulk")
    def work(ctx: Any, n: int) -> None:
        return None

    from ratchet import SubmitRequest
    app.submit_many([SubmitRequest("p.bulk", {"n": i}) for i in range(5000)])
    urgent = app.submit("p.bulk", {"n": -1}, priority=10).task_id
    # One claim round (a worker's batch) takes it first.
    assert urgent in _ids(app.ledger.claim("w", ["p.bulk"], 8, ALL))


def test_a_concurrency_key_runs_one_at_a_time_in_submit_order(app: App) -> None:
    @app.task("acct.update", concurrency_key=lambda p: p["account"], ordered=True)
    def update(ctx: Any, account: str, n: int) -> None:
        return None

    a = [app.submit("acct.update", {"account": "a", "n": i}).task_id for i in range(4)]
    b = [app.submit("acct.update", {"account": "b", "n": i}).task_id for i in range(2)]
    assert app.get(a[1]).state is State.WAITING
    ran: list[str] = []
    for _ in range(10):
        claims = app.ledger.claim("w", ["acct.update"], 10, ALL)
        if not claims:
            break
        # Never two tasks of one key at once.
        assert len({app.get(c.task_id).params["account"] for c in claims}) == len(claims)
        ran += _ids(claims)
        _finish(app, claims, State.FAILED if claims[0].task_id == a[1] else State.SUCCEEDED)
    assert [t for t in ran if t in a] == a  # a failed task frees its key too
    assert [t for t in ran if t in b] == b


def test_max_per_key_caps_running_tasks_of_a_key(app: App) -> None:
    @app.task("k.sync", concurrency_key=lambda p: p["shop"], max_per_key=2)
    def sync(ctx: Any, shop: str, n: int) -> None:
        return None

    for i in range(6):
        app.submit("k.sync", {"shop": "s1", "n": i})
    first = app.ledger.claim("w", ["k.sync"], 10, ALL)
    assert len(first) == 2
    assert app.ledger.claim("w", ["k.sync"], 10, ALL) == []
    _finish(app, first[:1])
    assert len(app.ledger.claim("w", ["k.sync"], 10, ALL)) == 1


def test_an_operator_cancel_of_the_holder_frees_the_key(app: App) -> None:
    @app.task("k.order", concurrency_key=lambda p: p["k"], ordered=True)
    def order(ctx: Any, k: str, n: int) -> None:
        return None

    first = app.submit("k.order", {"k": "x", "n": 0}).task_id
    second = app.submit("k.order", {"k": "x", "n": 1}).task_id
    app.cancel(first, reason="test")
    assert app.get(second).state is State.PENDING
    assert _ids(app.ledger.claim("w", ["k.order"], 5, ALL)) == [second]


def test_a_retried_dead_letter_waits_for_its_key_again(app: App) -> None:
    @app.task("k.retry", concurrency_key=lambda p: p["k"], ordered=True)
    def order(ctx: Any, k: str, n: int) -> None:
        return None

    first = app.submit("k.retry", {"k": "x", "n": 0}).task_id
    [c] = app.ledger.claim("w", ["k.retry"], 5, ALL)
    _finish(app, [c], State.FAILED)
    second = app.submit("k.retry", {"k": "x", "n": 1}).task_id
    [c2] = app.ledger.claim("w", ["k.retry"], 5, ALL)
    assert c2.task_id == second
    app.retry(first, reason="fixed")  # the key is held by `second`: it waits
    info = app.get(first)
    assert info.state is State.WAITING
    _finish(app, [c2])
    assert _ids(app.ledger.claim("w", ["k.retry"], 5, ALL)) == [first]


def test_fairness_bounds_a_small_tenants_wait_behind_a_burst(app: App) -> None:
    @app.task("f.work", fair=True)
    def work(ctx: Any, n: int) -> None:
        return None

    from ratchet import SubmitRequest
    app.submit_many([SubmitRequest("f.work", {"n": i}, tenant="A") for i in range(10_000)])
    small = app.submit("f.work", {"n": -1}, tenant="B").task_id
    scope = ClaimScope(fair=frozenset({"f.work"}))
    rounds = 0
    while True:
        rounds += 1
        claims = app.ledger.claim("w", ["f.work"], 1, scope)
        if small in _ids(claims):
            break
        assert rounds < 3, "B waited more than two claim rounds behind A's burst"


def test_a_rate_limit_defers_what_its_bucket_cannot_pay(app: App) -> None:
    @app.task("r.call", rate_limit=RateLimit("10/s", burst=5))
    def call(ctx: Any, n: int) -> None:
        return None

    _set_limit(app, "r.call", 10.0, 5)
    ids = [app.submit("r.call", {"n": i}).task_id for i in range(20)]
    first = app.ledger.claim("w", ["r.call"], 20, ALL)
    assert len(first) == 5
    waiting = [app.get(t) for t in ids if t not in _ids(first)]
    assert {w.flow_wait for w in waiting} == {"rate"}
    assert all(w.state is State.PENDING for w in waiting)
    assert all(w.attempt == 0 for w in waiting)  # no attempt spent


def _set_limit(app: App, name: str, per_s: float | str, burst: int) -> None:
    """The type's limit, set by an operator."""
    assert app.ledger_url is not None and app.ledger is not None  # created
    rate = per_s if isinstance(per_s, str) else f"{per_s:g}/s"
    with Control(app.ledger_url) as control:
        control.set_rate_limit(name, rate, burst=burst, reason="test")


def test_a_worker_serving_critical_only_never_runs_default_tasks(app: App) -> None:
    ran: list[str] = []

    @app.task("q.fast", queue="critical")
    def fast(ctx: Any, n: int) -> None:
        ran.append(f"fast-{n}")

    @app.task("q.slow")
    def slow(ctx: Any, n: int) -> None:
        ran.append(f"slow-{n}")

    slow_ids = [app.submit("q.slow", {"n": i}).task_id for i in range(5)]
    fast_ids = [app.submit("q.fast", {"n": i}).task_id for i in range(5)]
    moved = app.submit("q.slow", {"n": 99}, queue="critical").task_id
    with running_worker(app, concurrency=2, queues=["critical"]):
        for task_id in [*fast_ids, moved]:
            assert app.wait(task_id, timeout_s=30).state is State.SUCCEEDED
    assert sorted(ran) == sorted([f"fast-{i}" for i in range(5)] + ["slow-99"])
    assert {app.get(t).state for t in slow_ids} == {State.PENDING}


def test_concurrent_submitters_and_finishers_never_overfill_a_key(ledger_url: str) -> None:
    """Eight submitters and four claimers (each with its own App and connections) on three
    keys of max_per_key=2: at every snapshot at most two tasks of a key hold a slot or
    run, and every task ends (none is left waiting with a free slot)."""
    import threading

    def make() -> App:
        a = App(ledger_url)

        @a.task("k.race", concurrency_key=lambda p: p["k"], max_per_key=2)
        def race(ctx: Any, k: str, n: int) -> None:
            return None

        return a

    watcher = make()
    assert watcher.ledger is not None  # opens (creates) it before the others look at it
    apps = [watcher, *(make() for _ in range(11))]
    total = 8 * 30
    stop = threading.Event()
    errors: list[BaseException] = []
    done: list[int] = []

    def submitter(a: App, w: int) -> None:
        try:
            for i in range(30):
                a.submit("k.race", {"k": f"k{(w + i) % 3}", "n": w * 100 + i})
        except BaseException as exc:  # reported below
            errors.append(exc)

    def claimer(a: App, w: int) -> None:
        try:
            while not stop.is_set():
                claims = a.ledger.claim(f"c{w}", ["k.race"], 3, ALL)
                if claims:
                    _finish(a, claims)
                    done.append(len(claims))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=submitter, args=(apps[i], i)) for i in range(8)]
    threads += [threading.Thread(target=claimer, args=(apps[8 + i], i)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    try:
        while sum(done) < total and time.monotonic() < deadline and not errors:
            page = watcher.list_tasks(limit=1000).tasks
            holding: dict[str, int] = {}
            for info in page:
                if info.state in (State.PENDING, State.RUNNING) and info.key_slot:
                    holding[info.params["k"]] = holding.get(info.params["k"], 0) + 1
            assert all(n <= 2 for n in holding.values()), holding
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    assert sum(done) == total
    states = {t.state for t in watcher.list_tasks(limit=1000).tasks}
    assert states == {State.SUCCEEDED}
    for a in apps:
        a.close()


def test_a_fair_task_without_a_tenant_runs(app: App) -> None:
    @app.task("f.none", fair=True)
    def work(ctx: Any, n: int) -> None:
        return None

    alone = app.submit("f.none", {"n": 0}).task_id  # fairness key "" (no tenant)
    scope = ClaimScope(fair=frozenset({"f.none"}))
    assert _ids(app.ledger.claim("w", ["f.none"], 5, scope)) == [alone]
    later = app.submit("f.none", {"n": 1}).task_id
    assert _ids(app.ledger.claim("w", ["f.none"], 5, scope)) == [later]


def test_tenants_with_only_later_tasks_do_not_hide_the_ones_after_them(app: App) -> None:
    @app.task("f.later", fair=True)
    def work(ctx: Any, n: int) -> None:
        return None

    from ratchet import SubmitRequest
    app.submit_many([SubmitRequest("f.later", {"n": i}, tenant=f"t{i:03d}", delay_s=3600)
                     for i in range(100)])
    ready = app.submit("f.later", {"n": -1}, tenant="zzz").task_id
    scope = ClaimScope(fair=frozenset({"f.later"}))
    assert _ids(app.ledger.claim("w", ["f.later"], 4, scope)) == [ready]


def test_tasks_stored_without_a_fairness_key_are_not_starved(app: App) -> None:
    @app.task("f.mixed", fair=True)
    def work(ctx: Any, n: int) -> None:
        return None

    unfair = App(app.ledger_url)

    @unfair.task("f.mixed")  # the same type, declared without fairness
    def same(ctx: Any, n: int) -> None:
        return None

    from ratchet import SubmitRequest
    app.submit_many([SubmitRequest("f.mixed", {"n": i}, tenant=f"t{i % 50}")
                     for i in range(500)])
    plain = unfair.submit("f.mixed", {"n": -1}).task_id
    scope = ClaimScope(fair=frozenset({"f.mixed"}))
    seen: list[str] = []
    for _ in range(40):  # a claim with room, or one in FAIR_UNKEYED_EVERY, reaches it
        seen += _ids(app.ledger.claim("w", ["f.mixed"], 4, scope))
        if plain in seen:
            break
    assert plain in seen
    unfair.close()


def test_raising_a_rate_limit_rechecks_the_tasks_it_held_back(app: App) -> None:
    @app.task("r.slow", rate_limit=RateLimit("1/d", burst=1))
    def call(ctx: Any, n: int) -> None:
        return None

    _set_limit(app, "r.slow", "1/d", 1)
    ids = [app.submit("r.slow", {"n": i}).task_id for i in range(4)]
    assert len(app.ledger.claim("w", ["r.slow"], 4, ALL)) == 1
    held = [t for t in ids if app.get(t).flow_wait == "rate"]
    assert len(held) == 3
    assert all(app.get(t).run_at > time.time() + 3600 for t in held)
    _set_limit(app, "r.slow", 100.0, 10)
    # Due again at once; each then takes a token of the bucket at its new rate.
    assert all(app.get(t).run_at < time.time() + 5 for t in held)
    taken: list[str] = []

    def claimed_all() -> bool:
        taken.extend(_ids(app.ledger.claim("w", ["r.slow"], 4, ALL)))
        return len(taken) >= 3

    wait_for("the held tasks to be claimed at the new rate", claimed_all, 30.0)
    assert sorted(taken) == sorted(held)


def test_queue_names_a_worker_could_not_serve_are_refused(app: App) -> None:
    from ratchet.errors import ConfigError, InvalidArguments

    @app.task("q.names")
    def work(ctx: Any) -> None:
        return None

    for bad in ("a,b", " padded", "x "):
        with pytest.raises(InvalidArguments, match="queue name"):
            app.submit("q.names", queue=bad)
        with pytest.raises(ConfigError):
            app.task("q.bad", queue=bad)
