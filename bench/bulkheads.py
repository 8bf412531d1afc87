"""Bulkheads (DESIGN §8): what limits buy and what they cost, on both ledgers.

1. **Flood**: ``--flood`` ready ``bench.flood`` tasks (``--flood-ms`` each) are drained by
   ``--workers`` worker processes of ``--concurrency`` threads; meanwhile one
   ``bench.critical`` task (5 ms) is submitted every 100 ms for ``--seconds``. Reported: the
   critical tasks' wait (ledger clock: first claim minus submit; p50 / max) and the
   largest oldest-pending age of ``bench.critical`` sampled every 50 ms, next to the
   flood's own oldest pending age at the end. Three configurations: no limits; ``cap``
   (``bench.flood`` max = slots - 2); ``reserve`` (total = slots, ``bench.critical``
   reserved 2, the flood unlimited: it borrows the critical's idle slots and hands them
   back as its tasks end).
2. **Drain**: ``--tasks`` ready no-op tasks drained by one in-process worker of 8 threads,
   tasks/s from the first claimed task to the last finished one, ``--repeat`` interleaved
   runs (median [min-max]) per configuration: no limits; a limit on another type only
   (the drained type's claim stays the unlimited one: must equal "none" within noise); a
   cap on the drained type that never binds (max 100,000: the limited claim, its advisory
   lock, count and window); a total (every
   claim limited and serialised on one lock).

Usage::

    .venv/bin/python bench/bulkheads.py                      # both ledgers, small sizes
    .venv/bin/python bench/bulkheads.py --ledgers sqlite --tasks 5000 --repeat 5

It asserts nothing (a measurement tool, not a test). PostgreSQL: ``--pg-url`` (default
the test server); each run uses a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ratchet  # noqa: E402
from ratchet import App, Control, State, TaskContext, Worker  # noqa: E402

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def build_app(url: str, flood_ms: float = 20.0) -> App:
    """The bench's tasks on ``url``."""
    app = ratchet.App(url)

    @app.task(name="bench.flood")
    def flood(ctx: TaskContext, i: int = 0) -> None:
        time.sleep(flood_ms / 1000)

    @app.task(name="bench.critical")
    def critical(ctx: TaskContext, i: int = 0) -> None:
        time.sleep(0.005)

    @app.task(name="bench.drain")
    def drain(ctx: TaskContext, i: int = 0) -> None:
        return None

    @app.task(name="bench.other")
    def other(ctx: TaskContext, i: int = 0) -> None:
        return None

    return app


def child(url: str, concurrency: int, flood_ms: float) -> None:
    """A worker process of the flood scenario (runs until killed)."""
    app = build_app(url, flood_ms)
    Worker(app, concurrency=concurrency, poll_interval_s=0.02,
           names=["bench.flood", "bench.critical"]).run()


class Ledgers:
    """Fresh ledgers per run: SQLite files in a temp dir, PostgreSQL schemas (dropped)."""

    def __init__(self, pg_url: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-bulkheads-"))
        self.pg_url = pg_url
        self.schemas: list[str] = []
        self.n = 0

    def new(self, backend: str) -> str:
        self.n += 1
        if backend == "sqlite":
            return f"sqlite:///{self.dir}/l{self.n}.db"
        schema = f"bench_bh_{secrets.token_hex(4)}"
        self.schemas.append(schema)
        parts = urlsplit(self.pg_url)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
        return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))

    def close(self) -> None:
        if not self.schemas:
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            for schema in self.schemas:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                             .format(sql.Identifier(schema)))


def set_limits(url: str, limits: Sequence[tuple[str, str, int, int | None]]) -> None:
    with Control(url) as control:
        control.migrate()
        for scope, name, reserved, maximum in limits:
            control.set_limit(scope, name, reserved=reserved, maximum=maximum,
                              reason="bench", by="bench")


def flood_run(url: str, args: argparse.Namespace,
              limits: Sequence[tuple[str, str, int, int | None]]) -> dict[str, float]:
    """One flood scenario; returns the critical waits and ages, seconds."""
    set_limits(url, limits)
    app = build_app(url, args.flood_ms)
    for start in range(0, args.flood, 500):
        app.submit_many([ratchet.SubmitRequest("bench.flood", {"i": i})
                         for i in range(start, min(args.flood, start + 500))])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, __file__, "--child", url,
                               "--concurrency", str(args.concurrency),
                               "--flood-ms", str(args.flood_ms)], env=env)
             for _ in range(args.workers)]
    control = Control(url)
    critical: list[str] = []
    ages: list[float] = []
    try:
        # Let the workers fill their slots with flood work first.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                u.name == "bench.flood" and u.running for u in control.limits().usage):
            time.sleep(0.02)
        end = time.monotonic() + args.seconds
        next_submit = time.monotonic()
        while time.monotonic() < end:
            if time.monotonic() >= next_submit:
                critical.append(app.submit("bench.critical", {"i": len(critical)}).task_id)
                next_submit += 0.1
            usage = {u.name: u for u in control.limits().usage}
            crit = usage.get("bench.critical")
            ages.append((crit.oldest_ready_age_s or 0.0) if crit else 0.0)
            time.sleep(0.05)
        status = control.status()
        flood_age = status.oldest_pending_age_s or 0.0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            infos = control.get_many(critical)
            if all(t.state is State.SUCCEEDED for t in infos):
                break
            time.sleep(0.05)
        waits = []
        for task_id in critical:
            history = control.history(task_id)
            claim = next(e.at for e in history.events if e.kind == "claim")
            waits.append(claim - history.task.created_at)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        control.close()
        app.close()
    waits.sort()
    return {"wait_p50": statistics.median(waits), "wait_max": waits[-1],
            "age_max": max(ages), "flood_age": flood_age, "critical": len(waits)}


