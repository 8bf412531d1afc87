"""``ratchet relay``: publish the transactional outbox to RabbitMQ or NATS JetStream
(DESIGN §6.2, how-to: docs/how-to/outbox.md).

Delivery: at least once, in outbox order per key (first occurrences), each message with a
stable id consumers deduplicate by. :func:`run_relay` is what the command line runs;
:class:`Relay` is the loop for a program that embeds one.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence

from ..ledger.base import Ledger
from .loop import Relay, RelayOptions, RelayStats, default_holder
from .targets import Publisher, Target, parse_target, publisher_for

__all__ = ["Publisher", "Relay", "RelayOptions", "RelayStats", "Target", "default_holder",
           "parse_target", "publisher_for", "run_relay"]


def run_relay(ledger: Ledger, targets: Sequence[Target], *, holder: str,
              options: RelayOptions) -> RelayStats:
    """Run a relay in a new event loop until SIGTERM or SIGINT: the in-flight round is
    finished, the partitions released, the brokers closed; returns its counters.

    Raises:
        ConfigError: a broker's client library is not installed (``ratchet[relay]``).
    """
    publishers = [publisher_for(t) for t in targets]
    relay = Relay(ledger, publishers, holder=holder, options=options)

    async def main() -> RelayStats:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.stop)
        try:
            return await relay.run()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
