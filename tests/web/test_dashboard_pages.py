"""Every dashboard page over real HTTP on both ledgers (SQLite file, PostgreSQL schema),
with an in-process worker, without a browser: the pages render what Control reads, and a
pause and a resolve through the forms (session, CSRF token) land in the ledger."""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from dashsupport import Bank, make_app, serve, settle

from ratchet import Control, State
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_every_page_and_two_actions(ledger_url: str) -> None:
    bank, fixed = Bank(), threading.Event()
    app = make_app(ledger_url, bank, fixed)
    control = Control(ledger_url)
    try:
        with running_worker(app, concurrency=2, poll_interval_s=0.02), \
                serve(WebSettings(ledger_url=ledger_url), control) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            done = app.submit("shop.pack", {"order_id": "a-1"}).task_id
            unknown = app.submit("bank.charge", {"order_id": "a-2"}).task_id
            quarantined = app.submit("feed.import", {"feed_id": "a-3"}).task_id
            settle(app, done, State.SUCCEEDED)
            settle(app, unknown, State.UNKNOWN)
            settle(app, quarantined, State.FAILED)
            overview = client.get("/")
            assert overview.status_code == 200
            for name in ("shop.pack", "bank.charge", "feed.import"):
                assert f'data-type="{name}"' in overview.text
            assert "<svg" in overview.text and "polyline" in overview.text
            page = client.get(f"/tasks/{done}")
            assert page.status_code == 200 and "label:a-1" in page.text
            assert client.get("/tasks", params={"state": "SUCCEEDED"}).text.count(done) >= 1
            assert "charge:a-2" in client.get("/unknown").text
            [group] = control.quarantine_list()
            dry = client.get("/quarantine", params={"dry_run": group.fingerprint,
                                                    "rate": "2"})
            assert dry.status_code == 200 and quarantined in dry.text
            assert control.get(quarantined).state is State.FAILED
            assert client.post("/login", data={"operator": "frank"}).status_code == 303
            csrf = _csrf(client.get("/pauses").text)
            r = client.post("/actions/pause", data={"type": "shop.ship",
                                                    "reason": "maintenance", "csrf": csrf})
            assert r.status_code == 303
            [pause] = control.pauses()
            assert (pause.target, pause.paused_by, pause.reason) == (
                "shop.ship", "frank", "maintenance")
            assert "maintenance" in client.get("/pauses").text
            r = client.post("/actions/pause", data={"type": "shop.ship",
                                                    "reason": "again", "csrf": csrf})
            assert r.status_code == 303  # already paused: unchanged, said so
            again = client.get("/pauses").text
            assert "flash-unchanged" in again and "already paused" in again
            assert len(control.pauses()) == 1
            later = app.submit("shop.pack", {"order_id": "a-4"}, delay_s=3600).task_id
            assert 'id="pause-task-form"' in client.get(f"/tasks/{later}").text
            r = client.post("/actions/pause", data={"task_id": later, "reason": "hold it",
                                                    "csrf": csrf})
            assert r.status_code == 303 and r.headers["location"] == f"/tasks/{later}"
            assert control.get(later).state is State.PAUSED
            page = client.get(f"/tasks/{later}").text
            assert 'id="resume-task-form"' in page and "hold it" in page
            r = client.post("/actions/resume", data={
                "scope": "task", "target": later, "back": "task", "reason": "go",
                "csrf": csrf})
            assert r.status_code == 303 and r.headers["location"] == f"/tasks/{later}"
            resumed = control.get(later)  # back to PENDING, its delay kept (not claimed)
            assert resumed.state is State.PENDING
            assert resumed.run_at > control.ledger_now() + 3000
            r = client.post("/actions/resolve", data={
                "task_id": unknown, "outcome": "not-done", "result": "",
                "reason": "no such charge at the bank", "csrf": csrf})
            assert r.status_code == 303
            info = settle(app, unknown, State.SUCCEEDED)
            assert info.result == {"charge_id": "ch_charge:a-2"}
            assert bank.calls == ["charge:a-2", "charge:a-2"]  # not-done: called again
    finally:
        control.close()
        app.close()
