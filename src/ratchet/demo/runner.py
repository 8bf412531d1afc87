"""``ratchet demo``: billing tasks against a faulty payment service while workers are killed.

:func:`run_demo` is the main job. In about half a minute it:

1. starts the fake payment service (:mod:`ratchet.demo.payments`) in its own process with
   faults on — dropped replies after charging, bursts of 503, slow replies that outlast
   the client's read timeout;
2. submits ``tasks`` ``billing.charge`` tasks with idempotency keys, in batches spread over
   the run, and resubmits a few keys to show that submit dedupe returns the same task id;
3. runs ``workers`` real worker processes
   (``python -m ratchet.cli.main worker ratchet.demo.billing:app --concurrency 8``);
4. kills a random worker with a real ``SIGKILL`` at random moments (at least ``kills``
   times) and restarts it; freezes one worker that holds tasks with ``SIGSTOP`` for twice
   its lease, so another worker takes its tasks over, then lets it resume (``SIGCONT``):
   its late writes must be refused as stale generations;
5. shows live progress, then a report read from the ledger *and* from the payment
   service's own SQLite file, which is the only proof that each charge executed once —
   including how fast the killed workers' tasks were claimed again (same-host peers
   revoke a dead holder's leases instead of waiting for them to expire).

The ledger is a fresh SQLite file in the work directory, or a PostgreSQL schema
(``--ledger postgresql://...``): the URL's ``schema=``, else :data:`DEMO_PG_SCHEMA`. That
one schema is dropped (``DROP SCHEMA ... CASCADE``) and created empty at the start of every
run, and only if it is absent or was made by an earlier demo (its comment says so); any
other existing schema is refused, and nothing else in the database is touched.

The run lasts as long as the workload needs: after the chaos, it drains while tasks keep
settling, and gives up only when nothing has moved for :attr:`DemoSettings.stall_s`
seconds (a stall), or at the optional hard cap :attr:`DemoSettings.deadline_s`.

Process control and the checks are :mod:`ratchet.testing`'s (the same ones users get for
their own suites): worker processes are :class:`~ratchet.testing.WorkerProcess`es, the
payment service is the counting service, and the verdict comes from
:func:`~ratchet.testing.check_exactly_once` and
:func:`~ratchet.testing.check_ledger_consistent`.

It exits 1 if an invariant is broken: a succeeded task whose key did not execute exactly
once (or whose recorded charge is not the service's), any key executed more than once, a
charge no task accounts for, a task left unfinished (stall), an inconsistent ledger, fewer
kills than asked, or a resubmission that was not deduplicated.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..app import SubmitRequest
from ..config import parse_ledger_url
from ..errors import ConfigError, LedgerUnavailable, RatchetError
from ..ledger.base import AuditEvent, Ledger
from ..states import State
from ..testing import (
    ConditionTimeout,
    ProcessGroup,
    WorkerProcess,
    check_exactly_once,
    check_ledger_consistent,
    sqlite_write_locked,
)
from . import billing
from .payments import (
    PaymentClient,
    PaymentService,
    PaymentServiceError,
    start_payment_service,
)

__all__ = [
    "DEMO_PG_SCHEMA",
    "DemoSettings",
    "demo_pg_url",
    "reset_pg_schema",
    "run_demo",
]

_MARKER = ".ratchet-demo"
DEMO_PG_SCHEMA = "ratchet_demo"
"""The demo's schema on a PostgreSQL ledger whose URL names none (dropped every run)."""
_PG_SCHEMA_COMMENT = "created by ratchet demo; dropped and recreated at the start of every run"
_TASK = "billing.charge"


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Knobs of one demo run (defaults sized for < 2 minutes on 2 cores).

    Kills and the pause are placed at random points of *progress* (fractions of tasks
    settled), not of wall time, so they land on busy workers on a fast or a slow machine.

    Attributes:
        concurrency: task threads per worker process.
        arrival_s: submissions are spread over this many seconds.
        batches: number of ``submit_many`` batches.
        chaos_from: first progress fraction at which a kill may happen.
        chaos_to: last progress fraction at which a kill may happen.
        min_kill_gap_s: least time between two kills, seconds.
        resubmits: keys resubmitted to show submit dedupe.
        stall_s: once every task is submitted, the run fails when no task has changed
            state (and no claim happened) for this many seconds: the deadline follows the
            workload, it is not fixed.
        deadline_s: optional hard cap on the run, seconds from the first submission
            (None: none; the stall window alone decides).
        reply_lost: payment-service probability of dropping a reply after charging.
        burst_503: payment-service probability of starting a burst of 503s.
        slow: payment-service probability of a slow charge.
        honour_keys: the payment service deduplicates on ``Idempotency-Key`` (set False
            to watch the invariants catch duplicates: ``billing.charge`` declares the
            target idempotent, and lookup-first alone cannot see a request still in flight).
        slow_s: how slow a slow charge is, seconds (above the client's 1 s read timeout).
        latency_s: mean processing time of every charge at the service, seconds (keeps
            the workers' threads busy, so kills hit tasks in flight).
        pause_factor: the SIGSTOP lasts this many leases.
        tick_s: main-loop period (progress refresh, event scheduling), seconds.
    """

    concurrency: int = 8
    arrival_s: float = 5.0
    batches: int = 10
    chaos_from: float = 0.05
    chaos_to: float = 0.85
    min_kill_gap_s: float = 0.7
    resubmits: int = 5
    stall_s: float = 30.0
    deadline_s: float | None = None
    reply_lost: float = 0.05
    burst_503: float = 0.02
    slow: float = 0.03
    slow_s: float = 1.5
    honour_keys: bool = True
    latency_s: float = 0.35
    pause_factor: float = 2.0
    tick_s: float = 0.2


# ---------------------------------------------------------------------------- workers


@dataclass
class _Slot:
    """One worker position: a process that is restarted after every kill."""

    index: int
    proc: WorkerProcess | None = None
    started_mono: float = 0.0
    starts: int = 0
    stopped: bool = False
    pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


def demo_pg_url(url: str) -> tuple[str, str, bool]:
    """The URL the demo runs on for a PostgreSQL ledger: ``(url, schema, defaulted)``.

    A URL that names a ``schema=`` is used as it is. Otherwise ``schema=ratchet_demo``
    (:data:`DEMO_PG_SCHEMA`) is added and ``defaulted`` is True, so the demo never runs in,
    and never drops, the ``ratchet`` schema that workers use by default.

    Raises:
        ConfigError: the URL is malformed.
    """
    config = parse_ledger_url(url)
    schema = config.options.get("schema")
    if schema is not None:
        return config.url, schema, False
    parts = urlsplit(config.url)
    query = [*parse_qsl(parts.query, keep_blank_values=True), ("schema", DEMO_PG_SCHEMA)]
    rebuilt = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))
    return rebuilt, DEMO_PG_SCHEMA, True


def reset_pg_schema(url: str, schema: str, lock_timeout_s: float = 5.0) -> bool:
    """Make ``schema`` exist and be empty: ``DROP SCHEMA ... CASCADE``, then ``CREATE SCHEMA``.

    Only that schema is touched, and only if it is absent or was created by an earlier
    demo run (its comment says so, see :data:`_PG_SCHEMA_COMMENT`); the new schema gets
    that comment. Any other existing schema — even an empty one, such as ``public`` — is
    refused, never dropped. Waits at most ``lock_timeout_s`` seconds for locks (a worker of
    an earlier run still holding a table), then gives up.

    Returns:
        True when there was a schema to drop.

    Raises:
        ConfigError: the schema exists and was not created by the demo, it is a system
            schema, or psycopg is missing.
        LedgerUnavailable: no connection, or the schema is in use.
    """
    try:
        import psycopg
        from psycopg import sql

        from ..ledger.postgres import libpq_url
    except ImportError as exc:
        raise ConfigError(
            f"the PostgreSQL demo needs psycopg 3 and psycopg_pool ({exc}); "
            "install them with: pip install 'ratchet[demo]'"
        ) from exc
    config = parse_ledger_url(url)
    ident = sql.Identifier(schema)
    where = f"schema {schema!r} of {_display_url(libpq_url(config))}"
    if schema in ("public", "information_schema") or schema.startswith("pg_"):
        raise ConfigError(
            f"the demo drops and recreates its schema on every run; it will not do that to "
            f"{where}: name a schema of its own with ?schema=<name> (default {DEMO_PG_SCHEMA})"
        )
    try:
        with psycopg.connect(libpq_url(config), autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                sql.SQL("SET lock_timeout = {}").format(
                    sql.Literal(f"{max(1, int(lock_timeout_s * 1000))}ms")
                )
            )
            row = conn.execute(
                "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s",
                (schema,),
            ).fetchone()
            if row is not None and row[0] != _PG_SCHEMA_COMMENT:
                raise ConfigError(
                    f"{where} exists and was not created by `ratchet demo`, which drops its "
                    "schema on every run; name a new one with ?schema=<name> in the URL "
                    f"(default {DEMO_PG_SCHEMA}), or drop this one yourself if it is a "
                    "leftover of an older demo"
                )
            with conn.transaction():
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
                conn.execute(
                    sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                        ident, sql.Literal(_PG_SCHEMA_COMMENT)
                    )
                )
    except psycopg.errors.LockNotAvailable as exc:
        raise LedgerUnavailable(
            f"could not drop {where} within {lock_timeout_s:.0f} s: it is in use (is a worker "
            f"of an earlier demo still running?): {_first_line(exc)}"
        ) from exc
    except psycopg.Error as exc:
        raise LedgerUnavailable(f"could not reset {where}: {_first_line(exc)}") from exc
    return row is not None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _display_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for printing)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{host}"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if netloc == parts.netloc and all(k != "password" for k, _ in pairs):
        return url
    query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _holder_pid(holder: str | None) -> int | None:
    """The pid inside a ``host:pid:random`` holder id (None if it has another shape)."""
    if not holder:
        return None
    parts = holder.split(":")
    if len(parts) < 3:
        return None
    try:
        return int(parts[-2])
    except ValueError:
        return None


@dataclass
class _Snapshot:
    """What the ledger says about this run's tasks at one instant."""

    states: Counter[State]
    inflight: dict[int, list[str]]
    takeovers: int = 0
    stale: int = 0
    lookup_hits: int = 0
    revocations: int = 0


@dataclass(frozen=True, slots=True)
class _Reclaims:
    """How fast the SIGKILLed workers' tasks came back (from the audit timelines).

    Times are seconds from the kill (ledger clock read right after the process died).

    Attributes:
        freed: per kill, until the first of its tasks was claimable again: its ``revoke``
            row, or (lease expiry) its ``takeover`` row.
        first_claim: per kill, until the first of its tasks was claimed again.
        claimed: per task of a killed worker, until it was claimed again (a revoked task
            goes back to the ready queue, so this includes waiting behind the backlog).
        revoked: tasks of killed workers whose leases were revoked (fast takeover).
        expired: tasks of killed workers taken over only after their lease expired.
    """

    freed: list[float]
    first_claim: list[float]
    claimed: list[float]
    revoked: int
    expired: int


# ---------------------------------------------------------------------------- the run


class _DemoRun:
    def __init__(
        self,
        console: Console,
        ledger_url: str,
        workdir: Path,
        tasks: int,
        workers: int,
        kills: int,
        seed: int,
        settings: DemoSettings,
        notes: list[str] | None = None,
    ) -> None:
        self.console = console
        self.ledger_url = ledger_url
        self.notes = list(notes or [])
        self.workdir = workdir
        self.n_tasks = tasks
        self.n_workers = workers
        self.kills_asked = kills
        self.seed = seed
        self.s = settings
        self.rng = random.Random(seed)
        self.app = billing.app
        self.lease_s = self.app.definition(_TASK).lease_s
        self.service: PaymentService | None = None
        self.slots = [_Slot(i) for i in range(workers)]
        # Fault points of a test running the demo must not leak into its workers.
        self.procs = ProcessGroup(
            workdir / "logs", cwd=workdir,
            drop_prefixes=("RATCHET_CRASH_AT", "RATCHET_PAUSE_AT", "RATCHET_CRASH_SKIP"),
        )  # fmt: skip
        self.events: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.run_tag = f"{seed:06d}-{os.getpid() % 10000:04d}"
        self.orders = [
            (f"ord-{self.run_tag}-{i:05d}", self.rng.randrange(500, 50_000)) for i in range(tasks)
        ]
        self.task_ids: list[str] = []
        self.submitted = 0
        self.resubmit_checks: list[tuple[str, str, bool]] = []  # (expected id, got id, created)
        self.kills_done = 0
        self.kill_inflight: list[int] = []
        self.kill_times: list[tuple[int, float]] = []  # (pid, ledger clock just after death)
        self.unexpected_exits = 0
        self.pause: dict[str, Any] = {}
        self.pause_attempts = 0
        self.stalled = False
        self.deadline_hit = False
        self.elapsed_s = 0.0

    # -- plumbing

    @property
    def ledger(self) -> Ledger:
        return self.app.ledger

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, message: str) -> None:
        self.events.append((self.now(), message))

    def start_worker(self, slot: _Slot) -> None:
        """Start (or restart) the worker of ``slot`` in a process group of its own."""
        assert self.service is not None
        slot.proc = self.procs.worker(
            "ratchet.demo.billing:app",
            self.ledger_url,
            name=f"worker-{slot.index}",
            concurrency=self.s.concurrency,
            poll_interval_s=None,
            new_session=True,
            env={
                "RATCHET_DEMO_PAYMENTS_URL": self.service.url,
                "RATCHET_DEMO_LEASE_S": repr(self.lease_s),
            },
        )
        slot.started_mono = time.monotonic()
        slot.starts += 1
        slot.stopped = False
        slot.pids.append(slot.proc.pid)

    def stop_workers(self) -> None:
        """SIGCONT + SIGTERM every live worker, wait up to 5 s, SIGKILL what is left.

        Only processes still running (not yet reaped) are signalled, so a recycled pid is
        never hit. Calling it again is a no-op.
        """
        live = [s.proc for s in self.slots if s.proc is not None and s.alive()]
        for proc in live:
            proc.resume()
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in live:
            with contextlib.suppress(ConditionTimeout):
                proc.wait(max(0.1, deadline - time.monotonic()))
        for slot in self.slots:
            slot.stopped = False
        self.procs.cleanup()

    # -- ledger reads

    def snapshot(self) -> _Snapshot:
        infos = self.ledger.get_many(self.task_ids) if self.task_ids else []
        states: Counter[State] = Counter(i.state for i in infos)
        inflight: dict[int, list[str]] = {}
        for info in infos:
            if info.state is State.RUNNING:
                pid = _holder_pid(info.holder)
                if pid is not None:
                    inflight.setdefault(pid, []).append(info.task_id)
        stats = self.ledger.stats()
        return _Snapshot(
            states,
            inflight,
            stats.takeovers,
            stats.stale_rejections,
            stats.lookup_hits,
            stats.revocations,
        )

    def sqlite_write_lock_held(self) -> bool:
        """True when another process holds the SQLite ledger's write lock for > 0.5 s.

        Only used right after SIGSTOP: a process frozen *inside* a write transaction holds
        SQLite's single write lock, so every other writer (claims, renewals) would wait for
        the whole pause. That is a property of the embedded backend, not the scenario this
        demo wants to show (a stale holder outliving its lease), so the pause is retried.
        """
        try:
            config = parse_ledger_url(self.ledger_url)
        except ConfigError:
            return False
        if config.scheme != "sqlite":
            return False
        return sqlite_write_locked(config.path, timeout_s=0.5)

    # -- chaos

    def kill_one(self, snap: _Snapshot) -> bool:
        """SIGKILL a random running (not paused) worker and restart it. False: none eligible."""
        eligible = [s for s in self.slots if s.alive() and not s.stopped]
        if not eligible:
            return False
        busy = [s for s in eligible if s.pid is not None and snap.inflight.get(s.pid)]
        slot = self.rng.choice(busy or eligible)
        assert slot.proc is not None
        pid = slot.proc.pid
        held = len(snap.inflight.get(pid, []))
        slot.proc.kill()
        with contextlib.suppress(RatchetError):
            self.kill_times.append((pid, self.ledger.now()))
        self.kills_done += 1
        self.kill_inflight.append(held)
        self.start_worker(slot)
        self.log(
            f"[red]SIGKILL[/] worker {slot.index} (pid {pid}, ~{held} tasks in flight) "
            f"→ restarted as pid {slot.pid}"
        )
        return True

    def try_pause(self, snap: _Snapshot) -> bool:
        """SIGSTOP a worker that holds tasks, unless it froze inside a ledger write."""
        candidates = [
            s
            for s in self.slots
            if s.alive()
            and s.pid is not None
            and snap.inflight.get(s.pid)
            and time.monotonic() - s.started_mono > 1.0
        ]
        others_alive = sum(1 for s in self.slots if s.alive()) >= 2
        if not candidates or not others_alive:
            return False  # nobody would be left to take its tasks over
        slot = self.rng.choice(candidates)
        assert slot.proc is not None
        slot.stopped = True
        slot.proc.pause()  # SIGSTOP to its group; returns once the kernel says stopped
        held = self.snapshot().inflight.get(slot.proc.pid, [])
        self.pause_attempts += 1
        if not held or self.sqlite_write_lock_held():
            slot.proc.resume()
            slot.stopped = False
            return False
        until = self.now() + self.pause_s
        self.pause.update(
            slot=slot.index, pid=slot.proc.pid, tasks=list(held), start=self.now(), until=until
        )
        self.log(
            f"[yellow]SIGSTOP[/] worker {slot.index} (pid {slot.proc.pid}) holding "
            f"{len(held)} tasks, for {self.pause_s:.1f} s (lease {self.lease_s:.1f} s)"
        )
        return True

    def resume(self) -> None:
        slot = self.slots[int(self.pause["slot"])]
        if slot.proc is not None:
            slot.proc.resume()
        slot.stopped = False
        self.pause["end"] = self.now()
        taken = 0
        for info in self.ledger.get_many(self.pause["tasks"]):
            if info.holder is None or _holder_pid(info.holder) != self.pause["pid"]:
                taken += 1
        self.pause["taken_over"] = taken
        self.log(
            f"[green]SIGCONT[/] worker {slot.index} (pid {self.pause['pid']}) after "
            f"{self.pause['end'] - self.pause['start']:.1f} s; {taken} of its "
            f"{len(self.pause['tasks'])} tasks were taken over meanwhile"
        )

    @property
    def pause_s(self) -> float:
        return self.s.pause_factor * self.lease_s

    # -- display

    def progress(self, snap: _Snapshot) -> Group:
        """The live view: counts from the ledger, chaos so far, the latest events."""
        st = snap.states
        grid = Table.grid(padding=(0, 2))
        for _ in range(4):
            grid.add_column(justify="left")
        failed = f"[red]{st[State.FAILED]}[/]" if st[State.FAILED] else "0"
        grid.add_row(
            f"elapsed [bold]{self.now():.1f} s[/]",
            f"submitted [bold]{self.submitted}/{self.n_tasks}[/]",
            f"succeeded [bold green]{st[State.SUCCEEDED]}[/]",
            f"failed [bold]{failed}[/]",
        )
        grid.add_row(
            f"pending [bold]{st[State.PENDING]}[/]",
            f"running [bold]{st[State.RUNNING]}[/]",
            f"retry wait [bold]{st[State.RETRY_WAIT]}[/]",
            f"unknown [bold]{st[State.UNKNOWN]}[/]",
        )
        grid.add_row(
            f"kills [bold]{self.kills_done}/{self.kills_asked}[/]",
            f"takeovers [bold]{snap.takeovers}[/] revoked [bold]{snap.revocations}[/]",
            f"stale rejections [bold]{snap.stale}[/]",
            f"lookup hits [bold]{snap.lookup_hits}[/]",
        )
        workers = "  ".join(
            f"w{s.index}: pid {s.pid}{' [yellow]stopped[/]' if s.stopped else ''}"
            f" ({len(snap.inflight.get(s.pid or -1, []))} held)"
            for s in self.slots
        )
        lines = [Text.from_markup(f"[dim]{t:5.1f} s[/] {m}") for t, m in self.events[-5:]]
        return Group(
            Panel(grid, title="ratchet demo: billing.charge", subtitle=workers, expand=False),
            *lines,
        )

    # -- main loop

    def run(self) -> int:
        s = self.s
        self.console.print(
            f"[bold]ratchet demo[/]: {self.n_tasks} tasks, {self.n_workers} workers x "
            f"{s.concurrency} threads, {self.kills_asked} kills, seed {self.seed}, "
            f"lease {self.lease_s:.1f} s"
        )
        self.console.print(f"ledger  {_display_url(self.ledger_url)}\nworkdir {self.workdir}")
        for note in self.notes:
            self.console.print(note)
        self.service = start_payment_service(
            self.workdir / "payments.db",
            reply_lost=s.reply_lost,
            burst_503=s.burst_503,
            slow=s.slow,
            slow_s=s.slow_s,
            latency_s=s.latency_s,
            honour_keys=s.honour_keys,
            seed=self.seed,
        )
        self.console.print(
            f"payment service pid {self.service.pid} at {self.service.url} "
            f"(faults: reply lost {s.reply_lost:.0%}, 503 bursts {s.burst_503:.0%}, "
            f"slow {s.slow:.0%} x {s.slow_s:.1f} s"
            + ("" if s.honour_keys else ", [bold red]keys NOT honoured[/]")
            + ")"
        )
        self.ledger.migrate()
        for slot in self.slots:
            self.start_worker(slot)

        batches = max(1, min(s.batches, self.n_tasks))
        per_batch = -(-self.n_tasks // batches)
        submit_at = [s.arrival_s * i / batches for i in range(batches)]
        # Chaos at random points of progress: one kill in each of `kills` equal slices of
        # [chaos_from, chaos_to], the pause somewhere in the first half of the run.
        span = s.chaos_to - s.chaos_from
        kill_at = sorted(
            s.chaos_from + span * (k + self.rng.uniform(0.1, 0.9)) / max(1, self.kills_asked)
            for k in range(self.kills_asked)
        )
        pause_at = self.rng.uniform(0.2, 0.45)
        pause_done = self.n_workers < 2  # a lone worker has nobody to take over from it
        if pause_done:
            self.log("[yellow]one worker only: no pause (nobody could take its tasks over)[/]")
        last_kill = -1e9
        resubmitted = False

        self.t0 = time.monotonic()
        deadline = s.deadline_s
        snap = _Snapshot(Counter(), {})
        # The deadline follows the workload: the run ends when every task settled, and
        # fails only when nothing moved (no state change, no takeover) for stall_s.
        last_fingerprint: tuple[Any, ...] = ()
        last_change = 0.0
        with Live(
            self.progress(snap), console=self.console, refresh_per_second=4, transient=False
        ) as live:
            while True:
                t = self.now()
                # submissions
                while submit_at and submit_at[0] <= t:
                    submit_at.pop(0)
                    chunk = self.orders[self.submitted : self.submitted + per_batch]
                    handles = self.app.submit_many(
                        [
                            SubmitRequest(
                                _TASK,
                                {"order_id": o, "amount_cents": a},
                                idempotency_key=f"order:{o}",
                            )
                            for o, a in chunk
                        ]
                    )
                    self.task_ids.extend(h.task_id for h in handles)
                    self.submitted += len(chunk)
                if not resubmitted and self.submitted >= min(self.n_tasks, s.resubmits):
                    resubmitted = True
                    self._resubmit()
                # liveness: a worker that died by itself is restarted (and reported)
                for slot in self.slots:
                    if slot.proc is not None and not slot.alive():
                        self.unexpected_exits += 1
                        self.log(
                            f"[red]worker {slot.index} (pid {slot.pid}) exited by itself "
                            f"with status {slot.proc.returncode}[/] → restarting"
                        )
                        self.start_worker(slot)
                snap = self.snapshot()
                settled = sum(
                    snap.states[x] for x in (State.SUCCEEDED, State.FAILED, State.CANCELLED)
                )
                progress = settled / self.n_tasks
                # chaos
                if (
                    kill_at
                    and kill_at[0] <= progress
                    and time.monotonic() - last_kill >= s.min_kill_gap_s
                    and self.kill_one(snap)
                ):
                    kill_at.pop(0)
                    last_kill = time.monotonic()
                    snap = self.snapshot()
                if not self.pause and not pause_done and progress >= pause_at:
                    if not self.try_pause(snap) and settled == self.n_tasks:
                        pause_done = True  # never found a busy worker to freeze
                        self.log("[yellow]could not pause a worker holding tasks[/]")
                elif self.pause and "end" not in self.pause and t >= self.pause["until"]:
                    self.resume()
                    pause_done = True
                live.update(self.progress(snap))
                # done?
                chaos_over = (
                    not kill_at
                    and pause_done
                    and ("end" not in self.pause or t >= self.pause["end"] + 1.0)
                )
                if (
                    self.submitted >= self.n_tasks
                    and not submit_at
                    and chaos_over
                    and (settled == len(self.task_ids))
                ):
                    break
                fingerprint = (
                    tuple(sorted((st.value, n) for st, n in snap.states.items())),
                    snap.takeovers,
                    snap.revocations,
                )
                if fingerprint != last_fingerprint:
                    last_fingerprint, last_change = fingerprint, t
                elif self.submitted >= self.n_tasks and t - last_change >= s.stall_s:
                    self.stalled = True
                    self.log(
                        f"[red]stalled: no task changed state for {s.stall_s:.0f} s[/] "
                        f"({_fmt_states(snap.states)})"
                    )
                    live.update(self.progress(snap))
                    break
                if deadline is not None and t >= deadline:
                    self.deadline_hit = True
                    self.log(f"[red]hard deadline of {deadline:.0f} s reached[/]")
                    live.update(self.progress(snap))
                    break
                time.sleep(max(0.0, s.tick_s - (self.now() - t)))
        self.elapsed_s = self.now()
        if self.pause and "end" not in self.pause:
            self.resume()
        self.stop_workers()
        return self.report()

    def _resubmit(self) -> None:
        picks = self.rng.sample(range(self.submitted), min(self.s.resubmits, self.submitted))
        handles = self.app.submit_many(
            [
                SubmitRequest(
                    _TASK,
                    {"order_id": self.orders[i][0], "amount_cents": self.orders[i][1]},
                    idempotency_key=f"order:{self.orders[i][0]}",
                )
                for i in picks
            ]
        )
        for i, h in zip(picks, handles, strict=True):
            self.resubmit_checks.append((self.task_ids[i], h.task_id, h.created))
        same = sum(1 for want, got, created in self.resubmit_checks if want == got and not created)
        self.log(
            f"resubmitted {len(picks)} idempotency keys → {same} deduplicated to the same task id"
        )

    # -- report

    def report(self) -> int:
        assert self.service is not None
        infos = {i.task_id: i for i in self.ledger.get_many(self.task_ids)}
        stats = self.ledger.stats()
        records = self.service.records()
        executions = records.executions
        service_stats: dict[str, Any] = {}
        with contextlib.suppress(Exception), PaymentClient(self.service.url, 5.0) as client:
            service_stats = client.stats()

        states: Counter[State] = Counter(i.state for i in infos.values())
        key_of = {tid: f"charge:{i.params['order_id']}" for tid, i in infos.items()}

        # Per-task records from the ledger: effects, retries, releases.
        via_lookup = 0
        calls = 0
        retry_classes: Counter[str] = Counter()
        released: Counter[str] = Counter()
        attempts: list[int] = []
        timelines = {tid: self.ledger.timeline(tid) for tid in infos}
        events_of: dict[str, list[AuditEvent]] = {}
        for tid, info in infos.items():
            tl = timelines[tid]
            events_of[tid] = tl.events
            attempts.append(info.attempt)
            for ev in tl.events:
                if ev.kind == "transition" and ev.to_state == State.RETRY_WAIT.value:
                    retry_classes[str(ev.detail.get("error_class", "?"))] += 1
                if ev.kind == "transition" and ev.to_state == State.PENDING.value:
                    released[str(ev.detail.get("reason", "?"))] += 1
            for eff in tl.effects:
                calls += eff.calls
                via_lookup += int(eff.via_lookup)

        # The verdict: ratchet.testing's checks, against the service's own records.
        once = check_exactly_once(
            self.ledger, records, task_ids=self.task_ids, keys=key_of, effect="charge",
            result_id_field="charge_id", raise_on_violation=False, timelines=timelines,
        )  # fmt: skip
        consistent = check_ledger_consistent(
            self.ledger_url, task_ids=list(infos), raise_on_violation=False,
            timelines=timelines,
        )  # fmt: skip
        succeeded = once.succeeded
        dup_keys = once.duplicated
        charged_not_succeeded = once.executed_not_succeeded
        reclaims = self._reclaims(events_of)
        not_terminal = once.not_terminal
        resub_ok = all(want == got and not created for want, got, created in self.resubmit_checks)
        why_unfinished = (
            f"stalled {self.s.stall_s:.0f} s" if self.stalled
            else "hard deadline" if self.deadline_hit else ""
        )  # fmt: skip

        invariants: list[tuple[str, bool, str]] = [
            (
                "every task finished (drained, no stall)",
                not not_terminal and not self.stalled and not self.deadline_hit
                and len(infos) == self.n_tasks,
                f"{len(not_terminal)} not terminal "
                f"({_fmt_states(Counter(State(v) for v in not_terminal.values()))})"
                + (f", {why_unfinished}" if why_unfinished else "")
                if not_terminal or why_unfinished
                else f"{len(infos)} of {self.n_tasks}",
            ),
            (
                "every succeeded task's key executed exactly once",
                once.succeeded_once == succeeded and not once.missing,
                f"{once.succeeded_once} of {succeeded}"
                + (f"; never executed: {', '.join(list(once.missing)[:3])}"
                   if once.missing else ""),
            ),
            (
                "no key executed more than once",
                not dup_keys,
                f"{len(dup_keys)} duplicated keys"
                + (f": {', '.join(list(dup_keys)[:3])}" if dup_keys else ""),
            ),
            (
                "ledger's charge id = the service's charge id",
                not once.mismatched,
                f"{succeeded - len(once.mismatched)} of {succeeded} match",
            ),
            (
                "no charges for keys outside this run",
                not once.unexpected,
                f"{len(once.unexpected)} stray keys",
            ),
            (
                "ledger consistent (every fencing generation audited)",
                consistent.ok,
                f"{consistent.tasks} tasks" if consistent.ok
                else "; ".join(consistent.violations[:2]),
            ),
            (
                "resubmitted keys returned the same task id",
                resub_ok,
                f"{sum(1 for w, g, c in self.resubmit_checks if w == g and not c)} of "
                f"{len(self.resubmit_checks)}",
            ),
            (
                f"at least {self.kills_asked} SIGKILLs",
                self.kills_done >= self.kills_asked,
                f"{self.kills_done} done",
            ),
        ]  # fmt: skip
        broken = [name for name, ok, _ in invariants if not ok]

        # ---- print
        c = self.console
        c.print()
        timeline = Table(title="chaos timeline", box=None, show_header=False)
        timeline.add_column(justify="right", style="dim")
        timeline.add_column()
        for t, m in self.events:
            timeline.add_row(f"{t:5.1f} s", m)
        c.print(timeline)

        tasks_t = Table(title="tasks (ledger)", show_header=False)
        tasks_t.add_column()
        tasks_t.add_column(justify="right")
        tasks_t.add_row("submitted", str(len(infos)))
        tasks_t.add_row(
            "resubmissions deduplicated",
            f"{sum(1 for w, g, c_ in self.resubmit_checks if w == g and not c_)}"
            f"/{len(self.resubmit_checks)}",
        )
        tasks_t.add_row("succeeded", f"[green]{states[State.SUCCEEDED]}[/]")
        tasks_t.add_row("failed (dead-letter)", _warn(states[State.FAILED]))
        tasks_t.add_row("unknown (needs a person)", _warn(states[State.UNKNOWN]))
        tasks_t.add_row("not terminal", _warn(len(not_terminal)))
        tasks_t.add_row("claims / takeovers", f"{stats.claims} / {stats.takeovers}")
        tasks_t.add_row("revocations (fast takeover of dead holders)", str(stats.revocations))
        tasks_t.add_row("stale-generation rejections", str(stats.stale_rejections))
        tasks_t.add_row("lookups that found an earlier charge", str(stats.lookup_hits))
        tasks_t.add_row(
            "retries: overload / unknown outcome / transient",
            f"{retry_classes['overload']} / {retry_classes['unknown_outcome']} / "
            f"{retry_classes['transient']}",
        )
        tasks_t.add_row(
            "released: lease unconfirmed / shutdown",
            f"{released['lease_unconfirmed']} / {released['shutdown']}",
        )
        tasks_t.add_row("charge intents recorded (calls started)", str(calls))
        tasks_t.add_row(
            "attempts per task: max / mean",
            f"{max(attempts, default=0)} / "
            f"{(sum(attempts) / len(attempts)) if attempts else 0:.2f}",
        )

        ext = Table(title="payment service (its own SQLite file)", show_header=False)
        ext.add_column()
        ext.add_column(justify="right")
        ext.add_row("charges executed", str(sum(executions.values())))
        ext.add_row("distinct keys charged", str(len(executions)))
        ext.add_row("keys executed more than once", _bad(len(dup_keys)))
        ext.add_row("succeeded tasks with exactly one charge", f"{once.succeeded_once}/{succeeded}")
        ext.add_row("not-succeeded tasks that were charged", str(len(charged_not_succeeded)))
        ext.add_row("replays deduplicated by the service", str(service_stats.get("replays", "?")))
        ext.add_row(
            "lookups (found)",
            f"{service_stats.get('lookups', '?')} ({service_stats.get('lookups_found', '?')})",
        )
        injected = service_stats.get("injected", {})
        ext.add_row("replies dropped after charging", str(injected.get("reply_lost", "?")))
        ext.add_row("503 answers", str(injected.get("503", "?")))
        ext.add_row("slow charges", str(injected.get("slow", "?")))

        chaos = Table(title="chaos", show_header=False)
        chaos.add_column()
        chaos.add_column(justify="right")
        chaos.add_row("workers SIGKILLed (and restarted)", f"{self.kills_done}/{self.kills_asked}")
        chaos.add_row("tasks in flight at the kills", str(sum(self.kill_inflight)))
        for label, value in self._reclaim_rows(reclaims):
            chaos.add_row(label, value)
        if "end" in self.pause:
            chaos.add_row(
                "worker paused (SIGSTOP)",
                f"{self.pause['end'] - self.pause['start']:.1f} s, "
                f"{len(self.pause['tasks'])} tasks held",
            )
            chaos.add_row("its tasks taken over meanwhile", str(self.pause.get("taken_over", 0)))
        else:
            chaos.add_row("worker paused (SIGSTOP)", "[yellow]not achieved[/]")
        chaos.add_row("pause attempts", str(self.pause_attempts))
        chaos.add_row("unexpected worker exits", _warn(self.unexpected_exits))
        chaos.add_row("run time", f"{self.elapsed_s:.1f} s")

        c.print(tasks_t)
        c.print(ext)
        c.print(chaos)
        inv = Table(title="invariants", show_header=False)
        inv.add_column()
        inv.add_column()
        inv.add_column()
        for name, ok, detail in invariants:
            inv.add_row("[green]PASS[/]" if ok else "[bold red]FAIL[/]", name, detail)
        c.print(inv)
        if "end" in self.pause and stats.stale_rejections == 0:
            c.print(
                "[yellow]note:[/] the paused worker resumed without a stale-generation "
                "rejection (it had no write pending for a task taken over)"
            )
        if reclaims.claimed and reclaims.revoked:
            wait = statistics.median(reclaims.first_claim) - statistics.median(reclaims.freed)
            if wait > 1.0:
                c.print(
                    f"[yellow]note:[/] revoked tasks were claimable at once but waited "
                    f"{wait:.1f} s (median) to be claimed again: they re-enter the ready queue "
                    "behind the whole backlog (revoke_holder sets run_at = now)"
                )
        if broken:
            c.print(f"[bold red]FAILED[/]: {len(broken)} invariant(s) broken. Logs: {self.workdir}")
            return 1
        c.print(
            f"[bold green]OK[/]: {states[State.SUCCEEDED]} charges, each executed exactly "
            f"once at the payment service, despite {self.kills_done} SIGKILLs"
            + (" and a paused holder" if "end" in self.pause else "")
            + f" ({self.elapsed_s:.1f} s)."
        )
        freed_median = statistics.median(reclaims.freed) if reclaims.freed else None
        if freed_median is not None and freed_median < self.lease_s:
            c.print(
                f"Killed workers' tasks were claimable again {freed_median:.2f} s"
                f" after a kill (median), not after a {self.lease_s:.1f} s lease: "
                f"{stats.revocations} leases revoked from dead holders."
            )
        return 0

    def _reclaims(self, events_of: dict[str, list[AuditEvent]]) -> _Reclaims:
        """For each SIGKILL, the tasks the dead worker held and when each came back.

        A task counts for a kill when, by its audit rows, it was RUNNING under the killed
        pid at the ledger time read right after the process died. It was freed at its next
        ``revoke`` row (fast takeover) or else at its next ``takeover`` row (lease expiry),
        and claimed again at its next ``claim``/``takeover`` row.
        """
        freed: list[float] = []
        first_claim: list[float] = []
        claimed: list[float] = []
        revoked = expired = 0
        for pid, killed_at in self.kill_times:
            kill_freed: list[float] = []
            kill_claimed: list[float] = []
            for events in events_of.values():
                holder: str | None = None
                after: list[AuditEvent] = []
                for ev in events:
                    if ev.at > killed_at:
                        after.append(ev)
                    elif ev.kind in ("claim", "takeover"):
                        holder = ev.holder
                    elif ev.kind == "revoke" or (
                        ev.to_state is not None and ev.to_state != State.RUNNING.value
                    ):
                        holder = None
                if _holder_pid(holder) != pid:
                    continue
                revoked_after: float | None = None
                for ev in after:
                    delay = max(0.0, ev.at - killed_at)
                    if ev.kind == "revoke" and revoked_after is None:
                        revoked_after = delay
                    elif ev.kind in ("claim", "takeover"):
                        kill_claimed.append(delay)
                        kill_freed.append(revoked_after if revoked_after is not None else delay)
                        revoked += int(revoked_after is not None)
                        expired += int(revoked_after is None)
                        break
            claimed.extend(kill_claimed)
            if kill_claimed:
                freed.append(min(kill_freed))
                first_claim.append(min(kill_claimed))
        return _Reclaims(freed, first_claim, claimed, revoked, expired)

    def _reclaim_rows(self, r: _Reclaims) -> list[tuple[str, str]]:
        """Rows for the chaos table: how fast the killed workers' tasks came back."""
        if not r.claimed:
            return [("killed workers' tasks claimed again", "-")]
        freed = statistics.median(r.freed)
        verdict = (
            f"[green]< lease ({self.lease_s:.1f} s)[/]"
            if freed < self.lease_s
            else f"[yellow]lease ({self.lease_s:.1f} s)[/]"
        )
        return [
            ("killed tasks freed: revoked / lease expired", f"{r.revoked} / {r.expired}"),
            ("kill → its tasks claimable (median)", f"{freed:.2f} s, {verdict}"),
            ("kill → first re-claim (median)", f"{statistics.median(r.first_claim):.2f} s"),
            (
                "kill → re-claim per task: median / max",
                f"{statistics.median(r.claimed):.2f} / {max(r.claimed):.2f} s",
            ),
        ]


def _fmt_states(states: Counter[State]) -> str:
    return ", ".join(f"{s.value} {n}" for s, n in sorted(states.items())) or "-"


def _warn(n: int) -> str:
    return f"[yellow]{n}[/]" if n else "0"


def _bad(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "[green]0[/]"


def _prepare_workdir(workdir: Path) -> Path:
    """Create ``workdir`` empty; wipe it only if it is empty or an earlier demo's directory.

    Raises:
        ConfigError: it exists, is not empty and was not made by the demo.
    """
    workdir = workdir.resolve()
    if workdir.exists():
        if not workdir.is_dir():
            raise ConfigError(f"demo work dir {workdir} exists and is not a directory")
        if any(workdir.iterdir()) and not (workdir / _MARKER).exists():
            raise ConfigError(
                f"demo work dir {workdir} is not empty and was not created by `ratchet demo`; "
                "choose another directory (it is wiped on every run)"
            )
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / _MARKER).write_text("created by ratchet demo; wiped on every run\n")
    return workdir


def run_demo(
    ledger_url: str | None,
    tasks: int = 500,
    workers: int = 2,
    kills: int = 5,
    seed: int | None = None,
    workdir: Path | None = None,
    *,
    settings: DemoSettings | None = None,
    console: Console | None = None,
) -> int:
    """Run the demo and return the process exit code.

    Args:
        ledger_url: the ledger; None for ``sqlite:///<workdir>/ledger.db`` (fresh each run).
            A ``postgresql://`` URL runs in its ``schema=`` (default ``ratchet_demo``),
            which is dropped with everything in it and created empty first (see
            :func:`reset_pg_schema`: refused for a schema the demo did not create).
            Another SQLite URL is used as it is; order ids carry a per-run tag, so a shared
            ledger does not dedupe across runs.
        tasks: ``billing.charge`` tasks to submit (>= 1).
        workers: worker processes (>= 1; 2 or more to see takeovers of a paused holder).
        kills: SIGKILLs to deliver (at least).
        seed: seed for amounts, chaos timing and the service's faults (None: random,
            printed). Timing still varies between runs.
        workdir: directory for the ledger, the service's database and the logs; default
            ``./ratchet-demo``. It is wiped on every run.
        settings: finer knobs (:class:`DemoSettings`).
        console: where to print (default: a new Rich console on stdout).

    Returns:
        0 when every invariant holds, 1 when one is broken, 2 when the demo could not run
        (bad arguments, the payment service did not start).
    """
    console = console or Console()
    settings = settings or DemoSettings()
    if tasks < 1 or workers < 1 or kills < 0:
        console.print("[bold red]error:[/] need tasks >= 1, workers >= 1, kills >= 0")
        return 2
    if seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    try:
        wd = _prepare_workdir(workdir if workdir is not None else Path("ratchet-demo"))
    except (ConfigError, OSError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        return 2
    url = ledger_url or f"sqlite:///{wd / 'ledger.db'}"
    notes: list[str] = []
    try:
        if parse_ledger_url(url).scheme == "postgresql":
            url, schema, defaulted = demo_pg_url(url)
            if defaulted:
                notes.append(
                    f"schema  {schema} (the URL names no schema=; the demo uses its own, "
                    "never the default 'ratchet')"
                )
            existed = reset_pg_schema(url, schema)
            notes.append(
                f"        dropped schema {schema} (DROP SCHEMA ... CASCADE) and created it empty"
                if existed
                else f"        created schema {schema} (it did not exist)"
            )
    except RatchetError as exc:
        console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    app = billing.app
    app.close()  # a previous run in this process may have opened another ledger
    app.configure(ledger=url)
    demo = _DemoRun(console, url, wd, tasks, workers, kills, seed, settings, notes)
    try:
        return demo.run()
    except (PaymentServiceError, RatchetError) as exc:
        console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: stopping workers and the payment service")
        return 130
    finally:
        demo.stop_workers()
        if demo.service is not None:
            demo.service.stop()
        app.close()


def _main() -> None:
    raise SystemExit(run_demo(None))


if __name__ == "__main__":
    _main()
