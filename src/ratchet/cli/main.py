"""The ``ratchet`` command line (Typer + Rich), a face of :class:`ratchet.control.Control`.

Commands: ``worker``, ``submit``, ``status``, ``tasks``, ``workers``, ``inspect``,
``late-effects``, ``reconcile``, ``resolve``, ``cancel``, ``retry``, ``pause``, ``resume``,
``limits`` (``set``, ``clear``), ``definitions``, ``prune``, ``serve``, ``migrate``, ``demo``;
``ratchet --version``. Every command takes ``--ledger URL`` (default ``RATCHET_LEDGER_URL`` or
``sqlite:///ratchet.db``). The commands call only the public API (``Control``, ``App``,
``Worker``, :func:`ratchet.loading.load_app`), never the ledger modules. Ratchet errors
print one line saying what to fix (stored data and user input printed as text, never as
markup; passwords redacted) and exit with status 2; a corrupt ledger
(:class:`~ratchet.errors.LedgerCorrupt`) with :data:`~ratchet.errors.EXIT_LEDGER_CORRUPT`.
``--json`` (every command but ``worker`` and ``demo``; ``ratchet --version --json``) prints
``dataclasses.asdict`` of the records ``Control`` returns. Piped output is never wrapped
or cut (:mod:`ratchet.cli.render`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import tenacity
import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand

from .. import __version__
from ..capacity import span as _span
from ..config import redact_url
from ..control import (
    LATE_ACCOUNTED_FOR,
    MAX_WINDOW_S,
    REASON_REQUIRED,
    Control,
    ControlOutcome,
    PauseResult,
    StatusReport,
    TaskInfo,
    TaskTimeline,
    TypeStatusView,
    default_operator,
)
from ..errors import (
    EXIT_LEDGER_CORRUPT,
    ConfigError,
    InvalidArguments,
    LedgerCorrupt,
    LedgerUnavailable,
    RatchetError,
    UndecodableData,
)
from ..errortext import error_summary
from ..loading import load_app, load_middleware
from ..reconcile import MAX_LOOKUP_RETRIES, MAX_LOOKUP_TIMEOUT_S
from ..reconcile import reconcile as run_reconcile
from ..serde import loads
from ..states import State
from ..validation import MAX_DELAY_S, MAX_VERSION, parse_duration_s, parse_rate_per_s
from ..worker import (
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
)
from .render import (
    clip,
    console,
    echo_json,
    echo_json_line,
    err_console,
    field,
    line,
    plain,
    show_value,
    stdout_is_terminal,
)

__all__ = ["cli", "load_app", "main"]

cli = typer.Typer(
    name="ratchet",
    help="Recoverable task execution: leases, fencing tokens, exactly-once effects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

MAX_WAIT_S = 7 * 86_400.0
"""The longest ``--ledger-wait-s`` / ``--shutdown-grace-s`` (and the other timeouts given
in seconds), seconds (a week)."""

MIN_WATCH_S = 0.1
MAX_WATCH_S = 3600.0
"""The bounds of ``status --watch SECONDS``, seconds."""

ReasonOpt = Annotated[
    str | None,
    typer.Option("--reason", metavar="TEXT",
                 help="Why (kept in the audit log with --operator). Required."),
]
"""``--reason`` of every command that needs one. Not required at parse time: a missing
reason is refused by Control like a blank one (``error: InvalidArguments: reason
(--reason) must say why...``, status 2), so every command says the same, in one style."""
LedgerOpt = Annotated[
    str | None,
    typer.Option(
        "--ledger",
        metavar="URL",
        help="Ledger URL (default: $RATCHET_LEDGER_URL or sqlite:///ratchet.db).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the record as JSON (every field) instead of text.")
]
AppArg = Annotated[
    str,
    typer.Argument(metavar="MODULE:APP", help="The application, e.g. myproj.tasks:app."),
]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="The task id.")]

T = TypeVar("T")
log = logging.getLogger("ratchet.worker")


class _Argument(TyperArgument):
    """A positional argument whose help shows its metavar only (``MODULE:APP``), not Typer's
    type label (``<str>``)."""

    def display_type_rich(self, ctx: object) -> str | None:
        return None


class _Command(TyperCommand):
    """Every ``ratchet`` command: arguments shown as :class:`_Argument`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = _Argument



def _reason(reason: str | None) -> str:
    """``--reason`` of a command that needs one: a missing or blank one is the same
    ``InvalidArguments`` as Control's (one message, one style, for every command)."""
    if reason is None or not reason.strip():
        raise InvalidArguments(REASON_REQUIRED)
    return reason


def _print_error(exc: RatchetError) -> None:
    """A Ratchet error as the one line every command prints on stderr."""
    err_console().print(line(("error: ", "bold red"), (f"{type(exc).__name__}: {exc}", "")))


def _guard(fn: Callable[[], T]) -> T:
    """Run ``fn``; a Ratchet error becomes one line on stderr and exit status 2
    (:data:`~ratchet.errors.EXIT_LEDGER_CORRUPT` for a corrupt ledger)."""
    try:
        return fn()
    except RatchetError as exc:
        _print_error(exc)
        raise typer.Exit(EXIT_LEDGER_CORRUPT if isinstance(exc, LedgerCorrupt) else 2) from None


def _json_arg(text: str, option: str) -> object:
    """Decode a JSON command-line value; ``InvalidArguments`` naming the option if bad."""
    try:
        return loads(text, option)
    except UndecodableData as exc:
        raise InvalidArguments(f"{option} must be JSON: {exc}") from None


