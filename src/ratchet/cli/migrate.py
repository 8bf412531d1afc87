"""``ratchet migrate``: create the ledger or upgrade its schema."""

from __future__ import annotations

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
    line,
)

__all__ = ["migrate"]


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

    guard(run)
