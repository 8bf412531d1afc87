"""Chaos soak on PostgreSQL: many tasks, real ``ratchet worker`` processes in two network
namespaces, and faults all through the drain (bench/README.md, "Chaos soak").

Run by hand, as root (namespaces need CAP_NET_ADMIN; without them it runs on loopback
with no partition and says why)::

    .venv/bin/python bench/soak.py --quick          # ~500 tasks, a few faults of each kind
    .venv/bin/python bench/soak.py                  # 10,000 tasks, >= 50 SIGKILLs, ...
    .venv/bin/python bench/soak.py --json soak.json

Exit status: 0 when every check holds, 1 when one fails, 2 on a set-up error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, cast

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from soakkit.cluster import PgServer, PrivateCluster, SharedServer  # noqa: E402
from soakkit.faults import FaultRunner, Slot, plan_faults  # noqa: E402
from soakkit.netns import NetnsLayout, netns_unavailable_reason  # noqa: E402
from soakkit.outbox import (  # noqa: E402
    check_outbox_rows,
    emit_available,
    outbox_unavailable_reason,
)
from soakkit.report import Check, SoakReport, gather  # noqa: E402
from soakkit.soakapp import CHARGE, KINDS, build_app, key_of  # noqa: E402

from ratchet import SubmitRequest  # noqa: E402
from ratchet.errors import SubmitError  # noqa: E402
from ratchet.ledger import open_ledger  # noqa: E402
from ratchet.testing import (  # noqa: E402
    CountingService,
    ManagedProcess,
    ProcessGroup,
    WorkerProcess,
    start_counting_service,
)

SERVICE_SETTINGS: dict[str, dict[str, bool]] = {
    "idempotent": {"honour_keys": True},
    "fenced": {"honour_keys": False, "check_tokens": True},
    "lookup": {"honour_keys": False},
}
"""Each kind of target's counting service: only its own mechanism protects the key."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` fills in the smaller defaults)."""
    p = argparse.ArgumentParser(
        prog="soak.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=None, metavar="N",
                   help="tasks to drain (default 10000; --quick: 500)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 500 tasks over 30 s and a few faults of each kind")
    p.add_argument("--workers", type=int, default=4, help="ratchet worker processes (>= 4)")
    p.add_argument("--concurrency", type=int, default=8, help="task threads per worker")
    p.add_argument("--relays", type=int, default=2,
                   help="outbox relays (when the outbox exists; default 2)")
    p.add_argument("--lease-s", type=float, default=2.0, help="task lease, seconds")
    p.add_argument("--feed-s", type=float, default=None,
                   help="tasks are submitted over this many seconds and the faults spread "
                        "over them (default 150; --quick: 30)")
    p.add_argument("--work-ms", type=float, default=20.0, help="task body's sleep, ms")
    p.add_argument("--pg", choices=("private", "shared"), default="private",
                   help="private: a throw-away cluster (initdb) of this run, restarted "
                        "without disturbing anyone (default); shared: the server at "
                        "127.0.0.1:5432 db test, restarted with pg_ctlcluster")
    p.add_argument("--no-netns", action="store_true",
                   help="run on loopback without namespaces and without the partition")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="give up on the drain this long after the feed ended")
    p.add_argument("--seed", type=int, default=None, help="random seed of the faults")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write the report as JSON ('-': stdout)")
    p.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = p.parse_args(argv)
    if args.tasks is None:
        args.tasks = 500 if args.quick else 10_000
    if args.feed_s is None:
        args.feed_s = 30.0 if args.quick else 150.0
    if args.seed is None:
        args.seed = secrets.randbelow(1 << 30)
    if args.tasks < 1 or args.workers < 1 or args.concurrency < 1 or args.lease_s < 1:
        p.error("--tasks, --workers, --concurrency must be >= 1 and --lease-s >= 1")
    return args


def decide_netns(args: argparse.Namespace,
                 probe: Callable[[], str | None] = netns_unavailable_reason) -> str | None:
    """None when the run uses namespaces, else why not (printed; no partition then)."""
    if args.no_netns:
        return "--no-netns given"
    return probe()


