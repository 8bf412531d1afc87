"""What the fork tests share: an order task of two versions (version 1 fails for good at
its fourth checkpoint, version 2 is the fix) over the counting service, and the HTTP
service on a thread."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from ratchet import App, PermanentError, RetryPolicy, TaskContext
from ratchet.control import Control
from ratchet.testing import CountingClient, wait_for
from ratchet.web import WebSettings, create_app
from ratchet.web.serve import bind_socket

TASK = "fork.order"
CHECKPOINTS = ["load", "ratchet:emit:orders", "charge", "reserve", "pack", "ship"]
"""The stored checkpoint names of the order task, in code-path order."""


def order_app(ledger_url: str, client: CountingClient, calls: Counter[str]) -> App:
    """The order task, versions 1 and 2, on ``ledger_url``; ``calls`` counts the steps'
    function calls by name (the body runs in this process)."""
    app = App(ledger_url)
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, jitter=0.0)

    def body(ctx: TaskContext, order: str, broken: bool) -> dict[str, Any]:
        def load() -> dict[str, Any]:
            calls["load"] += 1
            return {"order": order, "amount": 42}

        loaded = ctx.step("load", load)
        ctx.emit("orders", {"order": order, "event": "started"}, key=order)
        charge = ctx.effect("charge", lambda k: client.execute(k, {"amount": 42}),
                            key=f"charge:{order}", lookup=client.lookup, idempotent=True)
        reserve = ctx.effect("reserve", lambda k: client.execute(k, {"sku": "a"}),
                             key=f"reserve:{order}", lookup=client.lookup, idempotent=True)

        def pack() -> str:
            calls["pack"] += 1
            if broken:
                raise PermanentError("pack: the box size table is wrong")
            return "box-3"

        box = ctx.step("pack", pack)
        ship = ctx.effect("ship", lambda k: client.execute(k, {"box": box}),
                          key=f"ship:{order}", lookup=client.lookup, idempotent=True)
        return {"amount": loaded["amount"], "charge": charge["id"],
                "reserve": reserve["id"], "ship": ship["id"], "box": box}

    @app.task(name=TASK, version=1, retry=policy)
    def order_v1(ctx: TaskContext, order: str) -> dict[str, Any]:
        return body(ctx, order, broken=True)

    @app.task(name=TASK, version=2, retry=policy)
    def order_v2(ctx: TaskContext, order: str) -> dict[str, Any]:
        return body(ctx, order, broken=False)

    return app


@contextmanager
def api_server(control: Control) -> Iterator[str]:
    """``ratchet serve``'s ASGI app over ``control`` with uvicorn on a thread, on
    127.0.0.1 (no token: loopback reads are open); yields the base URL."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(WebSettings(), control=control),
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="ratchet-fork-api")
    thread.start()
    try:
        wait_for("the API server to start", lambda: server.started or not thread.is_alive())
        assert thread.is_alive(), "the API server thread ended at start-up"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
