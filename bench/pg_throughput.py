"""Ratchet on PostgreSQL: enqueue, drain, pickup latency and claim latency, beside pgqueuer.

Run::

    .venv/bin/python bench/pg_throughput.py                       # everything, N = 20,000
    .venv/bin/python bench/pg_throughput.py --tasks 5000 --repeat 3
    .venv/bin/python bench/pg_throughput.py --no-pgqueuer --processes 1 --concurrency 32

What it measures, in one run, against one PostgreSQL server (``--pg-url``, default
``$RATCHET_TEST_PG_URL`` or ``postgresql://postgres@127.0.0.1:5432/test``):

1. pgqueuer (its own virtualenv ``bench/.venv-pgqueuer``, made on demand; its tables installed
   with ``pgq install`` into a fresh schema): enqueue one by one and in batches of 100, and the
   drain of N no-op jobs by 1 and 4 consumer processes (``QueueManager.run(batch_size=10,
   mode=drain)``), timed inside the consumers; and the pickup latency of one job on an idle
   consumer;
2. Ratchet, on a fresh ledger schema per measurement (``?schema=...``): enqueue
   (``app.submit`` one by one, ``app.submit_many`` x100), the drain of N no-op tasks (1 step
   and 0 steps) by 1 and 4 worker processes, ``fsync`` and ``buffered``; end-to-end latency of
   one task on an idle worker (p50 / p99); claim latency with 10k and with 1M tasks in the
   ledger, with the claim query's ``EXPLAIN (ANALYZE, BUFFERS)``; ``app.submit`` one by one
   from T concurrent threads sharing one App (``--enqueue-threads``);
3. memory: the resident set size of one worker process at C=128 (fsync, 1 step) draining
   ``--rss-tasks`` tasks, sampled from a thread inside it, and of one pgqueuer consumer
   draining as many jobs.

Every schema the run creates is dropped at the end (``DROP SCHEMA ... CASCADE``); no other
schema is touched. Figures are printed, never asserted: this is a measurement tool, not a
test. Children are this same file run with a private first argument (``_ratchet_worker``,
``_pgq``); the pgqueuer child imports only the standard library, pgqueuer and asyncpg.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PGQ_VENV = HERE / ".venv-pgqueuer"
RESULTS_DIR = HERE / "results"
DEFAULT_PG_URL = os.environ.get(
    "RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
TASKS = {"step": "bench.noop_step", "zero": "bench.noop_zero"}
VARIANT_LABEL = {"step": "1 step", "zero": "0 steps"}
# URL query parameters that belong to Ratchet, not to libpq.
RATCHET_URL_PARAMS = ("schema", "durability", "pool_size")
# Environment of the children: PYTHONPATH points at a snapshot of src/ratchet taken when the
# run starts, so every measurement of one run uses the same code while src/ changes.
CHILD_ENV: dict[str, str] | None = None
CHILD_TIMEOUT_S = 1800.0


# ----------------------------------------------------------------------------- helpers


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _spread(values: Sequence[float]) -> str:
    if len(values) < 2:
        return ""
    return f" [{min(values):,.0f}-{max(values):,.0f}]"


def _fmt_rate(values: Sequence[float]) -> str:
    return f"{_median(values):,.0f}{_spread(values)}" if values else "-"


def _pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))
    return ordered[rank]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    out = [title] if title else []
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    out.append("  ".join("-" * w for w in widths))
    for row in rows:
        out.append("  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ))
    return "\n".join(out)


def _git_revision() -> str:
    """Short HEAD, with a note when src/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True,
            text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"git {head}{' +uncommitted src changes' if dirty else ''}"


def libpq_url(base: str) -> str:
    """``base`` without Ratchet's own query parameters (what libpq, asyncpg and pgq accept)."""
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in RATCHET_URL_PARAMS]
    return urlunsplit(parts._replace(query=urlencode(query)))


def ratchet_url(base: str, schema: str, durability: str) -> str:
    """The Ratchet ledger URL of ``schema`` on the server of ``base``."""
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("schema", "durability")]
    query += [("schema", schema), ("durability", durability)]
    return urlunsplit(parts._replace(query=urlencode(query)))


class Schemas:
    """Creates unique schema names for this run and drops exactly those, never others."""

    def __init__(self, base_url: str) -> None:
        import psycopg

        self.url = libpq_url(base_url)
        self.conn = psycopg.connect(self.url, autocommit=True)
        self.tag = f"rbench_{os.getpid()}_{secrets.token_hex(2)}"
        self.created: list[str] = []

    def new(self, kind: str) -> str:
        name = f"{self.tag}_{kind}_{len(self.created)}".lower()[:63]
        self.created.append(name)
        return name

    def drop(self, name: str) -> None:
        if name not in self.created:
            raise ValueError(f"{name} was not created by this run")
        from psycopg import sql

        self.conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))

    def drop_all(self) -> list[str]:
        dropped = []
        for name in self.created:
            try:
                self.drop(name)
                dropped.append(name)
            except Exception as exc:  # report and go on: the others still need dropping
                print(f"  WARNING: could not drop schema {name}: {exc}", file=sys.stderr)
        return dropped

    def close(self) -> None:
        self.conn.close()


