"""The counting service's HTTP side: the request handler over a
:class:`~.store.CountingStore` and the process entry point (``main``: parse the options,
serve until SIGTERM/SIGINT or stdin EOF, print ``READY <port>`` once listening)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from .protocol import RETRY_AFTER_S, TOKEN_HEADER, FaultSettings
from .store import CountingStore

__all__ = ["main"]



class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], store: CountingStore) -> None:
        super().__init__(address, _Handler)
        self.store = store

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout) or a connection we dropped on purpose is normal.
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "RatchetCountingService/1.0"

    @property
    def store(self) -> CountingStore:
        return cast(_Server, self.server).store

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging (the caller's console is not ours)."""

    def _send(
        self, status: int, body: Any, headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(body).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _drop(self) -> None:
        """Close the connection without sending anything: the reply is lost."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        return json.loads(raw) if raw else None

    def _path(self) -> str:
        return urlsplit(self.path).path

    def _token(self) -> tuple[bool, int | None]:
        """The request's ``Fencing-Token`` (None if absent). A malformed one is answered
        400 here and ``(False, None)`` returned."""
        raw = self.headers.get(TOKEN_HEADER)
        if raw is None:
            return True, None
        text = raw.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 19:
            self._send(400, {"error": f"{TOKEN_HEADER} must be an integer >= 0, got {raw!r}"})
            return False, None
        return True, int(text)

    def _overloaded(self) -> None:
        self._send(503, {"error": "overloaded, retry later"}, {"Retry-After": str(RETRY_AFTER_S)})

    def do_POST(self) -> None:
        path = self._path()
        try:
            body = self._read_json()
        except (ValueError, UnicodeDecodeError):
            self._send(400, {"error": "body is not valid JSON"})
            return
        if path == "/effects":
            self._post_effect(body)
        elif path == "/admin/faults":
            if not isinstance(body, dict):
                self._send(400, {"error": "expected a JSON object of fault settings"})
                return
            try:
                self._send(200, self.store.set_faults(body))
            except ValueError as exc:
                self._send(400, {"error": str(exc)})
        else:
            self._send(404, {"error": "no such route", "path": path})

    def do_GET(self) -> None:
        path = self._path()
        if path.startswith("/effects/"):
            key = unquote(path[len("/effects/") :])
            ok, token = self._token()
            if not ok:
                return
            if self.store.gate_503():
                self._overloaded()
                return
            self._send(*self.store.fenced_lookup(key, token))
        elif path == "/executions":
            self._send(200, self.store.executions())
        elif path == "/stats":
            self._send(200, self.store.stats())
        elif path == "/admin/faults":
            self._send(200, self.store.get_faults())
        else:
            self._send(404, {"error": "no such route", "path": path})

    def _post_effect(self, body: Any) -> None:
        key = self.headers.get("Idempotency-Key")
        if not key:
            self._send(400, {"error": "missing Idempotency-Key header"})
            return
        if not isinstance(body, dict):
            self._send(400, {"error": "expected a JSON object body"})
            return
        ok, token = self._token()
        if not ok:
            return
        if self.store.gate_503():
            self._overloaded()
            return
        delay = self.store.delay_s()
        if delay > 0:
            time.sleep(delay)
        # The token is checked when the request executes (after its processing delay), as
        # a storage-side fence does: a request that waited past a newer holder is refused.
        status, reply, executed = self.store.execute(key, body, token)
        if executed and self.store.drop_reply():
            self._drop()
            return
        self._send(status, reply)



def _parse_args(argv: list[str] | None, prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Counting external service with fault injection (prints 'READY <port>').",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    p.add_argument("--db", required=True, help="the service's own SQLite file")
    p.add_argument(
        "--no-honour-keys",
        action="store_true",
        help="execute every POST even when its Idempotency-Key was seen (legacy API)",
    )
    p.add_argument(
        "--check-tokens",
        action="store_true",
        help=f"fenced mode: require a {TOKEN_HEADER} header on /effects requests and refuse "
        "(409) one lower than the highest token seen for its key",
    )
    p.add_argument("--reply-lost", type=float, default=0.0, metavar="P",
                   help="probability that an executed request's reply is dropped")
    p.add_argument("--burst-503", type=float, default=0.0, metavar="P",
                   help="probability that a request starts a burst of 503s")
    p.add_argument("--burst-len", type=int, default=5, metavar="N",
                   help="requests answered 503 per burst (default 5)")
    p.add_argument("--slow", type=float, default=0.0, metavar="P",
                   help="probability that a request sleeps --slow-s before executing")
    p.add_argument("--slow-s", type=float, default=2.0, metavar="S",
                   help="sleep of a slow request, seconds (default 2.0)")
    p.add_argument("--latency-s", type=float, default=0.0, metavar="S",
                   help="mean processing time of every request, seconds (default 0)")
    p.add_argument("--id-prefix", default="ex_", help="prefix of record ids (default ex_)")
    p.add_argument("--seed", type=int, default=None, help="seed of the fault RNG")
    p.add_argument("--exit-on-stdin-eof", action="store_true",
                   help="stop when stdin closes (the parent that started us is gone)")
    return p.parse_args(argv)  # fmt: skip


def main(
    argv: list[str] | None = None,
    prog: str = "python -m ratchet.testing.services",
    *,
    started: Callable[[CountingStore], None] | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT (or stdin EOF with ``--exit-on-stdin-eof``).

    Args:
        argv: the command-line options (default ``sys.argv[1:]``).
        prog: the program name in usage and error messages.
        started: called with the service's store once it is open and before the server
            listens (a service built on this one starts its own threads there: the demo's
            warehouse, which ships what was reserved, records through the same store).

    Returns:
        The process exit status (0 on a clean stop, 2 on bad arguments).
    """
    args = _parse_args(argv, prog)
    faults = FaultSettings()
    try:
        faults.update(
            {
                "honour_keys": not args.no_honour_keys,
                "check_tokens": args.check_tokens,
                "reply_lost": args.reply_lost,
                "burst_503": args.burst_503,
                "burst_len": args.burst_len,
                "slow": args.slow,
                "slow_s": args.slow_s,
                "latency_s": args.latency_s,
            }
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    store = CountingStore(args.db, faults, args.seed, args.id_prefix)
    if started is not None:
        started(store)
    server = _Server((args.host, args.port), store)
    stopping = threading.Event()

    def stop() -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watcher: threading.Thread | None = None
    if args.exit_on_stdin_eof:

        def watch_stdin() -> None:
            fd = sys.stdin.fileno()
            with contextlib.suppress(OSError, ValueError):
                while not stopping.is_set():
                    readable, _, _ = select.select([fd], [], [], 0.2)
                    if readable and not os.read(fd, 4096):
                        break
            stop()

        watcher = threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True)
        watcher.start()
    print(f"READY {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        stopping.set()
        if watcher is not None:
            watcher.join(timeout=1.0)
        server.server_close()
        store.close()
    return 0
