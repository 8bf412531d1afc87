"""The dashboard in a real browser: Debian's chromium (headless, driven by Playwright)
against a real uvicorn server on loopback serving ``create_app`` over a real SQLite ledger,
with an in-process worker running the tasks the whole time.

What the pages show is compared with what the ledger holds (read through Control), and
every action taken through a form is checked on the ledger afterwards: the pause recorded
with who and why, tasks not claimed while paused, an UNKNOWN task resolved with its
result, a quarantine replayed. A screenshot of the overview is saved to
``$RATCHET_TEST_ARTIFACTS/dashboard-overview.png`` when that variable names a directory,
else to the module's temporary directory (its path is printed).

Chromium missing (``/usr/bin/chromium``): the module is skipped with a message, except
under ``CI=true`` where that is a failure (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from batchsupport import Gates, held, register, shard_items
from dashsupport import Bank, make_app, serve, settle

from ratchet import App, Control, State
from ratchet.testing import wait_for
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings, present

pytestmark = pytest.mark.timeout(120)

CHROMIUM = "/usr/bin/chromium"
STATE_COLUMNS = [s.value for s in State
                 if s not in (State.COMPENSATING, State.COMPENSATED)]
"""The columns the overview shows with no task compensating (those two appear only then)."""


def _require_chromium() -> None:
    if os.path.exists(CHROMIUM):
        return
    message = (f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y "
               "chromium) to run the dashboard's browser tests")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


# ---------------------------------------------------------------------- the system


@dataclass
class System:
    """Everything the tests drive: the app (tasks registered), a Control, the server's base
    URL, the worker's holder name and the external sides."""

    app: App
    control: Control
    base: str
    holder: str
    bank: Bank
    fixed: threading.Event


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash')}/ledger.db"
    bank, fixed = Bank(), threading.Event()
    app = make_app(url, bank, fixed)
    control = Control(url)
    with running_worker(app, concurrency=4, poll_interval_s=0.02) as worker, \
            serve(WebSettings(ledger_url=url), control) as base:
        yield System(app, control, base, worker.holder, bank, fixed)
    app.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, system: System) -> Iterator[Any]:
    """A fresh browser context (no cookies) on the dashboard."""
    context = browser.new_context(base_url=system.base, viewport={"width": 1600,
                                                                   "height": 900})
    context.set_default_timeout(20_000)
    tab = context.new_page()
    yield tab
    context.close()


def login(page: Any, name: str = "alice") -> None:
    page.goto("/login")
    page.fill("#login-operator", name)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#operator")
    assert name in page.inner_text("#operator")


# ---------------------------------------------------------------------- tests


