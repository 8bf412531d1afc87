"""Circuit breakers toward a downstream (DESIGN §7, overload): the state machine with a
fake clock, and a real worker against the counting service answering a burst of 503s, on
both ledgers. While the breaker is open no call is sent and tasks wait without spending
attempts; half-open lets one probe through at a time; the work still completes, each
effect executed once at the service.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ratchet import App, CircuitBreaker, CircuitOpen, Control, RetryPolicy, State, TaskContext
from ratchet.breaker import BreakerState, DownstreamBreaker, is_overload
from ratchet.errors import ConfigError, OverloadError, TransientError
from ratchet.testing import CountingService, start_counting_service, wait_for
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(90)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _503() -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://svc.example/effects")
    return httpx.HTTPStatusError("503", request=request,
                                 response=httpx.Response(503, request=request))


def test_open_half_open_closed() -> None:
    clock = Clock()
    b = DownstreamBreaker("svc", CircuitBreaker(failure_threshold=3, open_s=2.0,
                                                half_open_probes=2), clock)
    for _ in range(2):
        b.release(b.acquire(), OverloadError())
    b.release(b.acquire(), None)  # a success resets the count
    for _ in range(2):
        b.release(b.acquire(), _503())
    assert b.state is BreakerState.CLOSED
    b.release(b.acquire(), TransientError("not about load"))  # neither opens nor resets
    assert b.state is BreakerState.CLOSED
    b.release(b.acquire(), _503())
    assert b.state is BreakerState.OPEN and b.opened == 1
    with pytest.raises(CircuitOpen) as stopped:
        b.acquire()
    assert stopped.value.retry_after_s == pytest.approx(2.0)
    clock.t += 2.0
    assert b.state is BreakerState.HALF_OPEN
    first, second = b.acquire(), b.acquire()
    assert first and second
    with pytest.raises(CircuitOpen):
        b.acquire()  # both probes in flight
    b.release(first, None)
    assert b.state is BreakerState.HALF_OPEN
    b.release(second, None)
    assert b.state is BreakerState.CLOSED
    # A failed probe opens it again.
    for _ in range(3):
        b.release(b.acquire(), OverloadError())
    clock.t += 2.0
    probe = b.acquire()
    b.release(probe, OverloadError())
    assert b.state is BreakerState.OPEN and b.opened == 3
    clock.t += 2.0
    probe = b.acquire()
    b.cancel(probe)  # not sent after all: the slot is free again, nothing decided
    assert b.state is BreakerState.HALF_OPEN and b.acquire()


def test_what_counts_as_overload() -> None:
    assert is_overload(OverloadError()) and is_overload(_503())
    assert is_overload(httpx.PoolTimeout("pool exhausted"))
    assert not is_overload(TransientError("x")) and not is_overload(ValueError())


@pytest.mark.parametrize("bad", [{"failure_threshold": 0}, {"failure_threshold": 1.5},
                                 {"open_s": 0}, {"open_s": float("inf")},
                                 {"half_open_probes": True}])
def test_settings_are_validated(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="CircuitBreaker"):
        CircuitBreaker(**bad)  # type: ignore[arg-type]


def test_downstream_needs_a_setting(tmp_path: Path) -> None:
    app = App(f"sqlite:///{tmp_path}/l.db")
    with pytest.raises(ConfigError, match="budget, a breaker"):
        app.downstream("svc")
    with pytest.raises(ConfigError, match="CircuitBreaker"):
        app.downstream("svc", breaker=3)  # type: ignore[arg-type]


@pytest.fixture(params=["fail_next_503", "burst_503"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CountingService]:
    """The counting service answering 503s: one burst of the next 6 requests, or random
    bursts (``burst_503``: each request starts a burst of 4 with probability 0.2)."""
    if request.param == "burst_503":
        svc = start_counting_service(tmp_path / "service.db", burst_503=0.2, burst_len=4,
                                     seed=7)
    else:
        svc = start_counting_service(tmp_path / "service.db")
        with svc.client() as c:
            c.set_faults(fail_next_503=6)
    with svc:
        yield svc


def test_503_bursts_open_the_breaker_and_tasks_wait_without_spending_attempts(
    ledger_url: str, service: CountingService
) -> None:
    app = App(ledger_url)
    app.downstream("svc", breaker=CircuitBreaker(failure_threshold=2, open_s=0.5,
                                                 half_open_probes=1))
    client = service.client(timeout_s=5.0)
    breaker = app.breakers["svc"]
    lock = threading.Lock()
    probes_max = [0]

    def send(key: str) -> object:
        with lock:
            probes_max[0] = max(probes_max[0], breaker.probing)
        return client.execute(key, {})

    @app.task(name="cb.call", retry=RetryPolicy(max_attempts=30, base_delay_s=0.01,
                                                 overload_min_delay_s=0.05, jitter=0.0,
                                                 quarantine_after=None))
    def call(ctx: TaskContext) -> object:
        return ctx.effect("call", send, key=f"c:{ctx.task_id}", lookup=client.lookup,
                          idempotent=True, downstream="svc")

    try:
        handles = [app.submit("cb.call", {}) for _ in range(12)]
        with running_worker(app, concurrency=4):
            wait_for("every call", lambda: all(h.get().state is State.SUCCEEDED
                                               for h in handles), 60, 0.1)
        executions = service.executions()
        assert sorted(executions) == sorted(f"c:{h.task_id}" for h in handles)
        assert set(executions.values()) == {1}
        answered_503 = client.stats()["injected"]["503"]
        assert answered_503 >= 2  # at least the failure threshold
        assert app.breakers["svc"].opened >= 1
        assert probes_max[0] <= 1  # half-open: one probe in flight at a time
        with Control(ledger_url) as control:
            events = [e for h in handles for e in control.history(h.task_id).events
                      if e.kind == "transition"]
        overloads = [e for e in events if e.to_state == "RETRY_WAIT"
                     and e.detail.get("error_class") == "overload"]
        waits = [e for e in events if e.to_state == "PENDING"
                 and e.detail.get("error_class") == "circuit_open"]
        assert len(overloads) == answered_503  # one spent attempt per 503, none per wait
        assert waits and all("circuit open toward svc" in e.detail["reason"] for e in waits)
        # Attempts spent: the first run plus one per 503 answered; waits gave theirs back.
        assert sum(h.get().attempt for h in handles) == 12 + answered_503
    finally:
        client.close()
        app.close()
