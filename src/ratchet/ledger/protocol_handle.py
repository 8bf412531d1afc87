"""What every role of the ledger contract shares (:class:`LedgerHandle`: its settings,
its clock, its corruption state, closing it) and the wake-up :class:`Subscription`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..config import LedgerConfig
from ..errors import LedgerCorrupt

__all__ = ["LedgerHandle", "Subscription"]


class Subscription(Protocol):
    """A wake-up subscription returned by :meth:`Ledger.subscribe`."""

    def close(self) -> None:
        """Stop calling back; release the connection or thread behind it."""
        ...


@runtime_checkable
class LedgerHandle(Protocol):
    """What every caller of a ledger may use, whatever its role: the settings, the ledger
    clock, the corruption found so far, and ``close``."""

    config: LedgerConfig

    def now(self) -> float:
        """The ledger clock, epoch seconds."""
        ...

    @property
    def corruption(self) -> LedgerCorrupt | None:
        """The last :class:`~ratchet.errors.LedgerCorrupt` any call of this object raised
        (None while none did): a damaged page fails only the calls that read it, so a
        health check that reads little asks this too."""
        ...

    def close(self) -> None:
        """Close every connection this object opened."""
        ...
