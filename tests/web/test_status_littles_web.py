"""The capacity figures by Little's law (``TypeStatusView.mean_attempt_s``, ``slots``,
``in_flight``, ``slots_needed``, ``capacity``) on the HTTP faces: ``GET /api/status`` with
and without ``drain_within_s``, and the dashboard's overview table, on both ledgers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from dashsupport import serve

from ratchet import App, Control, TaskContext
from ratchet.web import WebSettings

OTHER = "littles.other"


@pytest.fixture
def lapp(ledger_url: str) -> Iterator[App]:
    app = App(ledger_url)

    @app.task(name=OTHER)
    def other(ctx: TaskContext, n: int) -> int:
        return n

    yield app
    app.close()


def test_api_and_dashboard_show_the_capacity_figures(ledger_url: str, lapp: App) -> None:
    lapp.submit(OTHER, {"n": 1})
    with serve(WebSettings(ledger_url=ledger_url), Control(ledger_url)) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        body = client.get("/api/status").json()
        [t] = [t for t in body["types"] if t["name"] == OTHER]
        assert t["slots_needed"] is None and body["drain_within_s"] is None
        assert {"attempts", "mean_attempt_s", "slots", "workers", "in_flight",
                "over_capacity", "capacity"} <= set(t)
        body = client.get("/api/status", params={"drain_within_s": 600}).json()
        assert body["drain_within_s"] == 600
        assert client.get("/api/status", params={"drain_within_s": 0}).status_code == 422
        page = client.get("/").text
        assert "Capacity by Little&#39;s law" in page or "Capacity by Little's law" in page
        assert 'id="capacity"' in page and "slots needed" not in page
        page = client.get("/", params={"drain_within_s": "10m"}).text
        assert "slots needed" in page
        assert client.get("/", params={"drain_within_s": "soon"}).status_code == 422
