"""I/O-bound tasks: an async worker against a thread worker (bench/README.md, "async_io").

Each task awaits one HTTP call of ``--latency-ms`` (default 50 ms) to a local service (an
asyncio HTTP/1.1 server, its own process, real HTTP over loopback) inside a step, then
returns. The same N tasks are drained by ONE worker process twice:

* ``thread``: a plain ``def`` task calling ``httpx.Client`` on ``--concurrency`` threads
  (default 32);
* ``async``: an ``async def`` task awaiting ``httpx.AsyncClient`` on the worker's event
  loop, ``--async-concurrency`` at once (default 1000).

Printed per run: tasks/s (N divided by the time from the worker's first claim to its
last task finished, measured inside the worker process), the worker process's peak RSS
(``ru_maxrss``) and its peak thread count. It asserts nothing: a measurement tool, not a
test; CI does not run it.

Usage::

    .venv/bin/python bench/async_io.py                       # N = 5,000 each, SQLite
    .venv/bin/python bench/async_io.py --tasks 2000 --ledger postgresql://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve()
SYNC_TASK = "bench.io_sync"
ASYNC_TASK = "bench.io_async"
ASYNC_POOLS = 256
"""``httpx.AsyncClient`` pools the async task spreads its calls over (see build_app)."""


# ---------------------------------------------------------------------- the service


def serve(port: int, latency_s: float) -> None:
    """The local service: every request (HTTP/1.1, keep-alive) is answered
    ``{"ok": true}`` after ``latency_s`` seconds. A bare asyncio server: uvicorn with
    Starlette did the same at a higher CPU cost, on cores the workers share."""
    body = b'{"ok":true}'
    reply = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
             + str(len(body)).encode() + b"\r\n\r\n" + body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")  # GET requests: no body
                await asyncio.sleep(latency_s)
                writer.write(reply)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---------------------------------------------------------------------- the worker side


def build_app(ledger: str, url: str) -> Any:
    """The bench App: the sync and the async task, each one HTTP call inside a step."""
    import ratchet

    app = ratchet.App(ledger)
    # "sleep:S": no HTTP, each call sleeps S seconds (what the worker costs without a client).
    pause = float(url.removeprefix("sleep:")) if url.startswith("sleep:") else None
    sync_client = httpx.Client(base_url=url, timeout=30.0,
                               limits=httpx.Limits(max_connections=1024))
    # httpcore's pool looks at each of its connections for every request it assigns, so
    # one pool of 1,000 connections spends its time there (quadratic); 32 pools of at most
    # 64 connections each keep that small (the thread worker needs one pool of 32).
    # Made here, before the worker runs, with one TLS context for all (each would load the
    # CA bundle, tens of ms of the loop's time); used on the worker's event loop only.
    tls = ssl.create_default_context()
    clients = [httpx.AsyncClient(base_url=url, timeout=30.0, verify=tls,
                                 limits=httpx.Limits(max_connections=8,
                                                     max_keepalive_connections=8))
               for _ in range(ASYNC_POOLS)]

    @app.task(name=SYNC_TASK)
    def io_sync(ctx: ratchet.TaskContext, n: int) -> int:
        def call() -> int:
            if pause is not None:
                time.sleep(pause)
            else:
                sync_client.get("/work", params={"n": n}).raise_for_status()
            return n
        return int(ctx.step("call", call))

    @app.task(name=ASYNC_TASK)
    async def io_async(ctx: ratchet.AsyncTaskContext, n: int) -> int:
        async def call() -> int:
            client = clients[n % ASYNC_POOLS]
            if pause is not None:
                await asyncio.sleep(pause)
            else:
                (await client.get("/work", params={"n": n})).raise_for_status()
            return n
        return int(await ctx.step("call", call))

    return app


def drain(ledger: str, url: str, mode: str, tasks: int, concurrency: int,
          async_concurrency: int) -> None:
    """Run one worker process until it drained ``tasks``; print its figures as JSON."""
    import ratchet

    app = build_app(ledger, url)
    peak_threads = threading.active_count()
    first_claim: list[float] = []
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_threads
        while not done.wait(0.05):
            peak_threads = max(peak_threads, threading.active_count())

    class Timed(ratchet.Worker):
        def on_claimed(self, claim: Any) -> None:
            if not first_claim:
                first_claim.append(time.perf_counter())

    worker = Timed(app, names=[ASYNC_TASK if mode == "async" else SYNC_TASK],
                   concurrency=concurrency, async_concurrency=async_concurrency,
                   fast_takeover=False, scheduler=False)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stats = worker.run(max_tasks=tasks)
    ended = time.perf_counter()
    done.set()
    elapsed = ended - first_claim[0]
    print(json.dumps({
        "mode": mode, "tasks": tasks, "claimed": stats.claimed,
        "seconds": elapsed, "tasks_per_s": tasks / elapsed,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_threads": peak_threads,
    }), flush=True)
    app.close()


# ---------------------------------------------------------------------- the driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"the service did not listen on port {port} within {timeout_s} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--async-concurrency", type=int, default=1000)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--ledger", default=None,
                        help="ledger URL, with no ready tasks of the bench's types (default: "
                        "a fresh SQLite file per mode in a temp dir)")
    parser.add_argument("--modes", default="thread,async",
                        help="comma list of thread (--concurrency threads), thread:N (N "
                        "threads) and async (--async-concurrency)")
    parser.add_argument("--no-http", action="store_true",
                        help="each call sleeps --latency-ms instead (time.sleep in the thread "
                        "task, asyncio.sleep in the async one): the workers without an HTTP "
                        "client's cost")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--drain", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--url", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.latency_ms / 1000)
        return
    if args.drain is not None:
        drain(args.ledger, args.url, args.drain, args.tasks, args.concurrency,
              args.async_concurrency)
        return

    import ratchet

    port = _free_port()
    url = f"sleep:{args.latency_ms / 1000}" if args.no_http else f"http://127.0.0.1:{port}"
    service = subprocess.Popen([sys.executable, str(HERE), "--serve", str(port),
                                "--latency-ms", str(args.latency_ms)])
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-async-io-"))
    results = []
    try:
        _wait_listening(port)
        for spec in args.modes.split(","):
            # "thread" (--concurrency threads), "thread:N" (N threads) or "async".
            mode, _, threads = spec.partition(":")
            concurrency = int(threads) if threads else args.concurrency
            ledger = args.ledger or f"sqlite:///{tmp}/{spec.replace(':', '-')}.db"
            app = build_app(ledger, url)
            name = ASYNC_TASK if mode == "async" else SYNC_TASK
            for start in range(0, args.tasks, 500):
                app.submit_many([ratchet.SubmitRequest(name, {"n": i}) for i in
                                 range(start, min(args.tasks, start + 500))])
            app.close()
            out = subprocess.run(
                [sys.executable, str(HERE), "--drain", mode, "--ledger", ledger, "--url", url,
                 "--tasks", str(args.tasks), "--concurrency", str(concurrency),
                 "--async-concurrency", str(args.async_concurrency)],
                capture_output=True, text=True, check=True, env={**os.environ})
            result = json.loads(out.stdout.strip().splitlines()[-1])
            result["mode"] = spec
            results.append(result)
            print(f"{spec:>11}: {result['tasks_per_s']:8.0f} tasks/s  "
                  f"{result['seconds']:6.1f} s  peak RSS {result['peak_rss_mib']:6.1f} MiB  "
                  f"peak threads {result['peak_threads']}", flush=True)
    finally:
        service.terminate()
        service.wait(10)
    by = {r["mode"]: r for r in results}
    if "thread" in by and "async" in by:
        print(f"async / thread: {by['async']['tasks_per_s'] / by['thread']['tasks_per_s']:.1f}x"
              f" tasks/s, {by['async']['peak_rss_mib'] / by['thread']['peak_rss_mib']:.2f}x "
              "peak RSS")


if __name__ == "__main__":
    main()
