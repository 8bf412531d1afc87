"""What a fair claim reads does not grow with the backlog.

A claim of a fair type takes each fairness key's first few ready tasks and, as one more
group, the first ready tasks stored without a fairness key. Both walks must read about
what they return: with one tenant's burst of 10,000 ready tasks, a claim that walks the
queue's whole ready set (to find the tasks without a key, or to sort one key's tasks)
costs a hundred times what it costs with 100, on every claim until the burst is drained.
Measured by work done, not time: SQLite's virtual-machine steps (a progress handler),
PostgreSQL's rows read and thrown away (``EXPLAIN ANALYZE``).
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pgsupport import pg_base_url

from ratchet import App, SubmitRequest
from ratchet.config import parse_ledger_url
from ratchet.ledger.catalogue import load_catalogue

SMALL, BIG = 100, 10_000


def _params(now: float) -> dict[str, Any]:
    """claim_fair_candidates' parameters as a claim of want=8 with one key passes them."""
    return {"name": "fc.work", "queue": "default", "per_key": 4, "now": now, "lo": 1,
            "hi": 32767}


def _burst(app: App, n: int, first: int) -> None:
    app.submit_many([SubmitRequest("fc.work", {"n": first + i}, tenant="A")
                     for i in range(n)])


def _sqlite_steps(path: str, now: float) -> int:
    (statement,) = load_catalogue("sqlite")["claim_fair_candidates"]
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn = sqlite3.connect(path)
    try:
        conn.set_progress_handler(count, 100)
        rows = conn.execute(statement, {**_params(now), "keys": json.dumps(["A"])}).fetchall()
        assert len(rows) == 4
    finally:
        conn.close()
    return steps[0]


def _pg_discarded(url: str, now: float) -> int:
    import psycopg

    (statement,) = load_catalogue("postgresql")["claim_fair_candidates"]
    schema = parse_qs(urlsplit(url).query)["schema"][0]
    with psycopg.connect(pg_base_url(), options=f"-c search_path={schema}") as conn:
        plan = "\n".join(str(r[0]) for r in conn.execute(
            "EXPLAIN ANALYZE " + statement, {**_params(now), "keys": ["A"]}).fetchall())
        conn.rollback()
    return sum(int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan))


def test_a_fair_claim_reads_about_what_it_returns(app: App, ledger_url: str,
                                                  backend: str) -> None:
    @app.task("fc.work", fair=True)
    def work(ctx: Any, n: int) -> None:
        return None

    _burst(app, SMALL, 0)
    now = app.ledger.now() + 60.0
    if backend == "sqlite":
        path = str(parse_ledger_url(ledger_url).path)
        small = _sqlite_steps(path, now)
        _burst(app, BIG - SMALL, SMALL)
        big = _sqlite_steps(path, now)
        assert big <= 5 * max(small, 1), (small, big)
    else:
        small = _pg_discarded(ledger_url, now)
        _burst(app, BIG - SMALL, SMALL)
        big = _pg_discarded(ledger_url, now)
        assert big <= 100, (small, big)