def _columns(conn: Any, schema: str, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
        (schema, table),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _epoch(column: str, data_type: str) -> str:
    """SQL for ``column`` as epoch seconds, whatever its type (timestamptz or a number)."""
    if "timestamp" in data_type:
        return f"extract(epoch FROM {column})::float8"
    return f"{column}::float8"


def single_commit_rate(schemas: Schemas, synchronous_commit: str, seconds: float) -> float:
    """One-row INSERT transactions per second on one connection (the server's commit cost)."""
    import psycopg

    schema = schemas.new(f"commit_{synchronous_commit}")
    try:
        with psycopg.connect(schemas.url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".t (id bigserial PRIMARY KEY, v text)')
            conn.execute("SELECT set_config('synchronous_commit', %s, false)",
                         (synchronous_commit,))
            stmt = f'INSERT INTO "{schema}".t (v) VALUES (%s)'
            for _ in range(50):
                conn.execute(stmt, ("x" * 64,))
            count = 0
            t0 = time.perf_counter()
            while count < 200 or time.perf_counter() - t0 < seconds:
                conn.execute(stmt, ("x" * 64,))
                count += 1
            return count / (time.perf_counter() - t0)
    finally:
        schemas.drop(schema)


# ----------------------------------------------------------------------------- children I/O


class Children:
    """Child processes started together: each prints READY when set up and waits for GO on
    stdin, so process start-up, imports and migration stay out of the timed part."""

    def __init__(self, cmds: Sequence[Sequence[str]], cwd: str, env: dict[str, str] | None):
        self.procs: list[subprocess.Popen[str]] = []
        self.errs: list[Any] = []
        for cmd in cmds:
            err = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
            self.errs.append(err)
            self.procs.append(subprocess.Popen(
                list(cmd), cwd=cwd, env=env, text=True, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err,
            ))

    def wait_ready(self) -> None:
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            while line and line.strip() != "READY":  # a wrapper (py-spy) may print first
                line = proc.stdout.readline()
            if line.strip() != "READY":
                proc.wait(timeout=60)
                raise RuntimeError(f"child {i} did not start ({proc.returncode}): {line!r}\n"
                                   f"{self.stderr(i)[-4000:]}")

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()

    def wait(self, timeout: float = CHILD_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode != 0:
                raise RuntimeError(f"child {i} failed ({proc.returncode}):\n"
                                   f"{self.stderr(i)[-4000:]}")

    def stderr(self, i: int) -> str:
        self.errs[i].seek(0)
        return str(self.errs[i].read())

    def kill(self) -> None:
        """Kill what is still running (after an error) and close the stderr files."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for err in self.errs:
            err.close()


def _child_barrier() -> None:
    """In a child: tell the parent we are set up, wait for its GO."""
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "GO":
        raise SystemExit("no GO from the parent")


def _watchdog(progress: Callable[[], Any], stall_s: float) -> None:
    """In a child: if ``progress()`` stops changing for ``stall_s`` seconds, print every
    thread's stack and exit 3 (a stuck worker must not hang the whole benchmark)."""
    import faulthandler

    def watch() -> None:
        last, since = progress(), time.monotonic()
        while True:
            time.sleep(1.0)
            now = progress()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_s:
                print(f"watchdog: no progress for {stall_s:.0f} s at {now}", file=sys.stderr)
                faulthandler.dump_traceback(file=sys.stderr)
                os._exit(3)

    threading.Thread(target=watch, name="bench-watchdog", daemon=True).start()


MIB = 1048576.0


def _rss_bytes() -> int | None:
    """This process's resident set size in bytes (``/proc/self/statm``), None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _max_rss_mib() -> float | None:
    """The kernel's high-water mark of this process's RSS since its ``exec`` (``VmHWM`` of
    ``/proc/self/status``) in MiB, so also peaks between two samples; None off Linux.
    (Not ``ru_maxrss``: Linux carries the parent's RSS at ``fork`` into it.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


class RssSampler:
    """In a child: samples this process's RSS every ``interval_s`` seconds from a daemon
    thread. ``start()`` records the RSS at READY, ``stop()`` the RSS at the end and returns
    ``{"ready_mib", "peak_mib", "end_mib", "half_mib", "hwm_mib", "samples",
    "interval_s", "series"}``; ``series`` is ``[seconds since start, progress, MiB]`` about
    once a second; ``half_mib`` the first sample with ``progress() >= half``. MiB = 2**20
    bytes."""

    def __init__(self, interval_s: float, progress: Callable[[], int], half: int) -> None:
        self.interval_s = interval_s
        self.progress = progress
        self.half = half
        self.stopped = threading.Event()
        self.peak = 0
        self.count = 0
        self.ready = 0
        self.half_rss: int | None = None
        self.series: list[list[float]] = []
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def _sample(self) -> int:
        rss = _rss_bytes() or 0
        self.peak = max(self.peak, rss)
        self.count += 1
        if self.half_rss is None and self.progress() >= self.half:
            self.half_rss = rss
        return rss

    def _run(self) -> None:
        next_series = 0.0
        while not self.stopped.wait(self.interval_s):
            rss = self._sample()
            elapsed = time.monotonic() - self.t0
            if elapsed >= next_series:
                self.series.append([round(elapsed, 2), self.progress(), round(rss / MIB, 2)])
                next_series = elapsed + 1.0

    def start(self) -> None:
        self.ready = self._sample()
        self.t0 = time.monotonic()
        self.thread.start()

    def stop(self) -> dict[str, Any]:
        self.stopped.set()
        self.thread.join()
        end = self._sample()
        return {
            "ready_mib": self.ready / MIB, "peak_mib": self.peak / MIB, "end_mib": end / MIB,
            "half_mib": (self.half_rss / MIB) if self.half_rss is not None else None,
            "hwm_mib": _max_rss_mib(), "samples": self.count,
            "interval_s": self.interval_s, "series": self.series,
        }


# ----------------------------------------------------------------------------- ratchet app


def make_app(ledger: Any) -> Any:
    """The benchmark's Ratchet app: two no-op task types (one step, zero steps)."""
    import ratchet

    app = ratchet.App(ledger)

    @app.task(name=TASKS["step"])
    def noop_step(ctx: ratchet.TaskContext) -> Any:
        return ctx.step("noop", lambda: None)

    @app.task(name=TASKS["zero"])
    def noop_zero(ctx: ratchet.TaskContext) -> Any:
        return None

    return app


def enqueue_rate(url: str, n: int, batch: int) -> float:
    """Tasks/s submitted into a fresh ledger, one by one (``batch == 1``) or in batches."""
    from ratchet import SubmitRequest

    app = make_app(url)
    _ = app.ledger  # open and migrate outside the timed part
    name = TASKS["step"]
    try:
        t0 = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                app.submit(name)
        else:
            for start in range(0, n, batch):
                app.submit_many([SubmitRequest(name) for _ in range(min(batch, n - start))])
        return n / (time.perf_counter() - t0)
    finally:
        app.close()


def enqueue_threads_rate(url: str, n: int, threads: int) -> dict[str, Any]:
    """``app.submit`` one by one from ``threads`` threads sharing one App on a fresh ledger,
    ``n`` tasks in all (each thread its own share). Every thread first submits one
    untimed task, all together (so the pool has opened its connections), then all start at
    one barrier; the clock stops when the last thread is done. Returns ``{"tasks_per_s",
    "call_ms_p50", "call_ms_p99", "threads", "tasks"}``. Raises what a submit raised."""
    app = make_app(url)
    _ = app.ledger  # open and migrate outside the timed part
    name = TASKS["step"]
    shares = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
    warm = threading.Barrier(threads)
    start = threading.Barrier(threads + 1)
    calls: list[list[float]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            warm.wait(timeout=60)
            app.submit(name)
            start.wait(timeout=60)
            out = calls[i]
            for _ in range(shares[i]):
                t = time.perf_counter()
                app.submit(name)
                out.append(time.perf_counter() - t)
        except BaseException as exc:  # reported by the parent thread below
            errors.append(exc)
            warm.abort()
            start.abort()

    pool = [threading.Thread(target=run, args=(i,), name=f"bench-submit-{i}")
            for i in range(threads)]
    try:
        for th in pool:
            th.start()
        with contextlib.suppress(threading.BrokenBarrierError):  # a thread failed: below
            start.wait(timeout=120)
        t0 = time.perf_counter()
        for th in pool:
            th.join()
        elapsed = time.perf_counter() - t0
    finally:
        app.close()
    if errors:
        raise errors[0]
    ms = [1e3 * x for c in calls for x in c]
    return {"threads": threads, "tasks": n, "tasks_per_s": n / elapsed,
            "call_ms_p50": _pct(ms, 0.5), "call_ms_p99": _pct(ms, 0.99)}


def populate(url: str, variant: str, n: int) -> None:
    """Fill a fresh ledger with ``n`` ready tasks of ``variant`` (not timed)."""
    from ratchet import SubmitRequest

    app = make_app(url)
    try:
        for start in range(0, n, 1000):
            app.submit_many([SubmitRequest(TASKS[variant]) for _ in range(min(1000, n - start))])
    finally:
        app.close()


# ----------------------------------------------------------------------------- ratchet (child)


def ratchet_worker_child(argv: Sequence[str]) -> int:
    """``_ratchet_worker``: run one Worker on the ledger, write figures as JSON to --out."""
    p = argparse.ArgumentParser(prog="pg_throughput.py _ratchet_worker")
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--max-tasks", type=int, default=0, help="0: no limit (use --idle-exit)")
    p.add_argument("--idle-exit", type=float, default=2.0)
    p.add_argument("--record-tasks", action="store_true", help="per-task claim/finish times")
    p.add_argument("--rss-interval", type=float, default=0.0,
                   help="sample this process's RSS every S seconds (0: off)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import ratchet
    from ratchet import Worker

    lock = threading.Lock()
    fig: dict[str, Any] = {
        "first_claim_perf": None, "first_claim_wall": None, "cpu_at_first_claim": None,
        "last_finish_perf": None, "last_finish_wall": None, "cpu_at_last_finish": None,
        "finished": 0, "claimed": 0,
        "calls": {},  # ledger method -> [calls, seconds, rows]
    }
    per_task: dict[str, list[float]] = {}

    stmt = _count_statements()
    app = make_app(args.url)
    ledger = app.ledger  # open + migrate before READY

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        cell = fig["calls"].setdefault(name, [0, 0.0, 0])

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            out = fn(*a, **kw)
            cell[0] += 1
            cell[1] += time.perf_counter() - t
            claims = out[1] if name == "commit_and_claim" else out
            if name in ("claim", "commit_and_claim"):
                cell[2] += len(claims)
            elif name == "commit":
                cell[2] += len(a[0]) if a else 0
            return out

        return wrapper

    # Time the ledger's transactions on this instance (backend-agnostic: no subclass needed).
    for method in ("claim", "commit", "commit_and_claim", "renew"):
        if hasattr(ledger, method):
            setattr(ledger, method, timed(method, getattr(ledger, method)))

    class BenchWorker(Worker):
        def on_claimed(self, claim: Any) -> None:
            now_p, now_w = time.perf_counter(), time.time()
            with lock:
                fig["claimed"] += 1
                if fig["first_claim_perf"] is None:
                    fig["first_claim_perf"], fig["first_claim_wall"] = now_p, now_w
                    fig["cpu_at_first_claim"] = time.process_time()
                if args.record_tasks:
                    per_task[claim.task_id] = [now_w, float("nan")]
            super().on_claimed(claim)

        def on_finished(self, claim: Any, outcome: str) -> None:
            now_p, now_w = time.perf_counter(), time.time()
            with lock:
                fig["finished"] += 1
                fig["last_finish_perf"], fig["last_finish_wall"] = now_p, now_w
                fig["cpu_at_last_finish"] = time.process_time()
                if args.record_tasks and claim.task_id in per_task:
                    per_task[claim.task_id][1] = now_w
            super().on_finished(claim, outcome)

    # RATCHET_BENCH_WRITERS: the writer threads (default: the worker's own default).
    writers = os.environ.get("RATCHET_BENCH_WRITERS")
    worker = BenchWorker(app, concurrency=args.concurrency,
                         writers=int(writers) if writers else None)
    sampler = (RssSampler(args.rss_interval, lambda: int(fig["finished"]),
                          max(1, args.max_tasks // 2)) if args.rss_interval > 0 else None)
    if sampler:
        sampler.start()
    _child_barrier()
    stmt.clear()
    _watchdog(lambda: (fig["claimed"], fig["finished"]), max(60.0, 3 * args.idle_exit))
    stats = worker.run(max_tasks=args.max_tasks or None, idle_exit_s=args.idle_exit)
    rss = sampler.stop() if sampler else None
    out = {
        "rss": rss,
        "drain_s": (fig["last_finish_perf"] or 0.0) - (fig["first_claim_perf"] or 0.0),
        "cpu_s": (fig["cpu_at_last_finish"] or 0.0) - (fig["cpu_at_first_claim"] or 0.0),
        "stats": {"claimed": stats.claimed, "succeeded": stats.succeeded,
                  "failed": stats.failed, "stale": stats.stale},
        "writer_transactions": getattr(getattr(worker, "writer", None), "transactions", None),
        "writer_writes": getattr(getattr(worker, "writer", None), "writes", None),
        "per_task": per_task,
        "stmt": {k: v for k, v in stmt.items()},
        "ratchet_file": ratchet.__file__,
        "ledger_class": type(ledger).__module__ + "." + type(ledger).__qualname__,
        **{k: v for k, v in fig.items()},
    }
    app.close()
    Path(args.out).write_text(json.dumps(out))
    return 0


def _count_statements() -> dict[str, list[float]]:
    """Count and time every psycopg ``Cursor.execute`` / ``executemany`` in this process, by
    thread (writer, heartbeat, other) and first SQL word: ``{"writer:BEGIN": [n, s]}``.
    In pipeline mode a statement's wait shows up at the next synchronising call instead."""
    import psycopg

    stmt: dict[str, list[float]] = {}

    def patch(name: str) -> None:
        original = getattr(psycopg.Cursor, name)

        def wrapper(self: Any, query: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return original(self, query, *a, **kw)
            finally:
                thread = threading.current_thread().name
                role = ("writer" if "writer" in thread else
                        "heartbeat" if "heartbeat" in thread else "other")
                verb = query.split(None, 1)[0].upper() if isinstance(query, str) else "SQL"
                cell = stmt.setdefault(f"{role}:{verb}", [0, 0.0])
                cell[0] += 1
                cell[1] += time.perf_counter() - t

        setattr(psycopg.Cursor, name, wrapper)

    patch("execute")
    patch("executemany")
    return stmt


# ----------------------------------------------------------------------------- ratchet (parent)


def ledger_drain(conn: Any, schema: str) -> dict[str, Any]:
    """Succeeded count and ``max(tasks.updated_at) - min(claim time)`` read from the ledger."""
    task_cols = _columns(conn, schema, "tasks")
    audit_cols = _columns(conn, schema, "audit")
    q = f'"{schema}"'
    count, last = conn.execute(
        f"SELECT count(*), max({_epoch('updated_at', task_cols.get('updated_at', ''))})"
        f" FROM {q}.tasks WHERE state = 'SUCCEEDED'"
    ).fetchone()
    first = None
    if "at" in audit_cols and "kind" in audit_cols:
        (first,) = conn.execute(
            f"SELECT min({_epoch('at', audit_cols['at'])}) FROM {q}.audit WHERE kind = 'claim'"
        ).fetchone()
    span = (last - first) if last is not None and first is not None else float("nan")
    return {"succeeded": int(count), "ledger_drain_s": span}


def _worker_cmd(url: str, concurrency: int, out: str, max_tasks: int, idle_exit: float,
                record: bool = False, rss_interval: float = 0.0) -> list[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "_ratchet_worker", "--url", url,
           "--concurrency", str(concurrency), "--max-tasks", str(max_tasks),
           "--idle-exit", str(idle_exit), "--out", out]
    if rss_interval > 0:
        cmd += ["--rss-interval", str(rss_interval)]
    return [*cmd, "--record-tasks"] if record else cmd


def run_ratchet_drain(
    ctx: RunContext, durability: str, variant: str, concurrency: int, processes: int, n: int,
    profiler: list[str] | None = None, analyze: bool = False, rss_interval: float = 0.0,
) -> dict[str, Any]:
    """Populate a fresh ledger schema, drain it with worker subprocesses, return figures.
    ``analyze``: run ``ANALYZE`` on the tasks table before the drain (planner what-if).
    ``rss_interval`` > 0: each worker samples its RSS every that many seconds (``"rss"`` of
    the first process in the result, see :class:`RssSampler`)."""
    schema = ctx.schemas.new(f"drain_{durability[0]}{variant[0]}{concurrency}p{processes}"
                             f"{'a' if analyze else ''}{'m' if rss_interval > 0 else ''}")
    url = ratchet_url(ctx.base_url, schema, durability)
    try:
        populate(url, variant, n)
        if analyze:
            ctx.schemas.conn.execute(f'ANALYZE "{schema}".tasks')
        outs = [os.path.join(ctx.directory, f"{schema}-{i}.json") for i in range(processes)]
        cmds = [_worker_cmd(url, concurrency, out, n if processes == 1 else 0, 2.0,
                            rss_interval=rss_interval) for out in outs]
        if profiler:
            cmds = [[*profiler, "--", *cmd] for cmd in cmds]
        kids = Children(cmds, ctx.directory, CHILD_ENV)
        try:
            kids.wait_ready()
            server_before = postgres_cpu_s()
            kids.go()
            kids.wait()
            server_after = postgres_cpu_s()
        finally:
            kids.kill()
        results = [json.loads(Path(out).read_text()) for out in outs]
        for r in results:
            r.pop("per_task", None)
        ledger = ledger_drain(ctx.schemas.conn, schema)
    finally:
        ctx.schemas.drop(schema)
    first = min(r["first_claim_wall"] for r in results if r["first_claim_wall"] is not None)
    last = max(r["last_finish_wall"] for r in results if r["last_finish_wall"] is not None)
    wall_s = results[0]["drain_s"] if processes == 1 else last - first
    out: dict[str, Any] = {
        "processes": results,
        "drain_s": wall_s,
        "tasks_per_s": n / wall_s if wall_s > 0 else float("nan"),
        "ledger_tasks_per_s": (n / ledger["ledger_drain_s"]
                               if ledger["ledger_drain_s"] > 0 else float("nan")),
        "rss": results[0].get("rss"),
        "server_cpu_s": (server_after - server_before
                         if server_before is not None and server_after is not None
                         else None),
        **ledger,
    }
    if ledger["succeeded"] != n:
        print(f"  WARNING: {ledger['succeeded']}/{n} tasks SUCCEEDED in {schema}",
              file=sys.stderr)
    snapshot = (CHILD_ENV or {}).get("PYTHONPATH", "").split(os.pathsep)[0]
    if snapshot and not results[0]["ratchet_file"].startswith(snapshot):
        print(f"  WARNING: worker ran {results[0]['ratchet_file']}, not the snapshot",
              file=sys.stderr)
    return out


def postgres_cpu_s() -> float | None:
    """CPU seconds (user + system) the local PostgreSQL server has used so far: its live
    processes, plus the children the postmaster reaped (backends of closed connections,
    autovacuum workers: its cutime / cstime). None when no postgres process is visible
    (a server on another host)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, found = 0, False
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")] != "postgres":
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        found = True
    return total / tick if found else None


def run_ratchet_latency(
    ctx: RunContext, durability: str, concurrency: int, count: int, spacing_s: float
) -> dict[str, Any]:
    """End-to-end latency of one task at a time on an idle worker (already running)."""
    schema = ctx.schemas.new(f"lat_{durability[0]}")
    url = ratchet_url(ctx.base_url, schema, durability)
    out = os.path.join(ctx.directory, f"{schema}.json")
    warmup = 5
    app = make_app(url)
    samples: list[dict[str, float]] = []
    try:
        _ = app.ledger
        kids = Children([_worker_cmd(url, concurrency, out, count + warmup, 30.0, record=True)],
                        ctx.directory, CHILD_ENV)
        try:
            kids.wait_ready()
            kids.go()
            time.sleep(0.5)  # the worker is up and idle
            submitted: list[tuple[str, float, float]] = []
            for i in range(count + warmup):
                t0 = time.time()
                handle = app.submit(TASKS["step"])
                t1 = time.time()
                if i >= warmup:
                    submitted.append((handle.task_id, t0, t1))
                # wait for it to settle, then leave the worker idle for `spacing_s`
                time.sleep(spacing_s)
                deadline = time.monotonic() + 5.0
                while not app.get(handle.task_id).terminal and time.monotonic() < deadline:
                    time.sleep(0.002)
            kids.wait(timeout=120)
        finally:
            kids.kill()
        per_task = json.loads(Path(out).read_text())["per_task"]
        for task_id, t0, t1 in submitted:
            info = app.get(task_id)
            claimed_w, finished_w = per_task.get(task_id, [float("nan"), float("nan")])
            sample = {
                "submit_call_ms": 1e3 * (t1 - t0),
                "pickup_ms": 1e3 * (claimed_w - t1),  # committed submit -> worker's on_claimed
                "e2e_ms": 1e3 * (finished_w - t0),  # before submit -> worker's on_finished
                "ledger_e2e_ms": 1e3 * (info.updated_at - info.created_at),
            }
            try:
                events = app.ledger.timeline(task_id).events  # type: ignore[attr-defined]
                claim_at = min(e.at for e in events if e.kind == "claim")
                sample["ledger_pickup_ms"] = 1e3 * (claim_at - info.created_at)
            except (AttributeError, ValueError):
                pass
            samples.append(sample)
    finally:
        app.close()
        ctx.schemas.drop(schema)
    result: dict[str, Any] = {"samples": samples, "count": len(samples)}
    for key in ("submit_call_ms", "pickup_ms", "e2e_ms", "ledger_pickup_ms", "ledger_e2e_ms"):
        vals = [s[key] for s in samples if key in s and s[key] == s[key]]
        result[key] = {"p50": _pct(vals, 0.5), "p99": _pct(vals, 0.99),
                       "max": max(vals) if vals else float("nan"), "n": len(vals)}
    return result


# ----------------------------------------------------------------------------- claim latency


def _claim_query_text(module: Any) -> str | None:
    """The claim query as the ledger module exposes it (a constant or a method)."""
    for name in ("CLAIM_SQL", "CLAIM_QUERY", "_CLAIM_SQL", "_CLAIM_QUERY", "CLAIM_READY_SQL"):
        text = getattr(module, name, None)
        if isinstance(text, str):
            return text
    for holder in (module, getattr(module, "PostgresLedger", None),
                   getattr(module, "PostgreSQLLedger", None)):
        fn = getattr(holder, "claim_query", None) or getattr(holder, "claim_sql", None)
        if callable(fn):
            try:
                text = fn()
            except TypeError:
                continue
            if isinstance(text, str):
                return text
    return None


def bulk_terminal(conn: Any, schema: str, count: int) -> float:
    """Insert ``count`` SUCCEEDED rows into ``schema``.tasks with one INSERT ... SELECT
    generate_series, copying every other column from an existing task row; seconds taken."""
    cols = _columns(conn, schema, "tasks")
    q = f'"{schema}"'
    exprs = []
    for col, dtype in cols.items():
        if col == "id":
            exprs.append("gen_random_uuid()" if dtype == "uuid" else "'bulk-' || g::text")
        elif col == "state":
            exprs.append("'SUCCEEDED'")
        elif col in ("idempotency_key", "holder", "lease_until"):
            exprs.append("NULL")
        elif col in ("created_at", "updated_at", "run_at") and "timestamp" in dtype:
            exprs.append(f"{col} - make_interval(secs => g)")
        elif col in ("created_at", "updated_at", "run_at"):
            exprs.append(f"{col} - g")
        else:
            exprs.append(f'"{col}"')
    names = ", ".join(f'"{c}"' for c in cols)
    t0 = time.perf_counter()
    conn.execute(
        f"INSERT INTO {q}.tasks ({names}) SELECT {', '.join(exprs)}"
        f" FROM (SELECT * FROM {q}.tasks LIMIT 1) AS t, generate_series(1, %s) AS g",
        (count,),
    )
    return time.perf_counter() - t0


def run_claim_latency(
    ctx: RunContext, total: int, ready: int, claims: int, limit: int, explain: bool
) -> dict[str, Any]:
    """Time ``ledger.claim`` with ``total`` tasks in the ledger (``ready`` of them claimable)."""
    import ratchet
    from ratchet import SubmitRequest

    schema = ctx.schemas.new(f"claim_{total}")
    url = ratchet_url(ctx.base_url, schema, "fsync")
    app = make_app(url)
    result: dict[str, Any] = {"total": total, "ready": ready}
    try:
        ledger = app.ledger
        app.submit(TASKS["zero"])  # template row for the bulk insert
        conn = ctx.schemas.conn
        q = f'"{schema}"'
        # no statistics until we say so: the "as loaded" figures must not depend on when
        # autovacuum happens to wake up
        conn.execute(f"ALTER TABLE {q}.tasks SET (autovacuum_enabled = false)")
        conn.execute(f"UPDATE {q}.tasks SET state = 'SUCCEEDED'")
        result["bulk_insert_s"] = bulk_terminal(conn, schema, total - ready - 1)
        for start in range(0, ready, 1000):
            app.submit_many([SubmitRequest(TASKS["zero"]) for _ in range(min(1000, ready - start))])
        (result["rows"],) = conn.execute(f"SELECT count(*) FROM {q}.tasks").fetchone()
        (result["table_mb"],) = conn.execute(
            f"SELECT pg_total_relation_size('{q}.tasks') / 1048576.0"
        ).fetchone()
        holder = f"bench-claim-{os.getpid()}"
        names = [TASKS["zero"]]
        module = sys.modules.get(type(ledger).__module__)
        text = _claim_query_text(module) if module else None
        for stage in ("fresh", "analyzed"):
            if stage == "analyzed":
                conn.execute(f"ANALYZE {q}.tasks")
            if explain:
                result[f"explain_{stage}"] = explain_claim(conn, schema, text, holder, names,
                                                           limit)
            for _ in range(3):  # warm-up (connection, plan cache)
                ledger.claim(holder, names, limit)
            times = []
            got = 0
            for _ in range(claims // 2):
                t = time.perf_counter()
                got += len(ledger.claim(holder, names, limit))
                times.append(1e3 * (time.perf_counter() - t))
            result[stage] = dict(claim_ms_p50=_pct(times, 0.5), claim_ms_p99=_pct(times, 0.99),
                                 claim_ms_mean=statistics.fmean(times), claimed=got,
                                 claims=claims // 2, limit=limit)
        result["ratchet_file"] = ratchet.__file__
    finally:
        app.close()
        ctx.schemas.drop(schema)
    return result


def explain_claim(
    conn: Any, schema: str, text: str | None, holder: str, names: list[str], limit: int
) -> str:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the ledger's claim query, rolled back."""
    if text is None:
        return ("TODO: the PostgreSQL ledger module exposes no claim query text "
                "(looked for CLAIM_SQL / CLAIM_QUERY or a claim_query() function)")
    lines: list[str] = []
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(f'SET LOCAL search_path TO "{schema}"')
            # The ledger sets no planner knobs (an older revision measured with --src-rev
            # set enable_sort off per claim; its plan here is the one without that knob).
            (now,) = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
            # CLAIM_READY_SQL's parameters: now, names, limit, holder, and since versioned
            # claims lo / hi (every version of each name; ignored by older revisions)
            params = {"now": now, "names": names, "limit": limit, "holder": holder,
                      "lo": [1] * len(names), "hi": [2**31 - 1] * len(names)}
            cur = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params)
            lines = [row[0] for row in cur.fetchall()]
    except Exception as exc:
        return f"EXPLAIN failed: {exc}\nquery:\n{text}"
    return "\n".join(lines)


# ----------------------------------------------------------------------------- pgqueuer (child)


def pgq_child(argv: Sequence[str]) -> int:
    """``_pgq``: enqueue, drain or consume-with-latency against one pgqueuer schema."""
    import asyncio

    p = argparse.ArgumentParser(prog="pg_throughput.py _pgq")
    p.add_argument("--dsn", required=True)
    p.add_argument("--mode", choices=["enqueue", "drain", "latency-consumer",
                                      "latency-producer"], required=True)
    p.add_argument("--tasks", type=int, default=0)
    p.add_argument("--one-by-one", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--spacing", type=float, default=0.02)
    p.add_argument("--rss-interval", type=float, default=0.0,
                   help="drain: sample this process's RSS every S seconds (0: off)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    return asyncio.run(_pgq_main(args))


async def _pgq_main(args: argparse.Namespace) -> int:
    import asyncio

    import asyncpg
    import pgqueuer
    from pgqueuer import PgQueuer, Queries
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(args.dsn)
    result: dict[str, Any] = {"pgqueuer_version": getattr(pgqueuer, "__version__", "?"),
                              "asyncpg_version": asyncpg.__version__}
    if args.mode == "enqueue":
        queries = Queries(AsyncpgDriver(conn))
        t0 = time.perf_counter()
        for _ in range(args.one_by_one):
            await queries.enqueue("noop", None)
        result["enqueue_one_per_s"] = args.one_by_one / (time.perf_counter() - t0)
        await queries.clear_queue("noop")
        t0 = time.perf_counter()
        for start in range(0, args.tasks, 100):
            k = min(100, args.tasks - start)
            await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
        result["enqueue_batch_per_s"] = args.tasks / (time.perf_counter() - t0)
        await conn.close()
        Path(args.out).write_text(json.dumps(result))
        return 0

    if args.mode == "latency-producer":
        queries = Queries(AsyncpgDriver(conn))
        _child_barrier()
        sent: dict[str, list[float]] = {}
        for _ in range(args.tasks):
            t0 = time.time()
            (job_id,) = await queries.enqueue("noop", None)
            sent[str(job_id)] = [t0, time.time()]
            await asyncio.sleep(args.spacing)
        result["sent"] = sent
        await conn.close()
        Path(args.out).write_text(json.dumps(result))
        return 0

    pgq = PgQueuer(AsyncpgDriver(conn))
    state: dict[str, Any] = {"first_perf": None, "first_wall": None, "last_perf": None,
                             "last_wall": None, "cpu0": None, "cpu1": None, "done": 0}
    seen: dict[str, list[float]] = {}
    latency = args.mode == "latency-consumer"

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        if state["first_perf"] is None:
            state["first_perf"], state["first_wall"] = time.perf_counter(), time.time()
            state["cpu0"] = time.process_time()
        start_w = time.time()
        state["done"] += 1
        state["last_perf"], state["last_wall"] = time.perf_counter(), time.time()
        state["cpu1"] = time.process_time()
        if latency:
            seen[str(job.id)] = [start_w, state["last_wall"]]
            if state["done"] >= args.tasks:
                pgq.qm.shutdown.set()

    sampler = (RssSampler(args.rss_interval, lambda: int(state["done"]),
                          max(1, args.tasks // 2)) if args.rss_interval > 0 else None)
    if sampler:
        sampler.start()
    _child_barrier()
    t0 = time.perf_counter()
    mode = QueueExecutionMode.continuous if latency else QueueExecutionMode.drain
    await pgq.qm.run(batch_size=args.batch_size, mode=mode)
    result["rss"] = sampler.stop() if sampler else None
    result.update(
        run_s=time.perf_counter() - t0,  # includes the final flush of completion logs
        done=state["done"],
        drain_s=(state["last_perf"] or 0.0) - (state["first_perf"] or 0.0),
        first_wall=state["first_wall"],
        last_wall=state["last_wall"],
        run_end_wall=time.time(),
        cpu_s=(state["cpu1"] or 0.0) - (state["cpu0"] or 0.0),
        seen=seen,
    )
    await conn.close()
    Path(args.out).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- pgqueuer (parent)


def pgq_python(install: bool) -> str | None:
    """Python of ``bench/.venv-pgqueuer`` (``python -m venv`` + ``pip install pgqueuer
    asyncpg``), made on first use."""
    python = PGQ_VENV / "bin" / "python"
    ok = python.exists() and subprocess.run(
        [str(python), "-c", "import pgqueuer, asyncpg"], capture_output=True
    ).returncode == 0
    if ok:
        return str(python)
    if not install:
        return None
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"  creating {PGQ_VENV} and installing pgqueuer ...", flush=True)
    subprocess.run([base, "-m", "venv", str(PGQ_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "pgqueuer", "asyncpg"],
        check=True,
    )
    return str(python)


class PgqSchema:
    """A fresh schema with pgqueuer's tables, installed with its own ``pgq install``."""

    def __init__(self, ctx: RunContext, python: str, kind: str) -> None:
        self.ctx = ctx
        self.name = ctx.schemas.new(kind)
        self.dsn = libpq_url(ctx.base_url)
        # pgqueuer reads these (PGQUEUER_SCHEMA: where its objects live; PGQUEUER_PREFIX:
        # object and NOTIFY channel names, so concurrent installs never share a channel).
        self.env = dict(os.environ, PGQUEUER_SCHEMA=self.name,
                        PGQUEUER_PREFIX=f"b{os.getpid()}_{secrets.token_hex(2)}_")
        self.python = python
        pgq = str(Path(python).parent / "pgq")
        proc = subprocess.run(
            [pgq, "--pg-dsn", self.dsn, "--schema", self.name, "--prefix",
             self.env["PGQUEUER_PREFIX"], "install"],
            capture_output=True, text=True, env=self.env, timeout=300,
        )
        if proc.returncode != 0:
            ctx.schemas.drop(self.name)
            raise RuntimeError(f"pgq install failed:\n{proc.stdout}\n{proc.stderr}")

    def cmd(self, *args: str) -> list[str]:
        return [self.python, str(Path(__file__).resolve()), "_pgq", "--dsn", self.dsn, *args]

    def table(self, kind: str) -> str:
        return f'"{self.name}"."{self.env["PGQUEUER_PREFIX"]}{kind}"'

    def drop(self) -> None:
        self.ctx.schemas.drop(self.name)


def run_pgqueuer(
    ctx: RunContext, python: str, processes: int, n: int, batch: int, n_one: int,
    rss_interval: float = 0.0,
) -> dict[str, Any]:
    """Enqueue N jobs (timed one by one and in batches), drain with consumer processes.
    ``rss_interval`` > 0: each consumer samples its RSS (``"rss"`` of the first one)."""
    s = PgqSchema(ctx, python, f"pgq{processes}{'m' if rss_interval > 0 else ''}")
    try:
        out_enq = os.path.join(ctx.directory, f"{s.name}-enqueue.json")
        proc = subprocess.run(
            s.cmd("--mode", "enqueue", "--tasks", str(n), "--one-by-one", str(n_one),
                  "--out", out_enq),
            capture_output=True, text=True, env=s.env, timeout=CHILD_TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pgqueuer enqueue failed:\n{proc.stderr[-4000:]}")
        enq = json.loads(Path(out_enq).read_text())
        outs = [os.path.join(ctx.directory, f"{s.name}-drain-{i}.json")
                for i in range(processes)]
        kids = Children(
            [s.cmd("--mode", "drain", "--batch-size", str(batch), "--tasks", str(n),
                   "--rss-interval", str(rss_interval), "--out", o) for o in outs],
            ctx.directory, s.env,
        )
        try:
            kids.wait_ready()
            server_before = postgres_cpu_s()
            kids.go()
            kids.wait()
            server_after = postgres_cpu_s()
        finally:
            kids.kill()
        results = [json.loads(Path(o).read_text()) for o in outs]
        conn = ctx.schemas.conn
        (left,) = conn.execute(f"SELECT count(*) FROM {s.table('pgqueuer')}").fetchone()
        (logged,) = conn.execute(
            f"SELECT count(*) FROM {s.table('pgqueuer_log')} WHERE status = 'successful'"
        ).fetchone()
    finally:
        s.drop()
    done = sum(r["done"] for r in results)
    first = min(r["first_wall"] for r in results if r["first_wall"] is not None)
    last = max(r["last_wall"] for r in results if r["last_wall"] is not None)
    run_end = max(r["run_end_wall"] for r in results)
    drain_s = results[0]["drain_s"] if processes == 1 else last - first
    if done != n or left:
        print(f"  WARNING: pgqueuer ran {done}/{n} jobs, {left} left in the queue",
              file=sys.stderr)
    return {
        "version": enq.get("pgqueuer_version"),
        "enqueue_one_per_s": enq["enqueue_one_per_s"],
        "enqueue_batch_per_s": enq["enqueue_batch_per_s"],
        "done": done, "left_in_queue": int(left), "logged_successful": int(logged),
        "drain_s": drain_s,
        "tasks_per_s": n / drain_s if drain_s > 0 else float("nan"),
        # until the last consumer's run() returned (its final ack/log flush included)
        "tasks_per_s_until_exit": n / (run_end - first) if run_end > first else float("nan"),
        "cpu_s": sum(r["cpu_s"] for r in results),
        # the whole server's CPU while the consumers ran (as for Ratchet's drains)
        "server_cpu_s": (server_after - server_before
                         if server_before is not None and server_after is not None
                         else None),
        "per_process_done": [r["done"] for r in results],
        "rss": results[0].get("rss"),
    }


def run_pgqueuer_latency(ctx: RunContext, python: str, count: int, spacing: float
                         ) -> dict[str, Any]:
    """pgqueuer's pickup latency: an idle consumer, one producer enqueuing a job at a time."""
    s = PgqSchema(ctx, python, "pgqlat")
    warmup = 5
    try:
        out_c = os.path.join(ctx.directory, f"{s.name}-consumer.json")
        out_p = os.path.join(ctx.directory, f"{s.name}-producer.json")
        consumer = Children([s.cmd("--mode", "latency-consumer", "--tasks",
                                   str(count + warmup), "--out", out_c)], ctx.directory, s.env)
        try:
            consumer.wait_ready()
            consumer.go()
            time.sleep(0.5)
            producer = Children([s.cmd("--mode", "latency-producer", "--tasks",
                                       str(count + warmup), "--spacing", str(spacing),
                                       "--out", out_p)], ctx.directory, s.env)
            try:
                producer.wait_ready()
                producer.go()
                producer.wait(timeout=600)
            finally:
                producer.kill()
            consumer.wait(timeout=120)
        finally:
            consumer.kill()
        sent = json.loads(Path(out_p).read_text())["sent"]
        seen = json.loads(Path(out_c).read_text())["seen"]
    finally:
        s.drop()
    order = sorted(sent, key=lambda k: sent[k][0])[warmup:]
    pickup = [1e3 * (seen[k][0] - sent[k][1]) for k in order if k in seen]
    e2e = [1e3 * (seen[k][1] - sent[k][0]) for k in order if k in seen]
    return {
        "count": len(pickup),
        "pickup_ms": {"p50": _pct(pickup, 0.5), "p99": _pct(pickup, 0.99),
                      "max": max(pickup, default=float("nan"))},
        "e2e_ms": {"p50": _pct(e2e, 0.5), "p99": _pct(e2e, 0.99),
                   "max": max(e2e, default=float("nan"))},
    }


# ----------------------------------------------------------------------------- main


class RunContext:
    def __init__(self, base_url: str, directory: str, schemas: Schemas) -> None:
        self.base_url = base_url
        self.directory = directory
        self.schemas = schemas


def postgres_ledger_ready(url: str) -> str | None:
    """None when ``ratchet.open_ledger`` accepts a PostgreSQL URL, else the reason."""
    try:
        import ratchet

        ledger = ratchet.open_ledger(url)
        ledger.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per drain (default 20000)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run every drain R times, interleaved (median [min-max] reported)")
    p.add_argument("--enqueue-tasks", type=int, default=None,
                   help="tasks per enqueue measurement (default: min(--tasks, 5000))")
    p.add_argument("--enqueue-threads", default="1,16",
                   help="app.submit one by one from T threads sharing one App, "
                        "--enqueue-tasks in all ('' = skip; default 1,16)")
    p.add_argument("--rss-tasks", type=int, default=100_000,
                   help="tasks drained by one fsync / 1 step / C=--rss-concurrency worker "
                        "whose RSS is sampled (default 100000; 0 = skip)")
    p.add_argument("--rss-concurrency", type=int, default=128,
                   help="worker concurrency of the memory drain (128)")
    p.add_argument("--rss-interval", type=float, default=0.05,
                   help="RSS sampling interval in the worker, seconds (0.05)")
    p.add_argument("--rss-pgqueuer", action="store_true",
                   help="also sample a pgqueuer consumer draining --rss-tasks jobs (slow: "
                        "pgqueuer drains a 100,000-job backlog at a few hundred jobs/s)")
    p.add_argument("--processes", default="1,4", help="worker / consumer processes (1,4)")
    p.add_argument("--concurrency", default="32", help="Ratchet worker concurrencies (32)")
    p.add_argument("--durability", default="fsync,buffered")
    p.add_argument("--variants", default="step,zero", help="step (1 ctx.step) and/or zero")
    p.add_argument("--what-if-analyze", action="store_true",
                   help="also drain ledgers whose tasks table was ANALYZEd first (first "
                        "durability only): the claim plan with statistics")
    p.add_argument("--pgq-batch-size", type=int, default=10, help="pgqueuer batch_size (10)")
    p.add_argument("--no-pgqueuer", action="store_true", help="skip pgqueuer")
    p.add_argument("--no-ratchet", action="store_true", help="skip Ratchet (pgqueuer only)")
    p.add_argument("--latency-count", type=int, default=200,
                   help="single-task submissions for the pickup latency (200; 0 = skip)")
    p.add_argument("--latency-spacing", type=float, default=0.02,
                   help="idle time between two latency submissions, seconds (0.02)")
    p.add_argument("--latency-concurrency", type=int, default=8)
    p.add_argument("--claim-sizes", default="10000,1000000",
                   help="tasks in the ledger for the claim-latency test ('' = skip)")
    p.add_argument("--claim-ready", type=int, default=2000, help="claimable tasks among them")
    p.add_argument("--claim-calls", type=int, default=100)
    p.add_argument("--claim-limit", type=int, default=10)
    p.add_argument("--commit-seconds", type=float, default=2.0,
                   help="duration of each single-commit probe (2 s)")
    p.add_argument("--pg-url", default=DEFAULT_PG_URL,
                   help="server and database (default $RATCHET_TEST_PG_URL or local test db)")
    p.add_argument("--wait-for-ledger", type=float, default=0.0,
                   help="poll this many seconds for the PostgreSQL ledger to become available")
    p.add_argument("--profile", action="store_true",
                   help="also drain fsync/1 step/1 process under py-spy (wall clock, GIL)")
    p.add_argument("--profile-concurrency", type=int, default=8,
                   help="worker concurrency of the --profile drain (8, the default)")
    p.add_argument("--src-rev", default=None,
                   help="measure the committed src/ratchet of this git revision (e.g. HEAD) "
                        "instead of the working tree")
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = p.parse_args(argv)

    n = args.tasks
    n_enq = args.enqueue_tasks or min(n, 5000)
    durabilities = [d for d in args.durability.split(",") if d]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    processes = [int(c) for c in args.processes.split(",") if c]
    variants = [v for v in args.variants.split(",") if v]
    claim_sizes = [int(c) for c in args.claim_sizes.split(",") if c]
    enq_threads = [int(c) for c in args.enqueue_threads.split(",") if c]
    if any(t < 1 for t in enq_threads):
        p.error("--enqueue-threads: thread counts are >= 1")
    repeat = max(1, args.repeat)
    directory = tempfile.mkdtemp(prefix="ratchet-pgbench-")
    figures: dict[str, Any] = {"tasks": n, "repeat": repeat, "pg_url": libpq_url(args.pg_url)}

    global CHILD_ENV
    snapshot = os.path.join(directory, "src")
    if args.src_rev:
        # the committed src/ratchet of a revision: immune to edits in progress in src/
        os.makedirs(snapshot)
        archive = subprocess.run(["git", "archive", args.src_rev, "src/ratchet"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "--strip-components=1", "-C", snapshot],
                       input=archive, check=True)
        revision = "git " + subprocess.run(
            ["git", "rev-parse", "--short", args.src_rev], cwd=ROOT, capture_output=True,
            text=True, check=True).stdout.strip() + " (committed src/ratchet)"
    else:
        revision = _git_revision()
        shutil.copytree(ROOT / "src" / "ratchet", os.path.join(snapshot, "ratchet"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, snapshot)
    CHILD_ENV = dict(os.environ)
    CHILD_ENV["PYTHONPATH"] = os.pathsep.join(
        [snapshot, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    import ratchet

    schemas = Schemas(args.pg_url)
    ctx = RunContext(args.pg_url, directory, schemas)
    (server,) = schemas.conn.execute("SHOW server_version").fetchone()
    (sync_commit,) = schemas.conn.execute("SHOW synchronous_commit").fetchone()
    figures["revision"] = revision
    figures["server"] = server
    print(
        f"Ratchet {ratchet.__version__} ({revision}) on Python {platform.python_version()}, "
        f"PostgreSQL {server} (synchronous_commit={sync_commit}) at {libpq_url(args.pg_url)}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; schemas {schemas.tag}_*;"
        f" N = {n:,} tasks per drain, {repeat} run(s) each (median [min-max])\n",
        flush=True,
    )
    try:
        ledger_problem = None
        if not args.no_ratchet:
            probe = schemas.new("probe")
            probe_url = ratchet_url(args.pg_url, probe, "fsync")
            deadline = time.monotonic() + args.wait_for_ledger
            while True:
                ledger_problem = postgres_ledger_ready(probe_url)
                if ledger_problem is None or time.monotonic() >= deadline:
                    break
                time.sleep(min(60.0, max(1.0, deadline - time.monotonic())))
            schemas.drop(probe)
            if ledger_problem:
                print(f"Ratchet's PostgreSQL ledger is not available, Ratchet parts skipped: "
                      f"{ledger_problem}\n", flush=True)
        run_ratchet = not args.no_ratchet and ledger_problem is None
        commit_rate = {sc: single_commit_rate(schemas, sc, args.commit_seconds)
                       for sc in ("on", "off")}
        figures["single_commit_per_s"] = commit_rate
        print(_table(
            ["one-row INSERT transaction", "commits/s", "ms/commit"],
            [[f"synchronous_commit={k}", f"{v:,.0f}", f"{1e3 / v:.3f}"]
             for k, v in commit_rate.items()],
        ) + "\n", flush=True)
        python = None if args.no_pgqueuer else pgq_python(install=True)

        # 1. enqueue
        enq_rows = []
        figures["enqueue"] = {}
        if run_ratchet:
            for dur in durabilities:
                one = [enqueue_rate(ratchet_url(args.pg_url, schemas.new(f"enq1{dur[0]}"), dur),
                                    n_enq, 1) for _ in range(repeat)]
                many = [enqueue_rate(ratchet_url(args.pg_url, schemas.new(f"enq100{dur[0]}"),
                                                 dur), n, 100) for _ in range(repeat)]
                threaded: dict[int, list[dict[str, Any]]] = {t: [] for t in enq_threads}
                for _ in range(repeat):  # interleaved: 1, 16, 1, 16, ...
                    for t in enq_threads:
                        url = ratchet_url(args.pg_url, schemas.new(f"enqt{t}{dur[0]}"), dur)
                        try:
                            threaded[t].append(enqueue_threads_rate(url, n_enq, t))
                        except Exception as exc:  # report it, measure the rest
                            print(f"  WARNING: enqueue from {t} threads ({dur}) failed: "
                                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
                for name in schemas.created:
                    if "_enq" in name:
                        schemas.drop(name)
                figures["enqueue"][f"ratchet {dur}"] = {
                    "submit": one, "submit_many_100": many,
                    "submit_threads": {str(t): v for t, v in threaded.items()},
                }
                enq_rows.append([f"Ratchet ({dur})", _fmt_rate(one), _fmt_rate(many), *[
                    (f"{_fmt_rate([x['tasks_per_s'] for x in v])} "
                     f"(p50 {_median([x['call_ms_p50'] for x in v]):.1f} ms)") if v else "error"
                    for v in threaded.values()]])

        # 2. drains, interleaved round by round
        plans = [(d, v, c, pr, False) for d in durabilities for v in variants
                 for c in concurrencies for pr in processes] if run_ratchet else []
        if run_ratchet and args.what_if_analyze:
            plans += [(d, v, c, pr, True) for d in durabilities[:1] for v in variants
                      for c in concurrencies for pr in processes]
        drains = [{"durability": d, "variant": v, "concurrency": c, "processes": pr,
                   "analyze": a, "runs": []} for d, v, c, pr, a in plans]
        pgq = [{"processes": pr, "runs": []} for pr in processes] if python else []
        for round_no in range(repeat):
            if repeat > 1:
                print(f"round {round_no + 1}/{repeat}", flush=True)
            for h in pgq:
                assert python is not None
                r = run_pgqueuer(ctx, python, h["processes"], n, args.pgq_batch_size, n_enq)
                h["runs"].append(r)
                print(f"  pgqueuer {r['version']} x{h['processes']} process(es), batch_size "
                      f"{args.pgq_batch_size}: {r['tasks_per_s']:,.0f} jobs/s "
                      f"({r['tasks_per_s_until_exit']:,.0f}/s until exit; "
                      f"per process {r['per_process_done']}; CPU per job: consumers "
                      f"{1e6 * r['cpu_s'] / n:.0f} µs, server "
                      + (f"{1e6 * r['server_cpu_s'] / n:.0f} µs)"
                         if r["server_cpu_s"] is not None else "-)"), flush=True)
            for e in drains:
                r = run_ratchet_drain(ctx, e["durability"], e["variant"], e["concurrency"],
                                      e["processes"], n, analyze=e["analyze"])
                same = [h for h in pgq if h["processes"] == e["processes"]] or pgq[:1]
                r["pgq_same_round"] = same[0]["runs"][-1]["tasks_per_s"] if same else None
                r["pgq_same_round_processes"] = same[0]["processes"] if same else None
                e["runs"].append(r)
                print(f"  ratchet {e['durability']} {VARIANT_LABEL[e['variant']]} "
                      f"C={e['concurrency']} x{e['processes']} process(es)"
                      f"{' (ANALYZEd first)' if e['analyze'] else ''}: "
                      f"{r['tasks_per_s']:,.0f} tasks/s in-process, "
                      f"{r['ledger_tasks_per_s']:,.0f}/s by ledger timestamps", flush=True)
        figures["pgqueuer"] = pgq
        figures["drains"] = drains
        if pgq:
            enq = [x for h in pgq for x in h["runs"]]
            enq_rows.insert(0, [f"pgqueuer {enq[0]['version']} (asyncpg)",
                                _fmt_rate([x["enqueue_one_per_s"] for x in enq]),
                                _fmt_rate([x["enqueue_batch_per_s"] for x in enq]),
                                *["-" for _ in enq_threads if run_ratchet]])
        if enq_rows:
            print("\n" + _table(
                ["enqueue (tasks/s)", f"1-by-1 ({n_enq:,})", f"batches of 100 ({n:,})",
                 *[f"1-by-1, {t} thread{'s' if t > 1 else ''} ({n_enq:,})"
                   for t in enq_threads if run_ratchet]],
                enq_rows,
                title="Enqueue into a fresh schema (threads: app.submit from T threads "
                      "sharing one App; p50 = one call's median wall time)"), flush=True)

        # 2b. worker memory
        rss_pgq = python if args.rss_pgqueuer else None
        if args.rss_tasks > 0 and (run_ratchet or rss_pgq):
            memory_rows, figures["memory"] = [], {}
            n_rss, c_rss = args.rss_tasks, args.rss_concurrency

            def mem_row(label: str, tps: float, rss: dict[str, Any] | None) -> list[str]:
                if not rss:
                    return [label, f"{n_rss:,}", f"{tps:,.0f}", *["-"] * 6]
                half, hwm = rss.get("half_mib"), rss.get("hwm_mib")
                return [label, f"{n_rss:,}", f"{tps:,.0f}", f"{rss['ready_mib']:.1f}",
                        f"{half:.1f}" if half is not None else "-", f"{rss['end_mib']:.1f}",
                        f"{rss['peak_mib']:.1f}", f"{hwm:.1f}" if hwm is not None else "-",
                        f"{rss['samples']:,}"]

            if run_ratchet:
                r = run_ratchet_drain(ctx, "fsync", "step", c_rss, 1, n_rss,
                                      rss_interval=args.rss_interval)
                figures["memory"]["ratchet"] = {
                    "tasks": n_rss, "concurrency": c_rss, "durability": "fsync",
                    "variant": "step", "tasks_per_s": r["tasks_per_s"],
                    "succeeded": r["succeeded"], "rss": r["rss"]}
                memory_rows.append(mem_row(f"Ratchet worker fsync 1 step C={c_rss}",
                                           r["tasks_per_s"], r["rss"]))
            if rss_pgq:
                r = run_pgqueuer(ctx, rss_pgq, 1, n_rss, args.pgq_batch_size, 0,
                                 rss_interval=args.rss_interval)
                figures["memory"]["pgqueuer"] = {
                    "tasks": n_rss, "batch_size": args.pgq_batch_size,
                    "tasks_per_s": r["tasks_per_s"], "done": r["done"], "rss": r["rss"]}
                memory_rows.append(mem_row(
                    f"pgqueuer consumer batch_size={args.pgq_batch_size}",
                    r["tasks_per_s"], r["rss"]))
            print("\n" + _table(
                ["worker memory (RSS, MiB)", "tasks", "tasks/s", "at READY", "half done",
                 "at end", "peak (sampled)", "VmHWM", "samples"], memory_rows,
                title=(f"Worker memory: one process drains the tasks, its RSS sampled every "
                       f"{args.rss_interval * 1e3:.0f} ms from a thread inside it (VmHWM: "
                       "the kernel's high-water mark since the process started)")), flush=True)

        # 3. pickup latency
        latency_rows = []
        if args.latency_count > 0:
            if python:
                lat = run_pgqueuer_latency(ctx, python, args.latency_count,
                                           args.latency_spacing)
                figures["pgqueuer_latency"] = lat
                latency_rows.append([
                    "pgqueuer (LISTEN/NOTIFY)", f"{lat['count']}",
                    f"{lat['pickup_ms']['p50']:.2f}", f"{lat['pickup_ms']['p99']:.2f}",
                    f"{lat['e2e_ms']['p50']:.2f}", f"{lat['e2e_ms']['p99']:.2f}", "-", "-"])
            if run_ratchet:
                for dur in durabilities:
                    lat = run_ratchet_latency(ctx, dur, args.latency_concurrency,
                                              args.latency_count, args.latency_spacing)
                    figures[f"ratchet_latency_{dur}"] = {k: v for k, v in lat.items()
                                                         if k != "samples"}
                    latency_rows.append([
                        f"Ratchet {dur} C={args.latency_concurrency}", f"{lat['count']}",
                        f"{lat['pickup_ms']['p50']:.2f}", f"{lat['pickup_ms']['p99']:.2f}",
                        f"{lat['e2e_ms']['p50']:.2f}", f"{lat['e2e_ms']['p99']:.2f}",
                        f"{lat['ledger_pickup_ms']['p50']:.2f}",
                        f"{lat['ledger_e2e_ms']['p50']:.2f}"])
        if latency_rows:
            print("\n" + _table(
                ["one task on an idle worker", "n", "pickup p50 ms", "pickup p99 ms",
                 "e2e p50 ms", "e2e p99 ms", "ledger pickup p50", "ledger e2e p50"],
                latency_rows,
                title=(f"Latency, one task at a time, {args.latency_spacing * 1e3:.0f} ms idle "
                       "between tasks (pickup: committed submit -> task starts; e2e: submit "
                       "call -> task finished)")), flush=True)

        # 4. claim latency vs ledger size
        if run_ratchet and claim_sizes:
            claim_rows = []
            figures["claim"] = []
            plans_text: dict[str, str] = {}
            for total in claim_sizes:
                c = run_claim_latency(ctx, total, args.claim_ready, args.claim_calls,
                                      args.claim_limit, explain=total == max(claim_sizes))
                figures["claim"].append(c)
                for stage, label in (("fresh", "as loaded, no statistics"),
                                     ("analyzed", "after ANALYZE")):
                    st = c[stage]
                    claim_rows.append([f"{c['rows']:,}", f"{args.claim_ready:,}",
                                       f"{c['table_mb']:,.0f}", f"{c['bulk_insert_s']:.1f}",
                                       label, f"{st['claim_ms_p50']:.2f}",
                                       f"{st['claim_ms_p99']:.2f}", f"{st['claim_ms_mean']:.2f}",
                                       f"{st['claimed']:,}"])
                plans_text = {k: c[f"explain_{k}"] for k in ("fresh", "analyzed")
                              if f"explain_{k}" in c} or plans_text
            print("\n" + _table(
                ["tasks in ledger", "ready", "tasks MB", "bulk insert s", "planner statistics",
                 "claim p50 ms", "claim p99 ms", "mean ms", "claimed"], claim_rows,
                title=(f"ledger.claim(holder, names, limit={args.claim_limit}) x "
                       f"{args.claim_calls // 2} per row (whole claim transaction)")), flush=True)
            for stage, label in (("fresh", "as loaded, no statistics"),
                                 ("analyzed", "after ANALYZE")):
                if stage in plans_text:
                    print(f"\nEXPLAIN (ANALYZE, BUFFERS) of the claim query, "
                          f"{max(claim_sizes):,} tasks, {label}:\n{plans_text[stage]}",
                          flush=True)

        # 5. the side-by-side table
        # Like for like: every Ratchet drain is divided by pgqueuer's drain with the same
        # number of processes (pgqueuer's 1-process figure only where no equal count ran).
        base_by_procs = {h["processes"]: _median([x["tasks_per_s"] for x in h["runs"]])
                         for h in pgq}

        def base_for(procs: int) -> float:
            if procs in base_by_procs:
                return base_by_procs[procs]
            return next(iter(base_by_procs.values()), float("nan"))

        final = []
        for h in pgq:
            tps = [x["tasks_per_s"] for x in h["runs"]]
            final.append([f"pgqueuer batch_size={args.pgq_batch_size}", "sync_commit=on",
                          f"{h['processes']}", "-", _fmt_rate(tps), "-", "1.00", "1.00"])
        for e in drains:
            tps = [x["tasks_per_s"] for x in e["runs"]]
            ltps = [x["ledger_tasks_per_s"] for x in e["runs"]]
            main_tps = tps if e["processes"] == 1 else ltps
            ratios = [x["tasks_per_s"] / x["pgq_same_round"] if e["processes"] == 1 else
                      x["ledger_tasks_per_s"] / x["pgq_same_round"]
                      for x in e["runs"] if x.get("pgq_same_round")]
            final.append([f"Ratchet {VARIANT_LABEL[e['variant']]}"
                          f"{' +ANALYZE' if e['analyze'] else ''}", e["durability"],
                          f"{e['processes']}", f"{e['concurrency']}", _fmt_rate(tps),
                          _fmt_rate(ltps),
                          f"{_median(main_tps) / base_for(e['processes']):.2f}" if pgq else "-",
                          f"{_median(ratios):.2f}" if ratios else "-"])
        if final:
            print("\n" + _table(
                ["system", "durability", "processes", "C", "drain tasks/s (in-process)",
                 "by ledger", "x pgqueuer (median)", "x pgqueuer same round"], final,
                title=f"Drain of {n:,} no-op tasks, each divided by pgqueuer with the same "
                      "number of processes (in-process figure for 1 process, ledger figure "
                      "for more)"), flush=True)
        if drains:
            detail = []
            for e in drains:
                r = sorted(e["runs"], key=lambda x: x["tasks_per_s"])[len(e["runs"]) // 2]
                calls: dict[str, list[float]] = {}
                for pr in r["processes"]:
                    for k, v in pr["calls"].items():
                        cell = calls.setdefault(k, [0, 0.0, 0])
                        for i in range(3):
                            cell[i] += v[i]
                cpu = sum(pr["cpu_s"] for pr in r["processes"])

                def cell_ms(name: str, calls: dict[str, list[float]] = calls) -> str:
                    c = calls.get(name)
                    return f"{1e3 * c[1] / c[0]:.2f} x{c[0]:,.0f}" if c and c[0] else "-"

                stmts: dict[str, list[float]] = {}
                for pr in r["processes"]:
                    for k, v in pr.get("stmt", {}).items():
                        cell2 = stmts.setdefault(k, [0, 0.0])
                        cell2[0] += v[0]
                        cell2[1] += v[1]
                writer = {k.split(":", 1)[1]: v for k, v in stmts.items()
                          if k.startswith("writer:")}
                w_count = sum(v[0] for v in writer.values())
                w_secs = sum(v[1] for v in writer.values())
                busy = sum(c[1] for c in calls.values()) / len(r["processes"]) / r["drain_s"]

                def stmt_ms(verb: str, writer: dict[str, list[float]] = writer) -> str:
                    v = writer.get(verb)
                    return f"{1e3 * v[1] / v[0]:.2f}" if v and v[0] else "-"

                claimed = sum(calls.get(k, [0, 0, 0])[2] for k in ("claim", "commit_and_claim"))
                claim_tx = sum(calls.get(k, [0, 0, 0])[0] for k in ("claim", "commit_and_claim"))
                detail.append([
                    f"{e['durability']} {VARIANT_LABEL[e['variant']]} x{e['processes']}"
                    f"{' +ANALYZE' if e['analyze'] else ''}",
                    str(e["concurrency"]), cell_ms("claim"), cell_ms("commit"),
                    cell_ms("commit_and_claim"),
                    f"{claimed / max(1, claim_tx):.1f}",
                    f"{100 * busy:.0f}%",
                    f"{w_count / n:.2f}",
                    f"{1e3 * w_secs / max(1, w_count):.2f}",
                    stmt_ms("BEGIN"), stmt_ms("COMMIT"),
                    f"{1e6 * cpu / n:,.0f}",
                    "-" if r.get("server_cpu_s") is None
                    else f"{1e6 * r['server_cpu_s'] / n:,.0f}",
                ])
            print("\n" + _table(
                ["Ratchet drain (median run)", "C", "claim ms x calls", "commit ms x calls",
                 "commit+claim ms x calls", "tasks/claim tx", "writer busy",
                 "writer stmts/task", "ms/stmt", "BEGIN ms", "COMMIT ms",
                 "worker CPU µs/task", "server CPU µs/task"], detail,
                title="Ledger calls inside the workers (all processes added up)"), flush=True)
            verb_rows = []
            for e in drains:
                r = sorted(e["runs"], key=lambda x: x["tasks_per_s"])[len(e["runs"]) // 2]
                per_verb: dict[str, list[float]] = {}
                for pr in r["processes"]:
                    for k, v in pr.get("stmt", {}).items():
                        role, _, verb = k.partition(":")
                        if role == "writer":
                            cell3 = per_verb.setdefault(verb, [0, 0.0])
                            cell3[0] += v[0]
                            cell3[1] += v[1]
                verb_rows.append([
                    f"{e['durability']} {VARIANT_LABEL[e['variant']]} x{e['processes']} "
                    f"C={e['concurrency']}{' +ANALYZE' if e['analyze'] else ''}",
                    "  ".join(f"{verb} {c / n:.2f}@{1e3 * t / c:.2f}" for verb, (c, t) in
                              sorted(per_verb.items(), key=lambda kv: -kv[1][1]) if c),
                ])
            print("\n" + _table(
                ["Ratchet drain", "writer statements: kind per-task@ms-each, by total time"],
                verb_rows), flush=True)

        if args.profile and run_ratchet:
            profile_drain(ctx, n, figures, args.profile_concurrency)
    finally:
        dropped = schemas.drop_all()
        schemas.close()
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\ndropped {len(dropped)} schema(s) created by this run; load average at the end: "
          f"{os.getloadavg()[0]:.2f} (other processes skew figures)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    return 0


def profile_drain(ctx: RunContext, n: int, figures: dict[str, Any],
                  concurrency: int = 8) -> None:
    """fsync / 1 step / C=``concurrency`` / 1 process under py-spy (wall clock with --idle,
    and --gil)."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        print("  py-spy not found: .venv/bin/pip install py-spy to profile", file=sys.stderr)
        return
    RESULTS_DIR.mkdir(exist_ok=True)
    figures["profile"] = {}
    for gil in (False, True):
        raw = str(RESULTS_DIR / f"pg-profile-fsync-step-c{concurrency}-"
                                f"{'gil' if gil else 'wall'}.txt")
        prof = [pyspy, "record", "--rate", "250", "--format", "raw", "--output", raw,
                "--nonblocking", "--threads", "--gil" if gil else "--idle"]
        r = run_ratchet_drain(ctx, "fsync", "step", concurrency, 1, n, profiler=prof)
        figures["profile"]["gil" if gil else "wall"] = {"raw": raw,
                                                        "tasks_per_s": r["tasks_per_s"]}
        print(f"\nprofile ({'GIL holder only' if gil else 'wall clock, every thread'}): "
              f"{r['tasks_per_s']:,.0f} tasks/s under py-spy; collapsed stacks in "
              f"{os.path.relpath(raw, ROOT)}\n{summarize_profile(raw, 250, n)}", flush=True)


def _thread_role(thread: str) -> str:
    if "writer" in thread:
        return "writer"
    if "heartbeat" in thread:
        return "heartbeat"
    if "MainThread" in thread or thread.endswith("main"):
        return "main (claim loop)"
    if "ThreadPoolExecutor" in thread or "task" in thread:
        return "task threads"
    if "listen" in thread.lower() or "subscr" in thread.lower():
        return "listener"
    return "other"


def summarize_profile(raw_path: str, rate: int, n: int, top: int = 8) -> str:
    """µs per task by thread, then by the innermost Ratchet function on the stack and the
    leaf function (what it was doing there), from a py-spy raw (collapsed) profile."""
    by_role: dict[str, dict[str, int]] = {}
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        parts = stack.split(";")
        thread = ""
        if parts and parts[0].startswith("thread ("):
            thread = parts.pop(0).partition(": ")[2].rstrip(")")
        frames = [f for f in parts if not f.startswith("process ")]
        ours = [f for f in frames if "ratchet/" in f]
        inner = ours[-1].split(" (")[0] if ours else "(outside ratchet)"
        leaf = frames[-1].split(" (")[0] if frames else "?"
        where = inner if leaf == inner else f"{inner} -> {leaf}"
        cats = by_role.setdefault(_thread_role(thread), {})
        cats[where] = cats.get(where, 0) + int(count_text)
    blocks = []
    for role, cats in sorted(by_role.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(cats.values())
        rows = [[f"  {cat}"[:90], f"{c / rate / n * 1e6:,.1f}", f"{100 * c / total:.0f}%"]
                for cat, c in sorted(cats.items(), key=lambda kv: -kv[1])[:top]]
        rows.append(["  (all)", f"{total / rate / n * 1e6:,.1f}", "100%"])
        blocks.append(_table([role, "µs/task", "share"], rows))
    return "\n\n".join(blocks)


def _dispatch(argv: list[str]) -> int:
    children: dict[str, Callable[[Sequence[str]], int]] = {
        "_ratchet_worker": ratchet_worker_child,
        "_pgq": pgq_child,
    }
    if argv and argv[0] in children:
        return children[argv[0]](argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(_dispatch(sys.argv[1:]))
