"""``ratchet status`` and the dashboard's reads on PostgreSQL right after a drain.

Submits N tasks, drains them through the ledger (``commit_and_claim`` rounds of ``--batch``
tasks, as a worker's writer does), then times at once (no pause for autovacuum):
``Control.status`` (what ``ratchet status`` runs), the dashboard overview's reads (status
+ the throughput charts), and EXPLAIN (ANALYZE, BUFFERS) of each status statement; then the
same after ``VACUUM`` of the ledger's tables, for comparison. ``--reloptions`` shows the
autovacuum settings the migrations gave the tables. Prints figures; asserts nothing.

    .venv/bin/python bench/pg_status_after_drain.py --tasks 100000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.control import Control
from ratchet.ledger.base import NewTask, TaskWrite, Transition
from ratchet.ledger.catalogue import load_catalogue
from ratchet.serde import digest
from ratchet.states import State

STATEMENTS = ("stats_counts", "stats_oldest", "stats_kinds", "stats_unknown", "status_ready",
              "status_arrivals", "status_completions", "ready_by_version",
              "throughput_arrivals", "throughput_completions")


def _timed(fn: Callable[[], Any], repeat: int) -> str:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return (f"median {statistics.median(times):7.1f} ms  first {times[0]:7.1f} ms  "
            f"[{min(times):.1f}-{max(times):.1f}]")


def _explain(conn: psycopg.Connection[Any], schema: str, now: float) -> None:
    catalogue = load_catalogue("postgresql")
    params = {"now": now, "upto": now - 1.0, "from_at": now - 600.0, "to_at": now,
              "bucket_s": 30.0, "name": None, "names": ["noop"]}
    cur = psycopg.ClientCursor(conn)
    conn.execute(f"SET search_path TO {schema}")
    for name in STATEMENTS:
        (text,) = catalogue[name]
        sql = cur.mogrify(text, params)
        plan = conn.execute(("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql).encode()
                            ).fetchone()[0][0]  # type: ignore[index]
        top = plan["Plan"]
        hits = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        print(f"    {name:24s} {plan['Execution Time']:8.2f} ms  {hits:7d} buffers  "
              f"{top['Node Type']}")


def _dead(conn: psycopg.Connection[Any], schema: str) -> str:
    rows = conn.execute(
        "SELECT relname, n_live_tup, n_dead_tup, last_autovacuum IS NOT NULL FROM "
        "pg_stat_user_tables WHERE schemaname = %s AND relname IN ('tasks', 'audit') "
        "ORDER BY relname", (schema,)).fetchall()
    return ", ".join(f"{r[0]}: {r[1]} live {r[2]} dead autovacuumed={r[3]}" for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=100_000, help="tasks drained (100,000)")
    p.add_argument("--batch", type=int, default=500, help="tasks per commit_and_claim (500)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per read (5)")
    p.add_argument("--pg-url", default=os.environ.get(
        "RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--keep", action="store_true", help="keep the schema afterwards")
    p.add_argument("--no-vacuum", action="store_true",
                   help="measure only right after the drain (with --keep: to explore)")
    args = p.parse_args()
    schema = "rbench_status_" + uuid.uuid4().hex[:8]
    url = f"{args.pg_url}?schema={schema}"
    ledger = open_ledger(url)
    conn = psycopg.connect(args.pg_url, autocommit=True)
    try:
        print("reloptions:", conn.execute(
            "SELECT relname, reloptions FROM pg_class c JOIN pg_namespace n ON "
            "n.oid = c.relnamespace WHERE nspname = %s AND relkind = 'r' AND reloptions "
            "IS NOT NULL ORDER BY relname", (schema,)).fetchall() or "none")
        t0 = time.perf_counter()
        for start in range(0, args.tasks, 1000):
            ledger.submit([NewTask(new_task_id(), "noop", 1, "{}", digest("noop", "{}"), None,
                                   3, 30.0) for _ in range(min(1000, args.tasks - start))])
        print(f"submitted {args.tasks} in {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        claims = ledger.claim("bench", ["noop"], args.batch)
        done = 0
        while claims:
            writes = [TaskWrite(c.task_id, c.generation, "bench", "complete",
                                transition=Transition(State.SUCCEEDED, result_json="null"))
                      for c in claims]
            done += len(writes)
            _, claims = ledger.commit_and_claim(writes, "bench", ["noop"], args.batch)
        drain_s = time.perf_counter() - t0
        print(f"drained {done} in {drain_s:.1f} s ({done / drain_s:.0f} tasks/s)")
        control = Control(url)

        def overview() -> None:
            control.status(60.0)
            control.throughput(600.0, 30.0)
            control.throughput(600.0, 30.0, "noop")

        labels = ["right after the drain"] + ([] if args.no_vacuum else ["after VACUUM"])
        for label in labels:
            print(f"{label}: {_dead(conn, schema)}")
            print(f"  ratchet status       {_timed(lambda: control.status(60.0), args.repeat)}")
            print(f"  dashboard overview   {_timed(overview, args.repeat)}")
            _explain(conn, schema, ledger.now())
            if label != labels[-1]:
                for table in ("tasks", "audit", "steps", "effects"):
                    conn.execute(f"VACUUM {schema}.{table}")
    finally:
        ledger.close()
        if args.keep:
            print(f"kept schema {schema}")
        else:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        conn.close()


if __name__ == "__main__":
    main()
