"""What a demo run shows: the live progress panel while it runs, and the report at the end
(Rich tables; the text is Ratchet's own, so it may carry Rich markup)."""

from __future__ import annotations

import shlex
import statistics
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .. import State
from .books import BooksResult
from .chaos import Chaos, Freeze
from .judging import KindResult, Reclaims, Verdict
from .order_judging import OrderResult
from .payments import KINDS
from .prepare import display_url
from .settings import FREEZE_POINT
from .state import RunState, Snapshot

__all__ = ["late_send", "orders_table", "print_report", "progress", "reclaim_rows"]


def progress(st: RunState, chaos: Chaos, snap: Snapshot) -> Group:
    """The live view: counts from the ledger, chaos so far, the latest events."""
    counts = snap.states
    grid = Table.grid(padding=(0, 2))
    for _ in range(4):
        grid.add_column(justify="left")
    failed = f"[red]{counts[State.FAILED]}[/]" if counts[State.FAILED] else "0"
    grid.add_row(
        f"elapsed [bold]{st.now():.1f} s[/]",
        f"submitted [bold]{st.submitted}/{st.n_tasks}[/]",
        f"succeeded [bold green]{counts[State.SUCCEEDED]}[/]",
        f"failed [bold]{failed}[/]",
    )
    grid.add_row(
        f"pending [bold]{counts[State.PENDING]}[/]",
        f"running [bold]{counts[State.RUNNING]}[/]",
        f"retry wait [bold]{counts[State.RETRY_WAIT]}[/]",
        f"unknown [bold]{counts[State.UNKNOWN]}[/]",
    )
    grid.add_row(
        f"kills [bold]{chaos.kills_done}/{chaos.kills_asked}[/]",
        f"takeovers [bold]{snap.takeovers}[/] revoked [bold]{snap.revocations}[/]",
        f"stale rejections [bold]{snap.stale}[/]",
        f"late effects [bold]{snap.late_effects}[/]",
    )
    if chaos.freezes:
        grid.add_row(*(f"frozen {f.kind}: [bold]{f.state}[/]" for f in chaos.freezes.values()))
    if st.n_orders:
        o = snap.orders
        grid.add_row(
            f"orders waiting [bold]{o[State.WAITING]}[/]",
            f"shipped [bold green]{o[State.SUCCEEDED]}[/]",
            f"compensating [bold]{o[State.COMPENSATING]}[/]",
            f"compensated [bold]{o[State.COMPENSATED]}[/]",
        )
    workers = "  ".join(
        f"w{s.index}: pid {s.pid} ({len(snap.inflight.get(s.pid or -1, []))} held)"
        for s in chaos.slots
    )
    lines = [Text.from_markup(f"[dim]{t:5.1f} s[/] {m}") for t, m in st.events[-5:]]
    return Group(
        Panel(grid, title="ratchet demo: four kinds of payment target"
              + (", order workflows" if st.n_orders else ""), subtitle=workers,
              expand=False),
        *lines,
    )  # fmt: skip


