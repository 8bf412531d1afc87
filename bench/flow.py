"""Flow control (DESIGN §8): what its claims cost, and what queues and priorities do for
a critical queue beside a flood, on both ledgers.

1. **Drain, no flow feature configured: before / after.** ``--tasks`` ready no-op tasks
   drained by one worker (``--concurrency``, default 8 = the Worker's default) on a fresh
   ledger, with the code of ``--before REV`` (a git revision, e.g. the commit before flow
   control) and of this tree, alternated round by round (``--repeat``), so the machine's
   drift hits both alike. Every drain runs in a child process from a snapshot of its
   tree's ``src/ratchet`` (``PYTHONPATH``), which also submits its tasks (each tree
   migrates its own ledger). tasks/s from the first claimed task to the last finished one
   (start-up and submit excluded), as in ``bulkheads.py``.
2. **Claim cost per flow feature** (this tree, in the same rounds): the same drain of
   ``bench.plain`` (none), of a type with a rate limit that never throttles
   (``--rate``: the token bucket read, spent and saved at every claim), of ``--keys``
   tasks with distinct concurrency keys (``max_per_key=1``, one task per key: the slot
   admitted at submit, the release trigger at finish) and of a fair type with
   ``--tenants`` tenants (round-robin across fairness keys). µs per task = 1e6 / tasks/s;
   the difference with ``plain`` is what the feature adds. Also the submit cost, one by
   one (``--submit-one`` tasks) and ``submit_many`` x100 (the rest).
3. **Flood**: ``--flood`` ready ``bench.bulk`` no-op tasks (queue ``bulk``) drained while
   one ``bench.critical`` task (queue ``critical``) is submitted every ``1/--critical-rate``
   s. The critical wait is submit → body start: the submitter passes ``time.time()`` in
   the params and the body subtracts it from its own (same host clock); p50 / p99 / max.
   The bulk drain rate comes from the ledger (finished bulk tasks / (last - first finish)).
   Shapes: ``queues, 2 workers`` (one worker process ``queues=["critical"]``, one
   ``queues=["bulk"]``); ``queues, 1 worker`` (one process serving both); ``priority,
   1 worker`` (both types in the default queue, the critical tasks ``priority=10``).

Usage::

    .venv/bin/python bench/flow.py --before 3130700^        # all of it, both ledgers
    .venv/bin/python bench/flow.py --ledgers sqlite --skip-flood --repeat 5
    .venv/bin/python bench/flow.py --quick --ledgers sqlite  # seconds: a smoke run

It asserts nothing (a measurement tool, not a test). PostgreSQL: ``--pg-url`` (default
``$RATCHET_TEST_PG_URL`` or the test server); each ledger is a schema of its own, dropped
at the end. The load average is printed with every figure: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
CHILD = "--child" in sys.argv
if not CHILD:  # children import the snapshot on PYTHONPATH
    sys.path.insert(0, str(ROOT / "src"))

import ratchet  # noqa: E402
from ratchet import App, Control, State, TaskContext, Worker  # noqa: E402

DEFAULT_PG_URL = os.environ.get("RATCHET_TEST_PG_URL",
                                "postgresql://postgres@127.0.0.1:5432/test")
SCENARIOS = ("plain", "rate", "keyed", "fair")
SHAPES = ("queues, 2 workers", "queues, 1 worker", "priority, 1 worker")
CHILD_TIMEOUT_S = 1800.0


# ----------------------------------------------------------------------------- helpers


def load() -> float:
    return os.getloadavg()[0]


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def fmt(values: Sequence[float], digits: int = 0) -> str:
    if not values:
        return "-"
    spread = (f" [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"
              if len(values) > 1 else "")
    return f"{statistics.median(values):,.{digits}f}{spread}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
           "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(out)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


class Ledgers:
    """Fresh ledgers: SQLite files in a temp dir, PostgreSQL schemas (dropped at close)."""

    def __init__(self, pg_url: str, directory: Path) -> None:
        self.dir = directory
        self.pg_url = pg_url
        self.schemas: list[str] = []
        self.n = 0

    def new(self, backend: str) -> str:
        self.n += 1
        if backend == "sqlite":
            return f"sqlite:///{self.dir}/l{self.n}.db"
        schema = f"bench_flow_{secrets.token_hex(4)}"
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


class Sql:
    """Plain SQL on a ledger's tables (the bench's own reads and one insert), either
    dialect; statements are written with ``%s`` placeholders."""

    def __init__(self, url: str) -> None:
        self.sqlite = url.startswith("sqlite:")
        if self.sqlite:
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30,
                                             isolation_level=None)
        else:
            import psycopg
            from psycopg import sql

            parts = urlsplit(url)
            query = dict(parse_qsl(parts.query))
            schema = query.pop("schema")
            self.conn = psycopg.connect(
                urlunsplit(parts._replace(query=urlencode(list(query.items())))),
                autocommit=True)
            self.conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))

    def rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.sqlite:
            statement = statement.replace("%s", "?")
        return list(self.conn.execute(statement, params).fetchall())

    def run(self, statement: str, params: Sequence[Any] = ()) -> None:
        if self.sqlite:
            statement = statement.replace("%s", "?")
        self.conn.execute(statement, params)

    def close(self) -> None:
        self.conn.close()


def snapshot(rev: str | None, into: Path) -> Path:
    """``src/ratchet`` of git revision ``rev`` (None: the working tree) under ``into/src``;
    returns the directory to put on ``PYTHONPATH``."""
    src = into / "src"
    src.mkdir(parents=True)
    if rev is None:
        shutil.copytree(ROOT / "src" / "ratchet", src / "ratchet",
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "archive", rev, "src/ratchet"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return src


def run_child(src: Path, args: Sequence[str], out: Path) -> dict[str, Any]:
    """This file run as a child with ``src`` on ``PYTHONPATH``; returns its JSON."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, str(HERE), "--child", *args, "--out", str(out)],
                   env=env, check=True, timeout=CHILD_TIMEOUT_S)
    result: dict[str, Any] = json.loads(out.read_text())
    if not result["ratchet_file"].startswith(str(src)):
        raise RuntimeError(f"child ran {result['ratchet_file']}, not the snapshot {src}")
    return result


