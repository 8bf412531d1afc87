"""``App.downstream``: what a downstream's name stands for (DESIGN §7, §8): a cluster-wide
retry budget, a per-process circuit breaker and a cluster-wide rate limit, checked here
and kept in the App's maps by name."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..breaker import CircuitBreaker, DownstreamBreaker
from ..errors import ConfigError
from ..ratelimit import RateLimit
from ..retry import RetryBudget
from ..validation import MAX_NAME_BYTES, check_identifier

__all__ = ["Downstreams"]


@dataclass
class Downstreams:
    """The downstreams an App configured, by name.

    Attributes:
        budgets: retry budgets (``App.downstreams``).
        breakers: circuit breakers, this process's (``App.breakers``).
        rates: rate limits (``App.downstream_rates``; the buckets live in the ledger).
    """

    budgets: dict[str, RetryBudget] = field(default_factory=dict)
    breakers: dict[str, DownstreamBreaker] = field(default_factory=dict)
    rates: dict[str, RateLimit] = field(default_factory=dict)

    def add(self, name: str, budget: RetryBudget | None, breaker: CircuitBreaker | None,
            rate_limit: RateLimit | None) -> None:
        """Configure downstream ``name`` (``App.downstream``).

        Raises:
            ConfigError: none of the three given, one of the wrong type, or the name
                configured twice.
            InvalidArguments: the name cannot be stored.
        """
        check_identifier(name, "downstream name", MAX_NAME_BYTES)
        if budget is None and breaker is None and rate_limit is None:
            raise ConfigError(
                f"downstream {name!r}: give a budget, a breaker, a rate limit, or several")
        if budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigError(
                f"budget must be a ratchet.RetryBudget, got {type(budget).__name__}")
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise ConfigError(
                f"breaker must be a ratchet.CircuitBreaker, got {type(breaker).__name__}")
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise ConfigError(
                f"rate_limit must be a ratchet.RateLimit, got {type(rate_limit).__name__}")
        if name in self.budgets or name in self.breakers or name in self.rates:
            raise ConfigError(f"downstream {name!r} is configured twice")
        if budget is not None:
            self.budgets[name] = budget
        if breaker is not None:
            self.breakers[name] = DownstreamBreaker(name, breaker)
        if rate_limit is not None:
            self.rates[name] = rate_limit
