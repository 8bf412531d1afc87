"""Workflows (durable sleep, events, child tasks): what parked work costs, on either ledger.

Run::

    .venv/bin/python bench/workflows.py                      # SQLite, quick sizes (~1 min)
    .venv/bin/python bench/workflows.py --ledger postgresql  # the test server, a private schema
    .venv/bin/python bench/workflows.py --ledger sqlite,postgresql --full   # the issue's sizes
    .venv/bin/python bench/workflows.py --scenarios wake --sleepers 5000 --sleep-s 5

Four scenarios, each on a fresh ledger (a SQLite file in ``--dir``; on PostgreSQL a schema
of its own, ``?schema=`` in the ledger URL, dropped at the end, also after an error):

1. ``waiting``: one worker process (``--concurrency`` threads, ``--poll-interval``) on an
   empty ledger: its RSS, its CPU while idle for ``--idle-s``, and the claim latency of
   ``--latency-count`` plain tasks submitted one at a time (committed submit -> the task
   body's first line, p50 / p99). Then ``--waiting`` tasks are submitted (``submit_many``,
   batches of 1,000) and parked by that worker: half ``ctx.sleep`` for 30 days, half
   ``ctx.wait_for_event`` on a key of their own; once the ledger counts them all
   ``WAITING``, the same figures again (same worker); on PostgreSQL again after a
   ``VACUUM`` of ``tasks`` (the test server runs without autovacuum: parking leaves three
   dead versions per task, and once their leases have passed the expired-lease scan of
   every claim visits them, as after any drain); and once more for a new worker process
   started on the loaded ledger (a worker that loads parked work at start shows there).
   RSS is read from ``/proc/<pid>/status`` (``VmRSS``; ``VmHWM`` the peak).
2. ``wake``: ``--sleepers`` tasks (submitted in batches of 20 at random moments over
   ``--sleep-spread`` seconds, so the deadlines fall on every phase of a polling worker)
   each fix a deadline ``--sleep-s`` ahead in a step and ``ctx.sleep_until`` it; lateness
   = the resumed body's clock (its first line after the sleep) minus the deadline, min /
   p50 / p99 / max. Goal: p99 <= 1 s on PostgreSQL, <= the worker's poll interval on
   SQLite. "parked at once" is the most tasks the ledger counted ``WAITING`` at one time
   (sampled every 50 ms).
3. ``fanin``: one parent task fans out ``--children`` no-op children with
   ``ctx.submit_many`` and ``ctx.gather``\\ s them; one worker process runs all. Reported:
   fan-out (the parent's step before ``submit_many`` -> its step right after), the
   children's drain, and fan-in = the parent's step after ``gather`` minus the last
   child's finish (``TaskInfo.updated_at``, the ledger clock), goal <= 1 s; "resumed body
   -> step" is how long the resumed attempt took to get through ``submit_many`` (replayed)
   and ``gather`` (reading the results).
4. ``cost``: what one child's completion costs the ledger with ``--siblings-small`` (10)
   siblings vs ``--children`` siblings, the same number of children in both (``children /
   siblings`` parents). The parents are run first (this process, a worker claiming
   ``bench.parent`` only) until all wait on their children; then ``--commit-samples``
   children are claimed one by one and each completion committed alone
   (``Ledger.commit``, timed: p50 / p99 / mean; the two ledgers alternate in blocks of
   10, so drift in the machine's load hits both alike), then the rest is drained by an
   in-process worker claiming ``bench.child`` only (children/s; its writer's
   ``commit`` / ``commit_and_claim`` time per child). Must be O(1) in the siblings: the
   ratios (many / few) should stay near 1.

Plain-task drain throughput is measured by ``bench/sqlite_throughput.py`` and
``bench/pg_throughput.py`` (see bench/README.md). Figures are printed, never asserted: a
measurement tool, not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import secrets
import shutil
import signal
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ratchet  # noqa: E402
from ratchet import App, State, SubmitRequest, TaskContext, Worker  # noqa: E402
from ratchet.ledger.base import TaskWrite, Transition  # noqa: E402

DEFAULT_PG_URL = os.environ.get("RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RATCHET_URL_PARAMS = ("schema", "durability", "pool_size")
FAR_S = 30 * 86400.0  # "far in the future": 30 days
MIB = 1024.0 * 1024.0
QUICK = {"waiting": 10_000, "sleepers": 1_000, "children": 2_000, "latency_count": 100,
         "commit_samples": 100}
FULL = {"waiting": 100_000, "sleepers": 1_000, "children": 10_000, "latency_count": 200,
        "commit_samples": 200}


# ----------------------------------------------------------------------------- helpers


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _ratio(a: float, b: float) -> str:
    return f"x{a / b:.2f}" if b and a == a and b == b else "-"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds == seconds else "-"


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
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-workflows-", dir=directory))
        self.tag = f"rbench_wf_{os.getpid()}_{secrets.token_hex(2)}"
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


# ----------------------------------------------------------------------------- the tasks


def build_app(url: str) -> App:
    """The bench's task types on ``url``."""
    app = ratchet.App(url)

    @app.task(name="bench.plain")
    def plain(ctx: TaskContext) -> float:
        return time.time()  # the body's first line: the claim latency's end

    @app.task(name="bench.sleeper")
    def sleeper(ctx: TaskContext, far_s: float = FAR_S) -> None:
        ctx.sleep("far", far_s)

    @app.task(name="bench.waiter")
    def waiter(ctx: TaskContext, key: str) -> Any:
        return ctx.wait_for_event("go", key=key)

    @app.task(name="bench.nap")
    def nap(ctx: TaskContext, seconds: float) -> dict[str, float]:
        deadline = ctx.step("deadline", lambda: time.time() + seconds)
        ctx.sleep_until("nap", deadline)
        return {"deadline": deadline, "woke": time.time()}

    @app.task(name="bench.parent")
    def parent(ctx: TaskContext, n: int, ids: bool = False) -> dict[str, Any]:
        began = time.time()
        first = ctx.step("first", time.time)
        handles = ctx.submit_many("bench.child", [{"i": i} for i in range(n)])
        fanned = ctx.step("fanned", time.time)
        results = ctx.gather(handles)
        resumed = ctx.step("resumed", time.time)
        out: dict[str, Any] = {"first": first, "fanned": fanned, "began": began,
                               "resumed": resumed, "sum": sum(results)}
        if ids:
            out["children"] = [h.task_id for h in handles]
        return out

    @app.task(name="bench.child")
    def child(ctx: TaskContext, i: int) -> int:
        return i

    return app