# ----------------------------------------------------------------------------- the apps


def build_app(url: str, scenario: str, rate: str = "1000000/s") -> App:
    """The bench's task types on ``url``. ``plain`` uses nothing of flow control (it runs
    on code older than it too)."""
    app = ratchet.App(url)
    if scenario == "plain":
        @app.task(name="bench.plain")
        def plain(ctx: TaskContext, i: int = 0) -> None:
            return None
    elif scenario == "rate":
        @app.task(name="bench.rate", rate_limit=ratchet.RateLimit(rate, burst=1_000_000))
        def rated(ctx: TaskContext, i: int = 0) -> None:
            return None
    elif scenario == "keyed":
        @app.task(name="bench.keyed", concurrency_key=lambda p: p["k"], max_per_key=1)
        def keyed(ctx: TaskContext, i: int = 0, k: str = "") -> None:
            return None
    elif scenario == "fair":
        @app.task(name="bench.fair", fair=True)
        def fair(ctx: TaskContext, i: int = 0) -> None:
            return None
    elif scenario == "flood":
        @app.task(name="bench.bulk", queue="bulk")
        def bulk(ctx: TaskContext, i: int = 0) -> None:
            return None

        @app.task(name="bench.critical", queue="critical")
        def critical(ctx: TaskContext, t: float = 0.0) -> float:
            return time.time() - t  # the wait: submit -> body start, same host clock
    else:
        raise ValueError(scenario)
    return app


def ensure_rate_limit(url: str, name: str, per_s: float, burst: int) -> None:
    """The ``rate_limits`` row of ``name``. A worker's registration of its code's limits
    or ``Control.set_rate_limit`` writes it where they exist; the bench writes it itself
    when neither has (the claim reads the row, not the code)."""
    sql = Sql(url)
    try:
        if not sql.rows("SELECT 1 FROM rate_limits WHERE scope = 'type' AND name = %s",
                        [name]):
            sql.run("INSERT INTO rate_limits (scope, name, rate_per_s, burst, key_param, "
                    "source, version, updated_at, updated_by, reason) "
                    "VALUES ('type', %s, %s, %s, NULL, 'code', 1, %s, 'bench', 'bench')",
                    [name, per_s, burst, time.time()])
    finally:
        sql.close()


