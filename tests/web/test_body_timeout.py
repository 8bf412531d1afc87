"""A request body that does not arrive is not waited for: a real ``ratchet serve``
subprocess with ``--body-timeout-s 1``, driven over raw loopback sockets. A client that
declares more ``Content-Length`` than it sends, or starts a chunked body and stops, gets
408 ``request_timeout`` and the connection is closed; one over the size cap that never
sends it gets its 413 and is closed too; the service keeps answering others.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from apisupport import serve_process

from ratchet import Control

pytestmark = pytest.mark.parametrize("backend", ["sqlite"])  # no ledger is involved

TIMEOUT_S = 1.0


def _exchange(base: str, head: str, body: bytes) -> tuple[bytes, float]:
    """Send ``head`` and ``body`` and then nothing more; read until the server closes the
    connection (at most 30 s). Returns what was read and how long the close took."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall(head.encode() + body)
        received = b""
        while chunk := sock.recv(65536):  # b"": the server closed the connection
            received += chunk
        return received, time.monotonic() - started


def _answer(raw: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower(), head
    return status, json.loads(body)


def test_a_body_that_never_arrives_is_answered_408_and_closed(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with serve_process(ledger_url, "--body-timeout-s", str(TIMEOUT_S), token=None) as base:
        head = ("POST /api/pauses HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: {n}\r\n{extra}\r\n")
        short, took = _exchange(base, head.format(n=100, extra=""), b'{"scope": "all"')
        status, body = _answer(short)
        assert status == 408 and body["error"] == "request_timeout", body
        assert "15 of the 100 bytes declared" in str(body["message"])
        assert TIMEOUT_S * 0.9 <= took < 20, took

        chunked, _ = _exchange(base, "POST /api/resume HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n", b"5\r\n{\"sco\r\n")
        assert _answer(chunked)[0] == 408

        # Over the size cap and never sent: the 413 is not held back for the rest.
        huge, took = _exchange(base, head.format(n=10**9, extra=""), b"{")
        status, body = _answer(huge)
        assert status == 413 and body["error"] == "payload_too_large", body
        assert took < 20

        assert httpx.get(f"{base}/api/health", timeout=30).status_code == 200
        whole = httpx.post(f"{base}/api/pauses", timeout=30,
                           json={"scope": "type", "target": "web.echo", "reason": "whole"})
        assert whole.status_code == 200, whole.text
