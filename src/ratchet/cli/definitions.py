"""``ratchet definitions``: the task definitions (name, version) workers registered."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from ..control import (
    Control,
)
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
)
from .render import (
    console,
    echo_json,
    field,
)

__all__ = ["definitions"]


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

    guard(run)
