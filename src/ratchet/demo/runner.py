"""``ratchet demo``: billing tasks against four faulty payment services and order workflows
against a warehouse while workers are killed and frozen senders wake up late.

:func:`run_demo` is the main job. In about a minute it:

1. starts four fake payment services (:mod:`ratchet.demo.payments`), one per kind of
   target (:data:`~ratchet.demo.payments.KINDS`), each in its own process with its own
   SQLite file and faults on — dropped replies after charging, bursts of 503, slow replies
   that outlast the client's read timeout: one honours the idempotency key, one checks
   fencing tokens, one only answers lookups, one offers neither;
2. submits ``tasks`` billing tasks (:data:`~ratchet.demo.billing.TASKS`, the kinds in
   turn) with idempotency keys, in batches spread over the run, and resubmits a few keys
   to show that submit dedupe returns the same task id; and, among them, ``orders`` order
   workflows (:mod:`ratchet.demo.orders`: reserve at the warehouse, charge, wait for the
   ``shipped`` event, compensated when it does not come), against a warehouse
   (:mod:`ratchet.demo.warehouse`, which ships most orders a few seconds after their
   reservation and never ships some) and a payment service of their own, both faulty;
3. runs ``workers`` real worker processes
   (``python -m ratchet.cli.main worker ratchet.demo.orders:app --concurrency 8``: the
   billing app with the order workflow), and, once they run, submits a sharded job
   (:mod:`ratchet.demo.books`: yesterday's orders reconciled with ``ctx.batches`` over a
   few shards, through the kills below, one of them aimed at a worker holding a shard
   under way; its totals checked with ``Control.check``);
4. kills a random worker with a real ``SIGKILL`` at random moments (at least ``kills``
   times) and restarts it;
5. freezes one sender per kind in the middle of a call: a worker process for that kind's
   task only, started with ``RATCHET_PAUSE_AT=effect.before_call`` (before the workers of
   step 3, so it finds a task of its kind), stops itself with ``SIGSTOP`` after its last
   lease check and before its charge leaves. It stays frozen
   past its lease until another worker has taken its task over and settled it, then gets
   ``SIGCONT`` and sends its charge late (the faults of that one service are paused for
   that moment, so the report shows what the target does with a late charge, not an
   injected fault): the idempotent service answers it as a replay, the fenced service
   refuses its stale token, the lookup-only service executes it a second time (a duplicate
   the ledger records as a late effect), the service with neither executes it once while
   the task waits in ``UNKNOWN`` (the new holder could not know), again recorded as a late
   effect;
6. shows live progress, then a report read from the ledger *and* from each payment
   service's own SQLite file, which is the only proof of how often each charge executed:
   per kind of target, the executions, duplicates, late effects, refused tokens and
   ``UNKNOWN`` tasks, against that kind's guarantee; per order workflow, its reservation,
   release, charge and refund counted at the warehouse and the payment service, against
   whether the warehouse shipped it (:mod:`~ratchet.demo.order_judging`); and how fast
   the killed workers' tasks were claimed again (same-host peers revoke a dead holder's
   leases instead of waiting for them to expire).

The ledger is a fresh SQLite file in the work directory, or a PostgreSQL schema
(``--ledger postgresql://...``): the URL's ``schema=``, else :data:`DEMO_PG_SCHEMA`. That
one schema is dropped (``DROP SCHEMA ... CASCADE``) and created empty at the start of every
run, and only if it is absent or was made by an earlier demo (its comment says so); any
other existing schema is refused, and nothing else in the database is touched.

The run lasts as long as the workload needs: after the chaos, it drains while tasks keep
settling, and gives up only when nothing has moved for :attr:`DemoSettings.stall_s`
seconds (a stall), or at the optional hard cap :attr:`DemoSettings.deadline_s`.

The parts: :mod:`~ratchet.demo.settings` (the knobs), :mod:`~ratchet.demo.prepare` (work
dir, PostgreSQL schema), :mod:`~ratchet.demo.state` (what the parts share),
:mod:`~ratchet.demo.chaos` (kills, frozen senders), :mod:`~ratchet.demo.judging` (the
verdict), :mod:`~ratchet.demo.display` (progress and report); this module runs them.

Process control and the checks are :mod:`ratchet.testing`'s (the same ones users get for
their own suites): worker processes are :class:`~ratchet.testing.WorkerProcess`es, the
payment services are counting services, and the verdict comes from
:func:`~ratchet.testing.check_exactly_once` (per service) and
:func:`~ratchet.testing.check_ledger_consistent`; operator reads (status, late effects)
go through :class:`ratchet.Control`.

It exits 1 if an invariant is broken. The checks follow each kind's guarantee:

* idempotent and fenced: every succeeded task's key executed exactly once, no key more
  than once, no task in ``UNKNOWN``; fenced: the frozen sender's late charge refused;
* lookup only: no duplicate that the ledger did not record as a late effect (the frozen
  sender's duplicate is expected *and* must be recorded); every other key exactly once;
* neither: no key more than once; tasks in ``UNKNOWN`` allowed (a person settles them),
  each with its key executed at most once;

* order workflows: every reservation, charge, release and refund at most once; a refund
  only for a charge, a release only for a reservation; every shipped order ``SUCCEEDED``
  and neither refunded nor released; every order never shipped ``COMPENSATED``, refunded
  and released;

and for all: a charge no task accounts for, a task left unfinished (stall), an
inconsistent ledger, fewer kills than asked, a frozen sender missing, or a resubmission
that was not deduplicated.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from .. import ConfigError, Control, RatchetError, State, SubmitRequest
from ..config import parse_ledger_url
from ..loading import load_app
from .books import RECONCILE_TASK
from .chaos import Chaos
from .display import print_report, progress
from .judging import fmt_states, judge
from .payments import KINDS, SERVICE_OPTIONS, PaymentServiceError, start_payment_service
from .prepare import demo_pg_url, display_url, prepare_workdir, reset_pg_schema
from .settings import (
    DEMO_APP,
    DEMO_PG_SCHEMA,
    FREEZE_HEAD_START_S,
    GUARANTEES,
    ORDER_KIND,
    SETTLED,
    TASK_OF,
    TASKS,
    DemoSettings,
)
from .state import RunState, Snapshot
from .warehouse import ShipPlan, start_warehouse

__all__ = [
    "DEMO_PG_SCHEMA",
    "DemoSettings",
    "demo_pg_url",
    "reset_pg_schema",
    "run_demo",
]


class _DemoRun:
    """The main loop of one run (:meth:`run`): submissions, worker start, chaos, the
    progress panel, the end (every task settled, a stall, or the hard deadline)."""

    def __init__(self, console: Console, st: RunState, chaos: Chaos, notes: list[str]) -> None:
        self.console = console
        self.st = st
        self.s = st.settings
        self.chaos = chaos
        self.notes = notes

    def run(self) -> int:
        """Run the demo: services, submissions, workers, chaos, until every task settled
        (or a stall or the hard deadline), then judge it and print the report; the exit
        status (0 every invariant held, 1 one broke)."""
        s, st, chaos = self.s, self.st, self.chaos
        self.console.print(
            f"[bold]ratchet demo[/]: {st.n_billing} billing tasks over {len(KINDS)} kinds of "
            f"payment target and {st.n_orders} order workflows, "
            f"{len(chaos.slots)} workers x {s.concurrency} threads, "
            f"{chaos.kills_asked} kills, "
            f"{'a frozen sender per kind, ' if chaos.freezes else ''}seed {st.seed}, "
            f"lease {st.lease_s:.1f} s"
            + (f"; a sharded job reconciling {s.books_orders} orders over {s.books_shards} "
               "shards" if s.books_orders else "")
        )
        self.console.print(f"ledger  {display_url(st.ledger_url)}\nworkdir {st.workdir}")
        for note in self.notes:
            self.console.print(note)
        self._start_services()
        st.control.migrate()
        # The would-be frozen senders start first, and the workers only once each of them
        # has frozen (or after FREEZE_HEAD_START_S): each finds a task of its kind however
        # fast the workers would drain the queue.
        for fz in chaos.freezes.values():
            chaos.start_freezer(fz)
        workers_started = False

        batches = max(1, min(s.batches, st.n_tasks))
        per_batch = -(-st.n_tasks // batches)
        submit_at = [s.arrival_s * i / batches for i in range(batches)]
        # Kills at random points of progress: one in each of `kills` equal slices of
        # [chaos_from, chaos_to].
        span = s.chaos_to - s.chaos_from
        kill_at = sorted(
            s.chaos_from + span * (k + st.rng.uniform(0.1, 0.9)) / max(1, chaos.kills_asked)
            for k in range(chaos.kills_asked)
        )
        last_kill = -1e9
        resubmitted = False

        st.t0 = time.monotonic()
        deadline = s.deadline_s
        snap = Snapshot(Counter(), {})
        # The deadline follows the workload: the run ends when every task settled, and
        # fails only when nothing moved (no state change, no takeover) for stall_s.
        last_fingerprint: tuple[Any, ...] = ()
        last_change = 0.0
        with Live(progress(st, chaos, snap), console=self.console, refresh_per_second=4,
                  transient=False) as live:
            while True:
                t = st.now()
                # submissions
                while submit_at and submit_at[0] <= t:
                    submit_at.pop(0)
                    self._submit(per_batch)
                if not resubmitted and st.submitted >= min(st.n_tasks, s.resubmits):
                    resubmitted = True
                    self._resubmit()
                if not workers_started and (
                    all(f.state != "waiting" for f in chaos.freezes.values())
                    or t >= FREEZE_HEAD_START_S
                ):
                    workers_started = True
                    for slot in chaos.slots:
                        chaos.start_worker(slot)
                    self._submit_books()  # with the workers: it runs through the chaos
                    if chaos.freezes:
                        st.log(f"{len(chaos.slots)} workers started (frozen senders "
                               "in place)")
                # liveness: a worker that died by itself is restarted (and reported)
                chaos.restart_exited()
                snap = st.snapshot()
                settled = sum(snap.states[x] for x in SETTLED)
                done = settled / st.n_tasks
                # chaos
                if (
                    kill_at
                    and kill_at[0] <= done
                    and time.monotonic() - last_kill >= s.min_kill_gap_s
                    and chaos.kill_one(snap)
                ):
                    kill_at.pop(0)
                    last_kill = time.monotonic()
                    snap = st.snapshot()
                if (
                    st.books_job is not None
                    and not chaos.shard_kill_done
                    and time.monotonic() - last_kill >= s.min_kill_gap_s
                    and chaos.kill_shard_holder(snap)
                ):
                    last_kill = time.monotonic()
                    snap = st.snapshot()
                chaos.tend_freezes(snap)
                live.update(progress(st, chaos, snap))
                # done?
                chaos_over = not kill_at and all(f.finished for f in chaos.freezes.values())
                books = self._books_state()
                if (
                    st.submitted >= st.n_tasks
                    and not submit_at
                    and chaos_over
                    and settled == len(st.task_ids)
                    and books in ("", *(x.value for x in SETTLED))
                ):
                    break
                fingerprint = (
                    tuple(sorted((state.value, n) for state, n in snap.states.items())),
                    books,
                    snap.takeovers,
                    snap.revocations,
                    tuple(f.state for f in chaos.freezes.values()),
                )
                if fingerprint != last_fingerprint:
                    last_fingerprint, last_change = fingerprint, t
                elif st.submitted >= st.n_tasks and t - last_change >= s.stall_s:
                    st.stalled = True
                    st.log(
                        f"[red]stalled: no task changed state for {s.stall_s:.0f} s[/] "
                        f"({fmt_states(snap.states)})"
                    )
                    live.update(progress(st, chaos, snap))
                    break
                if deadline is not None and t >= deadline:
                    st.deadline_hit = True
                    st.log(f"[red]hard deadline of {deadline:.0f} s reached[/]")
                    live.update(progress(st, chaos, snap))
                    break
                time.sleep(max(0.0, s.tick_s - (st.now() - t)))
        st.elapsed_s = st.now()
        chaos.stop_workers()
        for kind in st.services:
            chaos.restore_faults(kind)
        verdict = judge(self.st, self.chaos)
        print_report(self.console, self.st, self.chaos, verdict)
        return 1 if verdict.broken else 0

    def _start_services(self) -> None:
        """Start the payment service of every kind, with the run's faults."""
        s, st = self.s, self.st
        for i, kind in enumerate(KINDS):
            st.services[kind] = start_payment_service(
                st.workdir / f"payments-{kind}.db",
                reply_lost=s.reply_lost,
                burst_503=s.burst_503,
                slow=s.slow,
                slow_s=s.slow_s,
                latency_s=s.latency_s,
                honour_keys=SERVICE_OPTIONS[kind]["honour_keys"] and s.honour_keys,
                check_tokens=SERVICE_OPTIONS[kind]["check_tokens"],
                seed=st.seed * 10 + i,
            )
            self.console.print(
                f"payment service [bold]{kind}[/] ({TASKS[kind]}) pid "
                f"{st.services[kind].pid} at {st.services[kind].url}: "
                f"{GUARANTEES[kind]}"
            )
        self.console.print(
            f"faults at every service: reply lost {s.reply_lost:.0%}, 503 bursts "
            f"{s.burst_503:.0%}, slow {s.slow:.0%} x {s.slow_s:.1f} s"
            + ("" if s.honour_keys else ", [bold red]keys NOT honoured[/]")
        )
        if st.n_orders:
            self._start_order_services()

    def _start_order_services(self) -> None:
        """Start the order workflows' warehouse (with its shipper on the run's ledger) and
        their payment service, both honouring keys, with the run's faults."""
        s, st = self.s, self.st
        faults = {"reply_lost": s.reply_lost, "burst_503": s.burst_503, "slow": s.slow,
                  "slow_s": s.slow_s, "latency_s": s.latency_s}  # fmt: skip
        plan = ShipPlan(s.ship_ratio, s.ship_min_s, s.ship_max_s, st.seed)
        st.warehouse = start_warehouse(
            st.workdir / "warehouse.db", st.ledger_url, plan, seed=st.seed * 10 + 8, **faults
        )
        st.order_payments = start_payment_service(
            st.workdir / "payments-orders.db", seed=st.seed * 10 + 9, **faults
        )
        self.console.print(
            f"warehouse pid {st.warehouse.pid} at {st.warehouse.url}: ships "
            f"{s.ship_ratio:.0%} of the orders {s.ship_min_s:g}-{s.ship_max_s:g} s after "
            f"their reservation (event 'shipped'), never the others; the orders wait "
            f"{s.ship_timeout_s:g} s, then are compensated (refund, release)\n"
            f"order payment service pid {st.order_payments.pid} at {st.order_payments.url}"
        )

    def _submit_books(self) -> None:
        """Submit the sharded job (:mod:`ratchet.demo.books`): yesterday's orders,
        reconciled over ``books_shards`` shards."""
        s, st = self.s, self.st
        if not s.books_orders:
            return
        yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
        st.books_day = f"{yesterday}-{st.seed:06d}"
        handle = st.app.submit_sharded(
            RECONCILE_TASK, {"day": st.books_day, "count": s.books_orders},
            shards=s.books_shards, key=f"books:{st.books_day}:{os.getpid()}")
        st.books_job = handle.task_id
        st.log(f"sharded job {handle.task_id}: reconcile {s.books_orders} orders of "
               f"{yesterday} over {s.books_shards} shards (ctx.batches)")

    def _books_state(self) -> str:
        """The sharded job's state ("" without one)."""
        if self.st.books_job is None:
            return ""
        state = self.st.control.get(self.st.books_job).state
        return state.value if isinstance(state, State) else str(state)

    def _submit(self, count: int) -> None:
        """Submit the next ``count`` orders in one ``submit_many``."""
        st = self.st
        chunk = st.orders[st.submitted : st.submitted + count]
        handles = st.app.submit_many(
            [
                SubmitRequest(
                    TASK_OF[kind],
                    {"order_id": o, "amount_cents": a},
                    idempotency_key=f"order:{o}",
                )
                for o, a, kind in chunk
            ]
        )
        for h, (_, _, kind) in zip(handles, chunk, strict=True):
            st.task_ids.append(h.task_id)
            st.kind_of[h.task_id] = kind
        st.submitted += len(chunk)

    def _resubmit(self) -> None:
        """Resubmit a few keys already submitted: submit dedupe must return their task ids."""
        st = self.st
        picks = st.rng.sample(range(st.submitted), min(self.s.resubmits, st.submitted))
        handles = st.app.submit_many(
            [
                SubmitRequest(
                    TASK_OF[st.orders[i][2]],
                    {"order_id": st.orders[i][0], "amount_cents": st.orders[i][1]},
                    idempotency_key=f"order:{st.orders[i][0]}",
                )
                for i in picks
            ]
        )
        for i, h in zip(picks, handles, strict=True):
            st.resubmit_checks.append((st.task_ids[i], h.task_id, h.created))
        same = sum(1 for want, got, created in st.resubmit_checks if want == got and not created)
        st.log(
            f"resubmitted {len(picks)} idempotency keys → {same} deduplicated to the same task id"
        )


