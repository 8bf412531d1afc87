"""``ratchet send-event``: send an event to the tasks waiting for it
(``ctx.wait_for_event``), audited with ``--operator``."""

from __future__ import annotations

from typing import Annotated

import typer

from ..control import (
    Control,
    EventReceipt,
    default_operator,
)
from .guard import guard
from .options import (
    JsonOpt,
    LedgerOpt,
    json_arg,
)
from .render import (
    console,
    echo_json,
    line,
)

__all__ = ["send_event"]


def _print_receipt(name: str, key: str, receipt: EventReceipt, who: str) -> None:
    """One line saying what the send did: the event's id and position, and how many
    waiting tasks it made ready (or that it was a duplicate, which wakes nothing)."""
    if receipt.duplicate:
        console().print(line(("duplicate", "yellow"), ": event id ", (receipt.event_id, ""),
                             " was already sent (", (name, ""), " key=", (key, ""),
                             f" #{receipt.seq}); delivered once, nothing woken"))
        return
    console().print(line("event ", (name, "bold"), " key=", (key, ""), " sent by ",
                         (who, ""), ": id ", (receipt.event_id, ""),
                         f" #{receipt.seq}, woke {receipt.woken} waiting task(s)"))


def send_event(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The event name, e.g. "
                                        "shipped (what ctx.wait_for_event waits for).")],
    key: Annotated[
        str,
        typer.Option("--key", metavar="KEY",
                     help="What the event is about, e.g. an order id (the key= of "
                          "ctx.wait_for_event)."),
    ],
    payload: Annotated[
        str | None,
        typer.Option("--payload", metavar="JSON",
                     help="What the wait returns, as JSON (default: null)."),
    ] = None,
    event_id: Annotated[
        str | None,
        typer.Option("--event-id", metavar="ID",
                     help="The event's identity: a second send with the same id is the "
                          "same event, delivered once (default: a new id)."),
    ] = None,
    operator: Annotated[
        str | None,
        typer.Option("--operator", metavar="NAME",
                     help="Who sends it, kept in the audit log (default: $USER / the login "
                          "name)."),
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send an event to the tasks waiting for it (audited with --operator).

    Every task WAITING in ctx.wait_for_event(NAME, key=KEY) becomes ready and its wait
    returns the payload; an event no task waits for yet is kept, and the next wait for it
    returns at once. Give --event-id to make a resend safe: the same id is delivered once.
    Exit status 0 when sent (or a duplicate of an event already sent); 2 on an error
    (a --payload that is not JSON, a malformed name or key).
    """

    def run() -> None:
        value = json_arg(payload, "--payload") if payload is not None else None
        who = operator if operator is not None else default_operator()
        with Control(ledger) as control:
            receipt = control.send_event(name, key=key, payload=value, event_id=event_id,
                                         by=who)
        if as_json:
            echo_json(receipt)
            return
        _print_receipt(name, key, receipt, who)

    guard(run)