def _when(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S.%f")[:-3]


@cli.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='With --version: {"name": "ratchet", "version": "..."}.'),
    ] = False,
) -> None:
    """Recoverable task execution: leases, fencing tokens, exactly-once effects."""
    if version:
        if as_json:
            echo_json({"name": "ratchet", "version": __version__})
        else:
            typer.echo(f"ratchet {__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)


@cli.command(cls=_Command)
def worker(
    app_spec: AppArg,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", "-c", min=1, max=MAX_CONCURRENCY, metavar="N",
                     help="Tasks run at the same time (threads)."),
    ] = 8,
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

    Claims ready tasks, runs them on --concurrency threads and commits fenced results.
    SIGTERM or Ctrl-C stops gracefully: no new claims, prefetched tasks released at once,
    running tasks released at their next step boundary, or their leases handed back when
    --shutdown-grace-s ends. Exit status: 0 stopped cleanly, 3 leases handed back (grace
    ended or second signal), 4 stopped at --max-stuck-threads, 2 a Ratchet error.
    """
    from ..worker import Worker

    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        err_console().print(line(("error: ", "bold red"),
                                 "--log-level must be DEBUG, INFO, WARNING or ERROR, not ",
                                 (repr(log_level), "")))
        raise typer.Exit(2)
    if log_format not in ("text", "json"):
        err_console().print(line(("error: ", "bold red"), "--log-format must be text or json,"
                                 " not ", (repr(log_format), "")))
        raise typer.Exit(2)
    from ..observe import logs, tracing

    # HTTP clients log every request at INFO (the task's own chatter, not the worker's):
    # off unless DEBUG.
    logs.setup_logging(level, "json" if log_format == "json" else "text")
    if log_format == "json":
        logging.captureWarnings(True)  # warnings as JSON lines too, not raw stderr text

    def open_ledger_waiting(app_ledger: Callable[[], object]) -> None:
        # A worker often starts before its database (boot order, a restart, maintenance):
        # keep trying to open the ledger until --ledger-wait-s has passed, backing off from
        # 0.5 s to 5 s; give up (re-raising the last error) when the next try would start
        # after the deadline.
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(LedgerUnavailable),
            wait=tenacity.wait_exponential(multiplier=0.5, min=0.5, max=5.0),
            stop=tenacity.stop_before_delay(ledger_wait_s),
            before_sleep=lambda state: log.warning(
                "ledger unavailable (%s); retrying in %.1f s",
                state.outcome.exception() if state.outcome else "?",
                state.next_action.sleep if state.next_action else 0.0,
            ),
            reraise=True,
        )
        retrying(app_ledger)

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
        if log_format == "json":
            installed.append(logs.AttemptLog())
        metrics_server = None
        if metrics_port is not None:
            from prometheus_client import disable_created_metrics

            from ..observe.metrics import MetricsServer, WorkerMetrics

            worker_metrics = WorkerMetrics(process=True)
            installed.insert(0, worker_metrics)
            metrics_server = MetricsServer(worker_metrics.registry, metrics_host, metrics_port)
            disable_created_metrics()  # type: ignore[no-untyped-call]  # one worker: half the series
            log.info("metrics on %s", metrics_server.url)
        app.configure(ledger=ledger)
        open_ledger_waiting(lambda: app.ledger)  # opens (and migrates) the ledger now
        w = Worker(
            app,
            middleware=installed,
            concurrency=concurrency,
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
        )
        w.install_signal_handlers()
        log.info("worker %s: tasks %s, concurrency %d, prefetch %d, writers %d, ledger %s",
                 w.holder, [f"{n} v{v}" for n, v in w.kinds], concurrency, w.prefetch,
                 w.writers, redact_url(app.ledger.config.url))
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
        code = w.exit_code
        if stats.stuck_threads:
            # Threads stuck in task code cannot be joined, and one may hold a lock the
            # interpreter's shutdown needs: leave at once (everything is committed).
            log.warning("worker %s: exiting with %d task thread(s) still stuck in task code",
                        w.holder, stats.stuck_threads)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)
        if code:
            raise typer.Exit(code)

    _guard(run)


@cli.command(cls=_Command)
def submit(
    app_spec: AppArg,
    name: Annotated[str, typer.Argument(metavar="NAME", help="Registered task name.")],
    params: Annotated[
        str,
        typer.Option("--params", metavar="JSON",
                     help="Params as a JSON object, e.g. '{\"order_id\": \"o-1\"}'."),
    ] = "{}",
    key: Annotated[
        str | None,
        typer.Option("--key", metavar="KEY",
                     help="Idempotency key: the same key and params return the same task."),
    ] = None,
    delay_s: Annotated[
        float,
        typer.Option("--delay-s", min=0.0, max=MAX_DELAY_S, metavar="SECONDS",
                     help="Earliest start, seconds from now."),
    ] = 0.0,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", metavar="TENANT",
                     help="Whose work it is (tenant limits of `ratchet limits` count it)."),
    ] = None,
    task_version: Annotated[
        int | None,
        typer.Option("--task-version", min=1, max=MAX_VERSION, metavar="N",
                     help="Definition version to pin (default: the newest the app defines)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit one task.

    The params are validated against the task function's signature (or its params model)
    first: a missing, unknown or mistyped field is refused, naming it, and nothing is
    written.

    Resubmitting with the same --key and params returns the same task id and writes
    nothing; the same key with other params is refused (IdempotencyConflict).
    """

    def run() -> None:
        decoded = _json_arg(params, "--params")
        if not isinstance(decoded, dict):
            raise InvalidArguments(
                "--params must be a JSON object, e.g. '{\"order_id\": \"o-1\"}'"
            )
        app = load_app(app_spec)
        app.configure(ledger=ledger)
        handle = Control(app=app).submit(name, decoded, idempotency_key=key, delay_s=delay_s,
                                         tenant=tenant, version=task_version)
        if as_json:
            echo_json({"task_id": handle.task_id, "name": handle.name, "created": handle.created})
            return
        verb = "submitted" if handle.created else "already submitted (same key and params)"
        console().print(line((handle.task_id, ""), f" {verb}"))

    _guard(run)


def _rate(rate: float) -> str:
    """A rate, tasks per second, to three significant digits."""
    return "0" if rate == 0 else f"{rate:.3g}"


def _per_s(rate: float) -> str:
    return f"{_rate(rate)}/s"


def _drain(v: TypeStatusView) -> tuple[str, str]:
    """The drain column of ``ratchet status`` (the record's own verdict,
    :attr:`TypeStatusView.drain`) and its style: yellow when paused, limited or not
    draining, green while it drains."""
    if v.paused is not None or v.limited or (v.backlog and v.drain_eta_s is None):
        return v.drain, "yellow"
    return v.drain, "green" if v.backlog else ""


def _status_view(s: StatusReport) -> list[RenderableType]:
    """The text form of ``ratchet status``: what to print, in order."""
    parts: list[RenderableType] = []
    order = [st.value for st in State]
    present = [st for st in order if any(st in v.counts for v in s.types)]
    present += sorted({k for v in s.types for k in v.counts} - set(order))
    table = Table(title="tasks by type and state (what the ledger holds)")
    table.add_column("task", overflow="fold")
    for st in present:
        table.add_column(st, justify="right")
    table.add_column("total", justify="right")
    rows = list(s.types) + ([s.totals] if s.totals is not None and len(s.types) > 1 else [])
    for v in rows:
        style = "bold" if v is s.totals else ""
        table.add_row(field("all types" if v is s.totals else v.name, style),
                      *(field(v.counts.get(st, 0) or "-") for st in present),
                      field(v.total, style))
    if not s.types:
        table.add_row("(no tasks)", "")
    parts.append(table)
    cap = Table(title=f"capacity (rates over the last {s.window_s:g} s)")
    for col in ("task", "backlog", "scheduled", "running", "in/s", "done/s", "net/s",
                "drain", "oldest pending", "unknown", "oldest unknown", "quarantined"):
        cap.add_column(col, overflow="fold",
                       justify="left" if col in ("task", "drain") else "right")
    for v in rows:
        drain, drain_style = _drain(v)
        cap.add_row(field("all types" if v is s.totals else v.name,
                          "bold" if v is s.totals else ""),
                    field(v.backlog), field(v.scheduled), field(v.running),
                    field(_rate(v.arrival_per_s)), field(_rate(v.completion_per_s)),
                    field(("+" if v.net_drain_per_s > 0 else "") + _rate(v.net_drain_per_s)),
                    field(drain, drain_style), field(_span(v.oldest_pending_age_s)),
                    field(v.unknown, "bold yellow" if v.unknown else ""),
                    field(_span(v.oldest_unknown_age_s)),
                    field(v.quarantined, "yellow" if v.quarantined else ""))
    if not s.types:
        cap.add_row("(no tasks)", "")
    parts.append(cap)
    parts.append(line("running: leased tasks, executing or prefetched by a worker (up to "
                      "--prefetch per worker); done/s: finished or gone UNKNOWN; in/s and "
                      "done/s are averages over the window; net/s and the drain estimate "
                      "too, or over its last quarter once arrivals stopped (the drain column "
                      "says which)"))
    age = f"{s.oldest_pending_age_s:.1f} s" if s.oldest_pending_age_s is not None else "-"
    parts.append(line(f"oldest pending age: {age}"))
    parts.append(line(f"unknown (waiting for an operator): {s.unknown}"))
    for ver in s.versions:
        if ver.waiting:
            parts.append(line(("waiting: ", "bold yellow"), f"{ver.ready} task(s) of ",
                              (ver.name, "bold"), f" version {ver.version}: {ver.note} (they "
                              "run once a worker that has it starts)"))
    duplicates = s.late_effects - s.late_effects_accounted_for
    late_style = "bold yellow" if duplicates else ""
    parts.append(line("late effects (possible duplicates, see ratchet late-effects): ",
                      (str(duplicates), late_style),
                      f" (and {s.late_effects_accounted_for} accounted for)"
                      if s.late_effects_accounted_for else ""))
    parts.append(line(
        f"claims: {s.claims}  takeovers: {s.takeovers}  revocations of dead holders: "
        f"{s.revocations}  stale-generation rejections: {s.stale_rejections}  "
        f"lookup hits: {s.lookup_hits}  idempotency conflicts: {s.idempotency_conflicts}"
        f"  operator actions: {s.operator_actions}"
    ))
    for p in s.pauses:
        what = {"all": "everything", "type": f"type {p.target}",
                "task": f"task {p.target}"}[p.scope]
        parts.append(line(("PAUSED ", "bold yellow"), (what, "bold"),
                          f" (version {p.version}) by ", (p.paused_by, ""), " since ",
                          _when(p.created_at), " UTC: ", (p.reason, ""),
                          f"; running, short of a safe boundary: {p.running}"))
    settings = ", ".join(f"{k}={v}" for k, v in s.backend_settings.items())
    parts.append(line("durability: ", (s.durability, "bold"), " (", (settings, ""),
                      f"); schema v{s.schema_version}; ledger ", (s.ledger, ""),
                      f"; ledger time {_when(s.ledger_now)} UTC"))
    return parts


