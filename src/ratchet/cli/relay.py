"""``ratchet relay``: publish the transactional outbox to RabbitMQ or NATS JetStream."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from .. import open_ledger
from ..config import redact_url
from ..observe import logs
from ..outbox import OUTBOX_PARTITIONS
from ..relay import RelayOptions, default_holder, parse_target, run_relay
from ..validation import parse_duration_s
from .guard import guard
from .options import LedgerOpt, log_level_of

__all__ = ["relay"]

log = logging.getLogger("ratchet.relay")


def relay(
    to: Annotated[
        list[str],
        typer.Option("--to", metavar="URL",
                     help="Broker: amqp://user:pass@host:5672/?exchange=NAME (RabbitMQ,"
                     " default exchange 'ratchet') or nats://host:4222?stream=NAME&prefix=WORD"
                     " (NATS JetStream, default stream RATCHET on subjects 'ratchet.>')."
                     " Repeat to publish to several; a message is marked sent when all"
                     " confirmed it."),
    ],
    ledger: LedgerOpt = None,
    lease: Annotated[
        str, typer.Option("--lease", metavar="DURATION",
                          help="Partition lease (renewed every third of it).")] = "10s",
    batch: Annotated[
        int, typer.Option("--batch", min=1, max=10_000, metavar="N",
                          help="Messages fetched and published per round.")] = 500,
    name: Annotated[
        str | None, typer.Option("--name", metavar="NAME",
                                 help="Relay name in the lease holder (default: host).")
    ] = None,
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, max=OUTBOX_PARTITIONS, metavar="N",
                          help="The most outbox partitions this relay holds.")
    ] = OUTBOX_PARTITIONS,
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL",
                          help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Publish outbox messages (ctx.emit, app.emit) to a broker, in order per key.

    Delivery is at least once: consumers deduplicate by message id (RabbitMQ message_id,
    NATS Nats-Msg-Id). Relays share the outbox's partitions by lease; start as many as
    you like. SIGTERM or Ctrl-C: the in-flight round finishes, the partitions are given
    back, exit 0. A broker that cannot be reached is retried (logged). Exit status 2: a
    bad URL or option.
    """
    level = log_level_of(log_level)
    logs.setup_logging(level, "text")

    def run() -> None:
        targets = [parse_target(url) for url in to]
        lease_s = parse_duration_s(lease, "--lease", minimum_s=0.3, maximum_s=3600.0)
        options = RelayOptions(lease_s=lease_s, batch=batch, want=partitions)
        opened = open_ledger(ledger)
        holder = default_holder(name)
        log.info("relay %s: ledger %s, to %s, lease %.1f s, batch %d", holder,
                 redact_url(opened.config.url), ", ".join(t.where for t in targets),
                 lease_s, batch)
        try:
            run_relay(opened, targets, holder=holder, options=options)
        finally:
            opened.close()

    guard(run)
