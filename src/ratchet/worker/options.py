"""The worker's options: their defaults, their limits and the checks of their values,
and the exit statuses of ``ratchet worker``. Every default says why it is what it is."""

from __future__ import annotations

import math
import os
import secrets
import socket

from ..errors import ConfigError, InvalidArguments
from ..validation import (
    MAX_ASYNC_CONCURRENCY,
    MAX_CONCURRENCY,
    MAX_POLL_INTERVAL_S,
    MAX_PREFETCH,
    MAX_STUCK_THREADS,
    MAX_WRITERS,
    check_finite,
)
from ..validation import check_int as validation_check_int

__all__ = [
    "DEFAULT_ASYNC_CONCURRENCY",
    "DEFAULT_SHUTDOWN_GRACE_S",
    "EXIT_HANDED_BACK",
    "EXIT_STUCK_THREADS",
    "MAX_ASYNC_CONCURRENCY",
    "MAX_CONCURRENCY",
    "MAX_POLL_INTERVAL_S",
    "MAX_PREFETCH",
    "MAX_STUCK_THREADS",
    "MAX_WRITERS",
    "STUCK_CONFIRM_S",
    "check_int",
    "check_seconds",
    "default_holder",
    "default_max_stuck_threads",
    "default_prefetch",
    "default_writers",
]


DEFAULT_ASYNC_CONCURRENCY = 100
"""Default ``async_concurrency``: ``async def`` bodies one worker runs at once on its
event loop. An awaiting body costs a coroutine and its context (kilobytes), not a thread,
so far more run at once than threads would; 100 keeps one worker's share of a downstream
and of the ledger's writer moderate. Raise it for I/O-bound tasks
(``bench/async_io.py`` ran 1,000)."""


