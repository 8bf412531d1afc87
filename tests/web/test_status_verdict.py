"""Why a task type does not drain, said once by ``Control.status`` (``TypeStatusView.drain``,
``paused``, ``limited``, ``drain_window_s``, ``arrivals_stopped``) and shown unchanged by
``ratchet status`` (text and ``--json``), ``GET /api/status`` and the dashboard, on both
ledgers: a paused type says who paused it and since when, never an ETA; a full
concurrency limit is named with its running count; a burst that ended is not reported as a
growing backlog; the estimate names the window it used. Plus the dashboard's limits page."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import httpx
import pytest
from dashsupport import serve
from typer.testing import CliRunner

from ratchet import App, Control, State, TaskContext, open_ledger
from ratchet.capacity import LimitReached, TypeStatusView, capacity_views
from ratchet.cli.main import cli
from ratchet.ledger.base import Ledger, PauseRecord, TaskWrite, Transition, TypeCapacity
from ratchet.testing.processes import wait_for
from ratchet.web import WebSettings

A = "verdict.a"
B = "verdict.b"


@pytest.fixture
def vapp(ledger_url: str) -> Iterator[App]:
    app = App(ledger_url)

    @app.task(name=A)
    def a(ctx: TaskContext, n: int) -> int:
        return n

    @app.task(name=B)
    def b(ctx: TaskContext, n: int) -> int:
        return n

    yield app
    app.close()


@pytest.fixture
def led(ledger_url: str, vapp: App) -> Iterator[Ledger]:
    assert vapp.ledger is not None  # opens and migrates the ledger
    ledger = open_ledger(ledger_url)
    yield ledger
    ledger.close()


def _finish(led: Ledger, name: str) -> None:
    [claim] = led.claim("w-verdict", [name], 1)
    [ok] = led.commit([TaskWrite(claim.task_id, claim.generation, "w-verdict", "done",
                                 transition=Transition(State.SUCCEEDED, result_json="1"))])
    assert ok.ok


def _view(views: list[TypeStatusView], name: str) -> TypeStatusView:
    [view] = [v for v in views if v.name == name]
    return view


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_a_paused_type_says_by_whom_and_since_when_on_every_face(
        ledger_url: str, vapp: App, led: Ledger) -> None:
    for n in range(4):
        vapp.submit(A, {"n": n})
        vapp.submit(B, {"n": n})
    _finish(led, A)
    _finish(led, A)  # completions in the window: the rates alone would promise a drain
    with Control(ledger_url) as control:
        control.pause("type", A, reason="bad deploy", by="alice")
        report = control.status()
        a, b = _view(report.types, A), _view(report.types, B)
        assert a.paused is not None and a.paused.paused_by == "alice"
        assert a.drain_eta_s is None and "drains" not in a.drain, a.drain
        assert a.drain.startswith("paused by alice since "), a.drain
        assert a.drain.endswith("; 2 ready wait for the resume"), a.drain
        assert b.paused is None and "paused" not in b.drain
        # The CLI's table and --json, the API and the dashboard show the same verdict.
        text = _cli("status", "--ledger", ledger_url)
        rows = [ln for ln in text.splitlines() if ln.strip("│┃ ").startswith(A)]
        assert any("paused by alice since" in row for row in rows), text
        as_json = json.loads(_cli("status", "--ledger", ledger_url, "--json"))
        [ja] = [t for t in as_json["types"] if t["name"] == A]
        assert ja["paused"]["paused_by"] == "alice" and ja["drain_eta_s"] is None
        assert ja["drain"].startswith("paused by alice since ")
        with serve(WebSettings(ledger_url=ledger_url), Control(ledger_url)) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            api = client.get("/api/status").json()
            [pa] = [t for t in api["types"] if t["name"] == A]
            assert pa["paused"]["paused_by"] == "alice"
            assert pa["drain"].startswith("paused by alice since ")
            page = client.get("/").text
            assert "paused by alice since" in page
        # A pause of everything covers every type and the totals.
        control.pause("all", reason="freeze", by="bob")
        report = control.status()
        for view in (*report.types, report.totals):
            assert view is not None and view.paused is not None, view
        assert report.totals is not None and report.totals.drain.startswith(
            "everything paused by bob since ")


def test_a_full_limit_is_named_with_its_running_count(
        ledger_url: str, vapp: App, led: Ledger) -> None:
    for n in range(3):
        vapp.submit(A, {"n": n})
        vapp.submit(B, {"n": n}, tenant="acme")
    with Control(ledger_url) as control:
        control.set_limit("type", A, maximum=1, reason="downstream is slow", by="carol")
        control.set_limit("tenant", "acme", maximum=1, reason="fair share", by="carol")
        control.set_limit("total", maximum=50, reason="cluster size", by="carol")
        assert len(led.claim("w-verdict", [A], 5)) == 1   # the cap lets one through
        assert len(led.claim("w-verdict", [B], 5)) == 1   # acme's cap: one
        report = control.status()
        a, b = _view(report.types, A), _view(report.types, B)
        assert a.limited == [LimitReached("type", A, 1, 1)], a
        assert "limited (1 running, of its type limit 1)" in a.drain, a.drain
        assert b.limited == [LimitReached("tenant", "acme", 1, 1)], b
        assert "limited (1 running, of tenant acme's limit 1)" in b.drain, b.drain
        assert report.totals is not None and report.totals.limited == []  # 2 of 50
        text = _cli("status", "--ledger", ledger_url)
        assert "limited (1 running, of its type limit 1)" in text, text
        # The dashboard's limits page: every limit with its live use, linked from the nav.
        with serve(WebSettings(ledger_url=ledger_url), Control(ledger_url)) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            overview = client.get("/")
            assert 'href="/limits"' in overview.text
            page = client.get("/limits")
            assert page.status_code == 200, page.text
            html = page.text
            assert f'data-scope="type" data-name="{A}"' in html
            assert 'data-scope="tenant" data-name="acme"' in html
            assert 'data-scope="total" data-name=""' in html
            assert html.count('<span class="tag full">full</span>') == 2, html
            assert "downstream is slow" in html and "fair share" in html
            assert f'data-type="{A}"' in html and 'id="running-all">2<' in html


def test_arrivals_that_stopped_are_not_a_growing_backlog(
        ledger_url: str, vapp: App, led: Ledger) -> None:
    window = 8.0  # its recent part: 2 s
    for n in range(20):
        vapp.submit(A, {"n": n})
    _finish(led, A)
    with Control(ledger_url) as control:
        burst = _view(control.status(window).types, A)
        if not burst.arrivals_stopped:  # read within 2 s of the burst (a stall may pass it)
            assert burst.net_drain_per_s < 0 and burst.drain_window_s == window
            assert burst.drain == f"backlog growing by {19 / window:.3g}/s (over the last " \
                                  f"{window:g} s)", burst.drain

        def stopped() -> TypeStatusView | None:
            view = _view(control.status(window).types, A)
            return view if view.arrivals_stopped else None

        wait_for("no arrival in the window's recent part", stopped, timeout_s=60)
        _finish(led, A)
        _finish(led, A)
        view = _view(control.status(window).types, A)
    assert view.arrivals_stopped and view.drain_window_s == window / 4
    # The window's average still counts the burst; the verdict does not.
    assert view.arrival_per_s > view.completion_per_s
    assert view.net_drain_per_s >= 0 and "growing" not in view.drain, view.drain
    if view.last_arrival_age_s is not None:
        assert view.drain.startswith("arrivals stopped "), view.drain
    if view.net_drain_per_s > 0:  # the two finishes are within the recent part
        assert view.drain_eta_s == pytest.approx(view.backlog / view.net_drain_per_s)
        assert view.drain.endswith(f" (at the last {window / 4:g} s's rate)"), view.drain
    else:
        assert view.drain.endswith(f"not draining (no completion in the last "
                                   f"{window / 4:g} s)"), view.drain


def test_verdict_arithmetic() -> None:
    """The estimate's window and the verdict's wording, from one read's figures."""
    counts = {"x": {"PENDING": 30}, "y": {"PENDING": 30}, "z": {"PENDING": 30}}
    caps = [
        # Arriving still: the whole window, completions minus arrivals.
        TypeCapacity("x", arrivals=60, completions=120, recent_arrivals=10,
                     recent_completions=30, last_arrival_at=99.0),
        # A burst 40 s ago, nothing since: 15 s of completions, no arrivals.
        TypeCapacity("y", arrivals=600, completions=45, recent_arrivals=0,
                     recent_completions=15, last_arrival_at=60.0),
        # Nothing arrived in the window and nothing finished lately.
        TypeCapacity("z", completions=3),
    ]
    pause = PauseRecord(1, "type", "z", 3, "dora", "migration", created_at=-200.0)
    views, total = capacity_views(counts, caps, now=100.0, window_s=60.0, pauses=[pause])
    x, y, z = views
    assert (x.drain_window_s, x.net_drain_per_s, x.drain_eta_s) == (60.0, 1.0, 30.0)
    assert x.drain == "drains in ~30.0s (at the last 60 s's rate)"
    assert (y.drain_window_s, y.net_drain_per_s, y.drain_eta_s) == (15.0, 1.0, 30.0)
    assert y.arrival_per_s == 10.0 and y.last_arrival_age_s == 40.0
    assert y.drain == "arrivals stopped 40.0s ago; drains in ~30.0s (at the last 15 s's rate)"
    assert z.paused == pause and z.drain_eta_s is None
    assert z.drain == "paused by dora since 23:56:40 UTC (5m00s ago); no arrivals in the " \
                      "last 60 s; 30 ready wait for the resume"
    assert not total.arrivals_stopped and total.paused is None
    assert set(dataclasses.asdict(total)) == {f.name for f in dataclasses.fields(TypeStatusView)}
