"""What the worker's threads report to the lifecycle hooks, seen from those threads.

The heartbeat and the writer report renewals, claims and commits without knowing the
middleware: they hold an object with the methods below (a
:class:`~ratchet.worker.hooks.Hooks` dispatcher, or None when no middleware is
installed). :data:`EffectSettlement` names how ``ctx.effect`` ended.
"""

from __future__ import annotations

from typing import Literal, Protocol

from ..ledger.base import Claim

__all__ = ["CommitEvents", "EffectSettlement", "RenewEvents"]

EffectSettlement = Literal["call", "lookup", "cached", "unknown", "failed"]
"""How an effect was settled, as ``after_effect`` reports it:

* ``"call"``: ``call(key)`` ran and its result was recorded;
* ``"lookup"``: the lookup found an earlier execution (no new call);
* ``"cached"``: a result recorded by an earlier attempt was returned (nothing asked);
* ``"unknown"``: the outcome could not be established (``EffectOutcomeUnknown``: the task
  goes to ``UNKNOWN``);
* ``"failed"``: the call, lookup or a ledger write raised (the exception is passed).
"""


class RenewEvents(Protocol):
    """What the heartbeat thread reports: one batched renewal ended."""

    def after_renew(
        self, leases: int, refused: int, duration_s: float, error: BaseException | None
    ) -> None:
        """``leases`` renewed in ``duration_s`` seconds, ``refused`` of them refused;
        ``error``: the ledger's error when the whole renewal failed."""


class CommitEvents(Protocol):
    """What a writer thread reports: claims and group commits."""

    def before_claim(self, limit: int) -> None:
        """A claim of at most ``limit`` tasks is about to be sent."""

    def after_claim(self, claims: list[Claim]) -> None:
        """A claim committed with ``claims`` (possibly empty)."""

    def before_commit(self, batch_size: int) -> None:
        """A group commit of ``batch_size`` task writes is about to be sent."""

    def after_commit(
        self, batch_size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """That group commit ended after ``duration_s`` seconds (``error`` if it failed)."""
