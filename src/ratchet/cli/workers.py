"""``ratchet workers``: the worker registry."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..capacity import span as _span
from ..control import (
    Control,
)
from ..validation import parse_duration_s
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
)
from .render import (
    console,
    echo_json,
    field,
    line,
)

__all__ = ["workers"]


_WORKER_STATES = {
    "alive": ("alive", "green"),
    "stopped": ("STOPPED (clean exit)", "dim"),
    "dead": ("DEAD (revoked)", "bold red"),
}


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

    guard(run)
