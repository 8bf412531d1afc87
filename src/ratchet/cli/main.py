"""The ``ratchet`` command line (Typer + Rich).

Commands: ``worker``, ``submit``, ``status``, ``inspect``, ``resolve``, ``migrate``, ``demo``.
Every command takes ``--ledger URL`` (default ``RATCHET_LEDGER_URL`` or
``sqlite:///ratchet.db``). Ratchet errors print one red line saying what to fix and exit
with status 2.
"""

from __future__ import annotations

import getpass
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from ..app import App
from ..errors import ConfigError, LedgerUnavailable, RatchetError
from ..ledger import open_ledger
from ..ledger.base import Ledger, ResolveOutcome
from ..serde import dumps
from ..states import State

__all__ = ["cli", "load_app", "main"]

cli = typer.Typer(
    name="ratchet",
    help="Recoverable task execution: leases, fencing tokens, exactly-once effects.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

LedgerOpt = Annotated[
    str | None,
    typer.Option("--ledger", help="Ledger URL (default: $RATCHET_LEDGER_URL or sqlite:///ratchet.db)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]

T = TypeVar("T")


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except RatchetError as exc:
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {exc}", highlight=False)
        raise typer.Exit(2) from None


def load_app(spec: str) -> App:
    """Import ``MODULE:attr`` and return the :class:`App` it names.

    Raises:
        ConfigError: malformed spec, module not importable, or the attribute is not an App.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(
            f"app spec {spec!r} must look like MODULE:ATTRIBUTE, e.g. myproj.tasks:app"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:  # the user's module failed while importing
        where = ""
        tb = exc.__traceback__
        while tb is not None:
            where = f" ({tb.tb_frame.f_code.co_filename}:{tb.tb_lineno})"
            tb = tb.tb_next
        raise ConfigError(
            f"importing module {module_name!r} raised {type(exc).__name__}: {exc}{where}"
        ) from exc
    if not hasattr(module, attr):
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}")
    app = getattr(module, attr)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is a {type(app).__name__}, not a ratchet.App")
    return app


def _ledger(url: str | None, must_exist: bool = True) -> Ledger:
    return open_ledger(url, must_exist=must_exist)


def _when(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%H:%M:%S.%f")[:-3]


@cli.command()
def worker(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP", help="e.g. myproj.tasks:app")],
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1)] = 8,
    names: Annotated[
        str | None, typer.Option("--names", help="Comma-separated task names (default: all).")
    ] = None,
    poll_interval_s: Annotated[float, typer.Option("--poll-interval-s", min=0.001)] = 0.1,
    ledger: LedgerOpt = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    ledger_wait_s: Annotated[
        float,
        typer.Option(
            "--ledger-wait-s", min=0.0,
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
) -> None:
    """Run a worker: claim tasks, run them, commit fenced results. SIGTERM stops gracefully."""
    from ..worker import Worker

    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        err_console.print(f"[bold red]error:[/] --log-level must be DEBUG, INFO, WARNING or ERROR,"
                          f" not {log_level!r}", highlight=False)
        raise typer.Exit(2)
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )

    def run() -> None:
        app = load_app(app_spec)
        app.configure(ledger=ledger)
        # A worker often starts before its database (boot order, a restart, maintenance):
        # keep trying to open the ledger for a while instead of exiting at once.
        deadline = time.monotonic() + ledger_wait_s
        delay = 0.5
        while True:
            try:
                app.ledger  # noqa: B018 - opens (and migrates) the ledger now
                break
            except LedgerUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    raise
                logging.getLogger("ratchet.worker").warning(
                    "ledger unavailable (%s); retrying in %.1f s", exc, delay
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        w = Worker(
            app,
            concurrency=concurrency,
            names=names.split(",") if names else None,
            poll_interval_s=poll_interval_s,
            fast_takeover=fast_takeover,
        )
        w.install_signal_handlers()
        logging.getLogger("ratchet.worker").info(
            "worker %s: tasks %s, concurrency %d", w.holder, w.names, concurrency
        )
        stats = w.run()
        logging.getLogger("ratchet.worker").info("worker %s stopped: %s", w.holder, stats)

    _guard(run)


@cli.command()
def submit(
    app_spec: Annotated[str, typer.Argument(metavar="MODULE:APP")],
    name: Annotated[str, typer.Argument(help="Registered task name.")],
    params: Annotated[str, typer.Option("--params", help="Params as a JSON object.")] = "{}",
    key: Annotated[str | None, typer.Option("--key", help="Idempotency key.")] = None,
    delay_s: Annotated[float, typer.Option("--delay-s", min=0.0)] = 0.0,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit one task; resubmitting with the same --key returns the same task id."""

    def run() -> None:
        try:
            decoded = json.loads(params)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--params is not valid JSON: {exc}") from None
        if not isinstance(decoded, dict):
            raise ConfigError("--params must be a JSON object, e.g. '{\"order_id\": \"o-1\"}'")
        app = load_app(app_spec)
        app.configure(ledger=ledger)
        handle = app.submit(name, decoded, idempotency_key=key, delay_s=delay_s)
        if as_json:
            console.print_json(
                json.dumps({"task_id": handle.task_id, "name": name, "created": handle.created})
            )
        else:
            verb = "submitted" if handle.created else "already submitted (same key and params)"
            console.print(f"{handle.task_id} {verb}")

    _guard(run)


@cli.command()
def status(ledger: LedgerOpt = None, as_json: JsonOpt = False) -> None:
    """Counts per task type and state, oldest pending age, unknowns, durability level."""

    def run() -> None:
        led = _ledger(ledger)
        s = led.stats()
        if as_json:
            console.print_json(
                json.dumps(
                    {
                        "counts": s.counts,
                        "oldest_pending_age_s": s.oldest_pending_age_s,
                        "unknown": s.unknown_count,
                        "claims": s.claims,
                        "takeovers": s.takeovers,
                        "revocations": s.revocations,
                        "stale_rejections": s.stale_rejections,
                        "lookup_hits": s.lookup_hits,
                        "idempotency_conflicts": s.idempotency_conflicts,
                        "operator_actions": s.operator_actions,
                        "durability": s.durability,
                        "backend": s.backend_settings,
                        "schema_version": s.schema_version,
                    }
                )
            )
            return
        order = {st.value: i for i, st in enumerate(State)}
        table = Table(title="tasks by type and state")
        table.add_column("task", overflow="fold")
        table.add_column("state")
        table.add_column("count", justify="right")
        for name in sorted(s.counts):
            for st, n in sorted(s.counts[name].items(), key=lambda kv: order.get(kv[0], 99)):
                table.add_row(name, st, str(n))
        if not s.counts:
            table.add_row("(no tasks)", "", "")
        console.print(table)
        age = f"{s.oldest_pending_age_s:.1f} s" if s.oldest_pending_age_s is not None else "-"
        console.print(f"oldest pending age: {age}")
        console.print(f"unknown (waiting for an operator): {s.unknown_count}")
        console.print(
            f"claims: {s.claims}  takeovers: {s.takeovers}  revocations of dead holders: "
            f"{s.revocations}  stale-generation rejections: "
            f"{s.stale_rejections}  lookup hits: {s.lookup_hits}  idempotency conflicts: "
            f"{s.idempotency_conflicts}  operator actions: {s.operator_actions}"
        )
        settings = ", ".join(f"{k}={v}" for k, v in s.backend_settings.items())
        console.print(
            f"durability: [bold]{s.durability}[/] ({settings}); schema v{s.schema_version}"
        )

    _guard(run)


@cli.command()
def workers(ledger: LedgerOpt = None, as_json: JsonOpt = False) -> None:
    """The worker registry: holder, host, pid, state (alive / stopped / dead = revoked), whether
    its process still runs (judged only on its own host), seconds since its last heartbeat."""

    from ..worker.registry import host_identity, process_gone

    def run() -> None:
        led = _ledger(ledger)
        now = led.now()
        found = led.list_workers(None)
        if as_json:
            console.print_json(json.dumps([
                {"holder": w.holder, "host_id": w.host_id, "hostname": w.hostname, "pid": w.pid,
                 "state": w.state, "started_at": w.started_at, "last_seen": w.last_seen}
                for w in found
            ]))
            return
        table = Table(title="workers")
        for column in ("holder", "host", "pid", "state", "process", "last seen"):
            table.add_column(column, overflow="fold")
        here = host_identity()
        for w in found:
            if w.state != "alive":
                process = "-"
            elif w.host_id == here:
                process = "gone" if process_gone(w.pid, w.pid_start) else "running"
            else:
                process = "other host"
            table.add_row(w.holder, w.hostname, str(w.pid), w.state, process,
                          f"{max(0.0, now - w.last_seen):.1f} s ago")
        if not found:
            table.add_row("(none registered)", "", "", "", "")
        console.print(table)

    _guard(run)


@cli.command()
def inspect(
    task_id: Annotated[str, typer.Argument(metavar="TASK")],
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The task's timeline: claims, steps, effects, retries, stale rejections, operator actions."""

    def run() -> None:
        tl = _ledger(ledger).timeline(task_id)
        t = tl.task
        if as_json:
            console.print_json(
                dumps(
                    {
                        "task": {
                            "id": t.task_id, "name": t.name, "version": t.version,
                            "state": t.state.value, "generation": t.generation,
                            "attempt": t.attempt, "max_attempts": t.max_attempts,
                            "holder": t.holder, "idempotency_key": t.idempotency_key,
                            "params": t.params, "result": t.result, "last_error": t.last_error,
                        },
                        "events": [
                            {"seq": e.seq, "at": e.at, "kind": e.kind, "from": e.from_state,
                             "to": e.to_state, "generation": e.generation, "holder": e.holder,
                             "detail": e.detail}
                            for e in tl.events
                        ],
                        "steps": [{"name": s.name, "generation": s.generation,
                                   "at": s.committed_at} for s in tl.steps],
                        "effects": [{"name": e.name, "key": e.key, "state": e.state.value,
                                     "generation": e.generation, "attempt": e.attempt,
                                     "calls": e.calls, "via_lookup": e.via_lookup}
                                    for e in tl.effects],
                    }
                )
            )
            return
        console.print(
            f"[bold]{t.name}[/] {t.task_id}  state=[bold]{t.state}[/] generation={t.generation} "
            f"attempt={t.attempt}/{t.max_attempts} key={t.idempotency_key}"
        )
        console.print(f"params: {dumps(t.params)}", highlight=False)
        if t.result is not None:
            console.print(f"result: {dumps(t.result)}", highlight=False)
        if t.last_error:
            console.print(f"last error: {t.last_error.strip().splitlines()[-1]}", highlight=False)
        table = Table(title="timeline")
        table.add_column("at (UTC)", no_wrap=True)
        table.add_column("event", overflow="fold")
        table.add_column("gen", justify="right")
        table.add_column("holder", overflow="fold")
        table.add_column("detail", overflow="fold")
        # (time, order within the same instant, ...): submitted, claims, steps and effects,
        # then transitions, so a same-millisecond completion sorts after its last step.
        rows: list[tuple[float, int, str, str, str, str]] = [
            (t.created_at, 0, "submitted", "-", "-", f"key={t.idempotency_key}")
        ]
        for e in tl.events:
            label = e.kind if e.kind != "transition" else f"{e.from_state} -> {e.to_state}"
            shown = {k: v for k, v in e.detail.items() if k != "error"}
            rows.append((e.at, 3 if e.kind == "transition" else 1, label,
                         str(e.generation or "-"), e.holder or "-",
                         json.dumps(shown) if shown else ""))
        for s in tl.steps:
            rows.append((s.committed_at, 2, f"step {s.name} done", str(s.generation), "-", ""))
        for eff in tl.effects:
            rows.append((eff.updated_at, 2, f"effect {eff.name} {eff.state.value}",
                         str(eff.generation), "-",
                         f"key={eff.key} calls={eff.calls}"
                         + (" via lookup" if eff.via_lookup else "")))
        for at, _, label, gen, holder, detail in sorted(rows, key=lambda r: (r[0], r[1])):
            table.add_row(_when(at), label, gen, holder, detail)
        console.print(table)

    _guard(run)


@cli.command()
def resolve(
    task_id: Annotated[str, typer.Argument(metavar="TASK")],
    outcome: Annotated[
        str, typer.Option("--outcome", help="done: the effect happened; not-done: it did not.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why (kept in the audit log).")],
    result: Annotated[
        str | None, typer.Option("--result", help="For done: the effect's result as JSON.")
    ] = None,
    operator: Annotated[str | None, typer.Option("--operator")] = None,
    ledger: LedgerOpt = None,
) -> None:
    """Settle an UNKNOWN task's open effect (audited); the task then resumes."""

    def run() -> None:
        try:
            verdict = ResolveOutcome(outcome)
        except ValueError:
            raise ConfigError("--outcome must be 'done' or 'not-done'") from None
        if not reason.strip():
            raise ConfigError("--reason must say why (it is kept in the audit log)")
        result_json: str | None = None
        if result is not None:
            try:
                result_json = dumps(json.loads(result))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"--result is not valid JSON: {exc}") from None
        if verdict is ResolveOutcome.DONE and result_json is None:
            err_console.print(
                "[yellow]warning:[/] no --result given: the effect's result is recorded as null, "
                "and the task resumes with None as the effect's return value", highlight=False,
            )
        who = operator or os.environ.get("USER") or getpass.getuser()
        info = _ledger(ledger).resolve(task_id, verdict, reason, who, result_json)
        console.print(f"{info.task_id} resolved ({verdict.value}) by {who}: now {info.state}")

    _guard(run)


@cli.command()
def migrate(ledger: LedgerOpt = None) -> None:
    """Apply pending schema migrations (also done automatically on first use)."""

    def run() -> None:
        led = _ledger(ledger, must_exist=False)
        console.print(f"ledger schema version {led.migrate()}")

    _guard(run)


@cli.command()
def demo(
    ledger: Annotated[
        str | None,
        typer.Option(
            "--ledger",
            help="Ledger URL (default: a fresh ./ratchet-demo/ledger.db). A postgresql:// URL "
            "runs in its schema= (default ratchet_demo), which is dropped and recreated first.",
        ),
    ] = None,
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 500,
    workers: Annotated[int, typer.Option("--workers", min=1)] = 2,
    kills: Annotated[int, typer.Option("--kills", min=0)] = 5,
    seed: Annotated[int | None, typer.Option("--seed")] = None,
) -> None:
    """The main job: billing tasks against a faulty payment service, workers killed at random."""
    from ..demo.runner import run_demo

    code = _guard(lambda: run_demo(ledger, tasks=tasks, workers=workers, kills=kills, seed=seed))
    raise typer.Exit(int(code))


def main() -> None:
    """Console-script entry point."""
    cli()


if __name__ == "__main__":
    main()
