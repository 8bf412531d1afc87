"""The dashboard's pure parts, without a browser: the SVG chart, the formatting and drain
text, the merged task timeline, and the signed sessions / CSRF tokens."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from ratchet.capacity import capacity_views
from ratchet.control import EffectView, StepView, TaskTimeline
from ratchet.ledger.base import AuditEvent, TaskInfo, TypeCapacity
from ratchet.states import State
from ratchet.web import charts, present
from ratchet.web.dashboard import BadInput, _result
from ratchet.web.sessions import Flash, SessionKeeper


def test_chart_is_valid_svg_with_both_series_scaled_per_second() -> None:
    points = [charts.RatePoint(1000.0 + 30 * i, a, c)
              for i, (a, c) in enumerate([(30, 0), (60, 30), (0, 90)])]
    svg = charts.arrival_completion_svg(points, 30.0, title="a <b> & c")
    root = ET.fromstring(svg)  # well-formed XML; the title is escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert root.find(f"{ns}title").text == "a <b> & c"  # type: ignore[union-attr]
    lines = {el.get("class"): el.get("points") for el in root.iter(f"{ns}polyline")}
    assert set(lines) == {"line arrivals", "line completions"}
    assert all(len((pts or "").split()) == 3 for pts in lines.values())
    labels = [el.text for el in root.iter(f"{ns}text")]
    assert labels[:3] == ["0", "2.5/s", "5/s"]  # peak 90 in 30 s = 3/s: the axis tops at 5/s
    assert "now" in labels and "-1.5 min" in labels


def test_chart_without_data_says_so() -> None:
    svg = charts.arrival_completion_svg([], 30.0)
    assert "no data" in svg
    ET.fromstring(svg)
    with pytest.raises(ValueError, match="bucket_s"):
        charts.arrival_completion_svg([], 0)


def test_drain_text_is_the_records_verdict() -> None:
    # The verdict is made once, in ratchet.capacity, for the CLI, the API and the pages.
    [view], _ = capacity_views({"t": {"PENDING": 3}}, [TypeCapacity("t")], 100.0, 60.0)
    assert present.drain(view) == view.drain == "no arrivals in the last 60 s; not " \
        "draining (no completion in the last 15 s)"
    assert present.drain(object()) == "-"


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.25, "250 ms"), (12.34, "12.3 s"), (245, "4 min 05 s"),
    (7380, "2 h 03 min"), (3 * 86400 + 4 * 3600, "3 d 4 h"),
])
def test_duration(seconds: float | None, text: str) -> None:
    assert present.duration(seconds) == text


def test_timeline_merges_everything_in_time_order() -> None:
    task = TaskInfo("t1", "shop.pack", 1, State.SUCCEEDED, 1, 1, 3, None, None, 10.0, 10.0,
                    13.0, "k-1", {}, "d", {"ok": True}, None, None)
    events = [
        AuditEvent(1, "t1", 11.0, "claim", "PENDING", "RUNNING", 1, "w-1",
                   {"attempt": 1, "lease_s": 15}),
        AuditEvent(2, "t1", 12.0, "transition", "RUNNING", "SUCCEEDED", 1, "w-1",
                   {"operation": "finish"}),
        AuditEvent(3, "t1", 13.0, "operator_cancel", "SUCCEEDED", None, 1, None,
                   {"operator": "alice", "reason": "too late"}),
    ]
    tl = TaskTimeline(task, events, [StepView("choose", {"box": "M"}, 1, 11.5)],
                      [EffectView("label", "label:1", "done", {"l": 1}, 1, 1, 1, False,
                                  12.0)])
    rows = present.timeline_rows(tl)
    assert [r.kind for r in rows] == ["submit", "claim", "step", "effect", "transition",
                                      "operator"]
    assert rows[0].detail == "key=k-1"
    assert (rows[1].holder, rows[1].generation) == ("w-1", 1)
    assert "key=label:1" in rows[3].detail
    assert (rows[5].operator, rows[5].reason) == ("alice", "too late")
    assert rows[5].label == "operator cancel"
    assert "alice" not in rows[5].detail


def test_sessions_are_signed_expire_and_bind_their_csrf_token() -> None:
    keeper = SessionKeeper("token-a")
    session, cookie = keeper.issue("alice", now=1000.0)
    assert keeper.read(cookie, now=1001.0) == session
    assert keeper.read(cookie, now=session.expires_at) is None  # expired
    payload, mac = cookie.split(".")
    assert keeper.read(f"{payload}.{'0' * len(mac)}", now=1001.0) is None  # forged
    assert keeper.read("garbage", now=1001.0) is None
    assert SessionKeeper("token-b").read(cookie, now=1001.0) is None  # another token
    assert SessionKeeper("token-a").read(cookie, now=1001.0) == session  # a replica
    token = keeper.csrf_token(session)
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert keeper.csrf_ok(session, token)
    other, _ = keeper.issue("bob", now=1000.0)
    assert not keeper.csrf_ok(other, token)
    assert not keeper.csrf_ok(None, token) and not keeper.csrf_ok(session, "")
    flash = keeper.flash("paused", now=1000.0)
    assert keeper.read_flash(flash, now=1010.0) == Flash("paused", "ok")
    assert keeper.read_flash(flash, now=2000.0) is None
    assert keeper.read_flash(cookie, now=1001.0) is None  # a session is not a flash


def test_a_resolve_result_with_a_key_twice_is_refused() -> None:
    assert _result('{"id": 1, "nested": {"id": 2}}', "done") == {"id": 1, "nested": {"id": 2}}
    with pytest.raises(BadInput, match="'id' appears twice in one object"):
        _result('{"charge": {"id": 1, "id": 2}}', "done")
