"""The PostgreSQL server of a soak run: a throw-away cluster of its own (``--pg private``,
the default: its restart disturbs nobody else's tests) or the machine's shared server
(``--pg shared``: restarted with ``pg_ctlcluster``; always left running)."""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["PgServer", "PrivateCluster", "SharedServer"]

PG_BIN = Path(os.environ.get("RATCHET_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PgServer:
    """What the soak needs of a server: where it is, raw SQL, a restart, a clean end."""

    host = "127.0.0.1"
    port = 5432
    database = "test"
    restart_kind = "restart"

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/DB``."""
        return f"postgresql://postgres@{self.host}:{self.port}/{self.database}"

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement on a fresh autocommit connection; its rows (or [])."""
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(query, args or None)
            return list(cur.fetchall()) if cur.description else []

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Poll ``SELECT 1`` until it answers (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                self.sql("SELECT 1")
                return True
            time.sleep(0.2)
        return False

    def restart(self) -> None:
        """Restart the server (fast shutdown). Raises RuntimeError when that failed."""
        raise NotImplementedError

    def ensure_running(self) -> None:
        """Make sure the server runs (after a failed restart), best effort."""

    def close(self) -> None:
        """Give the server back (a private cluster is destroyed)."""


def _run(cmd: list[str], timeout_s: float = 120.0) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): "
                           f"{done.stdout.strip()} {done.stderr.strip()}")
    return done.stdout


class SharedServer(PgServer):
    """The machine's shared server (PostgreSQL 15, cluster ``main``)."""

    restart_kind = "pg_ctlcluster restart"

    def __init__(self, port: int = 5432, database: str = "test") -> None:
        self.port = port
        self.database = database

    def restart(self) -> None:
        _run(["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart",
              "--", "-m", "fast"])

    def ensure_running(self) -> None:
        if self.wait_ready(3.0):
            return
        with contextlib.suppress(Exception):
            _run(["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start"])
        self.wait_ready(30.0)


def _free_port() -> int:
    for _ in range(50):
        port = 25432 + random.randrange(0, 5000)  # below the ephemeral range
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port for the private PostgreSQL cluster")


class PrivateCluster(PgServer):
    """A throw-away cluster (initdb + pg_ctl, as ``postgres`` when root) on its own
    loopback port; :meth:`close` stops it and removes its directory."""

    restart_kind = "pg_ctl restart -m fast (private cluster)"
    database = "postgres"

    def __init__(self, max_connections: int = 200) -> None:
        if not (PG_BIN / "initdb").exists():
            raise RuntimeError(f"initdb not found in {PG_BIN} (set RATCHET_TEST_PG_BIN)")
        self.run_as: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-soak-pg-"))
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            self.run_as = [shutil.which("runuser") or "runuser", "-u", "postgres", "--"]
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.data, self.sock, self.log = self.dir / "data", self.dir / "sock", self.dir / "log"
        self.port = _free_port()
        self.max_connections = max_connections
        _run([*self.run_as, "mkdir", "-p", str(self.sock)])
        _run([*self.run_as, str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
              "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        self._ctl("start")

    def _ctl(self, action: str, *extra: str) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sock}"
                f" -c max_connections={self.max_connections} -c fsync=on")
        _run([*self.run_as, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
              "-w", "-t", "60", "-o", opts, *extra, action])

    def restart(self) -> None:
        self._ctl("restart", "-m", "fast")

    def ensure_running(self) -> None:
        if not self.wait_ready(3.0):
            with contextlib.suppress(Exception):
                self._ctl("start")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _run([*self.run_as, str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60",
                  "-m", "immediate", "stop"])
        shutil.rmtree(self.dir, ignore_errors=True)
