"""A replay always ends and always reports, on histories a real worker recorded, on both
ledgers: a body that swallows the replay's stop with a bare ``except:`` and loops is
reported as not stopping within the time bound (``timeout_s``, ``ratchet replay
--timeout``), its daemon thread left behind; once the replay has stopped, every further
checkpoint raises at once; a body that raises ``KeyboardInterrupt``, ``SystemExit``,
``GeneratorExit``, ``asyncio.CancelledError`` or a plain ``BaseException`` is compared with
the recorded error like any exception, never let through."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import stopapp
from typer.testing import CliRunner

from ratchet import App, InvalidArguments, State
from ratchet.cli.main import cli
from ratchet.testing import replay, replay_sample, running_worker, wait_for

pytestmark = pytest.mark.timeout(120)

KINDS = ("keyboard", "base", "generator_exit", "system_exit", "cancelled")


def _replay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ratchet-replay" and t.is_alive()]


@pytest.fixture
def recorded(ledger_url: str) -> Iterator[tuple[App, dict[str, str]]]:
    """An App on the test's ledger and the ids of the tasks a real worker ran: ``loop``
    and ``loop_async`` with version 1 (succeeded after step ``first``), and ``raises`` /
    ``raises_async`` with every kind of ``BaseException``."""
    stopapp.RELEASE.clear()
    app = stopapp.make_app(ledger_url)
    ids = {"loop": app.submit("loop", {}, version=1).task_id,
           "loop_async": app.submit("loop_async", {}, version=1).task_id}
    for kind in KINDS:
        if kind != "cancelled":
            ids[kind] = app.submit("raises", {"kind": kind}).task_id
        ids[f"{kind}_async"] = app.submit("raises_async", {"kind": kind}).task_id
    with running_worker(app, concurrency=2):
        for task_id in ids.values():
            wait_for(f"task {task_id} to end",
                     lambda t=task_id: app.get(t).state in (State.SUCCEEDED, State.FAILED),
                     timeout_s=60)
    try:
        yield app, ids
    finally:
        stopapp.RELEASE.set()  # lets a body left looping on its daemon thread end
        wait_for("the replay threads to end", lambda: not _replay_threads(), timeout_s=30)
        app.close()


@pytest.mark.parametrize("name", ["loop", "loop_async"])
def test_a_body_that_swallows_the_stop_is_reported_within_the_time_bound(
        recorded: tuple[App, dict[str, str]], name: str) -> None:
    app, ids = recorded
    assert app.get(ids[name]).state is State.SUCCEEDED
    started = time.monotonic()
    report = replay(app, ids[name], version=2, timeout_s=1.5)
    assert time.monotonic() - started < 30
    assert report.timed_out and not report.reproduced
    assert report.divergence is not None and report.divergence.position == 1
    assert report.divergence.new == "does not stop"
    assert report.error is not None
    assert report.error.startswith("the body did not stop within 1.5 s after the replay "
                                   "stopped it at position 1 (the end of the history; its "
                                   "next call: step 'poll' (occurrence 1))"), report.error
    assert "it caught ReplayStop?" in report.summary and report.summary in str(report)
    assert _replay_threads()  # the body still loops on the daemon thread left behind
    stopapp.RELEASE.set()
    wait_for("the body left behind to end", lambda: not _replay_threads(), timeout_s=30)


@pytest.mark.parametrize("name", ["loop", "loop_async"])
def test_every_checkpoint_after_the_stop_raises_it_again(
        recorded: tuple[App, dict[str, str]], name: str) -> None:
    app, ids = recorded
    report = replay(app, ids[name], version=3, timeout_s=30)
    assert not report.timed_out and report.divergence is None
    assert report.history_end == ("history ends at position 1; the new code would next "
                                  "call step 'poll' (occurrence 1)")
    assert not report.reproduced


def test_bad_arguments_are_refused(recorded: tuple[App, dict[str, str]]) -> None:
    app, ids = recorded
    for version in (0, -1):
        with pytest.raises(InvalidArguments, match="versions are integers >= 1"):
            replay(app, ids["loop"], version=version)
        with pytest.raises(InvalidArguments, match="versions are integers >= 1"):
            replay_sample(app, "loop", version=version)
    for timeout in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArguments, match="timeout_s"):
            replay(app, ids["loop"], timeout_s=timeout)


@pytest.mark.parametrize("kind", [f"{k}{a}" for k in KINDS for a in ("", "_async")
                                  if f"{k}{a}" != "cancelled"])
def test_a_base_exception_the_body_raises_is_reported(
        recorded: tuple[App, dict[str, str]], kind: str) -> None:
    app, ids = recorded
    info = app.get(ids[kind])
    assert info.state is State.FAILED
    report = replay(app, ids[kind])
    assert report.reproduced, str(report)
    assert report.error is not None
    exc = stopapp.KINDS[kind.removesuffix("_async")]
    assert report.error.split(":")[0] == exc.__name__
    assert "reproduces the recorded history (raises" in str(report)


def _cli(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["replay", *args, "--app", "stopapp:app",
                                      "--ledger", url])
    return result.exit_code, result.output


def test_the_command_reports_base_exceptions_and_bodies_that_do_not_stop(
        recorded: tuple[App, dict[str, str]]) -> None:
    app, ids = recorded
    url = str(app.ledger_url)
    for name in ("raises", "raises_async"):
        code, out = _cli(url, "--type", name, "--sample", "10")
        assert code == 0, out
        count = len(KINDS) - (name == "raises")
        assert f"{count} {name} tasks replayed: {count} reproduce, 0 diverge" in out, out
    code, out = _cli(url, ids["keyboard"])
    assert code == 0 and "reproduces the recorded history (raises KeyboardInterrupt" in out

    code, out = _cli(url, ids["loop"], "--version", "2", "--timeout", "1", "--json")
    assert code == 1, out
    data = json.loads(out)
    assert data["timed_out"] is True and data["divergence"]["position"] == 1
    assert data["error"].startswith("the body did not stop within 1 s")
    stopapp.RELEASE.set()
    wait_for("the body left behind to end", lambda: not _replay_threads(), timeout_s=30)


@pytest.mark.parametrize(("args", "message", "not_in"), [
    ([], "give a TASK id or --type TYPE", "not both"),
    (["{loop}", "--type", "loop"], "not both", None),
    (["{loop}", "--version", "0"], "versions are integers >= 1", "version=0"),
    (["{loop}", "--version", "-1"], "versions are integers >= 1", "version=-1"),
    (["--type", "loop", "--version", "-1"], "versions are integers >= 1", "version=-1"),
    (["{loop}", "--timeout", "0"], "--timeout", None),
], ids=["neither", "both", "version-0", "version-negative", "type-version-negative",
        "timeout-0"])
def test_bad_input_messages(recorded: tuple[App, dict[str, str]], args: list[str],
                            message: str, not_in: str | None) -> None:
    app, ids = recorded
    code, out = _cli(str(app.ledger_url), *[a.format(loop=ids["loop"]) for a in args])
    assert code == 2, out
    assert message in out
    if not_in is not None:
        assert not_in not in out
