"""The application of tests/test_reconcile.py: a charge on a lookup-only counting service.

``make_app(ledger_url, service_url, ...)`` builds it. The *worker* app is what ran the
tasks: its effects are given no lookup (a target whose lookup came later, or a "neither"
target), so an unknown outcome goes ``UNKNOWN``. The *reconcile* app is the same code with
lookups registered (``App.lookup``), as an operator's deployment would have them:
``charge`` asks the counting service, ``notify`` asks a service that is down (the lookup
raises), ``mail`` has none.
"""

from __future__ import annotations

from typing import Any

from ratchet import NOT_FOUND, App, RetryPolicy, TaskContext
from ratchet.testing.services import CountingClient

TASK = "rc.charge"

_CLIENTS: dict[int, list[CountingClient]] = {}


def close(app: App) -> None:
    """Close the app and the HTTP clients :func:`make_app` made for it."""
    for client in _CLIENTS.pop(id(app), []):
        client.close()
    app.close()


def make_app(ledger_url: str, service_url: str, *, lookups: bool = False,
             black_hole_url: str | None = None, dead_url: str | None = None,
             worker_lookups: bool = True) -> App:
    """The test app.

    Args:
        ledger_url: the ledger.
        service_url: the counting service (lookup-only: it does not honour keys).
        lookups: register the reconcile lookups.
        black_hole_url: a listener that never answers: a ``mode="never"`` task's first
            claim sends its charge there (a real read timeout; nothing executed).
        dead_url: where nothing listens (the ``notify`` lookup's target).
        worker_lookups: the lookups serve a worker too (``App.lookup(worker=)``).
    """
    app = App(ledger_url)
    client = CountingClient(service_url, timeout_s=2.0)
    hole = CountingClient(black_hole_url, timeout_s=0.3) if black_hole_url else None
    dead = CountingClient(dead_url or "http://127.0.0.1:9", timeout_s=0.5,
                          connect_timeout_s=0.5)
    _CLIENTS[id(app)] = [c for c in (client, hole, dead) if c is not None]

    @app.task(name=TASK, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01), lease_s=5.0)
    def charge(ctx: TaskContext, order: str, mode: str = "ok") -> Any:
        key = f"charge:{order}"

        def call(k: str) -> Any:
            if mode == "never" and ctx.generation == 1 and hole is not None:
                return hole.execute(k, {"order": order})   # never answered: ReadTimeout
            if mode == "late" and ctx.generation == 1:
                # The real late-effect path: the call executes, then this holder's claim
                # is revoked and its safe window closed before the reply is handled (what
                # a holder frozen past its lease sees when it wakes up).
                done = client.execute(k, {"order": order})
                app.ledger.revoke_holder(ctx.holder, "test", "simulated takeover")
                ctx.lease.mark_lost()
                return done
            return client.execute(k, {"order": order})

        blind = (lambda k: NOT_FOUND) if mode == "late" else None  # cannot see the first
        charged = ctx.effect("charge", call, key=key, lookup=blind)
        if mode == "notify":
            ctx.effect("notify", lambda k: client.execute(k, {"order": order}),
                       key=f"notify:{order}")
            ctx.effect("mail", lambda k: client.execute(k, {"order": order}),
                       key=f"mail:{order}")
        return {"charge": charged["id"]}

    if lookups:
        app.lookup(TASK, "charge", worker=worker_lookups)(client.lookup)
        app.lookup(TASK, "notify", worker=worker_lookups)(dead.lookup)
    return app
