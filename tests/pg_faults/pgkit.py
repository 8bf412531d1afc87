"""Harness for the PostgreSQL fault tests: the crash rig on a PostgreSQL ledger, raw SQL
on the server, a private throw-away cluster, and a loopback TCP proxy.

Reuses :mod:`crashkit` (tests/crash) and through it :mod:`ratchet.testing` for processes,
the counting service, the step log and the exactly-once / consistency checks. As in the
crash suite, "how often did it happen" is always counted outside Ratchet: charges in the
counting service's own SQLite file, step runs in the append-only step log.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

HERE = Path(__file__).resolve().parent
CRASH_DIR = HERE.parent / "crash"
for _p in (str(CRASH_DIR), str(HERE.parent)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from crashkit import Proc, Rig, WorkerProcess, wait_for  # noqa: E402
from pgsupport import with_params  # noqa: E402

from ratchet import State  # noqa: E402
from ratchet.testing import check_exactly_once, check_ledger_consistent  # noqa: E402

PG_BIN = Path(os.environ.get("RATCHET_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def base_of(url: str) -> str:
    """``url`` without its query (the server + database only, for raw admin connections)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def raw_connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection to the server of ``url`` (no Ratchet code involved)."""
    return psycopg.connect(base_of(url), autocommit=True, connect_timeout=5)


# ---------------------------------------------------------------------------- rig


class PgRig(Rig):
    """The crash rig with a PostgreSQL ledger (one private schema per test).

    Workers may get their own ledger URL (``app_name`` sets libpq's ``application_name``,
    so the test can find exactly that worker's server connections in pg_stat_activity).
    """

    def __init__(self, tmp: Path, ledger_url: str, schema: str) -> None:
        super().__init__(tmp, ledger_url)
        self.schema = schema
        self.cluster: PrivateCluster | None = None  # set when the ledger is on one
        self._raw: psycopg.Connection[Any] | None = None

    # ------------------------------------------------------------------ raw SQL

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """The test's own admin connection (reconnects if the server dropped it)."""
        if self._raw is None or self._raw.closed or self._raw.broken:
            self._raw = raw_connect(self.ledger_url)
        return self._raw

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run ``query`` with ``search_path`` set to this test's schema; return its rows."""
        for attempt in range(3):
            try:
                with self.raw.transaction(), self.raw.cursor() as cur:
                    cur.execute(
                        sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(self.schema))
                    )
                    cur.execute(query, args or None)
                    return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ workers

    def worker_url(self, app_name: str | None = None, base: str | None = None) -> str:
        url = base or self.ledger_url
        return with_params(url, application_name=app_name) if app_name else url

    def pg_worker(
        self,
        name: str,
        *,
        concurrency: int = 8,
        app_name: str | None = None,
        url: str | None = None,
        pause_at: str | None = None,
        crash_at: str | None = None,
        env: dict[str, str] | None = None,
        log_level: str = "INFO",
    ) -> WorkerProcess:
        """``python -m ratchet.cli.main worker crashapp:app`` on this rig's PostgreSQL ledger
        (or on ``url``), with an optional ``application_name``."""
        return self.worker(
            name, concurrency=concurrency, url=self.worker_url(app_name, url),
            pause_at=pause_at, crash_at=crash_at, env=env, log_level=log_level,
            fast_takeover=None,
        )  # fmt: skip

    # ------------------------------------------------------------------ reads

    def states(self) -> dict[str, int]:
        return {s: int(n) for s, n in self.sql("SELECT state, count(*) FROM tasks GROUP BY 1")}

    def running_held_by(self, holder: str) -> list[str]:
        return [r[0] for r in self.sql(
            "SELECT id FROM tasks WHERE state = 'RUNNING' AND holder = %s", holder
        )]

    def wait_all_succeeded(self, total: int, timeout_s: float) -> None:
        def probe() -> bool:
            return self.states().get(State.SUCCEEDED.value, 0) == total

        try:
            wait_for("every task to succeed", probe, timeout_s=timeout_s, interval_s=0.25)
        except AssertionError:
            raise AssertionError(f"not drained after {timeout_s} s: {self.states()}") from None

    def cleanup(self) -> None:
        try:
            super().cleanup()
        finally:
            if self._raw is not None:
                self._raw.close()


def backends_of(conn: psycopg.Connection[Any], app_name: str) -> list[int]:
    """Server pids of the client connections whose application_name is ``app_name``."""
    return [r[0] for r in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()",
        (app_name,),
    ).fetchall()]


def terminate_backends(conn: psycopg.Connection[Any], app_name: str) -> list[int]:
    """``pg_terminate_backend`` every connection of ``app_name`` (and only those)."""
    rows = conn.execute(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = %s AND pid <> pg_backend_pid()",
        (app_name,),
    ).fetchall()
    return [pid for pid, ok in rows if ok]


def unique_app_name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(5)}"


# ---------------------------------------------------------------------------- ledger checks