def print_report(console: Console, st: RunState, chaos: Chaos, verdict: Verdict) -> None:
    """Print the report of a finished run: the chaos timeline, the ledger's counts, each
    payment target's counts at its service, the frozen senders, the chaos, the invariants,
    and the verdict's last line (``OK`` or ``FAILED``)."""
    c = console
    infos, states, status = verdict.infos, verdict.states, verdict.status
    late_all, service_stats, results = verdict.late_all, verdict.service_stats, verdict.results
    retry_classes, released, attempts = verdict.retry_classes, verdict.released, verdict.attempts
    calls, reclaims, invariants = verdict.calls, verdict.reclaims, verdict.invariants
    broken = verdict.broken
    c.print()
    timeline = Table(title="chaos timeline", box=None, show_header=False)
    timeline.add_column(justify="right", style="dim")
    timeline.add_column()
    for t, m in st.events:
        timeline.add_row(f"{t:5.1f} s", m)
    c.print(timeline)

    tasks_t = Table(title="tasks (ledger)", show_header=False)
    tasks_t.add_column()
    tasks_t.add_column(justify="right")
    tasks_t.add_row("submitted", str(len(infos)))
    tasks_t.add_row(
        "resubmissions deduplicated",
        f"{sum(1 for w, g, c_ in st.resubmit_checks if w == g and not c_)}"
        f"/{len(st.resubmit_checks)}",
    )
    tasks_t.add_row("succeeded", f"[green]{states[State.SUCCEEDED]}[/]")
    tasks_t.add_row("compensated (failed, its effects undone)", str(states[State.COMPENSATED]))
    tasks_t.add_row("failed (dead-letter)", _warn(states[State.FAILED]))
    tasks_t.add_row("unknown (needs a person)", _warn(states[State.UNKNOWN]))
    tasks_t.add_row("claims / takeovers", f"{status.claims} / {status.takeovers}")
    tasks_t.add_row("revocations (fast takeover of dead holders)", str(status.revocations))
    tasks_t.add_row("stale-generation rejections", str(status.stale_rejections))
    tasks_t.add_row("late effects (possible duplicates to reconcile)", str(len(late_all)))
    tasks_t.add_row("lookups that found an earlier charge", str(status.lookup_hits))
    tasks_t.add_row(
        "retries: overload / unknown outcome / transient",
        f"{retry_classes['overload']} / {retry_classes['unknown_outcome']} / "
        f"{retry_classes['transient']}",
    )
    tasks_t.add_row(
        "released: lease unconfirmed / shutdown",
        f"{released['lease_unconfirmed']} / {released['shutdown']}",
    )
    tasks_t.add_row("effect calls made", str(calls))
    tasks_t.add_row(
        "attempts per task: max / mean",
        f"{max(attempts, default=0)} / "
        f"{(sum(attempts) / len(attempts)) if attempts else 0:.2f}",
    )

    kinds_t = Table(title="payment targets: counted at each service (its own SQLite file)")
    kinds_t.add_column()
    for kind in KINDS:
        kinds_t.add_column(kind, justify="right")

    def row(label: str, cell: Any) -> None:
        kinds_t.add_row(label, *(cell(results[k], service_stats[k]) for k in KINDS))

    offers = {"idempotent": "key dedupe", "fenced": "fencing tokens",
              "lookup": "lookup only", "neither": "nothing"}  # fmt: skip
    row("the target offers", lambda r, _: offers[r.kind])
    row("tasks", lambda r, _: str(len(r.task_ids)))
    row("succeeded", lambda r, _: f"[green]{r.states[State.SUCCEEDED]}[/]")
    row("UNKNOWN (needs a person)", lambda r, _: _warn(r.states[State.UNKNOWN]))
    row("failed", lambda r, _: _warn(r.states[State.FAILED]))
    row("charges executed", lambda r, _: str(r.executions))
    row("succeeded with exactly one charge", lambda r, _: str(r.exactly))
    row("keys charged more than once", lambda r, _: (
        _bad(len(r.undetected)) if not r.detected
        else f"[yellow]{len(r.detected) + len(r.undetected)}[/]"))  # fmt: skip
    row("  of which recorded as late effects", lambda r, _: str(len(r.detected)))
    row("late effects recorded (ledger)",
        lambda r, _: str(sum(len(v) for v in r.late.values())))  # fmt: skip
    row("stale fencing tokens refused", lambda r, _: str(r.rejected()))
    row("replays deduplicated by the service", lambda _, st: str(st.get("replays", "?")))
    row("lookups (found)", lambda _, st: (
        f"{st.get('lookups', '?')} ({st.get('lookups_found', '?')})"))  # fmt: skip
    row(
        "injected: lost replies / 503 / slow",
        lambda _, st: "{} / {} / {}".format(
            *(st.get("injected", {}).get(x, "?") for x in ("reply_lost", "503", "slow"))
        ),
    )

    frozen_t = Table(title=f"frozen senders (SIGSTOP at {FREEZE_POINT}, then SIGCONT)")
    for col in ("target", "charge key (generation)", "frozen for", "meanwhile",
                "its late charge at the target", "ledger"):  # fmt: skip
        frozen_t.add_column(col)
    for kind, fz in chaos.freezes.items():
        if fz.frozen_at is None:
            frozen_t.add_row(kind, "-", "-", f"[yellow]not frozen: {fz.note}[/]", "-", "-")
            continue
        until = fz.resumed_at if fz.resumed_at is not None else st.elapsed_s
        at_target, in_ledger = late_send(chaos, fz, results[kind])
        frozen_t.add_row(
            kind, f"{fz.key} ({fz.generation})", f"{until - fz.frozen_at:.1f} s",
            f"taken over, {fz.settled_as} (generation {fz.settled_generation})"
            if fz.settled_as else "[yellow]not settled by another worker[/]",
            at_target, in_ledger,
        )  # fmt: skip

    chaos_t = Table(title="chaos", show_header=False)
    chaos_t.add_column()
    chaos_t.add_column(justify="right")
    chaos_t.add_row("workers SIGKILLed (and restarted)", f"{chaos.kills_done}/{chaos.kills_asked}")
    chaos_t.add_row("tasks in flight at the kills", str(sum(chaos.kill_inflight)))
    if st.n_orders:
        chaos_t.add_row("  of which order workflows", str(sum(chaos.kill_orders)))
    if st.books_job is not None:
        chaos_t.add_row("shards of the sharded job in flight at the kills "
                        "(one kill aimed at them, besides the random ones)",
                        f"{sum(chaos.kill_shards)}"
                        + ("" if chaos.shard_kill_done else " (no shard under way when a "
                           "kill was due)"))
    for label, value in reclaim_rows(st.lease_s, reclaims):
        chaos_t.add_row(label, value)
    chaos_t.add_row("unexpected worker exits", _warn(chaos.unexpected_exits))
    chaos_t.add_row("run time", f"{st.elapsed_s:.1f} s")

    c.print(tasks_t)
    c.print(kinds_t)
    if verdict.orders.orders:
        c.print(orders_table(verdict.orders, service_stats))
    if verdict.books is not None:
        c.print(books_table(verdict.books))
    if chaos.freezes:
        c.print(frozen_t)
    c.print(chaos_t)
    inv = Table(title="invariants", show_header=False)
    inv.add_column()
    inv.add_column()
    inv.add_column()
    for name, ok, detail in invariants:
        inv.add_row("[green]PASS[/]" if ok else "[bold red]FAIL[/]", name, detail)
    c.print(inv)
    if reclaims.claimed and reclaims.revoked:
        wait = statistics.median(reclaims.first_claim) - statistics.median(reclaims.freed)
        if wait > 1.0:
            c.print(
                f"[yellow]note:[/] revoked tasks were claimable at once but waited "
                f"{wait:.1f} s (median) to be claimed again: they re-enter the ready queue "
                "behind the whole backlog (revoke_holder sets run_at = now)"
            )
    if late_all:
        c.print(
            f"{len(late_all)} late effects are listed for reconciliation by "
            f"`ratchet late-effects --ledger {shlex.quote(display_url(st.ledger_url))}`."
        )
    if broken:
        c.print(f"[bold red]FAILED[/]: {len(broken)} invariant(s) broken. Logs: {st.workdir}")
        return
    frozen = sum(1 for f in chaos.freezes.values() if f.state == "done")
    shipped, timed_out = len(verdict.orders.shipped), len(verdict.orders.not_shipped)
    billed = sum(r.states[State.SUCCEEDED] for r in results.values())
    c.print(
        f"[bold green]OK[/]: {billed} billing tasks succeeded over {len(KINDS)} "
        f"kinds of payment target, each kind's guarantee held at its service"
        + (f"; {shipped} orders shipped, {timed_out} timed out and compensated, every "
           "charge, refund, reservation and release at most once at the services"
           if verdict.orders.orders else "")
        + (f"; {verdict.books.totals['items']} orders reconciled by a sharded job over "
           f"{verdict.books.shards} shards, every one counted once"
           if verdict.books is not None else "")
        + ", despite "
        f"{chaos.kills_done} SIGKILLs"
        + (f" and {frozen} senders frozen mid-call" if frozen else "")
        + f" ({st.elapsed_s:.1f} s)."
    )
    freed_median = statistics.median(reclaims.freed) if reclaims.freed else None
    if freed_median is not None and freed_median < st.lease_s:
        c.print(
            f"Killed workers' tasks were claimable again {freed_median:.2f} s"
            f" after a kill (median), not after a {st.lease_s:.1f} s lease: "
            f"{status.revocations} leases revoked from dead holders."
        )


