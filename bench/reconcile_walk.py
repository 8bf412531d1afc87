"""The ledger side of ``ratchet reconcile``: how long ``Control.effects`` takes to walk a
task type's effects in a ledger that holds many tasks of other types.

Run::

    .venv/bin/python bench/reconcile_walk.py                          # 1,000,000 tasks
    .venv/bin/python bench/reconcile_walk.py --tasks 200000 --dialects sqlite

For each dialect (a SQLite file in a temp dir, a fresh schema on ``--pg-url``): fills a new
ledger with N finished tasks spread evenly over ``--span-days`` days, one in ``--every``
of them of the reconciled type with one effect row (the rest of another type, no effects);
bulk SQL as bench/retention.py does (PostgreSQL then gets ``ANALYZE``). Then times walks of
the reconciled type's effects: the first page of 1,000 (``--since 24h`` and all time),
and a full walk of the last 24 h in pages of 500 (what ``reconcile --limit`` large does).
Figures only; every file and schema is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from ratchet import Control, open_ledger  # noqa: E402

DEFAULT_PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
TYPE = "bench.charge"
OTHER = "bench.other"
_TASK_COLS = ("id, name, version, params, params_digest, state, generation, attempt,"
              " max_attempts, lease_s, run_at, created_at, updated_at, result")
_EFFECT_COLS = ("task_id, name, key, params_digest, state, result, generation, attempt, calls,"
                " via_lookup, updated_at, seq")


def fill_sqlite(path: str, n: int, every: int, start: float, step: float) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    gen = "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?) "
    conn.execute("BEGIN")
    conn.execute(
        gen + f"INSERT INTO tasks ({_TASK_COLS}) SELECT printf('h%012d', i),"
        " CASE WHEN i % ? = 0 THEN ? ELSE ? END, 1, '{}', 'd', 'SUCCEEDED', 1, 1, 5, 15,"
        " ? + i * ?, ? + i * ?, ? + i * ? + 0.01, '1' FROM g",
        (n, every, TYPE, OTHER, start, step, start, step, start, step))
    conn.execute(
        gen + f"INSERT INTO effects ({_EFFECT_COLS}) SELECT printf('h%012d', i), 'charge',"
        " 'charge:' || i, 'd', 'done', '{\"id\": 1}', 1, 1, 1, 0, ? + i * ?, 0 FROM g"
        " WHERE i % ? = 0", (n, start, step, every))
    conn.execute("COMMIT")
    conn.close()


def fill_pg(base_url: str, schema: str, n: int, every: int, start: float, step: float) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute("SET synchronous_commit = off")
        v = {"n": n, "every": every, "type": TYPE, "other": OTHER, "start": start,
             "step": step}
        at = "%(start)s::float8 + g * %(step)s::float8"
        series = "generate_series(1, %(n)s::bigint) AS g"
        conn.execute(
            f"INSERT INTO tasks ({_TASK_COLS}) SELECT 'h' || lpad(g::text, 12, '0'),"
            " CASE WHEN g %% %(every)s = 0 THEN %(type)s ELSE %(other)s END, 1, '{}', 'd',"
            f" 'SUCCEEDED', 1, 1, 5, 15, {at}, {at}, {at} + 0.01, '1' FROM {series}", v)
        conn.execute(
            f"INSERT INTO effects ({_EFFECT_COLS}) SELECT 'h' || lpad(g::text, 12, '0'),"
            " 'charge', 'charge:' || g, 'd', 'done', '{\"id\": 1}', 1, 1, 1, false,"
            f" {at}, 0 FROM {series} WHERE g %% %(every)s = 0", v)
        conn.execute("ANALYZE")


def measure(url: str, label: str) -> None:
    with Control(url) as control:
        for since, what in ((86_400.0, "first page, --since 24h"), (None, "first page, all")):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                page = control.effects(TYPE, newer_than_s=since, limit=1000)
                times.append(time.perf_counter() - t0)
            print(f"{label:10} {what:28} {len(page.effects):6} rows  "
                  f"p50 {sorted(times)[2] * 1000:8.1f} ms")
        t0 = time.perf_counter()
        rows, cursor = 0, None
        while True:
            page = control.effects(TYPE, newer_than_s=86_400.0, limit=500, cursor=cursor)
            rows += len(page.effects)
            cursor = page.next_cursor
            if cursor is None:
                break
        print(f"{label:10} {'full walk, --since 24h':28} {rows:6} rows  "
              f"{(time.perf_counter() - t0) * 1000:11.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--span-days", type=float, default=7.0)
    parser.add_argument("--dialects", default="sqlite,postgresql")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args()
    now = time.time()
    span = args.span_days * 86_400
    start, step = now - span, span / args.tasks
    print(f"{args.tasks} tasks over {args.span_days} days, 1 in {args.every} of {TYPE!r} "
          "with one effect")
    for dialect in args.dialects.split(","):
        if dialect == "sqlite":
            tmp = tempfile.mkdtemp(prefix="rc-walk-")
            try:
                url = f"sqlite:///{tmp}/l.db"
                open_ledger(url).close()
                fill_sqlite(f"{tmp}/l.db", args.tasks, args.every, start, step)
                measure(url, "sqlite")
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            import psycopg
            from psycopg import sql

            schema = f"rc_walk_{secrets.token_hex(4)}"
            sep = "&" if "?" in args.pg_url else "?"
            url = f"{args.pg_url}{sep}schema={schema}"
            open_ledger(url).close()
            try:
                fill_pg(args.pg_url, schema, args.tasks, args.every, start, step)
                measure(url, "postgresql")
            finally:
                with psycopg.connect(args.pg_url, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(
                        sql.Identifier(schema)))


if __name__ == "__main__":
    main()
