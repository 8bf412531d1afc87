"""A write the database refuses is that write's error, isolated from its batch,
and step / effect identifiers are checked where they enter.

Every value the worker writes is validated before it reaches the ledger, so no real write
is refused by either database any more; the refusal itself is played by
:class:`RefusingLedger`, a real ledger that raises ``WriteRejected`` for the writes of
chosen tasks. Everything else really commits, on both ledgers.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from ratchet import App, State, TaskContext, open_ledger
from ratchet.errors import LedgerUnavailable, WriteRejected
from ratchet.ledger.base import CommitOutcome, Ledger, TaskWrite, Transition
from ratchet.testing import LedgerProxy
from ratchet.testing.worker import running_worker
from ratchet.validation import MAX_KEY_BYTES, MAX_NAME_BYTES
from ratchet.worker.writer import LedgerWriter

pytestmark = pytest.mark.timeout(60)


class RefusingLedger(LedgerProxy):
    """The real ledger, except that the "database" refuses every write of the tasks in
    ``refused`` that carries steps (as PostgreSQL refuses an index entry over its row
    limit). Records the task ids of every batch it was asked to commit."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner, fail={"commit": self._check, "commit_and_claim": self._check})
        self.refused: set[str] = set()
        self.batches: list[list[str]] = []
        self._guard = threading.Lock()

    def _check(self, writes: Sequence[TaskWrite], *rest: Any) -> BaseException | None:
        with self._guard:
            self.batches.append([w.task_id for w in writes])
        for w in writes:
            if w.task_id in self.refused and w.steps:
                return WriteRejected(f"index row size exceeds maximum (task {w.task_id}, test)")
        return None


def test_group_commit_applies_the_other_writes_of_a_refused_batch(ledger_url: str) -> None:
    setup = App(ledger_url)
    ledger = open_ledger(ledger_url)
    try:

        @setup.task(name="t.w")
        def w(ctx: TaskContext, i: int) -> int:
            return i

        for i in range(3):
            setup.submit("t.w", {"i": i})
        claims = ledger.claim("holder-1", ["t.w"], 3)
        assert len(claims) == 3
        refusing = RefusingLedger(ledger)
        refusing.refused = {claims[1].task_id}
        writer = LedgerWriter(refusing)  # type: ignore[arg-type]
        results: dict[str, tuple[CommitOutcome | None, BaseException | None]] = {}

        def callback(task_id: str) -> Any:
            def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
                results[task_id] = (outcome, error)
            return done

        # Queued before the thread starts: the writer takes all three as one batch.
        for c in claims:
            writer.submit(
                TaskWrite(c.task_id, c.generation, "holder-1", "finish", steps=[("s", "1")],
                          transition=Transition(State.SUCCEEDED, result_json="1")),
                callback(c.task_id),
            )
        writer.start()
        writer.sync()
        writer.stop()
        writer.join(10)
        ids = [c.task_id for c in claims]
        assert refusing.batches[0] == ids, "the three writes must have been one group commit"
        assert sorted(map(tuple, refusing.batches[1:])) == sorted((i,) for i in ids)
        refused = claims[1].task_id
        outcome, error = results.pop(refused)
        assert outcome is None and isinstance(error, WriteRejected)
        assert all(o is not None and o.ok and e is None for o, e in results.values())
        for task_id in results:
            info = ledger.get(task_id)
            assert info.state is State.SUCCEEDED and info.result == 1
            assert [s.name for s in ledger.timeline(task_id).steps] == ["s"]
        assert ledger.get(refused).state is State.RUNNING  # nothing of it was applied
        assert ledger.timeline(refused).steps == []
    finally:
        ledger.close()
        setup.close()


@pytest.mark.parametrize("durable", [False, True], ids=["pipelined-step", "durable-step"])
def test_refused_write_fails_its_task_and_the_others_succeed(
    ledger_url: str, durable: bool
) -> None:
    refusing = RefusingLedger(open_ledger(ledger_url))
    app = App(refusing)  # type: ignore[arg-type]
    try:

        @app.task(name="t.w")
        def w(ctx: TaskContext, i: int) -> int:
            # Several steps: a pipelined step's write can be refused in the background (then
            # raised at the next step) or with the final write; the outcome is the same.
            ctx.step("first", lambda: i, durable=durable)
            ctx.step("second", lambda: i, durable=durable)
            return int(ctx.step("square", lambda: i * i, durable=durable))

        handles = [app.submit("t.w", {"i": i}) for i in range(8)]
        refused = handles[3].task_id
        refusing.refused = {refused}
        with running_worker(app, concurrency=4) as worker:
            infos = {h.task_id: app.wait(h.task_id, timeout_s=20) for h in handles}
        bad = infos.pop(refused)
        assert bad.state is State.FAILED and bad.attempt == 1
        assert bad.error_class == "write_rejected"
        assert "index row size exceeds maximum" in (bad.last_error or "")
        assert refusing.timeline(refused).steps == []
        assert [i.state for i in infos.values()] == [State.SUCCEEDED] * 7
        assert sorted(i.result for i in infos.values()) == sorted(
            i * i for i in range(8) if i != 3
        )
        assert worker.stats.failed == 1 and worker.stats.succeeded == 7
    finally:
        app.close()