def drain_rate(url: str, n: int, limits: Sequence[tuple[str, str, int, int | None]]) -> float:
    """tasks/s of one in-process worker (8 threads) draining ``n`` no-op tasks."""
    set_limits(url, limits)
    app = build_app(url)
    for start in range(0, n, 500):
        app.submit_many([ratchet.SubmitRequest("bench.drain", {"i": i})
                         for i in range(start, min(n, start + 500))])
    marks: list[float] = []

    class Timed(Worker):
        """Times from the first claimed task to the last finished one (start-up and
        shutdown excluded, as in bench/sqlite_throughput.py)."""

        def on_claimed(self, claim: Any) -> None:
            if not marks:
                marks.append(time.perf_counter())

        def on_finished(self, claim: Any, outcome: str) -> None:
            if len(marks) < 2:
                marks.append(0.0)
            marks[1] = time.perf_counter()

    Timed(app, concurrency=8, poll_interval_s=0.01, names=["bench.drain"]).run(max_tasks=n)
    app.close()
    return n / (marks[1] - marks[0])


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledgers", default="sqlite,postgresql")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--flood", type=int, default=3000, help="flood tasks (3000)")
    p.add_argument("--flood-ms", type=float, default=20.0, help="a flood task's work, ms")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--concurrency", type=int, default=4, help="threads per worker (4)")
    p.add_argument("--seconds", type=float, default=5.0, help="critical submits for (5 s)")
    p.add_argument("--tasks", type=int, default=3000, help="tasks per drain (3000)")
    p.add_argument("--repeat", type=int, default=3, help="drain runs per configuration")
    p.add_argument("--skip-flood", action="store_true")
    p.add_argument("--skip-drain", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child, args.concurrency, args.flood_ms)
        return 0
    ledgers = Ledgers(args.pg_url)
    slots = args.workers * args.concurrency
    print(f"Ratchet bulkheads bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"flood {args.flood} x {args.flood_ms:g} ms on {args.workers} x {args.concurrency}"
          f" slots; drain {args.tasks} no-op tasks, 8 threads, {args.repeat} runs\n",
          flush=True)
    try:
        for backend in [b for b in args.ledgers.split(",") if b]:
            if not args.skip_flood:
                configs: list[tuple[str, list[tuple[str, str, int, int | None]]]] = [
                    ("none", []),
                    (f"cap: flood max {slots - 2}", [("type", "bench.flood", 0, slots - 2)]),
                    (f"reserve: total {slots}, critical reserved 2",
                     [("total", "", 0, slots), ("type", "bench.critical", 2, None)]),
                ]
                print(f"[{backend}] flood: critical wait (claim - submit) and oldest pending age")
                print(f"  {'limits':44} {'wait p50':>9} {'wait max':>9} {'age max':>9} "
                      f"{'flood age':>10}")
                for label, limits in configs:
                    r = flood_run(ledgers.new(backend), args, limits)
                    print(f"  {label:44} {r['wait_p50']:8.3f}s {r['wait_max']:8.3f}s "
                          f"{r['age_max']:8.3f}s {r['flood_age']:9.1f}s", flush=True)
                print()
            if not args.skip_drain:
                drains: list[tuple[str, list[tuple[str, str, int, int | None]]]] = [
                    ("none", []),
                    ("another type capped (bench.other max 5)",
                     [("type", "bench.other", 0, 5)]),
                    ("drained type capped, never binding (max 100000)",
                     [("type", "bench.drain", 0, 100_000)]),
                    ("total 100000 (every claim limited)", [("total", "", 0, 100_000)]),
                ]
                rates: dict[str, list[float]] = {label: [] for label, _ in drains}
                for _ in range(args.repeat):
                    for label, limits in drains:  # interleaved: drift hits all alike
                        rates[label].append(drain_rate(ledgers.new(backend), args.tasks,
                                                       limits))
                print(f"[{backend}] drain tasks/s, median [min-max]")
                for label, _ in drains:
                    print(f"  {label:50} {fmt(rates[label])}", flush=True)
                print()
    finally:
        ledgers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
