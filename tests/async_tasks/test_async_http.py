"""``async def`` bodies against a real HTTP service over loopback (the counting service,
its own process and SQLite file), counted at the external side, on both ledgers:

* an effect whose call and lookup are coroutines (``httpx.AsyncClient``), its reply lost
  once: the lookup settles it, one execution per key;
* 250 tasks each awaiting a slow (~0.4 s) request run side by side on the worker's one
  event loop, with few threads in this process while they run."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ratchet import App, AsyncTaskContext, State
from ratchet.testing import fast_retry_policy, wait_for
from ratchet.testing.services import AsyncCountingClient, start_counting_service
from ratchet.testing.worker import running_worker

pytestmark = pytest.mark.timeout(120)

FAST = fast_retry_policy()


def test_async_call_and_lookup_count_once_at_the_service(app: App, tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "svc.db", honour_keys=False) as service:
        with service.client() as admin:
            admin.set_faults(reply_lost_next=1)  # the first reply never arrives

        @app.task(name="t.pay", retry=FAST)
        async def pay(ctx: AsyncTaskContext, order: int) -> Any:
            client = AsyncCountingClient(service.url, timeout_s=5.0)
            try:
                body = {"order": order}
                receipt = await ctx.effect(
                    "charge", lambda k: client.execute(k, body), key=f"charge:{order}",
                    lookup=client.lookup, params=body)
            finally:
                await client.aclose()
            return receipt["body"]

        handles = [app.submit("t.pay", {"order": i}) for i in range(8)]
        with running_worker(app, async_concurrency=8, overload_floor_s=0.05):
            infos = [h.wait(timeout_s=60) for h in handles]
        for i, info in enumerate(infos):
            assert info.state is State.SUCCEEDED, info.last_error
            assert info.result == {"order": i}
        assert service.executions() == {f"charge:{i}": 1 for i in range(8)}
        settled = [e for h in handles for e in app.ledger.timeline(h.task_id).effects
                   if e.via_lookup]
        assert len(settled) == 1  # the lost reply was found by the lookup, not sent again


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_many_slow_requests_share_one_loop_and_few_threads(app: App, tmp_path: Path) -> None:
    tasks, latency_s = 250, 0.4
    with start_counting_service(tmp_path / "svc.db", latency_s=latency_s) as service:
        in_flight = 0
        peak = 0

        async def call(key: str) -> Any:
            nonlocal in_flight, peak
            # Generous timeouts: on a loaded machine the service accepts 250 connections
            # slowly, and a connect timeout would spend the task's attempts.
            client = AsyncCountingClient(service.url, timeout_s=60.0, connect_timeout_s=60.0)
            in_flight += 1  # on the loop's own thread only: no lock needed
            peak = max(peak, in_flight)
            try:
                return await client.execute(key, {"k": key})
            finally:
                in_flight -= 1
                await client.aclose()

        @app.task(name="t.slow_io", retry=FAST)
        async def slow_io(ctx: AsyncTaskContext, n: int) -> int:
            await ctx.effect("call", call, key=f"io:{n}", idempotent=True)
            return n

        handles = [app.submit("t.slow_io", {"n": i}) for i in range(tasks)]
        before = threading.active_count()
        threads_seen = before
        with running_worker(app, concurrency=2, async_concurrency=tasks + 50):

            def finished() -> bool:
                nonlocal threads_seen
                threads_seen = max(threads_seen, threading.active_count())
                infos = app.ledger.get_many([h.task_id for h in handles])
                return all(i.state is State.SUCCEEDED for i in infos)

            wait_for(f"{tasks} tasks to succeed", finished, timeout_s=240, interval_s=0.05)
        assert service.executions() == {f"io:{i}": 1 for i in range(tasks)}
        # Side by side on one loop (how fast is a benchmark's business: bench/async_io.py).
        assert peak >= 100, f"at most {peak} requests were awaited at once"
        # The worker's own threads (writer, heartbeat, loop, its small executor, two task
        # threads, ...), not one per awaiting task.
        assert threads_seen - before < 40, f"{threads_seen - before} threads more"
