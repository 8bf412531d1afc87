"""Flow control as :class:`ratchet.Control` shows and sets it (DESIGN §8, flow control):
rate limits (listed, set and cleared by operators, audited like the concurrency limits)
and the live tasks per queue and per type that flow control holds back."""

from __future__ import annotations

import math

from ..app import _checks as opchecks
from ..errors import InvalidArguments
from ..ratelimit import parse_rate
from ..validation import MAX_NAME_BYTES, check_identifier
from ._flowviews import RateLimitView
from ._reads import ControlReads

__all__ = ["ControlFlow"]

class ControlFlow(ControlReads):
    """The rate-limit calls of :class:`ratchet.Control` (see there)."""

    def rate_limits(self) -> list[RateLimitView]:
        """Every rate limit in the ledger, the code's and the operators', by scope and
        name, each with the tasks it holds back now (DESIGN §8, ``ratchet limits``).

        Raises:
            LedgerUnavailable: no ledger there.
        """
        led = self._reader()
        held = led.rate_held()
        return [RateLimitView.of(r, held.get(r.name, 0) if r.scope == "type" else 0)
                for r in led.rate_limits()]

    def set_rate_limit(
        self, task_type: str, rate: str, *, burst: int | None = None,
        key_param: str | None = None, reason: str, by: str | None = None,
    ) -> RateLimitView:
        """Set an operator's rate limit of a task type, audited (``rate_limit_set``, with
        the old and new values): at most ``burst`` of its tasks start at once, then
        ``rate`` on average, per key, cluster-wide. It replaces the limit the type's code
        declares (``@app.task(rate_limit=...)``) until :meth:`clear_rate_limit`; every
        worker's next claim obeys it.

        Args:
            task_type: the task name.
            rate: ``"20/s"``, ``"100/m"``, ``"5/10s"``, ``"1000/h"``, ``"2/d"``
                (:func:`ratchet.ratelimit.parse_rate`).
            burst: the bucket's size, tasks (>= 1); default the rate's count per second,
                rounded up (as :class:`~ratchet.ratelimit.RateLimit`).
            key_param: a bucket per value of this parameter of the task's params; None:
                the key of the limit it replaces (the code's ``key=`` parameter), else one
                bucket for the type (a key the code computes at submit still applies).
            reason: why (audited); must not be blank. by: the operator (default: login).

        Returns:
            the stored limit (:class:`RateLimitView`).

        Raises:
            InvalidArguments: a bad rate (not ``N/unit``, 0, too high), a burst below 1,
                a task type or parameter name that cannot be stored, a ``key_param`` that is
                not a parameter of the type's newest registered definition, a blank reason.
            LedgerUnavailable: no ledger there. SchemaTooOld: a ledger not migrated to
                flow control.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        try:
            per_s = parse_rate(rate)
        except Exception as exc:  # ConfigError for code; an argument here
            raise InvalidArguments(str(exc)) from None
        size = burst if burst is not None else max(1, math.ceil(per_s))
        reason, who = opchecks.operator_args(reason, by)
        row = self._writer().set_rate_limit(task_type, per_s, size, key_param, who, reason)
        return RateLimitView.of(row, self._reader().rate_held().get(task_type, 0))

    def clear_rate_limit(self, task_type: str, *, reason: str,
                         by: str | None = None) -> RateLimitView:
        """Remove the operator's rate limit of a task type (audited,
        ``rate_limit_cleared``); returns it as it was. The limit the type's newest
        registered definition declares, if any, applies again at once (and at the next
        worker's registration).

        Raises:
            InvalidArguments: the type has no operator's rate limit (one declared in code
                is changed in the code, or overridden by :meth:`set_rate_limit`), a blank
                reason.
            LedgerUnavailable: no ledger there.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        reason, who = opchecks.operator_args(reason, by)
        return RateLimitView.of(self._writer().clear_rate_limit(task_type, who, reason), 0)
