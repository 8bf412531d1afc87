"""What the Prometheus worker middleware costs: one worker drains N ready tasks with and
without :class:`ratchet.observe.metrics.WorkerMetrics`, interleaved, and the ratio of the
median drain rates is printed. A measurement tool: it asserts nothing.

    .venv/bin/python bench/metrics_overhead.py                     # 20,000 tasks, 3 rounds
    .venv/bin/python bench/metrics_overhead.py --tasks 5000 --repeat 5 --body effect

Each drain runs in this process on a fresh SQLite file (``--durability buffered`` by
default, so the worker's CPU, where the middleware's cost lands, dominates rather than
fsync). Timing: ``Worker.run(max_tasks=N)`` from call to return.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ratchet import App, SubmitRequest, TaskContext, Worker
from ratchet.observe.metrics import WorkerMetrics


def drain(directory: Path, n: int, body: str, concurrency: int, durability: str,
          with_metrics: bool, round_no: int) -> float:
    """Drain ``n`` tasks once; return tasks per second."""
    path = directory / f"r{round_no}-{'m' if with_metrics else 'p'}.db"
    app = App(f"sqlite:///{path}", durability=durability)

    @app.task(name="bench.noop")
    def noop(ctx: TaskContext, i: int) -> Any:
        if body == "step":
            return ctx.step("s", lambda: i)
        if body == "effect":
            return ctx.effect("e", key=f"e-{i}", call=lambda key: i)
        return i

    for lo in range(0, n, 1000):
        app.submit_many([SubmitRequest("bench.noop", {"i": i})
                         for i in range(lo, min(n, lo + 1000))])
    middleware = [WorkerMetrics()] if with_metrics else []
    worker = Worker(app, concurrency=concurrency, middleware=middleware, poll_interval_s=0.01)
    t0 = time.perf_counter()
    worker.run(max_tasks=n)
    took = time.perf_counter() - t0
    app.close()
    assert worker.stats.succeeded == n, worker.stats
    return n / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--body", choices=["zero", "step", "effect"], default="step")
    parser.add_argument("--durability", default="buffered")
    args = parser.parse_args()
    plain: list[float] = []
    metered: list[float] = []
    with tempfile.TemporaryDirectory(prefix="ratchet-metrics-bench-") as tmp:
        for r in range(args.repeat):
            for with_metrics in ((False, True) if r % 2 == 0 else (True, False)):
                rate = drain(Path(tmp), args.tasks, args.body, args.concurrency,
                             args.durability, with_metrics, r)
                (metered if with_metrics else plain).append(rate)
                print(f"round {r + 1}: {'with' if with_metrics else 'without'} metrics "
                      f"{rate:,.0f} tasks/s", flush=True)
    p, m = statistics.median(plain), statistics.median(metered)
    print(f"\n{args.tasks:,} tasks, body={args.body}, C={args.concurrency}, "
          f"durability={args.durability}, {args.repeat} rounds (median [min-max])")
    print(f"  without metrics: {p:,.0f} tasks/s [{min(plain):,.0f}-{max(plain):,.0f}]")
    print(f"  with metrics:    {m:,.0f} tasks/s [{min(metered):,.0f}-{max(metered):,.0f}]")
    print(f"  ratio with/without: {m / p:.3f}")


if __name__ == "__main__":
    main()
