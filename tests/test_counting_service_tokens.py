"""The counting service's fenced mode: Kleppmann's fencing token checked at the
storage side, over real HTTP on loopback against the service's own process and file.

With ``check_tokens`` the service keeps, per key, the highest ``Fencing-Token`` it has seen
from executions and lookups alike, and refuses (409, recorded in its ``stale_tokens``
table) a request whose token is lower. Everything is counted from the service's own file.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ratchet import NOT_FOUND, FenceError, TokenRejected
from ratchet.testing import CountingClient, CountingService, start_counting_service, wait_for
from ratchet.testing.services import TokenRejection

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fenced(tmp_path: Path) -> Iterator[CountingService]:
    """A fenced service that does not honour keys: only the token protects a key."""
    with start_counting_service(tmp_path / "fenced.db", honour_keys=False,
                                check_tokens=True) as svc:  # fmt: skip
        yield svc


@pytest.fixture
def client(fenced: CountingService) -> Iterator[CountingClient]:
    with fenced.client(timeout_s=5.0) as c:
        yield c


def _rejected(exc: pytest.ExceptionInfo[TokenRejected]) -> tuple[str, int, int | None]:
    err = exc.value
    return err.key, err.token, err.highest


def test_a_lower_token_is_refused_after_a_lookup_saw_a_higher_one(
    fenced: CountingService, client: CountingClient
) -> None:
    """The frozen-sender case at the target: holder 1 checked, froze; holder 2 looked up
    (token 2, not found) and charged; holder 1's late request (token 1) executes nothing."""
    assert client.lookup("k", token=2) is NOT_FOUND
    with pytest.raises(TokenRejected) as late:
        client.execute("k", {"n": 1}, token=1)
    assert isinstance(late.value, FenceError)
    assert _rejected(late) == ("k", 1, 2)
    assert fenced.executions() == {}, "a stale request must execute nothing"
    charged = client.execute("k", {"n": 1}, token=2)
    assert charged["replayed"] is False
    with pytest.raises(TokenRejected):
        client.execute("k", {"n": 1}, token=1)
    records = fenced.records()
    assert records.executions == {"k": 1}
    assert records.execution_tokens == [2]
    assert records.tokens == {"k": 2}
    assert [(r.key, r.token, r.highest, r.op) for r in records.rejections] == [
        ("k", 1, 2, "execute"), ("k", 1, 2, "execute"),
    ]
    assert all(isinstance(r, TokenRejection) and r.at > 0 for r in records.rejections)
    assert fenced.rejections() == records.rejections
    stats = client.stats()
    assert stats["stale_tokens_rejected"] == 2
    assert (stats["executions"], stats["lookups"], stats["lookups_found"]) == (1, 1, 0)


def test_equal_and_higher_tokens_pass_and_keys_are_independent(
    fenced: CountingService, client: CountingClient
) -> None:
    client.execute("a", {}, token=3)
    client.execute("a", {}, token=3)  # the same holder again: accepted
    client.execute("a", {}, token=7)
    client.execute("b", {}, token=1)  # another key has its own highest
    with pytest.raises(TokenRejected) as stale:
        client.execute("a", {}, token=6)
    assert _rejected(stale) == ("a", 6, 7)
    records = fenced.records()
    assert records.executions == {"a": 3, "b": 1}
    assert records.execution_tokens == [3, 3, 7, 1]
    assert records.tokens == {"a": 7, "b": 1}


def test_a_stale_lookup_is_refused_and_not_answered(
    fenced: CountingService, client: CountingClient
) -> None:
    client.execute("k", {"n": 1}, token=5)
    found = client.lookup("k", token=5)
    assert isinstance(found, dict) and found["key"] == "k"
    with pytest.raises(TokenRejected) as stale:
        client.lookup("k", token=4)
    assert _rejected(stale) == ("k", 4, 5)
    assert client.lookup("never", token=9) is NOT_FOUND
    records = fenced.records()
    assert [(r.key, r.op) for r in records.rejections] == [("k", "lookup")]
    assert records.tokens == {"k": 5, "never": 9}
    stats = client.stats()
    assert (stats["lookups"], stats["lookups_found"], stats["stale_tokens_rejected"]) == (
        2, 1, 1,
    )  # fmt: skip