def submit_tasks(app: App, scenario: str, n: int, one_by_one: int,
                 tenants: int) -> tuple[float, float]:
    """Submits ``n`` tasks of ``scenario``: the first ``one_by_one`` with ``app.submit``,
    the rest with ``submit_many`` x100. Returns the µs per task of each (nan if none)."""
    name = f"bench.{scenario}"

    def request(i: int) -> tuple[dict[str, Any], str | None]:
        params: dict[str, Any] = {"i": i}
        if scenario == "keyed":
            params["k"] = f"k{i}"
        return params, (f"t{i % tenants}" if scenario == "fair" else None)

    first = min(n, one_by_one)
    start = time.perf_counter()
    for i in range(first):
        params, tenant = request(i)
        if tenant is None:
            app.submit(name, params)
        else:
            app.submit(name, params, tenant=tenant)
    one = (time.perf_counter() - start) / first * 1e6 if first else float("nan")
    start = time.perf_counter()
    for lo in range(first, n, 100):
        batch = []
        for i in range(lo, min(n, lo + 100)):
            params, tenant = request(i)
            batch.append(ratchet.SubmitRequest(name, params, tenant=tenant))
        app.submit_many(batch)
    many = (time.perf_counter() - start) / (n - first) * 1e6 if n > first else float("nan")
    return one, many


def child_drain(args: argparse.Namespace) -> dict[str, Any]:
    """One drain (section 1 and 2), in a child process on its tree's snapshot."""
    scenario = args.scenario
    app = build_app(args.url, scenario, args.rate)
    with Control(args.url) as control:
        control.migrate()  # not in the submit's time
    if scenario == "rate":
        limit = ratchet.RateLimit(args.rate)
        ensure_rate_limit(args.url, "bench.rate", limit.per_s, 1_000_000)
    one, many = submit_tasks(app, scenario, args.tasks, args.submit_one, args.tenants)
    marks: list[float] = []
    cpu: list[float] = []

    class Timed(Worker):
        """Times from the first claimed task to the last finished one."""

        def on_claimed(self, claim: Any) -> None:
            if not marks:
                marks.append(time.perf_counter())
                cpu.append(time.process_time())

        def on_finished(self, claim: Any, outcome: str) -> None:
            if len(marks) < 2:
                marks.append(0.0)
                cpu.append(0.0)
            marks[1] = time.perf_counter()
            cpu[1] = time.process_time()

    Timed(app, concurrency=args.concurrency).run(max_tasks=args.tasks)
    app.close()
    seconds = marks[1] - marks[0]
    return {"ratchet_file": ratchet.__file__, "n": args.tasks, "seconds": seconds,
            "rate": args.tasks / seconds, "cpu_us": (cpu[1] - cpu[0]) / args.tasks * 1e6,
            "submit_one_us": one, "submit_many_us": many}


def child_claims(args: argparse.Namespace) -> dict[str, Any]:
    """Claims alone (section 1's detail): ``--tasks`` plain tasks claimed through
    ``Ledger.claim`` in batches of ``--claim-limit`` until none is left, nothing finished:
    the claim transaction's cost per claimed task, wall and process CPU (SQLite: the whole
    statement work is in this process)."""
    app = build_app(args.url, "plain")
    with Control(args.url) as control:
        control.migrate()
    submit_tasks(app, "plain", args.tasks, 0, 1)
    kinds = [("bench.plain", 1)]
    claimed = calls = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while claimed < args.tasks:
        got = app.ledger.claim("bench-claims", kinds, args.claim_limit)
        claimed += len(got)
        calls += 1
        if not got:
            break
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    app.close()
    return {"ratchet_file": ratchet.__file__, "n": claimed, "calls": calls,
            "us": wall / claimed * 1e6, "cpu_us": cpu / claimed * 1e6,
            "claim_ms": wall / calls * 1000}