def books_table(r: BooksResult) -> Table:
    """The sharded job: expected counts, what the job reported, what the ledger counted."""
    t = Table(title=f"sharded job: reconcile yesterday's orders ({r.shards} shards, "
              "ctx.batches)")
    t.add_column()
    for col in ("expected", "job's totals", "ledger (Control.check)"):
        t.add_column(col, justify="right")
    for key, label in (("succeeded", "orders matching the bank"),
                       ("failed", "mismatched (failed)"), ("skipped", "refunded (skipped)")):
        got = r.totals.get(key)
        t.add_row(label, str(r.expected[key]), "-" if got is None else str(got),
                  str(r.ledger.get(key, "-")))
    t.add_row("in flight", "", "", str(r.ledger.get("in_flight", "-")))
    t.add_row("job state / conservation check", "", r.state,
              "[green]adds up[/]" if r.check_ok else "[bold red]does not add up[/]")
    resumed = sum(1 for a in r.attempts if a > 1)
    t.add_row("batches committed / shards claimed again, resumed from their watermark",
              "", "", f"{r.batches} / {resumed}")
    return t


def orders_table(r: OrderResult, service_stats: dict[str, dict[str, Any]]) -> Table:
    """The order workflows, counted at the warehouse and the order payment service."""
    t = Table(title="order workflows: counted at the warehouse and the payment service "
              "(their own SQLite files)", show_header=False)  # fmt: skip
    t.add_column()
    t.add_column(justify="right")
    states = r.states
    woke = sum(1 for o in r.shipped if o.woke)
    early = sum(1 for o in r.shipped if o.woke is False)
    t.add_row("orders", str(len(r.orders)))
    t.add_row("shipped by the warehouse (event 'shipped' sent)", str(len(r.shipped)))
    t.add_row("  woke an order waiting for it / arrived before its wait",
              f"{woke} / {early}")  # fmt: skip
    t.add_row("never shipped (the wait timed out)", str(len(r.not_shipped)))
    t.add_row("SUCCEEDED / COMPENSATED",
              f"[green]{states[State.SUCCEEDED]}[/] / {states[State.COMPENSATED]}")
    others = {s: n for s, n in states.items()
              if s not in (State.SUCCEEDED, State.COMPENSATED)}  # fmt: skip
    t.add_row("in another state", _bad(sum(others.values())) if others else "[green]0[/]")
    t.add_row("reservations / releases executed (warehouse)",
              f"{r.total('reserved')} / {r.total('released')}")
    t.add_row("charges / refunds executed (payment service)",
              f"{r.total('charged')} / {r.total('refunded')}")
    t.add_row("orders with anything executed twice",
              _bad(sum(1 for o in r.orders if max(o.counts) > 1)))
    t.add_row("refunds without a charge / releases without a reservation",
              f"{_bad(sum(1 for o in r.orders if o.refunded > o.charged))} / "
              f"{_bad(sum(1 for o in r.orders if o.released > o.reserved))}")
    t.add_row("timed-out orders refunded and released",
              f"{sum(1 for o in r.not_shipped if o.refunded == 1 and o.released == 1)}"
              f" / {len(r.not_shipped)}")
    t.add_row("shipped orders refunded or released",
              _bad(sum(1 for o in r.shipped if o.refunded or o.released)))
    t.add_row("compensations recorded done (ledger)", str(sum(o.compensations for o in r.orders)))
    for name in ("warehouse", "order-payments"):
        inj = service_stats.get(name, {}).get("injected", {})
        t.add_row(f"injected at {name}: lost replies / 503 / slow",
                  " / ".join(str(inj.get(x, "?")) for x in ("reply_lost", "503", "slow")))
    return t


