"""The Ratchet app the flow-control process tests run in real worker subprocesses.

What must be counted is counted *outside* Ratchet: every body sends its marks over real
HTTP to the counting service (:mod:`ratchet.testing`) at ``FLOW_URL``, which stores each
request (it deduplicates nothing) with its own clock and in its own order (one lock, an
autoincrement id). A mark's key says what happened, fields separated by ``|``:

* ``s|ACCOUNT|N|GENERATION|PID`` and ``e|...``: ``flow.ordered`` started / ended its body;
* ``r|N|ATTEMPT``: ``flow.rated`` started;
* ``f|TENANT|N`` / ``u|TENANT|N``: ``flow.fair`` / ``flow.unfair`` started;
* ``p|N``: ``flow.prio`` started;
* ``q|NAME|N|HOLDER``: ``flow.critical`` / ``flow.bulk`` started, on the worker ``HOLDER``.

Tasks:

* ``flow.ordered(account, n)``: one at a time per account, in submit order
  (``concurrency_key``, ``ordered=True``); the body holds its slot ``FLOW_HOLD_S``
  seconds (default 0.03) between its start and end marks, so a SIGKILL lands inside it.
  Its lease is long (``FLOW_LEASE_S``, default 30 s): a killed holder's tasks come back by
  fast takeover (same-host revocation), never by lease expiry, so no holder that is alive
  loses its task.
* ``flow.rated(n)``: ``RateLimit("10/s", burst=10)``, one bucket for the type.
* ``flow.fair(t, n)`` (``fair=True``: round-robin across tenants) and ``flow.unfair(t, n)``
  (the same without fairness).
* ``flow.prio(n)``: a plain task, submitted at various priorities.
* ``flow.critical(n)`` in queue ``critical``, ``flow.bulk(n)`` in queue ``bulk``.
"""

from __future__ import annotations

import os
import time

import ratchet
from ratchet import RateLimit, RetryPolicy, TaskContext
from ratchet.testing import CountingClient

__all__ = ["RATE", "app", "build_app"]

LEASE_S = float(os.environ.get("FLOW_LEASE_S", "30"))
HOLD_S = float(os.environ.get("FLOW_HOLD_S", "0.03"))
RATE = RateLimit("10/s", burst=10)
RETRY = RetryPolicy(max_attempts=20, base_delay_s=0.01, max_delay_s=0.2,
                    quarantine_after=None)

_client: CountingClient | None = None


def client() -> CountingClient:
    """The counting-service client of this process (created on first use)."""
    global _client
    if _client is None:
        _client = CountingClient(os.environ["FLOW_URL"], timeout_s=30.0)
    return _client


def mark(*fields: object) -> None:
    """Record one mark at the counting service (key: the fields joined by ``|``)."""
    key = "|".join(str(f) for f in fields)
    client().execute(key, {})


def build_app(ledger: str | None = None) -> ratchet.App:
    """A fresh App with the flow tasks registered."""
    app = ratchet.App(ledger)

    @app.task(name="flow.ordered", concurrency_key=lambda p: p["account"], ordered=True,
              lease_s=LEASE_S, retry=RETRY)
    def ordered(ctx: TaskContext, account: str, n: int) -> None:
        mark("s", account, n, ctx.generation, os.getpid())
        time.sleep(HOLD_S)
        mark("e", account, n, ctx.generation, os.getpid())

    @app.task(name="flow.rated", rate_limit=RATE, retry=RETRY)
    def rated(ctx: TaskContext, n: int) -> None:
        mark("r", n, ctx.attempt)

    @app.task(name="flow.fair", fair=True, retry=RETRY)
    def fair(ctx: TaskContext, t: str, n: int) -> None:
        mark("f", t, n)

    @app.task(name="flow.unfair", retry=RETRY)
    def unfair(ctx: TaskContext, t: str, n: int) -> None:
        mark("u", t, n)

    @app.task(name="flow.prio", retry=RETRY)
    def prio(ctx: TaskContext, n: int) -> None:
        mark("p", n)

    @app.task(name="flow.critical", queue="critical", retry=RETRY)
    def critical(ctx: TaskContext, n: int) -> None:
        mark("q", "flow.critical", n, ctx.holder)

    @app.task(name="flow.bulk", queue="bulk", retry=RETRY)
    def bulk(ctx: TaskContext, n: int) -> None:
        mark("q", "flow.bulk", n, ctx.holder)

    return app


app = build_app()
if os.environ.get("FLOW_URL"):
    # Build the HTTP client at import, before the worker starts its threads.
    client()
