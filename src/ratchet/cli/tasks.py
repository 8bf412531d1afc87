"""The commands that read or add tasks: ``submit``, ``tasks`` (the list), ``inspect`` (one
task and its timeline) and ``late-effects``."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from .. import (
    InvalidArguments,
    State,
    TaskNotFound,
)
from ..capacity import span as _span
from ..control import (
    BATCH_EFFECT_PREFIX,
    LATE_ACCOUNTED_FOR,
    Control,
    TaskInfo,
    TaskTimeline,
)
from ..errortext import error_summary
from ..loading import load_app
from ..validation import MAX_DELAY_S, MAX_VERSION, parse_duration_s
from .batches import print_batches
from .guard import guard
from .options import (
    AppArg,
    JsonOpt,
    LedgerOpt,
    TaskArg,
    json_arg,
)
from .render import (
    clip,
    console,
    echo_json,
    field,
    line,
    plain,
    show_value,
    when,
)

__all__ = ["submit", "tasks", "inspect", "late_effects"]


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
    queue: Annotated[
        str | None,
        typer.Option("--queue", metavar="QUEUE",
                     help="The queue (default: the task type's)."),
    ] = None,
    priority: Annotated[
        int,
        typer.Option("--priority", metavar="N",
                     help="Higher first among the queue's ready tasks (default 0)."),
    ] = 0,
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
        decoded = json_arg(params, "--params")
        if not isinstance(decoded, dict):
            raise InvalidArguments(
                "--params must be a JSON object, e.g. '{\"order_id\": \"o-1\"}'"
            )
        app = load_app(app_spec)
        app.configure(ledger=ledger)
        handle = Control(app=app).submit(name, decoded, idempotency_key=key, delay_s=delay_s,
                                         tenant=tenant, version=task_version, queue=queue,
                                         priority=priority)
        if as_json:
            echo_json({"task_id": handle.task_id, "name": handle.name, "created": handle.created})
            return
        verb = "submitted" if handle.created else "already submitted (same key and params)"
        console().print(line((handle.task_id, ""), f" {verb}"))

    guard(run)

def tasks(
    state: Annotated[
        list[str] | None,
        typer.Option("--state", metavar="STATE",
                     help="Only this state (repeat for several): PENDING, RUNNING, "
                     "RETRY_WAIT, WAITING, UNKNOWN, PAUSED, COMPENSATING, SUCCEEDED, "
                     "FAILED, CANCELLED, COMPENSATED."),
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
                          field(f"{t.attempt}/{t.max_attempts}"), field(when(t.created_at)),
                          field(_runs_at(t, now)), field(t.idempotency_key or "-"),
                          field(error, "dim" if t.state is State.SUCCEEDED else ""))
        if not page.tasks:
            table.add_row("(none)", "", "", "", "", "", "", "")
        console().print(table)
        if page.next_cursor is not None:
            console().print(line("more: ratchet tasks ... --cursor ", (page.next_cursor, "")))

    guard(run)

def _runs_at(t: TaskInfo, now: float) -> str:
    """When a waiting task becomes ready: ``HH:MM:SS (in 5m00s)`` for a ``PENDING`` /
    ``RETRY_WAIT`` task scheduled after ``now``, ``-`` otherwise."""
    if t.state not in (State.PENDING, State.RETRY_WAIT) or t.run_at <= now:
        return "-"
    day = datetime.fromtimestamp(t.run_at, UTC).strftime("%Y-%m-%d ")
    today = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d ")
    return f"{day if day != today else ''}{when(t.run_at)} (in {_span(t.run_at - now)})"


def _state_cell(t: TaskInfo) -> Text:
    """A task's state, with ``quarantined`` for a quarantined ``FAILED`` task."""
    if t.quarantined:
        return line((t.state, ""), (" quarantined", "bold yellow"))
    return field(t.state)


MAX_CHILD_ROWS = 100
"""The most children ``ratchet inspect`` lists as text (``--json`` has every one)."""


def _children_table(children: list[TaskInfo]) -> Table:
    """The children of ``ratchet inspect``: each child's id, type, state (what a waiting
    one waits for) and attempt, oldest first, with the count per state in the title."""
    per_state = Counter(str(c.state) for c in children)
    summary = ", ".join(f"{n} {st}" for st, n in sorted(per_state.items()))
    table = Table(title=f"children ({len(children)}: {summary})")
    for column in ("task", "type", "state", "attempt", "waiting for"):
        table.add_column(column, overflow="fold")
    for c in children[:MAX_CHILD_ROWS]:
        table.add_row(field(c.task_id), field(c.name), _state_cell(c),
                      field(f"{c.attempt}/{c.max_attempts}"),
                      field(c.waiting_for if c.state is State.WAITING and c.waiting_for
                            else "-"))
    if len(children) > MAX_CHILD_ROWS:
        table.add_row(f"... and {len(children) - MAX_CHILD_ROWS} more (--json lists every "
                      "one)", "", "", "", "")
    return table