# ----------------------------------------------------------------------------- ledger reads


def vacuum(url: str) -> float:
    """``VACUUM`` the ``tasks`` table of the PostgreSQL ledger ``url`` (what autovacuum
    would do; the test server runs without it); seconds taken."""
    import psycopg
    from psycopg import sql

    schema = dict(parse_qsl(urlsplit(url).query))["schema"]
    t0 = time.monotonic()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(sql.SQL("VACUUM {}.tasks").format(sql.Identifier(schema)))
    return time.monotonic() - t0


def state_counts(app: App) -> dict[str, int]:
    """Tasks by state, all types (the ledger's own counts: ``Ledger.stats``)."""
    totals: dict[str, int] = {}
    for by_state in app.ledger.stats().counts.values():
        for state, count in by_state.items():
            key = state.value if isinstance(state, State) else str(state)
            totals[key] = totals.get(key, 0) + count
    return totals


def wait_until(what: str, predicate: Callable[[], bool], timeout_s: float,
               every_s: float = 0.1) -> float:
    """Poll ``predicate`` until true; seconds taken. Raises TimeoutError."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not after {timeout_s:g} s")
        time.sleep(every_s)
    return time.monotonic() - t0


def get_all(app: App, ids: Sequence[str]) -> list[Any]:
    out: list[Any] = []
    for lo in range(0, len(ids), 500):
        out.extend(app.ledger.get_many(list(ids[lo:lo + 500])))
    return out


def submit_batches(app: App, requests: Sequence[SubmitRequest], batch: int = 1000) -> list[str]:
    ids: list[str] = []
    for lo in range(0, len(requests), batch):
        ids.extend(h.task_id for h in app.submit_many(requests[lo:lo + batch]))
    return ids


# ----------------------------------------------------------------------------- worker process


def child_worker(url: str, concurrency: int, poll_interval_s: float, names: str) -> int:
    """A worker process: runs until SIGTERM. Prints READY when about to claim."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    app = build_app(url)
    worker = Worker(app, concurrency=concurrency, poll_interval_s=poll_interval_s,
                    names=names.split(",") if names else None)
    worker.install_signal_handlers()
    print("READY", flush=True)
    worker.run()
    app.close()
    return 0


