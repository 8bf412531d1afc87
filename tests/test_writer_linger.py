"""The writer's bounded wait for expected final writes (worker/writer.py, "linger"): under
load a transaction waits, at most a fraction of the last one's time, for the final writes
of tasks still running, and stops as soon as all are queued; a lone write, a writer that
was not busy, and a ``sync`` never wait. On both ledgers (``ledger_url``), with the real
ledger; the claim policy is a stand-in that claims nothing and reports how many claimed
tasks are unfinished."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from ratchet import App, State, SubmitRequest, TaskContext, open_ledger
from ratchet.ledger.base import Claim, ClaimKind, ClaimScope, Ledger, TaskWrite, Transition
from ratchet.testing import LedgerProxy, wait_for
from ratchet.worker import writer as writer_module
from ratchet.worker.writer import LedgerWriter

pytestmark = pytest.mark.timeout(60)

NAME = "t.linger"


class Policy:
    """Claims nothing; ``unfinished`` is set by the test (tasks whose final write is due)."""

    def __init__(self, unfinished: int) -> None:
        self.holder = "holder-1"
        self.names: Sequence[ClaimKind] = [NAME]
        self.scope = ClaimScope()
        self.count = unfinished

    def limit(self, freed: int, forced: bool) -> int:
        return 0

    def dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        raise AssertionError("nothing is claimed")

    def release(self, reserved: int, freed: int) -> None:
        pass

    def claim_failed(self, error: BaseException) -> None:
        raise AssertionError(f"no claim runs: {error!r}")

    def unfinished(self) -> int:
        return self.count


class CountingLedger(LedgerProxy):
    """The real ledger, recording the size of every commit (writes per transaction)."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner, after={"commit": self._after})
        self.sizes: list[int] = []

    def _after(self, outcomes: list[Any], writes: Sequence[TaskWrite]) -> None:
        self.sizes.append(len(writes))


@pytest.fixture
def claimed(ledger_url: str) -> Iterator[tuple[CountingLedger, list[Claim]]]:
    setup = App(ledger_url)

    @setup.task(name=NAME)
    def body(ctx: TaskContext, i: int) -> int:
        return i

    setup.submit_many([SubmitRequest(NAME, {"i": i}) for i in range(40)])
    ledger = open_ledger(ledger_url)
    try:
        claims = ledger.claim("holder-1", [NAME], 40)
        assert len(claims) == 40
        yield CountingLedger(ledger), claims
    finally:
        ledger.close()
        setup.close()


def _final(c: Claim) -> TaskWrite:
    return TaskWrite(c.task_id, c.generation, "holder-1", "finish",
                     transition=Transition(State.SUCCEEDED, result_json="1"))


@contextlib.contextmanager
def _running(ledger: Ledger, policy: Policy, busy: Sequence[Claim] = ()
             ) -> Iterator[LedgerWriter]:
    """A started writer, stopped at the end. With ``busy`` (eight claims) its last
    transaction carried a full batch of their final writes (a busy worker)."""
    writer = LedgerWriter(ledger)
    writer.set_claim_policy(policy)
    for c in busy:
        writer.submit(_final(c), lambda o, e: None)
    writer.start()
    try:
        if busy:
            writer.sync()
        yield writer
    finally:
        writer.stop()
        writer.join(20)


def test_a_busy_writer_waits_for_the_finals_due_and_no_longer(
    claimed: tuple[CountingLedger, list[Claim]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, claims = claimed
    # A generous bound: the wait must end because every expected write came, not by it.
    monkeypatch.setattr(writer_module, "LINGER_MAX_S", 30.0)
    monkeypatch.setattr(writer_module, "LINGER_FRACTION", 1e6)
    with _running(ledger, Policy(unfinished=3), claims[:8]) as writer:
        ledger.sizes.clear()
        committed: list[str] = []
        t0 = time.monotonic()
        writer.submit(_final(claims[8]), lambda o, e: committed.append("first"))

        def later() -> None:
            time.sleep(0.2)  # the two other tasks report while the writer waits
            for c in claims[9:11]:
                writer.submit(_final(c), lambda o, e: committed.append("later"))

        threading.Thread(target=later).start()
        wait_for("the three final writes committed",
                 lambda: len(committed) == 3 or None, timeout_s=20)
        elapsed = time.monotonic() - t0
        assert ledger.sizes == [3]  # one transaction for the three
        assert elapsed < 15  # ended when all three were queued, not at the bound
        assert all(ledger.get(c.task_id).state is State.SUCCEEDED for c in claims[8:11])


def test_the_wait_is_bounded_when_the_finals_do_not_come(
    claimed: tuple[CountingLedger, list[Claim]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, claims = claimed
    monkeypatch.setattr(writer_module, "LINGER_MAX_S", 0.3)
    monkeypatch.setattr(writer_module, "LINGER_FRACTION", 1e6)
    with _running(ledger, Policy(unfinished=30), claims[:8]) as writer:
        ledger.sizes.clear()
        done = threading.Event()
        t0 = time.monotonic()
        writer.submit(_final(claims[8]), lambda o, e: done.set())
        assert done.wait(20)
        elapsed = time.monotonic() - t0
        assert elapsed >= 0.25  # it waited for the 29 others...
        assert ledger.sizes == [1]  # ...up to its bound, then committed what it had


def test_an_idle_writer_and_a_sync_never_wait(
    claimed: tuple[CountingLedger, list[Claim]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, claims = claimed
    monkeypatch.setattr(writer_module, "LINGER_MAX_S", 30.0)
    monkeypatch.setattr(writer_module, "LINGER_FRACTION", 1e6)
    # Not busy: its last transaction carried one write (below LINGER_MIN_FINALS).
    with _running(ledger, Policy(unfinished=30)) as writer:
        t0 = time.monotonic()
        writer.commit(_final(claims[0]))
        writer.commit(_final(claims[1]))
        assert time.monotonic() - t0 < 10  # never the 30 s bound: nothing was waited for
    with _running(ledger, Policy(unfinished=30), claims[2:10]) as busy:
        done = threading.Event()
        busy.submit(_final(claims[12]), lambda o, e: done.set())
        busy.sync()  # a sync ends the wait at once (never the 30 s bound)
        assert done.wait(20)
