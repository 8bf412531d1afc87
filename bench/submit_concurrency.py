"""``App.submit`` from many threads at once: tasks/s with 1, 4 and 16 submitting threads.

Each measurement runs in a child process on a fresh ledger (a private PostgreSQL schema,
or a new SQLite file): one App shared by ``T`` threads, ``N`` no-op tasks in all (each
thread its share, one ``app.submit`` per task, no idempotency key). Every thread first
submits one untimed task, then all start at one barrier; the clock stops when the last
thread is done.

``--before DIR`` compares another Ratchet tree in the same run: ``DIR`` is put on the
child's ``PYTHONPATH`` (it holds the ``ratchet`` package), e.g. the last commit's
(``--after DIR`` likewise replaces the tree under test, default this checkout's ``src``)::

    mkdir -p /tmp/before && git archive HEAD src/ratchet | tar -x -C /tmp/before
    .venv/bin/python bench/submit_concurrency.py --before /tmp/before/src

To isolate one file's change from others' commits, make both trees from one commit and
put the old file in ``before`` (``git show REV:src/ratchet/app.py > /tmp/before/...``).

Measurements of both trees are interleaved (before, after, before, after, ...) so a
change of the machine's load moves both. Figures are printed, never asserted. Every
schema the run creates is dropped at the end, and no other.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
TASK = "bench.noop"


def child(url: str, n: int, threads: int) -> dict[str, Any]:
    """Submit ``n`` tasks from ``threads`` threads sharing one App on ``url``; return
    ``{"tasks_per_s", "call_ms_p50", "call_ms_p99", "transactions", "ratchet"}``."""
    import ratchet

    app = ratchet.App(url)

    @app.task(name=TASK)
    def noop(ctx: ratchet.TaskContext) -> None:
        return None

    _ = app.ledger  # open and migrate outside the timed part
    shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
    warm = threading.Barrier(threads)
    start = threading.Barrier(threads + 1)
    calls: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            warm.wait(timeout=60)
            app.submit(TASK)  # untimed: the pool opens its connections
            start.wait(timeout=60)
            out = calls[i]
            for _ in range(shares[i]):
                t = time.perf_counter()
                app.submit(TASK)
                out.append(time.perf_counter() - t)
        except BaseException as exc:  # reported below
            errors.append(exc)
            warm.abort()
            start.abort()

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for th in pool:
        th.start()
    group = getattr(app, "_submit_group", None)
    before = getattr(group, "transactions", 0)
    with contextlib.suppress(threading.BrokenBarrierError):  # a thread failed: see errors
        start.wait(timeout=120)
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    elapsed = time.perf_counter() - t0
    after = getattr(group, "transactions", None)
    app.close()
    if errors:
        raise errors[0]
    ms = sorted(1e3 * x for c in calls for x in c)
    return {
        "tasks_per_s": n / elapsed,
        "call_ms_p50": ms[len(ms) // 2],
        "call_ms_p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "transactions": None if after is None else after - before,
        "ratchet": str(Path(ratchet.__file__).parent),
    }


def pg_url(base: str, schema: str, durability: str) -> str:
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("schema", "durability")]
    query += [("schema", schema), ("durability", durability)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def libpq_url(base: str) -> str:
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query)
             if k not in ("schema", "durability", "pool_size", "busy_timeout_s")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledger", choices=("postgresql", "sqlite"), default="postgresql")
    p.add_argument("--url", default=os.environ.get("RATCHET_TEST_PG_URL", DEFAULT_PG_URL),
                   help="PostgreSQL server (default %(default)s)")
    p.add_argument("--durability", default="fsync", choices=("fsync", "buffered"))
    p.add_argument("-n", "--tasks", type=int, default=5000)
    p.add_argument("--threads", default="1,4,16")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--before", help="a directory holding another ratchet package to compare")
    p.add_argument("--after", default=str(SRC),
                   help="the directory of the ratchet package under test (default: this "
                        "checkout's src)")
    p.add_argument("--json", help="write every measurement to this file")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    trees = [("before", args.before)] if args.before else []
    trees.append(("after", args.after))

    conn = None
    created: list[str] = []
    tmp = tempfile.TemporaryDirectory(prefix="rbench_submit_")
    tag = f"rbench_sub_{os.getpid()}_{secrets.token_hex(2)}"
    if args.ledger == "postgresql":
        import psycopg

        conn = psycopg.connect(libpq_url(args.url), autocommit=True)
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(args.repeat):
            for t in threads:
                for label, tree in trees:
                    name = f"{tag}_{len(created)}"
                    created.append(name)
                    if args.ledger == "postgresql":
                        url = pg_url(args.url, name, args.durability)
                    else:
                        url = f"sqlite:///{tmp.name}/{name}.db?durability={args.durability}"
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    out = subprocess.run(
                        [sys.executable, __file__, "_child", url, str(args.tasks), str(t)],
                        env=env, capture_output=True, text=True, timeout=1800,
                    )
                    if out.returncode != 0:
                        sys.exit(f"child failed ({label}, {t} threads):\n{out.stderr}")
                    fig = json.loads(out.stdout.strip().splitlines()[-1])
                    fig.update(tree=label, threads=t, repeat=rep)
                    rows.append(fig)
                    if rep == 0 and t == threads[0]:
                        print(f"  {label}: ratchet from {fig['ratchet']}")
                    tx = fig["transactions"]
                    print(f"  rep {rep} {label:6} T={t:<3} {fig['tasks_per_s']:8.0f} tasks/s  "
                          f"p50 {fig['call_ms_p50']:6.2f} ms  p99 {fig['call_ms_p99']:7.2f} ms"
                          + (f"  {args.tasks / tx:5.1f} tasks/tx" if tx else ""),
                          flush=True)
                    if conn is not None:
                        from psycopg import sql

                        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                                     .format(sql.Identifier(name)))
    finally:
        if conn is not None:
            from psycopg import sql

            for name in created:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                             .format(sql.Identifier(name)))
            conn.close()
        tmp.cleanup()
    print(f"\n{args.ledger} {args.durability}, N={args.tasks}, median of {args.repeat} "
          "(tasks/s):")
    print(f"{'threads':>8} " + " ".join(f"{label:>10}" for label, _ in trees)
          + ("     ratio" if len(trees) == 2 else ""))
    for t in threads:
        med = [statistics.median(r["tasks_per_s"] for r in rows
                                 if r["threads"] == t and r["tree"] == label)
               for label, _ in trees]
        print(f"{t:>8} " + " ".join(f"{m:>10.0f}" for m in med)
              + (f" {med[1] / med[0]:>8.2f}x" if len(med) == 2 else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "_child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        main()
