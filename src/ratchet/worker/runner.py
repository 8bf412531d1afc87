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
Leases are renewed by one :class:`~ratchet.worker.heartbeat.Heartbeat`.

``async def`` bodies (:mod:`ratchet.worker.asyncattempt`) run on one event loop per
worker process (:mod:`ratchet.worker.asyncrun`), started only when the worker serves an
``async def`` task type, beside the task threads: at most ``async_concurrency`` at once.
The claim capacity is then ``concurrency + prefetch + async_concurrency``; each claimed
task waits for a free slot of its own kind (a thread, or the loop). The ledger, writer,
heartbeat, leases, fencing, start checks, the exception ladder and the context protocol
are the same for both (:mod:`ratchet.worker.protocol`).

How a task body can end and what is recorded: :mod:`ratchet.worker.attempt`. Attempts
ended without their thread (time limits, the shutdown grace): :mod:`ratchet.worker.ended`.
The layers of :class:`Worker`, one module each: :mod:`ratchet.worker.core`.

Operator requests (DESIGN §3, arbitration): a cancel or pause the heartbeat has
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
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType

from .. import faults
from ..app import App
from ..errors import EXIT_LEDGER_CORRUPT, ConfigError, LedgerCorrupt, RatchetError
from ..ledger.base import Claim, ClaimScope, DefinitionSpec, Subscription
from ..serde import dumps
from ..validation import MAX_NAME_BYTES, check_identifier, check_queue_name
from .asyncrun import AsyncRunner
from .backoff import RepeatedFailure
from .ended import EndedAttempts
from .executor import Executor
from .forks import Descendants, install_signal_handler
from .heartbeat import Heartbeat, LeaseHandle
from .hooks import Hooks, Middleware, with_defaults
from .options import (
    DEFAULT_ASYNC_CONCURRENCY,
    DEFAULT_SHUTDOWN_GRACE_S,
    EXIT_HANDED_BACK,
    EXIT_STUCK_THREADS,
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
    STUCK_CONFIRM_S,
    check_int,
    check_seconds,
    default_holder,
    default_max_stuck_threads,
    default_prefetch,
    default_writers,
)
from .registry import Registrar
from .retention import Pruner
from .scheduler import Scheduler, log_lacking
from .slots import ClaimPolicy
from .startcheck import StartCheck
from .stats import WorkerStats
from .timelimit import Attempts
from .writer import LedgerWriter

__all__ = [
    "DEFAULT_ASYNC_CONCURRENCY",
    "DEFAULT_SHUTDOWN_GRACE_S",
    "EXIT_HANDED_BACK",
    "EXIT_LEDGER_CORRUPT",
    "EXIT_STUCK_THREADS",
    "MAX_ASYNC_CONCURRENCY",
    "MAX_CONCURRENCY",
    "MAX_POLL_INTERVAL_S",
    "MAX_PREFETCH",
    "MAX_STUCK_THREADS",
    "MAX_WRITERS",
    "SIGNAL_REPEAT_S",
    "STUCK_CONFIRM_S",
    "Worker",
    "WorkerStats",
    "default_holder",
    "default_max_stuck_threads",
    "default_prefetch",
    "default_writers",
]

log = logging.getLogger("ratchet.worker")

_STALL_S = 0.005
"""Queued tasks not picked up for this long (s) while task threads are busy: wake another."""

SIGNAL_REPEAT_S = 0.5
"""A SIGTERM / SIGINT within this many seconds of the previous one is the same stop
delivered twice (to the process group and to the process, e.g. by ``timeout`` and a
process manager), not a request to hurry."""

