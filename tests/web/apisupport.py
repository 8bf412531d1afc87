"""Real ``ratchet serve`` services for the HTTP API tests: uvicorn on 127.0.0.1, an
ephemeral port, in a thread of the test process (:func:`api_server`) or as a ``ratchet
serve`` subprocess (:func:`serve_process`)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from ratchet import Control
from ratchet.testing.processes import clean_env, wait_for
from ratchet.web import WebSettings, create_app
from ratchet.web.serve import bind_socket

HERE = Path(__file__).resolve().parent
TOKEN = "test-token-3f1c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def bare(api: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """``method path`` on ``api``'s service without the client's default headers (the
    token): what an anonymous client gets. ``path`` is relative to ``api.base_url``."""
    return httpx.request(method, api.base_url.join(path.lstrip("/")), timeout=30, **kwargs)


@contextmanager
def api_server(control: Control, settings: WebSettings) -> Iterator[str]:
    """Serve ``create_app(settings, control=control)`` with uvicorn on a thread; yields the
    base URL (``http://127.0.0.1:PORT``). The app's lifespan closes ``control`` at exit."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings, control=control),
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name="ratchet-test-api")
    thread.start()
    try:
        wait_for("the API server to start", lambda: server.started or not thread.is_alive())
        assert thread.is_alive(), "the API server thread ended at start-up"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
        assert not thread.is_alive(), "the API server did not stop within 15 s"


@contextmanager
def token_api(ledger_url: str, timeout_s: float = 60.0) -> Iterator[httpx.Client]:
    """An httpx client on a service with a token and the test app (``api_app``), on a
    migrated ledger; it sends the token on every request (:func:`bare` for one without)."""
    from api_app import make_app

    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base, \
            httpx.Client(base_url=f"{base}/api", headers=AUTH, timeout=timeout_s) as client:
        yield client


@contextmanager
def serve_process(ledger_url: str, *args: str, token: str | None = TOKEN,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """``ratchet serve --ledger URL --port 0 --app api_app:app ARGS`` as a subprocess
    (``env``: more environment variables); yields its base URL (read from the start
    line). SIGTERM at exit."""
    cmd = [sys.executable, "-m", "ratchet.cli.main", "serve", "--ledger", ledger_url,
           "--port", "0", "--app", "api_app:app", "--log-level", "warning", *args]
    variables: dict[str, str | None] = {"RATCHET_API_TOKEN": token, **(env or {})}
    proc = subprocess.Popen(cmd, cwd=HERE, env=clean_env(variables, pythonpath=[HERE]),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    drain: threading.Thread | None = None
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)", first)
        assert found, f"ratchet serve did not start: {first}{proc.stderr.read()}"
        # Keep draining stderr, so the service never blocks on a full pipe.
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        drain.start()
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if drain is not None:
            drain.join(5)
        if proc.stderr is not None:
            proc.stderr.close()
