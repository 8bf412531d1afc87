"""Shared by the dashboard tests: the tasks they run (with their external sides), a real
uvicorn server for ``create_app`` on 127.0.0.1 (an ephemeral port, in a thread), and a
wait for a task's state."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from ratchet import App, Control, State, TaskContext
from ratchet.testing import fast_retry_policy, wait_for
from ratchet.web import WebSettings, create_app

FAST = fast_retry_policy()
QUARANTINE = fast_retry_policy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05,
                               quarantine_after=2)


@dataclass
class Bank:
    """The external side of ``bank.charge``: neither honours the key nor answers a lookup;
    the first call of each key times out after sending (outcome unknown)."""

    calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, key: str) -> dict[str, str]:
        with self.lock:
            self.calls.append(key)
            first = self.calls.count(key) == 1
        if first:
            raise httpx.ReadTimeout("reply lost",
                                    request=httpx.Request("POST", "https://bank.example"))
        return {"charge_id": f"ch_{key}"}


def make_app(url: str, bank: Bank, fixed: threading.Event) -> App:
    app = App(url)

    @app.task(name="shop.pack", retry=FAST)
    def pack(ctx: TaskContext, order_id: str) -> dict[str, Any]:
        box = ctx.step("choose_box", lambda: {"box": "M", "order": order_id})
        label = ctx.effect("print_label", lambda key: {"label": key}, key=f"label:{order_id}",
                           idempotent=True, params={"order_id": order_id})
        return {"box": box["box"], "label": label["label"]}

    @app.task(name="shop.ship", retry=FAST)
    def ship(ctx: TaskContext, order_id: str) -> str:
        return ctx.step("hand_over", lambda: f"shipped {order_id}")

    @app.task(name="bank.charge", retry=FAST)
    def charge(ctx: TaskContext, order_id: str) -> Any:
        return ctx.effect("charge", bank.charge, key=f"charge:{order_id}",
                          params={"order_id": order_id})

    @app.task(name="feed.import", retry=QUARANTINE)
    def feed(ctx: TaskContext, feed_id: str) -> str:
        if not fixed.is_set():
            raise RuntimeError("feed parser rejects the header row")
        return f"imported {feed_id}"

    return app


@contextmanager
def serve(settings: WebSettings, control: Control) -> Iterator[str]:
    """``create_app`` on a real uvicorn server on 127.0.0.1, an ephemeral port, in a
    thread; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings, control=control),
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for("the dashboard server to start", lambda: server.started, timeout_s=20)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()


def settle(app: App, task_id: str, state: State, timeout_s: float = 30) -> Any:
    def probe() -> Any:
        info = app.get(task_id)
        return info if info.state is state else None

    return wait_for(f"task {task_id} to be {state.value}", probe, timeout_s=timeout_s)
