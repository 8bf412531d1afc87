"""``ratchet serve``: the bind rule (no token: loopback only, said on start; another host is
refused before anything listens) and the start line, as a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from apisupport import HERE, serve_process

from ratchet import ConfigError, Control
from ratchet.testing.processes import clean_env
from ratchet.web import WebSettings
from ratchet.web.serve import check_bind, start_line


def test_without_a_token_another_host_is_refused(tmp_path: object) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "serve", "--host", "0.0.0.0",
         "--port", "0", "--ledger", "sqlite:///unused.db"],
        cwd=HERE, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "refusing to listen on '0.0.0.0' without RATCHET_API_TOKEN" in run.stderr
    assert "--host 127.0.0.1" in run.stderr
    with pytest.raises(ConfigError, match="RATCHET_API_TOKEN"):
        check_bind(WebSettings(), "::")
    check_bind(WebSettings(), "::1")
    check_bind(WebSettings(api_token="t"), "0.0.0.0")


def test_start_line_says_which_rule() -> None:
    loopback = start_line(WebSettings(), "127.0.0.1", 8000, "sqlite:///x.db")
    assert "listening on loopback only" in loopback and "no --app" in loopback
    token = start_line(WebSettings(api_token="t", app_spec="m:app"), "0.0.0.0", 80, "x")
    assert "Bearer $RATCHET_API_TOKEN" in token and "m:app" in token


def test_serve_subprocess_answers_and_stops_on_sigterm(ledger_url: str) -> None:
    Control(ledger_url).migrate()
    with serve_process(ledger_url, token=None) as base:
        status = httpx.get(f"{base}/api/status", timeout=30)
        assert status.status_code == 200 and status.json()["unknown"] == 0
        created = httpx.post(f"{base}/api/tasks", timeout=30,
                             json={"name": "web.echo", "params": {"text": "cli"}})
        assert created.status_code == 201, created.text
    assert Control(ledger_url).get(created.json()["task_id"]).params == {"text": "cli"}
