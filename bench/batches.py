"""Batches and sharded jobs: items/s through ``ctx.batches``, resume time against the number
of finished batches, and a sharded job against one task, on either ledger.

Run::

    .venv/bin/python bench/batches.py                                  # SQLite (~1 min)
    .venv/bin/python bench/batches.py --ledger sqlite,postgresql       # what README shows
    .venv/bin/python bench/batches.py --scenarios resume --resume-batches 10,10000,50000

Three scenarios, each task on a fresh ledger (a SQLite file in ``--dir``; on PostgreSQL a
schema of its own, ``?schema=`` in the ledger URL, dropped at the end, also after an
error). The worker runs in this process (``ratchet.Worker``, ``--concurrency`` threads);
timing is taken inside the task, so worker start-up and migration are not counted.

1. ``throughput``: one task runs ``ctx.batches`` over ``--items`` items (a callable
   source, ``source(start) = range(start, n)``, the shape of a keyset query) with a no-op
   ``fn``, for every ``--sizes`` x ``--parallel``. items/s = items / (the call's return -
   its start); batches/s likewise. ``writes/tx`` is the group commit: task writes per
   ledger transaction of the worker's writer (each batch is one fenced write).
2. ``resume``: a task runs ``ctx.batches`` over batches of ``--resume-size`` items whose
   ``fn`` makes one ``ctx.effect`` per batch (key derived from the position), with
   ``parallel=8``, and fails on purpose at batch N (for each of ``--resume-batches``), so
   about N batches and N batch effects are committed. Then (a) ``Ledger.batch_open`` -
   what ``ctx.batches`` reads when it starts: the run's row and the effects at or past the
   watermark - is timed ``--samples`` times from this process; (b) a new worker claims the
   second attempt, and we time the claim transaction (``Ledger.claim``; the effects the
   claim loaded are counted: batch effects must not be among them), the claim -> the body,
   and the body's call of ``ctx.batches`` -> the first new batch's ``fn`` (the resume). The
   second attempt then processes the 8 batches left. The figure that matters is the ratio
   between the largest and the smallest N: resuming must not grow with the finished
   batches.
3. ``shards``: ``--shard-items`` items processed by one task (``ctx.batches``, size
   ``--shard-size``, ``parallel=1``) and by a sharded job (``App.submit_sharded``,
   ``--shards`` shards, each task's source the items it owns, ``Shard.owns(str(i))``),
   with the same worker (``--concurrency`` threads, enough for the parent and every
   shard); ``fn`` sleeps ``--shard-batch-ms`` per batch (the batch's I/O). Wall time from
   the submit to the job's result; the time the tasks spent selecting their items (wall, summed)
   (one task: the list; the shards: every shard hashes every key); the job's conservation
   check (``Control.check``).

Figures are printed, never asserted: a measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ratchet  # noqa: E402
from ratchet import App, RetryPolicy, State, TaskContext, Worker  # noqa: E402
from ratchet.control import Control  # noqa: E402
from ratchet.ledger.base import BATCH_RUN_PREFIX  # noqa: E402

DEFAULT_PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RATCHET_URL_PARAMS = ("schema", "durability", "pool_size")
TAIL_BATCHES = 8  # batches left for the resumed attempt


class Planned(Exception):
    """The first attempt of the resume task stops here, on purpose."""


# ----------------------------------------------------------------------------- helpers


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _ratio(a: float, b: float) -> str:
    return f"x{a / b:.2f}" if b and a == a and b == b else "-"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms" if seconds == seconds else "-"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  " + "  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                            for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    out = [line, "  " + "  ".join("-" * w for w in widths)]
    for row in rows:
        out.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                    for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(out)


def _git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"git {head}{' +uncommitted src changes' if dirty else ''}"


def libpq_url(base: str) -> str:
    """``base`` without Ratchet's own query parameters (what libpq accepts)."""
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in RATCHET_URL_PARAMS]
    return urlunsplit(parts._replace(query=urlencode(query)))