def test_overview_shows_the_types_and_counts_the_ledger_holds(
        system: System, page: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    app = system.app
    done = [app.submit("shop.pack", {"order_id": f"o-{i}"}).task_id for i in range(5)]
    scheduled = [app.submit("shop.ship", {"order_id": f"later-{i}"}, delay_s=3600).task_id
                 for i in range(2)]
    for tid in done:
        settle(app, tid, State.SUCCEEDED)
    page.goto("/")
    rows = page.locator("#types tr.type-row")
    report = system.control.status()  # nothing moves now: the rest is finished or later
    assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.type)")) \
        == sorted(report.counts) == sorted(t.name for t in report.types)
    for view in report.types:
        row = page.locator(f'#types tr.type-row[data-type="{view.name}"]')
        shown = {s: int(row.locator(f'td.count[data-state="{s}"]').inner_text())
                 for s in STATE_COLUMNS}
        assert shown == {s: report.counts[view.name].get(s, 0) for s in STATE_COLUMNS}
        assert shown == {s: view.counts.get(s, 0) for s in STATE_COLUMNS}
        figures = {c: int(row.locator(f"td.{c}").inner_text())
                   for c in ("total", "backlog", "scheduled", "quarantined")}
        assert figures == {"total": view.total, "backlog": view.backlog,
                           "scheduled": view.scheduled,
                           "quarantined": view.quarantined}, view.name
        assert shown["UNKNOWN"] == view.unknown  # its oldest age is in td.oldest-unknown
        oldest_unknown = row.locator("td.oldest-unknown").inner_text()
        assert (oldest_unknown == "-") is (view.unknown == 0), view.name
    pack = page.locator('#types tr.type-row[data-type="shop.pack"]')
    assert pack.locator('td.count[data-state="SUCCEEDED"]').inner_text() == "5"
    assert pack.locator("td.drain").inner_text() == "no backlog"
    assert pack.locator("td.arrivals").inner_text() != "0"  # 5 a minute ago: per second
    ship = page.locator('#types tr.type-row[data-type="shop.ship"]')
    assert ship.locator('td.count[data-state="PENDING"]').inner_text() == str(len(scheduled))
    assert ship.locator("td.scheduled").inner_text() == str(len(scheduled))
    assert ship.locator("td.backlog").inner_text() == "0"
    assert ship.locator("td.drain").inner_text() == "nothing ready, 2 scheduled"
    total = page.locator("#types tfoot tr.totals")
    assert int(total.locator("td.total").inner_text()) == sum(
        sum(c.values()) for c in report.counts.values())
    assert system.holder in page.inner_text("#workers")  # the running worker, registered
    # The charts: every type together, and each type, arrivals and completions.
    assert page.locator("#chart-all svg polyline.arrivals").count() == 1
    assert page.locator("#chart-all svg polyline.completions").count() == 1
    dots = page.locator('figure.type-chart[data-type="shop.pack"] circle.completions title')
    assert sum(int(re.search(r": (\d+) in", t).group(1))  # type: ignore[union-attr]
               for t in dots.evaluate_all("els => els.map(e => e.textContent)")) == 5
    artifacts = os.environ.get("RATCHET_TEST_ARTIFACTS")
    where = Path(artifacts) if artifacts else tmp_path_factory.mktemp("artifacts")
    where.mkdir(parents=True, exist_ok=True)
    shot = where / "dashboard-overview.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"overview screenshot: {shot}")
    for tid in scheduled:  # leave nothing scheduled behind for the other tests
        system.control.cancel(tid, reason="test cleanup", by="test")


def test_overview_fits_a_1400_px_window(system: System, browser: Any) -> None:
    """The task-types table, every column of it, fits a 1,400 px wide window: neither the
    page nor the table's own box scrolls sideways (a narrower window scrolls the table,
    not the page)."""
    app = system.app
    for name in ("shop.pack", "shop.ship"):
        settle(app, app.submit(name, {"order_id": f"wide-{name}"}).task_id, State.SUCCEEDED)
    for width, table_fits in ((1400, True), (900, False)):
        context = browser.new_context(base_url=system.base,
                                      viewport={"width": width, "height": 900})
        try:
            page = context.new_page()
            page.goto("/")
            assert page.locator("#types tr.type-row").count() >= 2
            sizes = page.evaluate("""() => {
                const table = document.querySelector('#types');
                const last = table.querySelector('thead tr th:last-child');
                return {page: document.documentElement.scrollWidth, view: window.innerWidth,
                        table: table.scrollWidth, box: table.parentElement.clientWidth,
                        right: last.getBoundingClientRect().right};
            }""")
            assert sizes["page"] <= sizes["view"] == width, sizes
            if table_fits:
                assert sizes["table"] <= sizes["box"], sizes
                assert sizes["right"] <= width, sizes  # the last column is in view
        finally:
            context.close()


