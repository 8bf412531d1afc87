"""What an operator sees of a failed attempt, on both ledgers: a real worker runs a task
whose HTTP call gets a real 503 from a loopback server (``raise_for_status()``: httpx's
message has two lines, the second "For more information check: ..."). ``ratchet tasks``,
``ratchet inspect``, the worker's log lines and the dashboard show the exception's type and
the first line of its message; the traceback is kept apart (``tasks.last_traceback``),
shown by ``ratchet inspect --traceback`` and in the task page's ``<details>``."""

from __future__ import annotations

import html
import http.server
import json
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from dashsupport import serve, settle
from typer.testing import CliRunner

from ratchet import App, Control, RetryPolicy, State, TaskContext
from ratchet.cli.main import cli
from ratchet.errortext import MESSAGE_MAX_CHARS, error_message, error_summary
from ratchet.observe.logs import AttemptLog
from ratchet.testing.worker import running_worker
from ratchet.web import WebSettings

pytestmark = pytest.mark.timeout(120)


class _Unavailable(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"down for maintenance"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def unavailable_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/charge"
    server.shutdown()
    server.server_close()


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), terminal_width=400)
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


def test_failed_attempt_shows_type_and_message_and_keeps_the_traceback_apart(
    ledger_url: str, unavailable_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(ledger_url)

    @app.task(name="pay.fetch", retry=RetryPolicy(max_attempts=1))
    def fetch(ctx: TaskContext, url: str) -> int:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
        return response.status_code

    caplog.set_level(logging.INFO, logger="ratchet")
    control = Control(ledger_url)
    try:
        with running_worker(app, concurrency=1, middleware=[AttemptLog()]):
            task_id = app.submit("pay.fetch", {"url": unavailable_url}).task_id
            settle(app, task_id, State.FAILED)
        with serve(WebSettings(ledger_url=ledger_url), control) as base:
            page = httpx.get(f"{base}/tasks/{task_id}", timeout=30).text
            listing = httpx.get(f"{base}/tasks", timeout=30).text
        info = control.get(task_id)
    finally:
        control.close()
        app.close()

    first = (f"HTTPStatusError: Server error '503 Service Unavailable' for url "
             f"'{unavailable_url}'")
    # The ledger: the message (type, then str(exc) whole), the traceback apart.
    assert info.last_error is not None and info.last_error.startswith(first + "\n")
    assert "For more information check" in info.last_error.splitlines()[1]
    assert info.last_traceback is not None
    assert info.last_traceback.startswith("Traceback (most recent call last):")
    assert "raise_for_status()" in info.last_traceback
    assert "Traceback" not in info.last_error

    # ratchet tasks / ratchet inspect: the type and the first line, not the "For more
    # information" line.
    listed = _cli("tasks", "--ledger", ledger_url)
    assert first in listed and "For more information" not in listed
    shown = _cli("inspect", task_id, "--ledger", ledger_url)
    assert f"last error: {first}" in shown
    assert "For more information" not in shown and "raise_for_status" not in shown
    assert "--traceback" in shown  # says where the rest is
    full = _cli("inspect", task_id, "--ledger", ledger_url, "--traceback")
    assert "For more information check" in full
    assert "Traceback (most recent call last):" in full and "raise_for_status()" in full
    as_json = json.loads(_cli("inspect", task_id, "--ledger", ledger_url, "--json"))
    assert as_json["task"]["last_traceback"] == info.last_traceback

    # The worker's log: its failure line and the attempt's outcome line.
    failure = [r.getMessage() for r in caplog.records if r.name == "ratchet.worker"
               and task_id in r.getMessage() and "-> FAILED" in r.getMessage()]
    assert len(failure) == 1 and failure[0].endswith(f": {first}"), failure
    outcome = [r for r in caplog.records if r.name == "ratchet.attempt"
               and getattr(r, "task_id", None) == task_id]
    assert len(outcome) == 1 and outcome[0].__dict__["error"] == first, outcome
    assert not [r for r in caplog.records if "For more information" in r.getMessage()
                and r.levelno >= logging.WARNING]

    # The dashboard: the line on the task and in the list, the traceback in an expander.
    shown_error = re.search(r'<code class="value" id="task-error">(.*?)</code>', page)
    assert shown_error and html.unescape(shown_error.group(1)) == first, page
    details = re.search(r'<details id="task-traceback">(.*?)</details>', page, re.S)
    assert details, page
    expander = html.unescape(details.group(1))
    assert "For more information check" in expander
    assert "Traceback (most recent call last):" in expander and "raise_for_status()" in expander
    assert first in html.unescape(listing)
    assert "For more information" not in listing


def test_error_text_of_odd_exceptions_and_of_rows_that_hold_a_traceback() -> None:
    """The recorded message is bounded, names the type alone when the message is empty,
    and the one-line form of a row whose last_error is a whole traceback (written by a
    release that kept no message apart) is still the exception's line."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert error_message(KeyError()) == "KeyError"
    assert error_message(ValueError("a\nb")) == "ValueError: a\nb"
    assert error_message(Unprintable()).startswith("Unprintable: (its message could not")
    long = error_message(ValueError("x" * 10_000))
    assert len(long) == MESSAGE_MAX_CHARS and long.endswith("…")
    old = ('Traceback (most recent call last):\n  File "t.py", line 1, in <module>\n'
           "ValueError: bad input\n")
    assert error_summary(old) == "ValueError: bad input"
    assert error_summary("HTTPStatusError: 503\nFor more information check: x") == (
        "HTTPStatusError: 503")
    assert error_summary(None) == error_summary("  \n") == ""