def default_holder() -> str:
    """``host:pid:random`` — unique per worker process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def default_prefetch(concurrency: int) -> int:
    """Default :class:`Worker` ``prefetch`` for ``concurrency`` threads:
    ``min(32, max(4, 4 * concurrency))`` (Celery's prefetch multiplier of 4, capped).

    Why: without prefetch a single-thread worker runs one task per transaction and its
    body never overlaps the commit. Measured with ``bench/sqlite_throughput.py --repeat 2
    --concurrency 1,32 --durability fsync --variants step --prefetch 0,4,8,16,32`` (20,000
    no-op tasks, one worker process, 2 shared cores; huey ``-w 1`` 2,473 tasks/s in the
    same run): C=1 826 tasks/s with prefetch 0, 4,449 with 4, 4,760 with 8, 5,546 with
    16; C=32 7,006 with 0, 8,531 with 8, 10,326 with 16, 9,568 with 32. Most of the
    gain comes with the first few tasks (the body overlaps the commit, ~5 completions
    per fsync at C=1); beyond that it flattens while more tasks sit leased and unstarted
    in one process, where another worker cannot take them (a graceful stop releases
    them; a crash leaves them to lease expiry, like running ones). Long tasks spread
    over several workers want a small prefetch (``0``). At the default concurrency (8) on
    PostgreSQL, one process draining 20,000 one-step tasks: 3,627-3,990 tasks/s with
    prefetch 8, 4,977 with 16, 5,693 with 32 (two interleaved runs, 2026-11-30): the claim
    and completion batches grow with what a worker holds, hence 4 per thread up to 32.
    """
    return min(32, max(4, 4 * concurrency))


def default_writers(ledger: object) -> int:
    """Default :class:`Worker` ``writers`` for ``ledger``: its ``default_writers``
    attribute if it has one (an int >= 1), else 1.

    Why 1 on both ledgers: SQLite has one write lock, so a second writer thread would only
    wait for it. On PostgreSQL more writers overlap transactions, which pays only while
    the database server has CPU to spare: N writers cut each writer's batches by about N,
    so a task costs the server more (more BEGIN/fence/COMMIT/fsync per task). Measured on 2
    shared cores (server and workers on one host) with ``bench/pg_throughput.py --repeat 1
    --processes 1,4 --concurrency 32,128 --durability fsync --variants step --claim-sizes ''
    --latency-count 0 --rss-tasks 0 --enqueue-threads '' --no-pgqueuer``, 20,000 no-op
    tasks, three interleaved rounds at load ~1: 1 process C=128 8,580 / 8,826 / 8,025
    tasks/s with 1 writer against 9,778 / 8,834 / 7,988 with 2 (eight more 1-process rounds
    at C=128: 2 writers ahead by 0-25% when the host was quiet, behind when it was busy;
    3 writers no better than 2); 4 processes C=32 12,862 / 12,736 / 11,686 with 1 against
    8,855 / 8,753 / 8,226 with 2, C=128 14,128 / 14,944 / 13,324 against 12,065 / 12,316 /
    11,159 (twice the transactions on a saturated server). Pass ``writers=2`` for one busy
    worker process against a PostgreSQL server with cores to spare.
    """
    attr = getattr(ledger, "default_writers", None)
    if isinstance(attr, int) and not isinstance(attr, bool) and attr >= 1:
        return attr
    return 1


DEFAULT_SHUTDOWN_GRACE_S = 25.0
"""Default :class:`Worker` ``shutdown_grace_s``, seconds: how long running tasks get, after
SIGTERM / Ctrl-C, to reach their end or a step boundary before the worker hands their
leases back and exits. A few seconds below Kubernetes' default
``terminationGracePeriodSeconds`` (30 s), after which it sends SIGKILL, so the hand-back
(one ledger transaction) happens before the kill; set it below your process manager's
own kill timeout (``docker stop``: 10 s, systemd ``TimeoutStopSec``: 90 s)."""

EXIT_HANDED_BACK = 3
"""``ratchet worker`` exit status when the shutdown grace ended (or a second signal came)
while task threads were still inside task code: their leases were handed back."""

EXIT_STUCK_THREADS = 4
"""``ratchet worker`` exit status when the worker stopped itself because
``max_stuck_threads`` task threads were stuck past their attempt's end: restart it."""


STUCK_CONFIRM_S = 1.0
"""Seconds a thread taken from its attempt (time limit) must stay in task code before it
counts towards ``max_stuck_threads``: a body that ends a few milliseconds past its limit
is not stuck, and on a loaded host every thread can be in that moment at once."""


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``: the
    :func:`ratchet.validation.check_int` of a :class:`Worker` option, raising ``ConfigError``
    ("Worker {name} must be an integer from {low} to {high}, got ...")."""
    return validation_check_int(value, f"Worker {name}", minimum=low, maximum=high,
                                error=ConfigError)


def check_seconds(name: str, value: object, *, above_zero: bool = False,
                  high: float = math.inf) -> float:
    """``value`` as a number of seconds: finite (or up to ``high``), at least 0 (above 0
    when ``above_zero``); else ``ConfigError`` naming the option and its range."""
    try:
        seconds: float | None = check_finite(
            value, f"Worker {name}", minimum=0.0, maximum=high if high < math.inf else None)
    except InvalidArguments:
        seconds = None
    if seconds is None or (above_zero and seconds == 0):
        bound = "> 0" if above_zero else ">= 0"
        top = f" and <= {high:g}" if high < math.inf else ""
        raise ConfigError(f"Worker {name} must be a finite number of seconds {bound}{top}, "
                          f"got {value!r}")
    return seconds


def default_max_stuck_threads(concurrency: int) -> int:
    """Default :class:`Worker` ``max_stuck_threads``: ``max(4, concurrency)``.

    Why: a thread stuck in task code past its time limit cannot be killed; the worker
    starts another in its place, so each stuck thread adds one thread, its stack and
    whatever it holds (sockets, memory, CPU if it spins) to the process. Up to as many as
    the worker runs (at least 4, so a one-thread worker survives a few hangs) the process
    runs at most about twice its threads; past that only a restart frees them."""
    return max(4, concurrency)