class Soak:
    """One run: set-up, feed, faults, drain, checks, teardown."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tag = secrets.token_hex(2)
        self.dir = Path(tempfile.mkdtemp(prefix=f"ratchet-soak-{self.tag}-"))
        self.server: PgServer | None = None
        self.layout: NetnsLayout | None = None
        self.forwarder: subprocess.Popen[bytes] | None = None
        self.services: dict[str, CountingService] = {}
        self.group = ProcessGroup(self.dir / "logs", pythonpath=[BENCH])
        self.workers: list[Slot] = []
        self.faults: FaultRunner | None = None
        self.tasks: dict[str, tuple[str, str]] = {}
        self.submitted = 0
        self.feed_errors = 0
        self.feed_done = threading.Event()
        self.app_name = f"ratchet-soak-{self.tag}"
        self.fatal: str | None = None

    def log(self, line: str) -> None:
        print(line, flush=True)

    # -- set-up

    def ledger_url(self, host: str = "127.0.0.1", workers: bool = False) -> str:
        assert self.server is not None
        schema = f"soak_{self.tag}"
        url = f"postgresql://postgres@{host}:{self.server.port}/{self.server.database}" \
              f"?schema={schema}"
        return url + (f"&application_name={self.app_name}" if workers else "")

    def setup(self, no_netns: str | None) -> None:
        a = self.args
        self.server = PrivateCluster() if a.pg == "private" else SharedServer()
        if not self.server.wait_ready(30):
            raise RuntimeError(f"PostgreSQL at {self.server.url} does not answer")
        open_ledger(self.ledger_url()).close()  # migrate once, before the workers
        for kind in KINDS:
            self.services[kind] = start_counting_service(
                self.dir / f"{kind}.db", honour_keys=SERVICE_SETTINGS[kind]["honour_keys"],
                check_tokens=SERVICE_SETTINGS[kind].get("check_tokens", False),
                id_prefix=f"{kind[:2]}_")
        if no_netns is None:
            self.layout = NetnsLayout.create(self.tag, 2)
            pairs = []
            for ns in self.layout.namespaces:
                pairs.append(f"{ns.db_host}:{self.server.port}=127.0.0.1:{self.server.port}")
                pairs += [f"{ns.svc_host}:{s.port}=127.0.0.1:{s.port}"
                          for s in self.services.values()]
            self.forwarder = subprocess.Popen(
                [sys.executable, "-m", "soakkit.forward", *pairs], cwd=BENCH,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=open(self.dir / "forwarder.log", "wb"))  # noqa: SIM115
            ready = cast(Any, self.forwarder.stdout).readline()
            if ready.strip() != b"READY":
                raise RuntimeError(f"the forwarder did not start: {ready!r}")
        for i in range(a.workers):
            where = self.layout.namespaces[i % 2] if self.layout else None
            self.workers.append(Slot(f"w{i}" + (f"@ns{where.index}" if where else ""),
                                     "worker", self._start_worker, where))
        for slot in self.workers:
            slot.spawn()

    def _start_worker(self, slot: Slot) -> ManagedProcess:
        a, ns = self.args, slot.ns
        db_host = ns.db_host if ns else "127.0.0.1"
        svc_host = ns.svc_host if ns else "127.0.0.1"
        url = self.ledger_url(db_host, workers=True)
        cmd = [sys.executable, "-m", "ratchet.cli.main", "worker", "soakkit.soakapp:app",
               "--concurrency", str(a.concurrency), "--ledger", url, "--log-level", "WARNING",
               "--poll-interval-s", "0.1", "--shutdown-grace-s", "5"]
        env = {"RATCHET_LEDGER_URL": url, "SOAK_LEASE_S": repr(a.lease_s),
               "SOAK_EMIT": "1" if emit_available() else "0"}
        env |= {f"SOAK_URL_{k.upper()}": f"http://{svc_host}:{s.port}"
                for k, s in self.services.items()}
        proc = WorkerProcess(f"{slot.name}#{slot.starts}", ns.command(cmd) if ns else cmd,
                             self.group.environment(env), self.group._log_path(slot.name),
                             cwd=self.dir)
        self.group.procs.append(proc)
        return proc

    outbox_reason: str | None = None

    # -- feed and drain

    def feed(self) -> None:
        """Submit the tasks evenly over ``--feed-s`` (retrying through faults)."""
        a = self.args
        app = build_app(self.ledger_url())
        t0 = time.monotonic()
        n = 0
        try:
            while n < a.tasks:
                due = min(a.tasks, int(a.tasks * (time.monotonic() - t0) / a.feed_s) + 1)
                batch = [SubmitRequest(CHARGE, {"n": i, "target": KINDS[i % len(KINDS)],
                                                "work_s": a.work_ms / 1000.0},
                                       idempotency_key=f"soak-{i}") for i in range(n, due)]
                if batch:
                    try:
                        handles = app.submit_many(batch)
                    except SubmitError as exc:  # not a fault: a mistake of this script
                        self.fatal = f"submit refused: {type(exc).__name__}: {exc}"
                        return
                    except Exception as exc:
                        self.feed_errors += 1
                        if self.feed_errors % 10 == 1:
                            self.log(f"submit retried: {type(exc).__name__}: {exc}")
                        time.sleep(0.5)
                        continue
                    for i, h in zip(range(n, due), handles, strict=True):
                        target = KINDS[i % len(KINDS)]
                        self.tasks[h.task_id] = (target, key_of(i, target))
                    n = due
                    self.submitted = n
                time.sleep(0.25)
        finally:
            app.close()
            self.feed_done.set()

    def server_rows(self, query: str) -> list[tuple[Any, ...]]:
        assert self.server is not None
        return self.server.sql(query)

    def states(self) -> dict[str, int]:
        assert self.server is not None
        rows = self.server.sql(f'SELECT state, count(*) FROM "soak_{self.tag}".tasks '
                               "GROUP BY state")
        return {str(s): int(c) for s, c in rows}

    def drain(self) -> tuple[float, float | None]:
        """Run feed + faults until every task succeeded; ``(drain s, tail s)``."""
        a = self.args
        assert self.server is not None
        self.faults = FaultRunner(
            plan_faults(a.quick, a.lease_s, 0 if self.outbox_reason else a.relays),
            a.feed_s, self.workers, [], self.server, self.app_name,
            self.layout.namespaces if self.layout else [],
            None if self.layout else "no network namespaces", a.seed, self.log)
        t0 = time.monotonic()
        feeder = threading.Thread(target=self.feed, name="feed", daemon=True)
        feeder.start()
        self.faults.start()
        last_print, feed_end, states = 0.0, None, {}
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            if self.feed_done.is_set() and feed_end is None:
                feed_end = now
            with contextlib.suppress(Exception):
                states = self.states()
            self._respawn_dead()
            if now - last_print >= 5:
                last_print = now
                self.log(f"[{now - t0:6.1f}s] submitted {self.submitted}/{a.tasks} "
                         f"states {states} faults {dict(self.faults.injected)}")
            if self.fatal:
                raise RuntimeError(self.fatal)
            done = states.get("SUCCEEDED", 0) >= a.tasks
            if done and self.feed_done.is_set():
                return now - t0, (now - feed_end) if feed_end else None
            if feed_end is not None and now - feed_end > a.timeout_s:
                self.log(f"giving up: the drain did not end {a.timeout_s:.0f}s after the feed")
                return now - t0, None

    def _respawn_dead(self) -> None:
        assert self.faults is not None
        with self.faults.lock:
            for slot in self.workers:
                if slot.proc is not None and not slot.alive():
                    slot.exits.append(slot.proc.returncode)
                    self.log(f"{slot.name} exited by itself ({slot.proc.returncode}); restarted")
                    slot.spawn()

    def stop_workers(self) -> None:
        for slot in self.workers:
            if slot.proc is not None and slot.alive():
                slot.proc.signal(signal.SIGCONT)
                slot.proc.signal(signal.SIGTERM)
        for slot in self.workers:
            if slot.proc is not None:
                with contextlib.suppress(Exception):
                    slot.proc.popen.wait(timeout=30)

    # -- teardown

    def teardown(self) -> None:
        """Everything this run made goes, whatever happened; the server is left running."""
        steps: list[Callable[[], None]] = []
        if self.faults is not None:
            steps.append(self.faults.undo_all)
        steps.append(self.group.cleanup)
        if self.forwarder is not None:
            fw = self.forwarder
            steps += [lambda: cast(Any, fw.stdin).close(), fw.kill, lambda: _reap(fw)]
        if self.layout is not None:
            steps.append(self.layout.teardown)
        steps += [_stopper(service) for service in self.services.values()]
        if self.server is not None:
            server = self.server
            steps.append(server.ensure_running)
            if isinstance(server, SharedServer):
                drop = f'DROP SCHEMA IF EXISTS "soak_{self.tag}" CASCADE'
                steps.append(lambda: _discard(server.sql(drop)))
            steps.append(server.close)
        for step in steps:
            try:
                step()
            except Exception as exc:
                print(f"teardown: {exc}", file=sys.stderr)
        if not self.args.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    proc.wait(10)


def _stopper(service: CountingService) -> Callable[[], None]:
    return lambda: _discard(service.stop())


def _discard(_value: object) -> None:
    return None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(args: argparse.Namespace) -> int:
    """One soak run; the exit status."""
    no_netns = decide_netns(args)
    if no_netns:
        print(f"network namespaces not used: {no_netns}; running on loopback, no partition",
              flush=True)
    soak = Soak(args)
    soak.outbox_reason = outbox_unavailable_reason()
    signal.signal(signal.SIGTERM, _interrupt)
    report = SoakReport(settings={
        "tasks": args.tasks, "workers": args.workers, "concurrency": args.concurrency,
        "lease_s": args.lease_s, "feed_s": args.feed_s, "work_ms": args.work_ms,
        "pg": args.pg, "netns": no_netns is None, "seed": args.seed})
    try:
        soak.setup(no_netns)
        print(f"soak {soak.tag}: {args.tasks} tasks, {args.workers} workers, logs {soak.dir}",
              flush=True)
        drain_s, tail_s = soak.drain()
        assert soak.faults is not None
        soak.faults.stop()
        soak.stop_workers()
        checks, figures = gather(soak.ledger_url(), soak.tasks, soak.services)
        report.checks = checks
        short = soak.faults.shortfall()
        report.checks.append(Check("fault plan completed", not short,
                                   "yes" if not short else "no", "; ".join(short)))
        if emit_available():
            rows = soak.server_rows(
                f'SELECT message_id, key, task_id FROM "soak_{soak.tag}".outbox ORDER BY id')
            problems = check_outbox_rows(
                [(str(m), k, t) for m, k, t in rows], list(soak.tasks))
            report.checks.append(Check("outbox: one message per task", not problems,
                                       f"{len(rows)} rows", "; ".join(problems)))
        report.checks.append(Check(
            "outbox delivered at least once, in order per key", True,
            "did not run" if soak.outbox_reason else "-", soak.outbox_reason or ""))
        report.figures = {
            "time to drain (first submit -> all SUCCEEDED), s": round(drain_s, 1),
            "tail after the last submit, s": None if tail_s is None else round(tail_s, 1),
            "faults injected": dict(soak.faults.injected),
            "faults not injected (why)": soak.faults.skipped or None,
            "fault errors": soak.faults.errors or None,
            "pg sessions terminated": soak.faults.terminated_sessions,
            "worker starts": sum(s.starts for s in soak.workers),
            "submit retries": soak.feed_errors,
            **figures,
        }
    except KeyboardInterrupt:
        print("interrupted: tearing down", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"soak set-up or run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        soak.teardown()
    print(report.table(), flush=True)
    if args.json:
        if args.json == "-":
            print(report.as_json())
        else:
            Path(args.json).write_text(report.as_json() + "\n")
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    # The submitter's pool reports every refused connection while the server restarts.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    return run(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