def test_task_page_shows_its_timeline_and_cancels_through_the_form(
        system: System, page: Any) -> None:
    app = system.app
    tid = app.submit("shop.pack", {"order_id": "t-1"}, idempotency_key="pack-t-1").task_id
    settle(app, tid, State.SUCCEEDED)
    page.goto(f"/tasks/{tid}")
    assert page.inner_text("#task-state") == "SUCCEEDED"
    kinds = page.locator("#timeline tbody tr").evaluate_all(
        "rs => rs.map(r => [r.dataset.kind, r.cells[1].innerText, r.cells[2].innerText, "
        "r.cells[3].innerText, r.cells[4].innerText])")
    claim = next(k for k in kinds if k[0] == "claim")
    assert claim[2] == "1" and claim[3] == system.holder
    assert any(k[0] == "step" and "choose_box" in k[1] for k in kinds)
    assert any(k[0] == "effect" and "print_label done" in k[1] and "key=label:t-1" in k[4]
               for k in kinds)
    assert kinds[0][0] == "submit" and "key=pack-t-1" in kinds[0][4]
    assert kinds[-1][0] == "transition" and kinds[-1][1] == "RUNNING -> SUCCEEDED"
    assert "label:t-1" in page.inner_text("#effects")
    tl = system.control.inspect(tid)
    assert len(kinds) == 1 + len(tl.events) + len(tl.steps) + len(tl.effects)
    # A finished task offers no cancel; a scheduled one does, through the form.
    assert page.locator("#cancel-form").count() == 0
    later = app.submit("shop.ship", {"order_id": "t-2"}, delay_s=3600).task_id
    login(page)
    page.goto(f"/tasks/{later}")
    page.click("#cancel-form button[type=submit]")  # no reason: refused, nothing changed
    assert "reason is required" in page.inner_text("#error")
    assert system.control.get(later).state is State.PENDING
    page.fill("#cancel-form input[name=reason]", "customer withdrew the order")
    page.click("#cancel-form button[type=submit]")
    page.wait_for_selector("#flash")
    assert page.inner_text("#task-state") == "CANCELLED"
    assert system.control.get(later).state is State.CANCELLED
    [event] = [e for e in system.control.inspect(later).events
               if e.kind == "operator_cancel"]
    assert event.detail["operator"] == "alice"
    assert event.detail["reason"] == "customer withdrew the order"
    operator_row = page.locator('#timeline tr[data-kind="operator"]')
    assert "alice" in operator_row.inner_text()
    assert "customer withdrew the order" in operator_row.inner_text()


def test_pause_and_resume_a_type_through_the_form(system: System, page: Any) -> None:
    app, control = system.app, system.control
    login(page, "bob")
    page.goto("/pauses")
    assert page.locator("#no-pauses").count() == 1
    page.fill("#pause-type", "shop.ship")
    page.click("#pause-form button[type=submit]")  # no reason: refused
    assert "reason is required" in page.inner_text("#error")
    assert control.pauses() == []
    page.fill("#pause-reason", "carrier outage")
    page.click("#pause-form button[type=submit]")
    page.wait_for_selector("#flash")
    assert "paused" in page.inner_text("#flash")
    row = page.locator('#pauses tr.pause[data-target="shop.ship"]')
    assert row.locator(".paused-by").inner_text() == "bob"
    assert row.locator(".why").inner_text() == "carrier outage"
    [pause] = control.pauses()
    assert (pause.scope, pause.target, pause.paused_by, pause.reason) == (
        "type", "shop.ship", "bob", "carrier outage")
    # Not claimed while paused: a later task of another type runs to the end first.
    held = app.submit("shop.ship", {"order_id": "p-1"}).task_id
    probe = app.submit("shop.pack", {"order_id": "p-2"}).task_id
    settle(app, probe, State.SUCCEEDED)
    assert control.get(held).state is State.PENDING
    assert control.get(held).attempt == 0
    page.goto("/")
    assert page.locator('#types tr.type-row[data-type="shop.ship"] .tag.paused').count() == 1
    assert "carrier outage" in page.inner_text("#pause-banner")
    page.goto("/pauses")
    form = page.locator('#pauses tr.pause[data-target="shop.ship"] form.resume-form')
    form.locator("input[name=rate]").fill("fast")  # not a rate: refused
    form.locator("input[name=reason]").fill("carrier back")
    form.locator("button[type=submit]").click()
    assert "not a number" in page.inner_text("#error")
    assert len(control.pauses()) == 1
    form = page.locator('#pauses tr.pause[data-target="shop.ship"] form.resume-form')
    form.locator("input[name=reason]").fill("carrier back")
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#flash")
    assert "resumed" in page.inner_text("#flash")
    assert page.locator("#no-pauses").count() == 1
    assert control.pauses() == []
    settle(app, held, State.SUCCEEDED)


