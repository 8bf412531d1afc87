"""The outbox's routes of the JSON HTTP API (DESIGN §6 row 10, §9): ``GET /api/outbox``
(:meth:`Control.outbox <ratchet.control.Control.outbox>`: the backlog, the oldest unsent
age, the failing messages, the relays holding partitions) and ``GET
/api/outbox/messages`` (:meth:`Control.outbox_messages
<ratchet.control.Control.outbox_messages>`: messages without their payload, with their
state). Reads: the token rule of the other reads (:func:`ratchet.web.auth.read_ok`)."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at
# definition time.
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ..control import Control, OutboxMessage, OutboxStats
from ..errors import SchemaTooOld
from .models import NO_NUL

__all__ = ["OUTBOX_SCHEMA", "add_outbox_routes"]

OUTBOX_SCHEMA = 16
"""The ledger schema version that has the outbox (a ledger below it answers 503
``schema_too_old`` on ``GET /api/outbox``)."""


def add_outbox_routes(reads: APIRouter, control: Control,
                      errors: Callable[..., dict[int | str, dict[str, Any]]]) -> None:
    """Add the outbox's read routes to ``reads`` (the API's router of reads, behind its
    token rule); ``errors(*codes)`` makes a route's documented error responses."""

    @reads.get("/outbox", response_model=OutboxStats, responses=errors(422, 503),
               summary="The outbox: unsent messages, oldest unsent age, failing messages, "
                       "relays holding partitions")
    def get_outbox(
        top: Annotated[int, Query(ge=0, le=1000, description="Unsent counts of at most "
                                                             "this many topics.")] = 10,
    ) -> OutboxStats:
        stats = control.outbox(top)
        if stats is None:
            raise SchemaTooOld(control.schema_version(), OUTBOX_SCHEMA, "the outbox")
        return stats

    @reads.get("/outbox/messages", response_model=list[OutboxMessage],
               responses=errors(422, 503),
               summary="Outbox messages with their state (sent, failing, unsent), newest "
                       "first, or the unsent ones in outbox order")
    def get_outbox_messages(
        limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
        unsent_only: Annotated[bool, Query(description="Only the unsent messages, in "
                                                       "outbox order (published next "
                                                       "first).")] = False,
        topic: Annotated[str | None, Query(max_length=1024, pattern=NO_NUL,
                                           description="Only this topic's.")] = None,
        key: Annotated[str | None, Query(max_length=1024, pattern=NO_NUL,
                                         description="Only this key's.")] = None,
    ) -> list[OutboxMessage]:
        return control.outbox_messages(limit, unsent_only=unsent_only, topic=topic, key=key)
