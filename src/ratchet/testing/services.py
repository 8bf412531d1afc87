"""A counting external service: its own process, real HTTP on loopback, its own SQLite file.

It stands for a system outside Ratchet's trust boundary (DESIGN §2, §5) — a payment API,
a mailer — and keeps its own record of every execution, so a test can count at the
*external* side whether each effect happened exactly once. Nothing Ratchet records
locally can prove that.

Run it as::

    python -m ratchet.testing.services --port 0 --db service.db \\
        [--no-honour-keys] [--check-tokens] [--reply-lost P] [--burst-503 P] [--slow P] \\
        [--slow-s S] [--seed N]

When it listens it prints exactly one line, ``READY <port>``, on stdout.

HTTP API (JSON bodies):

* ``POST /effects`` with header ``Idempotency-Key: K`` and a JSON object body.
  Honouring keys (the default, like Stripe): a key already executed returns ``200`` with
  the stored record and ``"replayed": true`` and executes nothing (a row goes into
  ``replays``); the same key with another body returns ``422``. Otherwise the request
  executes — one SQLite transaction inserts into ``executions`` and upserts ``records`` —
  and ``201 {"id", "key", "body", "created_at", "replayed": false}`` is returned. With
  ``--no-honour-keys`` every POST executes (a legacy API that records keys but does not
  enforce them). A missing key or a body that is not a JSON object returns ``400``.
  A body may carry ``"items": [...]`` (strings and integers; anything else: ``400``):
  an execution *applies* each item (one row per item in the ``items`` table, in the same
  transaction), a replay applies none. So a test can count per item at the external side
  (:attr:`ServiceRecords.items`) when one request carries a batch of items: an item
  applied by two executions shows 2, whatever their keys.
* ``GET /effects/{key}`` — ``200`` with the stored record, or ``404 {"error": "not found"}``.
* ``GET /executions`` — ``{key: number of executions}``.
* ``GET /stats`` — ``{"executions", "keys", "duplicate_keys", "replays", "lookups",
  "lookups_found", "stale_tokens_rejected", "items_applied", "injected": {...}}``.

Fenced mode (``--check-tokens``; Kleppmann's fencing token checked at the storage side):
``POST /effects`` and ``GET /effects/{key}`` must carry a header ``Fencing-Token: T`` (a
decimal integer >= 0; missing or malformed: ``400``). The service keeps, per key, the
highest token it has seen, from executions *and* lookups alike. A request whose token is
lower than that is refused with ``409 {"error": "stale fencing token", "key", "token",
"highest"}``, executes (or answers) nothing, and is recorded in the ``stale_tokens``
table. Otherwise its token becomes the key's highest and the request proceeds as usual
(dedupe by key with honour_keys, or execute). Check, record and execution are one SQLite
transaction under the store lock, and a POST is checked when it executes (after any
processing delay). So once a lookup with token T has answered "not found", no request
with a lower token can execute for that key: a frozen holder's late request is refused.
Without ``--check-tokens`` the header is ignored.
* ``GET /admin/faults`` / ``POST /admin/faults`` — read or change :class:`FaultSettings`.

Fault injection (probabilities in ``[0, 1]``, drawn from one seeded RNG):

* ``reply_lost`` — the request executes and commits, then the connection is shut down
  without a response (the client sees a dropped reply: an unknown outcome);
* ``burst_503`` — a request starts a burst with this probability: it and the next
  ``burst_len - 1`` requests to ``/effects`` get ``503`` with ``Retry-After: 0.2`` and
  execute nothing;
* ``slow`` — sleep ``slow_s`` seconds *before* executing and replying, so a client with a
  shorter read timeout gives up while the execution is still to come;
* ``latency_s`` — not a fault: every POST takes ``uniform(0.5, 1.5) * latency_s`` seconds
  before executing, like a real API (default 0);
* deterministic counterparts for tests: ``reply_lost_next`` (drop the reply of the next N
  executing requests), ``fail_next_503`` (the next N requests to ``/effects`` — POST or
  GET — get 503), ``slow_next`` (the next N POSTs are slow).

The code lives in :mod:`ratchet.testing.counting`, one module per job (protocol, store,
HTTP server, records, process, client); this module is its public face and re-exports
every name, and ``python -m ratchet.testing.services`` runs :func:`main`.

Python side: :func:`start_counting_service` (spawn, wait for ``READY``; returns a
:class:`CountingService` that reads the service's own file), :class:`CountingClient`
(httpx; :class:`AsyncCountingClient` for ``async def`` bodies; errors are raised unchanged,
so Ratchet's classifier sees them, except a 409
stale-token reply, raised as ``ratchet.TokenRejected``).
"""

from __future__ import annotations

from ..errors import TokenRejected as TokenRejected
from .counting.client import AsyncCountingClient as AsyncCountingClient
from .counting.client import CountingClient as CountingClient
from .counting.process import CountingService as CountingService
from .counting.process import start_counting_service as start_counting_service
from .counting.protocol import ITEMS_ERROR as ITEMS_ERROR
from .counting.protocol import RETRY_AFTER_S as RETRY_AFTER_S
from .counting.protocol import STALE_TOKEN_ERROR as STALE_TOKEN_ERROR
from .counting.protocol import TOKEN_HEADER as TOKEN_HEADER
from .counting.protocol import FaultSettings as FaultSettings
from .counting.protocol import ServiceError as ServiceError
from .counting.records import ServiceRecords as ServiceRecords
from .counting.records import TokenRejection as TokenRejection
from .counting.records import read_records as read_records
from .counting.records import read_stored as read_stored
from .counting.server import main as main
from .counting.store import CountingStore as CountingStore

__all__ = [
    "ITEMS_ERROR",
    "RETRY_AFTER_S",
    "AsyncCountingClient",
    "CountingClient",
    "CountingService",
    "CountingStore",
    "FaultSettings",
    "ServiceError",
    "ServiceRecords",
    "TokenRejected",
    "TokenRejection",
    "main",
    "read_records",
    "read_stored",
    "start_counting_service",
]

if __name__ == "__main__":
    raise SystemExit(main())
