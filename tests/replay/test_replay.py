"""``ratchet.testing.replay`` on histories a real worker recorded, on both ledgers: the
same code reproduces its history and calls nothing (the counting service, in its own
process, sees no new request); a changed body diverges at the position where it changed,
naming the recorded call and the new one; a history that ends where a task failed tells
what the fixed code would call next; bad input is refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import replayapp

from ratchet import App, Control, State, TaskNotFound, UnknownTask
from ratchet.control import FORK_AT_END
from ratchet.testing import (
    CountingService,
    ReplayReport,
    replay,
    replay_sample,
    running_worker,
    start_counting_service,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)

ENDED = (State.SUCCEEDED, State.FAILED)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[CountingService]:
    with start_counting_service(tmp_path / "service.db") as svc:
        replayapp.SERVICE_URL = svc.url
        yield svc


@pytest.fixture
def recorded(ledger_url: str, service: CountingService) -> Iterator[tuple[App, dict[str, str]]]:
    """An App on the test's ledger and the ids of the tasks a real worker ran: ``order``
    (succeeded, 3 checkpoints), ``pipeline`` (failed in its third step), ``audit``
    (failed in its body after one step), all with version 1."""
    app = replayapp.make_app(ledger_url)
    ids = {
        "order": app.submit("order", {"order_id": "o-17"}, version=1).task_id,
        "pipeline": app.submit("pipeline", {"n": 4}, version=1).task_id,
        "audit": app.submit("audit", {"n": 5}, version=1).task_id,
    }
    with running_worker(app, concurrency=2):
        for task_id in ids.values():
            wait_for(f"task {task_id} to end",
                     lambda t=task_id: app.get(t).state in ENDED, timeout_s=60)
    yield app, ids
    app.close()


def test_the_same_code_reproduces_its_history_and_calls_nothing(
        recorded: tuple[App, dict[str, str]], service: CountingService) -> None:
    app, ids = recorded
    assert app.get(ids["order"]).state is State.SUCCEEDED
    before = service.executions()
    assert before == {"charge:o-17": 1, "two:4": 1}

    report = replay(app, ids["order"])
    assert isinstance(report, ReplayReport)
    assert report.reproduced, str(report)
    assert (report.positions, report.recorded_positions) == (3, 3)
    assert report.divergence is None and report.history_end is None
    assert report.version == report.recorded_version == 1
    assert report.result == app.get(ids["order"]).result
    assert "reproduces the recorded history" in str(report)
    # version 2 is the same code: it reproduces version 1's history too
    assert replay(app, ids["order"], version=2).reproduced

    audit = replay(app, ids["audit"])
    assert audit.reproduced, str(audit)
    assert audit.error is not None and audit.error.startswith("ValueError: audit found 5")

    assert service.executions() == before
    with service.client() as client:
        assert client.stats()["lookups"] == 0


@pytest.mark.parametrize(("version", "position", "was", "now"), [
    (3, 0, "step 'quote' (occurrence 1)", "calls step 'price' (occurrence 1)"),
    (4, 1, "effect 'charge' (occurrence 1) key 'charge:o-17'",
     "calls effect 'charge' (occurrence 1) key 'pay:o-17'"),
    (5, 1, "effect 'charge' (occurrence 1) key 'charge:o-17'",
     "calls step 'receipt' (occurrence 1)"),
    (6, 3, 'the result {"amount":40', 'returns {"amount":40'),
], ids=["step-renamed", "effect-key-changed", "reordered", "other-result"])
def test_a_changed_body_diverges_where_it_changed(
        recorded: tuple[App, dict[str, str]], service: CountingService, version: int,
        position: int, was: str, now: str) -> None:
    app, ids = recorded
    before = service.executions()
    report = replay(app, ids["order"], version=version)
    assert not report.reproduced
    assert report.divergence is not None, str(report)
    assert report.divergence.position == position
    assert report.divergence.recorded.startswith(was)
    assert report.divergence.new.startswith(now)
    assert report.positions == position
    assert f"diverges at position {position}" in str(report)
    assert service.executions() == before


def test_a_failed_history_tells_what_the_fixed_code_would_call_next(
        recorded: tuple[App, dict[str, str]], service: CountingService) -> None:
    app, ids = recorded
    info = app.get(ids["pipeline"])
    assert info.state is State.FAILED and "step three" in (info.last_error or "")
    before = service.executions()
    for version in (1, 2):  # the failing code and the fixed code alike
        report = replay(app, ids["pipeline"], version=version)
        assert report.divergence is None
        assert not report.reproduced
        assert (report.positions, report.recorded_positions) == (2, 2)
        assert report.history_end == ("history ends at position 2; the new code would next "
                                      "call step 'three' (occurrence 1)")
    # the fixed audit returns where the recorded run raised: new behaviour, no divergence
    audit = replay(app, ids["audit"], version=2)
    assert audit.divergence is None and audit.history_end is None
    assert not audit.reproduced and audit.result == {"seen": 5}
    assert "the recorded run has not succeeded (FAILED)" in str(audit)
    assert service.executions() == before


def test_a_fork_with_the_fixed_version_replays_and_reproduces(
        recorded: tuple[App, dict[str, str]], service: CountingService) -> None:
    app, ids = recorded
    with Control(app=app) as control:
        fork_id = control.fork(ids["pipeline"], FORK_AT_END, version=2,
                               reason="step three fixed")
    with running_worker(app, concurrency=1):
        wait_for("the fork to succeed", lambda: app.get(fork_id).state is State.SUCCEEDED,
                 timeout_s=60)
    before = service.executions()
    assert before == {"charge:o-17": 1, "two:4": 1}  # the fork did not call 'two' again
    report = replay(app, fork_id)
    assert report.reproduced, str(report)
    assert (report.version, report.positions, report.recorded_positions) == (2, 3, 3)
    assert service.executions() == before


def test_a_sample_of_a_type_is_replayed_newest_first(
        recorded: tuple[App, dict[str, str]]) -> None:
    app, ids = recorded
    more = app.submit("order", {"order_id": "o-2"}, version=1).task_id
    queued = app.submit("order", {"order_id": "o-3"}, version=1, delay_s=3600).task_id
    with running_worker(app, concurrency=1):
        wait_for("o-2 to succeed", lambda: app.get(more).state is State.SUCCEEDED,
                 timeout_s=60)
    reports = replay_sample(app, "order", version=2, sample=10)
    assert [r.task_id for r in reports] == [more, ids["order"]]  # never-claimed o-3 left out
    assert queued not in [r.task_id for r in reports]
    assert all(r.reproduced for r in reports)
    assert [r.task_id for r in replay_sample(app, "order", version=2, sample=1)] == [more]
    diverged = replay_sample(app, "order", version=3)
    assert [r.divergence is not None for r in diverged] == [True, True]
    mixed = replay_sample(app, "order", version=7)
    assert [(r.task_id, r.reproduced, r.divergence is not None) for r in mixed] == [
        (more, False, True), (ids["order"], True, False)]


def test_bad_input_is_refused(recorded: tuple[App, dict[str, str]]) -> None:
    app, ids = recorded
    with pytest.raises(TaskNotFound):
        replay(app, "00000000-0000-0000-0000-000000000000")
    with pytest.raises(UnknownTask, match="version 9"):
        replay(app, ids["order"], version=9)
    with pytest.raises(UnknownTask):
        replay_sample(app, "nope", version=1)
    other = App(app.ledger_url)  # an app that does not define the task at all
    try:
        with pytest.raises(UnknownTask, match="order"):
            replay(other, ids["order"])
    finally:
        other.close()
