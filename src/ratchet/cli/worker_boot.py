"""``ratchet worker``: start-up of a worker process."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import tenacity
import typer
from prometheus_client import disable_created_metrics

from .. import ConfigError, InvalidArguments, LedgerUnavailable, Worker
from ..config import redact_url
from ..loading import load_app, load_middleware
from ..observe import logs, tracing
from ..observe.metrics import MetricsServer, WorkerMetrics
from ..validation import (
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
    parse_duration_s,
)
from .guard import guard
from .options import (
    MAX_WAIT_S,
    AppArg,
    LedgerOpt,
    log_level_of,
)
from .render import (
    err_console,
    line,
)

__all__ = ["worker"]

log = logging.getLogger("ratchet.worker")


def worker(
    app_spec: AppArg,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-c", min=1, max=MAX_CONCURRENCY, metavar="N",
                     help="Tasks run at the same time (threads)."),
    ] = 8,
    async_concurrency: Annotated[
        int,
        typer.Option("--async-concurrency", min=1, max=MAX_ASYNC_CONCURRENCY, metavar="N",
                     help="async def task bodies run at the same time on the worker's event"
                     " loop (one per worker, started only when it serves an async def task"
                     " type), beside the --concurrency threads of plain def bodies."),
    ] = 100,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch", min=0, max=MAX_PREFETCH, metavar="N",
            help="Tasks claimed beyond --concurrency and held (leased, not started) so the"
            " next task starts while the last completion commits (default: 4 per thread,"
            " at least 4, at most 32; 0 = none; long tasks over several workers: 0)."
            " Unstarted ones are released on stop.",
        ),
    ] = None,
    writers: Annotated[
        int | None,
        typer.Option(
            "--writers", min=1, max=MAX_WRITERS, metavar="N",
            help="Writer threads, each committing (and claiming) in transactions of its own"
            " (default 1; more help on PostgreSQL only while the server has CPU to spare;"
            " SQLite has one write lock).",
        ),
    ] = None,
    names: Annotated[
        str | None,
        typer.Option("--names", metavar="NAME,...",
                     help="Comma-separated task names to run (default: all registered)."),
    ] = None,
    poll_interval_s: Annotated[
        float,
        typer.Option("--poll-interval-s", min=0.001, max=MAX_POLL_INTERVAL_S,
                     metavar="SECONDS",
                     help="Seconds between claims when idle (PostgreSQL also wakes on NOTIFY)."),
    ] = 0.1,
    ledger: LedgerOpt = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR."),
    ] = "INFO",
    ledger_wait_s: Annotated[
        float,
        typer.Option(
            "--ledger-wait-s", min=0.0, max=MAX_WAIT_S, metavar="SECONDS",
            help="Keep retrying an unreachable ledger this many seconds at start-up.",
        ),
    ] = 30.0,
    fast_takeover: Annotated[
        bool,
        typer.Option(
            "--fast-takeover/--no-fast-takeover",
            help="Register in the worker registry and revoke the leases of same-host workers"
            " whose process is gone (default), or rely on lease expiry alone.",
        ),
    ] = True,
    queues: Annotated[
        str | None,
        typer.Option(
            "--queues", metavar="Q1,Q2",
            help="Serve only these named queues (comma-separated); default every queue."
            " A task in another queue is never claimed here.",
        ),
    ] = None,
    scheduler: Annotated[
        bool,
        typer.Option(
            "--scheduler/--no-scheduler",
            help="Fire the app's periodic tasks (@app.periodic) from this worker (default;"
            " any number of workers may, each tick is one task), or leave it to others.",
        ),
    ] = True,
    middleware: Annotated[
        list[str] | None,
        typer.Option(
            "--middleware", metavar="MODULE:ATTR",
            help="A ratchet.Middleware subclass (created without arguments) or instance to"
            " install; repeat for several, called in order.",
        ),
    ] = None,
    shutdown_grace_s: Annotated[
        float,
        typer.Option(
            "--shutdown-grace-s", min=0.0, max=MAX_WAIT_S, metavar="SECONDS",
            help="After SIGTERM/Ctrl-C, how long running tasks get to reach their end or a"
            " step boundary; then their leases are handed back (released to PENDING, attempt"
            " not counted) and the worker exits (status 3). A second signal: at once. Keep it"
            " below your process manager's kill timeout.",
        ),
    ] = 25.0,
    max_stuck_threads: Annotated[
        int | None,
        typer.Option(
            "--max-stuck-threads", min=1, max=MAX_STUCK_THREADS, metavar="N",
            help="Task threads stuck in task code past their attempt's time limit at which"
            " the worker stops and exits with status 4, for a restart (default: --concurrency,"
            " at least 4).",
        ),
    ] = None,
    prune_older_than: Annotated[
        str | None,
        typer.Option(
            "--prune-older-than", metavar="AGE",
            help="Prune tasks finished more than AGE ago (30d) in the background, as"
            " `ratchet prune` does (default: never).",
        ),
    ] = None,
    prune_every: Annotated[
        str | None,
        typer.Option("--prune-every", metavar="AGE",
                     help="Time between those prunes (jittered; default 1h). Needs"
                     " --prune-older-than."),
    ] = None,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format", metavar="FORMAT",
            help="text (default) or json: one JSON object per line with the task's"
            " correlation fields, and one line per attempt outcome (success included).",
        ),
    ] = "text",
    trace: Annotated[
        bool | None,
        typer.Option(
            "--trace/--no-trace",
            help="OpenTelemetry spans for attempts, steps and effects (needs the otel"
            " extra). Default: on when a TracerProvider is configured (by the app module,"
            " opentelemetry-instrument or --trace-file) unless RATCHET_TRACE=0.",
        ),
    ] = None,
    trace_file: Annotated[
        str | None,
        typer.Option(
            "--trace-file", metavar="PATH",
            help="Write spans to PATH, one JSON object per line (implies --trace).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port", min=0, max=65535, metavar="PORT",
            help="Serve Prometheus metrics of this worker at http://HOST:PORT/metrics"
            " (0: a free port, logged as 'metrics on http://...'). Default: not served.",
        ),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option("--metrics-host", metavar="HOST",
                     help="Address the metrics endpoint binds (with --metrics-port)."),
    ] = "127.0.0.1",
) -> None:
    """Run a worker for the app's tasks.

    Claims ready tasks, runs them on --concurrency threads (async def bodies on an event
    loop, at most --async-concurrency at once) and commits fenced results.
    SIGTERM or Ctrl-C stops gracefully: no new claims, prefetched tasks released at once,
    running tasks released at their next step boundary, or their leases handed back when
    --shutdown-grace-s ends. Exit status: 0 stopped cleanly, 3 leases handed back (grace
    ended or second signal), 4 stopped at --max-stuck-threads, 2 a Ratchet error.
    """
    level = log_level_of(log_level)
    if log_format not in ("text", "json"):
        err_console().print(line(("error: ", "bold red"), "--log-format must be text or json,"
                                 " not ", (repr(log_format), "")))
        raise typer.Exit(2)
    # HTTP clients log every request at INFO (the task's own chatter, not the worker's):
    # off unless DEBUG.
    logs.setup_logging(level, "json" if log_format == "json" else "text")
    if log_format == "json":
        logging.captureWarnings(True)  # warnings as JSON lines too, not raw stderr text

    def run() -> None:
        prune_age = (parse_duration_s(prune_older_than, "--prune-older-than",
                                      unit_required=True)
                     if prune_older_than is not None else None)
        if prune_every is not None and prune_older_than is None:
            raise InvalidArguments("--prune-every needs --prune-older-than AGE (which tasks "
                                   "to prune); without it the worker prunes nothing")
        prune_every_s = parse_duration_s(prune_every or "1h", "--prune-every", above_zero=True)
        app = load_app(app_spec)
        installed = [load_middleware(spec) for spec in middleware or []]
        provider = _configure_tracing(trace, trace_file)
        if log_format == "json":
            installed.append(logs.AttemptLog())
        metrics_server = None
        if metrics_port is not None:
            worker_metrics = WorkerMetrics(process=True)
            installed.insert(0, worker_metrics)
            metrics_server = MetricsServer(worker_metrics.registry, metrics_host, metrics_port)
            # One worker: half the series.
            disable_created_metrics()  # type: ignore[no-untyped-call]
            log.info("metrics on %s", metrics_server.url)
        app.configure(ledger=ledger)
        _open_ledger_waiting(lambda: app.ledger, ledger_wait_s)  # opens (and migrates) it now
        w = Worker(
            app,
            middleware=installed,
            concurrency=concurrency,
            async_concurrency=async_concurrency,
            prefetch=prefetch,
            writers=writers,
            names=[n.strip() for n in names.split(",") if n.strip()] if names else None,
            poll_interval_s=poll_interval_s,
            fast_takeover=fast_takeover,
            shutdown_grace_s=shutdown_grace_s,
            max_stuck_threads=max_stuck_threads,
            prune_older_than_s=prune_age,
            prune_every_s=prune_every_s,
            stop_descendants=True,  # the process is the worker's: leave none behind
            scheduler=scheduler,
            queues=None if queues is None else [q.strip() for q in queues.split(",")
                                                if q.strip()],
        )
        w.install_signal_handlers()
        log.info("worker %s: tasks %s, queues %s, concurrency %d, async concurrency %d, "
                 "prefetch %d, writers %d, ledger %s", w.holder,
                 [f"{n} v{v}" for n, v in w.kinds],
                 "all" if queues is None else ",".join(w.claim_scope.queues or ()),
                 concurrency, async_concurrency, w.prefetch, w.writers,
                 redact_url(app.ledger.config.url))
        try:
            stats = w.run()
        finally:
            if provider is not None:
                provider.shutdown()  # flush the spans still batched
            if provider is not None or trace is not None:
                tracing.configure()  # back to automatic (in-process callers, tests)
            if metrics_server is not None:
                metrics_server.close()
        log.info("worker %s stopped: %s", w.holder, stats)
        _exit(w.exit_code, w.holder, stats.stuck_threads)

    guard(run)


def _configure_tracing(trace: bool | None, trace_file: str | None) -> Any:
    """Set up tracing from ``--trace/--no-trace`` and ``--trace-file``; the file's provider
    (None without ``--trace-file``), for the caller to shut down when the worker stops.

    Raises:
        ConfigError: ``--trace`` without OpenTelemetry or without a TracerProvider.
    """
    provider = tracing.file_provider(trace_file) if trace_file is not None else None
    if provider is not None or trace is not None:
        tracing.configure(provider, enabled=trace if provider is None else True)
    if trace and not tracing.enabled():
        tracing.configure()
        raise ConfigError(
            "--trace: " + ("OpenTelemetry is not installed (pip install 'ratchet[otel]')"
                           if not tracing.available() else
                           "no TracerProvider is configured: set one up in the app "
                           "module, run under opentelemetry-instrument, or pass "
                           "--trace-file PATH"))
    return provider


def _open_ledger_waiting(open_ledger: Callable[[], object], wait_s: float) -> None:
    """Call ``open_ledger`` until it stops raising ``LedgerUnavailable``, for ``wait_s``
    seconds (``--ledger-wait-s``).

    A worker often starts before its database (boot order, a restart, maintenance): tries
    back off from 0.5 s to 5 s; the last error is re-raised when the next try would start
    after the deadline.

    Raises:
        LedgerUnavailable: still unreachable after ``wait_s`` seconds.
    """
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(LedgerUnavailable),
        wait=tenacity.wait_exponential(multiplier=0.5, min=0.5, max=5.0),
        stop=tenacity.stop_before_delay(wait_s),
        before_sleep=lambda state: log.warning(
            "ledger unavailable (%s); retrying in %.1f s",
            state.outcome.exception() if state.outcome else "?",
            state.next_action.sleep if state.next_action else 0.0,
        ),
        reraise=True,
    )
    retrying(open_ledger)


def _exit(code: int, holder: str, stuck_threads: int) -> None:
    """End the worker process with its exit status ``code`` (:attr:`Worker.exit_code`).

    With threads still stuck in task code the process leaves at once (``os._exit``, after
    flushing stdout and stderr): they cannot be joined, and one may hold a lock the
    interpreter's shutdown needs (everything is committed by then).

    Raises:
        typer.Exit: ``code`` is not 0.
    """
    if stuck_threads:
        log.warning("worker %s: exiting with %d task thread(s) still stuck in task code",
                    holder, stuck_threads)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    if code:
        raise typer.Exit(code)
