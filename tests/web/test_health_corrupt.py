"""``GET /api/health`` of a real service on a SQLite ledger damaged in place: 503
``"ledger": "corrupt"`` naming :class:`~ratchet.LedgerCorrupt` (the message for a client
with the token), whether its own small reads see the damage (a file cut in half) or another
call of the service found it (a damaged task page, met by ``/api/status``, which answers
503 ``ledger_corrupt``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from apisupport import AUTH, TOKEN, api_server
from corruptsupport import cut_in_half, damage_task_pages

from ratchet import App, Control
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)


def _ledger(path: Path) -> str:
    url = f"sqlite:///{path}"
    app = App(url)

    @app.task(name="hc.echo")
    def echo(ctx: object, n: int) -> int:
        return n

    for i in range(5):
        app.submit("hc.echo", {"n": i})
    app.close()
    return url


def _corrupt_health(base: str) -> None:
    anonymous = httpx.get(f"{base}/api/health", timeout=30)
    assert anonymous.status_code == 503, anonymous.text
    body = anonymous.json()
    assert (body["status"], body["ledger"]) == ("error", "corrupt")
    assert body["error"] == "LedgerCorrupt (send the bearer token for the message)"
    detailed = httpx.get(f"{base}/api/health", headers=AUTH, timeout=30).json()
    assert detailed["ledger"] == "corrupt"
    assert detailed["error"].startswith("LedgerCorrupt: ledger ")
    assert "SQLITE_CORRUPT" in detailed["error"] and "restore it from a backup" in \
        detailed["error"]


def test_health_reports_a_truncated_ledger(tmp_path: Path) -> None:
    url = _ledger(tmp_path / "l.db")
    with api_server(Control(url), WebSettings(ledger_url=url, api_token=TOKEN)) as base:
        assert httpx.get(f"{base}/api/health", timeout=30).status_code == 200
        cut_in_half(tmp_path / "l.db")
        _corrupt_health(base)


def test_health_reports_corruption_another_call_found(tmp_path: Path) -> None:
    url = _ledger(tmp_path / "l.db")
    with api_server(Control(url), WebSettings(ledger_url=url, api_token=TOKEN)) as base:
        assert httpx.get(f"{base}/api/health", timeout=30).status_code == 200
        damage_task_pages(tmp_path / "l.db")
        # The health check's own reads (schema version, clock) do not touch the tasks.
        status = httpx.get(f"{base}/api/status", headers=AUTH, timeout=30)
        assert status.status_code == 503, status.text
        assert status.json()["error"] == "ledger_corrupt"
        _corrupt_health(base)
        metrics = httpx.get(f"{base}/metrics", timeout=30)
        assert "ratchet_ledger_corrupt 1.0" in metrics.text