BAD_NAMES = [
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("bad\ud800", "not valid Unicode", id="lone-surrogate"),
    pytest.param("nul\x00name", "NUL", id="nul"),
    pytest.param("x" * (MAX_NAME_BYTES + 1), f"over the limit of {MAX_NAME_BYTES}", id="long"),
]


@pytest.mark.parametrize(("name", "message"), BAD_NAMES)
def test_bad_step_name_is_a_permanent_failure(app: App, name: str, message: str) -> None:
    @app.task(name="t.badstep")
    def badstep(ctx: TaskContext) -> None:
        ctx.step(name, lambda: 1)

    @app.task(name="t.after")
    def after(ctx: TaskContext) -> str:
        return "ran"

    handle = app.submit("t.badstep")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
        nxt = app.wait(app.submit("t.after").task_id, timeout_s=20)
    assert info.state is State.FAILED and info.attempt == 1
    assert info.error_class == "permanent"
    assert "InvalidArguments" in (info.last_error or "")
    assert "step name" in (info.last_error or "") and message in (info.last_error or "")
    assert app.ledger.timeline(handle.task_id).steps == []
    assert nxt.state is State.SUCCEEDED


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        pytest.param("charge", "k\x00", "effect key contains a NUL", id="nul-key"),
        pytest.param("charge", "k" * (MAX_KEY_BYTES + 1), "effect key is", id="long-key"),
        pytest.param("c\ud800", "k", "effect name is not valid Unicode", id="surrogate-name"),
    ],
)
def test_bad_effect_name_or_key_is_refused_before_any_call(
    app: App, name: str, key: str, message: str
) -> None:
    calls: list[str] = []

    @app.task(name="t.badeffect")
    def badeffect(ctx: TaskContext) -> None:
        ctx.effect(name, lambda k: calls.append(k), key=key)

    handle = app.submit("t.badeffect")
    with running_worker(app, concurrency=1):
        info = app.wait(handle.task_id, timeout_s=20)
    assert calls == []
    assert info.state is State.FAILED and info.attempt == 1
    assert info.error_class == "permanent"
    assert message in (info.last_error or "")
    assert app.ledger.timeline(handle.task_id).effects == []


class UnreachableForFinalWrites(LedgerProxy):
    """The real ledger, except that the first ``failures`` commits carrying a transition
    fail as if the server were unreachable (nothing is applied)."""

    def __init__(self, inner: Ledger, failures: int) -> None:
        super().__init__(inner, fail={"commit": self._check, "commit_and_claim": self._check})
        self.left = failures
        self.refused_at: list[float] = []
        self._guard = threading.Lock()

    def _check(self, writes: Sequence[TaskWrite], *rest: Any) -> BaseException | None:
        if any(w.transition is not None for w in writes):
            with self._guard:
                if self.left > 0:
                    self.left -= 1
                    self.refused_at.append(time.monotonic())
                    return LedgerUnavailable("server closed the connection (test)")
        return None


def test_final_write_is_sent_again_while_the_ledger_is_unreachable(ledger_url: str) -> None:
    flaky = UnreachableForFinalWrites(open_ledger(ledger_url), failures=3)
    app = App(flaky)  # type: ignore[arg-type]
    try:

        @app.task(name="t.final", lease_s=10.0)
        def final(ctx: TaskContext) -> int:
            return int(ctx.step("one", lambda: 1))

        handle = app.submit("t.final")
        with running_worker(app, concurrency=1) as worker:
            info = app.wait(handle.task_id, timeout_s=20)
        assert info.state is State.SUCCEEDED and info.result == 1
        assert info.attempt == 1 and info.generation == 1  # same claim: no takeover
        assert flaky.left == 0 and len(flaky.refused_at) == 3
        gaps = [b - a for a, b in itertools.pairwise(flaky.refused_at)]
        assert all(g >= 0.05 for g in gaps), f"re-sends must back off, got gaps {gaps}"
        assert worker.stats.succeeded == 1
        assert [s.name for s in app.ledger.timeline(handle.task_id).steps] == ["one"]
    finally:
        app.close()