def check_pg_ledger_consistent(rig: PgRig) -> None:
    """The ledger's structural invariants (:func:`ratchet.testing.check_ledger_consistent`:
    audited generations, fenced steps and effects, leases of finished and running tasks,
    stale rejections older than the task)."""
    check_ledger_consistent(rig.ledger_url)


def assert_exactly_once(rig: PgRig, keys: set[str]) -> None:
    """Every task succeeded with its charge executed exactly once at the counting service
    (its own count), the ledger recorded that very execution, and the executed keys are
    exactly ``keys`` (:func:`ratchet.testing.check_exactly_once`)."""
    assert rig.service is not None
    report = check_exactly_once(
        rig.ledger_url, rig.service.records(), effect="charge", result_id_field="id"
    )
    assert set(report.executions) == keys, (
        f"{len(keys - set(report.executions))} charges never executed, "
        f"unexpected: {sorted(set(report.executions) - keys)[:5]}"
    )
    assert report.succeeded == report.succeeded_once == report.tasks
    assert rig.client.stats()["duplicate_keys"] == 0


def execution_times(rig: PgRig) -> list[tuple[float, str]]:
    """``(wall-clock time, key)`` of every execution, from the service's own file."""
    assert rig.service is not None
    return rig.service.records().times


# ---------------------------------------------------------------------------- private cluster


def _free_port() -> int:
    # Below Linux's ephemeral range (32768-60999): while a cluster is stopped for a restart,
    # no port-0 socket of a concurrent test (pytest-xdist, a second suite) can take its port.
    for _ in range(50):
        port = 25432 + random.randrange(0, 5000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port for the private PostgreSQL cluster")


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


class PrivateCluster:
    """A throw-away PostgreSQL cluster (initdb + pg_ctl) on its own port, owned by this test.

    Runs as the current user; as root (initdb refuses root) it runs as ``postgres`` on a
    directory owned by ``postgres`` under the system temp dir. :meth:`destroy` stops it
    (immediate) and removes the directory. The shared server is never touched.
    """

    def __init__(self) -> None:
        initdb = PG_BIN / "initdb"
        if not initdb.exists():
            _skip_or_fail(
                f"initdb not found at {initdb} (set RATCHET_TEST_PG_BIN to PostgreSQL's bin dir)"
                "; the private-cluster restart test needs it"
            )
        self.run_as: list[str] = []
        self._owner: tuple[int, int] | None = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                _skip_or_fail("running as root and there is no 'postgres' user to run initdb as")
            runuser = shutil.which("runuser")
            if runuser is None:
                _skip_or_fail("running as root and runuser(1) is not available for initdb")
            self.run_as = [str(runuser), "-u", "postgres", "--"]
            self._owner = (pw.pw_uid, pw.pw_gid)
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-pgfault-"))
        if self._owner is not None:
            os.chown(self.dir, *self._owner)
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        self.log = self.dir / "server.log"
        self.port = _free_port()
        self.started = False

    def _run(self, *cmd: str, timeout_s: float = 120.0) -> str:
        proc = subprocess.run(
            [*self.run_as, *cmd], capture_output=True, text=True, timeout=timeout_s,
            cwd=str(self.dir), stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                f"{self.server_log()[-3000:]}"
            )
        return proc.stdout

    def init(self) -> None:
        self._run("mkdir", "-p", str(self.sock))
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "--no-sync", "-E", "UTF8", "--locale=C",
        )

    def _options(self) -> str:
        return (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sock} -c max_connections=100"
            " -c fsync=on -c synchronous_commit=on"
        )

    def start(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", "60", "-o", self._options(), "start",
        )
        self.started = True

    def stop(self, mode: str = "fast") -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-m", mode,
                  "stop")
        self.started = False

    def restart(self, mode: str = "fast") -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
            "-m", mode, "-o", self._options(), "restart",
        )
        self.started = True

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def server_log(self) -> str:
        try:
            return self.log.read_text("utf-8", "replace")
        except (FileNotFoundError, PermissionError):
            return ""

    def destroy(self) -> None:
        try:
            if self.started or (self.data / "postmaster.pid").exists():
                with contextlib.suppress(Exception):
                    self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    cluster = PrivateCluster()
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


# ---------------------------------------------------------------------------- TCP proxy


class TcpProxy:
    """A loopback TCP proxy to ``target`` that the test can cut: :meth:`block` makes it
    refuse new connections (accepted, then closed at once, like a server that is down)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._blocked = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.refused = 0
        self.accepted = 0
        threading.Thread(target=self._accept_loop, name="proxy-accept", daemon=True).start()

    def block(self) -> None:
        self._blocked.set()

    def unblock(self) -> None:
        self._blocked.clear()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            if self._blocked.is_set():
                self.refused += 1
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):  # no Nagle: the protocol is many small messages
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.accepted += 1
            with self._lock:
                self._socks.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
                with self._lock:
                    self._socks.discard(s)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


def sigcont_all(procs: list[Proc]) -> None:
    for p in procs:
        p.signal(signal.SIGCONT)
