"""Hostile text through the dashboard over real HTTP on both ledgers: a task name, params,
step name, error, idempotency key, operator name and pause reason carrying markup are shown
escaped on every page (and its SVG chart); odd task ids get a clean 422/404 page (the API's
statuses); the login's ``next`` never leads to another site."""

from __future__ import annotations

import re

import httpx
import pytest
from dashsupport import serve

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)

X = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>\u202e\U0001F600"
LIVE = ("<script>alert", "<img src=x")
"""What must never appear unescaped in a page."""


def test_markup_everywhere_is_escaped(ledger_url: str) -> None:
    app = App(ledger_url)
    name = "x" + X

    @app.task(name=name, retry=RetryPolicy(max_attempts=1))
    def bad(ctx: TaskContext, p: str, **kw: object) -> str:
        ctx.step("s" + X, lambda: 1)
        raise RuntimeError("boom " + X + "A" * 3000)

    control = Control(ledger_url)
    try:
        with running_worker(app, concurrency=1, poll_interval_s=0.02), \
                serve(WebSettings(ledger_url=ledger_url), control) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            tid = app.submit(name, {"p": X, X: X}, idempotency_key="k" + X).task_id
            wait_for("the task to fail", lambda: control.get(tid).state is State.FAILED, 30)
            assert client.post("/login", data={"operator": "op" + X}).status_code == 303
            found = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/pauses").text)
            assert found
            r = client.post("/actions/pause", data={"type": name, "reason": "r" + X,
                                                    "csrf": found.group(1)})
            assert r.status_code == 303
            pages = {"/": 200, f"/tasks/{tid}": 200, "/tasks": 200, "/quarantine": 200,
                     "/pauses": 200, "/unknown": 200, "/tasks/%00": 422,
                     "/tasks/" + "a" * 5000: 422, "/tasks/\u202e": 404,
                     "/tasks?cursor=" + X: 422, "/tasks?state=" + X: 422,
                     "/quarantine?dry_run=" + X + "&rate=1": 422}
            for path, status in pages.items():
                page = client.get(path, params={"name": name} if path == "/tasks" else None)
                assert page.status_code == status, path
                assert not [m for m in LIVE if m in page.text], path
                assert "Internal Server Error" not in page.text
            task_page = client.get(f"/tasks/{tid}").text
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in task_page
            for nxt in ("http://evil", "//evil", "/\\evil", "https:evil", "/\tevil",
                        "javascript:alert(1)"):
                r = client.post("/login", data={"operator": "bob", "next": nxt})
                assert (r.status_code, r.headers["location"]) == (303, "/"), nxt
    finally:
        control.close()
        app.close()
