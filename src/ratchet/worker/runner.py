"""The worker: claim → execute → fenced commit, with the whole lifecycle in one place.

Lifecycle of one task (``on_claimed`` / ``on_finished`` / ``on_failure`` are methods on
:class:`Worker` that only log by default; metrics and tracing plug in as
:class:`~ratchet.worker.hooks.Middleware` passed as ``Worker(app, middleware=[...])``):

``on_claimed`` → task function runs (``ctx.step`` / ``ctx.effect``) → one of
``SUCCEEDED`` | ``RETRY_WAIT`` (transient/overload, attempts left) | ``FAILED``
(permanent, or attempts exhausted: dead-letter) | ``UNKNOWN`` (effect outcome not
established) | released to ``PENDING`` (graceful shutdown) | abandoned (lease lost or stale
generation: no write, another worker owns it) → ``on_finished``.

Execution model: all writes go through one :class:`~ratchet.worker.writer.LedgerWriter`
(group commit; ``writers`` threads, each with its own transactions, a task's writes always
on the same one), which also claims: every transaction that commits writes claims as many
tasks as the worker has room for (``concurrency + prefetch`` claimed and not finished,
slots reserved while a claim is in flight so concurrent writers never exceed it),
counting the slots its own completions free (one fsync for both). Prefetched tasks wait
in the local queue, leased (the heartbeat renews them) but not started, so a thread that
finishes a task starts the next at once while the completion commits; a task is started
only while the worker is not stopping, its lease is confirmed and a read of the operator
requests at most ``START_CHECK_S`` old (:mod:`ratchet.worker.startcheck`) shows none on it
(a pause is honoured by every start more than that after it returned). Claimed tasks go to a
local queue served by ``concurrency`` long-lived task threads
(:class:`~ratchet.worker.executor.Executor`): a thread that finishes a task takes the next
one without sleeping, and more threads are woken only when work waits. A task's
completion is handed to the writer without waiting; the task keeps its lease (the
heartbeat renews it) and its slot in the concurrency limit until the completion has
committed, and ``on_finished`` fires once the outcome is known. The calling thread only
polls for work when idle, watches for stalled task threads and decides when to stop.
Leases are renewed by one :class:`~ratchet.worker.heartbeat.Heartbeat`. An ``async def``
runner would replace only :meth:`Worker._run_body` with an event loop; the ledger, writer,
heartbeat and context protocol stay as they are.

How a task body can end, and what is recorded (DESIGN §7): a return is ``SUCCEEDED``; an
``Exception`` is classified by :func:`~ratchet.retry.classify`. Every other
``BaseException`` raised by task code also ends the attempt with a recorded outcome, the
lease released and the slot freed, and the worker keeps running: ``SystemExit`` (e.g.
argparse on bad arguments) and ``KeyboardInterrupt`` are permanent failures with
``error_class`` ``"system_exit"`` / ``"keyboard_interrupt"`` (running again cannot
change them); any other ``BaseException`` (``GeneratorExit``, a custom one) is transient.
The worker's own :class:`~ratchet.worker.context.Shutdown` is the exception: it releases
the task to ``PENDING`` at a step boundary. Params, step values or effect results that
cannot be decoded fail the task permanently (``error_class`` ``"undecodable"``), and a
write the database refuses (:class:`~ratchet.errors.WriteRejected`) fails it permanently
(``"write_rejected"``). As everywhere, a failure while an effect's intent is open goes to
``UNKNOWN`` instead of ``FAILED``.

Time limits (DESIGN §7): an attempt of a task type with ``time_limit_s`` that runs longer
is ended by the watchdog thread (:mod:`ratchet.worker.timelimit`) as a failed attempt
(``error_class`` ``"time_limit"``: ``RETRY_WAIT`` with backoff, ``FAILED`` on the last
attempt, ``UNKNOWN`` then if an effect's intent is open), written by this holder at the
attempt's generation. Its lease is no longer trusted (no new effect call can start) nor
renewed, its slot is freed, and its task thread, which Python cannot kill, is replaced by
a fresh one; the stuck thread's next ``ctx.step`` / ``ctx.effect`` raises
:class:`~ratchet.errors.TimeLimitExceeded`, and whatever it writes later is fenced out.
Stuck threads are counted (``stats.stuck_threads``); at ``max_stuck_threads`` the worker
stops itself, for a restart.
Operator requests (issue 10, DESIGN §3 arbitration): a cancel or pause the heartbeat has
read for a lease (:attr:`~ratchet.worker.heartbeat.LeaseHandle.request`) makes the task's
next step/effect boundary raise :class:`~ratchet.worker.context.ControlInterrupt` (never
while an effect intent is open: it is settled first), which becomes the fenced ``RUNNING
-> CANCELLED`` or ``RUNNING -> PAUSED`` (lease released, attempt handed back), carrying
the pipelined checkpoints; a task claimed with a request is not started unless it must
settle an open intent first.

Signals: the first SIGTERM/SIGINT stops claiming; running tasks finish their current
step, then are released at the next step/effect boundary (their committed steps stay);
claimed tasks not started yet (prefetched) are released at once without running (to
``PENDING``, attempt handed back; ``on_claimed``, ``before_attempt`` and
``after_attempt`` still fire for them, with outcome ``"PENDING"``). Tasks still in task
code when ``shutdown_grace_s`` ends have their leases handed back (a fenced release to
``PENDING``, attempt handed back) and :meth:`Worker.run` returns although their threads are
stuck. A second SIGTERM/SIGINT ends the grace at once (warm, then cold shutdown); one
within :data:`SIGNAL_REPEAT_S` of the previous is the same signal delivered twice (process
managers, ``timeout`` signalling the whole group) and changes nothing; a third exits at
once. SIGKILL loses nothing: leases expire and are taken over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import os
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import tenacity

from .. import faults
from ..app import App, TaskDefinition
from ..errors import (
    EXIT_LEDGER_CORRUPT,
    CircuitOpen,
    ConfigError,
    EffectOutcomeUnknown,
    FenceError,
    LeaseLost,
    LedgerCorrupt,
    LedgerUnavailable,
    RatchetError,
    StaleGeneration,
    TimeLimitExceeded,
    TokenRejected,
    UndecodableData,
    WriteRejected,
)
from ..errortext import bounded, error_message, error_summary, error_traceback
from ..fingerprint import of_exception
from ..ledger.base import (
    BudgetUse,
    Claim,
    CommitOutcome,
    DefinitionSpec,
    Subscription,
    TaskWrite,
    Transition,
)
from ..observe import tracing
from ..outcome import AttemptFacts, Happened, decide
from ..retry import TIME_LIMIT, FailureClass, classify, downstream_unreachable, retry_after_s
from ..serde import dumps
from ..states import State
from ..validation import MAX_NAME_BYTES, check_identifier
from .backoff import RepeatedFailure
from .context import ControlInterrupt, Shutdown, TaskContext
from .executor import Executor
from .forks import Descendants, exit_forked_child, install_signal_handler
from .heartbeat import Heartbeat, LeaseHandle
from .hooks import Hooks, Middleware
from .registry import Registrar
from .retention import Pruner
from .startcheck import StartCheck
from .timelimit import ENDED_BY_SHUTDOWN_GRACE, Attempt, Attempts
from .writer import LedgerWriter

__all__ = [
    "DEFAULT_SHUTDOWN_GRACE_S",
    "EXIT_HANDED_BACK",
    "EXIT_LEDGER_CORRUPT",
    "EXIT_STUCK_THREADS",
    "MAX_CONCURRENCY",
    "MAX_POLL_INTERVAL_S",
    "MAX_PREFETCH",
    "MAX_STUCK_THREADS",
    "MAX_WRITERS",
    "Worker",
    "WorkerStats",
    "default_holder",
    "default_max_stuck_threads",
    "default_prefetch",
    "default_writers",
]

log = logging.getLogger("ratchet.worker")


def default_holder() -> str:
    """``host:pid:random`` — unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def default_prefetch(concurrency: int) -> int:
    """Default :class:`Worker` ``prefetch`` for ``concurrency`` threads:
    ``min(32, max(4, 4 * concurrency))`` (Celery's prefetch multiplier of 4, capped).

    Why: without prefetch a single-thread worker runs one task per transaction and its
    body never overlaps the commit. Measured with ``bench/sqlite_throughput.py --repeat 2
    --concurrency 1,32 --durability fsync --variants step --prefetch 0,4,8,16,32`` (20,000
    no-op tasks, one worker process, 2 shared cores; huey ``-w 1`` 2,473 tasks/s in the
    same run): C=1 826 tasks/s with prefetch 0, 4,449 with 4, 4,760 with 8, 5,546 with
    16; C=32 7,006 with 0, 8,531 with 8, 10,326 with 16, 9,568 with 32. Most of the
    gain comes with the first few tasks (the body overlaps the commit, ~5 completions
    per fsync at C=1); beyond that it flattens while more tasks sit leased and unstarted
    in one process, where another worker cannot take them (a graceful stop releases
    them; a crash leaves them to lease expiry, like running ones). Long tasks spread
    over several workers want a small prefetch (``0``). At the default concurrency (8) on
    PostgreSQL, one process draining 20,000 one-step tasks: 3,627-3,990 tasks/s with
    prefetch 8, 4,977 with 16, 5,693 with 32 (two interleaved runs, 2026-11-30): the claim
    and completion batches grow with what a worker holds, hence 4 per thread up to 32.
    """
    return min(32, max(4, 4 * concurrency))


