"""``ratchet demo``: billing tasks against four faulty payment services while workers are
killed and frozen senders wake up late.

:func:`run_demo` is the main job. In about a minute it:

1. starts four fake payment services (:mod:`ratchet.demo.payments`), one per kind of
   target (:data:`~ratchet.demo.payments.KINDS`), each in its own process with its own
   SQLite file and faults on — dropped replies after charging, bursts of 503, slow replies
   that outlast the client's read timeout: one honours the idempotency key, one checks
   fencing tokens, one only answers lookups, one offers neither;
2. submits ``tasks`` billing tasks (:data:`~ratchet.demo.billing.TASKS`, the kinds in
   turn) with idempotency keys, in batches spread over the run, and resubmits a few keys
   to show that submit dedupe returns the same task id;
3. runs ``workers`` real worker processes
   (``python -m ratchet.cli.main worker ratchet.demo.billing:app --concurrency 8``);
4. kills a random worker with a real ``SIGKILL`` at random moments (at least ``kills``
   times) and restarts it;
5. freezes one sender per kind in the middle of a call: a worker process for that kind's
   task only, started with ``RATCHET_PAUSE_AT=effect.before_call`` (before the workers of
   step 3, so it finds a task of its kind), stops itself with ``SIGSTOP`` after its last
   lease check and before its charge leaves. It stays frozen
   past its lease until another worker has taken its task over and settled it, then gets
   ``SIGCONT`` and sends its charge late (the faults of that one service are paused for
   that moment, so the report shows what the target does with a late charge, not an
   injected fault): the idempotent service answers it as a replay, the fenced service
   refuses its stale token, the lookup-only service executes it a second time (a duplicate
   the ledger records as a late effect), the service with neither executes it once while
   the task waits in ``UNKNOWN`` (the new holder could not know), again recorded as a late
   effect;
6. shows live progress, then a report read from the ledger *and* from each payment
   service's own SQLite file, which is the only proof of how often each charge executed:
   per kind of target, the executions, duplicates, late effects, refused tokens and
   ``UNKNOWN`` tasks, against that kind's guarantee; and how fast the killed workers'
   tasks were claimed again (same-host peers revoke a dead holder's leases instead of
   waiting for them to expire).

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
payment services are counting services, and the verdict comes from
:func:`~ratchet.testing.check_exactly_once` (per service) and
:func:`~ratchet.testing.check_ledger_consistent`; operator reads (status, late effects)
go through :class:`ratchet.Control`.

It exits 1 if an invariant is broken. The checks follow each kind's guarantee:

* idempotent and fenced: every succeeded task's key executed exactly once, no key more
  than once, no task in ``UNKNOWN``; fenced: the frozen sender's late charge refused;
* lookup only: no duplicate that the ledger did not record as a late effect (the frozen
  sender's duplicate is expected *and* must be recorded); every other key exactly once;
* neither: no key more than once; tasks in ``UNKNOWN`` allowed (a person settles them),
  each with its key executed at most once;

and for all: a charge no task accounts for, a task left unfinished (stall), an
inconsistent ledger, fewer kills than asked, a frozen sender missing, or a resubmission
that was not deduplicated.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psutil
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..app import SubmitRequest
from ..config import parse_ledger_url
from ..control import AuditEvent, Control, LateEffectView, TaskInfo
from ..errors import ConfigError, LedgerUnavailable, RatchetError
from ..states import State
from ..storedtext import StoredState
from ..testing import (
    ConditionTimeout,
    ExactlyOnceReport,
    ProcessGroup,
    ServiceRecords,
    WorkerProcess,
    check_exactly_once,
    check_ledger_consistent,
    sqlite_write_locked,
)
from . import billing
from .payments import (
    KINDS,
    SERVICE_OPTIONS,
    PaymentClient,
    PaymentService,
    PaymentServiceError,
    read_replays,
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
_FREEZE_POINT = "effect.before_call"
_FREEZE_HEAD_START_S = 15.0
"""Seconds the would-be frozen senders run alone before the workers start (at most)."""
_SETTLED = (State.SUCCEEDED, State.FAILED, State.CANCELLED, State.UNKNOWN)
"""States in which a task no longer moves by itself (UNKNOWN waits for a person)."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Knobs of one demo run (defaults sized for about a minute on 2 cores).

    Kills are placed at random points of *progress* (fractions of tasks settled), not of
    wall time, so they land on busy workers on a fast or a slow machine.

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
        honour_keys: the ``idempotent`` service deduplicates on ``Idempotency-Key`` (set
            False to watch the invariants catch duplicates: ``billing.charge`` declares
            the target idempotent, and lookup-first alone cannot see a request still in
            flight).
        slow_s: how slow a slow charge is, seconds (above the client's 1 s read timeout).
        latency_s: mean processing time of every charge at the services, seconds (keeps
            the workers' threads busy, so kills hit tasks in flight).
        in_flight_s: ``in_flight_s`` of the lookup-only charge, seconds (None: the
            services' slowest processing, ``max(slow_s, 1.5 * latency_s)``, plus 1 s).
        freeze: freeze one sender per kind of target in the middle of a call.
        pause_factor: a frozen sender stays frozen at least this many leases, and until
            another worker has settled its task.
        freeze_max_s: ... but at most this long, seconds (then it is resumed anyway).
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
    in_flight_s: float | None = None
    freeze: bool = True
    pause_factor: float = 1.0
    freeze_max_s: float = 45.0
    tick_s: float = 0.2

    @property
    def effective_in_flight_s(self) -> float:
        """The lookup-only charge's ``in_flight_s``, seconds (see :attr:`in_flight_s`)."""
        if self.in_flight_s is not None:
            return self.in_flight_s
        return max(self.slow_s, 1.5 * self.latency_s) + 1.0


# ---------------------------------------------------------------------------- workers


@dataclass
class _Slot:
    """One worker position: a process that is restarted after every kill."""

    index: int
    proc: WorkerProcess | None = None
    started_mono: float = 0.0
    starts: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass
class _Freeze:
    """The frozen sender of one kind of target: a worker process for that kind's task only,
    which stops itself at ``effect.before_call``.

    ``state``: ``waiting`` (runs, not frozen yet), ``frozen``, ``resumed`` (SIGCONT sent,
    its late charge awaited), ``done``, ``failed`` (never froze in the window). ``before``:
    the key's executions, refused tokens and replays at the service just before SIGCONT.
    """

    kind: str
    proc: WorkerProcess | None = None
    attempts: int = 0
    state: str = "waiting"
    task_id: str | None = None
    key: str | None = None
    generation: int | None = None
    frozen_at: float | None = None
    resumed_at: float | None = None
    done_at: float | None = None
    settled_as: str | None = None
    settled_generation: int | None = None
    before: tuple[int, int, int] = (0, 0, 0)
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


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


@dataclass
class _Snapshot:
    """What the ledger says about this run's tasks at one instant."""

    states: Counter[State | StoredState]
    inflight: dict[int, list[str]]
    settled_of: Counter[str] = field(default_factory=Counter)
    takeovers: int = 0
    stale: int = 0
    lookup_hits: int = 0
    revocations: int = 0
    late_effects: int = 0


@dataclass
class _KindResult:
    """The verdict on one kind of payment target, from its service's own file and the ledger.

    Attributes:
        kind: the kind (:data:`~ratchet.demo.payments.KINDS`).
        task_ids: this run's tasks of that kind.
        states: their states.
        once: :func:`~ratchet.testing.check_exactly_once` against the kind's service.
        records: the service's own records.
        late: late effects the ledger recorded for these tasks, per key.
        detected: duplicated keys whose extra executions all have a late-effect record.
        undetected: duplicated keys with more executions than late effects explain.
        exactly: succeeded tasks whose key executed exactly once, or once plus one
            execution per recorded late effect where the kind allows that (lookup only).
        problems: what breaks the kind's guarantee (empty: it held).
    """

    kind: str
    task_ids: list[str]
    states: Counter[State | StoredState]
    once: ExactlyOnceReport
    records: ServiceRecords
    late: dict[str, list[LateEffectView]]
    detected: dict[str, int] = field(default_factory=dict)
    undetected: dict[str, int] = field(default_factory=dict)
    exactly: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def executions(self) -> int:
        return sum(self.records.executions.values())

    def rejected(self, key: str | None = None) -> int:
        """Requests the service refused for a stale fencing token (for ``key``, or all)."""
        return sum(1 for r in self.records.rejections if key is None or r.key == key)


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
        self.control = Control(app=self.app)
        self.lease_s = self.app.definition(billing.TASKS["idempotent"]).lease_s
        self.services: dict[str, PaymentService] = {}
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
            (f"ord-{self.run_tag}-{i:05d}", self.rng.randrange(500, 50_000), KINDS[i % len(KINDS)])
            for i in range(tasks)
        ]
        self.total_of: Counter[str] = Counter(kind for _, _, kind in self.orders)
        self.freezes = {
            kind: _Freeze(kind) for kind in KINDS if settings.freeze and self.total_of[kind]
        }
        self.task_ids: list[str] = []
        self.kind_of: dict[str, str] = {}
        self.submitted = 0
        self.resubmit_checks: list[tuple[str, str, bool]] = []  # (expected id, got id, created)
        self.kills_done = 0
        self.kill_inflight: list[int] = []
        self.kill_times: list[tuple[int, float]] = []  # (pid, ledger clock just after death)
        self.unexpected_exits = 0
        self.stalled = False
        self.deadline_hit = False
        self.elapsed_s = 0.0

    # -- plumbing

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, message: str) -> None:
        self.events.append((self.now(), message))

    def worker_env(self) -> dict[str, str | None]:
        """What every worker process needs: each kind's service URL, lease, in_flight_s."""
        env: dict[str, str | None] = {
            "RATCHET_DEMO_LEASE_S": repr(self.lease_s),
            "RATCHET_DEMO_IN_FLIGHT_S": repr(self.s.effective_in_flight_s),
            "RATCHET_DEMO_PAYMENTS_URL": None,
        }
        for kind, service in self.services.items():
            env[f"RATCHET_DEMO_PAYMENTS_URL_{kind.upper()}"] = service.url
        return env

    def start_worker(self, slot: _Slot) -> None:
        """Start (or restart) the worker of ``slot`` in a process group of its own."""
        slot.proc = self.procs.worker(
            "ratchet.demo.billing:app",
            self.ledger_url,
            name=f"worker-{slot.index}",
            concurrency=self.s.concurrency,
            poll_interval_s=None,
            new_session=True,
            env=self.worker_env(),
        )
        slot.started_mono = time.monotonic()
        slot.starts += 1
        slot.pids.append(slot.proc.pid)

    def start_freezer(self, fz: _Freeze) -> None:
        """Start the would-be frozen sender of ``fz.kind``: one task thread, nothing
        prefetched, only that kind's task, ``RATCHET_PAUSE_AT=effect.before_call``."""
        fz.attempts += 1
        fz.state = "waiting"
        fz.proc = self.procs.worker(
            "ratchet.demo.billing:app",
            self.ledger_url,
            name=f"frozen-sender-{fz.kind}-{fz.attempts}",
            concurrency=1,
            poll_interval_s=0.05,
            new_session=True,
            args=["--names", billing.TASKS[fz.kind], "--prefetch", "0"],
            env={**self.worker_env(), "RATCHET_PAUSE_AT": _FREEZE_POINT},
        )

    def all_procs(self) -> list[WorkerProcess]:
        procs = [s.proc for s in self.slots if s.proc is not None]
        return procs + [f.proc for f in self.freezes.values() if f.proc is not None]

    def stop_workers(self) -> None:
        """SIGCONT + SIGTERM every live worker, wait up to 5 s, SIGKILL what is left.

        Only processes still running (not yet reaped) are signalled, so a recycled pid is
        never hit. Calling it again is a no-op.
        """
        live = [p for p in self.all_procs() if p.alive()]
        for proc in live:
            proc.resume()
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in live:
            with contextlib.suppress(ConditionTimeout):
                proc.wait(max(0.1, deadline - time.monotonic()))
        self.procs.cleanup()

    def restore_faults(self, kind: str) -> None:
        """Put ``kind``'s service back on the run's fault settings."""
        s = self.s
        with contextlib.suppress(Exception), PaymentClient(self.services[kind].url, 5.0) as c:
            c.set_faults(reply_lost=s.reply_lost, burst_503=s.burst_503, slow=s.slow)

    # -- ledger reads

    def snapshot(self) -> _Snapshot:
        infos = self.control.get_many(self.task_ids) if self.task_ids else []
        states: Counter[State | StoredState] = Counter(i.state for i in infos)
        settled_of: Counter[str] = Counter(
            self.kind_of[i.task_id] for i in infos if i.state in _SETTLED
        )
        inflight: dict[int, list[str]] = {}
        for info in infos:
            if info.state is State.RUNNING:
                pid = _holder_pid(info.holder)
                if pid is not None:
                    inflight.setdefault(pid, []).append(info.task_id)
        st = self.control.status()
        return _Snapshot(
            states, inflight, settled_of, st.takeovers, st.stale_rejections, st.lookup_hits,
            st.revocations, st.late_effects,
        )  # fmt: skip

    def late_effects(self, task_id: str | None = None) -> list[LateEffectView]:
        """Late effects the ledger recorded (for ``task_id``, or all of this run's)."""
        found = self.control.late_effects(task_id=task_id, limit=10_000)
        if task_id is not None:
            return list(found)
        mine = set(self.task_ids)
        return [le for le in found if le.task_id in mine]

    def sqlite_write_lock_held(self) -> bool:
        """True when another process holds the SQLite ledger's write lock for > 0.5 s.

        Only used right after a sender froze: a process frozen while one of its threads is
        *inside* a write transaction (a lease renewal) holds SQLite's single write lock, so
        every other writer would wait for the whole freeze. That is a property of the
        embedded backend, not the scenario this demo wants to show (a sender outliving its
        lease), so that freeze is retried.
        """
        try:
            config = parse_ledger_url(self.ledger_url)
        except ConfigError:
            return False
        if config.scheme != "sqlite":
            return False
        return sqlite_write_locked(config.path, timeout_s=0.5)

    # -- chaos: kills

    def kill_one(self, snap: _Snapshot) -> bool:
        """SIGKILL a random running worker and restart it. False: none eligible."""
        eligible = [s for s in self.slots if s.alive()]
        if not eligible:
            return False
        busy = [s for s in eligible if s.pid is not None and snap.inflight.get(s.pid)]
        slot = self.rng.choice(busy or eligible)
        assert slot.proc is not None
        pid = slot.proc.pid
        held = len(snap.inflight.get(pid, []))
        slot.proc.kill()
        with contextlib.suppress(RatchetError):
            self.kill_times.append((pid, self.control.ledger_now()))
        self.kills_done += 1
        self.kill_inflight.append(held)
        self.start_worker(slot)
        self.log(
            f"[red]SIGKILL[/] worker {slot.index} (pid {pid}, ~{held} tasks in flight) "
            f"→ restarted as pid {slot.pid}"
        )
        return True

    # -- chaos: frozen senders

    def tend_freezes(self, snap: _Snapshot) -> None:
        """Move each frozen sender along: waiting → frozen → resumed → done."""
        for fz in self.freezes.values():
            if fz.state == "waiting":
                self._check_frozen(fz, snap)
            elif fz.state == "frozen":
                self._maybe_resume(fz)
            elif fz.state == "resumed":
                self._check_late(fz)

    def _retry_freeze(self, fz: _Freeze, why: str) -> None:
        if fz.proc is not None and fz.proc.alive():
            fz.proc.resume()
            fz.proc.signal(signal.SIGTERM)  # graceful: it finishes or releases its task
        if fz.attempts >= 3:
            fz.state, fz.note = "failed", why
            self.log(f"[yellow]{fz.kind}: no frozen sender ({why}; gave up after 3 tries)[/]")
        else:
            self.log(f"[yellow]{fz.kind}: freeze retried ({why})[/]")
            self.start_freezer(fz)

    def _check_frozen(self, fz: _Freeze, snap: _Snapshot) -> None:
        proc = fz.proc
        if proc is None:
            return
        if not proc.alive():
            self.unexpected_exits += 1
            self._retry_freeze(fz, f"its worker exited with status {proc.returncode}")
            return
        if proc.status() != psutil.STATUS_STOPPED:
            left = self.total_of[fz.kind] - snap.settled_of[fz.kind]
            if self.submitted >= self.n_tasks and left == 0:
                fz.state, fz.note = "failed", "no task of its kind was left to claim"
                self.log(f"[yellow]{fz.kind}: no frozen sender ({fz.note})[/]")
            return
        held = self.snapshot().inflight.get(proc.pid, [])
        if len(held) != 1:
            self._retry_freeze(fz, f"it froze holding {len(held)} tasks")
            return
        if self.sqlite_write_lock_held():
            self._retry_freeze(fz, "it froze inside a SQLite write")
            return
        info = self.control.get(held[0])
        fz.task_id, fz.generation = info.task_id, info.generation
        fz.key = f"charge:{info.params['order_id']}"
        fz.state, fz.frozen_at = "frozen", self.now()
        self.log(
            f"[yellow]SIGSTOP[/] {fz.kind}: worker pid {proc.pid} froze itself at "
            f"{_FREEZE_POINT} (lease checked, charge not sent): {fz.key}, generation "
            f"{fz.generation}"
        )

    def _maybe_resume(self, fz: _Freeze) -> None:
        assert fz.proc is not None and fz.task_id is not None and fz.frozen_at is not None
        info = self.control.get(fz.task_id)
        frozen_for = self.now() - fz.frozen_at
        settled = info.state in _SETTLED and info.generation > (fz.generation or 0)
        if frozen_for < self.s.pause_factor * self.lease_s:
            return
        if not settled and frozen_for < self.s.freeze_max_s:
            return
        fz.settled_as = info.state.value if settled else None
        fz.settled_generation = info.generation
        fz.before = self.at_target(fz)
        # The late charge must meet the target itself, not an injected fault.
        with contextlib.suppress(Exception), PaymentClient(self.services[fz.kind].url, 5.0) as c:
            c.set_faults(reply_lost=0.0, burst_503=0.0, slow=0.0)
        fz.proc.resume()
        fz.state, fz.resumed_at = "resumed", self.now()
        what = (
            f"its task was taken over and ended {info.state.value} (generation {info.generation})"
            if settled
            else f"[red]its task was not settled by another worker within "
            f"{self.s.freeze_max_s:.0f} s[/]"
        )
        self.log(
            f"[green]SIGCONT[/] {fz.kind}: frozen sender resumed after {frozen_for:.1f} s "
            f"(lease {self.lease_s:.1f} s); {what}; its charge leaves now"
        )

    def at_target(self, fz: _Freeze) -> tuple[int, int, int]:
        """``(executions, refused tokens, replays)`` of the frozen sender's key, counted in
        its service's own file."""
        service = self.services[fz.kind]
        records = service.records()
        return (
            records.executions.get(fz.key or "", 0),
            sum(1 for r in records.rejections if r.key == fz.key),
            read_replays(service.db_path).get(fz.key or "", 0),
        )

    def _check_late(self, fz: _Freeze) -> None:
        assert fz.resumed_at is not None and fz.task_id is not None
        now = self.at_target(fz)
        executed, refused, replayed = (a - b for a, b in zip(now, fz.before, strict=True))
        late = self.late_effects(fz.task_id)
        waited = self.now() - fz.resumed_at
        # An execution is followed by the late-effect record (or not, at an idempotent
        # target, which replays); give the ledger write a moment.
        if executed and not late and waited < 3.0:
            return
        if not (executed or refused or replayed or late) and waited < 15.0:
            return
        self.restore_faults(fz.kind)
        fz.state, fz.done_at = "done", self.now()
        if refused:
            seen = "the service refused its stale fencing token"
        elif replayed:
            seen = "the service answered it as a replay (nothing charged)"
        elif executed:
            seen = "the service executed it" + (
                f"; the ledger recorded a late effect ({late[0].outcome})"
                if late
                else "; [red]no late effect recorded[/]"
            )
        else:
            seen = "[yellow]nothing reached the service within 15 s[/]"
        self.log(f"{fz.kind}: the frozen sender's late charge: {seen}")

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
            f"late effects [bold]{snap.late_effects}[/]",
        )
        if self.freezes:
            grid.add_row(*(f"frozen {f.kind}: [bold]{f.state}[/]" for f in self.freezes.values()))
        workers = "  ".join(
            f"w{s.index}: pid {s.pid} ({len(snap.inflight.get(s.pid or -1, []))} held)"
            for s in self.slots
        )
        lines = [Text.from_markup(f"[dim]{t:5.1f} s[/] {m}") for t, m in self.events[-5:]]
        return Group(
            Panel(grid, title="ratchet demo: four kinds of payment target", subtitle=workers,
                  expand=False),
            *lines,
        )  # fmt: skip

    # -- main loop

    def run(self) -> int:
        s = self.s
        self.console.print(
            f"[bold]ratchet demo[/]: {self.n_tasks} tasks over {len(KINDS)} kinds of payment "
            f"target, {self.n_workers} workers x {s.concurrency} threads, {self.kills_asked} "
            f"kills, {'a frozen sender per kind, ' if self.freezes else ''}seed {self.seed}, "
            f"lease {self.lease_s:.1f} s"
        )
        self.console.print(f"ledger  {_display_url(self.ledger_url)}\nworkdir {self.workdir}")
        for note in self.notes:
            self.console.print(note)
        for i, kind in enumerate(KINDS):
            self.services[kind] = start_payment_service(
                self.workdir / f"payments-{kind}.db",
                reply_lost=s.reply_lost,
                burst_503=s.burst_503,
                slow=s.slow,
                slow_s=s.slow_s,
                latency_s=s.latency_s,
                honour_keys=SERVICE_OPTIONS[kind]["honour_keys"] and s.honour_keys,
                check_tokens=SERVICE_OPTIONS[kind]["check_tokens"],
                seed=self.seed * 10 + i,
            )
            self.console.print(
                f"payment service [bold]{kind}[/] ({billing.TASKS[kind]}) pid "
                f"{self.services[kind].pid} at {self.services[kind].url}: "
                f"{billing.GUARANTEES[kind]}"
            )
        self.console.print(
            f"faults at every service: reply lost {s.reply_lost:.0%}, 503 bursts "
            f"{s.burst_503:.0%}, slow {s.slow:.0%} x {s.slow_s:.1f} s"
            + ("" if s.honour_keys else ", [bold red]keys NOT honoured[/]")
        )
        self.control.migrate()
        # The would-be frozen senders start first, and the workers only once each of them
        # has frozen (or after FREEZE_HEAD_START_S): each finds a task of its kind however
        # fast the workers would drain the queue.
        for fz in self.freezes.values():
            self.start_freezer(fz)
        workers_started = False

        batches = max(1, min(s.batches, self.n_tasks))
        per_batch = -(-self.n_tasks // batches)
        submit_at = [s.arrival_s * i / batches for i in range(batches)]
        # Kills at random points of progress: one in each of `kills` equal slices of
        # [chaos_from, chaos_to].
        span = s.chaos_to - s.chaos_from
        kill_at = sorted(
            s.chaos_from + span * (k + self.rng.uniform(0.1, 0.9)) / max(1, self.kills_asked)
            for k in range(self.kills_asked)
        )
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
                                billing.TASKS[kind],
                                {"order_id": o, "amount_cents": a},
                                idempotency_key=f"order:{o}",
                            )
                            for o, a, kind in chunk
                        ]
                    )
                    for h, (_, _, kind) in zip(handles, chunk, strict=True):
                        self.task_ids.append(h.task_id)
                        self.kind_of[h.task_id] = kind
                    self.submitted += len(chunk)
                if not resubmitted and self.submitted >= min(self.n_tasks, s.resubmits):
                    resubmitted = True
                    self._resubmit()
                if not workers_started and (
                    all(f.state != "waiting" for f in self.freezes.values())
                    or t >= _FREEZE_HEAD_START_S
                ):
                    workers_started = True
                    for slot in self.slots:
                        self.start_worker(slot)
                    if self.freezes:
                        self.log(f"{len(self.slots)} workers started (frozen senders in place)")
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
                settled = sum(snap.states[x] for x in _SETTLED)
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
                self.tend_freezes(snap)
                live.update(self.progress(snap))
                # done?
                chaos_over = not kill_at and all(f.finished for f in self.freezes.values())
                if (
                    self.submitted >= self.n_tasks
                    and not submit_at
                    and chaos_over
                    and settled == len(self.task_ids)
                ):
                    break
                fingerprint = (
                    tuple(sorted((st.value, n) for st, n in snap.states.items())),
                    snap.takeovers,
                    snap.revocations,
                    tuple(f.state for f in self.freezes.values()),
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
        self.stop_workers()
        for kind in self.services:
            self.restore_faults(kind)
        return self.report()

    def _resubmit(self) -> None:
        picks = self.rng.sample(range(self.submitted), min(self.s.resubmits, self.submitted))
        handles = self.app.submit_many(
            [
                SubmitRequest(
                    billing.TASKS[self.orders[i][2]],
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

    def _judge_kind(
        self,
        kind: str,
        infos: dict[str, TaskInfo],
        key_of: dict[str, str],
        timelines: dict[str, Any],
        late_all: list[LateEffectView],
    ) -> _KindResult:
        """Check ``kind``'s guarantee against its service's own file (see the module doc)."""
        ids = [tid for tid in infos if self.kind_of[tid] == kind]
        records = self.services[kind].records()
        once = check_exactly_once(
            self.ledger_url, records, task_ids=ids, keys={t: key_of[t] for t in ids},
            effect="charge", result_id_field="charge_id", require_terminal=False,
            raise_on_violation=False, timelines=timelines,
        )  # fmt: skip
        mine = set(ids)
        late: dict[str, list[LateEffectView]] = {}
        for le in late_all:
            if le.task_id in mine:
                late.setdefault(le.key, []).append(le)
        states: Counter[State | StoredState] = Counter(infos[t].state for t in ids)
        r = _KindResult(kind, ids, states, once, records, late)
        executions = records.executions
        for key, n in once.duplicated.items():
            explained = sum(1 for le in late.get(key, []) if le.outcome == "done") >= n - 1
            (r.detected if explained else r.undetected)[key] = n
        for tid in ids:
            info = infos[tid]
            n = executions.get(key_of[tid], 0)
            if info.state is State.SUCCEEDED and (
                n == 1 or (kind == "lookup" and key_of[tid] in r.detected)
            ):
                r.exactly += 1
        succeeded = states[State.SUCCEEDED]
        p = r.problems
        if kind == "lookup":
            if r.undetected:
                p.append(f"{len(r.undetected)} duplicated keys not recorded as late effects: "
                         + ", ".join(list(r.undetected)[:3]))  # fmt: skip
        elif once.duplicated:
            p.append(f"{len(once.duplicated)} keys executed more than once: "
                     + ", ".join(list(once.duplicated)[:3]))  # fmt: skip
        if r.exactly != succeeded or once.missing:
            p.append(f"{succeeded - r.exactly} succeeded tasks without exactly one charge"
                     + (f" (never charged: {', '.join(list(once.missing.values())[:3])})"
                        if once.missing else ""))  # fmt: skip
        mismatched = [
            t for t in once.mismatched if not (kind == "lookup" and key_of[t] in r.detected)
        ]
        if mismatched:
            p.append(f"{len(mismatched)} succeeded tasks whose recorded charge id is not the "
                     "service's")  # fmt: skip
        if kind != "neither" and states[State.UNKNOWN]:
            p.append(f"{states[State.UNKNOWN]} tasks UNKNOWN, though the target can settle "
                     "every outcome")  # fmt: skip
        fz = self.freezes.get(kind)
        if fz is not None and fz.state == "done" and fz.settled_as is not None:
            assert fz.key is not None
            n = executions.get(fz.key, 0)
            late_here = late.get(fz.key, [])
            if kind == "fenced" and r.rejected(fz.key) <= fz.before[1]:
                p.append("the frozen sender's late charge was not refused by the service")
            if kind == "lookup" and not (n == 2 and fz.key in r.detected):
                p.append(f"the frozen sender's late charge: {n} executions of {fz.key}, "
                         f"{len(late_here)} late effects (expected 2, recorded)")  # fmt: skip
            if kind == "neither" and not (
                n == 1 and late_here and fz.settled_as == State.UNKNOWN.value
            ):
                p.append(f"the frozen sender's late charge: {n} executions of {fz.key}, "
                         f"{len(late_here)} late effects, task {fz.settled_as} (expected 1, "
                         "recorded, UNKNOWN)")  # fmt: skip
        return r

    def _late_send(self, fz: _Freeze, r: _KindResult) -> tuple[str, str]:
        """``(at the target, in the ledger)``: what became of a frozen sender's late charge."""
        if fz.key is None or fz.state != "done":
            return "-", "-"
        n = r.records.executions.get(fz.key, 0)
        plural = "execution" if n == 1 else "executions"
        executed, refused, replayed = (
            a - b for a, b in zip(self.at_target(fz), fz.before, strict=True)
        )
        late = r.late.get(fz.key, [])
        if refused:
            target = f"[green]refused[/] (stale token {fz.generation}); {n} {plural} in all"
        elif replayed:
            target = f"[green]answered as a replay[/]; {n} {plural} in all"
        elif executed and n > 1:
            target = f"[yellow]executed again[/]: {n} {plural}"
        elif executed:
            target = f"executed; {n} {plural} in all"
        else:
            target = f"[yellow]never arrived[/]; {n} {plural}"
        if late:
            ledger = f"late effect recorded (generation {late[0].generation}, {late[0].outcome})"
        elif executed:
            ledger = "[red]no late effect recorded[/]"
        else:
            ledger = "no late effect (nothing executed)"
        return target, ledger

    def report(self) -> int:
        infos = {i.task_id: i for i in self.control.get_many(self.task_ids)}
        status = self.control.status()
        late_all = self.late_effects()
        service_stats: dict[str, dict[str, Any]] = {}
        for kind, service in self.services.items():
            service_stats[kind] = {}
            with contextlib.suppress(Exception), PaymentClient(service.url, 5.0) as client:
                service_stats[kind] = client.stats()

        states: Counter[State | StoredState] = Counter(i.state for i in infos.values())
        key_of = {tid: f"charge:{i.params['order_id']}" for tid, i in infos.items()}

        # Per-task records from the ledger: effects, retries, releases.
        calls = 0
        retry_classes: Counter[str] = Counter()
        released: Counter[str] = Counter()
        attempts: list[int] = []
        timelines = {tid: self.control.history(tid) for tid in infos}
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

        # The verdict: per kind, ratchet.testing's checks against that service's own file.
        results = {k: self._judge_kind(k, infos, key_of, timelines, late_all) for k in KINDS}
        consistent = check_ledger_consistent(
            self.ledger_url, task_ids=list(infos), raise_on_violation=False,
            timelines=timelines,
        )  # fmt: skip
        reclaims = self._reclaims(events_of)
        unfinished = {
            tid: i.state.value
            for tid, i in infos.items()
            if not i.terminal and not (i.state is State.UNKNOWN and self.kind_of[tid] == "neither")
        }
        stray = {k: n for r in results.values() for k, n in r.once.unexpected.items()}
        resub_ok = all(want == got and not created for want, got, created in self.resubmit_checks)
        why_unfinished = (
            f"stalled {self.s.stall_s:.0f} s" if self.stalled
            else "hard deadline" if self.deadline_hit else ""
        )  # fmt: skip

        invariants: list[tuple[str, bool, str]] = [
            (
                "every task settled (UNKNOWN only where the target offers nothing)",
                not unfinished and not self.stalled and not self.deadline_hit
                and len(infos) == self.n_tasks,
                f"{len(unfinished)} unsettled "
                f"({_fmt_states(Counter(State(v) for v in unfinished.values()))})"
                + (f", {why_unfinished}" if why_unfinished else "")
                if unfinished or why_unfinished
                else f"{len(infos)} of {self.n_tasks}",
            ),
        ]  # fmt: skip
        for kind, r in results.items():
            invariants.append((
                f"{kind}: {billing.GUARANTEES[kind]}",
                not r.problems,
                "; ".join(r.problems) if r.problems
                else f"{r.exactly} of {r.states[State.SUCCEEDED]} succeeded exactly once"
                + (f", {len(r.detected)} duplicate(s) recorded as late effects"
                   if r.detected else "")
                + (f", {r.states[State.UNKNOWN]} UNKNOWN" if r.states[State.UNKNOWN] else ""),
            ))  # fmt: skip
        if self.freezes:
            missing = [f.kind for f in self.freezes.values()
                       if f.state != "done" or f.settled_as is None]  # fmt: skip
            invariants.append((
                "a sender frozen mid-call per kind, resumed after its task was settled",
                not missing,
                f"not achieved for: {', '.join(missing)}" if missing
                else f"{len(self.freezes)} of {len(self.freezes)}",
            ))  # fmt: skip
        invariants += [
            ("no charges for keys outside this run", not stray, f"{len(stray)} stray keys"),
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
        tasks_t.add_row("claims / takeovers", f"{status.claims} / {status.takeovers}")
        tasks_t.add_row("revocations (fast takeover of dead holders)", str(status.revocations))
        tasks_t.add_row("stale-generation rejections", str(status.stale_rejections))
        tasks_t.add_row("late effects (possible duplicates to reconcile)", str(len(late_all)))
        tasks_t.add_row("lookups that found an earlier charge", str(status.lookup_hits))
        tasks_t.add_row(
            "retries: overload / unknown outcome / transient",
            f"{retry_classes['overload']} / {retry_classes['unknown_outcome']} / "
            f"{retry_classes['transient']}",
        )
        tasks_t.add_row(
            "released: lease unconfirmed / shutdown",
            f"{released['lease_unconfirmed']} / {released['shutdown']}",
        )
        tasks_t.add_row("charge calls made", str(calls))
        tasks_t.add_row(
            "attempts per task: max / mean",
            f"{max(attempts, default=0)} / "
            f"{(sum(attempts) / len(attempts)) if attempts else 0:.2f}",
        )

        kinds_t = Table(title="payment targets: counted at each service (its own SQLite file)")
        kinds_t.add_column()
        for kind in KINDS:
            kinds_t.add_column(kind, justify="right")

        def row(label: str, cell: Any) -> None:
            kinds_t.add_row(label, *(cell(results[k], service_stats[k]) for k in KINDS))

        offers = {"idempotent": "key dedupe", "fenced": "fencing tokens",
                  "lookup": "lookup only", "neither": "nothing"}  # fmt: skip
        row("the target offers", lambda r, _: offers[r.kind])
        row("tasks", lambda r, _: str(len(r.task_ids)))
        row("succeeded", lambda r, _: f"[green]{r.states[State.SUCCEEDED]}[/]")
        row("UNKNOWN (needs a person)", lambda r, _: _warn(r.states[State.UNKNOWN]))
        row("failed", lambda r, _: _warn(r.states[State.FAILED]))
        row("charges executed", lambda r, _: str(r.executions))
        row("succeeded with exactly one charge", lambda r, _: str(r.exactly))
        row("keys charged more than once", lambda r, _: (
            _bad(len(r.undetected)) if not r.detected
            else f"[yellow]{len(r.detected) + len(r.undetected)}[/]"))  # fmt: skip
        row("  of which recorded as late effects", lambda r, _: str(len(r.detected)))
        row("late effects recorded (ledger)",
            lambda r, _: str(sum(len(v) for v in r.late.values())))  # fmt: skip
        row("stale fencing tokens refused", lambda r, _: str(r.rejected()))
        row("replays deduplicated by the service", lambda _, st: str(st.get("replays", "?")))
        row("lookups (found)", lambda _, st: (
            f"{st.get('lookups', '?')} ({st.get('lookups_found', '?')})"))  # fmt: skip
        row(
            "injected: lost replies / 503 / slow",
            lambda _, st: "{} / {} / {}".format(
                *(st.get("injected", {}).get(x, "?") for x in ("reply_lost", "503", "slow"))
            ),
        )

        frozen_t = Table(title=f"frozen senders (SIGSTOP at {_FREEZE_POINT}, then SIGCONT)")
        for col in ("target", "charge key (generation)", "frozen for", "meanwhile",
                    "its late charge at the target", "ledger"):  # fmt: skip
            frozen_t.add_column(col)
        for kind, fz in self.freezes.items():
            if fz.frozen_at is None:
                frozen_t.add_row(kind, "-", "-", f"[yellow]not frozen: {fz.note}[/]", "-", "-")
                continue
            until = fz.resumed_at if fz.resumed_at is not None else self.elapsed_s
            at_target, in_ledger = self._late_send(fz, results[kind])
            frozen_t.add_row(
                kind, f"{fz.key} ({fz.generation})", f"{until - fz.frozen_at:.1f} s",
                f"taken over, {fz.settled_as} (generation {fz.settled_generation})"
                if fz.settled_as else "[yellow]not settled by another worker[/]",
                at_target, in_ledger,
            )  # fmt: skip

        chaos = Table(title="chaos", show_header=False)
        chaos.add_column()
        chaos.add_column(justify="right")
        chaos.add_row("workers SIGKILLed (and restarted)", f"{self.kills_done}/{self.kills_asked}")
        chaos.add_row("tasks in flight at the kills", str(sum(self.kill_inflight)))
        for label, value in self._reclaim_rows(reclaims):
            chaos.add_row(label, value)
        chaos.add_row("unexpected worker exits", _warn(self.unexpected_exits))
        chaos.add_row("run time", f"{self.elapsed_s:.1f} s")

        c.print(tasks_t)
        c.print(kinds_t)
        if self.freezes:
            c.print(frozen_t)
        c.print(chaos)
        inv = Table(title="invariants", show_header=False)
        inv.add_column()
        inv.add_column()
        inv.add_column()
        for name, ok, detail in invariants:
            inv.add_row("[green]PASS[/]" if ok else "[bold red]FAIL[/]", name, detail)
        c.print(inv)
        if reclaims.claimed and reclaims.revoked:
            wait = statistics.median(reclaims.first_claim) - statistics.median(reclaims.freed)
            if wait > 1.0:
                c.print(
                    f"[yellow]note:[/] revoked tasks were claimable at once but waited "
                    f"{wait:.1f} s (median) to be claimed again: they re-enter the ready queue "
                    "behind the whole backlog (revoke_holder sets run_at = now)"
                )
        if late_all:
            c.print(
                f"{len(late_all)} late effects are listed for reconciliation by "
                f"`ratchet late-effects --ledger {shlex.quote(_display_url(self.ledger_url))}`."
            )
        if broken:
            c.print(f"[bold red]FAILED[/]: {len(broken)} invariant(s) broken. Logs: {self.workdir}")
            return 1
        frozen = sum(1 for f in self.freezes.values() if f.state == "done")
        c.print(
            f"[bold green]OK[/]: {states[State.SUCCEEDED]} tasks succeeded over {len(KINDS)} "
            f"kinds of payment target, each kind's guarantee held at its service, despite "
            f"{self.kills_done} SIGKILLs"
            + (f" and {frozen} senders frozen mid-call" if frozen else "")
            + f" ({self.elapsed_s:.1f} s)."
        )
        freed_median = statistics.median(reclaims.freed) if reclaims.freed else None
        if freed_median is not None and freed_median < self.lease_s:
            c.print(
                f"Killed workers' tasks were claimable again {freed_median:.2f} s"
                f" after a kill (median), not after a {self.lease_s:.1f} s lease: "
                f"{status.revocations} leases revoked from dead holders."
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


def _fmt_states(states: Counter[State | StoredState]) -> str:
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
        tasks: billing tasks to submit (>= 1), the kinds of payment target in turn.
        workers: worker processes (>= 1), besides one would-be frozen sender per kind.
        kills: SIGKILLs to deliver (at least).
        seed: seed for amounts, chaos timing and the service's faults (None: random,
            printed). Timing still varies between runs.
        workdir: directory for the ledger, the services' databases and the logs; default
            ``./ratchet-demo``. It is wiped on every run.
        settings: finer knobs (:class:`DemoSettings`).
        console: where to print (default: a new Rich console on stdout).

    Returns:
        0 when every invariant holds, 1 when one is broken, 2 when the demo could not run
        (bad arguments, a payment service did not start).
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
        console.print("[yellow]interrupted[/]: stopping workers and the payment services")
        return 130
    finally:
        demo.stop_workers()
        for service in demo.services.values():
            service.stop()
        demo.control.close()
        app.close()


def _main() -> None:
    raise SystemExit(run_demo(None))


if __name__ == "__main__":
    _main()
