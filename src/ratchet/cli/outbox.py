"""The outbox part of ``ratchet status`` (DESIGN §6 row 10, §9): the backlog, the oldest
unsent message's age, the relays holding partitions, the messages relays fail to publish."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table

from ..capacity import span
from ..control import OutboxStats
from .render import clip, field, line

__all__ = ["outbox_views"]

STUCK_AGE_S = 60.0
"""An oldest unsent age above this is shown in yellow (the alert threshold of the docs'
example is the operator's to choose)."""


def outbox_views(s: OutboxStats | None) -> list[RenderableType]:
    """A line with the backlog (unsent, oldest unsent age, failing, sent kept, relays and
    free partitions), a table of the relays holding partitions, and one line per failing
    message (its last error); nothing on a ledger without an outbox, and only the line
    when it never held a message."""
    if s is None:
        return []
    more = "+" if s.unsent_capped else ""
    sent = f"{'~' if s.sent_capped else ''}{s.sent}{'+' if s.sent_capped else ''}"
    age = s.oldest_unsent_age_s
    age_style = "bold yellow" if age is not None and age > STUCK_AGE_S else ""
    held = sum(len(r.partitions) for r in s.relays)
    parts: list[RenderableType] = [line(
        "outbox: ", (f"{s.unsent}{more}", "bold" if s.unsent else ""), " unsent (oldest ",
        (span(age) if age is not None else "-", age_style), "), ",
        (str(s.failing), "bold red" if s.failing else ""), " failing, ", sent,
        f" sent kept; {len(s.relays)} relay(s) hold {held} partition(s), ",
        (str(s.free_partitions), "yellow" if s.free_partitions and s.unsent else ""),
        " free")]
    if s.unsent and not s.relays:
        parts.append(line(("no relay holds an outbox partition", "bold yellow"),
                          ": unsent messages wait until one runs (ratchet relay)"))
    if s.relays:
        table = Table(title="outbox relays (unexpired leases)")
        for col in ("relay", "partitions", "lease ends in"):
            table.add_column(col, overflow="fold")
        for r in s.relays:
            table.add_row(field(r.holder), field(f"{len(r.partitions)}: "
                                                 + ",".join(map(str, r.partitions))),
                          field(span(max(0.0, r.lease_until - s.ledger_now))))
        parts.append(table)
    if s.topics and len(s.topics) > 1:
        parts.append(line("outbox unsent by topic: ", ", ".join(
            f"{t.topic} {t.unsent}" for t in s.topics)))
    for m in s.failures:
        parts.append(line(("failing ", "bold red"), (m.topic, "bold"),
                          f" message {m.message_id} (key {m.key or '-'}, partition {m.part},"
                          f" {m.attempts} attempt(s)): ", (clip(m.last_error or "", 200), "")))
    return parts
