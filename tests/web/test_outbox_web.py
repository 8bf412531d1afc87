"""The outbox on the web service, on both ledgers: ``GET /api/outbox`` and
``/api/outbox/messages`` (JSON, the token rule of reads) and the dashboard's Outbox page
(backlog, relays, failing and latest messages), on a real server."""

from __future__ import annotations

import httpx
import pytest
from dashsupport import serve
from outboxviewsupport import fill_outbox

from ratchet import App, Control
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)


def test_api_outbox(app: App, ledger_url: str) -> None:
    ids = fill_outbox(app)
    with Control(app=app) as control, serve(WebSettings(ledger_url=ledger_url),
                                            control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        got = client.get("/api/outbox")
        assert got.status_code == 200, got.text
        body = got.json()
        assert (body["unsent"], body["sent"], body["failing"], body["free_partitions"]) == (
            4, 2, 1, 28)
        assert body["relays"][0]["holder"] == "relay-a"
        assert body["relays"][0]["partitions"] == [0, 1, 2, 3]
        assert body["failures"][0]["message_id"] == ids["failing"]
        assert body["topics"][0] == {"topic": "order.paid", "unsent": 3, "failing": 1}
        assert client.get("/api/outbox", params={"top": 1}).json()["topics"] == [
            body["topics"][0]]
        assert client.get("/api/outbox", params={"top": -1}).status_code == 422
        listed = client.get("/api/outbox/messages", params={"limit": 3}).json()
        assert [m["message_id"] for m in listed] == [ids["nokey"], ids["new_sent"],
                                                     ids["failing"]]
        assert [m["state"] for m in listed] == ["unsent", "sent", "failing"]
        unsent = client.get("/api/outbox/messages",
                            params={"unsent_only": "true", "key": "k2"}).json()
        assert [m["message_id"] for m in unsent] == [ids["unsent_k2"], ids["failing"]]
        assert client.get("/api/outbox/messages", params={"limit": 0}).status_code == 422
        paths = {e["path"] for e in client.get("/api").json()["endpoints"]}
        assert {"/api/outbox", "/api/outbox/messages"} <= paths


def test_api_outbox_needs_the_token(app: App, ledger_url: str) -> None:
    fill_outbox(app)
    settings = WebSettings(ledger_url=ledger_url, api_token="s3cret-token-for-tests")
    with Control(app=app) as control, serve(settings, control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        assert client.get("/api/outbox").status_code == 401
        ok = client.get("/api/outbox",
                        headers={"Authorization": "Bearer s3cret-token-for-tests"})
        assert ok.status_code == 200 and ok.json()["unsent"] == 4


def test_dashboard_outbox_page(app: App, ledger_url: str) -> None:
    ids = fill_outbox(app)
    with Control(app=app) as control, serve(WebSettings(ledger_url=ledger_url),
                                            control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        page = client.get("/outbox")
        assert page.status_code == 200, page.text
        html = page.text
        assert 'href="/outbox" aria-current="page"' in html
        assert '<td class="num" id="unsent">4</td>' in html
        assert '<td class="num" id="failing">1</td>' in html
        assert 'data-holder="relay-a"' in html and "relay-old" not in html
        assert "broker refused: no route" in html
        for message_id in ids.values():
            assert f'data-message="{message_id}"' in html
        assert f'data-message="{ids["new_sent"]}" data-state="sent"' in html
        unsent = client.get("/outbox", params={"unsent": "1"}).text
        assert f'data-message="{ids["new_sent"]}" data-state' not in unsent
        assert f'data-message="{ids["unsent_k1"]}" data-state="unsent"' in unsent
        overview = client.get("/").text
        assert 'href="/outbox"' in overview


def test_dashboard_outbox_page_empty(app: App, ledger_url: str) -> None:
    app.ledger.migrate()
    with Control(app=app) as control, serve(WebSettings(ledger_url=ledger_url),
                                            control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        page = client.get("/outbox")
        assert page.status_code == 200, page.text
        assert 'id="no-relays"' in page.text and 'id="no-messages"' in page.text