class WorkerProcess:
    """``bench/workflows.py --child-worker`` in a subprocess; RSS and CPU from /proc."""

    def __init__(self, url: str, concurrency: int, poll_interval_s: float, log_dir: Path,
                 names: Sequence[str] = ()) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        self.log = log_dir / f"worker-{secrets.token_hex(3)}.log"
        self._stderr = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child-worker", url, "--concurrency",
             str(concurrency), "--poll-interval", str(poll_interval_s),
             "--names", ",".join(names)],
            stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.stop()
            raise RuntimeError(f"worker did not start: {line!r}\n{self.tail()}")
        self.ticks = os.sysconf("SC_CLK_TCK")

    def _status(self, field: str) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0  # kB -> MiB
        return float("nan")

    def rss_mib(self) -> float:
        return self._status("VmRSS")

    def hwm_mib(self) -> float:
        return self._status("VmHWM")

    def cpu_s(self) -> float:
        """User + system CPU seconds of the worker process so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.ticks

    def idle_cpu(self, seconds: float) -> float:
        """Share of one core the worker used over ``seconds`` of (presumed) idleness."""
        c0, t0 = self.cpu_s(), time.monotonic()
        time.sleep(seconds)
        return (self.cpu_s() - c0) / (time.monotonic() - t0)

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()


# ----------------------------------------------------------------------------- 1. waiting


def claim_latency(app: App, count: int, spacing_s: float, poll_interval_s: float,
                  warmup: int = 5) -> list[float]:
    """Seconds from a committed ``submit`` to the plain task body's first line, one task at
    a time on an otherwise idle worker. The idle time between two tasks is ``spacing_s``
    plus a random part of up to one poll interval, so the submits do not lock onto the
    phase of a polling worker's claims."""
    rng = random.Random(7)
    samples: list[float] = []
    for i in range(count + warmup):
        handle = app.submit("bench.plain")
        submitted = time.time()
        deadline = time.monotonic() + 30.0
        info = app.get(handle.task_id)
        while not info.terminal:
            if time.monotonic() > deadline:
                raise TimeoutError(f"plain task {handle.task_id} not done after 30 s")
            time.sleep(0.002)
            info = app.get(handle.task_id)
        if i >= warmup:
            samples.append(float(info.result) - submitted)
        time.sleep(spacing_s + rng.uniform(0.0, poll_interval_s))
    return samples