class Worker(EndedAttempts):
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
        scheduler: run the scheduler of the app's periodic tasks (``@app.periodic``) in a
            thread (:mod:`ratchet.worker.scheduler`); default True. Any number of workers
            may run it (no leader: each tick's idempotency key makes it one task); False
            (``ratchet worker --no-scheduler``) leaves the firing to other workers.
        queues: the named queues served (``ratchet worker --queues critical,default``);
            default None: every queue. A task in another queue is never claimed here.
        async_concurrency: ``async def`` bodies run at once on the worker's event loop
            (one loop per worker, on a thread of its own, started only when a served task
            type is ``async def``), beside the ``concurrency`` task threads of plain
            ``def`` bodies. Default :data:`DEFAULT_ASYNC_CONCURRENCY` (100).

    Raises:
        ConfigError: ``concurrency`` not an integer from 1 to :data:`MAX_CONCURRENCY`,
            ``prefetch`` not from 0 to :data:`MAX_PREFETCH`, ``async_concurrency`` not from
            1 to :data:`MAX_ASYNC_CONCURRENCY`, ``writers`` not from 1 to
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
        scheduler: bool = True,
        queues: Sequence[str] | None = None,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
    ) -> None:
        self.run_scheduler = bool(scheduler)
        self.scheduler: Scheduler | None = None
        if overload_floor_s is not None:
            overload_floor_s = check_seconds("overload_floor_s", overload_floor_s)
        self.overload_floor_s = overload_floor_s
        if prune_older_than_s is not None:
            prune_older_than_s = check_seconds("prune_older_than_s", prune_older_than_s)
        prune_every_s = check_seconds("prune_every_s", prune_every_s, above_zero=True)
        self.prune_older_than_s = prune_older_than_s
        self.prune_every_s = prune_every_s
        self.stop_descendants = stop_descendants
        self._descendants: Descendants | None = None
        self._pid = os.getpid()  # the worker's process (run() sets it): not a forked child
        self.pruner: Pruner | None = None
        concurrency = check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
        async_concurrency = check_int("async_concurrency", async_concurrency, 1,
                                      MAX_ASYNC_CONCURRENCY)
        if prefetch is None:
            prefetch = default_prefetch(concurrency)
        prefetch = check_int("prefetch", prefetch, 0, MAX_PREFETCH)
        if writers is None:
            writers = default_writers(app.ledger)
        writers = check_int("writers", writers, 1, MAX_WRITERS)
        poll_interval_s = check_seconds("poll_interval_s", poll_interval_s, above_zero=True,
                                         high=MAX_POLL_INTERVAL_S)
        shutdown_grace_s = check_seconds("shutdown_grace_s", shutdown_grace_s)
        if max_stuck_threads is None:
            max_stuck_threads = default_max_stuck_threads(concurrency)
        max_stuck_threads = check_int("max_stuck_threads", max_stuck_threads, 1,
                                       MAX_STUCK_THREADS)
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.max_stuck_threads = max_stuck_threads
        self.stop_reason: str | None = None
        """Why :meth:`run` ended early, if it did: ``"stuck_threads"`` (the cap was
        reached), ``"ledger_corrupt"`` (a claim raised :class:`LedgerCorrupt`); None
        otherwise."""
        self.app = app
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.prefetch = prefetch
        self.names = list(names) if names is not None else sorted(app.tasks)
        for name in self.names:
            app.definition(name)
        self.kinds: list[tuple[str, int]] = [
            (name, version) for name in self.names for version in sorted(app.versions[name])
        ]
        self._async = None
        if any(app.definition(n, v).is_async for n, v in self.kinds):
            self._async = AsyncRunner(async_concurrency, self._execute_async)
        # Running bodies at most, and claimed and not finished at most.
        self._run_slots = concurrency + (async_concurrency if self._async else 0)
        self._capacity = self._run_slots + prefetch
        """The (name, version) pairs this worker claims: every version its app defines of
        each name in ``names``; a task pinned to another version is never claimed here."""
        served = None if queues is None else tuple(sorted({
            check_queue_name(q, ConfigError) for q in queues}))
        if served == ():
            raise ConfigError("queues is empty: name at least one queue, or None for all")
        if served is not None:
            declared = {d.flow.queue for v in app.versions.values() for d in v.values()}
            if not declared & set(served):
                log.warning("worker serves queues %s, none of which is the queue of a task "
                            "type of its app (%s): it runs only tasks submitted to them "
                            "with queue= (a misspelt --queues?)", ", ".join(served),
                            ", ".join(sorted(declared)))
        self.claim_scope = ClaimScope(served, frozenset(
            n for n in self.names if any(d.flow.fair for d in app.versions[n].values())))
        """What the claims may take beyond the kinds: the queues served (None: every
        queue) and the fair types (DESIGN §8, flow control)."""
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
        # DESIGN §9: what observe installs by itself (tracing, when OpenTelemetry records)
        # goes first.
        self.middleware = with_defaults(self.middleware)
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
        self._notify_polled_at = float("-inf")  # monotonic: the last poll _on_notify sent
        self._executor: Executor[tuple[Claim, LeaseHandle]] = Executor(
            concurrency, self._execute
        )
        self._attempts = Attempts(self._on_time_limit, self._taken_from_thread)
        self._stop_began: float | None = None  # monotonic: the shutdown grace runs from it
        self._last_signal_at = float("-inf")
        self._cold = False  # a second signal: hand the leases back now

    # ------------------------------------------------------------------ hooks

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

        Raises:
            ConfigError: ``RATCHET_CRASH_AT`` / ``RATCHET_PAUSE_AT`` names an unknown point.
        """
        for variable, name in faults.armed().items():  # a test's setting, never production's
            log.warning("fault point armed: %s=%s (this worker kills or stops itself there)",
                        variable, name)
        self._max_tasks = max_tasks
        self._pid = os.getpid()
        if self.stop_descendants:
            # What is there now is not the tasks'; orphans below are reparented to the worker.
            self._descendants = Descendants(subreaper=True)
        hooks = self._hooks
        if hooks is not None:
            hooks.worker_start()
        self.writer.set_claim_policy(ClaimPolicy(self))
        self.writer.start()
        self.heartbeat.start()
        self._attempts.start()
        if self._async is not None:
            self._async.start()
        self._register_definitions()
        registrar: Registrar | None = None
        if self.fast_takeover:
            registrar = Registrar(self.ledger, self.holder, slots=self._run_slots,
                                  queues=self.claim_scope.queues)
            try:
                registrar.register()
            except LedgerCorrupt as exc:
                self._stop_corrupt(exc)
            except RatchetError as exc:  # the registrar thread tries again
                log.warning("worker registry: %s", exc)
            registrar.start()
        if self.prune_older_than_s is not None:
            self.pruner = Pruner(self.ledger, self.holder, self.prune_older_than_s,
                                 self.prune_every_s)
            self.pruner.start()
        if self.run_scheduler and self.app.periodic_tasks:
            self.scheduler = Scheduler(self.ledger, self.app.periodic_tasks, self.holder)
            self.scheduler.start()
        elif self.run_scheduler:
            log_lacking(self.ledger)
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
                    if max(last_poll, self.writer.last_claim_at,
                           self._notify_polled_at) < idle_since:
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
                    last_try = max(self.writer.last_claim_at, last_poll,
                                   self._notify_polled_at)
                    due = last_try + (
                        linger if 0 < inflight < self._run_slots else self.poll_interval_s
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
                runner = self._async
                if runner is not None:
                    runner.close()  # bodies waiting for a slot are released at once
                while not (self._executor.join(0.05)
                           and (runner is None or runner.join(0.0))):
                    if self._cold or time.monotonic() >= grace_ends:
                        self._hand_back(
                            "second signal" if self._cold
                            else f"shutdown grace of {self.shutdown_grace_s:g} s ended")
                        break
                if runner is not None:
                    # Bodies still awaiting were cancelled by the hand-back; their final
                    # writes were handed to the writer before it stops.
                    runner.join(1.0)
                    runner.stop()
                self._attempts.stop()
                self.writer.stop()
                self.writer.join()  # final writes committed, on_finished fired
                if registrar is not None:
                    registrar.stop(clean=True)
                if self.pruner is not None:
                    self.pruner.stop()
                if self.scheduler is not None:
                    self.scheduler.stop()
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
        except LedgerCorrupt as exc:  # said once, where every corrupt-ledger path stops
            self._stop_corrupt(exc)
            return
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
        PostgreSQL NOTIFY): poll now, and let the heartbeat read the requests. With room
        for a claim the poll goes to the writer from here, the listener's thread (one
        thread hand-off less between a submit's commit and its claim); else the main loop
        decides."""
        if not self._stopping.is_set() and self._claim_limit(0, forced=True) > 0:
            self._notify_polled_at = time.monotonic()
            self.writer.poll()
        else:
            self._notified = True
        self._wake.set()
        self.heartbeat.poke_control()