def run_demo(
    ledger_url: str | None,
    tasks: int = 500,
    workers: int = 2,
    kills: int = 5,
    seed: int | None = None,
    workdir: Path | None = None,
    *,
    orders: int = 100,
    settings: DemoSettings | None = None,
    console: Console | None = None,
) -> int:
    """Run the demo and return the process exit code.

    Args:
        ledger_url: the ledger; None for ``sqlite:///<workdir>/ledger.db`` (fresh each run).
            A ``postgresql://`` URL runs in its ``schema=`` (default ``ratchet_demo``),
            which is dropped with everything in it and created empty first (see
            :func:`reset_pg_schema`: refused for a schema the demo did not create).
            Another SQLite URL is used as it is; order ids carry a per-run tag, so a shared
            ledger does not dedupe across runs.
        tasks: billing tasks to submit (>= 1), the kinds of payment target in turn.
        workers: worker processes (>= 1), besides one would-be frozen sender per kind.
        kills: SIGKILLs to deliver (at least).
        seed: seed for amounts, chaos timing and the service's faults (None: random,
            printed). Timing still varies between runs.
        workdir: directory for the ledger, the services' databases and the logs; default
            ``./ratchet-demo``. It is wiped on every run.
        orders: order workflows to submit (>= 0), spread evenly among the billing tasks.
        settings: finer knobs (:class:`DemoSettings`).
        console: where to print (default: a new Rich console on stdout).

    Returns:
        0 when every invariant holds, 1 when one is broken, 2 when the demo could not run
        (bad arguments, such as an orders' wait not longer than the warehouse's latest
        shipment; a service did not start).
    """
    console = console or Console()
    settings = settings or DemoSettings()
    if tasks < 1 or workers < 1 or kills < 0 or orders < 0:
        console.print("[bold red]error:[/] need tasks >= 1, workers >= 1, kills >= 0, "
                      "orders >= 0")
        return 2
    if orders and not settings.ship_timeout_s > settings.ship_max_s:
        console.print(
            f"[bold red]error:[/] the orders' wait for 'shipped' ({settings.ship_timeout_s:g} s)"
            f" must be longer than the warehouse's latest shipment ({settings.ship_max_s:g} s"
            " after the reservation), or shipped orders time out too"
        )
        return 2
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    try:
        wd = prepare_workdir(workdir if workdir is not None else Path("ratchet-demo"))
    except (ConfigError, OSError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    url = ledger_url or f"sqlite:///{wd / 'ledger.db'}"
    notes: list[str] = []
    try:
        if parse_ledger_url(url).scheme == "postgresql":
            url, schema, defaulted = demo_pg_url(url)
            if defaulted:
                notes.append(
                    f"schema  {schema} (the URL names no schema=; the demo uses its own, "
                    "never the default 'ratchet')"
                )
            existed = reset_pg_schema(url, schema)
            notes.append(
                f"        dropped schema {schema} (DROP SCHEMA ... CASCADE) and created it empty"
                if existed
                else f"        created schema {schema} (it did not exist)"
            )
    except RatchetError as exc:
        console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    app = load_app(DEMO_APP)  # the module the workers run, loaded only for a run
    app.close()  # a previous run in this process may have opened another ledger
    app.configure(ledger=url)
    rng = random.Random(seed)
    run_tag = f"{seed:06d}-{os.getpid() % 10000:04d}"
    work = [
        (f"ord-{run_tag}-{i:05d}", rng.randrange(500, 50_000), KINDS[i % len(KINDS)])
        for i in range(tasks)
    ]
    # The order workflows spread evenly among the billing tasks (so over every batch).
    for j in range(orders):
        at = (j * (tasks + orders)) // orders
        work.insert(at, (f"so-{run_tag}-{j:05d}", rng.randrange(500, 50_000), ORDER_KIND))
    st = RunState(
        settings=settings, ledger_url=url, workdir=wd, seed=seed, n_tasks=len(work), app=app,
        control=Control(app=app), lease_s=app.definition(TASKS["idempotent"]).lease_s,
        rng=rng, orders=work,
    )  # fmt: skip
    demo = _DemoRun(console, st, Chaos(st, workers, kills), notes)
    try:
        return demo.run()
    except (PaymentServiceError, RatchetError) as exc:
        console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: stopping workers and the payment services")
        return 130
    finally:
        demo.chaos.stop_workers()
        for service in st.all_services().values():
            service.stop()
        st.control.close()
        app.close()


def _main() -> None:
    raise SystemExit(run_demo(None))


if __name__ == "__main__":
    _main()