def test_resolve_an_unknown_task_through_the_queue(system: System, page: Any) -> None:
    app, control = system.app, system.control
    tid = app.submit("bank.charge", {"order_id": "u-1"}).task_id
    unknown = settle(app, tid, State.UNKNOWN)
    assert unknown.error_class == "unknown_outcome"
    assert system.bank.calls == ["charge:u-1"]
    page.goto("/unknown")
    section = page.locator(f'section.unknown-task[data-task-id="{tid}"]')
    assert "charge:u-1" in section.inner_text()  # the open effect's key
    assert section.locator("form.resolve").count() == 0  # reads need no login; acts do
    login(page)
    page.goto(f"/tasks/{tid}")  # the task page offers the same resolve form
    assert page.inner_text("#task-state") == "UNKNOWN"
    assert "charge:u-1" in page.inner_text(f"#resolve-{tid} legend")
    page.goto("/unknown")
    form = page.locator(f"#resolve-{tid}")
    form.locator("input[value=done]").check()
    form.locator("textarea[name=result]").fill('{"charge_id": ')  # not JSON: refused
    form.locator("input[name=reason]").fill("seen in the bank console")
    form.locator("button[type=submit]").click()
    assert "not valid JSON" in page.inner_text("#error")
    assert control.get(tid).state is State.UNKNOWN
    form = page.locator(f"#resolve-{tid}")
    form.locator("textarea[name=result]").fill('{"charge_id": "ch_manual"}')
    form.locator("button[type=submit]").click()
    page.wait_for_selector("#flash")
    assert f"Task {tid} resolved done" in page.inner_text("#flash")
    info = settle(app, tid, State.SUCCEEDED)
    assert info.result == {"charge_id": "ch_manual"}
    assert system.bank.calls == ["charge:u-1"]  # done means done: not called again
    [event] = [e for e in control.inspect(tid).events if e.kind == "operator_resolve"]
    assert event.detail["operator"] == "alice"
    assert event.detail["reason"] == "seen in the bank console"
    assert event.detail["outcome"] == "done"
    page.goto("/unknown")
    assert page.locator(f'section.unknown-task[data-task-id="{tid}"]').count() == 0


def test_quarantine_dry_run_then_replay(system: System, page: Any) -> None:
    app, control = system.app, system.control
    tid = app.submit("feed.import", {"feed_id": "f-1"}).task_id
    wait_for("the feed task to be quarantined",
             lambda: any(g.task_type == "feed.import" for g in control.quarantine_list()))
    [group] = [g for g in control.quarantine_list() if g.task_type == "feed.import"]
    page.goto("/quarantine")
    row = page.locator(f"#fp-{group.fingerprint}")
    assert "feed parser rejects the header row" in row.inner_text()
    row.locator("input[name=rate]").fill("5")
    row.locator("button[type=submit]").click()
    assert tid in page.inner_text("#dry-run")
    assert control.get(tid).state is State.FAILED  # a dry run changes nothing
    login(page, "carol")
    page.goto(f"/quarantine?dry_run={group.fingerprint}&rate=5")
    system.fixed.set()
    page.fill("#replay-form input[name=reason]", "parser fixed in 1.4.2")
    page.click("#replay-form button[type=submit]")
    page.wait_for_selector("#flash")
    assert "Replayed 1 task(s)" in page.inner_text("#flash")
    settle(app, tid, State.SUCCEEDED)
    [event] = [e for e in control.inspect(tid).events if e.kind == "operator_replay"]
    assert (event.detail["operator"], event.detail["reason"]) == ("carol",
                                                                  "parser fixed in 1.4.2")


# ---------------------------------------------------------------------- no browser


