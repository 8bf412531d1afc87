"""What every concern of the engine shares: the dialect, the parsed ledger URL, the schema
gate and the watch on the ledger clock (:class:`EngineCore`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ...config import LedgerConfig
from .. import clock as ledger_clock
from ..dialect import Dialect, Tx
from .schema import SchemaGate

__all__ = ["EngineCore"]

_T = TypeVar("_T")


class EngineCore:
    """The parts one :class:`~ratchet.ledger.engine.LedgerEngine` hands its concerns.

    Attributes:
        config: the parsed ledger URL.
        dialect: the database under the engine.
        schema: which migrations the ledger has (:class:`SchemaGate`).
        clock_watch: backward steps of the ledger clock seen from this process
            (:mod:`ratchet.ledger.clock`).
    """

    def __init__(self, config: LedgerConfig, dialect: Dialect) -> None:
        self.config = config
        self.dialect = dialect
        self.schema = SchemaGate(config.scheme, lambda: self.dialect.schema_version())
        self.clock_watch = ledger_clock.ClockWatch()

    def repair_clock(self, tx: Tx, now: float, repaired: list[bool] | None) -> None:
        """Re-anchor the rows written ahead of the ledger clock ``now`` (epoch seconds) in
        ``tx`` when this process's watch saw it step back, or is new
        (:func:`ratchet.ledger.clock.repair`). ``repaired`` receives ``True`` when it did:
        the caller marks the repair done once ``tx`` committed. Run by every claim and by
        the operator's pause and resume (which come while workers are stopped: a type's
        delayed rows then wait their own wait from the command, not from the first claim)."""
        if self.clock_watch.observe(now):
            ledger_clock.repair(tx, now, self.clock_watch)
            if repaired is not None:
                repaired.append(True)

    def run_repairing(self, body: Callable[[Tx, list[bool]], _T]) -> _T:
        """``dialect.run(body)`` for a body that may call :meth:`repair_clock` with the
        list it is given; the repair is marked done after the commit."""
        repaired: list[bool] = []

        def run(tx: Tx) -> _T:
            repaired.clear()  # a retried attempt decides again
            return body(tx, repaired)

        result = self.dialect.run(run)
        if repaired:
            self.clock_watch.repaired()
        return result
