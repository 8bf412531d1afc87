"""A rate bucket's clock never moves back (PostgreSQL).

PostgreSQL's ledger clock is the transaction's start (``now()``). Two claims spending from
one bucket take turns on its row lock, so a claim that began *before* the bucket's last
write can read it *after* that write: its refill is nothing (its clock is behind the
bucket's), but if it then saves the bucket with its own, earlier, clock, the next claim
refills the interval between the two again, and over time more tasks start than
``burst + rate * t``. Here the other claim is played by the test's own connection, holding
the bucket's row while a real claim waits on it.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pgsupport import pg_base_url

from ratchet import App, Control, RateLimit
from ratchet.ledger.base import ClaimScope
from ratchet.testing import wait_for


def test_a_claim_that_began_before_the_buckets_last_write_keeps_its_clock(
        app: App, ledger_url: str, backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("SQLite reads its clock after taking the write lock")
    import psycopg

    @app.task("r.tick", rate_limit=RateLimit("10/s", burst=1))
    def tick(ctx: Any, n: int) -> None:
        return None

    app.submit("r.tick", {"n": 0})  # (opens the ledger)
    with Control(ledger_url) as control:
        control.set_rate_limit("r.tick", "10/s", burst=1, reason="test")
    assert len(app.ledger.claim("w1", ["r.tick"], 5, ClaimScope())) == 1  # bucket now empty
    app.submit("r.tick", {"n": 1})
    schema = parse_qs(urlsplit(ledger_url).query)["schema"][0]
    claimed: list[Any] = []
    with psycopg.connect(pg_base_url(), options=f"-c search_path={schema}") as other:
        # The other claim: it holds the bucket's row...
        other.execute("SELECT tokens FROM rate_buckets WHERE name = 'r.tick' FOR UPDATE")
        # ... while this claim begins (its clock is read now) and waits for the row.
        late = threading.Thread(target=lambda: claimed.extend(
            app.ledger.claim("w2", ["r.tick"], 5, ClaimScope())))
        late.start()
        wait_for("the claim to wait for the bucket's row", lambda: other.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0] > 0, 30.0)
        # The other claim spends the bucket later than the waiting claim began, commits.
        other.execute("UPDATE rate_buckets SET tokens = 0, "
                      "updated_at = extract(epoch FROM clock_timestamp()) "
                      "WHERE name = 'r.tick'")
        (written,) = other.execute(
            "SELECT updated_at FROM rate_buckets WHERE name = 'r.tick'").fetchone()
        other.commit()
        late.join(30.0)
        assert not late.is_alive()
        (after,) = other.execute(
            "SELECT updated_at FROM rate_buckets WHERE name = 'r.tick'").fetchone()
    assert claimed == []  # the bucket was empty: the task waits for a token
    # The bucket's clock stays where the later write put it: otherwise the next claim
    # refills the time between the two claims a second time.
    assert after >= written, (after, written)
