"""The per-queue table of ``ratchet status`` (DESIGN §8, flow control): the live tasks of
each queue, and what flow control holds back per type."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table

from ..control import StatusReport
from .render import field, line

__all__ = ["queue_views"]


def queue_views(s: StatusReport) -> list[RenderableType]:
    """The per-queue table (ready, scheduled, running, waiting for a key slot,
    rate-limited, parked, the live workers serving it), a line per queue no live worker
    serves, and a line per type flow control holds back; nothing when the ledger has no
    live task."""
    if not s.queues:
        return []
    table = Table(title="tasks by queue (live)")
    for col in ("queue", "ready", "scheduled", "running", "key-waiting", "rate-limited",
                "waiting", "workers"):
        table.add_column(col, overflow="fold", justify="left" if col == "queue" else "right")
    for q in s.queues:
        table.add_row(field(q.queue), field(q.ready), field(q.scheduled), field(q.running),
                      field(q.key_waiting, "yellow" if q.key_waiting else ""),
                      field(q.rate_limited, "yellow" if q.rate_limited else ""),
                      field(q.waiting), field(q.workers, "red" if q.unserved else ""))
    parts: list[RenderableType] = [table]
    for q in s.queues:
        if q.unserved:
            parts.append(line("no live worker serves queue ", (q.queue, "bold red"),
                              ": its tasks wait until one does (ratchet worker --queues ",
                              (q.queue, "bold"), ")"))
    for f in s.flow:
        held = [f"{n} {what}" for n, what in ((f.rate_limited, "rate-limited"),
                                              (f.key_waiting, "waiting for a key slot")) if n]
        parts.append(line("held back by flow control: ", (f.name, "bold"), ": ",
                          (", ".join(held), "yellow")))
    return parts