def run_waiting(ledgers: Ledgers, ledger: str, args: argparse.Namespace) -> dict[str, Any]:
    url = ledgers.new(ledger, "waiting")
    app = build_app(url)
    app.ledger.migrate()
    out: dict[str, Any] = {"waiting": args.waiting, "poll_interval": args.poll_interval}

    def measure(worker: WorkerProcess, label: str) -> None:
        out[f"{label}_idle_cpu"] = worker.idle_cpu(args.idle_s)
        out[f"{label}_rss_idle"] = worker.rss_mib()
        lat = claim_latency(app, args.latency_count, args.latency_spacing, args.poll_interval)
        out[f"{label}_latency"] = lat
        out[f"{label}_rss"] = worker.rss_mib()
        out[f"{label}_hwm"] = worker.hwm_mib()

    worker = WorkerProcess(url, args.concurrency, args.poll_interval, ledgers.dir)
    try:
        time.sleep(0.5)
        out["ready_rss"] = worker.rss_mib()
        measure(worker, "empty")
        half = args.waiting // 2
        requests = [SubmitRequest("bench.sleeper") for _ in range(half)]
        requests += [SubmitRequest("bench.waiter", {"key": f"order-{i}"})
                     for i in range(args.waiting - half)]
        requests = [r for pair in zip(requests[:half], requests[half:], strict=False)
                    for r in pair] + requests[2 * half:]
        t0 = time.monotonic()
        submit_batches(app, requests)
        out["submit_s"] = time.monotonic() - t0
        peak = [0.0]

        def parked() -> bool:
            peak[0] = max(peak[0], worker.rss_mib())
            if not worker.alive():
                raise RuntimeError(f"worker exited:\n{worker.tail()}")
            return state_counts(app).get("WAITING", 0) >= args.waiting

        wait_until(f"{args.waiting} tasks WAITING", parked, 600 + args.waiting / 50, 0.25)
        out["park_s"] = time.monotonic() - t0
        out["parking_rss_peak"] = peak[0]
        out["parked_rss"] = worker.rss_mib()
        measure(worker, "loaded")
        out["counts"] = state_counts(app)
        if url.startswith("postgresql"):
            out["vacuum_s"] = vacuum(url)
            measure(worker, "vacuumed")
    finally:
        worker.stop()
    worker = WorkerProcess(url, args.concurrency, args.poll_interval, ledgers.dir)
    try:
        time.sleep(0.5)
        out["restart_ready_rss"] = worker.rss_mib()
        measure(worker, "restart")
    finally:
        worker.stop()
        app.close()
        ledgers.drop(url)
    return out


def report_waiting(r: dict[str, Any]) -> None:
    n = r["waiting"]
    print(f"  {n:,} tasks parked (half ctx.sleep 30 days, half ctx.wait_for_event) in "
          f"{r['park_s']:.1f} s ({n / r['park_s']:,.0f} tasks/s; submit_many alone "
          f"{r['submit_s']:.1f} s); worker RSS while parking peaked at "
          f"{r['parking_rss_peak']:.1f} MiB")
    rows = []
    labels = [("empty", "empty ledger"), ("loaded", f"{n:,} WAITING, same worker")]
    if "vacuumed_latency" in r:
        labels.append(("vacuumed", f"  then VACUUM tasks ({r['vacuum_s']:.1f} s)"))
    labels.append(("restart", f"{n:,} WAITING, new worker"))
    for label, what in labels:
        lat = r[f"{label}_latency"]
        slow = sum(1 for x in lat if x > r["poll_interval"])
        rows.append([what, _ms(_pct(lat, 0.5)), _ms(_pct(lat, 0.99)), _ms(max(lat)),
                     f"{slow}/{len(lat)}",
                     f"{r[f'{label}_rss_idle']:.1f}", f"{r[f'{label}_rss']:.1f}",
                     f"{r[f'{label}_hwm']:.1f}", f"{100 * r[f'{label}_idle_cpu']:.1f} %"])
    e, lo = r["empty_latency"], r["loaded_latency"]
    rows.append(["ratio loaded / empty", _ratio(_pct(lo, 0.5), _pct(e, 0.5)),
                 _ratio(_pct(lo, 0.99), _pct(e, 0.99)), _ratio(max(lo), max(e)), "",
                 _ratio(r["loaded_rss_idle"], r["empty_rss_idle"]),
                 _ratio(r["loaded_rss"], r["empty_rss"]), "",
                 _ratio(r["loaded_idle_cpu"], r["empty_idle_cpu"])])
    if "vacuumed_latency" in r:
        v = r["vacuumed_latency"]
        rows.append(["ratio after VACUUM / empty", _ratio(_pct(v, 0.5), _pct(e, 0.5)),
                     _ratio(_pct(v, 0.99), _pct(e, 0.99)), _ratio(max(v), max(e)), "", "", "",
                     "", ""])
    print(_table(["claim latency (submit -> body)", "p50", "p99", "max", "> poll", "RSS idle MiB",
                  "RSS after MiB", "VmHWM MiB", "idle CPU"], rows))