def late_send(chaos: Chaos, fz: Freeze, r: KindResult) -> tuple[str, str]:
    """``(at the target, in the ledger)``: what became of a frozen sender's late charge."""
    if fz.key is None or fz.state != "done":
        return "-", "-"
    n = r.records.executions.get(fz.key, 0)
    plural = "execution" if n == 1 else "executions"
    executed, refused, replayed = (
        a - b for a, b in zip(chaos.at_target(fz), fz.before, strict=True)
    )
    late = r.late.get(fz.key, [])
    if refused:
        target = f"[green]refused[/] (stale token {fz.generation}); {n} {plural} in all"
    elif replayed:
        target = f"[green]answered as a replay[/]; {n} {plural} in all"
    elif executed and n > 1:
        target = f"[yellow]executed again[/]: {n} {plural}"
    elif executed:
        target = f"executed; {n} {plural} in all"
    else:
        target = f"[yellow]never arrived[/]; {n} {plural}"
    if late:
        ledger = f"late effect recorded (generation {late[0].generation}, {late[0].outcome})"
    elif executed:
        ledger = "[red]no late effect recorded[/]"
    else:
        ledger = "no late effect (nothing executed)"
    return target, ledger


def reclaim_rows(lease_s: float, r: Reclaims) -> list[tuple[str, str]]:
    """Rows for the chaos table: how fast the killed workers' tasks came back."""
    if not r.claimed:
        return [("killed workers' tasks claimed again", "-")]
    freed = statistics.median(r.freed)
    verdict = (
        f"[green]< lease ({lease_s:.1f} s)[/]"
        if freed < lease_s
        else f"[yellow]lease ({lease_s:.1f} s)[/]"
    )
    return [
        ("killed tasks freed: revoked / lease expired", f"{r.revoked} / {r.expired}"),
        ("kill → its tasks claimable (median)", f"{freed:.2f} s, {verdict}"),
        ("kill → first re-claim (median)", f"{statistics.median(r.first_claim):.2f} s"),
        (
            "kill → re-claim per task: median / max",
            f"{statistics.median(r.claimed):.2f} / {max(r.claimed):.2f} s",
        ),
    ]


def _warn(n: int) -> str:
    return f"[yellow]{n}[/]" if n else "0"


def _bad(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "[green]0[/]"