def _watch_frames(read: Callable[[], T], show: Callable[[T], None], every_s: float,
                  count: int | None) -> None:
    """Call ``show(read())`` every ``every_s`` seconds, ``count`` times (None: until
    Ctrl-C, which ends it with status 0)."""
    shown = 0
    try:
        while True:
            started = time.monotonic()
            show(read())
            shown += 1
            if count is not None and shown >= count:
                return
            time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return


@cli.command(cls=_Command)
def status(
    interval: Annotated[
        str | None,
        typer.Argument(metavar="SECONDS", show_default=False,
                       help="With --watch: seconds between redraws (default 2)."),
    ] = None,
    window: Annotated[
        str,
        typer.Option("--window", metavar="SECONDS",
                     help="Arrival and completion rates over the last SECONDS (90, 5m, 1h;"
                     " at most 24h)."),
    ] = "60",
    watch: Annotated[
        bool,
        typer.Option("--watch", help="Redraw every [SECONDS] (default 2) until Ctrl-C;"
                     " with --json: one JSON line per read."),
    ] = False,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, metavar="N", help="With --watch: stop after N reads."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Per task type: counts by state, backlog, rates, drain ETA; and health.

    Capacity per type (and over all types): backlog (ready now), scheduled (delayed or
    backing off), running, arrival and completion rates over --window, the net drain rate
    with "drains in ~X" while it is positive or "backlog growing by N/s", the oldest
    pending age, unknown (and the oldest unknown's age) and quarantined. Counts are what
    the ledger holds and add up to the total. Also: late effects, claims, takeovers,
    revocations, stale-generation rejections, pauses, durability and schema version.
    --watch [SECONDS] redraws until Ctrl-C (--count N: N reads, then exit).
    """

    def run() -> None:
        window_s = parse_duration_s(window, "--window", maximum_s=MAX_WINDOW_S,
                                    above_zero=True)
        every_s = 2.0
        if interval is not None:
            if not watch:
                raise InvalidArguments(
                    f"a SECONDS argument ({interval!r}) goes with --watch only")
            every_s = parse_duration_s(interval, "--watch SECONDS", minimum_s=MIN_WATCH_S,
                                       maximum_s=MAX_WATCH_S)
        if count is not None and not watch:
            raise InvalidArguments("--count goes with --watch only")
        with Control(ledger) as control:
            if not watch:
                report = control.status(window_s)
                if as_json:
                    echo_json(report)
                else:
                    out = console()
                    for part in _status_view(report):
                        out.print(part)
                return
            read = functools.partial(control.status, window_s)
            if as_json:
                _watch_frames(read, echo_json_line, every_s, count)
                return
            if stdout_is_terminal():
                with Live(console=console(), auto_refresh=False,
                          redirect_stdout=False) as live:
                    _watch_frames(read, lambda r: live.update(
                        Group(*_status_view(r), line(
                            f"every {every_s:g} s; Ctrl-C to stop")), refresh=True),
                        every_s, count)
                return

            def show(r: StatusReport) -> None:
                out = console()
                out.print(line(f"== ratchet status at {_when(r.ledger_now)} UTC"))
                for part in _status_view(r):
                    out.print(part)
                sys.stdout.flush()

            _watch_frames(read, show, every_s, count)

    _guard(run)


@cli.command(cls=_Command)
def tasks(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", metavar="STATE",
                     help="Only this state (repeat for several): PENDING, RUNNING, "
                     "RETRY_WAIT, UNKNOWN, PAUSED, SUCCEEDED, FAILED, CANCELLED."),
    ] = None,
    task_type: Annotated[
        list[str] | None,
        typer.Option("--type", metavar="NAME", help="Only this task type (repeatable)."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", metavar="KEY", help="The submit idempotency key.")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option("--older-than", metavar="AGE",
                     help="Created more than AGE ago (90s, 5m, 1.5h, 7d)."),
    ] = None,
    newer_than: Annotated[
        str | None,
        typer.Option("--newer-than", metavar="AGE", help="Created less than AGE ago."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=1000, metavar="N", help="Tasks per page.")
    ] = 50,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", metavar="CURSOR",
                     help="The next page: the cursor the previous page printed."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List tasks, newest first: filter by state, type, key and age; paginated.

    E.g. the tasks waiting for an operator: ratchet tasks --state UNKNOWN.
    """

    def run() -> None:
        with Control(ledger) as control:
            page = control.list_tasks(
                state=state or None, name=task_type or None, key=key,
                older_than_s=parse_duration_s(older_than, "--older-than")
                if older_than is not None else None,
                newer_than_s=parse_duration_s(newer_than, "--newer-than")
                if newer_than is not None else None,
                limit=limit, cursor=cursor,
            )
            now = control.ledger_now() if not as_json else 0.0
        if as_json:
            echo_json(page)
            return
        table = Table(title="tasks (newest first)")
        for column in ("task", "type", "state", "attempt", "created (UTC)", "runs at (UTC)",
                       "key", "last error"):
            table.add_column(column, overflow="fold")
        for t in page.tasks:
            error = ""
            if t.last_error:
                error = clip(error_summary(t.last_error), 120)
                if error and t.state is State.SUCCEEDED:
                    error = f"(earlier attempt) {error}"  # not why it failed: it did not
            table.add_row(field(t.task_id), field(t.name), _state_cell(t),
                          field(f"{t.attempt}/{t.max_attempts}"), field(_when(t.created_at)),
                          field(_runs_at(t, now)), field(t.idempotency_key or "-"),
                          field(error, "dim" if t.state is State.SUCCEEDED else ""))
        if not page.tasks:
            table.add_row("(none)", "", "", "", "", "", "", "")
        console().print(table)
        if page.next_cursor is not None:
            console().print(line("more: ratchet tasks ... --cursor ", (page.next_cursor, "")))

    _guard(run)


_WORKER_STATES = {
    "alive": ("alive", "green"),
    "stopped": ("STOPPED (clean exit)", "dim"),
    "dead": ("DEAD (revoked)", "bold red"),
}


@cli.command(cls=_Command)
def workers(
    prune_after: Annotated[
        str | None,
        typer.Option("--prune-after", metavar="AGE",
                     help="First delete the rows of workers stopped or dead (never alive"
                     " ones) last seen more than AGE ago (24h, 30m). Running workers do"
                     " this themselves once a minute with AGE 24h."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The worker registry.

    Holder, host, pid, state: alive, STOPPED (clean exit) or DEAD (its leases were revoked
    by a same-host peer that found its process gone); for an alive worker on this host
    what the OS says of its process (running, stopped, disk-sleep, zombie, gone), and the
    time since its last heartbeat: an alive worker
    whose heartbeat is older than its lease (the shortest of its task types', at least
    10 s) is UNRESPONSIVE (frozen, hung or cut off; its leases expire). Rows of stopped
    and dead workers are kept 24 h after their last heartbeat, then running workers delete
    them (--prune-after AGE: now, for an older AGE).
    """

    def run() -> None:
        age = (parse_duration_s(prune_after, "--prune-after")
               if prune_after is not None else None)
        with Control(ledger) as control:
            pruned = control.prune_workers(age) if age is not None else []
            found = control.workers()
        if as_json:
            echo_json(found)
            return
        table = Table(title="workers")
        for column in ("holder", "host", "pid", "state", "process", "last seen"):
            table.add_column(column, overflow="fold")
        for w in found:
            label, style = _WORKER_STATES.get(w.state, (w.state, ""))
            if w.unresponsive:
                label, style = "alive, UNRESPONSIVE", "bold yellow"
            gone = w.process_gone
            seen = f"{_span(w.last_seen_age_s)} ago"
            if w.unresponsive:
                seen += f" (past its {w.lease_s:g}s lease)"
            table.add_row(field(w.holder, "dim" if w.state != "alive" else ""),
                          field(w.hostname), field(w.pid), field(label, style),
                          field(w.process + (" (not yet revoked)" if gone else ""),
                                "bold red" if gone else "" if w.process in (
                                    "running", "-", "other host") else "bold yellow"),
                          field(seen, "bold yellow" if w.unresponsive else ""))
        if not found:
            table.add_row("(none registered)", "", "", "", "", "")
        out = console()
        out.print(table)
        by_state = {st: sum(1 for w in found if w.state == st) for st in _WORKER_STATES}
        stuck = sum(1 for w in found if w.unresponsive)
        out.print(line(f"{by_state['alive']} alive"
                       + (f" ({stuck} unresponsive: no heartbeat within its lease)"
                          if stuck else "") + f", {by_state['stopped']} stopped, "
                       f"{by_state['dead']} dead"
                       + (f"; pruned {len(pruned)} stopped/dead row(s) older than "
                          f"{prune_after}" if prune_after is not None else "")))

    _guard(run)


@cli.command(cls=_Command)
def definitions(ledger: LedgerOpt = None, as_json: JsonOpt = False) -> None:
    """Task definitions workers registered when they started.

    Name, version, lease, retry attempts, live workers that have it (alive in the registry,
    seen within 30 s) and when it was last registered. A version no live worker has is
    not claimed by anyone: its tasks wait (ratchet status).
    """

    def run() -> None:
        with Control(ledger) as control:
            found = control.definitions()
        if as_json:
            echo_json(found)
            return
        table = Table(title="definitions")
        for column in ("task", "version", "lease", "attempts", "live workers", "registered"):
            table.add_column(column, overflow="fold")
        for d in found:
            spec: dict[str, Any] = d.spec if isinstance(d.spec, dict) else {}
            retry = spec["retry"] if isinstance(spec.get("retry"), dict) else {}
            table.add_row(field(d.name), field(d.version), field(spec.get("lease_s", "?")),
                          field(retry.get("max_attempts", "?")),
                          field(d.live_workers, "" if d.live_workers else "yellow"),
                          field(f"{d.last_registered_age_s:.1f} s ago"))
        if not found:
            table.add_row("(none registered)", "", "", "", "", "")
        console().print(table)

    _guard(run)


def _runs_at(t: TaskInfo, now: float) -> str:
    """When a waiting task becomes ready: ``HH:MM:SS (in 5m00s)`` for a ``PENDING`` /
    ``RETRY_WAIT`` task scheduled after ``now``, ``-`` otherwise."""
    if t.state not in (State.PENDING, State.RETRY_WAIT) or t.run_at <= now:
        return "-"
    day = datetime.fromtimestamp(t.run_at, UTC).strftime("%Y-%m-%d ")
    today = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d ")
    return f"{day if day != today else ''}{_when(t.run_at)} (in {_span(t.run_at - now)})"


def _state_cell(t: TaskInfo) -> Text:
    """A task's state, with ``quarantined`` for a quarantined ``FAILED`` task."""
    if t.quarantined:
        return line((t.state, ""), (" quarantined", "bold yellow"))
    return field(t.state)


def _print_timeline(tl: TaskTimeline, now: float, with_traceback: bool = False) -> None:
    """The text form of ``ratchet inspect`` (``with_traceback``: the last error's whole
    message and its traceback too)."""
    out = console()
    t = tl.task
    out.print(line((t.name, "bold"), " ", (t.task_id, ""), "  state=", (t.state, "bold"),
                   f" generation={t.generation} attempt={t.attempt}/{t.max_attempts} key=",
                   (t.idempotency_key if t.idempotency_key is not None else "-", "")))
    if t.tenant is not None:
        out.print(line("tenant: ", (t.tenant, "")))
    if t.undecodable:
        out.print(line(("undecodable", "bold yellow"), ": ", (", ".join(t.undecodable), ""),
                       " (shown as stored; bytes that are not valid UTF-8 as \\x escapes, a"
                       " state that is not a known one as it is: never claimed or moved)"))
    if _runs_at(t, now) != "-":
        out.print(line("scheduled: runs at ", (_runs_at(t, now), ""), " UTC"))
    if t.quarantined:
        out.print(line(("quarantined", "bold yellow"), ": not retried automatically (ratchet"
                       " quarantine list; ratchet quarantine replay re-queues it)"))
    out.print(line("params: ") + show_value(t.params))
    if t.result is not None:
        out.print(line("result: ") + show_value(t.result))
    if t.last_error:
        # The type and the first line of the message; "\n" only (a "\r" is data).
        label = ("last error (an earlier attempt; it succeeded): "
                 if t.state is State.SUCCEEDED else "last error: ")
        out.print(line(label, (error_summary(t.last_error) or repr(t.last_error), "")))
        if with_traceback:
            out.print(line(("error message:", "bold")))
            out.print(line((t.last_error, "")))
            out.print(line(("traceback:", "bold")))
            out.print(line((t.last_traceback or "(none recorded)", "")))
        elif t.last_traceback or "\n" in t.last_error.strip():
            out.print(line(("(the whole message and the traceback: ratchet inspect "
                            "--traceback)", "dim")))
    table = Table(title="timeline")
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("event", overflow="fold")
    table.add_column("gen", justify="right")
    table.add_column("holder", overflow="fold")
    table.add_column("detail", overflow="fold")
    # (time, order within the same instant, ...): submitted, claims, steps and effects,
    # then transitions, so a same-millisecond completion sorts after its last step.
    rows: list[tuple[float, int, str, str, str, str]] = [
        (t.created_at, 0, "submitted", "-", "-",
         f"key={t.idempotency_key}" if t.idempotency_key is not None else "no key")
    ]
    for e in tl.events:
        label = e.kind if e.kind != "transition" else f"{e.from_state} -> {e.to_state}"
        shown = {k: v for k, v in e.detail.items() if k != "error"}
        rows.append((e.at, 3 if e.kind == "transition" else 1, label,
                     str(e.generation or "-"), e.holder or "-",
                     plain(show_value(shown)) if shown else ""))
    for s in tl.steps:
        rows.append((s.committed_at, 2, f"step {s.name} done", str(s.generation), "-", ""))
    for eff in tl.effects:
        rows.append((eff.updated_at, 2, f"effect {eff.name} {plain(eff.state)}",
                     str(eff.generation), "-",
                     f"key={eff.key} calls={eff.calls}"
                     + (" via lookup" if eff.via_lookup else "")))
    for le in tl.late_effects:
        what = ("accounted for: the only request sent; a lookup hit settled the effect"
                if le.kind == LATE_ACCOUNTED_FOR else "possible duplicate")
        rows.append((le.at, 2, f"LATE effect {le.effect} ({le.outcome})", str(le.generation),
                     le.holder, f"key={le.key} {what}; sent after a takeover"))
    for at, _, label, gen, holder, detail in sorted(rows, key=lambda r: (r[0], r[1])):
        table.add_row(field(_when(at)), field(label), field(gen), field(holder), field(detail))
    out.print(table)
    duplicates = [le for le in tl.late_effects if le.kind != LATE_ACCOUNTED_FOR]
    if duplicates:
        out.print(line(("warning: ", "yellow"), f"{len(duplicates)} late effect(s): a "
                       "holder sent a call after its claim was taken over; check the target "
                       "for a duplicate (ratchet late-effects)"))


@cli.command(cls=_Command)
def inspect(
    task_id: TaskArg,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
    with_traceback: Annotated[
        bool, typer.Option("--traceback", help="Also the last error's whole message and "
                           "its traceback (in --json: task.last_traceback, always).")
    ] = False,
) -> None:
    """One task and its timeline.

    Params, result, last error (its type and the first line of its message; --traceback
    for the rest); claims, steps, effects, retries, stale rejections and operator actions
    in order.
    """

    def run() -> None:
        with Control(ledger) as control:
            tl = control.inspect(task_id)
            now = control.ledger_now() if not as_json else 0.0
        if as_json:
            echo_json(tl)
        else:
            _print_timeline(tl, now, with_traceback)

    _guard(run)


@cli.command("late-effects", cls=_Command)
def late_effects(
    task: Annotated[
        str | None, typer.Option("--task", metavar="TASK_ID", help="Only this task's.")
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10000, metavar="N", help="At most N, newest first.")
    ] = 100,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Calls stale holders sent after a takeover: possible duplicates, or accounted for.

    A holder frozen between its lease check and its send (SIGSTOP, GC pause, VM migration)
    can send after another holder took the task over. Targets that honour the key or check
    fencing tokens absorb it; at a lookup-only target it may have executed twice. Each
    record shows the late call's key and generation, what the ledger recorded, and its
    kind: accounted_for when the new holder's lookup found this call's execution and
    settled the effect with it (the only request sent), else possible_duplicate.
    """

    def run() -> None:
        with Control(ledger) as control:
            found = control.late_effects(task, limit)
        if as_json:
            echo_json(found)
            return
        table = Table(title="late effects")
        for column in ("at (UTC)", "task", "effect", "key", "gen", "holder", "outcome",
                       "kind", "ledger recorded"):
            table.add_column(column, overflow="fold")
        for le in found:
            gen = le.recorded_generation if le.recorded_generation is not None else "-"
            recorded = (f"key={le.recorded_key} gen={gen}"
                        if le.recorded_key is not None else "-")
            kind = le.kind.replace("_", " ")
            table.add_row(field(_when(le.at)), field(f"{le.task_name} {le.task_id}"),
                          field(le.effect), field(le.key), field(le.generation),
                          field(le.holder), field(le.outcome),
                          field(kind, "" if le.kind == LATE_ACCOUNTED_FOR else "bold yellow"),
                          field(recorded))
        if not found:
            table.add_row("(none)", "", "", "", "", "", "", "", "")
        console().print(table)
        accounted = sum(le.kind == LATE_ACCOUNTED_FOR for le in found)
        console().print(line(f"{len(found) - accounted} possible duplicate(s): check the "
                             f"target; {accounted} accounted for (a lookup hit settled the "
                             "effect with the late call, the only one sent)"))

    _guard(run)


@cli.command(cls=_Command)
def reconcile(
    task_type: Annotated[str, typer.Argument(metavar="TYPE", help="The task type to check.")],
    app_spec: Annotated[
        str,
        typer.Option("--app", metavar="MODULE:APP",
                     help="The application whose lookups (App.lookup) ask the targets."),
    ],
    since: Annotated[
        str,
        typer.Option("--since", metavar="AGE",
                     help="Only tasks submitted within AGE (90s, 5m, 24h, 7d), or 'all'."),
    ] = "24h",
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100_000, metavar="N",
                          help="At most N effects, newest task first."),
    ] = 1000,
    apply: Annotated[
        bool, typer.Option("--apply",
                           help="Resolve the unambiguous findings (audited; needs --reason)."),
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT",
                                 help="Why (kept in the audit log); required with --apply."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who reconciles, for the audit log (default: $USER / login name)."),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, max=64, metavar="N",
                          help="Lookups at once."),
    ] = 4,
    rate: Annotated[
        str, typer.Option("--rate", metavar="RATE",
                          help="Lookups started at most this often (20/s, 300/m), or 'none'."),
    ] = "20/s",
    lookup_timeout: Annotated[
        str, typer.Option("--lookup-timeout", metavar="SECONDS",
                          help="Time each lookup may take; slower counts as unknown."),
    ] = "10s",
    lookup_retries: Annotated[
        int, typer.Option("--lookup-retries", min=0, max=MAX_LOOKUP_RETRIES, metavar="N",
                          help="Tries again a lookup that raised (a 503, a refused "
                          "connection) up to N times, with jittered backoff."),
    ] = 2,
    no_record: Annotated[
        bool, typer.Option("--no-record",
                           help="Do not audit the run and its findings in the ledger."),
    ] = False,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ask the targets whether they agree with the ledger, for recent effects of TYPE.

    Each effect's lookup registered with App.lookup(TYPE, EFFECT) is asked for its key.
    Findings: absent (recorded done, the target has no such key), unrecorded (the target
    has it, the ledger records an open intent / not_done / given_up), not_executed (an
    UNKNOWN task's open intent the target confirms never executed), unknown (the lookup
    raised, tried --lookup-retries times more, or timed out), late (a stale holder's late
    call: a possible duplicate), no_lookup (effects of a name with no registered lookup).
    Nothing changes unless --apply: then an UNKNOWN task whose one open effect the target
    has is resolved done with the target's answer, and one the target confirms absent is
    resolved not-done (audited with --operator and --reason); the rest is left for a
    person. Every run is audited (kinds reconcile, reconcile_<outcome>) unless
    --no-record. Exit status: 0 no finding left, 1 findings left (disagreement or not
    checked), 2 an error.
    """
    outcome: dict[str, int] = {}

    def run() -> None:
        window = None if since.strip().lower() == "all" else parse_duration_s(since, "--since")
        per_s = None if rate.strip().lower() == "none" else parse_rate_per_s(rate, "--rate")
        timeout_s = parse_duration_s(lookup_timeout, "--lookup-timeout",
                                     maximum_s=MAX_LOOKUP_TIMEOUT_S, above_zero=True)
        app = load_app(app_spec)
        if ledger is not None:
            app.configure(ledger=ledger)
        with Control(app=app) as control:
            report = run_reconcile(
                control, app, task_type, newer_than_s=window, limit=limit, apply=apply,
                reason=reason, by=operator, concurrency=concurrency, rate_per_s=per_s,
                lookup_timeout_s=timeout_s, lookup_retries=lookup_retries,
                record=not no_record)
        outcome["open"] = report.open_findings
        if as_json:
            echo_json(report)
            return
        out = console()
        table = Table(title=f"reconcile {task_type}: findings")
        for column in ("outcome", "task", "state", "effect", "key", "ledger", "target",
                       "action", "note"):
            table.add_column(column, overflow="fold")
        for f in report.findings:
            action = f.action if f.action == "none" else (
                f"{f.action}: {'done' if f.applied else 'not applied'}" if report.apply
                else f"{f.action} (with --apply)")
            target = "-" if f.target is None else show_value(f.target)
            table.add_row(field(f.outcome), field(f.task_id or "-"), field(f.task_state or "-"),
                          field(f.effect), field(f.key or "-"), field(f.recorded or "-"),
                          target, field(action), field(f.note))
        if not report.findings:
            table.add_row("(none)", "", "", "", "", "", "", "", "")
        out.print(table)
        counts = "  ".join(f"{k}: {n}" for k, n in report.counts.items())
        out.print(line(
            f"{report.effects} effect(s) walked", " (more left past --limit)"
            if report.truncated else "", f", {report.lookups} lookup(s), {report.agreed} "
            f"agree, {report.in_flight} in flight (RUNNING, not asked); ", counts,
            f"; resolved: {report.resolved}; left: {report.open_findings}",
            "" if report.recorded else " (not recorded)"))

    _guard(run)
    if outcome.get("open"):
        raise typer.Exit(1)


@cli.command(cls=_Command)
def resolve(
    task_id: TaskArg,
    outcome: Annotated[
        str,
        typer.Option("--outcome", metavar="done|not-done|give-up",
                     help="done: the effect happened; not-done: it did not; give-up: nobody "
                          "can tell, end the task FAILED."),
    ],
    reason: ReasonOpt = None,
    result: Annotated[
        str | None,
        typer.Option("--result", metavar="JSON",
                     help="For done only: the effect's result as JSON."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who decided (default: $USER / the login name)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Settle an UNKNOWN task's open effect.

    The verdict is audited with --reason and --operator; the task then resumes (done: the
    effect returns --result; not-done: the call is made again with the same key), or
    give-up: it ends FAILED with the reason and its open effects are marked given up
    (ratchet retry can run it again, lookup first). A cancel or pause waiting for the
    resolution is applied instead of resuming. --result goes with done only.
    """

    def run() -> None:
        why = _reason(reason)
        if result is not None and outcome != "done":
            raise InvalidArguments(
                f"--result goes with --outcome done only, not {outcome!r} (nothing changed)")
        value = _json_arg(result, "--result") if result is not None else None
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            info = control.resolve(task_id, outcome, value, reason=why, by=who)
        if outcome == "done" and result is None:  # only once the resolve was accepted
            err_console().print(line(
                ("warning: ", "yellow"),
                "no --result given: the effect's result was recorded as null, and the task "
                "resumes with None as the effect's return value",
            ))
        if as_json:
            echo_json(info)
            return
        console().print(line((info.task_id, ""), " resolved (", (outcome, ""), ") by ",
                             (who, ""), " now ", (info.state, "")))

    _guard(run)


limits_cli = typer.Typer(
    help="Cluster-wide concurrency limits (bulkheads). Without a command: every limit with "
         "its live use (running, ready, oldest ready age), the use per task type, and the "
         "latest limit changes. Limits live in the ledger: every worker's claim obeys them.",
    invoke_without_command=True, add_completion=False, pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
cli.add_typer(limits_cli, name="limits")

LimitTypeOpt = Annotated[
    str | None, typer.Option("--type", metavar="NAME", help="A task type.")]
TenantOpt = Annotated[
    str | None, typer.Option("--tenant", metavar="TENANT", help="A tenant (App.submit tenant=).")]
OperatorOpt = Annotated[
    str | None,
    typer.Option("--operator", metavar="NAME",
                 help="Who decided (default: $USER / the login name)."),
]


def _limit_scope(type_name: str | None, tenant: str | None, total: bool) -> tuple[str, str]:
    """``(scope, name)`` of exactly one of --type / --tenant / --total."""
    given = [(s, n) for s, n, on in (("type", type_name or "", type_name is not None),
                                     ("tenant", tenant or "", tenant is not None),
                                     ("total", "", total)) if on]
    if len(given) != 1:
        raise InvalidArguments("give exactly one of --type NAME, --tenant TENANT, --total")
    return given[0]


@limits_cli.callback()
def limits(
    ctx: typer.Context, ledger: LedgerOpt = None, as_json: JsonOpt = False
) -> None:
    """Show every concurrency limit with its live use (running, ready, oldest ready age),
    the use of every task type, and the latest limit changes.

    Limits live in the ledger and hold cluster-wide: every worker's claim obeys them.
    """
    if ctx.invoked_subcommand is not None:
        return

    def run() -> None:
        with Control(ledger) as control:
            report = control.limits()
        if as_json:
            echo_json(report)
            return
        out = console()
        table = Table(title="concurrency limits")
        for col in ("scope", "name", "reserved", "max", "running", "ready", "oldest ready",
                    "set by", "reason"):
            table.add_column(col, overflow="fold")
        for v in report.limits:
            age = f"{v.oldest_ready_age_s:.1f} s" if v.oldest_ready_age_s is not None else "-"
            table.add_row(field(v.scope), field(v.name or "-"), field(v.reserved),
                          field(v.maximum if v.maximum is not None else "-"),
                          field(v.running), field(v.ready), field(age),
                          field(f"{v.updated_by} v{v.version}"), field(v.reason))
        if not report.limits:
            table.add_row("(none: no limit applies)", "", "", "", "", "", "", "", "")
        out.print(table)
        usage = Table(title="use per task type")
        for col in ("task", "running", "ready", "oldest ready"):
            usage.add_column(col, overflow="fold")
        for u in report.usage:
            age = f"{u.oldest_ready_age_s:.1f} s" if u.oldest_ready_age_s is not None else "-"
            usage.add_row(field(u.name), field(u.running), field(u.ready), field(age))
        if not report.usage:
            usage.add_row("(nothing running or ready)", "", "", "")
        out.print(usage)
        out.print(line(f"running in all: {report.running}"))
        if report.changes:
            out.print(line("latest limit changes:"))
        for e in report.changes[:10]:
            d = e.detail
            what = e.task_id.removeprefix("limit:")
            values = ("cleared" if e.kind == "limit_cleared" else
                      f"reserved {d.get('reserved')}, max "
                      f"{'-' if d.get('maximum') is None else d.get('maximum')}")
            out.print(line(f"  {_when(e.at)} {what} {values} by ", (str(d.get("operator")), ""),
                           ": ", (str(d.get("reason")), "")))

    _guard(run)


@limits_cli.command("set", cls=_Command)
def limits_set(
    reason: ReasonOpt = None,
    type_name: LimitTypeOpt = None,
    tenant: TenantOpt = None,
    total: Annotated[
        int | None,
        typer.Option("--total", metavar="SLOTS", help="The cluster's total of slots."),
    ] = None,
    reserved: Annotated[
        int, typer.Option("--reserved", metavar="N",
                          help="Slots of the total kept for it while it has ready work."),
    ] = 0,
    maximum: Annotated[
        int | None, typer.Option("--max", metavar="N", help="At most N running at once."),
    ] = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a limit of one task type, one tenant, or the total (replaces the old one).

    Examples: --total 200; --type payment --reserved 60; --type tracking --max 70;
    --tenant acme --max 20. Audited with --reason and --operator.
    """

    def run() -> None:
        scope, name = _limit_scope(type_name, tenant, total is not None)
        top = total if scope == "total" else maximum
        with Control(ledger) as control:
            lim = control.set_limit(scope, name, reserved=reserved, maximum=top,
                                    reason=_reason(reason), by=operator)
        if as_json:
            echo_json(lim)
            return
        what = f"{lim.scope.value} {lim.name}".strip()
        console().print(line(f"{what}: reserved {lim.reserved}, max ",
                             (str(lim.maximum) if lim.maximum is not None else "-", "bold"),
                             f" (v{lim.version}, by {lim.updated_by})"))

    _guard(run)


@limits_cli.command("clear", cls=_Command)
def limits_clear(
    reason: ReasonOpt = None,
    type_name: LimitTypeOpt = None,
    tenant: TenantOpt = None,
    total: Annotated[bool, typer.Option("--total", help="The total of slots.")] = False,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a limit of one task type, one tenant, or the total (audited); --json prints
    the limit as it was."""

    def run() -> None:
        scope, name = _limit_scope(type_name, tenant, total)
        with Control(ledger) as control:
            old = control.clear_limit(scope, name, reason=_reason(reason), by=operator)
        if as_json:
            echo_json(old)
            return
        console().print(line(f"{old.scope.value} {old.name}".strip() + " limit cleared"))

    _guard(run)


def _print_control(outcome: ControlOutcome, who: str, as_json: bool) -> None:
    """Print what an operator command did; exit 1 when it changed nothing."""
    if as_json:
        echo_json(outcome)
    else:
        style = "yellow" if outcome.outcome == "unchanged" else ""
        console().print(line((outcome.task_id, ""), f" {outcome.action} ",
                             (outcome.outcome, style or "bold"), " by ", (who, ""), ": ",
                             (outcome.message, "")))
    if outcome.outcome == "unchanged":
        raise typer.Exit(1)


@cli.command(cls=_Command)
def cancel(
    task_id: TaskArg,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a task (audited with --reason and --operator).

    Not running (pending, scheduled, retry wait, paused): cancelled at once. Running: its
    holder stops at its next step boundary (an effect in flight is settled first). With an
    open effect or UNKNOWN: cancelled once the effect is settled (lookup, or ratchet
    resolve). Exit status 0 when cancelled or requested; 1 when nothing changed (the task
    had already finished: a success committed first stays a success); 2 on an error.
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            outcome = control.cancel(task_id, reason=_reason(reason), by=who)
        _print_control(outcome, who, as_json)

    _guard(run)


quarantine_cli = typer.Typer(
    name="quarantine", no_args_is_help=True, rich_markup_mode=None,
    help="Poison tasks: list them by error fingerprint, replay them at a rate.",
)
cli.add_typer(quarantine_cli)


@quarantine_cli.command("list", cls=_Command)
def quarantine_list(
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=10000, metavar="N", help="At most N groups.")
    ] = 100,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Quarantined tasks grouped by error fingerprint, newest group first.

    A task is quarantined after the same error (task type + exception class + message with
    numbers, ids and quoted values masked) RetryPolicy.quarantine_after times in a row, or
    after as many deliveries whose worker died; it is never redelivered automatically.
    """

    def run() -> None:
        with Control(ledger) as control:
            groups = control.quarantine_list(limit)
        if as_json:
            echo_json(groups)
            return
        table = Table(title="quarantine (by fingerprint)")
        for column in ("fingerprint", "type", "tasks", "first (UTC)", "last (UTC)", "class",
                       "example", "task ids"):
            table.add_column(column, overflow="fold")
        for g in groups:
            more = " ..." if g.count > len(g.task_ids) else ""
            table.add_row(field(g.fingerprint), field(g.task_type), field(g.count),
                          field(_when(g.first_seen)), field(_when(g.last_seen)),
                          field(g.error_class or "-"), field(clip(g.example_message, 160)),
                          field(" ".join(g.task_ids) + more))
        if not groups:
            table.add_row("(none)", "", "", "", "", "", "", "")
        console().print(table)

    _guard(run)


@cli.command(cls=_Command)
def retry(
    task_id: TaskArg,
    reason: ReasonOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a FAILED task again (audited with --reason and --operator).

    A fresh set of attempts; its history is kept (done steps stay done: it resumes from its
    checkpoint). Exit status 0 when queued again; 1 when nothing changed (the task is not
    FAILED: SUCCEEDED and CANCELLED never move); 2 on an error.
    """

    def run() -> None:
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            outcome = control.retry(task_id, reason=_reason(reason), by=who)
        _print_control(outcome, who, as_json)

    _guard(run)


AllOpt = Annotated[bool, typer.Option("--all", help="Everything.")]
TypeOpt = Annotated[
    str | None, typer.Option("--type", metavar="TASK_TYPE", help="One task type.")
]
TaskOpt = Annotated[str | None, typer.Option("--task", metavar="TASK_ID", help="One task.")]


def _selector(everything: bool, task_type: str | None, task: str | None) -> tuple[str, str | None]:
    """``(scope, target)`` from exactly one of --all / --type / --task."""
    given = [(flag, scope, target) for flag, scope, target in (
        (everything, "all", None), (task_type is not None, "type", task_type),
        (task is not None, "task", task)) if flag]
    if len(given) != 1:
        raise InvalidArguments("give exactly one of --all, --type TASK_TYPE, --task TASK_ID")
    return given[0][1], given[0][2]


def _parse_rate(text: str | None) -> float | None:
    """``--rate N/s`` (or ``N``) as tasks per second."""
    return None if text is None else parse_rate_per_s(text, "--rate")


def _print_pause(result: PauseResult, who: str, as_json: bool) -> None:
    """Print what a pause / resume did; exit 1 when it changed nothing."""
    if as_json:
        echo_json(result)
    else:
        style = "yellow" if result.outcome == "unchanged" else "bold"
        console().print(line(f"{result.action} ", (result.outcome, style), " by ", (who, ""),
                             ": ", (result.message, "")))
    if result.outcome == "unchanged":
        raise typer.Exit(1)


@cli.command(cls=_Command)
def pause(
    reason: ReasonOpt = None,
    everything: AllOpt = False,
    task_type: TypeOpt = None,
    task: TaskOpt = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause everything, a task type or one task (a versioned, audited record).

    Once it returns, no new attempt starts in the scope until resume. Running tasks stop
    at their next step boundary (checkpoint committed, lease released, attempt handed
    back) and become PAUSED; an effect in flight is settled first. ratchet status shows
    each pause and its running tasks still short of a boundary. Exit status 0 when paused,
    1 when nothing changed (already paused, or the task had finished), 2 on an error.
    """

    def run() -> None:
        scope, target = _selector(everything, task_type, task)
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            result = control.pause(scope, target, reason=_reason(reason), by=who)
        _print_pause(result, who, as_json)

    _guard(run)


@cli.command(cls=_Command)
def resume(
    reason: ReasonOpt = None,
    everything: AllOpt = False,
    task_type: TypeOpt = None,
    task: TaskOpt = None,
    rate: Annotated[
        str | None,
        typer.Option("--rate", metavar="N/s",
                     help="Re-admit paused tasks at N per second (default: all at once)."),
    ] = None,
    operator: OperatorOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """End a pause (same selectors as pause; audited).

    Its PAUSED tasks not covered by another pause are ready again, at --rate per second.
    Exit status 0 when resumed, 1 when that scope was not paused, 2 on an error.
    """

    def run() -> None:
        scope, target = _selector(everything, task_type, task)
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            result = control.resume(scope, target, reason=_reason(reason), by=who,
                                    rate_per_s=_parse_rate(rate))
        _print_pause(result, who, as_json)

    _guard(run)


@quarantine_cli.command("replay", cls=_Command)
def quarantine_replay(
    fingerprint: Annotated[
        str, typer.Option("--fingerprint", metavar="F",
                          help="The fingerprint ratchet quarantine list shows.")
    ],
    rate: Annotated[
        str, typer.Option("--rate", metavar="RATE",
                          help="Admission rate: 5/s, 300/m, 1000/h (per second if no unit).")
    ] = "1/s",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be replayed; change nothing.")
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", metavar="TEXT",
                                 help="Why (kept in the audit log; required unless --dry-run).")
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who decided (default: $USER / the login name)."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=100000, metavar="N", help="At most N tasks.")
    ] = 10000,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay the quarantined tasks of one fingerprint with fresh attempt counters.

    Each becomes PENDING (attempts, failure streak and crash count reset; steps, effects
    and history kept) at a run_at staggered by the rate, audited with --reason and
    --operator. --dry-run lists them and changes nothing.
    """

    def run() -> None:
        per_s = parse_rate_per_s(rate, "--rate")
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            report = control.quarantine_replay(fingerprint, per_s, dry_run=dry_run,
                                               reason=reason, by=who, limit=limit)
        if as_json:
            echo_json(report)
            return
        table = Table(title=("would replay (dry run: nothing changed)" if dry_run
                             else f"replayed by {who}"))
        for column in ("task", "type", "ready in", "failures", "crashes"):
            table.add_column(column, overflow="fold")
        for t in report.tasks:
            table.add_row(field(t.task_id), field(t.name),
                          field(f"{max(0.0, t.run_at - report.ledger_now):.1f}s"),
                          field(t.failures), field(t.crashes))
        if not report.tasks:
            table.add_row("(none)", "", "", "", "")
        console().print(table)
        verb = "would replay" if dry_run else "replayed"
        console().print(line(f"{verb} {len(report.tasks)} task(s) at {per_s:g}/s"))

    _guard(run)


@cli.command(cls=_Command)
def prune(
    older_than: Annotated[
        str,
        typer.Option("--older-than", metavar="AGE",
                     help="Delete tasks that finished more than AGE ago (90s, 5m, 1.5h, 30d)."),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option("--batch-size", min=1, max=10000, metavar="N",
                     help="Tasks per transaction (each batch is short; claims never wait)."),
    ] = 500,
    export: Annotated[
        str | None,
        typer.Option("--export", metavar="FILE",
                     help="Append each pruned task with its history to FILE as a JSON line,"
                     " flushed to disk before its batch is deleted."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who prunes, for the audit log (default: $USER / the login name)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished tasks older than --older-than, with their history.

    SUCCEEDED, FAILED and CANCELLED tasks, their steps, effects, late effects and audit
    rows, in small batches; tasks that are not finished are never touched. A pruned task's
    idempotency key no longer deduplicates: submitting it again creates a new task (the
    dedupe window is the retention age). Audited, unless --dry-run.
    """

    def run() -> None:
        age = parse_duration_s(older_than, "--older-than", unit_required=True)
        with Control(ledger) as control:
            try:
                report = control.prune(age, dry_run=dry_run, batch_size=batch_size,
                                       export=export, by=operator)
            except OSError as exc:  # the export file: nothing was deleted
                raise InvalidArguments(
                    f"--export {export}: {exc.strerror or exc}; nothing was pruned") from exc
        if as_json:
            echo_json(report)
            return
        verb = "would delete" if report.dry_run else "deleted"
        console().print(line(
            f"{verb} {report.tasks} finished task(s) older than {older_than} (finished before ",
            (datetime.fromtimestamp(report.cutoff, UTC)
             .strftime("%Y-%m-%d %H:%M:%S"), ""),
            f" UTC): {report.steps} step(s), {report.effects} effect(s), "
            f"{report.late_effects} late effect(s), {report.audit} audit row(s)",
            f"; {report.batches} batch(es) in {report.elapsed_s:.2f} s" if not report.dry_run
            else "",
            f"; {report.exported} exported to " if export is not None else "",
            (export or "", "")))

    _guard(run)


@cli.command(cls=_Command)
def serve(
    ledger: LedgerOpt = None,
    host: Annotated[
        str,
        typer.Option("--host", metavar="HOST",
                     help="Address to listen on. Without RATCHET_API_TOKEN only loopback"
                     " (127.0.0.1, ::1, localhost) is allowed."),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, metavar="PORT",
                     help="TCP port (0: an ephemeral one, printed on start)."),
    ] = 8000,
    app_spec: Annotated[
        str | None,
        typer.Option("--app", metavar="MODULE:APP",
                     help="The application whose task registry checks submits"
                     " (POST /api/tasks); without it submitting is refused."),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option("--log-level", metavar="LEVEL",
                     help="uvicorn's log level: debug, info, warning, error."),
    ] = "info",
    metrics_auth: Annotated[
        bool,
        typer.Option("--metrics-auth",
                     help="/metrics needs the bearer token too (needs RATCHET_API_TOKEN;"
                     " Prometheus: the scrape config's authorization credentials)."
                     " Default: /metrics is open (no task ids, keys or params)."),
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", metavar="NAME",
                     help="A Host name to answer to besides localhost, 127.0.0.1, [::1] and"
                     " --host (repeat for several; '*.example.com' for subdomains; also"
                     " $RATCHET_ALLOWED_HOSTS, comma-separated): e.g. a reverse proxy's"
                     " name. Requests for any other Host are refused (400), which stops DNS"
                     " rebinding."),
    ] = None,
    body_timeout_s: Annotated[
        float | None,
        typer.Option("--body-timeout-s", min=0.001, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Seconds a request body may take to arrive; then 408 and the"
                     " connection is closed. Default: 30."),
    ] = None,
) -> None:
    """Serve the HTTP API (/api, OpenAPI at /api/openapi.json) and the dashboard.

    Stateless: several replicas may serve one ledger. With RATCHET_API_TOKEN set, every
    /api read and mutation needs 'Authorization: Bearer $RATCHET_API_TOKEN' (but
    /api/health and /api/openapi.json) and every dashboard page a login; without it the
    service listens on loopback only (another --host is refused), reads are open and
    mutations are accepted from loopback. Either way only requests for an allowed Host
    (localhost, 127.0.0.1, [::1], --host, --allowed-host) are answered. Operator actions
    take a reason and are audited with the X-Ratchet-Operator header's name.
    """
    from ..web import WebSettings
    from ..web.hosts import ALLOWED_HOSTS_ENV, parse_allowed_hosts
    from ..web.serve import serve as run_service

    level = log_level.lower()
    if level not in ("debug", "info", "warning", "error"):
        err_console().print(line(("error: ", "bold red"),
                                 "--log-level must be debug, info, warning or error, not ",
                                 (repr(log_level), "")))
        raise typer.Exit(2)
    token = os.environ.get("RATCHET_API_TOKEN") or None
    extra = (*parse_allowed_hosts(os.environ.get(ALLOWED_HOSTS_ENV)), *(allowed_host or ()))
    settings = WebSettings(ledger_url=ledger, api_token=token, app_spec=app_spec,
                           metrics_auth=metrics_auth, allowed_hosts=extra)
    if body_timeout_s is not None:
        settings = dataclasses.replace(settings, body_timeout_s=body_timeout_s)
    _guard(lambda: run_service(settings, host, port, log_level=level))


@cli.command(cls=_Command)
def migrate(ledger: LedgerOpt = None, as_json: JsonOpt = False) -> None:
    """Create the ledger or upgrade its schema.

    Also done automatically when a worker or submit first uses the ledger. --json prints
    {"schema_version": N}.
    """

    def run() -> None:
        with Control(ledger) as control:
            version = control.migrate()
        if as_json:
            echo_json({"schema_version": version})
            return
        console().print(line(f"ledger schema version {version}"))

    _guard(run)


@cli.command(cls=_Command)
def demo(
    ledger: Annotated[
        str | None,
        typer.Option(
            "--ledger", metavar="URL",
            help="Ledger URL (default: a fresh ./ratchet-demo/ledger.db). A postgresql:// URL "
            "runs in its schema= (default ratchet_demo), which is dropped and recreated first.",
        ),
    ] = None,
    tasks: Annotated[
        int, typer.Option("--tasks", min=1, metavar="N", help="Billing tasks to submit.")
    ] = 500,
    workers: Annotated[
        int, typer.Option("--workers", min=1, metavar="N",
                          help="Worker processes (the frozen senders come on top).")
    ] = 2,
    kills: Annotated[
        int,
        typer.Option("--kills", min=0, metavar="N",
                     help="Worker processes killed with SIGKILL at random moments."),
    ] = 5,
    seed: Annotated[
        int | None,
        typer.Option("--seed", metavar="N", help="Random seed (default: a fresh one)."),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option("--concurrency", min=1, metavar="N",
                     help="Task threads per worker process."),
    ] = 8,
    stall_s: Annotated[
        float,
        typer.Option("--stall-s", min=1.0, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Once every task is submitted, fail when no task changed state for "
                     "this long (the deadline follows the workload)."),
    ] = 30.0,
    deadline_s: Annotated[
        float | None,
        typer.Option("--deadline-s", min=1.0, max=MAX_WAIT_S, metavar="SECONDS",
                     help="Optional hard cap on the whole run (default: none)."),
    ] = None,
) -> None:
    """Billing demo: workers killed at random, senders frozen mid-call.

    Billing tasks against four kinds of payment target (key dedupe, fencing tokens, lookup
    only, neither), each its own faulty service process; worker processes killed with
    SIGKILL and one sender per kind frozen mid-call past its lease; a report per kind
    counted at the services' own files (non-zero exit status when a kind's guarantee is
    broken).
    """
    from ..demo.runner import DemoSettings, run_demo
    from .render import report_console

    settings = DemoSettings(concurrency=concurrency, stall_s=stall_s, deadline_s=deadline_s)
    code = _guard(lambda: run_demo(ledger, tasks=tasks, workers=workers, kills=kills, seed=seed,
                                   settings=settings, console=report_console()))
    raise typer.Exit(int(code))


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