# ----------------------------------------------------------------------------- 2. wake


def run_wake(ledgers: Ledgers, ledger: str, args: argparse.Namespace) -> dict[str, Any]:
    url = ledgers.new(ledger, "wake")
    app = build_app(url)
    app.ledger.migrate()
    worker = WorkerProcess(url, args.concurrency, args.poll_interval, ledgers.dir)
    out: dict[str, Any] = {"sleepers": args.sleepers, "sleep_s": args.sleep_s,
                           "spread_s": args.sleep_spread}
    try:
        time.sleep(0.5)
        # Batches of 20 at random moments over --sleep-spread seconds: the deadlines fall on
        # every phase of a polling worker's claims, not on one.
        rng = random.Random(11)
        batches = max(1, args.sleepers // 20)
        offsets = sorted(rng.uniform(0.0, args.sleep_spread) for _ in range(batches))
        ids: list[str] = []
        t0 = time.monotonic()
        for b, offset in enumerate(offsets):
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            lo, hi = b * args.sleepers // batches, (b + 1) * args.sleepers // batches
            ids += submit_batches(app, [SubmitRequest("bench.nap", {"seconds": args.sleep_s})
                                        for _ in range(hi - lo)])
        most = [0]

        def done() -> bool:
            counts = state_counts(app)
            most[0] = max(most[0], counts.get("WAITING", 0))
            if not worker.alive():
                raise RuntimeError(f"worker exited:\n{worker.tail()}")
            return counts.get("SUCCEEDED", 0) + counts.get("FAILED", 0) >= args.sleepers

        wait_until("the sleepers to finish", done, 120 + args.sleep_s + args.sleepers / 20,
                   0.05)
        infos = get_all(app, ids)
    finally:
        worker.stop()
        app.close()
        ledgers.drop(url)
    failed = [i for i in infos if i.state is not State.SUCCEEDED]
    late = [i.result["woke"] - i.result["deadline"] for i in infos
            if i.state is State.SUCCEEDED]
    deadlines = [i.result["deadline"] for i in infos if i.state is State.SUCCEEDED]
    woke = [i.result["woke"] for i in infos if i.state is State.SUCCEEDED]
    out.update(lateness=late, failed=len(failed), parked_at_once=most[0],
               deadline_span=max(deadlines) - min(deadlines) if deadlines else float("nan"),
               woke_span=max(woke) - min(woke) if woke else float("nan"))
    return out


def report_wake(r: dict[str, Any], goal: float, goal_text: str) -> None:
    late = r["lateness"]
    p99 = _pct(late, 0.99)
    print(f"  {r['sleepers']:,} tasks sleeping {r['sleep_s']:g} s: deadlines spread over "
          f"{r['deadline_span']:.3f} s, resumed over {r['woke_span']:.3f} s; parked at once: "
          f"{r['parked_at_once']:,}; failed: {r['failed']}")
    nan = float("nan")
    print(_table(["wake-up lateness (body after sleep - deadline)", "min", "p50", "p99",
                  "max", "goal p99", "met"],
                 [["", _ms(min(late) if late else nan), _ms(_pct(late, 0.5)), _ms(p99),
                   _ms(max(late) if late else nan),
                   f"<= {goal_text}", "yes" if p99 <= goal else "NO"]]))


# ----------------------------------------------------------------------------- 3. fan-in


def run_fanin(ledgers: Ledgers, ledger: str, args: argparse.Namespace) -> dict[str, Any]:
    url = ledgers.new(ledger, "fanin")
    app = build_app(url)
    app.ledger.migrate()
    worker = WorkerProcess(url, args.concurrency, args.poll_interval, ledgers.dir)
    try:
        time.sleep(0.5)
        handle = app.submit("bench.parent", {"n": args.children, "ids": True})
        info = app.wait(handle.task_id, timeout_s=300 + args.children / 20)
        if info.state is not State.SUCCEEDED:
            raise RuntimeError(f"parent ended {info.state}: {info.last_error}\n{worker.tail()}")
        result = info.result
        children = get_all(app, result["children"])
    finally:
        worker.stop()
        app.close()
        ledgers.drop(url)
    finished = [c.updated_at for c in children]
    last = max(finished)
    return {
        "children": len(children), "not_succeeded": sum(
            1 for c in children if c.state is not State.SUCCEEDED),
        "fan_out_s": result["fanned"] - result["first"],
        "drain_s": last - result["fanned"], "first_child_done_s": min(finished) - result["fanned"],
        "fan_in_s": result["resumed"] - last, "resume_body_s": result["resumed"] - result["began"],
        "wake_s": result["began"] - last,
    }


def report_fanin(r: dict[str, Any]) -> None:
    n = r["children"]
    print(_table(
        [f"fan-out / fan-in of {n:,} children", "seconds", "note"],
        [["submit_many (parent's step before -> after)", f"{r['fan_out_s']:.3f}",
          f"{n / r['fan_out_s']:,.0f} children/s" if r["fan_out_s"] > 0 else ""],
         ["children drained (after -> last child's finish)", f"{r['drain_s']:.3f}",
          f"{n / r['drain_s']:,.0f} children/s" if r["drain_s"] > 0 else ""],
         ["fan-in: last child's finish -> step after gather", f"{r['fan_in_s']:.3f}",
          "goal <= 1 s: " + ("met" if r["fan_in_s"] <= 1.0 else "NOT met")],
         ["  of which: last finish -> resumed body starts", f"{r['wake_s']:.3f}", ""],
         ["  of which: resumed body -> step after gather", f"{r['resume_body_s']:.3f}",
          "replayed submit_many + gather's reads"]]))
    if r["not_succeeded"]:
        print(f"  WARNING: {r['not_succeeded']} children did not succeed")


# ----------------------------------------------------------------------------- 4. cost


class CommitTimer:
    """Wraps one ledger object's ``commit`` and ``commit_and_claim`` (instance attributes)
    to sum their wall time and count the task writes they carried."""

    def __init__(self, ledger: Any) -> None:
        self.seconds = 0.0
        self.writes = 0
        self.transactions = 0
        self.lock = threading.Lock()
        for name in ("commit", "commit_and_claim"):
            setattr(ledger, name, self._wrap(getattr(ledger, name)))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(writes: Sequence[Any], *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(writes, *a, **kw)
            finally:
                with self.lock:
                    self.seconds += time.perf_counter() - t0
                    self.writes += len(writes)
                    self.transactions += 1

        return timed


class CostLedger:
    """One ledger of the cost scenario: ``children / siblings`` parents of ``siblings``
    children each, all parents waiting in ``gather``."""

    def __init__(self, ledgers: Ledgers, ledger: str, args: argparse.Namespace,
                 siblings: int) -> None:
        self.ledgers = ledgers
        self.args = args
        self.parents = max(1, args.children // siblings)
        self.url = ledgers.new(ledger, f"cost{siblings}")
        self.app = build_app(self.url)
        self.holder = f"bench-cost-{os.getpid()}"
        self.out: dict[str, Any] = {"siblings": siblings, "parents": self.parents,
                                    "single": []}

    def prepare(self) -> None:
        """Submit the parents and run them (in this process) until all wait."""
        app = self.app
        app.ledger.migrate()
        submit_batches(app, [SubmitRequest("bench.parent", {"n": self.out["siblings"]})
                             for _ in range(self.parents)])
        t0 = time.monotonic()
        Worker(app, concurrency=self.args.concurrency, poll_interval_s=0.02,
               names=["bench.parent"]).run(max_tasks=self.parents)
        wait_until("the parents to wait on their children",
                   lambda: state_counts(app).get("WAITING", 0) >= self.parents, 60)
        self.out["fan_out_s"] = time.monotonic() - t0
        self.out["children"] = state_counts(app).get("PENDING", 0)

    def sample(self, count: int) -> None:
        """Claim ``count`` children one at a time and commit each completion alone; the
        commit is timed."""
        ledger_obj = self.app.ledger
        done = Transition(to=State.SUCCEEDED, result_json="0")
        for _ in range(count):
            claims = ledger_obj.claim(self.holder, ["bench.child"], 1)
            if not claims:
                return
            c = claims[0]
            t = time.perf_counter()
            ledger_obj.commit([TaskWrite(c.task_id, c.generation, self.holder, "complete",
                                         transition=done)])
            self.out["single"].append(time.perf_counter() - t)

    def drain(self) -> None:
        """The remaining children, by an in-process worker claiming ``bench.child`` only."""
        out = self.out
        rest = out["children"] - len(out["single"])
        timer = CommitTimer(self.app.ledger)
        marks: list[float] = []

        class Timed(Worker):
            def on_claimed(self, claim: Any) -> None:
                if not marks:
                    marks.append(time.perf_counter())

            def on_finished(self, claim: Any, outcome: str) -> None:
                if len(marks) < 2:
                    marks.append(0.0)
                marks[1] = time.perf_counter()

        Timed(self.app, concurrency=self.args.concurrency, poll_interval_s=0.02,
              names=["bench.child"]).run(max_tasks=rest)
        out["drained"] = rest
        out["drain_rate"] = rest / (marks[1] - marks[0]) if len(marks) == 2 else float("nan")
        out["commit_s_per_child"] = timer.seconds / max(1, timer.writes)
        out["writes_per_tx"] = timer.writes / max(1, timer.transactions)
        out["woken"] = state_counts(self.app).get("PENDING", 0)  # parents woken, not run

    def close(self) -> None:
        self.app.close()
        self.ledgers.drop(self.url)


def run_cost(ledgers: Ledgers, ledger: str,
             args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Few siblings vs many: both ledgers prepared first, then their single commits
    sampled in alternating blocks of 10 (so drift in the machine's load hits both alike),
    then each drained."""
    few = CostLedger(ledgers, ledger, args, args.siblings_small)
    many = CostLedger(ledgers, ledger, args, args.children)
    try:
        few.prepare()
        many.prepare()
        samples = min(args.commit_samples, few.out["children"], many.out["children"])
        for lo in range(0, samples, 10):
            for side in (few, many) if (lo // 10) % 2 == 0 else (many, few):
                side.sample(min(10, samples - lo))
        few.drain()
        many.drain()
    finally:
        few.close()
        many.close()
    return few.out, many.out


def report_cost(few: dict[str, Any], many: dict[str, Any]) -> None:
    rows = []
    for r in (few, many):
        s = r["single"]
        rows.append([f"{r['siblings']:,} siblings ({r['parents']:,} parent(s))",
                     _ms(_pct(s, 0.5)), _ms(_pct(s, 0.99)), _ms(statistics.fmean(s)),
                     f"{r['drain_rate']:,.0f}", f"{r['commit_s_per_child'] * 1e6:,.0f} µs",
                     f"{r['writes_per_tx']:.1f}"])
    a, b = few["single"], many["single"]
    rows.append(["ratio many / few", _ratio(_pct(b, 0.5), _pct(a, 0.5)),
                 _ratio(_pct(b, 0.99), _pct(a, 0.99)),
                 _ratio(statistics.fmean(b), statistics.fmean(a)),
                 _ratio(many["drain_rate"], few["drain_rate"]),
                 _ratio(many["commit_s_per_child"], few["commit_s_per_child"]), ""])
    print(_table(["one child's completion", "commit p50", "commit p99", "mean",
                  "drain children/s", "writer time/child", "writes/tx"], rows))
    print(f"  ({len(a)} / {len(b)} completions committed alone, then the rest drained by an "
          f"in-process worker; parents woken meanwhile: {few['woken']:,} / {many['woken']:,})")


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ledger", default="sqlite",
                   help="sqlite, postgresql (the test server) or a postgresql:// URL; "
                        "several, comma-separated (default sqlite)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="small sizes, about a minute per ledger (the default)")
    size.add_argument("--full", action="store_true",
                      help="100,000 waiting, 1,000 sleepers, 10,000 children")
    p.add_argument("--scenarios", default="waiting,wake,fanin,cost",
                   help="which to run (default all: waiting,wake,fanin,cost)")
    p.add_argument("--waiting", type=int, help="tasks parked in WAITING (10,000; full 100,000)")
    p.add_argument("--sleepers", type=int, help="tasks sleeping --sleep-s (1,000)")
    p.add_argument("--sleep-s", type=float, default=2.0, help="their sleep (2 s)")
    p.add_argument("--sleep-spread", type=float, default=2.0,
                   help="sleepers submitted in batches of 20 at random moments over (2 s)")
    p.add_argument("--children", type=int, help="children of one parent (2,000; full 10,000)")
    p.add_argument("--siblings-small", type=int, default=10,
                   help="siblings per parent in the cost scenario's small case (10)")
    p.add_argument("--commit-samples", type=int,
                   help="child completions committed and timed one by one (100; full 200)")
    p.add_argument("--latency-count", type=int, help="plain tasks per latency run (100; full 200)")
    p.add_argument("--latency-spacing", type=float, default=0.02,
                   help="idle time between them, s (0.02)")
    p.add_argument("--idle-s", type=float, default=2.0, help="idle CPU measured over (2 s)")
    p.add_argument("--concurrency", type=int, default=32, help="worker threads (32)")
    p.add_argument("--poll-interval", type=float, default=0.1,
                   help="worker poll interval, s (0.1, the Worker default)")
    p.add_argument("--dir", default=None, help="where SQLite ledger files go (temp dir)")
    p.add_argument("--json", default=None, help="also write every figure to this file")
    p.add_argument("--child-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--names", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_worker:
        return child_worker(args.child_worker, args.concurrency, args.poll_interval, args.names)
    sizes = FULL if args.full else QUICK
    for key, value in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - {"waiting", "wake", "fanin", "cost"}
    if unknown:
        p.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    logging.basicConfig(level=logging.WARNING)
    print(f"Ratchet workflows bench: {_git_revision()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}; worker concurrency {args.concurrency}, poll interval "
          f"{args.poll_interval:g} s", flush=True)
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
            if "waiting" in scenarios:
                print(f"\n[{label}] 1. claim latency and worker memory, empty vs "
                      f"{args.waiting:,} WAITING", flush=True)
                mine["waiting"] = run_waiting(ledgers, ledger, args)
                report_waiting(mine["waiting"])
            if "wake" in scenarios:
                print(f"\n[{label}] 2. wake-up lateness", flush=True)
                mine["wake"] = run_wake(ledgers, ledger, args)
                if kind == "sqlite":
                    report_wake(mine["wake"], args.poll_interval,
                                f"poll interval {args.poll_interval * 1e3:g} ms")
                else:
                    report_wake(mine["wake"], 1.0, "1 s")
            if "fanin" in scenarios:
                print(f"\n[{label}] 3. fan-out and fan-in", flush=True)
                mine["fanin"] = run_fanin(ledgers, ledger, args)
                report_fanin(mine["fanin"])
            if "cost" in scenarios:
                print(f"\n[{label}] 4. a child's completion: {args.siblings_small} vs "
                      f"{args.children:,} siblings, {args.children:,} children in both",
                      flush=True)
                few, many = run_cost(ledgers, ledger, args)
                mine["cost"] = {"few": few, "many": many}
                report_cost(few, many)
    finally:
        ledgers.close()
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
