"""Ratchet on SQLite: enqueue and drain throughput, against one fsynced commit and huey.

Run::

    .venv/bin/python bench/sqlite_throughput.py                 # everything, N = 20,000
    .venv/bin/python bench/sqlite_throughput.py --tasks 5000 --repeat 3
    .venv/bin/python bench/sqlite_throughput.py --profile       # + py-spy profile of a drain
    .venv/bin/python bench/sqlite_throughput.py --prefetch 0,auto  # without / with prefetch

What it measures (all in one run, on fresh SQLite files in one temp directory):

1. the cost of one fsynced SQLite commit on this disk (single-row INSERT transactions,
   WAL, ``synchronous=FULL``; and ``NORMAL`` for reference), as commits/s;
2. enqueue throughput: ``app.submit`` one by one, and ``app.submit_many`` in batches of 100;
3. drain throughput: N no-op tasks drained by ONE worker process (``ratchet.Worker`` in a
   subprocess), timed inside that process from the start of the first claim transaction
   that returned work to the last task's completion (process start-up excluded), and
   cross-checked with ledger timestamps (``max(tasks.updated_at) - min(audit claim at)``);
4. huey's ``SqliteHuey`` draining the same number of no-op tasks with one consumer process
   (thread workers, 1 and 8), from its own virtualenv (``bench/.venv-huey``, made on demand).

Figures are printed, never asserted: this is a measurement tool, not a test.
The worker and huey children are this same file run with a private first argument
(``_ratchet_worker`` / ``_huey``); the huey child imports only the standard library and huey.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HUEY_VENV = HERE / ".venv-huey"
RESULTS_DIR = HERE / "results"
TASKS = {"step": "bench.noop_step", "zero": "bench.noop_zero"}
# Environment of the worker children: PYTHONPATH points at a snapshot of src/ratchet taken when
# the run starts, so every drain of one run measures the same code while src/ changes.
CHILD_ENV: dict[str, str] | None = None
VARIANT_LABEL = {"step": "1 step", "zero": "0 steps"}


# ----------------------------------------------------------------------------- helpers


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _spread(values: Sequence[float]) -> str:
    if len(values) < 2:
        return ""
    return f" [{min(values):,.0f}-{max(values):,.0f}]"


def _fmt_rate(values: Sequence[float]) -> str:
    return f"{_median(values):,.0f}{_spread(values)}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str = "") -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    out = []
    if title:
        out.append(title)
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    out.append("  ".join("-" * w for w in widths))
    for row in rows:
        cells = []
        for i, (cell, w) in enumerate(zip(row, widths, strict=True)):
            cells.append(cell.ljust(w) if i == 0 else cell.rjust(w))
        out.append("  ".join(cells))
    return "\n".join(out)


def _ledger_url(path: str) -> str:
    return "sqlite:///" + os.path.abspath(path)


def _fresh(directory: str, stem: str) -> str:
    path = os.path.join(directory, f"{stem}.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return path


def _git_revision() -> str:
    """``git describe`` of the working tree, with ``+dirty src`` when src/ has changes."""
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


# ----------------------------------------------------------------------------- 1. commit cost


def single_commit_rate(directory: str, synchronous: str, seconds: float) -> float:
    """Single-row INSERT transactions per second in WAL mode with ``synchronous``."""
    path = _fresh(directory, f"commit-{synchronous.lower()}")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        row = ("x" * 64,)

        def one() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", row)
            conn.execute("COMMIT")

        for _ in range(50):
            one()
        n = 0
        t0 = time.perf_counter()
        while n < 200 or time.perf_counter() - t0 < seconds:
            one()
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        conn.close()


# ----------------------------------------------------------------------------- 2. enqueue


def enqueue_rate(directory: str, durability: str, n: int, batch: int) -> float:
    """Tasks/s submitted into a fresh ledger, one by one (``batch == 1``) or in batches."""
    from ratchet import SubmitRequest

    path = _fresh(directory, f"enqueue-{durability}-{batch}")
    app = make_app(None)
    app.configure(ledger=_ledger_url(path), durability=durability)
    _ = app.ledger  # open and migrate outside the timed part
    name = TASKS["step"]
    t0 = time.perf_counter()
    if batch == 1:
        for _ in range(n):
            app.submit(name)
    else:
        for start in range(0, n, batch):
            app.submit_many([SubmitRequest(name) for _ in range(min(batch, n - start))])
    elapsed = time.perf_counter() - t0
    app.close()
    return n / elapsed


def populate(path: str, durability: str, variant: str, n: int) -> None:
    """Fill a fresh ledger with ``n`` ready tasks of ``variant`` (not timed)."""
    from ratchet import SubmitRequest

    app = make_app(None)
    app.configure(ledger=_ledger_url(path), durability=durability)
    name = TASKS[variant]
    for start in range(0, n, 1000):
        app.submit_many([SubmitRequest(name) for _ in range(min(1000, n - start))])
    app.close()


# ----------------------------------------------------------------------------- 3. drain (child)


def ratchet_worker_child(argv: Sequence[str]) -> int:
    """``_ratchet_worker``: drain the ledger with one Worker, write figures as JSON."""
    p = argparse.ArgumentParser(prog="sqlite_throughput.py _ratchet_worker")
    p.add_argument("--db", required=True)
    p.add_argument("--durability", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--prefetch", default="auto")
    p.add_argument("--tasks", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    from ratchet import Worker
    from ratchet.config import parse_ledger_url
    from ratchet.ledger.sqlite import SQLiteLedger

    lock = threading.Lock()
    figures: dict[str, Any] = {
        "first_claim_at": None,
        "last_finish_at": None,
        "cpu_at_first_claim": None,
        "cpu_at_last_finish": None,
        "finished": 0,
        "claim_calls": 0,
        "claim_nonempty": 0,
        "claimed": 0,
        "claim_s": 0.0,
        "commit_calls": 0,
        "commit_writes": 0,
        "commit_s": 0.0,
        "commit_and_claim_calls": 0,
        "renew_calls": 0,
        "commit_sizes": defaultdict(int),
        "stmt": defaultdict(lambda: [0, 0.0]),
    }

    class TimedConnection:
        """Delegates to a sqlite3 connection; times BEGIN and COMMIT per thread."""

        def __init__(self, conn: sqlite3.Connection) -> None:
            self._conn = conn

        def execute(self, sql: str, *params: Any) -> Any:
            if sql.startswith(("BEGIN", "COMMIT")):
                t = time.perf_counter()
                result = self._conn.execute(sql, *params)
                cell = figures["stmt"][f"{threading.current_thread().name}:{sql.split()[0]}"]
                cell[0] += 1
                cell[1] += time.perf_counter() - t
                return result
            return self._conn.execute(sql, *params)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

    class CountingLedger(SQLiteLedger):
        """The real SQLite ledger plus counters (transactions, sizes, time inside them)."""

        def _open(self) -> Any:
            return TimedConnection(super()._open())

        def claim(self, holder: str, names: Sequence[Any], limit: int,
                  scope: Any = None) -> Any:
            t = time.perf_counter()
            claims = super().claim(holder, names, limit, scope)
            figures["claim_s"] += time.perf_counter() - t
            figures["claim_calls"] += 1
            if claims:
                figures["claim_nonempty"] += 1
                figures["claimed"] += len(claims)
                if figures["first_claim_at"] is None:
                    figures["first_claim_at"] = t
                    figures["cpu_at_first_claim"] = time.process_time()
            return claims

        def commit(self, writes: Sequence[Any]) -> Any:
            t = time.perf_counter()
            outcomes = super().commit(writes)
            figures["commit_s"] += time.perf_counter() - t
            figures["commit_calls"] += 1
            figures["commit_writes"] += len(writes)
            figures["commit_sizes"][len(writes)] += 1
            return outcomes

        def commit_and_claim(
            self, writes: Sequence[Any], holder: str, names: Sequence[Any], limit: int,
            scope: Any = None,
        ) -> Any:
            # The worker's usual transaction: completions plus the claim of their successors.
            t = time.perf_counter()
            outcomes, claims = super().commit_and_claim(writes, holder, names, limit, scope)
            figures["commit_s"] += time.perf_counter() - t
            figures["commit_calls"] += 1
            figures["commit_writes"] += len(writes)
            figures["commit_sizes"][len(writes)] += 1
            figures["commit_and_claim_calls"] += 1
            if claims:
                figures["claim_nonempty"] += 1
                figures["claimed"] += len(claims)
            return outcomes, claims

        def renew(self, holder: str, leases: Sequence[tuple[str, int]]) -> Any:
            figures["renew_calls"] += 1
            return super().renew(holder, leases)

    import ratchet.ledger.sqlite as sqlite_module

    # The source this process runs, so a profile is labelled against the right line numbers
    # even when the working tree changes while the benchmark runs.
    sources = {"ratchet/ledger/sqlite.py": Path(sqlite_module.__file__).read_text()}
    ledger = CountingLedger(parse_ledger_url(_ledger_url(args.db), args.durability))
    app = make_app(ledger)

    class BenchWorker(Worker):
        def on_finished(self, claim: Any, outcome: str) -> None:
            with lock:
                figures["finished"] += 1
                figures["last_finish_at"] = time.perf_counter()
                figures["cpu_at_last_finish"] = time.process_time()
            super().on_finished(claim, outcome)

    switch = os.environ.get("RATCHET_BENCH_SWITCH_INTERVAL")  # GIL experiment, seconds
    if switch:
        sys.setswitchinterval(float(switch))
    prefetch = None if args.prefetch == "auto" else int(args.prefetch)
    worker = BenchWorker(app, concurrency=args.concurrency, prefetch=prefetch)
    wall0 = time.perf_counter()
    stats = worker.run(max_tasks=args.tasks, idle_exit_s=10.0)
    wall = time.perf_counter() - wall0
    out = {
        "drain_s": (figures["last_finish_at"] or 0.0) - (figures["first_claim_at"] or 0.0),
        "cpu_s": (figures["cpu_at_last_finish"] or 0.0) - (figures["cpu_at_first_claim"] or 0.0),
        "run_wall_s": wall,
        "writer_transactions": worker.writer.transactions,
        "writer_writes": worker.writer.writes,
        "heartbeat_renewals": worker.heartbeat.renewals,
        "stats": {
            "claimed": stats.claimed,
            "succeeded": stats.succeeded,
            "failed": stats.failed,
            "stale": stats.stale,
            "by_outcome": stats.by_outcome,
        },
        **{k: v for k, v in figures.items() if k not in ("commit_sizes", "stmt")},
        "commit_sizes": {str(k): v for k, v in sorted(figures["commit_sizes"].items())},
        "stmt": {k: v for k, v in figures["stmt"].items()},
        "sources": sources,
        "ratchet_file": sqlite_module.__file__,
    }
    app.close()
    Path(args.out).write_text(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------- 3. drain (parent)


def ledger_drain_s(path: str) -> tuple[int, float]:
    """(succeeded count, max(updated_at) - min(claim audit at)) read from the ledger file."""
    conn = sqlite3.connect(path)
    try:
        count, last = conn.execute(
            "SELECT COUNT(*), MAX(updated_at) FROM tasks WHERE state = 'SUCCEEDED'"
        ).fetchone()
        (first,) = conn.execute("SELECT MIN(at) FROM audit WHERE kind = 'claim'").fetchone()
    finally:
        conn.close()
    return int(count), (last - first) if last is not None and first is not None else float("nan")


def run_ratchet_drain(
    directory: str,
    durability: str,
    variant: str,
    concurrency: int,
    n: int,
    analyze: bool = False,
    profiler: list[str] | None = None,
    prefetch: str = "auto",
) -> dict[str, Any]:
    """Populate a fresh ledger, drain it with one worker subprocess, return the figures.

    ``prefetch``: the Worker's ``prefetch`` (an integer as text), or ``"auto"`` for its
    default."""
    stem = (f"drain-{durability}-{variant}-c{concurrency}-p{prefetch}"
            f"{'-analyze' if analyze else ''}")
    path = _fresh(directory, stem)
    populate(path, durability, variant, n)
    if analyze:
        conn = sqlite3.connect(path)
        conn.execute("ANALYZE")
        conn.close()
    out = os.path.join(directory, stem + ".json")
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "_ratchet_worker",
        "--db", path, "--durability", durability, "--concurrency", str(concurrency),
        "--prefetch", prefetch, "--tasks", str(n), "--out", out,
    ]
    if profiler:
        cmd = [*profiler, "--", *cmd]
    proc = subprocess.run(
        cmd, cwd=directory, capture_output=True, text=True, timeout=3600, env=CHILD_ENV
    )
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(
            f"worker subprocess failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(Path(out).read_text())
    sources = result.pop("sources", None)
    if profiler:
        result["sources"] = sources
    succeeded, ledger_s = ledger_drain_s(path)
    result["ledger_succeeded"] = succeeded
    result["ledger_drain_s"] = ledger_s
    result["tasks_per_s"] = n / result["drain_s"] if result["drain_s"] > 0 else float("nan")
    result["ledger_tasks_per_s"] = n / ledger_s if ledger_s > 0 else float("nan")
    if succeeded != n:
        print(f"  WARNING: {succeeded}/{n} tasks SUCCEEDED in {stem}", file=sys.stderr)
    snapshot = (CHILD_ENV or {}).get("PYTHONPATH", "").split(os.pathsep)[0]
    if snapshot and not result["ratchet_file"].startswith(snapshot):
        print(f"  WARNING: worker ran {result['ratchet_file']}, not the snapshot", file=sys.stderr)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return result


# ----------------------------------------------------------------------------- 4. huey (child)


def huey_child(argv: Sequence[str]) -> int:
    """``_huey``: enqueue N no-op tasks, or drain them with one consumer; JSON to --out."""
    p = argparse.ArgumentParser(prog="sqlite_throughput.py _huey")
    p.add_argument("--db", required=True)
    p.add_argument("--mode", choices=["enqueue", "drain"], required=True)
    p.add_argument("--tasks", type=int, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import huey as huey_pkg
    from huey import SqliteHuey
    from huey.signals import SIGNAL_COMPLETE, SIGNAL_EXECUTING

    huey = SqliteHuey("bench", filename=args.db)  # huey's defaults: WAL, fsync=None

    @huey.task(name="noop")
    def noop() -> None:
        return None

    conn = huey.storage.conn
    synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(
        conn.execute("PRAGMA synchronous").fetchone()[0], "?"
    )
    result: dict[str, Any] = {"huey_version": huey_pkg.__version__, "synchronous": synchronous}
    if args.mode == "enqueue":
        t0 = time.perf_counter()
        for _ in range(args.tasks):
            noop()
        result["enqueue_per_s"] = args.tasks / (time.perf_counter() - t0)
        Path(args.out).write_text(json.dumps(result))
        return 0

    lock = threading.Lock()
    state: dict[str, Any] = {"first": None, "last": None, "cpu0": None, "cpu1": None, "done": 0}
    done = threading.Event()

    @huey.signal(SIGNAL_EXECUTING)
    def on_executing(signal: str, task: Any, *rest: Any) -> None:
        if state["first"] is None:
            with lock:
                if state["first"] is None:
                    state["first"] = time.perf_counter()
                    state["cpu0"] = time.process_time()

    @huey.signal(SIGNAL_COMPLETE)
    def on_complete(signal: str, task: Any, *rest: Any) -> None:
        with lock:
            state["done"] += 1
            state["last"] = time.perf_counter()
            state["cpu1"] = time.process_time()
            if state["done"] >= args.tasks:
                done.set()

    consumer = huey.create_consumer(
        workers=args.workers, worker_type="thread", periodic=False, check_worker_health=False
    )
    consumer.start()
    finished = done.wait(timeout=3600)
    consumer.stop(graceful=True)
    drain_s = (state["last"] or 0.0) - (state["first"] or 0.0)
    result.update(
        completed=state["done"],
        finished=finished,
        drain_s=drain_s,
        cpu_s=(state["cpu1"] or 0.0) - (state["cpu0"] or 0.0),
        tasks_per_s=args.tasks / drain_s if drain_s > 0 else float("nan"),
        remaining=huey.pending_count(),
    )
    Path(args.out).write_text(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- 4. huey (parent)


def huey_python(install: bool) -> str | None:
    """Python of ``bench/.venv-huey`` (created with ``python -m venv`` + ``pip install huey``)."""
    python = HUEY_VENV / "bin" / "python"
    ok = python.exists() and subprocess.run(
        [str(python), "-c", "import huey"], capture_output=True
    ).returncode == 0
    if ok:
        return str(python)
    if not install:
        return None
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"  creating {HUEY_VENV} and installing huey ...", flush=True)
    subprocess.run([base, "-m", "venv", str(HUEY_VENV)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "huey"],
        check=True,
    )
    return str(python)


def run_huey(python: str, directory: str, workers: int, n: int) -> dict[str, Any]:
    path = _fresh(directory, f"huey-w{workers}")
    me = str(Path(__file__).resolve())
    out_enq = os.path.join(directory, f"huey-w{workers}-enqueue.json")
    out_drain = os.path.join(directory, f"huey-w{workers}-drain.json")
    for mode, out in (("enqueue", out_enq), ("drain", out_drain)):
        proc = subprocess.run(
            [python, me, "_huey", "--db", path, "--mode", mode, "--tasks", str(n),
             "--workers", str(workers), "--out", out],
            cwd=directory, capture_output=True, text=True, timeout=3600,
        )
        if proc.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"huey {mode} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(Path(out_drain).read_text())
    result["enqueue_per_s"] = json.loads(Path(out_enq).read_text())["enqueue_per_s"]
    if result["completed"] != n or not result["finished"]:
        print(f"  WARNING: huey completed {result['completed']}/{n}", file=sys.stderr)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    return result


# ----------------------------------------------------------------------------- profile


class _SourceIndex:
    """Maps (file, line) to 'SQL', 'BEGIN', 'COMMIT' when the line is inside such a call."""

    def __init__(self, sources: dict[str, str] | None = None) -> None:
        self._sources = sources or {}
        self._cache: dict[str, dict[int, str]] = {}

    def label(self, filename: str, line: int) -> str | None:
        if filename not in self._cache:
            text = self._sources.get(filename)
            if text is None:
                try:
                    text = Path(self._resolve(filename)).read_text()
                except OSError:
                    text = ""
            self._cache[filename] = self._build(text)
        return self._cache[filename].get(line)

    @staticmethod
    def _resolve(filename: str) -> str:
        """py-spy prints ``ratchet/ledger/sqlite.py``; find it under the installed package."""
        if os.path.isabs(filename):
            return filename
        import ratchet

        package_parent = Path(ratchet.__file__).resolve().parent.parent
        return str(package_parent / filename)

    @staticmethod
    def _build(text: str) -> dict[int, str]:
        marks: dict[int, str] = {}
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            return marks
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in ("execute", "executemany", "fetchone", "fetchall"):
                continue
            label = "SQL"
            first = node.args[0] if node.args else None
            text = ast.unparse(first) if first is not None else ""
            if "COMMIT" in text:
                label = "COMMIT"
            elif "BEGIN" in text:
                label = "BEGIN"
            elif "ROLLBACK" in text:
                label = "ROLLBACK"
            for ln in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                marks.setdefault(ln, label) if label == "SQL" else marks.__setitem__(ln, label)
        return marks


def _parse_frame(frame: str) -> tuple[str, str, int]:
    """py-spy raw frame ``func (file:line)`` -> (func, file, line)."""
    if frame.endswith(")") and " (" in frame:
        func, _, rest = frame.rpartition(" (")
        loc = rest[:-1]
        file, _, line = loc.rpartition(":")
        try:
            return func, file, int(line)
        except ValueError:
            return func, loc, 0
    return frame, "", 0


def classify_stack(
    thread: str, frames: list[tuple[str, str, int]], src: _SourceIndex
) -> tuple[str, str]:
    """(thread role, category) of one sampled stack (root first) of thread ``thread``."""
    # The benchmark's own timing wrappers are transparent.
    frames = [f for f in frames if not f[1].endswith("sqlite_throughput.py")] or frames

    def has(func: str, file_part: str) -> bool:
        return any(
            (f == func or f.endswith("." + func)) and file_part in fl for f, fl, _ in frames
        )

    leaf = frames[-1] if frames else ("", "", 0)

    def db_part() -> str:
        for func, file, line in reversed(frames):
            if file.endswith("ledger/sqlite.py"):
                label = src.label(file, line)
                if label == "COMMIT":
                    return "COMMIT (fsync)"
                if label in ("BEGIN", "ROLLBACK"):
                    return label
                if label == "SQL" and (func, file, line) == leaf:
                    return "SQL statements"
                break
        if "json" in leaf[1] or leaf[1].endswith("serde.py"):
            return "JSON"
        return "Python"

    if thread == "ratchet-writer":
        role = "writer"
        if has("_finished", "worker/runner.py"):
            return role, "completion callbacks (stats, lease, on_finished)"
        if has("_dispatch", "worker/runner.py"):
            return role, "dispatch claims (leases, local queue)"
        if has("_claim_in", "ledger/sqlite.py"):
            return role, "claim part of tx: " + db_part()
        if has("claim", "ledger/sqlite.py"):
            return role, "poll claim tx: " + db_part()
        if has("commit_and_claim", "ledger/sqlite.py") or has("commit", "ledger/sqlite.py"):
            return role, "commit part of tx: " + db_part()
        if has("get", "queue.py") or has("wait", "threading.py"):
            return role, "idle (waiting for work)"
        if has("_resolve", "worker/writer.py"):
            return role, "handoff (wake a waiting task thread)"
        return role, "loop (incl. waiting in queue.get)"
    if thread == "ratchet-heartbeat":
        if has("renew", "ledger/sqlite.py"):
            return "heartbeat", "renew tx: " + db_part()
        return "heartbeat", "idle"
    if thread.startswith("ratchet-task"):
        role = "task"
        if not has("_execute", "worker/runner.py"):
            if has("wait", "threading.py"):
                return role, "idle (no task)"
            return role, "executor loop (take next task)"
        if has("commit", "worker/writer.py"):
            if has("result", "worker/writer.py"):
                return role, "waiting for a durable commit"
            return role, "hand write to writer"
        if has("submit", "worker/writer.py"):
            return role, "hand write to writer"
        if has("__init__", "worker/context.py"):
            return role, "context init (params JSON)"
        if has("step", "worker/context.py"):
            return role, "ctx.step Python/JSON"
        if has("_finish", "worker/runner.py"):
            return role, "finish: Python"
        if has("dumps", "serde.py"):
            return role, "result JSON"
        if has("remove", "worker/heartbeat.py"):
            return role, "lease bookkeeping"
        if has("debug", "logging/") or has("on_finished", "worker/runner.py") or has(
            "on_claimed", "worker/runner.py"
        ):
            return role, "hooks/logging"
        return role, "task Python (other)"
    if thread == "MainThread":
        if not has("run", "worker/runner.py"):
            return "other", "start-up / shutdown"
        role = "main"
        if has("poll", "worker/writer.py"):
            return role, "ask the writer to claim"
        if has("check_stalled", "worker/executor.py"):
            return role, "watch for stalled task threads"
        if has("shutdown", "worker/executor.py") or has("join", "threading.py"):
            return "other", "start-up / shutdown"
        if has("wait", "threading.py"):
            return role, "idle / poll wait"
        return role, "loop Python"
    return "other", thread or "unknown thread"


def summarize_profile(
    raw_path: str, rate: int, n: int, sources: dict[str, str] | None = None
) -> tuple[str, dict[str, Any]]:
    """Aggregate a py-spy raw (collapsed) profile into µs per task by thread role."""
    src = _SourceIndex(sources)
    by_role: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        try:
            count = int(count_text)
        except ValueError:
            continue
        parts = stack.split(";")
        thread = ""
        if parts and parts[0].startswith("thread ("):
            thread = parts.pop(0).partition(": ")[2]
        frames = [_parse_frame(f) for f in parts if not f.startswith("process ")]
        role, category = classify_stack(thread, frames, src)
        by_role[role][category] += count
    lines = []
    data: dict[str, Any] = {}
    for role in ("writer", "main", "task", "heartbeat", "other"):
        cats = by_role.get(role)
        if not cats:
            continue
        total = sum(cats.values())
        rows = []
        for cat, count in sorted(cats.items(), key=lambda kv: -kv[1]):
            us = count / rate / n * 1e6
            rows.append([cat, f"{us:,.1f}", f"{100 * count / total:.1f}%"])
        data[role] = {c: v / rate / n * 1e6 for c, v in cats.items()}
        lines.append(_table(["  " + role + " thread(s)", "µs/task", "share"], rows))
    return "\n\n".join(lines), data


def profile_drain(
    directory: str, durability: str, variant: str, concurrency: int, n: int, analyze: bool,
    gil: bool, rate: int,
) -> tuple[str, dict[str, Any]] | None:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(pyspy):
        print("  py-spy not found: pip install py-spy into .venv to profile", file=sys.stderr)
        return None
    RESULTS_DIR.mkdir(exist_ok=True)
    tag = f"{durability}-{variant}-c{concurrency}{'-analyze' if analyze else ''}"
    tag += "-gil" if gil else "-wall"
    raw = str(RESULTS_DIR / f"profile-{tag}-n{n}.txt")
    prof = [pyspy, "record", "--rate", str(rate), "--format", "raw", "--output", raw,
            "--nonblocking", "--threads"]
    prof += ["--gil"] if gil else ["--idle"]
    result = run_ratchet_drain(directory, durability, variant, concurrency, n, analyze, prof)
    text, data = summarize_profile(raw, rate, n, result.pop("sources", None))
    head = (
        f"profile {tag}: {result['tasks_per_s']:,.0f} tasks/s under py-spy "
        f"({'samples only the thread holding the GIL' if gil else 'wall clock, every thread'});"
        f" raw stacks in {os.path.relpath(raw, ROOT)}"
    )
    return head + "\n" + text, {"result": result, "us_per_task": data}


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000, help="tasks per drain (default 20000)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole drain round R times, interleaved (median reported)")
    p.add_argument("--enqueue-tasks", type=int, default=None,
                   help="tasks per enqueue measurement (default: --tasks)")
    p.add_argument("--concurrency", default="1,8,32", help="worker concurrencies (default 1,8,32)")
    p.add_argument("--prefetch", default="auto",
                   help="worker prefetch values, e.g. 0,4,auto (default auto: the Worker's "
                        "default; 0 = no prefetch, the behaviour before prefetch existed)")
    p.add_argument("--durability", default="fsync,buffered")
    p.add_argument("--variants", default="step,zero", help="step (1 ctx.step) and/or zero")
    p.add_argument("--huey-workers", default="1,8", help="huey thread workers (default 1,8)")
    p.add_argument("--no-huey", action="store_true", help="skip the huey comparison")
    p.add_argument("--what-if-analyze", action="store_true",
                   help="also drain fsync ledgers that were ANALYZEd first (planner what-if)")
    p.add_argument("--profile", action="store_true",
                   help="also profile fsync/1-step C=8 and C=32 drains with py-spy (wall, GIL)")
    p.add_argument("--profile-rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--commit-seconds", type=float, default=3.0,
                   help="duration of the first single-commit loop (default 3 s)")
    p.add_argument("--probe-seconds", type=float, default=0.5,
                   help="single-commit probe before and after each drain (default 0.5 s; 0 = off)")
    p.add_argument("--dir", default=None, help="parent directory of the temp files (same disk!)")
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = p.parse_args(argv)

    n = args.tasks
    n_enq = args.enqueue_tasks or n
    durabilities = [d for d in args.durability.split(",") if d]
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    variants = [v for v in args.variants.split(",") if v]
    prefetches = [x.strip() for x in args.prefetch.split(",") if x.strip()]
    for x in prefetches:
        if x != "auto" and not x.isdigit():
            p.error(f"--prefetch: {x!r} is neither a non-negative integer nor 'auto'")
    huey_workers = [] if args.no_huey else [int(w) for w in args.huey_workers.split(",") if w]
    repeat = max(1, args.repeat)
    directory = tempfile.mkdtemp(prefix="ratchet-bench-", dir=args.dir)
    figures: dict[str, Any] = {"tasks": n, "repeat": repeat}
    sync_of = {"fsync": "FULL", "buffered": "NORMAL"}

    global CHILD_ENV
    revision = _git_revision()
    snapshot = os.path.join(directory, "src")
    shutil.copytree(ROOT / "src" / "ratchet", os.path.join(snapshot, "ratchet"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, snapshot)
    CHILD_ENV = dict(os.environ)
    CHILD_ENV["PYTHONPATH"] = os.pathsep.join(
        [snapshot, *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    import ratchet

    figures["revision"] = revision
    print(
        f"Ratchet {ratchet.__version__} ({revision}) on Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}, files in {directory}; N = {n:,} tasks per drain, "
        f"{repeat} run(s) each (median [min-max])\n",
        flush=True,
    )
    try:
        # 1. one fsynced commit
        commit_rate = {
            sync: single_commit_rate(directory, sync, args.commit_seconds)
            for sync in ("FULL", "NORMAL")
        }
        figures["single_commit_per_s"] = commit_rate
        print(_table(
            ["single-row commit (WAL)", "commits/s", "ms/commit"],
            [[f"synchronous={k}", f"{v:,.0f}", f"{1000 / v:.3f}"] for k, v in commit_rate.items()],
        ) + "\n", flush=True)

        def probe(sync: str) -> float:
            if args.probe_seconds <= 0:
                return commit_rate[sync]
            return single_commit_rate(directory, sync, args.probe_seconds)

        # 2. enqueue
        enq_rows = []
        figures["enqueue"] = {}
        for dur in durabilities:
            one = [enqueue_rate(directory, dur, n_enq, 1) for _ in range(repeat)]
            many = [enqueue_rate(directory, dur, n_enq, 100) for _ in range(repeat)]
            rate_now = probe(sync_of[dur])
            figures["enqueue"][dur] = {"submit": one, "submit_many_100": many,
                                       "commit_probe_per_s": rate_now}
            enq_rows.append([dur, _fmt_rate(one), _fmt_rate(many), f"{rate_now:,.0f}",
                             f"{_median(one) / rate_now:.2f}"])
        print(_table(["enqueue (tasks/s)", "submit 1-by-1", "submit_many x100",
                      "commit/s probe", "1-by-1 / commit/s"], enq_rows,
                     title=f"enqueue of {n_enq:,} tasks into a fresh ledger") + "\n", flush=True)

        # 3 + 4. drains, interleaved round by round (disk and CPU drift hit every system alike)
        plans: list[tuple[str, str, int, str, bool]] = [
            (d, v, c, pf, False) for d in durabilities for v in variants
            for c in concurrencies for pf in prefetches
        ]
        if args.what_if_analyze and "fsync" in durabilities:
            plans += [("fsync", v, c, pf, True) for v in variants for c in concurrencies
                      for pf in prefetches]
        drains = [{"durability": d, "variant": v, "concurrency": c, "prefetch": pf,
                   "analyze": a, "runs": []} for d, v, c, pf, a in plans]
        huey = [{"workers": w, "runs": []} for w in huey_workers]
        python = huey_python(install=True) if huey else None
        for round_no in range(repeat):
            if repeat > 1:
                print(f"round {round_no + 1}/{repeat}", flush=True)
            for h in huey:
                before = probe("FULL")
                assert python is not None
                r = run_huey(python, directory, h["workers"], n)
                after = probe("FULL")
                r["commit_probe_per_s"] = (before + after) / 2
                r["commit_probe_before_after"] = [before, after]
                h["runs"].append(r)
                print(f"  huey -w {h['workers']} thread: {r['tasks_per_s']:,.0f} tasks/s "
                      f"(commit probe before/after {before:,.0f}/{after:,.0f} per s)", flush=True)
            for e in drains:
                before = probe(sync_of[e["durability"]])
                r = run_ratchet_drain(directory, e["durability"], e["variant"],
                                      e["concurrency"], n, e["analyze"],
                                      prefetch=e["prefetch"])
                after = probe(sync_of[e["durability"]])
                r["commit_probe_per_s"] = (before + after) / 2
                r["commit_probe_before_after"] = [before, after]
                e["runs"].append(r)
                print(f"  ratchet {e['durability']} {VARIANT_LABEL[e['variant']]} "
                      f"C={e['concurrency']} prefetch={e['prefetch']}"
                      f"{' (ANALYZEd file)' if e['analyze'] else ''}: "
                      f"{r['tasks_per_s']:,.0f} tasks/s (commit probe before/after "
                      f"{before:,.0f}/{after:,.0f} per s)", flush=True)
        figures["drains"] = drains
        figures["huey"] = huey

        def ratio(runs: list[dict[str, Any]]) -> float:
            return _median([x["tasks_per_s"] / x["commit_probe_per_s"] for x in runs])

        # detail table
        rows = []
        for e in drains:
            rs = e["runs"]
            tps = [x["tasks_per_s"] for x in rs]
            r = sorted(rs, key=lambda x: x["tasks_per_s"])[len(rs) // 2]
            claims = max(1, r["claim_nonempty"])
            tx = r["writer_transactions"] + r["claim_calls"]
            writer_busy = (r["claim_s"] + r["commit_s"]) / r["drain_s"] if r["drain_s"] else 0
            commit_stmt = r["stmt"].get("ratchet-writer:COMMIT", [0, 0.0])
            begin_stmt = r["stmt"].get("ratchet-writer:BEGIN", [0, 0.0])
            label = f"{e['durability']} {VARIANT_LABEL[e['variant']]}" + (
                " +ANALYZE" if e["analyze"] else "")
            rows.append([
                label, f"{e['concurrency']} p={e['prefetch']}", _fmt_rate(tps),
                f"{_median([x['ledger_tasks_per_s'] for x in rs]):,.0f}",
                f"{ratio(rs):.2f}",
                f"{r['writer_writes'] / max(1, r['writer_transactions']):.1f}",
                f"{r['claimed'] / claims:.1f}",
                f"{tx / max(1, r['claimed']):.2f}",
                f"{1e3 * r['claim_s'] / max(1, r['claim_calls']):.2f}",
                f"{1e3 * r['commit_s'] / max(1, r['commit_calls']):.2f}",
                f"{1e3 * begin_stmt[1] / max(1, begin_stmt[0]):.2f}",
                f"{1e3 * commit_stmt[1] / max(1, commit_stmt[0]):.2f}",
                f"{100 * writer_busy:.0f}%",
                f"{1e6 * r['cpu_s'] / n:,.0f}",
            ])
        print("\n" + _table(
            ["ratchet drain", "C", "tasks/s", "ledger t/s", "÷commit/s", "writes/tx",
             "claim batch", "tx/task", "claim ms", "commit ms", "BEGIN ms", "COMMIT ms",
             "writer busy", "CPU µs/task"],
            rows,
            title=(f"Ratchet drain of {n:,} no-op tasks by one worker process "
                   "(tasks/s timed in-process; 'ledger t/s' from ledger timestamps)"),
        ), flush=True)

        # final table
        base = _median([x["tasks_per_s"] for x in huey[0]["runs"]]) if huey else float("nan")
        base_ratio = ratio(huey[0]["runs"]) if huey else float("nan")
        final = []
        for h in huey:
            rs = h["runs"]
            tps = [x["tasks_per_s"] for x in rs]
            final.append([
                "huey SqliteHuey", f"default (sync={rs[0]['synchronous']})",
                f"-w {h['workers']} thread", _fmt_rate(tps),
                f"{_median([x['commit_probe_per_s'] for x in rs]):,.0f}", f"{ratio(rs):.2f}",
                f"{_median(tps) / base:.2f}", f"{ratio(rs) / base_ratio:.2f}",
            ])
        for e in drains:
            rs = e["runs"]
            tps = [x["tasks_per_s"] for x in rs]
            system = f"ratchet {VARIANT_LABEL[e['variant']]}" + (
                " +ANALYZE (what-if)" if e["analyze"] else "")
            final.append([
                system, e["durability"], f"C={e['concurrency']} p={e['prefetch']}",
                _fmt_rate(tps),
                f"{_median([x['commit_probe_per_s'] for x in rs]):,.0f}", f"{ratio(rs):.2f}",
                f"{_median(tps) / base:.2f}" if huey else "-",
                f"{ratio(rs) / base_ratio:.2f}" if huey else "-",
            ])
        print("\n" + _table(
            ["system", "durability", "workers", "drain tasks/s", "commit/s probe",
             "÷commit/s", "x huey -w 1", "x huey (per commit)"], final,
            title=f"Final: drain of {n:,} no-op tasks, one worker process",
        ), flush=True)
        if huey:
            enq = [x["enqueue_per_s"] for h in huey for x in h["runs"]]
            print(f"huey enqueue, one by one with its defaults: {_fmt_rate(enq)} tasks/s")

        # profile
        if args.profile:
            figures["profile"] = {}
            for conc in (8, 32):
                for gil in (False, True):
                    got = profile_drain(directory, "fsync", "step", conc, n, False, gil,
                                        args.profile_rate)
                    if got is None:
                        break
                    text, data = got
                    figures["profile"][f"C={conc},gil={gil}"] = data
                    print("\n" + text, flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other processes skew figures)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    return 0


def _dispatch(argv: list[str]) -> int:
    children: dict[str, Callable[[Sequence[str]], int]] = {
        "_ratchet_worker": ratchet_worker_child,
        "_huey": huey_child,
    }
    if argv and argv[0] in children:
        return children[argv[0]](argv[1:])
    return main(argv)


if __name__ == "__main__":
    sys.exit(_dispatch(sys.argv[1:]))
