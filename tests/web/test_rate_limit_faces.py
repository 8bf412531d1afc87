"""Flow control in the faces (DESIGN §8, flow control), on both ledgers: ``ratchet limits
set|clear --rate`` and the listing (errors exit 2), ``ratchet status`` per queue (text and
--json), ``ratchet inspect``'s flow line, ``GET /api/limits``, ``/api/status``,
``/api/tasks/{id}``, the dashboard's overview, task and limits pages, and the flow metrics.
"""

from __future__ import annotations

import json

import httpx
import pytest
from dashsupport import serve
from typer.testing import CliRunner

from ratchet import App, Control, State, TaskContext
from ratchet.cli.main import cli
from ratchet.ledger.base import DefinitionSpec, TaskWrite, Transition
from ratchet.observe.ledger_metrics import render_ledger_metrics
from ratchet.ratelimit import RateLimit
from ratchet.serde import dumps
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)


def make_app(url: str) -> App:
    app = App(url)

    @app.task(name="pay", queue="payments", rate_limit=RateLimit("20/s", key="merchant"))
    def pay(ctx: TaskContext, merchant: str) -> None:
        return None

    @app.task(name="mail")
    def mail(ctx: TaskContext) -> None:
        return None

    return app


def register(app: App) -> None:
    """What a worker of ``app`` registers at start."""
    app.ledger.register_definitions("w-1", [
        DefinitionSpec(d.name, d.version, dumps(d.spec()))
        for versions in app.versions.values() for d in versions.values()])


def hold_one(app: App) -> str:
    """Submit pay tasks; claim one and hand it back rate-limited (as a downstream's empty
    bucket does). Returns its id."""
    for m in ("m1", "m2"):
        app.submit("pay", {"merchant": m})
    app.submit("mail", {})
    [claim] = app.ledger.claim("h", ["pay"], 1)
    app.ledger.commit([TaskWrite(claim.task_id, claim.generation, "h", "rate",
                                 transition=Transition(State.PENDING, delay_s=600.0,
                                                       flow_wait="rate"))])
    return claim.task_id


def run(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(cli, list(args))
    return out.exit_code, out.output


def test_cli_rate_limits_status_and_inspect(ledger_url: str) -> None:
    app = make_app(ledger_url)
    try:
        register(app)
        code, text = run("limits", "--ledger", ledger_url)
        assert code == 0, text
        assert "rate limits" in text and "20/s" in text and "merchant" in text
        assert "code" in text
        code, text = run("limits", "set", "--type", "pay", "--rate", "5/s", "--burst", "10",
                         "--key-param", "merchant", "--reason", "psp", "--operator", "al",
                         "--ledger", ledger_url)
        assert code == 0 and "5/s" in text and "burst 10" in text, text
        # (Held back after the change: a change re-checks the tasks held back then.)
        held = hold_one(app)
        code, text = run("limits", "--json", "--ledger", ledger_url)
        [rate] = json.loads(text)["rate_limits"]
        assert (rate["rate"], rate["burst"], rate["source"], rate["held"]) == (
            "5/s", 10, "operator", 1)
        code, text = run("limits", "--ledger", ledger_url)
        assert "rate 5/s, burst 10, key merchant by" in text, text
        # Bad input: exit 2 with a message naming the problem.
        code, text = run("limits", "set", "--type", "pay", "--rate", "fast", "--reason",
                         "x", "--ledger", ledger_url)
        assert code == 2 and "not N/unit" in text, text
        code, text = run("limits", "set", "--tenant", "acme", "--rate", "5/s", "--reason",
                         "x", "--ledger", ledger_url)
        assert code == 2 and "--type NAME only" in text, text
        code, text = run("limits", "set", "--type", "pay", "--max", "2", "--burst", "3",
                         "--reason", "x", "--ledger", ledger_url)
        assert code == 2 and "go with --rate" in text, text

        code, text = run("status", "--ledger", ledger_url)
        assert code == 0 and "tasks by queue" in text and "payments" in text, text
        assert "held back by flow control: pay: 1 rate-limited" in text, text
        code, text = run("status", "--json", "--ledger", ledger_url)
        queues = {q["queue"]: q for q in json.loads(text)["queues"]}
        assert (queues["payments"]["ready"], queues["payments"]["rate_limited"]) == (1, 1)
        assert queues["default"]["ready"] == 1
        code, text = run("inspect", held, "--ledger", ledger_url)
        assert code == 0 and "queue: payments" in text and "held back by a rate limit" in text
        code, text = run("inspect", held, "--json", "--ledger", ledger_url)
        task = json.loads(text)["task"]
        assert (task["queue"], task["priority"], task["flow_wait"], task["key_slot"]) == (
            "payments", 0, "rate", False)
        code, text = run("limits", "clear", "--type", "pay", "--rate", "--reason", "ok",
                         "--ledger", ledger_url)
        assert code == 0 and "cleared" in text, text
        code, text = run("limits", "clear", "--type", "pay", "--rate", "--reason", "ok",
                         "--ledger", ledger_url)
        assert code == 2 and "declared in its code" in text, text
    finally:
        app.close()


def test_http_dashboard_and_metrics(ledger_url: str) -> None:
    app = make_app(ledger_url)
    control = Control(ledger_url)
    try:
        register(app)
        held = hold_one(app)
        with serve(WebSettings(ledger_url=ledger_url), control) as base, \
                httpx.Client(base_url=base, timeout=30) as client:
            limits = client.get("/api/limits")
            assert limits.status_code == 200, limits.text
            [rate] = limits.json()["rate_limits"]
            assert (rate["name"], rate["rate"], rate["key_param"], rate["held"]) == (
                "pay", "20/s", "merchant", 1)
            status = client.get("/api/status").json()
            assert {q["queue"] for q in status["queues"]} == {"payments", "default"}
            assert status["flow"] == [{"name": "pay", "rate_limited": 1, "key_waiting": 0}]
            task = client.get(f"/api/tasks/{held}").json()["task"]
            assert (task["queue"], task["flow_wait"], task["ckey"]) == ("payments", "rate",
                                                                         None)
            overview = client.get("/").text
            assert 'data-queue="payments"' in overview and "1 rate-limited" in overview
            page = client.get(f"/tasks/{held}").text
            assert 'id="task-queue">payments' in page and "rate-limited" in page
            limits_page = client.get("/limits").text
            assert 'id="rate-limits"' in limits_page and "20/s" in limits_page
        body, _ = render_ledger_metrics(Control(ledger_url))
        text = body.decode()
        assert 'ratchet_ledger_queue_tasks{queue="payments",state="rate_limited"} 1.0' in text
        assert 'ratchet_ledger_queue_tasks{queue="default",state="ready"} 1.0' in text
        assert 'ratchet_ledger_rate_limited_tasks{type="pay"} 1.0' in text
        assert 'ratchet_ledger_key_waiting_tasks{type="mail"} 0.0' in text
    finally:
        control.close()
        app.close()
