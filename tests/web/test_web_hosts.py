"""DNS rebinding: ``ratchet serve`` answers only to its allowed ``Host`` names
(:mod:`ratchet.web.hosts`), over real HTTP on loopback, on both ledgers.

A page at ``rebind.attacker.example`` whose name resolves to 127.0.0.1 reaches the service
from the operator's browser as a loopback peer, with ``Host`` and ``Origin`` naming the
attacker's site (so the Origin check matches). Such requests are refused (400) before any
route runs, in both modes: the API's reads and mutations, the dashboard's login and its
actions; the ledger is left as it was. localhost, 127.0.0.1 and [::1] answer, and so does
a name given with ``--allowed-host`` / ``RATCHET_ALLOWED_HOSTS``.
"""

from __future__ import annotations

import re
import socket

import httpx
import pytest
from api_app import make_app
from apisupport import AUTH, TOKEN, api_server, serve_process

from ratchet import ConfigError, Control, State
from ratchet.web import WebSettings
from ratchet.web.hosts import allowed_hosts, check_allowed_hosts, parse_allowed_hosts
from ratchet.web.serve import check_bind, start_line

EVIL = "rebind.attacker.example"


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def _as(host: str, base: str) -> dict[str, str]:
    """The headers of a browser on a page at ``host`` that resolves to the service."""
    netloc = f"{host}:{_port(base)}"
    return {"Host": netloc, "Origin": f"http://{netloc}"}


def _csrf(client: httpx.Client) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/pauses").text)
    assert found, "no CSRF token on /pauses"
    return found.group(1)


def test_a_rebinding_host_is_refused_in_loopback_mode(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    control = Control(ledger_url)
    with api_server(Control(app=make_app(ledger_url)), WebSettings(ledger_url=ledger_url)
                    ) as base, httpx.Client(base_url=base, timeout=30) as own:
        created = own.post("/api/tasks", json={"name": "web.echo",
                                               "params": {"text": "card 4242"}})
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]
        evil = _as(EVIL, base)
        with httpx.Client(base_url=base, timeout=30, headers=evil) as attacker:
            refused = {
                "GET /api/tasks": attacker.get("/api/tasks"),
                "GET /api/tasks/{id}": attacker.get(f"/api/tasks/{task_id}"),
                "GET /": attacker.get("/"),
                "POST /login": attacker.post("/login", data={"operator": "mallory"}),
                "POST /api/pauses": attacker.post("/api/pauses", json={
                    "scope": "type", "target": "web.echo", "reason": "rebound"}),
                "POST /api/tasks/{id}/cancel": attacker.post(
                    f"/api/tasks/{task_id}/cancel", json={"reason": "rebound"}),
            }
            for what, r in refused.items():
                assert r.status_code == 400, (what, r.status_code, r.text)
                if "/api/" in what:  # the API's error shape; the dashboard's is plain text
                    assert r.headers["content-type"] == "application/json", what
                    assert (r.json()["error"], r.json()["errors"]) == (
                        "host_not_allowed", []), what
                    assert "--allowed-host" in r.json()["message"], what
                else:
                    assert r.text == "Invalid host header", what
                assert "card 4242" not in r.text, what
                assert "set-cookie" not in r.headers, what
        # A session and CSRF token of the service's own page do not help either.
        assert own.post("/login", data={"operator": "alice"}).status_code == 303
        csrf = _csrf(own)
        r = own.post("/actions/pause", headers=evil,
                     data={"type": "web.echo", "reason": "rebound", "csrf": csrf})
        assert r.status_code == 400, r.text
        assert control.pauses() == []
        assert control.get(task_id).state is State.PENDING
        # The same requests for the service's own names are answered.
        for host in ("127.0.0.1", "localhost", "[::1]", "LOCALHOST"):
            assert own.get("/api/status", headers=_as(host, base)).status_code == 200, host
        r = own.post("/actions/pause", headers=_as("localhost", base),
                     data={"type": "web.echo", "reason": "own page", "csrf": csrf})
        assert r.status_code == 303, r.text
        assert [p.target for p in control.pauses()] == ["web.echo"]
    control.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_rebinding_host_is_refused_with_a_token(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url, api_token=TOKEN)
    with api_server(Control(app=make_app(ledger_url)), settings) as base:
        evil = {**_as(EVIL, base), **AUTH}
        assert httpx.get(f"{base}/api/status", headers=evil, timeout=30).status_code == 400
        login = httpx.post(f"{base}/login", headers=_as(EVIL, base), timeout=30,
                           data={"operator": "mallory", "token": TOKEN})
        assert login.status_code == 400 and "set-cookie" not in login.headers
        assert httpx.get(f"{base}/api/status", headers=AUTH, timeout=30).status_code == 200