_FLOW_WAITS = {"rate": "held back by a rate limit (runs when its bucket has a token)",
               "key": "waiting for a slot of its concurrency key",
               "debounce": "its debounce window is open"}


def _flow_parts(t: TaskInfo) -> list[str | tuple[object, str]]:
    """The flow-control line of ``ratchet inspect``: queue, priority, concurrency key
    (and whether it holds a slot), rate key, and why flow control holds it back."""
    parts: list[str | tuple[object, str]] = ["queue: ", (t.queue, "bold"),
                                             f"  priority: {t.priority}"]
    if t.ckey is not None:
        parts += ["  concurrency key: ", (t.ckey, ""),
                  " (holds a slot)" if t.key_slot else " (no slot)"]
    if t.rate_key is not None:
        parts += ["  rate key: ", (t.rate_key, "")]
    if t.flow_wait is not None:
        parts += ["  ", ("flow", "bold yellow"), ": ",
                  (_FLOW_WAITS.get(t.flow_wait, t.flow_wait), "")]
    return parts


def _print_timeline(tl: TaskTimeline, now: float, with_traceback: bool = False,
                    parent: TaskInfo | None = None) -> None:
    """The text form of ``ratchet inspect`` (``with_traceback``: the last error's whole
    message and its traceback too; ``parent``: the task's parent, when read)."""
    out = console()
    t = tl.task
    out.print(line((t.name, "bold"), " ", (t.task_id, ""), "  state=", (t.state, "bold"),
                   f" generation={t.generation} attempt={t.attempt}/{t.max_attempts} key=",
                   (t.idempotency_key if t.idempotency_key is not None else "-", "")))
    if t.tenant is not None:
        out.print(line("tenant: ", (t.tenant, "")))
    out.print(line(*_flow_parts(t)))
    if t.parent_id is not None:
        if parent is None:
            out.print(line("parent: ", (t.parent_id, "")))
        else:
            out.print(line("parent: ", (t.parent_id, ""), " (", (parent.name, ""), ", ",
                           (parent.state, "bold"), ")"))
    if tl.forked_from is not None:
        f = tl.forked_from
        out.print(line(("forked from", "bold"), " ", (f.source_id, ""), " at step ",
                       (f.from_step, ""), f" (version {f.source_version} -> {f.version}) by ",
                       (f.by, ""), ": ", (f.reason, "")))
    if tl.forks:
        out.print(line(("forks", "bold"), ": ", (", ".join(
            f"{f.task_id} (at step {f.from_step}, version {f.version})" for f in tl.forks),
            "")))
    if t.state is State.WAITING:
        out.print(line(("waiting", "bold"), " for: ",
                       (t.waiting_for or "(not recorded)", ""),
                       " (no lease, no slot: ready again when it arrives)"))
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
    # Effects made inside batches that completed are counted, not listed (a long run has
    # one per batch); an open or unsettled one is listed like any effect.
    settled = [e for e in tl.effects if e.name.startswith(BATCH_EFFECT_PREFIX)
               and plain(e.state) in ("done", "not_done")]
    if settled:
        rows.append((max(e.updated_at for e in settled), 2,
                     f"{len(settled)} effects inside batches settled", "-", "-",
                     "listed by ratchet inspect --json"))
    skip = {id(e) for e in settled}
    for eff in tl.effects:
        if id(eff) in skip:
            continue
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
        table.add_row(field(when(at)), field(label), field(gen), field(holder), field(detail))
    out.print(table)
    if tl.children:
        out.print(_children_table(tl.children))
    print_batches(tl)
    duplicates = [le for le in tl.late_effects if le.kind != LATE_ACCOUNTED_FOR]
    if duplicates:
        out.print(line(("warning: ", "yellow"), f"{len(duplicates)} late effect(s): a "
                       "holder sent a call after its claim was taken over; check the target "
                       "for a duplicate (ratchet late-effects)"))

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
    in order; its parent, what it waits for (WAITING: a sleep's deadline, an event, its
    children) and the children it submitted, with their states; the task it was forked
    from (ratchet fork) and the tasks forked from it. Each ctx.batches run:
    watermark / total (percent), counts, batches committed above the watermark, rate
    (items/s) and ETA; a shard's index / count; a sharded job's shard count and each
    shard's progress on one line (--json: batches, shards, shard_batches).
    """

    def run() -> None:
        with Control(ledger) as control:
            tl = control.inspect(task_id)
            now = control.ledger_now() if not as_json else 0.0
            parent = None
            if not as_json and tl.task.parent_id is not None:
                try:
                    parent = control.get(tl.task.parent_id)
                except TaskNotFound:  # pruned: its id is all there is
                    parent = None
        if as_json:
            echo_json(tl)
        else:
            _print_timeline(tl, now, with_traceback, parent)

    guard(run)

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
            table.add_row(field(when(le.at)), field(f"{le.task_name} {le.task_id}"),
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

    guard(run)