def child_worker(args: argparse.Namespace) -> None:
    """A worker process of the flood (runs until killed)."""
    app = build_app(args.url, "flood")
    queues = args.queues.split(",") if args.queues else None
    Worker(app, concurrency=args.concurrency, queues=queues).run()


# ----------------------------------------------------------------------------- drains


def drains(args: argparse.Namespace, ledgers: Ledgers, backend: str,
           trees: dict[str, Path], tmp: Path) -> None:
    """Sections 1 and 2 on one ledger, interleaved round by round."""
    labels = ([("before", "plain")] if "before" in trees else []) + [
        ("after", s) for s in SCENARIOS if s in args.scenarios.split(",")]
    results: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in labels}
    loads: list[float] = []
    for r in range(args.repeat):
        for tree, scenario in labels:
            n = {"keyed": args.keys, "fair": args.fair_tasks}.get(scenario, args.tasks)
            loads.append(load())
            out = tmp / f"drain-{backend}-{tree}-{scenario}-{r}.json"
            res = run_child(trees[tree], [
                "drain", "--url", ledgers.new(backend), "--scenario", scenario,
                "--tasks", str(n), "--concurrency", str(args.concurrency),
                "--submit-one", str(min(args.submit_one, n)), "--tenants", str(args.tenants),
                "--rate", args.rate], out)
            res["load"] = loads[-1]
            results[(tree, scenario)].append(res)
            print(f"  [{backend}] round {r + 1} {tree:6} {scenario:6} n={n:,} "
                  f"{res['rate']:,.0f} tasks/s (load {res['load']:.2f})", flush=True)
    print(f"\n[{backend}] drain, C={args.concurrency}, {args.repeat} rounds, median [min-max]; "
          f"load {min(loads):.2f}-{max(loads):.2f}")
    base = results.get(("after", "plain"), [])
    base_us = statistics.median(1e6 / r["rate"] for r in base) if base else float("nan")
    rows = []
    for key in labels:
        tree, scenario = key
        runs = results[key]
        rates = [r["rate"] for r in runs]
        us = [1e6 / r["rate"] for r in runs]
        extra = statistics.median(us) - base_us
        rows.append([f"{tree} {scenario}", f"{runs[0]['n']:,}", fmt(rates), fmt(us, 1),
                     "-" if (tree, scenario) == ("after", "plain") or not base
                     else f"{extra:+.1f}",
                     fmt([r["cpu_us"] for r in runs]),
                     fmt([r["submit_one_us"] for r in runs]),
                     fmt([r["submit_many_us"] for r in runs], 1)])
    print(table(["tree / scenario", "tasks", "drain tasks/s", "µs/task", "Δ µs vs plain",
                 "CPU µs/task", "submit 1-by-1 µs", "submit_many µs"], rows))
    if "before" in trees and base:
        pairs = [a["rate"] / b["rate"] for a, b in
                 zip(results[("after", "plain")], results[("before", "plain")], strict=True)]
        print(f"after / before (plain drain, per round): "
              f"{', '.join(f'{p:.3f}' for p in pairs)}; median {statistics.median(pairs):.3f}")
    print(flush=True)


def claim_costs(args: argparse.Namespace, ledgers: Ledgers, backend: str,
                trees: dict[str, Path], tmp: Path) -> None:
    """Claims alone, before / after, alternated (:func:`child_claims`)."""
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    loads: list[float] = []
    for r in range(args.repeat):
        for tree in sorted(trees, reverse=True):  # before, then after
            loads.append(load())
            res = run_child(trees[tree], [
                "claims", "--url", ledgers.new(backend), "--tasks", str(args.tasks),
                "--claim-limit", str(args.claim_limit)],
                tmp / f"claims-{backend}-{tree}-{r}.json")
            results[tree].append(res)
            print(f"  [{backend}] round {r + 1} claims {tree:6} {res['us']:,.1f} µs/task "
                  f"(load {loads[-1]:.2f})", flush=True)
    print(f"\n[{backend}] claims alone, {args.tasks:,} tasks in claims of "
          f"{args.claim_limit}, {args.repeat} rounds; load {min(loads):.2f}-{max(loads):.2f}")
    rows = [[tree, fmt([x["us"] for x in results[tree]], 1),
             fmt([x["cpu_us"] for x in results[tree]], 1),
             fmt([x["claim_ms"] for x in results[tree]], 2)]
            for tree in sorted(trees, reverse=True)]
    print(table(["tree", "µs/claimed task", "CPU µs/task", "ms/claim"], rows))
    if "before" in trees:
        pairs = [a["us"] / b["us"] for a, b in
                 zip(results["after"], results["before"], strict=True)]
        print(f"after / before (µs per claimed task, per round): "
              f"{', '.join(f'{x:.3f}' for x in pairs)}; median {statistics.median(pairs):.3f}")
    print(flush=True)