def test_an_allowed_host_is_answered(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    settings = WebSettings(ledger_url=ledger_url,
                           allowed_hosts=("ratchet.proxy.internal", "*.ops.example"))
    with api_server(Control(app=make_app(ledger_url)), settings) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        for host in ("ratchet.proxy.internal", "eu.ops.example"):
            headers = _as(host, base)
            assert client.get("/api/status", headers=headers).status_code == 200, host
            assert client.post("/login", headers=headers,
                               data={"operator": "alice"}).status_code == 303, host
        assert client.get("/api/status", headers=_as("ops.example.evil", base)
                          ).status_code == 400


@pytest.mark.parametrize("backend", ["sqlite"])
def test_serve_takes_allowed_hosts_from_the_option_and_the_environment(
        ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with serve_process(ledger_url, "--allowed-host", "proxy-a.internal", token=None,
                       env={"RATCHET_ALLOWED_HOSTS": "proxy-b.internal, proxy-c.internal"}
                       ) as base:
        for host, status in (("proxy-a.internal", 200), ("proxy-c.internal", 200),
                             ("localhost", 200), (EVIL, 400)):
            r = httpx.get(f"{base}/api/status", headers=_as(host, base), timeout=30)
            assert r.status_code == status, (host, r.text)


def test_allowed_host_names_are_checked() -> None:
    assert allowed_hosts((), "0.0.0.0") == ["localhost", "127.0.0.1", "[::1]"]
    assert allowed_hosts(("Proxy.Example",), "::1") == ["localhost", "127.0.0.1", "[::1]",
                                                         "proxy.example"]
    assert allowed_hosts((), "10.0.0.5")[-1] == "10.0.0.5"
    assert parse_allowed_hosts(" a.example,b.example  c.example,") == (
        "a.example", "b.example", "c.example")
    assert check_allowed_hosts(["fe80::1", "*.example.com"], token_mode=False) == (
        "[fe80::1]", "*.example.com")
    for bad in ("http://proxy", "proxy:8080", "proxy/path", "a.*.example", "", "x y"):
        with pytest.raises(ConfigError, match="not a host name"):
            check_allowed_hosts([bad], token_mode=True)
    with pytest.raises(ConfigError, match="DNS rebinding"):
        check_bind(WebSettings(allowed_hosts=("*",)), "127.0.0.1")
    check_bind(WebSettings(api_token="t", allowed_hosts=("*",)), "0.0.0.0")
    line = start_line(WebSettings(allowed_hosts=("proxy.example",)), "127.0.0.1", 80, "x")
    assert "answers to Host localhost, 127.0.0.1, [::1], proxy.example only" in line
    assert "--allowed-host NAME" in line


def test_the_host_is_checked_before_the_body_is_read(ledger_url: str) -> None:
    """A refused Host gets its 400 at once, whatever body it declares."""
    Control(ledger_url).migrate()
    with api_server(Control(ledger_url), WebSettings(ledger_url=ledger_url)) as base, \
            socket.create_connection(("127.0.0.1", _port(base)), timeout=30) as sock:
        sock.sendall(f"POST /api/pauses HTTP/1.1\r\nHost: {EVIL}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
                     .encode())
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400 ")
        while b"host_not_allowed" not in answer:  # the body may come in a later segment
            more = sock.recv(4096)
            assert more, answer
            answer += more