def default_writers(ledger: object) -> int:
    """Default :class:`Worker` ``writers`` for ``ledger``: its ``default_writers``
    attribute if it has one (an int >= 1), else 1.

    Why 1 on both ledgers: SQLite has one write lock, so a second writer thread would only
    wait for it. On PostgreSQL more writers overlap transactions, which pays only while
    the database server has CPU to spare: N writers cut each writer's batches by about N,
    so a task costs the server more (more BEGIN/fence/COMMIT/fsync per task). Measured on 2
    shared cores (server and workers on one host) with ``bench/pg_throughput.py --repeat 1
    --processes 1,4 --concurrency 32,128 --durability fsync --variants step --claim-sizes ''
    --latency-count 0 --rss-tasks 0 --enqueue-threads '' --no-pgqueuer``, 20,000 no-op
    tasks, three interleaved rounds at load ~1: 1 process C=128 8,580 / 8,826 / 8,025
    tasks/s with 1 writer against 9,778 / 8,834 / 7,988 with 2 (eight more 1-process rounds
    at C=128: 2 writers ahead by 0-25% when the host was quiet, behind when it was busy;
    3 writers no better than 2); 4 processes C=32 12,862 / 12,736 / 11,686 with 1 against
    8,855 / 8,753 / 8,226 with 2, C=128 14,128 / 14,944 / 13,324 against 12,065 / 12,316 /
    11,159 (twice the transactions on a saturated server). Pass ``writers=2`` for one busy
    worker process against a PostgreSQL server with cores to spare.
    """
    attr = getattr(ledger, "default_writers", None)
    if isinstance(attr, int) and not isinstance(attr, bool) and attr >= 1:
        return attr
    return 1


_STALL_S = 0.005
"""Queued tasks not picked up for this long (s) while task threads are busy: wake another."""

DEFAULT_SHUTDOWN_GRACE_S = 25.0
"""Default :class:`Worker` ``shutdown_grace_s``, seconds: how long running tasks get, after
SIGTERM / Ctrl-C, to reach their end or a step boundary before the worker hands their
leases back and exits. A few seconds below Kubernetes' default
``terminationGracePeriodSeconds`` (30 s), after which it sends SIGKILL, so the hand-back
(one ledger transaction) happens before the kill; set it below your process manager's
own kill timeout (``docker stop``: 10 s, systemd ``TimeoutStopSec``: 90 s)."""

SIGNAL_REPEAT_S = 0.5
"""A SIGTERM / SIGINT within this many seconds of the previous one is the same stop
delivered twice (to the process group and to the process, e.g. by ``timeout`` and a
process manager), not a request to hurry."""

EXIT_HANDED_BACK = 3
"""``ratchet worker`` exit status when the shutdown grace ended (or a second signal came)
while task threads were still inside task code: their leases were handed back."""

EXIT_STUCK_THREADS = 4
"""``ratchet worker`` exit status when the worker stopped itself because
``max_stuck_threads`` task threads were stuck past their attempt's end: restart it."""


MAX_CONCURRENCY = 1024
"""Most task threads one worker process runs (``concurrency``). Each is an OS thread with
its stack, and all share one interpreter lock: past a few hundred, more threads add
contention, not throughput; run more processes instead."""

MAX_PREFETCH = 1024
"""Most tasks one worker holds claimed beyond ``concurrency`` (``prefetch``). A prefetched
task is leased and renewed but not running, and no other worker can take it: past the
default's 32 the claim and completion batches stop growing (see :func:`default_prefetch`)
while more work sits hidden in one process."""

MAX_WRITERS = 32
"""Most writer threads (``writers``): each holds a ledger connection and runs transactions
of its own; more than the database has cores only queues."""

MAX_STUCK_THREADS = 4 * MAX_CONCURRENCY
"""Largest ``max_stuck_threads``: every stuck thread stays in the process until it returns
(stack, sockets, memory), so a larger cap is no cap."""

STUCK_CONFIRM_S = 1.0
"""Seconds a thread taken from its attempt (time limit) must stay in task code before it
counts towards ``max_stuck_threads``: a body that ends a few milliseconds past its limit
is not stuck, and on a loaded host every thread can be in that moment at once."""

MAX_POLL_INTERVAL_S = 60.0
"""Longest ``poll_interval_s`` (seconds): an idle worker on SQLite (no NOTIFY) finds new
work only when it polls."""


def _check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int in ``[low, high]``; else ``ConfigError`` naming the
    option and both limits."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"Worker {name} must be an integer from {low} to {high}, got "
                          f"{value!r}")
    return value


def _check_seconds(name: str, value: object, *, above_zero: bool = False,
                   high: float = math.inf) -> float:
    """``value`` as a number of seconds: finite (or up to ``high``), at least 0 (above 0
    when ``above_zero``); else ``ConfigError`` naming the option and its range."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or value < 0 or (above_zero and value == 0)
            or value > high):
        bound = "> 0" if above_zero else ">= 0"
        top = f" and <= {high:g}" if high < math.inf else ""
        raise ConfigError(f"Worker {name} must be a finite number of seconds {bound}{top}, "
                          f"got {value!r}")
    return float(value)


def default_max_stuck_threads(concurrency: int) -> int:
    """Default :class:`Worker` ``max_stuck_threads``: ``max(4, concurrency)``.

    Why: a thread stuck in task code past its time limit cannot be killed; the worker
    starts another in its place, so each stuck thread adds one thread, its stack and
    whatever it holds (sockets, memory, CPU if it spins) to the process. Up to as many as
    the worker runs (at least 4, so a one-thread worker survives a few hangs) the process
    runs at most about twice its threads; past that only a restart frees them."""
    return max(4, concurrency)


class _Policy:
    """The worker's claim policy as the writer sees it."""

    def __init__(self, worker: Worker) -> None:
        self.holder = worker.holder
        self.names = worker.kinds
        self._worker = worker

    def limit(self, freed: int, forced: bool) -> int:
        return self._worker._reserve(freed, forced)

    def dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        self._worker._dispatch(claims, t_sent, reserved, freed)

    def release(self, reserved: int, freed: int) -> None:
        self._worker._release(reserved, freed)

    def claim_failed(self, error: BaseException) -> None:
        if isinstance(error, LedgerCorrupt):
            self._worker._stop_corrupt(error)


UNDECODABLE = "undecodable"
"""``error_class`` of a task failed because a value stored for it (params, a step value, an
effect result) cannot be decoded (:class:`~ratchet.errors.UndecodableData`)."""

WRITE_REJECTED = "write_rejected"
"""``error_class`` of a task failed because the database refused one of its writes."""

_BASE_EXCEPTION_CLASSES: dict[type[BaseException], str] = {
    SystemExit: "system_exit",
    KeyboardInterrupt: "keyboard_interrupt",
}
"""``BaseException`` types raised by task code that fail the task permanently, with the
``error_class`` recorded. Any other ``BaseException`` from task code is transient."""


class _StopWhenLost(tenacity.stop.stop_base):
    """tenacity stop condition: the lease is known lost (a re-sent write would be stale)."""

    def __init__(self, lease: LeaseHandle) -> None:
        self._lease = lease

    def __call__(self, retry_state: tenacity.RetryCallState) -> bool:
        return self._lease.lost