# ----------------------------------------------------------------------------- flood


def flood_run(url: str, shape: str, args: argparse.Namespace, src: Path) -> dict[str, float]:
    """One flood; returns the critical waits (s), the bulk drain rate and the load."""
    app = build_app(url, "flood")
    by_priority = shape.startswith("priority")
    bulk_queue = "default" if by_priority else None
    for lo in range(0, args.flood, 500):
        app.submit_many([ratchet.SubmitRequest("bench.bulk", {"i": i}, queue=bulk_queue)
                         for i in range(lo, min(args.flood, lo + 500))])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")])
    workers = [["critical"], ["bulk"]] if shape.startswith("queues, 2") else [[]]
    procs = [subprocess.Popen([sys.executable, str(HERE), "--child", "worker", "--url", url,
                               "--concurrency", str(args.concurrency),
                               "--queues", ",".join(q)], env=env)
             for q in workers]
    sql = Sql(url)
    critical: list[str] = []
    submits: list[float] = []  # the submit call's own time, part of the wait
    loads = [load()]

    def pending() -> int:
        return int(sql.rows("SELECT count(*) FROM tasks WHERE name = 'bench.bulk' "
                            "AND state IN ('PENDING', 'RETRY_WAIT')")[0][0])

    try:
        deadline = time.monotonic() + 60
        while pending() >= args.flood and time.monotonic() < deadline:
            time.sleep(0.02)  # the bulk drain has started
        every = 1.0 / args.critical_rate
        next_submit = next_check = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.25
                if pending() == 0:
                    break
            if now >= next_submit:
                params = {"t": time.time()}
                if by_priority:
                    critical.append(app.submit("bench.critical", params, queue="default",
                                               priority=10).task_id)
                else:
                    critical.append(app.submit("bench.critical", params).task_id)
                submits.append(time.time() - params["t"])
                next_submit += every
            time.sleep(max(0.0, min(next_submit, next_check) - time.monotonic()))
        loads.append(load())
        with Control(url) as control:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                infos = control.get_many(critical)
                if all(t.state is State.SUCCEEDED for t in infos):
                    break
                time.sleep(0.1)
        count, first, last = sql.rows(
            "SELECT count(*), min(updated_at), max(updated_at) FROM tasks "
            "WHERE name = 'bench.bulk' AND state = 'SUCCEEDED'")[0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        sql.close()
        app.close()
    waits = [float(t.result) for t in infos if t.state is State.SUCCEEDED]
    return {"n": len(critical), "done": len(waits), "p50": pct(waits, 0.5),
            "p99": pct(waits, 0.99), "max": max(waits, default=float("nan")),
            "submit_p50": pct(submits, 0.5), "submit_p99": pct(submits, 0.99),
            "bulk_rate": count / (last - first) if last and last > first else float("nan"),
            "load": max(loads)}


def floods(args: argparse.Namespace, ledgers: Ledgers, backend: str, src: Path) -> None:
    rows = []
    loads: list[float] = []
    for shape in SHAPES:
        r = flood_run(ledgers.new(backend), shape, args, src)
        loads.append(r["load"])
        print(f"  [{backend}] {shape}: critical p50 {r['p50'] * 1000:,.0f} ms, "
              f"p99 {r['p99'] * 1000:,.0f} ms; bulk {r['bulk_rate']:,.0f} tasks/s "
              f"(load {r['load']:.2f})", flush=True)
        rows.append([shape, f"{r['done']}/{r['n']}", f"{r['p50'] * 1000:,.0f}",
                     f"{r['p99'] * 1000:,.0f}", f"{r['max'] * 1000:,.0f}",
                     f"{r['submit_p50'] * 1000:,.1f} / {r['submit_p99'] * 1000:,.0f}",
                     f"{r['bulk_rate']:,.0f}", f"{r['load']:.2f}"])
    print(f"\n[{backend}] flood: {args.flood:,} bulk tasks, critical at "
          f"{args.critical_rate:g}/s during the drain, C={args.concurrency} per worker")
    print(table(["shape", "critical", "wait p50 ms", "p99 ms", "max ms",
                 "submit p50 / p99 ms", "bulk tasks/s", "load"], rows))
    print(flush=True)


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--ledgers", default="sqlite,postgresql", help="sqlite,postgresql")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL)
    p.add_argument("--before", default=None, metavar="REV",
                   help="also drain plain tasks with src/ratchet of this git revision, "
                        "alternated with this tree's")
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per drain (20000)")
    p.add_argument("--keys", type=int, default=10_000,
                   help="keyed drain: tasks, one per concurrency key (10000)")
    p.add_argument("--tenants", type=int, default=1_000, help="fair drain: tenants (1000)")
    p.add_argument("--fair-tasks", type=int, default=None,
                   help="fair drain: tasks (default --tasks)")
    p.add_argument("--rate", default="1000000/s",
                   help="rate limit of the rated drain, never reached (1000000/s)")
    p.add_argument("--submit-one", type=int, default=1_000,
                   help="tasks of each drain submitted one by one (1000; the rest x100)")
    p.add_argument("--concurrency", type=int, default=8, help="worker threads (8)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of drains (3)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--flood", type=int, default=50_000, help="bulk tasks of a flood (50000)")
    p.add_argument("--critical-rate", type=float, default=20.0,
                   help="critical submits per second during a flood (20)")
    p.add_argument("--claim-limit", type=int, default=8,
                   help="claims alone: tasks per claim (8)")
    p.add_argument("--skip-drain", action="store_true")
    p.add_argument("--skip-claims", action="store_true",
                   help="skip the claims-alone section (it runs with --before)")
    p.add_argument("--skip-flood", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, one round (a smoke run of every section)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scenario", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--queues", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child == "drain":
        Path(args.out).write_text(json.dumps(child_drain(args)))
        return 0
    if args.child == "claims":
        Path(args.out).write_text(json.dumps(child_claims(args)))
        return 0
    if args.child == "worker":
        child_worker(args)
        return 0
    if args.quick:
        args.tasks, args.keys, args.tenants, args.submit_one = 200, 200, 20, 20
        args.repeat, args.flood, args.fair_tasks = 1, 600, None
    if args.fair_tasks is None:
        args.fair_tasks = args.tasks
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-flow-"))
    trees = {"after": snapshot(None, tmp / "after")}
    dirty = " (src/ has uncommitted changes)" if git("status", "--porcelain", "--",
                                                     "src") else ""
    head = f"git {git('rev-parse', '--short', 'HEAD')}{dirty}"
    if args.before:
        trees["before"] = snapshot(args.before, tmp / "before")
        head += f", before = {git('rev-parse', '--short', args.before)}"
    print(f"Ratchet flow-control bench: {os.cpu_count()} CPUs, Python "
          f"{sys.version.split()[0]}, {head}; load {load():.2f}\n", flush=True)
    ledgers = Ledgers(args.pg_url, tmp)
    try:
        for backend in [b for b in args.ledgers.split(",") if b]:
            if not args.skip_drain:
                drains(args, ledgers, backend, trees, tmp)
            if "before" in trees and not args.skip_claims:
                claim_costs(args, ledgers, backend, trees, tmp)
            if not args.skip_flood:
                floods(args, ledgers, backend, trees["after"])
    finally:
        ledgers.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
