"""Retention: claims and ``status`` with a small and a large finished history, and a prune.

Run::

    .venv/bin/python bench/retention.py                                 # 10,000 vs 1,000,000
    .venv/bin/python bench/retention.py --sizes 10000,10000000          # the issue's figure
    .venv/bin/python bench/retention.py --dialects postgresql --sizes 10000,1000000

For each dialect (a SQLite file in ``--dir``, a fresh schema on ``--pg-url``) and each size
N, one run:

1. fills a new ledger with N finished tasks (``SUCCEEDED``, finish times spread evenly over
   the last ``--span-days`` days) with what a real one-step task leaves behind: a step row
   and two audit rows (its claim and its transition) each. Bulk SQL, in chunks of 500,000
   rows: ``generate_series`` on PostgreSQL, a recursive CTE on SQLite. PostgreSQL then
   gets ``ANALYZE`` (what autovacuum does after a bulk load; the plans without statistics
   are pinned by tests/test_ledger_plans.py);
2. times ``Control.status()``: the first call, which advances the counts mark over the
   whole history once (DESIGN §9), then ``--status-calls`` calls (p50 / p99);
3. times claim + commit rounds on the ledger API: ``claim(limit=--batch)`` of ready tasks
   (``--rounds`` rounds; 2 x rounds x batch tasks submitted first), then one ``commit`` of
   their completions (SUCCEEDED), p50 / p99 of the round;
4. status again, now that the rounds finished tasks since the mark;
5. on the largest size only: a prune of the oldest ``--prune-tasks`` finished tasks
   (``Control.prune``, as ``ratchet prune`` runs it) while a thread keeps doing claim +
   commit rounds (of ``--prune-ready`` tasks submitted for them, more submitted untimed
   when they run out): the prune's throughput (tasks/s, with their steps and audit rows)
   and the rounds' p50 / p99 during it; then the same for the next ``--prune-tasks`` with
   the worker's paced prune (``pace=1``: it sleeps as long as each batch took).

It prints each figure and, per dialect, the large/small ratios. Figures only: this is a
measurement tool, not a test. Every schema and file it makes is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from ratchet import App, Control, SubmitRequest, TaskContext  # noqa: E402
from ratchet.ledger.base import Ledger, TaskWrite, Transition  # noqa: E402
from ratchet.states import State  # noqa: E402

DEFAULT_PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
NAME = "bench.retention"
CHUNK = 500_000
_TASK_COLS = ("id, name, version, params, params_digest, state, generation, attempt,"
              " max_attempts, lease_s, run_at, created_at, updated_at, result")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def fill_sqlite(path: str, n: int, start: float, span_s: float) -> float:
    """N finished tasks, a step and two audit rows each; seconds taken."""
    t0 = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    step = span_s / n
    for lo in range(1, n + 1, CHUNK):
        hi = min(n, lo + CHUNK - 1)
        gen = ("WITH RECURSIVE g(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM g WHERE i < ?) ")
        conn.execute("BEGIN")
        conn.execute(
            gen + f"INSERT INTO tasks ({_TASK_COLS}) SELECT printf('h%012d', i), ?, 1, '{{}}',"
            " 'd', 'SUCCEEDED', 1, 1, 5, 15, ? + i * ?, ? + i * ?, ? + i * ? + 0.01, '1' FROM g",
            (lo, hi, NAME, start, step, start, step, start, step))
        conn.execute(
            gen + "INSERT INTO steps (task_id, name, result, generation, committed_at, seq)"
            " SELECT printf('h%012d', i), 'work', '1', 1, ? + i * ? + 0.005, 0 FROM g",
            (lo, hi, start, step))
        conn.execute(
            gen + "INSERT INTO audit (task_id, at, kind, from_state, to_state, generation,"
            " holder) SELECT printf('h%012d', i), ? + i * ? + 0.001 * k.k,"
            " CASE k.k WHEN 0 THEN 'claim' ELSE 'transition' END,"
            " CASE k.k WHEN 0 THEN 'PENDING' ELSE 'RUNNING' END,"
            " CASE k.k WHEN 0 THEN 'RUNNING' ELSE 'SUCCEEDED' END, 1, 'bench'"
            " FROM g, (SELECT 0 AS k UNION ALL SELECT 10) AS k ORDER BY 1, 2",
            (lo, hi, start, step))
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - t0


def fill_pg(base_url: str, schema: str, n: int, start: float, span_s: float) -> float:
    """N finished tasks, a step and two audit rows each, then ANALYZE; seconds taken."""
    import psycopg
    from psycopg import sql

    t0 = time.perf_counter()
    step = span_s / n
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("SET synchronous_commit = off")
        for lo in range(1, n + 1, CHUNK):
            v = {"name": NAME, "start": start, "step": step, "lo": lo,
                 "hi": min(n, lo + CHUNK - 1)}
            at = "%(start)s::float8 + g * %(step)s::float8"
            series = "generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g"
            conn.execute(
                f"INSERT INTO tasks ({_TASK_COLS}) SELECT 'h' || lpad(g::text, 12, '0'),"
                f" %(name)s, 1, '{{}}', 'd', 'SUCCEEDED', 1, 1, 5, 15, {at}, {at},"
                f" {at} + 0.01, '1' FROM {series}", v)
            conn.execute(
                "INSERT INTO steps (task_id, name, result, generation, committed_at, seq)"
                f" SELECT 'h' || lpad(g::text, 12, '0'), 'work', '1', 1, {at} + 0.005, 0"
                f" FROM {series}", v)
            conn.execute(
                "INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder)"
                f" SELECT 'h' || lpad(g::text, 12, '0'), {at} + 0.001 * k,"
                " CASE k WHEN 0 THEN 'claim' ELSE 'transition' END,"
                " CASE k WHEN 0 THEN 'PENDING' ELSE 'RUNNING' END,"
                " CASE k WHEN 0 THEN 'RUNNING' ELSE 'SUCCEEDED' END, 1, 'bench'"
                f" FROM {series}, (VALUES (0), (10)) AS v(k) ORDER BY g, k", v)
        conn.execute("ANALYZE")
    return time.perf_counter() - t0


def make_app(url: str) -> App:
    app = App(url)

    @app.task(name=NAME)
    def work(ctx: TaskContext) -> int:
        return 1

    return app


def claim_rounds(app: App, holder: str, batch: int, rounds: int,
                 stop: threading.Event | None = None) -> list[float]:
    """Claim ``batch`` ready tasks and commit their completions, ``rounds`` times (or
    until ``stop``, submitting more ready tasks, untimed, when they run out); each round's
    milliseconds."""
    ledger: Ledger = app.ledger
    times: list[float] = []
    done = Transition(to=State.SUCCEEDED, result_json="1")
    while (stop is None and len(times) < rounds) or (stop is not None and not stop.is_set()):
        t = time.perf_counter()
        claims = ledger.claim(holder, [NAME], batch)
        if not claims:
            if stop is None:
                break
            submit_ready(app, 5000)
            continue
        ledger.commit([TaskWrite(c.task_id, c.generation, holder, "complete", transition=done)
                       for c in claims])
        times.append(1e3 * (time.perf_counter() - t))
    return times


def submit_ready(app: App, count: int) -> None:
    for lo in range(0, count, 1000):
        app.submit_many([SubmitRequest(NAME) for _ in range(min(1000, count - lo))])


def time_status(url: str, calls: int) -> tuple[float, list[float]]:
    with Control(url) as control:
        t = time.perf_counter()
        control.status()
        first = 1e3 * (time.perf_counter() - t)
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            control.status()
            times.append(1e3 * (time.perf_counter() - t))
    return first, times


def measure(url: str, fill: Any, n: int, args: argparse.Namespace,
            prune: bool) -> dict[str, Any]:
    """One ledger of ``n`` finished tasks: fill, status, claims, status, (prune)."""
    out: dict[str, Any] = {"n": n}
    app = make_app(url)
    try:
        app.ledger.migrate()
        now = app.ledger.now()
        span = args.span_days * 86400.0
        out["fill_s"] = fill(n, now - span - 60.0, span)
        first, steady = time_status(url, args.status_calls)
        out["status_first_ms"] = first
        out["status_ms"] = (_pct(steady, 0.5), _pct(steady, 0.99))
        submit_ready(app, 2 * args.rounds * args.batch)
        holder = f"bench-{os.getpid()}"
        claim_rounds(app, holder, args.batch, 5)  # warm-up
        times = claim_rounds(app, holder, args.batch, args.rounds)
        out["claim_ms"] = (_pct(times, 0.5), _pct(times, 0.99))
        _, steady = time_status(url, args.status_calls)
        out["status_after_ms"] = (_pct(steady, 0.5), _pct(steady, 0.99))
        if prune:
            submit_ready(app, args.prune_ready)  # for the rounds during the prune
            stop = threading.Event()
            during: list[float] = []
            thread = threading.Thread(target=lambda: during.extend(
                claim_rounds(app, holder, args.batch, 0, stop)))
            age = span * (1.0 - min(1.0, args.prune_tasks / n)) + 60.0
            thread.start()
            try:
                with Control(url) as control:
                    report = control.prune(age, batch_size=args.prune_batch, by="bench")
            finally:
                stop.set()
                thread.join()
            out["prune"] = report
            out["prune_tasks_per_s"] = report.tasks / report.elapsed_s if report.elapsed_s else 0
            out["claim_during_prune_ms"] = (_pct(during, 0.5), _pct(during, 0.99), len(during))
            # The worker's background prune (pace=1: it sleeps as long as each batch took).
            stop.clear()
            during = []
            thread = threading.Thread(target=lambda: during.extend(
                claim_rounds(app, holder, args.batch, 0, stop)))
            thread.start()
            try:
                paced = app.ledger.prune(max(0.0, age - span * args.prune_tasks / n),
                                         by="bench", batch_size=args.prune_batch, pace=1.0)
            finally:
                stop.set()
                thread.join()
            out["paced"] = paced
            out["claim_during_paced_ms"] = (_pct(during, 0.5), _pct(during, 0.99), len(during))
            _, steady = time_status(url, args.status_calls)
            out["status_after_prune_ms"] = (_pct(steady, 0.5), _pct(steady, 0.99))
    finally:
        app.close()
    return out


def show(dialect: str, r: dict[str, Any]) -> None:
    print(f"  {dialect} N={r['n']:,}: fill {r['fill_s']:.1f} s; status first "
          f"{r['status_first_ms']:.1f} ms, then p50/p99 {r['status_ms'][0]:.2f}/"
          f"{r['status_ms'][1]:.2f} ms, after the claims {r['status_after_ms'][0]:.2f}/"
          f"{r['status_after_ms'][1]:.2f} ms; claim+commit round p50/p99 "
          f"{r['claim_ms'][0]:.2f}/{r['claim_ms'][1]:.2f} ms", flush=True)
    if "prune" in r:
        p = r["prune"]
        print(f"  {dialect} prune of {p.tasks:,} tasks ({p.steps:,} steps, {p.audit:,} audit"
              f" rows) in {p.elapsed_s:.1f} s = {r['prune_tasks_per_s']:,.0f} tasks/s, "
              f"{p.batches} batches; claim+commit rounds meanwhile p50/p99 "
              f"{r['claim_during_prune_ms'][0]:.2f}/{r['claim_during_prune_ms'][1]:.2f} ms "
              f"({r['claim_during_prune_ms'][2]} rounds); status after "
              f"{r['status_after_prune_ms'][0]:.2f}/{r['status_after_prune_ms'][1]:.2f} ms",
              flush=True)
        q, d = r["paced"], r["claim_during_paced_ms"]
        print(f"  {dialect} paced prune (the worker's, pace=1) of {q.tasks:,} tasks in "
              f"{q.elapsed_s:.1f} s = {q.tasks / max(q.elapsed_s, 1e-9):,.0f} tasks/s; rounds "
              f"meanwhile p50/p99 {d[0]:.2f}/{d[1]:.2f} ms ({d[2]} rounds)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,1000000",
                        help="finished tasks per ledger, comma-separated (the first is the "
                        "small one, the last gets the prune)")
    parser.add_argument("--dialects", default="sqlite,postgresql")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--dir", default=None, help="where the SQLite files go")
    parser.add_argument("--span-days", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--status-calls", type=int, default=20)
    parser.add_argument("--prune-tasks", type=int, default=100_000)
    parser.add_argument("--prune-batch", type=int, default=500)
    parser.add_argument("--prune-ready", type=int, default=10_000,
                        help="ready tasks submitted for the claim rounds during the prune")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"bench/retention.py: sizes {sizes}, span {args.span_days} days, claim rounds "
          f"{args.rounds} x {args.batch}, prune of {args.prune_tasks:,} on the largest; "
          f"{os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for dialect in args.dialects.split(","):
        results[dialect] = []
        for n in sizes:
            prune = n == sizes[-1]
            if dialect == "sqlite":
                work = tempfile.mkdtemp(prefix="rt-bench-", dir=args.dir)
                path = os.path.join(work, "ledger.db")
                url = f"sqlite:///{path}"
                try:
                    r = measure(url, lambda n_, s_, sp_, path=path: fill_sqlite(
                        path, n_, s_, sp_), n, args, prune)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
            else:
                import psycopg
                from psycopg import sql

                schema = f"rt_bench_{secrets.token_hex(4)}"
                sep = "&" if "?" in args.pg_url else "?"
                url = f"{args.pg_url}{sep}schema={schema}"
                try:
                    r = measure(url, lambda n_, s_, sp_, schema=schema: fill_pg(
                        args.pg_url, schema, n_, s_, sp_), n, args, prune)
                finally:
                    with psycopg.connect(args.pg_url, autocommit=True) as conn:
                        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                            sql.Identifier(schema)))
            results[dialect].append(r)
            show(dialect, r)
    print("\nsummary (large / small):")
    for dialect, rs in results.items():
        small, large = rs[0], rs[-1]
        print(f"  {dialect}: N {small['n']:,} -> {large['n']:,}: claim+commit p50 "
              f"{small['claim_ms'][0]:.2f} -> {large['claim_ms'][0]:.2f} ms (x"
              f"{large['claim_ms'][0] / small['claim_ms'][0]:.2f}), p99 "
              f"{small['claim_ms'][1]:.2f} -> {large['claim_ms'][1]:.2f} ms (x"
              f"{large['claim_ms'][1] / small['claim_ms'][1]:.2f}); status p50 "
              f"{small['status_ms'][0]:.2f} -> {large['status_ms'][0]:.2f} ms (x"
              f"{large['status_ms'][0] / small['status_ms'][0]:.2f}), p99 "
              f"{large['status_ms'][1]:.2f} ms; first status at N={large['n']:,} "
              f"{large['status_first_ms']:.0f} ms", flush=True)
        if "prune" in large:
            print(f"  {dialect}: prune {large['prune_tasks_per_s']:,.0f} tasks/s; claim+commit"
                  f" p50/p99 during it {large['claim_during_prune_ms'][0]:.2f}/"
                  f"{large['claim_during_prune_ms'][1]:.2f} ms (x"
                  f"{large['claim_during_prune_ms'][0] / large['claim_ms'][0]:.2f} / x"
                  f"{large['claim_during_prune_ms'][1] / large['claim_ms'][1]:.2f} of without)",
                  flush=True)
            q, d = large["paced"], large["claim_during_paced_ms"]
            print(f"  {dialect}: paced prune (worker) {q.tasks / max(q.elapsed_s, 1e-9):,.0f}"
                  f" tasks/s; claim+commit p50/p99 during it {d[0]:.2f}/{d[1]:.2f} ms (x"
                  f"{d[0] / large['claim_ms'][0]:.2f} / x{d[1] / large['claim_ms'][1]:.2f})",
                  flush=True)


if __name__ == "__main__":
    main()