class Ledgers:
    """Fresh ledgers: SQLite files in a temp dir, PostgreSQL schemas (dropped at close)."""

    def __init__(self, directory: str | None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-batches-", dir=directory))
        self.tag = f"rbench_bt_{os.getpid()}_{secrets.token_hex(2)}"
        self.schemas: list[tuple[str, str]] = []  # (base url, schema)
        self.made = 0

    def new(self, ledger: str, what: str) -> str:
        self.made += 1
        n = self.made
        if ledger == "sqlite":
            return f"sqlite:///{self.dir}/{what}_{n}.db"
        schema = f"{self.tag}_{what}_{n}".lower()[:63]
        self.schemas.append((ledger, schema))
        parts = urlsplit(ledger)
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"]
        return urlunsplit(parts._replace(query=urlencode([*query, ("schema", schema)])))

    def drop(self, url: str) -> None:
        """Remove the ledger ``url`` (made by :meth:`new`) now."""
        if url.startswith("sqlite:///"):
            for suffix in ("", "-wal", "-shm"):
                Path(url[len("sqlite:///"):] + suffix).unlink(missing_ok=True)
            return
        schema = dict(parse_qsl(urlsplit(url).query))["schema"]
        for base, name in list(self.schemas):
            if name == schema:
                self._drop_schema(base, name)
                self.schemas.remove((base, name))

    @staticmethod
    def _drop_schema(base: str, schema: str) -> None:
        import psycopg
        from psycopg import sql

        with psycopg.connect(libpq_url(base), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

    def close(self) -> None:
        for base, schema in self.schemas:
            try:
                self._drop_schema(base, schema)
            except Exception as exc:  # report and go on: the others still need dropping
                print(f"  WARNING: could not drop schema {schema}: {exc}", file=sys.stderr)
        self.schemas.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class CommitTimer:
    """Wraps one ledger object's ``commit`` and ``commit_and_claim`` (instance attributes)
    to count the task writes they carried and the transactions."""

    def __init__(self, ledger: Any) -> None:
        self.writes = 0
        self.transactions = 0
        self.lock = threading.Lock()
        for name in ("commit", "commit_and_claim"):
            setattr(ledger, name, self._wrap(getattr(ledger, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(writes: Sequence[Any], *a: Any, **kw: Any) -> Any:
            try:
                return fn(writes, *a, **kw)
            finally:
                with self.lock:
                    self.writes += len(writes)
                    self.transactions += 1

        return counted


class ClaimTimer:
    """Wraps ``Ledger.claim`` (an instance attribute): the duration of every claim that
    returned tasks, and what those claims loaded."""

    def __init__(self, ledger: Any) -> None:
        self.claims: list[tuple[float, Any]] = []
        inner = ledger.claim

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            found = inner(*a, **kw)
            if found:
                self.claims.append((time.perf_counter() - t0, found))
            return found

        ledger.claim = timed


# ----------------------------------------------------------------------------- the tasks

_marks: dict[int, dict[str, float]] = {}  # the resume task's clock readings, by attempt


def build_app(url: str) -> App:
    """The bench's task types on ``url``."""
    app = ratchet.App(url)

    @app.task(name="bench.batches")
    def batches(ctx: TaskContext, n: int, size: int, parallel: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        report = ctx.batches("items", lambda start: range(start, n), lambda b, p: None,
                             size=size, parallel=parallel, total=n)
        return {"seconds": time.perf_counter() - t0, **report}

    @app.task(name="bench.resume", retry=RetryPolicy(
        max_attempts=100, base_delay_s=0.0, jitter=0.0, quarantine_after=None))
    def resume(ctx: TaskContext, stop_at: int, size: int, resumes: int) -> dict[str, Any]:
        marks = _marks.setdefault(ctx.attempt, {})
        marks["body"] = time.perf_counter()
        attempt = ctx.attempt
        n = (stop_at + TAIL_BATCHES) * size

        def fn(batch: list[int], position: int) -> None:
            if "first_fn" not in marks:
                marks["first_fn"] = time.perf_counter()
            if attempt == 1 and position >= stop_at * size:
                raise Planned(f"stop at {position}")
            if 1 < attempt <= resumes + 1:
                raise Planned(f"resume {attempt - 1} measured")
            ctx.effect("touch", lambda k: position, key=f"touch:{position}")

        marks["call"] = time.perf_counter()
        return ctx.batches("items", lambda start: range(start, n), fn, size=size,
                           parallel=8, total=n)

    @app.task(name="bench.sharded")
    def sharded(ctx: TaskContext, n: int, size: int, batch_ms: float) -> dict[str, Any]:
        shard = ctx.shard
        t0 = time.perf_counter()
        mine = (list(range(n)) if shard is None
                else [i for i in range(n) if shard.owns(str(i))])
        selected = time.perf_counter() - t0

        def fn(batch: list[int], position: int) -> None:
            time.sleep(batch_ms / 1e3)  # the batch's I/O

        report = ctx.batches("items", mine, fn, size=size)
        return {**report, "select_us": int(selected * 1e6)}

    return app


def run_worker(app: App, concurrency: int, until: Callable[[], bool],
               timeout_s: float, hooks: type[Worker] = Worker) -> None:
    """Run a worker in a thread of this process until ``until()``; then stop it."""
    worker = hooks(app, concurrency=concurrency, poll_interval_s=0.02)
    thread = threading.Thread(target=worker.run, name="bench-worker", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not until():
            if not thread.is_alive():
                raise RuntimeError("the worker stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {timeout_s:g} s")
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(60)


def terminal(app: App, task_id: str) -> Callable[[], bool]:
    return lambda: app.get(task_id).terminal


# ----------------------------------------------------------------------------- 1. throughput


def run_throughput(ledgers: Ledgers, ledger: str, args: argparse.Namespace
                   ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for size in args.sizes:
        for parallel in args.parallel:
            url = ledgers.new(ledger, f"tp{size}p{parallel}")
            app = build_app(url)
            try:
                app.ledger.migrate()
                timer = CommitTimer(app.ledger)
                handle = app.submit("bench.batches", {"n": args.items, "size": size,
                                                      "parallel": parallel})
                run_worker(app, args.concurrency, terminal(app, handle.task_id),
                           600 + args.items / 100)
                info = app.get(handle.task_id)
                if info.state is not State.SUCCEEDED:
                    raise RuntimeError(f"task ended {info.state}: {info.last_error}")
                r = info.result
                out.append({"size": size, "parallel": parallel, "items": r["items"],
                            "batches": r["batches"], "seconds": r["seconds"],
                            "writes_per_tx": timer.writes / max(1, timer.transactions)})
            finally:
                app.close()
                ledgers.drop(url)
            row = out[-1]
            print(f"  size {size:,} parallel {parallel}: {row['items'] / row['seconds']:,.0f} "
                  f"items/s", flush=True)
    return out


def report_throughput(rows: list[dict[str, Any]]) -> None:
    by = {(r["size"], r["parallel"]): r for r in rows}
    table = []
    for r in rows:
        base = by.get((r["size"], 1))
        table.append([f"size {r['size']:,}, parallel {r['parallel']}", f"{r['items']:,}",
                      f"{r['seconds']:.2f}", f"{r['items'] / r['seconds']:,.0f}",
                      f"{r['batches'] / r['seconds']:,.0f}",
                      f"{r['seconds'] / r['batches'] * 1e3:.2f}",
                      f"{r['writes_per_tx']:.1f}",
                      _ratio(base["seconds"], r["seconds"]) if base else "-"])
    print(_table(["ctx.batches, no-op fn", "items", "seconds", "items/s", "batches/s",
                  "ms/batch", "writes/tx", "x parallel 1"], table))


# ----------------------------------------------------------------------------- 2. resume


def claim_history(app: App, task_id: str, samples: int) -> tuple[list[float], int]:
    """Time the two reads a claim makes of a resumed task's history (its steps and its
    effects, the ledger's ``claim_steps`` / ``claim_effects`` statements) in one read
    transaction, ``samples`` times; and the rows they returned. These are the part of a
    claim that could grow with the task's past (the rest is the same for every task)."""
    from ratchet.ledger.rows import CLAIM_EFFECTS, CLAIM_STEPS

    dialect = app.ledger._core.dialect  # type: ignore[attr-defined]

    def read(tx: Any) -> int:
        return (len(CLAIM_STEPS.all(tx, {"ids": [task_id]}))
                + len(CLAIM_EFFECTS.all(tx, {"ids": [task_id]})))

    times, rows = [], 0
    for _ in range(samples):
        t = time.perf_counter()
        rows = dialect.run(read, write=False)
        times.append(time.perf_counter() - t)
    return times, rows



def run_resume(ledgers: Ledgers, ledger: str, args: argparse.Namespace, stop_at: int
               ) -> dict[str, Any]:
    url = ledgers.new(ledger, f"resume{stop_at}")
    app = build_app(url)
    size, resumes = args.resume_size, args.resumes
    out: dict[str, Any] = {"stop_at": stop_at}
    try:
        app.ledger.migrate()
        handle = app.submit("bench.resume", {"stop_at": stop_at, "size": size,
                                             "resumes": resumes})
        tid = handle.task_id
        # attempt 1: runs up to batch stop_at, fails on purpose (retried at once)
        _marks.clear()
        t0 = time.monotonic()
        Worker(app, concurrency=args.concurrency, poll_interval_s=0.02).run(max_tasks=1)
        out["prepare_s"] = time.monotonic() - t0
        info = app.get(tid)
        if info.terminal:
            raise RuntimeError(f"after attempt 1 the task is {info.state}: {info.last_error}")
        [run] = app.ledger.batch_runs([tid])
        out.update(watermark=run.watermark, above=len(run.above), batches=run.batches)
        stored = f"{BATCH_RUN_PREFIX}items"
        samples = []
        for _ in range(args.samples):
            t = time.perf_counter()
            _, effects = app.ledger.batch_open(tid, stored)
            samples.append(time.perf_counter() - t)
        out["open"] = samples
        out["open_effects"] = len(effects)
        out["history"], out["history_rows"] = claim_history(app, tid, args.samples)
        # attempts 2 .. resumes + 1: a new worker claims each, resumes from the watermark,
        # and stops at the first new batch; the last attempt processes the batches left
        claims = ClaimTimer(app.ledger)
        claimed: dict[int, float] = {}

        class Timed(Worker):
            def on_claimed(self, claim: Any) -> None:
                claimed[claim.attempt] = time.perf_counter()

        run_worker(app, args.concurrency, terminal(app, tid), 600, Timed)
        info = app.get(tid)
        if info.state is not State.SUCCEEDED:
            raise RuntimeError(f"the last attempt ended {info.state}: {info.last_error}")
        if info.result["items"] != (stop_at + TAIL_BATCHES) * size:
            print(f"  WARNING: the run counted {info.result}")
        measured = range(2, resumes + 2)
        out.update(
            claim=[c for c, _ in claims.claims][:resumes],
            claim_effects=max(len(f[0].effects) for _, f in claims.claims),
            to_body=[_marks[a]["body"] - claimed[a] for a in measured],
            resume=[_marks[a]["first_fn"] - _marks[a]["call"] for a in measured],
            claim_to_batch=[_marks[a]["first_fn"] - claimed[a] for a in measured],
            result=info.result)
    finally:
        app.close()
        ledgers.drop(url)
    print(f"  {out['batches']:,} batches: prepared in {out['prepare_s']:.1f} s; resume p50 "
          f"{_ms(_pct(out['resume'], 0.5))}", flush=True)
    return out


def report_resume(rows: list[dict[str, Any]]) -> None:
    cols = ("open", "history", "claim", "to_body", "resume", "claim_to_batch")
    table = []
    for r in rows:
        table.append([f"{r['batches']:,} batches (watermark {r['watermark']:,}, "
                      f"{r['above']} above)"]
                     + [_ms(_pct(r[c], 0.5)) for c in cols]
                     + [str(r["open_effects"]), str(r["claim_effects"])
                        + f" ({r['history_rows']} rows)"])
    lo, hi = rows[0], rows[-1]
    if len(rows) > 1:
        table.append([f"ratio {hi['batches']:,} / {lo['batches']:,} (p50)"]
                     + [_ratio(_pct(hi[c], 0.5), _pct(lo[c], 0.5)) for c in cols] + ["", ""])
    print(_table(["resume after (p50 of each)", "batch_open", "claim's history read",
                  "claim tx", "claim -> body",
                  "ctx.batches -> 1st new fn", "claim -> 1st new fn", "effects opened",
                  "effects claimed"], table))
    print(f"  ({len(lo['open'])} batch_open reads from this process; {len(lo['resume'])} "
          "resumed attempts, each claimed by the worker and stopped at its first new batch)")


# ----------------------------------------------------------------------------- 3. shards


def run_shards(ledgers: Ledgers, ledger: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"items": args.shard_items, "shards": args.shards,
                           "batch_ms": args.shard_batch_ms}
    concurrency = max(args.concurrency, args.shards + 1)
    for what in ("one task", "sharded"):
        url = ledgers.new(ledger, "shards" if what == "sharded" else "single")
        app = build_app(url)
        try:
            app.ledger.migrate()
            params = {"n": args.shard_items, "size": args.shard_size,
                      "batch_ms": args.shard_batch_ms}
            t0 = time.perf_counter()
            handle = (app.submit_sharded("bench.sharded", params, shards=args.shards)
                      if what == "sharded" else app.submit("bench.sharded", params))
            run_worker(app, concurrency, terminal(app, handle.task_id),
                       600 + args.shard_items / 100)
            seconds = time.perf_counter() - t0
            info = app.get(handle.task_id)
            if info.state is not State.SUCCEEDED:
                raise RuntimeError(f"{what} ended {info.state}: {info.last_error}")
            totals = info.result["totals"] if what == "sharded" else info.result
            items = totals["items"]
            with Control(app=app) as control:
                check = control.check(handle.task_id)
            out[what] = {"seconds": seconds, "items": items, "ok": check.ok,
                         "lines": len(check.lines), "select_s": totals["select_us"] / 1e6}
        finally:
            app.close()
            ledgers.drop(url)
    return out


def report_shards(r: dict[str, Any]) -> None:
    one, many = r["one task"], r["sharded"]
    print(_table(
        [f"{r['items']:,} items, {r['batch_ms']:g} ms per batch", "seconds", "items/s",
         "selecting items (wall, summed)", "items counted", "Control.check"],
        [["one task", f"{one['seconds']:.2f}", f"{one['items'] / one['seconds']:,.0f}",
          f"{one['select_s']:.2f} s", f"{one['items']:,}", "ok" if one["ok"] else "NOT OK"],
         [f"sharded job, {r['shards']} shards", f"{many['seconds']:.2f}",
          f"{many['items'] / many['seconds']:,.0f}", f"{many['select_s']:.2f} s",
          f"{many['items']:,}", ("ok" if many["ok"] else "NOT OK") + f" ({many['lines']} lines)"],
         ["ratio sharded / one", _ratio(many["seconds"], one["seconds"]),
          _ratio(many["items"] / many["seconds"], one["items"] / one["seconds"]), "", "", ""]]))


# ----------------------------------------------------------------------------- main


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledger", default="sqlite",
                   help="sqlite, postgresql (the test server) or a postgresql:// URL; "
                        "several, comma-separated (default sqlite)")
    p.add_argument("--scenarios", default="throughput,resume,shards",
                   help="which to run (default all: throughput,resume,shards)")
    p.add_argument("--items", type=int, default=100_000, help="items per throughput run")
    p.add_argument("--sizes", type=_ints, default=[100, 1000], help="batch sizes (100,1000)")
    p.add_argument("--parallel", type=_ints, default=[1, 8], help="parallel values (1,8)")
    p.add_argument("--resume-batches", type=_ints, default=[10, 10_000],
                   help="committed batches before the resume (10,10000)")
    p.add_argument("--resume-size", type=int, default=10, help="items per batch (10)")
    p.add_argument("--samples", type=int, default=50, help="batch_open timings (50)")
    p.add_argument("--resumes", type=int, default=20,
                   help="resumed attempts timed per run (20)")
    p.add_argument("--shard-items", type=int, default=100_000, help="items (100,000)")
    p.add_argument("--shard-size", type=int, default=500, help="batch size (500)")
    p.add_argument("--shards", type=int, default=8, help="shards (8)")
    p.add_argument("--shard-batch-ms", type=float, default=20.0,
                   help="what fn takes per batch in the shards scenario, ms (20: I/O)")
    p.add_argument("--concurrency", type=int, default=8, help="worker threads (8)")
    p.add_argument("--dir", default=None, help="where SQLite ledger files go (temp dir)")
    p.add_argument("--json", default=None, help="also write every figure to this file")
    args = p.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - {"throughput", "resume", "shards"}
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.ERROR)
    print(f"Ratchet batches bench: {_git_revision()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; worker concurrency {args.concurrency}", flush=True)
    ledgers = Ledgers(args.dir)
    figures: dict[str, Any] = {}
    try:
        for ledger in [x.strip() for x in args.ledger.split(",") if x.strip()]:
            if ledger == "postgresql":
                ledger = DEFAULT_PG_URL
            kind = "sqlite" if ledger == "sqlite" else "postgresql"
            if kind == "postgresql" and not ledger.startswith("postgresql"):
                p.error(f"--ledger: {ledger!r} is neither sqlite nor a postgresql URL")
            label = "SQLite" if kind == "sqlite" else f"PostgreSQL ({libpq_url(ledger)})"
            mine: dict[str, Any] = figures.setdefault(kind, {})
            if "throughput" in scenarios:
                print(f"\n[{label}] 1. items/s through ctx.batches, {args.items:,} items",
                      flush=True)
                mine["throughput"] = run_throughput(ledgers, ledger, args)
                report_throughput(mine["throughput"])
            if "resume" in scenarios:
                print(f"\n[{label}] 2. resume time against finished batches "
                      f"({args.resume_size} items each, one ctx.effect per batch)", flush=True)
                mine["resume"] = [run_resume(ledgers, ledger, args, n)
                                  for n in sorted(args.resume_batches)]
                report_resume(mine["resume"])
            if "shards" in scenarios:
                print(f"\n[{label}] 3. a sharded job ({args.shards} shards) vs one task",
                      flush=True)
                mine["shards"] = run_shards(ledgers, ledger, args)
                report_shards(mine["shards"])
    finally:
        ledgers.close()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