@pytest.mark.parametrize(("ci", "outcome"), [("", "skip"), ("true", "fail")])
def test_without_chromium_the_module_skips_except_under_ci(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: str) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("CI", ci)
    expected = pytest.skip.Exception if outcome == "skip" else pytest.fail.Exception
    with pytest.raises(expected, match="apt-get install -y chromium"):
        _require_chromium()


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_mutations_need_a_session_its_csrf_token_and_this_origin(system: System) -> None:
    control = system.control
    with httpx.Client(base_url=system.base, timeout=30) as anonymous:
        r = anonymous.post("/actions/pause", data={"type": "shop.ship", "reason": "x"})
        assert r.status_code == 401 and "Log in first" in r.text
    with httpx.Client(base_url=system.base, timeout=30) as client:
        r = client.post("/login", data={"operator": "dave", "next": "/pauses"})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        csrf = _csrf(client.get("/pauses").text)
        r = client.post("/actions/pause",
                        data={"type": "shop.ship", "reason": "x", "csrf": "0" * 64})
        assert r.status_code == 403 and "CSRF" in r.text
        r = client.post("/actions/pause", data={"type": "shop.ship", "reason": "x",
                                                "csrf": csrf},
                        headers={"Origin": "https://evil.example"})
        assert r.status_code == 403
        r = client.post("/login", data={"operator": "mallory"},
                        headers={"Origin": "https://evil.example"})
        assert r.status_code == 403
        assert control.pauses() == []
        r = client.post("/login", data={"operator": "  "})
        assert r.status_code == 422 and "name is required" in r.text
        r = client.post("/logout", data={"csrf": csrf})
        assert r.status_code == 303 and 'ratchet_session=""' in r.headers["set-cookie"]
        client.cookies.clear()
        r = client.post("/actions/pause", data={"type": "shop.ship", "reason": "x",
                                                "csrf": csrf})
        assert r.status_code == 401


def test_with_a_token_the_login_needs_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    control = Control(url)
    control.migrate()
    with serve(WebSettings(ledger_url=url, api_token="s3cret-token"), control) as base, \
            httpx.Client(base_url=base, timeout=30) as client:
        assert 'name="token"' in client.get("/login").text
        r = client.post("/login", data={"operator": "erin", "token": "wrong"})
        assert r.status_code == 401 and "Wrong token" in r.text
        assert "ratchet_session" not in r.headers.get("set-cookie", "")
        r = client.post("/login", data={"operator": "erin", "token": "s3cret-token"})
        assert r.status_code == 303
        session = client.cookies["ratchet_session"]
        csrf = _csrf(client.get("/pauses").text)
        r = client.post("/actions/pause", data={"type": "t.x", "reason": "maintenance",
                                                "csrf": csrf})
        assert r.status_code == 303
        [pause] = control.pauses()
        assert (pause.paused_by, pause.reason) == ("erin", "maintenance")
    # Another service with another token does not accept this session (nor the key).
    with serve(WebSettings(ledger_url=url, api_token="other-token"), control) as base, \
            httpx.Client(base_url=base, cookies={"ratchet_session": session},
                         timeout=30) as other:
        r = other.post("/actions/resume", data={"scope": "type", "target": "t.x",
                                                "reason": "x", "csrf": csrf})
        assert r.status_code == 401
    assert len(control.pauses()) == 1
    control.close()