def test_fenced_mode_requires_a_well_formed_token(
    fenced: CountingService, client: CountingClient
) -> None:
    sends: list[Callable[[], object]] = [
        lambda: client.execute("k", {}), lambda: client.lookup("k"),
    ]
    for send in sends:
        with pytest.raises(httpx.HTTPStatusError) as missing:
            send()
        assert missing.value.response.status_code == 400
        assert "Fencing-Token" in missing.value.response.json()["error"]
    with httpx.Client(base_url=fenced.url, timeout=5.0) as raw:
        for bad in ("-1", "1.5", "x", "", "99999999999999999999"):
            r = raw.post("/effects", json={}, headers={"Idempotency-Key": "k",
                                                       "Fencing-Token": bad})  # fmt: skip
            assert r.status_code == 400, (bad, r.text)
            r = raw.get("/effects/k", headers={"Fencing-Token": bad})
            assert r.status_code == 400, (bad, r.text)
    assert fenced.executions() == {}
    assert fenced.records().tokens == {}
    assert client.stats()["lookups"] == 0


def test_fenced_mode_with_honoured_keys_replays_only_for_a_current_token(
    tmp_path: Path,
) -> None:
    with start_counting_service(tmp_path / "both.db", check_tokens=True) as svc, \
            svc.client(timeout_s=5.0) as c:  # fmt: skip
        first = c.execute("k", {"n": 1}, token=1)
        again = c.execute("k", {"n": 1}, token=2)
        assert again["replayed"] is True and again["id"] == first["id"]
        with pytest.raises(TokenRejected):
            c.execute("k", {"n": 1}, token=1)
        stats = c.stats()
        assert (stats["executions"], stats["replays"], stats["stale_tokens_rejected"]) == (
            1, 1, 1,
        )  # fmt: skip
        assert svc.records().tokens == {"k": 2}


def test_without_check_tokens_the_header_is_ignored(tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "plain.db", honour_keys=False) as svc, \
            svc.client(timeout_s=5.0) as c:  # fmt: skip
        c.execute("k", {}, token=5)
        c.execute("k", {}, token=1)
        c.execute("k", {})
        assert c.lookup("k", token=0) != NOT_FOUND
        records = svc.records()
        assert records.executions == {"k": 3}
        assert records.execution_tokens == [None, None, None]
        assert records.tokens == {} and records.rejections == []
        assert c.stats()["stale_tokens_rejected"] == 0
        # Switched on at runtime: from now on the service fences.
        assert c.set_faults(check_tokens=True)["check_tokens"] is True
        c.execute("k", {}, token=4)
        with pytest.raises(TokenRejected):
            c.execute("k", {}, token=3)
        with pytest.raises(httpx.HTTPStatusError) as bad:
            c.set_faults(check_tokens="yes")
        assert bad.value.response.status_code == 400
        assert svc.executions() == {"k": 4}


def test_a_request_checked_when_it_executes_not_when_it_arrived(
    fenced: CountingService, client: CountingClient
) -> None:
    """A slow request (processing delay) whose token became stale while it waited is
    refused: the fence is at the storage write, not at the door."""
    client.set_faults(slow_next=1, slow_s=1.0)
    outcome: list[BaseException | dict[str, object]] = []

    def slow_sender() -> None:
        with CountingClient(fenced.url, timeout_s=10.0) as c:
            try:
                outcome.append(c.execute("k", {}, token=1))
            except BaseException as exc:
                outcome.append(exc)

    t = threading.Thread(target=slow_sender)
    t.start()
    try:
        # The slow request is counted as slow once it is inside its delay.
        wait_for("the slow request to arrive", lambda: client.stats()["injected"]["slow"] == 1)
        assert client.lookup("k", token=2) is NOT_FOUND
    finally:
        t.join(timeout=15)
    assert len(outcome) == 1 and isinstance(outcome[0], TokenRejected), outcome
    assert fenced.executions() == {}


def test_concurrent_holders_execute_in_non_decreasing_token_order(
    fenced: CountingService,
) -> None:
    """Many senders race on one key, each with its own token, each looking up and then
    executing: check and record are atomic, so the executed tokens never go down and
    every refused request was below the highest seen at that moment."""
    tokens = list(range(1, 41))
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(tokens))

    def holder(token: int) -> None:
        with CountingClient(fenced.url, timeout_s=10.0) as c:
            barrier.wait()
            try:
                c.lookup("k", token=token)
                c.execute("k", {}, token=token)
            except TokenRejected:
                pass
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=holder, args=(t,)) for t in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    records = fenced.records()
    executed = [t for t in records.execution_tokens if t is not None]
    assert executed == sorted(executed), executed
    assert records.tokens == {"k": max(tokens)}
    assert all(r.token < r.highest for r in records.rejections)
    # Each holder ended in exactly one of: executed, or refused (at lookup or execute).
    refused_holders = {r.token for r in records.rejections}
    assert set(executed) | refused_holders == set(tokens)
    assert not set(executed) & refused_holders
    assert max(tokens) in executed, "the newest holder is never refused"
