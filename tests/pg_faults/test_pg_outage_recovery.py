"""After a PostgreSQL outage, an idle worker picks up new work within about two seconds of
the server accepting connections again, however long the outage lasted.

psycopg_pool's own reconnect backoff doubles without a cap (1, 2, 4, 8, 16 s ...): after 45 s
of downtime an idle worker took 14-18 s to run a task submitted once the server was back,
after 90 s 35 s. ``ratchet.ledger.pgpool`` caps the delay between attempts. A private
cluster (initdb + pg_ctl on its own port) is stopped for :data:`DOWN_S` seconds — long
enough that the uncapped backoff's next attempt falls ~15 s after the restart — then
started; a task submitted right after must finish within :data:`RECOVERY_BOUND_S`.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgkit import PrivateCluster, private_cluster
from pgsupport import with_params

from ratchet import App, State, open_ledger
from ratchet.testing import wait_for

pytestmark = [pytest.mark.crash, pytest.mark.timeout(180)]

DOWN_S = 16.0
"""Outage length, seconds: the uncapped backoff would next try ~31 s after the failure."""

RECOVERY_BOUND_S = 6.0
"""Restart → task finished, seconds: ~2 s expected, room for a loaded machine; the uncapped
backoff needs ~15 s here."""

APP = '''
import ratchet

app = ratchet.App()


@app.task(name="outage.noop")
def noop(ctx: ratchet.TaskContext, n: int) -> int:
    return n
'''


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as c:
        yield c


def _wait(what: str, probe: object, timeout_s: float) -> float:
    """Poll ``probe()`` until true; return the monotonic time it became true."""
    assert callable(probe)
    return wait_for(what, lambda: time.monotonic() if probe() else None, timeout_s=timeout_s,
                    interval_s=0.02)


def test_idle_worker_runs_new_work_soon_after_a_long_outage(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    url = with_params(cluster.url, schema="rt_outage", durability="fsync")
    (tmp_path / "outage_app.py").write_text(APP)
    App(ledger=url).ledger.close()  # creates the schema
    log = (tmp_path / "worker.log").open("wb")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "ratchet.cli.main", "worker", "outage_app:app",
         "--ledger", url, "--concurrency", "2", "--log-level", "INFO"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
    )
    try:
        ledger = open_ledger(url)
        try:
            _wait("the worker to register", lambda: bool(ledger.list_workers()), 60)
        finally:
            ledger.close()
        cluster.stop("fast")
        time.sleep(DOWN_S)  # the outage itself (the fault under test), not a wait for state
        assert worker.poll() is None, "the worker exited during the outage"
        cluster.start()
        restarted = time.monotonic()
        app = App(ledger=url)
        app.task(name="outage.noop")(lambda ctx, n: n)  # the same definition as the worker's
        try:
            handle = app.submit("outage.noop", {"n": 7})
            done = _wait(
                "the task to finish", lambda: handle.get().state == State.SUCCEEDED, 60
            )
        finally:
            app.close()
        recovery_s = done - restarted
        print(f"outage {DOWN_S:.0f} s: restart -> task finished in {recovery_s:.2f} s")
        assert recovery_s < RECOVERY_BOUND_S, (
            f"an idle worker took {recovery_s:.1f} s after the server came back "
            f"(bound {RECOVERY_BOUND_S} s): the pool's reconnect backoff grew with the outage"
        )
        assert worker.poll() is None, "the worker exited after the outage"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        print((tmp_path / "worker.log").read_text("utf-8", "replace")[-4000:])


def test_pool_reconnect_attempts_stay_close_together_during_an_outage() -> None:
    """The mechanism, deterministically: while the server refuses connections (a proxy that
    accepts and hangs up at once), the pool's attempts never drift more than about
    :data:`~ratchet.ledger.pgpool.RECONNECT_MAX_DELAY_S` apart (psycopg_pool's own backoff
    would already be 4 s apart after 7 s), and once connections are accepted again a caller
    gets one within a second."""
    from urllib.parse import urlsplit

    from pgkit import TcpProxy
    from pgsupport import require_pg

    from ratchet.ledger.pgpool import RECONNECT_MAX_DELAY_S, make_pool

    base = urlsplit(require_pg())
    proxy = TcpProxy(base.hostname or "127.0.0.1", base.port or 5432)
    proxy.block()
    user = base.username or "postgres"
    conninfo = base._replace(netloc=f"{user}@127.0.0.1:{proxy.port}").geturl()
    pool = make_pool(conninfo, min_size=1, max_size=2, configure=lambda conn: None,
                     name="outage-test", timeout_s=10.0, connect_timeout_s=2)
    try:
        seen: list[float] = []
        last = proxy.refused
        deadline = time.monotonic() + 7.0
        while time.monotonic() < deadline:
            if proxy.refused != last:
                last = proxy.refused
                seen.append(time.monotonic())
            time.sleep(0.01)
        gaps = [b - a for a, b in itertools.pairwise(seen)]
        assert len(seen) >= 8, f"only {len(seen)} reconnect attempts in 7 s: {gaps}"
        assert max(gaps) < RECONNECT_MAX_DELAY_S * 1.2 + 0.3, f"attempt gaps grew: {gaps}"
        proxy.unblock()
        t0 = time.monotonic()
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert time.monotonic() - t0 < 1.5, "no connection within 1.5 s of the outage's end"
    finally:
        pool.close()
        proxy.close()