def test_with_a_token_a_page_asks_for_the_login_and_comes_back(browser: Any,
                                                              tmp_path: Path) -> None:
    """Token mode: a page opened without a session shows the login form; logging in with
    the token lands on the page asked for (its query too)."""
    url = f"sqlite:///{tmp_path}/l.db"
    control = Control(url)
    control.migrate()
    with serve(WebSettings(ledger_url=url, api_token="s3cret-token"), control) as base:
        context = browser.new_context(base_url=base)
        context.set_default_timeout(20_000)
        tab = context.new_page()
        try:
            tab.goto("/tasks?state=FAILED")
            assert urlsplit(tab.url).path == "/login"
            assert "every page needs a login" in tab.inner_text("#login-rule")
            tab.fill("#login-operator", "gina")
            tab.fill("#login-token", "wrong")
            tab.click("#login-form button[type=submit]")
            assert "Wrong token" in tab.inner_text("#error")
            tab.fill("#login-operator", "gina")
            tab.fill("#login-token", "s3cret-token")
            tab.click("#login-form button[type=submit]")
            tab.wait_for_selector("#operator")
            assert (urlsplit(tab.url).path, urlsplit(tab.url).query) == ("/tasks",
                                                                         "state=FAILED")
            assert "gina" in tab.inner_text("#operator")
            tab.goto("/pauses")
            assert urlsplit(tab.url).path == "/pauses"
        finally:
            context.close()
    control.close()


def test_reads_survive_a_missing_task_and_a_bad_filter(system: System) -> None:
    with httpx.Client(base_url=system.base, timeout=30) as client:
        r = client.get("/tasks/" + "0" * 32)
        assert r.status_code == 404 and "No such task" in r.text
        r = client.get("/tasks", params={"state": "SLEEPING"})
        assert r.status_code == 422 and "unknown state" in r.text
        r = client.get("/quarantine", params={"dry_run": "nothex", "rate": "1"})
        assert r.status_code == 422 and "fingerprint" in r.text
        assert client.get("/static/dashboard.css").status_code == 200
        started = time.monotonic()
        assert client.get("/").status_code == 200
        assert time.monotonic() - started < 10


def test_task_page_draws_a_bar_per_batch_run_and_per_shard(
        browser: Any, tmp_path: Path) -> None:
    """A run held at its watermark (20 of 100, one batch committed above it) and a sharded
    job whose shard 1 FAILED midway: the bars the browser renders carry the ledger's
    numbers (Control.batch_progress)."""
    url = f"sqlite:///{tmp_path}/batches.db"
    app, gates = App(url), Gates()
    register(app, gates)
    control = Control(url)
    held_id = app.submit("bt.items", {"n": 100, "size": 10, "parallel": 2,
                                      "hold": [20, 40]}).task_id
    job = app.submit_sharded("bt.shard", {"n": 90, "fail_shard": 1}, shards=3).task_id
    try:
        with running_worker(app, concurrency=4, poll_interval_s=0.02), \
                serve(WebSettings(ledger_url=url), Control(url)) as base:
            context = browser.new_context(base_url=base, viewport={"width": 1600,
                                                                   "height": 900})
            context.set_default_timeout(20_000)
            try:
                tab = context.new_page()
                run = held(control, held_id, 20, above=1)
                tab.goto(f"/tasks/{held_id}")
                bar = tab.locator('#batches .batch[data-run="items"]')
                assert bar.count() == 1
                progress = bar.locator("progress.batch-bar")
                assert progress.evaluate("e => [e.value, e.max, e.position]") == [
                    20, 100, 0.2]
                assert progress.is_visible()
                text = bar.inner_text()
                assert "20 / 100 (20.0%)" in text and "1 committed above the watermark" in text
                assert bar.locator(".batch-rate").inner_text() == present.rate(
                    run.rate_per_s, " items/s")

                assert app.wait(job, timeout_s=60).state is State.FAILED
                tab.goto(f"/tasks/{job}")
                shards = tab.locator("#shard-bars .batch").evaluate_all(
                    "bs => bs.map(b => [b.dataset.shard, b.querySelector('progress').value,"
                    " b.querySelector('progress').max, b.querySelector('.batch-eta')"
                    ".innerText])")
                expected = []
                for index in range(3):
                    n = shard_items(90, 3, index)
                    expected.append([f"{index}/3", 5 if index == 1 else n, n,
                                     "stopped" if index == 1 else "done"])
                assert shards == expected
                assert "Sharded job: 3 shards" in tab.inner_text("#batch-shards")
            finally:
                context.close()
                gates.release.set()
    finally:
        control.close()
        app.close()
