"""Retry amplification with and without a retry budget (DESIGN §7).

Run::

    .venv/bin/python bench/retry_budget.py                       # SQLite, 100 tasks/s for 5 s
    .venv/bin/python bench/retry_budget.py --ledger postgresql://postgres@127.0.0.1:5432/test
    .venv/bin/python bench/retry_budget.py --rate 100 --seconds 10 --failure 0.5

Tasks arrive at ``--rate`` per second for ``--seconds`` (each submitted with its own
``run_at``); every attempt calls the counting service (its own process and SQLite file,
where calls are counted and timed) and then fails transiently with probability
``--failure`` (drawn from the task id and attempt alone, so both runs see the same
failures). Retries are immediate (3 retries at most: ``max_attempts=4``, 10 ms backoff),
the worst case for amplification. One run has no budget; the other gives the task type
``RetryBudget(ratio, min_per_s, window_s)``. Printed per run, from the service's own
records: calls/s and retries/s while tasks arrive, peak calls in any 1 s, how long the
backlog took to drain (a budget defers retries, it never drops them), and the most retries
any ``window_s`` whole seconds held, as a fraction of the budget's bound there
(``min_per_s * window_s + ratio * calls``). With 100 tasks/s at
50 % failure, 3 immediate retries make 187.5 calls/s; a budget of ratio 0.1 and 5/s keeps
retries near 5 + 0.1 * calls/s, i.e. calls near 117/s.

On PostgreSQL each run uses a schema of its own, dropped at the end. Figures are printed,
never asserted: this is a measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ratchet import (
    App,
    RetryBudget,
    RetryPolicy,
    State,
    SubmitRequest,
    TaskContext,
    TransientError,
)
from ratchet.testing import start_counting_service, wait_for
from ratchet.testing.worker import running_worker


def _fails(task_id: str, attempt: int, failure: float) -> bool:
    return random.Random(f"{task_id}:{attempt}").random() < failure


def run_once(ledger_url: str, workdir: Path, budget: RetryBudget | None, rate: float,
             seconds: float, failure: float, concurrency: int) -> dict[str, Any]:
    """One scenario run on a fresh ledger; returns its figures (calls per second...)."""
    service = start_counting_service(workdir / "service.db", honour_keys=False)
    client = service.client(timeout_s=5.0)
    app = App(ledger_url)
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.01, jitter=0.0,
                         quarantine_after=None, budget=budget)

    @app.task(name="bench.call", retry=policy)
    def call(ctx: TaskContext) -> str:
        client.execute(f"{ctx.task_id}:{ctx.attempt}", {})
        if _fails(ctx.task_id, ctx.attempt, failure):
            raise TransientError("the downstream failed this call")
        return "ok"

    n = int(rate * seconds)
    try:
        app.ledger.migrate()
        with running_worker(app, concurrency=concurrency):
            handles = app.submit_many(
                SubmitRequest("bench.call", {}, delay_s=i / rate) for i in range(n))
            wait_for("the backlog to drain",
                     lambda: all(h.get().terminal for h in handles), 3600, 0.5)
        records = service.records().times
        succeeded = sum(1 for h in handles if h.get().state is State.SUCCEEDED)
    finally:
        client.close()
        service.stop()
        app.close()
    times = sorted(at for at, _ in records)
    start = times[0]
    retries = [at for at, key in records if int(key.rsplit(":", 1)[1]) > 1]
    arrival = [at for at in times if at < start + seconds]
    per_second: dict[int, int] = {}
    retry_second: dict[int, int] = {}
    for at in times:
        per_second[math.floor(at)] = per_second.get(math.floor(at), 0) + 1
    for at in retries:
        retry_second[math.floor(at)] = retry_second.get(math.floor(at), 0) + 1
    worst = 0.0  # retries in any window_s whole seconds / the budget's bound there
    if budget is not None:
        n = math.ceil(budget.window_s)
        for end in range(math.floor(start), math.floor(times[-1]) + 1):
            calls = sum(per_second.get(b, 0) for b in range(end - n + 1, end + 1))
            used = sum(retry_second.get(b, 0) for b in range(end - n + 1, end + 1))
            worst = max(worst, used / max(1.0, budget.min_per_s * budget.window_s
                                          + budget.ratio * calls))
    return {
        "tasks": n, "succeeded": succeeded, "calls": len(times), "retries": len(retries),
        "calls_per_s_arrival": len(arrival) / seconds,
        "retries_per_s_arrival": sum(1 for at in retries if at < start + seconds) / seconds,
        "peak_calls_1s": max(per_second.values()),
        "drain_s": times[-1] - start, "worst_of_bound": worst,
    }


def _drop_schema(url: str, schema: str) -> None:
    """Drop the PostgreSQL schema a run created (``DROP SCHEMA ... CASCADE``)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", default=None, help="ledger URL (default: a fresh SQLite file)")
    parser.add_argument("--rate", type=float, default=100.0, help="arrivals per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="arrival period, seconds")
    parser.add_argument("--failure", type=float, default=0.5, help="failure probability")
    parser.add_argument("--ratio", type=float, default=0.1)
    parser.add_argument("--min-per-s", type=float, default=5.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("ratchet").setLevel(logging.ERROR)
    budget = RetryBudget(args.ratio, args.min_per_s, args.window_s)
    print(f"{args.rate:g} tasks/s for {args.seconds:g} s, {args.failure:.0%} transient "
          f"failure, up to 3 immediate retries; budget {budget}")
    print(f"{'run':<12} {'calls/s':>8} {'retries/s':>10} {'peak 1s':>8} {'calls':>7} "
          f"{'retries':>8} {'ok':>5} {'drain s':>8} {'of bound':>8}")
    for label, chosen in (("no budget", None), ("budget", budget)):
        with tempfile.TemporaryDirectory(prefix="ratchet-budget-") as tmp:
            url = args.ledger
            schema = None
            if url is None:
                url = f"sqlite:///{tmp}/ledger.db"
            elif url.startswith("postgresql"):
                schema = f"bench_budget_{int(time.time() * 1000) % 10**9}"
                url += ("&" if "?" in url else "?") + f"schema={schema}"
            try:
                r = run_once(url, Path(tmp), chosen, args.rate, args.seconds, args.failure,
                             args.concurrency)
            finally:
                if schema is not None:
                    _drop_schema(args.ledger, schema)
        print(f"{label:<12} {r['calls_per_s_arrival']:>8.1f} {r['retries_per_s_arrival']:>10.1f} "
              f"{r['peak_calls_1s']:>8} {r['calls']:>7} {r['retries']:>8} {r['succeeded']:>5} "
              f"{r['drain_s']:>8.1f} {r['worst_of_bound']:>8.2f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