@dataclass
class WorkerStats:
    """Counters of one worker process (since start).

    Task threads, the writer thread and the heartbeat all count, so every update goes
    through :meth:`add` / :meth:`add_outcome`, which hold one lock (a ``+=`` on an
    attribute is not atomic). Reading one counter needs no lock; :meth:`snapshot` reads
    them all consistently.
    """

    claimed: int = 0
    takeovers: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    released: int = 0
    cancelled: int = 0
    paused: int = 0
    stale: int = 0
    lease_lost: int = 0
    time_limited: int = 0
    """Attempts ended at their task type's time limit (``time_limit_s``)."""
    handed_back: int = 0
    """Leases handed back (released to ``PENDING``) when the shutdown grace ended or a
    second signal came, their task threads still in task code."""
    stuck_threads: int = 0
    """Task threads now inside the code of an attempt that was ended without them (time
    limit, shutdown grace): a gauge, not a counter (DESIGN §7, time limits)."""
    by_outcome: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Not a dataclass field: asdict(), repr and == see only the counters.
        self._lock = threading.Lock()

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to the integer counter named ``counter`` (e.g. ``"succeeded"``)."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + n)

    def add_outcome(self, outcome: str) -> None:
        """Count one attempt that ended with ``outcome`` in :attr:`by_outcome`."""
        with self._lock:
            self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """Every counter at one instant (``dataclasses.asdict``): ``{name: int}`` plus
        ``by_outcome`` (a copy)."""
        with self._lock:
            return asdict(self)


class Worker:
    """Runs tasks of an :class:`~ratchet.app.App` from its ledger.

    Args:
        app: the application (its registered tasks are the ones claimed).
        concurrency: task threads (>= 1).
        names: task names to claim; default all registered. The worker claims every
            version its app defines of each (``kinds``), never another, and registers
            those definitions in the ledger when it starts (DESIGN §8).
        poll_interval_s: sleep between claim attempts when idle, seconds.
        holder: worker identity; default ``host:pid:random``. Must be a storable
            identifier (no NUL or lone surrogate, at most 200 UTF-8 bytes), else
            ``InvalidArguments``.
        prefetch: tasks claimed beyond ``concurrency`` and held locally, leased (the
            heartbeat renews them) but not started, so a thread that finishes a task
            starts the next one at once while the previous completion commits, and the
            completions of several tasks share one transaction. At most ``concurrency``
            bodies still run at once. Default :func:`default_prefetch` (4 per thread,
            at least 4, at most 32); 0 claims only for free threads. A prefetched task not
            started when the worker stops is released (``PENDING``, attempt handed back)
            without running.
        max_batch: most task writes merged into one group commit.
        writers: writer threads, each committing (and claiming) in transactions of its own
            on its own ledger connection; a task's writes always go to the same one.
            Default (None) :func:`default_writers`: 1 (SQLite has one write lock; on
            PostgreSQL more pay only while the server has CPU to spare). More than the
            ledger's connection pool (PostgreSQL ``pool_size``, default 4, shared with the
            heartbeat and task threads' reads) only queues.
        claim_linger_s: when fewer than a quarter of the slots are free but tasks are still
            running, claims wait for more slots to free (they ride on the commit of the
            completions that free them); after this long (seconds) without a claim the
            free slots are claimed anyway.
        fast_takeover: register in the ledger's worker registry and revoke the leases of
            same-host workers whose process is gone (:mod:`ratchet.worker.registry`).
        middleware: lifecycle hooks (:class:`~ratchet.worker.hooks.Middleware`), called
            in this order; none by default. When OpenTelemetry tracing is enabled
            (:func:`ratchet.observe.tracing.enabled`) a
            :class:`~ratchet.observe.tracing.TracingMiddleware` is put first unless one
            is given.
        shutdown_grace_s: seconds running tasks get, once the worker stops (SIGTERM,
            Ctrl-C, :meth:`stop`), to reach their end or a step boundary (where they are
            released); after it their leases are handed back (a fenced release to
            ``PENDING``, attempt not counted) and :meth:`run` returns, even if a task thread
            is still stuck in task code. Default :data:`DEFAULT_SHUTDOWN_GRACE_S` (25 s).
        max_stuck_threads: when this many task threads are stuck inside the code of an
            attempt the worker already ended (time limit), the worker stops (as on
            SIGTERM) so that its process manager restarts it (``ratchet worker`` exits
            with :data:`EXIT_STUCK_THREADS`). Default :func:`default_max_stuck_threads`.
        prune_older_than_s: prune (``Ledger.prune``) tasks finished longer ago than this
            many seconds in a background thread (:mod:`ratchet.worker.retention`); None
            (the default): no pruning.
        prune_every_s: seconds between those prunes (jittered), default 3600.
        stop_descendants: when :meth:`run` ends (stop, SIGTERM, ``max_stuck_threads``),
            stop the processes that appeared below this process while it ran (children
            forked by task code, subprocesses never waited for, their children, and those
            started meanwhile): SIGTERM, SIGKILL after
            :data:`~ratchet.worker.forks.DESCENDANT_GRACE_S`, each logged
            (:mod:`ratchet.worker.forks`). On Linux the process is a child subreaper while
            :meth:`run` runs, so orphans (double forks) stay below it and are stopped
            too; run on the main thread, those that end meanwhile are reaped every
            :data:`~ratchet.worker.forks.REAP_EVERY_S` seconds. ``ratchet worker`` sets
            it; off by default in process, where other threads of the application may own
            such processes.
        overload_floor_s: the floor of the retry delay after an overload failure, seconds,
            for every task this worker runs, in place of each ``RetryPolicy``'s
            ``overload_min_delay_s`` (5 s by default): for tests against a flaky fake
            (``running_worker(app, overload_floor_s=0.05)``). None (the default): each
            policy's own floor. A downstream's ``Retry-After`` hint still applies.

    Raises:
        ConfigError: ``concurrency`` not an integer from 1 to :data:`MAX_CONCURRENCY`,
            ``prefetch`` not from 0 to :data:`MAX_PREFETCH`, ``writers`` not from 1 to
            :data:`MAX_WRITERS`, ``poll_interval_s`` not above 0 and at most
            :data:`MAX_POLL_INTERVAL_S`, ``shutdown_grace_s`` not a finite number >= 0,
            ``max_stuck_threads`` not from 1 to :data:`MAX_STUCK_THREADS`,
            ``prune_older_than_s`` negative, ``prune_every_s`` not positive or
            ``overload_floor_s`` not None or a finite number >= 0.
        UnknownTask: a name in ``names`` is not registered.
    """

    def __init__(
        self,
        app: App,
        concurrency: int = 8,
        names: Sequence[str] | None = None,
        poll_interval_s: float = 0.1,
        holder: str | None = None,
        max_batch: int = 256,
        claim_linger_s: float = 0.002,
        fast_takeover: bool = True,
        middleware: Sequence[Middleware] = (),
        prefetch: int | None = None,
        writers: int | None = None,
        shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S,
        max_stuck_threads: int | None = None,
        prune_older_than_s: float | None = None,
        prune_every_s: float = 3600.0,
        stop_descendants: bool = False,
        overload_floor_s: float | None = None,
    ) -> None:
        if overload_floor_s is not None:
            overload_floor_s = _check_seconds("overload_floor_s", overload_floor_s)
        self.overload_floor_s = overload_floor_s
        if prune_older_than_s is not None and not 0 <= prune_older_than_s < float("inf"):
            raise ConfigError(f"Worker prune_older_than_s must be a finite number of seconds "
                              f">= 0, got {prune_older_than_s!r}")
        if not 0 < prune_every_s < float("inf"):
            raise ConfigError(f"Worker prune_every_s must be a finite number of seconds > 0, "
                              f"got {prune_every_s!r}")
        self.prune_older_than_s = prune_older_than_s
        self.prune_every_s = prune_every_s
        self.stop_descendants = stop_descendants
        self._descendants: Descendants | None = None
        self._pid = os.getpid()  # the worker's process (run() sets it): not a forked child
        self.pruner: Pruner | None = None
        concurrency = _check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
        if prefetch is None:
            prefetch = default_prefetch(concurrency)
        prefetch = _check_int("prefetch", prefetch, 0, MAX_PREFETCH)
        if writers is None:
            writers = default_writers(app.ledger)
        writers = _check_int("writers", writers, 1, MAX_WRITERS)
        poll_interval_s = _check_seconds("poll_interval_s", poll_interval_s, above_zero=True,
                                         high=MAX_POLL_INTERVAL_S)
        shutdown_grace_s = _check_seconds("shutdown_grace_s", shutdown_grace_s)
        if max_stuck_threads is None:
            max_stuck_threads = default_max_stuck_threads(concurrency)
        max_stuck_threads = _check_int("max_stuck_threads", max_stuck_threads, 1,
                                       MAX_STUCK_THREADS)
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.max_stuck_threads = max_stuck_threads
        self.stop_reason: str | None = None
        """Why :meth:`run` ended early, if it did: ``"stuck_threads"`` (the cap was
        reached), ``"ledger_corrupt"`` (a claim raised :class:`LedgerCorrupt`); None
        otherwise."""
        self.app = app
        self.concurrency = concurrency
        self.prefetch = prefetch
        self._capacity = concurrency + prefetch  # claimed and not finished, at most
        self.names = list(names) if names is not None else sorted(app.tasks)
        for name in self.names:
            app.definition(name)
        self.kinds: list[tuple[str, int]] = [
            (name, version) for name in self.names for version in sorted(app.versions[name])
        ]
        """The (name, version) pairs this worker claims: every version its app defines of
        each name in ``names``; a task pinned to another version is never claimed here."""
        self.poll_interval_s = poll_interval_s
        self.claim_linger_s = claim_linger_s
        self.fast_takeover = fast_takeover
        self._claim_batch = max(1, self._capacity // 4)
        self.holder = (
            default_holder() if holder is None
            else check_identifier(holder, "worker holder", MAX_NAME_BYTES)
        )
        self.ledger = app.ledger
        self.writers = writers
        self.writer = LedgerWriter(self.ledger, max_batch=max_batch, writers=writers)
        self.heartbeat = Heartbeat(self.ledger, self.holder)
        self.final_commit_failures = RepeatedFailure("final commit", log, level=logging.WARNING)
        """Log throttling of final writes sent again while the ledger is unreachable (all
        tasks together: a full disk fails every one of them at once)."""
        self._start_check = StartCheck(self.heartbeat)
        self.stats = WorkerStats()
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        traced = tracing.auto_middleware(self.middleware)  # DESIGN §9: first, if enabled
        if traced is not None:
            self.middleware = (traced, *self.middleware)
        self._hooks: Hooks | None = Hooks(self, self.middleware) if self.middleware else None
        self.writer.hooks = self._hooks
        self.heartbeat.hooks = self._hooks
        self._stopping = threading.Event()
        self._wake = threading.Event()
        # Claimed and not finished: prefetched, running, completion not yet committed.
        self._inflight = 0
        # Claims in flight (a writer thread asked, no answer yet): tasks asked for, and
        # the slots they take beyond those their own transaction's completions free.
        self._reserved = 0
        self._reserved_room = 0
        self._lock = threading.Lock()
        self._signals = 0
        self._max_tasks: int | None = None
        self._last_claimed_at = float("-inf")  # monotonic: last claim that returned work
        self._notified = False  # the ledger said work may be ready: poll now
        self._executor: Executor[tuple[Claim, LeaseHandle]] = Executor(
            concurrency, self._execute
        )
        self._attempts = Attempts(self._on_time_limit, self._taken_from_thread)
        self._stop_began: float | None = None  # monotonic: the shutdown grace runs from it
        self._last_signal_at = float("-inf")
        self._cold = False  # a second signal: hand the leases back now

    # ------------------------------------------------------------------ hooks

    def on_claimed(self, claim: Claim) -> None:
        """Hook: a task was claimed (before its body runs)."""
        log.debug(
            "claimed %s %s gen=%d attempt=%d%s", claim.name, claim.task_id, claim.generation,
            claim.attempt, f" takeover from {claim.previous_holder}" if claim.takeover else "",
        )

    def on_finished(self, claim: Claim, outcome: str) -> None:
        """Hook: the worker is done with a claim; ``outcome`` is the state written or
        ``"stale"`` / ``"lease_lost"`` / ``"abandoned"``."""
        log.debug("finished %s %s gen=%d: %s", claim.name, claim.task_id, claim.generation, outcome)

    def on_failure(self, claim: Claim, transition: Transition) -> None:
        """Hook: a task is about to be retried, dead-lettered or parked as UNKNOWN.

        Logs one WARNING line (ERROR for FAILED / UNKNOWN) with the task, the attempt and
        the error's type and message (its first line); the traceback at DEBUG.
        """
        summary = error_summary(transition.error)
        level = logging.WARNING if transition.to is State.RETRY_WAIT else logging.ERROR
        extra = f" in {transition.delay_s:.2f} s" if transition.to is State.RETRY_WAIT else ""
        log.log(
            level, "task %s %s gen=%d attempt %d/%d -> %s%s (%s): %s", claim.name,
            claim.task_id, claim.generation, claim.attempt, claim.max_attempts,
            transition.to.value, extra, transition.reason or transition.error_class, summary,
        )
        if log.isEnabledFor(logging.DEBUG) and (transition.traceback or transition.error):
            log.debug("task %s error:\n%s\n%s", claim.task_id, transition.error or "",
                      transition.traceback or "")

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop claiming; running tasks are released at their next boundary, or their
        leases handed back when the shutdown grace ends (``shutdown_grace_s``)."""
        if self._stop_began is None:
            self._stop_began = time.monotonic()
        self._stopping.set()
        self._wake.set()

    @property
    def exit_code(self) -> int:
        """The ``ratchet worker`` exit status for how :meth:`run` ended: 0 (stopped, every
        running attempt ended or was released at a step boundary),
        :data:`EXIT_HANDED_BACK` (the grace ended or a second signal came: leases of
        running tasks handed back), :data:`EXIT_STUCK_THREADS` (stopped itself at
        ``max_stuck_threads``; restart it), :data:`EXIT_LEDGER_CORRUPT` (stopped itself on a
        corrupt ledger; restore it before restarting)."""
        if self.stop_reason == "ledger_corrupt":
            return EXIT_LEDGER_CORRUPT
        if self.stop_reason == "stuck_threads":
            return EXIT_STUCK_THREADS
        if self.stats.handed_back:
            return EXIT_HANDED_BACK
        return 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only flags, never self._wake: the handler runs on the main thread, which may be
        # inside self._wake.wait()/clear() holding the Event's (non-reentrant) lock;
        # setting _wake here would deadlock the worker on its own SIGTERM. Nothing waits on
        # _stopping, and every wait of the main loop is bounded (poll interval, 0.05 s in
        # the shutdown grace).
        now = time.monotonic()
        if self._signals and now - self._last_signal_at < SIGNAL_REPEAT_S:
            log.info("signal %d: already stopping", signum)
            return
        self._signals += 1
        self._last_signal_at = now
        if self._signals == 1:
            log.info("signal %d: stop claiming; running tasks are released at their next "
                     "step, or their leases handed back in %g s (shutdown grace; a second "
                     "signal: now)", signum, self.shutdown_grace_s)
            if self._stop_began is None:
                self._stop_began = now
            self._stopping.set()
        elif self._signals == 2:
            log.warning("signal %d again: handing back the leases of running tasks now, "
                        "then exiting", signum)
            self._cold = True
            self._stopping.set()
        else:
            log.warning("signal %d a third time: exiting now (leases will expire and be "
                        "taken over)", signum)
            if self._descendants is not None:
                with contextlib.suppress(Exception):
                    self._descendants.stop(grace_s=0.0)
            os._exit(1)

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker gracefully; a second one (more than
        :data:`SIGNAL_REPEAT_S` later) ends the grace at once; a third exits at once
        (main thread only). A child forked from the worker gets the handlers it replaced
        back (:func:`~ratchet.worker.forks.install_signal_handler`): ``kill`` ends it."""
        install_signal_handler(signal.SIGTERM, self._on_signal)
        install_signal_handler(signal.SIGINT, self._on_signal)

    # ------------------------------------------------------------------ main loop

    def run(self, max_tasks: int | None = None, idle_exit_s: float | None = None) -> WorkerStats:
        """Claim and run tasks until stopped.

        Args:
            max_tasks: stop after this many claims (tests, benchmarks).
            idle_exit_s: stop after this many seconds without claimable work: nothing
                in flight, no claim in progress and none that returned work meanwhile.

        Returns:
            The worker's counters.
        """
        self._max_tasks = max_tasks
        self._pid = os.getpid()
        if self.stop_descendants:
            # What is there now is not the tasks'; orphans below are reparented to the worker.
            self._descendants = Descendants(subreaper=True)
        hooks = self._hooks
        if hooks is not None:
            hooks.worker_start()
        self.writer.set_claim_policy(_Policy(self))
        self.writer.start()
        self.heartbeat.start()
        self._attempts.start()
        self._register_definitions()
        registrar: Registrar | None = None
        if self.fast_takeover:
            registrar = Registrar(self.ledger, self.holder)
            try:
                registrar.register()
            except RatchetError as exc:  # the registrar thread tries again
                log.warning("worker registry: %s", exc)
            registrar.start()
        if self.prune_older_than_s is not None:
            self.pruner = Pruner(self.ledger, self.holder, self.prune_older_than_s,
                                 self.prune_every_s)
            self.pruner.start()
        subscription: Subscription | None = None
        idle_since = time.monotonic()
        last_poll = float("-inf")
        linger = max(self.claim_linger_s, 0.0)
        try:
            # Wake the claim loop as soon as the ledger says work may be ready (PostgreSQL
            # LISTEN/NOTIFY); the poll interval stays the fallback.
            subscription = self.ledger.subscribe(self._on_notify)
            while not self._stopping.is_set():
                now = time.monotonic()
                inflight = self._inflight
                if max_tasks is not None and self.stats.claimed >= max_tasks and inflight == 0:
                    break
                if inflight:  # idle counts from when the last task left, not from its claim
                    idle_since = now
                idle_since = max(idle_since, self._last_claimed_at)
                if idle_exit_s is not None and inflight == 0 and now - idle_since >= idle_exit_s:
                    if max(last_poll, self.writer.last_claim_at) < idle_since:
                        # No claim tried since the worker became idle (a slow start-up, e.g.
                        # the LISTEN connection): try one before leaving.
                        self._notified = True
                    else:
                        # A claim asked for or in progress may yet return work: let it end
                        # first (else its tasks would be claimed only to be handed back).
                        self.writer.sync()
                        if self._inflight == 0 and self._last_claimed_at <= idle_since:
                            break
                        continue
                # Busy: claims ride on the writer's commits. Poll only when nothing was
                # tried for a while (idle, or a few threads free while long tasks run).
                # Room for prefetch alone never polls: it is filled by the claims riding
                # on completions (a worker whose threads are all busy adds no transaction).
                wait_s = self.poll_interval_s
                if self._claim_limit(0, forced=True) > 0:
                    last_try = max(self.writer.last_claim_at, last_poll)
                    due = last_try + (
                        linger if 0 < inflight < self.concurrency else self.poll_interval_s
                    )
                    if self._notified or now >= due:
                        self._notified = False
                        self.writer.poll()
                        last_poll = now
                    else:
                        wait_s = min(wait_s, due - now)
                if self._executor.check_stalled(_STALL_S):
                    wait_s = min(wait_s, _STALL_S)
                self._wake.wait(max(wait_s, 0.0005))
                self._wake.clear()
        finally:
            self._stopping.set()
            if self._stop_began is None:
                self._stop_began = time.monotonic()
            grace_ends = self._stop_began + self.shutdown_grace_s
            if subscription is not None:
                subscription.close()
            try:
                self.writer.sync()  # a claim in progress has been handed to the executor
                # Prefetched tasks not started yet are released now (PENDING, attempt
                # handed back), not after the running ones reach a boundary: another
                # worker can take them at once. A task body never starts after stop
                # (_run_body checks), so this is about promptness, not safety.
                for item in self._executor.take_queued():
                    self._execute(item)
            finally:
                # Running tasks get until the grace ends to reach their end or a step
                # boundary (where they are released); then their leases are handed back.
                self._executor.close()
                while not self._executor.join(0.05):
                    if self._cold or time.monotonic() >= grace_ends:
                        self._hand_back(
                            "second signal" if self._cold
                            else f"shutdown grace of {self.shutdown_grace_s:g} s ended")
                        break
                self._attempts.stop()
                self.writer.stop()
                self.writer.join()  # final writes committed, on_finished fired
                if registrar is not None:
                    registrar.stop(clean=True)
                if self.pruner is not None:
                    self.pruner.stop()
                self.heartbeat.stop()
                self.heartbeat.join(timeout=5)
                if self._descendants is not None:
                    self._descendants.stop()
                if hooks is not None:
                    hooks.worker_stop()
        return self.stats

    def _register_definitions(self) -> None:
        """Record this worker's definitions in the ledger (DESIGN §8): each (name, version)
        with its spec, and which pairs this holder has (``ratchet status`` shows tasks of a
        version no live worker has). A stored spec that differs under the same version is
        replaced and audited; it is logged here as a warning naming the differences. A
        ledger error is logged and not retried: claims do not depend on it (they carry the
        pairs), only the status view does."""
        specs = [
            DefinitionSpec(d.name, d.version, dumps(d.spec()))
            for name in self.names for d in (self.app.definition(name, v)
                                             for v in sorted(self.app.versions[name]))
        ]
        try:
            changes = self.ledger.register_definitions(self.holder, specs)
        except RatchetError as exc:
            log.warning("could not register definitions in the ledger: %s", exc)
            return
        for change in changes:
            log.warning(
                "definition %s version %d registered with a different %s than stored; the "
                "new spec replaces it (audited as definition_changed). Give a changed "
                "definition a new version= so tasks pinned to the old one keep it",
                change.name, change.version, ", ".join(change.differences))

    def _on_notify(self) -> None:
        """The ledger says work may be ready, or an operator recorded a request (e.g.
        PostgreSQL NOTIFY): poll now, and let the heartbeat read the requests."""
        self._notified = True
        self._wake.set()
        self.heartbeat.poke_control()

    # ------------------------------------------------------------------ claims

    def _claim_limit(self, freed: int, forced: bool) -> int:
        """How many tasks to claim now; ``freed``: completions in the transaction being
        built, whose slots are free once it commits. Slots reserved by claims in flight
        count as taken, less the completions of their own transactions (free once those
        commit; should one fail, its claim fails with it). Exact under ``self._lock``
        (:meth:`_reserve`); the main loop reads it without the lock as a hint."""
        if self._stopping.is_set():
            return 0
        inflight = self._inflight + self._reserved_room
        free = self._capacity - inflight + freed
        if self._max_tasks is not None:
            free = min(free, self._max_tasks - self.stats.claimed - self._reserved)
        if free <= 0:
            return 0
        if forced and inflight - freed >= self.concurrency:
            # Every thread has a task: room left only for prefetch is filled by the claims
            # riding on completions, never by a transaction of its own (a poll).
            return 0
        if not forced and free < self._claim_batch and inflight > freed:
            return 0  # let more finish: one bigger claim instead of many small ones
        return free

    def _reserve(self, freed: int, forced: bool) -> int:
        """:meth:`_claim_limit`, with the slots reserved until :meth:`_dispatch` or
        :meth:`_release` (writer thread): writer threads claiming at once never ask for
        more than the room left.

        A reservation of ``limit`` tasks made with ``freed`` completions takes
        ``limit - min(freed, limit)`` slots of room: the completions' slots are free once
        its transaction commits (they stay counted in flight until their callbacks run),
        and if it fails, nothing is claimed either. So all writers claiming at once take
        at most the room left plus their own completions."""
        with self._lock:
            limit = self._claim_limit(freed, forced)
            if limit > 0:
                self._reserved += limit
                self._reserved_room += limit - min(freed, limit)
            return limit

    def _release(self, reserved: int, freed: int) -> None:
        """A claim that reserved ``reserved`` tasks with ``freed`` completions ended
        without claims (writer thread)."""
        with self._lock:
            self._reserved -= reserved
            self._reserved_room -= reserved - min(freed, reserved)

    def _dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        """Claims committed (writer thread): track their leases, queue them for threads;
        the reservation (``reserved`` tasks asked with ``freed`` completions) becomes
        ``len(claims)`` tasks in flight."""
        try:
            faults.point("claim.after_commit")
            handles = self.heartbeat.add_many(
                [
                    (c.task_id, c.generation, c.lease_s, t_sent, c.lease_until - c.ledger_now)
                    for c in claims
                ]
            )
            for claim, handle in zip(claims, handles, strict=True):
                if claim.control_request is not None:
                    handle.request = claim.control_request
            with self._lock:
                self._reserved -= reserved
                self._reserved_room -= reserved - min(freed, reserved)
                reserved = 0
                self._inflight += len(claims)
                self.stats.add("claimed", len(claims))
        finally:
            if reserved:
                self._release(reserved, freed)
        takeovers = sum(1 for c in claims if c.takeover)
        if takeovers:
            self.stats.add("takeovers", takeovers)
        self._last_claimed_at = time.monotonic()
        self._executor.push(zip(claims, handles, strict=True))

    # ------------------------------------------------------------------ one task

    def _execute(self, item: tuple[Claim, LeaseHandle]) -> None:
        claim, lease = item
        outcome: str | None = "abandoned"
        ctx: TaskContext | None = None
        hooks = self._hooks
        attempt: Attempt | None = None
        try:
            self.on_claimed(claim)
            if hooks is not None:
                hooks.before_attempt(claim)
            definition = self.app.definition(claim.name, claim.version)
            ctx = TaskContext(
                claim, self.holder, self.writer, lease, self._stopping,
                on_block=self._executor.blocking, hooks=hooks,
            )
            attempt = self._attempts.begin(claim, lease, ctx, definition.time_limit_s)
            ctx.breakers = self.app.breakers
            ctx.lookups = self.app.lookups
            outcome = self._run_body(definition, claim, ctx)
        except BaseException:  # never let one task kill the worker or leak its slot
            log.exception("internal error while running task %s", claim.task_id)
            outcome = "abandoned"
        if outcome is not None:  # None: a final write is on its way to the ledger
            if attempt is None or self._attempts.end(claim):
                self._done(claim, lease, outcome, ctx.exception if ctx is not None else None)
            else:  # ended at its time limit or the shutdown grace: not ours any more
                self._stuck_returned(claim, None)

    def _done(
        self, claim: Claim, lease: LeaseHandle, outcome: str,
        exception: BaseException | None = None,
    ) -> None:
        """The worker is done with ``claim``: free its lease and slot, fire on_finished."""
        try:
            self.heartbeat.remove(lease)
            self.stats.add_outcome(outcome)
            with self._lock:
                self._inflight -= 1
                idle = self._inflight == 0
            if idle:
                self._wake.set()
        finally:
            try:
                self.on_finished(claim, outcome)
            finally:
                if self._hooks is not None:
                    self._hooks.after_attempt(claim, outcome, exception)

    # ------------------------------------------------------------------ ended without its thread

    def _on_time_limit(self, attempt: Attempt) -> None:
        """The watchdog ended ``attempt`` at its time limit (watchdog thread): a failed
        attempt (``error_class`` ``"time_limit"``) written at its own generation, its slot
        freed now although its thread is still in the task's code (DESIGN §7)."""
        claim, ctx = attempt.claim, attempt.ctx
        limit = attempt.time_limit_s or 0.0
        exc = TimeLimitExceeded(claim.task_id, claim.attempt, claim.max_attempts, limit)
        self._give_up(attempt)  # first: from here on the thread can start no effect call
        ctx.exception = exc
        ctx.interrupt(exc)  # its next ctx.step / ctx.effect raises it
        self.stats.add("time_limited")
        # Read after the lease was marked lost: an intent not recorded in the context yet
        # is one whose call cannot start any more (the call needs a confirmed lease).
        open_intents = ctx.open_intents()
        try:
            transition = self._failure_transition(
                self.app.definition(claim.name, claim.version), claim, exc, open_intents,
                error_class=TIME_LIMIT,
                error=error_message(exc), trace=_where(attempt.thread),
            )
            self.on_failure(claim, transition)
        except BaseException:  # e.g. an overridden on_failure: never leak the slot
            log.exception("internal error at the time limit of task %s", claim.task_id)
            self._done(claim, attempt.lease, "abandoned", exc)  # the lease will expire
        else:
            self._write_ended(attempt, transition, "time_limit")
        if self.stats.stuck_threads >= self.max_stuck_threads:
            # Decide once the threads had STUCK_CONFIRM_S to come back (each one back has
            # uncounted itself by then), never at the moment of the time limit.
            confirm = threading.Timer(STUCK_CONFIRM_S, self._stop_if_stuck)
            confirm.daemon = True
            confirm.start()

    def _stop_if_stuck(self) -> None:
        """Stop the worker (for a restart) when ``max_stuck_threads`` threads are still in
        task code past their attempts' ends, :data:`STUCK_CONFIRM_S` after a time limit
        brought the count there."""
        stuck = self.stats.stuck_threads
        if stuck >= self.max_stuck_threads and not self._stopping.is_set():
            log.error("%d task threads are stuck in task code past their attempt's end "
                      "(max_stuck_threads=%d): stopping this worker so that it is restarted",
                      stuck, self.max_stuck_threads)
            self.stop_reason = "stuck_threads"
            self.stop()

    def _stop_corrupt(self, error: LedgerCorrupt) -> None:
        """A claim found the ledger corrupt (writer thread): retrying cannot repair it, so
        stop claiming and end :meth:`run` as on SIGTERM (exit status
        :data:`EXIT_LEDGER_CORRUPT`). Logged once, however many claims fail."""
        with self._lock:
            if self.stop_reason == "ledger_corrupt":
                return
            self.stop_reason = "ledger_corrupt"
        log.critical("%s: this worker stops claiming and exits (status %d)", error,
                     EXIT_LEDGER_CORRUPT)
        self.stop()

    def _hand_back(self, reason: str) -> None:
        """Hand back the lease of every attempt still running (the shutdown grace ended, or
        a second signal came): a fenced release to ``PENDING`` each, so another worker can
        claim the task at once. The attempt is handed back too (not counted), as for a
        release at a step boundary: stopping is the worker's decision, not a failure of the
        task (a hang is what ``time_limit_s`` is for)."""
        running = self._attempts.running()
        if running:
            log.warning("%s: handing back the leases of %d running task(s) still in task "
                        "code", reason, len(running))
        for attempt in running:
            if not self._attempts.take(attempt, ENDED_BY_SHUTDOWN_GRACE):
                continue  # it ended meanwhile
            self._give_up(attempt)
            attempt.ctx.interrupt(Shutdown())
            self.stats.add("handed_back")
            self._write_ended(attempt, Transition(State.PENDING, reason=reason), "hand_back")

    def _taken_from_thread(self, attempt: Attempt) -> None:
        """``attempt`` was just ended without its thread (time limit, shutdown grace), under
        the attempts register's lock (:meth:`Attempts.take`): its task thread is replaced,
        so the worker's concurrency is kept, and counted stuck. Done there, not later by
        the watchdog: a thread that comes back from task code at once (it was in a ledger
        call, or about to start an effect) must find itself detached and counted, else it
        would uncount itself first and then be detached while idle or running the next task
        (stuck threads never reaching ``max_stuck_threads``, a healthy thread dropped)."""
        self._executor.detach(attempt.thread)
        self.stats.add("stuck_threads")

    def _give_up(self, attempt: Attempt) -> None:
        """Stop acting for ``attempt``, taken from its thread (which is detached and counted
        stuck already: :meth:`_taken_from_thread`): its lease is no longer trusted (no new
        effect call can start) nor renewed."""
        attempt.lease.mark_lost()
        self.heartbeat.remove(attempt.lease)

    def _write_ended(self, attempt: Attempt, transition: Transition, operation: str) -> None:
        """The fenced final write of an attempt ended without its thread (the holder's own
        write at its generation); its outcome is reported, and its slot freed, once it
        commits. If it fails, the lease (no longer renewed) expires and the task is taken
        over or retired by the ledger as for a dead holder."""
        claim, ctx, lease = attempt.claim, attempt.ctx, attempt.lease
        write = TaskWrite(claim.task_id, claim.generation, self.holder,
                          f"{operation}:{transition.to.value}", transition=transition)

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            self._finished(claim, lease, ctx, [], transition, None, outcome, error)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            done(None, exc)
        finally:
            if attempt.end_sent is not None:
                attempt.end_sent.set()

    def _stuck_returned(self, claim: Claim, late: tuple[TaskContext, Any] | None) -> None:
        """A task thread came back from task code after its attempt was ended without it
        (time limit, shutdown grace). ``late``: ``(ctx, result)`` if the body returned.

        A late result is still sent, fenced at the attempt's generation: the ledger judges
        it and rejects it as stale (audited) since the attempt's transition was written (a
        later claim may have run the task again). Nothing else is reported: the attempt's
        outcome was reported when it was ended."""
        attempt = self._attempts.came_back(claim)
        if attempt is not None:  # counted stuck when it was taken (_taken_from_thread)
            self.stats.add("stuck_threads", -1)
        log.warning("task %s gen=%d: its task thread came back from the task's code after "
                    "the attempt was ended without it", claim.task_id, claim.generation)
        if late is None or attempt is None or attempt.end_sent is None:
            return
        # The attempt's own end goes first (its writes are applied in order): the watchdog
        # may still be building it. Without it, the late result could land first.
        if not attempt.end_sent.wait(10.0):
            return
        ctx, result = late
        try:
            result_json = dumps(result, what=f"result of task {claim.name!r}")
        except Exception:
            return
        write = TaskWrite(claim.task_id, claim.generation, self.holder, "finish:SUCCEEDED",
                          steps=ctx.unsaved_steps(),
                          transition=Transition(State.SUCCEEDED, result_json=result_json))

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is not None and outcome.stale:
                self.stats.add("stale")
                log.info("task %s gen=%d: late result rejected (stale)", claim.task_id,
                         claim.generation)
            elif outcome is not None:
                log.warning("task %s gen=%d: late result accepted (the attempt's own end "
                            "had not been written)", claim.task_id, claim.generation)

        with contextlib.suppress(RatchetError):
            self.writer.submit(write, done)

    def _run_body(self, definition: TaskDefinition, claim: Claim, ctx: TaskContext) -> str | None:
        """Run the task function; return its outcome, or None when the final write was
        handed to the writer (the outcome is reported when it commits).

        Every way the body can end is turned into an outcome here (see the module
        docstring for the classification of ``BaseException``)."""
        try:
            try:
                if self._stopping.is_set():
                    raise Shutdown()  # claimed (perhaps prefetched), not started: release it
                # A prefetched task may have waited: start it only under a confirmed lease,
                # and not at all if an operator has asked for it meanwhile (cancel, pause),
                # as known from a read of the requests at most START_CHECK_S old.
                try:
                    self._start_check.ensure(ctx.lease)
                except LedgerUnavailable as exc:
                    ctx.ledger_outage = exc  # not the task's fault: hand the attempt back
                    raise
                ctx.check_control()
                ctx.ensure_lease()
                params = ctx.load_params()
                result = definition.fn(ctx, **params)
            except BaseException as exc:
                if os.getpid() != self._pid:  # a child the task forked: not a worker
                    exit_forked_child(claim.task_id, exc)
                if self._attempts.is_running(claim):
                    raise
                self._stuck_returned(claim, None)  # ended without us: nothing to say
                return None
            if os.getpid() != self._pid:
                exit_forked_child(claim.task_id, None)
            if not self._attempts.is_running(claim):
                self._stuck_returned(claim, (ctx, result))
                return None
            transition = Transition(
                State.SUCCEEDED, result_json=dumps(result, what=f"result of task {claim.name!r}")
            )
        except Shutdown:
            transition = Transition(State.PENDING, reason="shutdown")
        except ControlInterrupt as exc:
            # An operator's request reached a boundary (DESIGN §3, arbitration): the
            # pipelined checkpoints ride on this fenced write; a pause hands the attempt
            # back (the engine's transition does it for PAUSED as for a release).
            if exc.request == "cancel":
                transition = Transition(State.CANCELLED, error_class="cancelled",
                                        reason="cancel requested by an operator")
            else:
                transition = Transition(State.PAUSED, error_class="paused",
                                        reason="pause requested by an operator")
        except CircuitOpen as exc:
            # The downstream's breaker is open: nothing was sent. Hand the attempt back and
            # wait until it may probe, instead of spending a retry on it (DESIGN §7).
            ctx.exception = exc
            transition = Transition(
                State.PENDING, delay_s=exc.retry_after_s or 0.0, error=error_message(exc),
                error_class="circuit_open", reason=f"circuit open toward {exc.downstream}",
            )
        except (StaleGeneration, TokenRejected) as exc:
            # TokenRejected: the target saw a newer claim's fencing token, so a newer
            # generation exists; like a fenced-out write, nothing of ours counts.
            ctx.exception = exc
            self.stats.add("stale")
            return "stale"
        except LeaseLost as exc:
            ctx.exception = exc
            self.stats.add("lease_lost")
            log.warning("task %s: %s", claim.task_id, exc)
            # A fenced release is still safe: if our generation is current it frees the task
            # now instead of after expiry; if not, the ledger rejects it.
            return self._finish(
                claim, ctx, Transition(State.PENDING, reason="lease_unconfirmed"), "lease_lost"
            )
        except FenceError as exc:
            ctx.exception = exc
            return "abandoned"
        except EffectOutcomeUnknown as exc:
            ctx.exception = exc
            transition = Transition(
                State.UNKNOWN, error=error_message(exc), traceback=error_traceback(exc),
                error_class=FailureClass.UNKNOWN_OUTCOME.value, reason="effect outcome unknown",
            )
            self.on_failure(claim, transition)
        except LedgerUnavailable as exc:
            ctx.exception = exc
            if ctx.ledger_outage is exc:
                # The worker's own ledger is unreachable: not the task's fault. Hand the
                # attempt back (release to PENDING, after a pause) instead of spending the
                # retry budget on a database outage.
                transition = Transition(
                    State.PENDING, delay_s=1.0, error=error_message(exc),
                    error_class="ledger_unavailable", reason="ledger unavailable",
                )
            else:
                # Raised by the task's own code (another App, another ledger): an ordinary
                # failure that spends attempts like any other, so it ends.
                transition = self._failure_transition(
                    definition, claim, exc, ctx.open_intents()
                )
            self.on_failure(claim, transition)
        except UndecodableData as exc:
            # Stored data of this task cannot be read back: running again reads the same.
            ctx.exception = exc
            transition = self._failure_transition(
                definition, claim, exc, ctx.open_intents(), failure=FailureClass.PERMANENT,
                error_class=UNDECODABLE,
            )
            self.on_failure(claim, transition)
        except WriteRejected as exc:
            # The database refused one of this task's writes for its content: sending it
            # again cannot help. The failure write must not carry the refused steps.
            ctx.exception = exc
            ctx.discard_unsaved_steps()
            transition = self._failure_transition(
                definition, claim, exc, ctx.open_intents(), failure=FailureClass.PERMANENT,
                error_class=WRITE_REJECTED,
            )
            self.on_failure(claim, transition)
        except Exception as exc:
            ctx.exception = exc
            transition = self._failure_transition(definition, claim, exc, ctx.open_intents())
            self.on_failure(claim, transition)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit, custom
            ctx.exception = exc
            base_class = next(
                (c for t, c in _BASE_EXCEPTION_CLASSES.items() if isinstance(exc, t)), None
            )
            transition = self._failure_transition(
                definition, claim, exc, ctx.open_intents(),
                failure=FailureClass.TRANSIENT if base_class is None else FailureClass.PERMANENT,
                error_class=base_class,
            )
            self.on_failure(claim, transition)
        return self._finish(claim, ctx, transition)

    def _failure_transition(
        self,
        definition: TaskDefinition,
        claim: Claim,
        exc: BaseException,
        open_intents: list[str],
        *,
        failure: FailureClass | None = None,
        error_class: str | None = None,
        error: str | None = None,
        trace: str | None = None,
    ) -> Transition:
        """The transition after the body raised ``exc``, as the outcome table says
        (:func:`ratchet.outcome.decide`, the worker's half): ``RETRY_WAIT`` while attempts
        remain for a retryable failure, else ``FAILED`` (``UNKNOWN`` while an effect's
        intent is open); the ledger completes it. ``failure`` overrides :func:`classify`;
        ``error_class`` the class recorded (default the failure class); ``error`` the
        recorded message (default :func:`~ratchet.errortext.error_message`: ``Type:
        message``) and ``trace`` its traceback (default
        :func:`~ratchet.errortext.error_traceback`), kept apart."""
        if failure is None:
            failure = classify(exc)
        recorded_class = error_class or failure.value
        error = bounded(error) if error is not None else error_message(exc)
        if trace is None:
            trace = error_traceback(exc)
        # Quarantine (DESIGN §7): the ledger counts the fingerprint of failures that say
        # something about the task; overload, unknown outcomes and an unreachable
        # downstream are about the downstream.
        fp = (of_exception(claim.name, exc)
              if failure in (FailureClass.TRANSIENT, FailureClass.PERMANENT)
              and not downstream_unreachable(exc) else None)
        # Where it ends is the outcome table's (the worker's half; the ledger completes it).
        facts = AttemptFacts(
            Happened.TIME_LIMIT if error_class == TIME_LIMIT else Happened.RAISED,
            failure=failure, error_class=recorded_class, attempt=claim.attempt,
            max_attempts=claim.max_attempts, intent_open=bool(open_intents))
        ending = decide(facts)
        if ending.state is State.RETRY_WAIT:  # the backoff draws only for a retry
            ending = decide(dataclasses.replace(facts, delay_s=definition.retry.backoff_s(
                claim.attempt, failure, retry_after_s(exc),
                overload_floor_s=self.overload_floor_s)))
            return Transition(
                State.RETRY_WAIT, delay_s=ending.run_at or 0.0, error=error,
                error_class=ending.error_class, reason="retry", fingerprint=fp, traceback=trace,
            )
        reason = "permanent" if failure is FailureClass.PERMANENT else "attempts exhausted"
        if ending.state is State.UNKNOWN:
            # The call may have happened: a dead-letter would hide a possible charge.
            reason = f"{reason} with open effect intent(s) {', '.join(open_intents)}"
        return Transition(ending.state, error=error, error_class=ending.error_class,
                          reason=reason, fingerprint=fp, traceback=trace)

    def _finish(
        self, claim: Claim, ctx: TaskContext, transition: Transition, label: str | None = None
    ) -> str | None:
        """Hand the final write (with the steps not yet durable) to the writer, without
        waiting. The lease and the slot stay held until it commits; then
        :meth:`_finished` reports the outcome (``label`` overrides its name).

        If the ledger is unreachable (or the reply to COMMIT was lost), the same write is
        sent again from a helper thread while the lease lasts (:meth:`_resend`). If the
        database refuses the write for its content, a failure write without the task's
        unsaved steps and result is sent instead (:meth:`_reject`)."""
        if not self._attempts.end(claim):
            # Ended at its time limit or the shutdown grace while this thread was in the
            # task's code: its lease, slot and outcome are no longer this thread's.
            self._stuck_returned(claim, None)
            return None
        steps = ctx.unsaved_steps()
        budgets = self._budget_uses(claim, ctx, transition)
        if budgets:
            transition = dataclasses.replace(transition, budgets=budgets)
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{transition.to.value}",
            steps=steps, transition=transition,
        )
        lease = ctx.lease

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is None and isinstance(error, LedgerUnavailable) and not lease.lost:
                thread = threading.Thread(
                    target=self._resend, args=(claim, lease, ctx, steps, transition, label, write),
                    name=f"ratchet-resend-{claim.task_id}", daemon=True,
                )
                thread.start()
                return
            if outcome is None and isinstance(error, WriteRejected):
                self._reject(claim, ctx, transition, error)
                return
            if (outcome is not None and outcome.ok and outcome.current_state is not None
                    and outcome.current_state is not transition.to):
                # The ledger applied another state than asked (an operator's request, a
                # quarantine): say so next to the line on_failure logged for the request.
                log.warning("task %s %s gen=%d: the ledger made it %s (asked %s)",
                            claim.name, claim.task_id, claim.generation,
                            outcome.current_state.value, transition.to.value)
            self._finished(claim, lease, ctx, steps, transition, label, outcome, error)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            log.error("task %s: final commit failed (%s); lease will expire", claim.task_id, exc)
            return "abandoned"
        return None

    def _budget_uses(
        self, claim: Claim, ctx: TaskContext, transition: Transition
    ) -> tuple[BudgetUse, ...]:
        """What this attempt charges to retry budgets (DESIGN §7): one call to its task
        type's budget (not for a release, which hands the attempt back), the requests its
        effects sent to each budgeted downstream; a ``RETRY_WAIT`` asks the type's budget
        and the budget of the downstream whose call failed to admit the retry. The ledger
        counts and decides (:class:`~ratchet.ledger.engine.LedgerEngine`)."""
        uses: list[BudgetUse] = []
        retry = transition.to is State.RETRY_WAIT
        definition = self.app.versions.get(claim.name, {}).get(claim.version)  # pinned
        type_budget = definition.retry.budget if definition is not None else None
        if type_budget is not None and transition.to is not State.PENDING:
            uses.append(BudgetUse(f"type:{claim.name}", 1, retry, type_budget.ratio,
                                  type_budget.min_per_s, type_budget.window_s))
        downstreams = self.app.downstreams
        if downstreams:
            names = dict(ctx.downstream_calls)
            if ctx.failed_downstream is not None:
                names.setdefault(ctx.failed_downstream, 0)
            for name, calls in sorted(names.items()):
                budget = downstreams.get(name)
                if budget is not None:
                    uses.append(BudgetUse(f"downstream:{name}", calls,
                                          retry and ctx.failed_downstream == name,
                                          budget.ratio, budget.min_per_s, budget.window_s))
        return tuple(uses)

    def _resend(
        self, claim: Claim, lease: LeaseHandle, ctx: TaskContext,
        steps: list[tuple[str, str, int | None]], transition: Transition, label: str | None,
        write: TaskWrite,
    ) -> None:
        """Send a final write again while the ledger is unreachable (helper thread).

        Re-sending is safe: every write is fenced, and a transition already applied at
        this generation is acknowledged, not applied twice. Exponential backoff from
        0.1 s up to 1 s between tries (tenacity), for at most one lease length or until
        the lease is known lost: after that the write would be stale anyway and the task
        belongs to its next holder."""

        def log_retry(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            self.final_commit_failures.failed(RuntimeError(
                f"task {claim.task_id}: {error}; sending it again in {delay:.2f} s"))

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(LedgerUnavailable),
            wait=tenacity.wait_exponential(multiplier=0.1, max=1.0),
            stop=tenacity.stop_after_delay(claim.lease_s) | _StopWhenLost(lease),
            before_sleep=log_retry,
            reraise=True,
        )
        outcome: CommitOutcome | None = None
        error: BaseException | None = None
        try:
            # The first try waits like the failed send did: the ledger was just unreachable.
            time.sleep(0.1)
            outcome = retrying(self.writer.commit, write)
        except Exception as exc:  # writer stopped, lease gone, or still unreachable
            error = exc
        else:
            self.final_commit_failures.succeeded()
        self._finished(claim, lease, ctx, steps, transition, label, outcome, error)

    def _reject(
        self, claim: Claim, ctx: TaskContext, transition: Transition, error: BaseException
    ) -> None:
        """The database refused a final write: record a permanent failure instead, without
        the unsaved steps or the result (writer thread). If that write is refused too, the
        attempt is abandoned (the lease expires)."""
        log.error("task %s: the ledger refused its final write (%s); failing it",
                  claim.task_id, error)
        ctx.exception = ctx.exception or error
        ctx.discard_unsaved_steps()
        failure = self._failure_transition(
            self.app.definition(claim.name, claim.version), claim, error, ctx.open_intents(),
            failure=FailureClass.PERMANENT, error_class=WRITE_REJECTED,
            error=f"{error_message(error)} (refused write: {transition.to.value} of task "
                  f"{claim.task_id})",
        )
        self.on_failure(claim, failure)
        write = TaskWrite(
            claim.task_id, claim.generation, self.holder, f"finish:{failure.to.value}",
            transition=failure,
        )

        def done(outcome: CommitOutcome | None, err: BaseException | None) -> None:
            self._finished(claim, ctx.lease, ctx, [], failure, None, outcome, err)

        try:
            self.writer.submit(write, done)
        except RatchetError as exc:
            done(None, exc)

    def _finished(
        self,
        claim: Claim,
        lease: LeaseHandle,
        ctx: TaskContext,
        steps: list[tuple[str, str, int | None]],
        transition: Transition,
        label: str | None,
        outcome: CommitOutcome | None,
        error: BaseException | None,
    ) -> None:
        """The final write's outcome is known (writer thread, or the resend thread)."""
        result = "abandoned"
        try:
            if outcome is None:
                log.error("task %s: final commit failed (%s); lease will expire",
                          claim.task_id, error)
            elif outcome.stale:
                self.stats.add("stale")
                result = "stale"
            else:
                ctx.steps_saved(steps)
                faults.point("task.after_complete")
                # An operator request may have changed the state applied (arbitration).
                applied = outcome.current_state or transition.to
                attr = _COUNTERS.get(applied)
                if attr is not None:
                    self.stats.add(attr)
                result = applied.value
        finally:
            self._done(claim, lease, label or result, ctx.exception)


def _current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()`` with the garbage collector held off: up to CPython 3.11 a
    collection that starts inside it (it allocates frame objects while holding the
    runtime's thread-list lock) can free a ``threading.local``, whose deallocation takes
    that lock again, and the process deadlocks (python/cpython#106883)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if enabled:
            gc.enable()


def _where(thread: threading.Thread) -> str:
    """Where ``thread`` is now: its innermost frames, for the time-limit error."""
    frame = _current_frames().get(thread.ident or -1)
    if frame is None:
        return "(its thread has just ended)\n"
    stack = "".join(traceback.format_stack(frame, limit=8))
    return f"the task thread ({thread.name}) is at (innermost last):\n{stack}"[-1500:]


_COUNTERS: dict[str, str] = {
    State.CANCELLED: "cancelled",
    State.PAUSED: "paused",
    State.SUCCEEDED: "succeeded",
    State.RETRY_WAIT: "retried",
    State.FAILED: "failed",
    State.UNKNOWN: "unknown",
    State.PENDING: "released",
}
