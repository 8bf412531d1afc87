"""A throw-away PostgreSQL primary with a synchronous standby, for the failover test.

:class:`ReplicatedPair` runs two private clusters on free loopback ports, never the shared
test server: ``initdb`` the primary, start it with ``synchronous_standby_names`` naming
the standby (given on the primary's command line only, so the standby copied by
``pg_basebackup`` does not inherit it), ``pg_basebackup -R`` the standby through a
physical replication slot, write its ``primary_conninfo`` with the matching
``application_name``, start it, and wait until ``pg_stat_replication`` on the primary
shows it ``streaming`` and ``sync``.

:meth:`ReplicatedPair.kill_primary` is the loss of the primary's host: SIGKILL to the
postmaster and to every process it started, at once (no shutdown, no last WAL sent).
:meth:`ReplicatedPair.promote` is ``pg_ctl promote -w``. :meth:`ReplicatedPair.destroy`
SIGKILLs whatever is left of either cluster (by the pids in ``postmaster.pid`` and their
children, never by name) and removes the directory; the fixture calls it even when the
test fails.

As root (``initdb`` refuses root) the server binaries run as the ``postgres`` user
(``runuser``) on a directory owned by it. Without the binaries the test is skipped with a
message, except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ratchet.testing import wait_for

PG_BIN = Path(os.environ.get("RATCHET_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
STANDBY_NAME = "ratchet_standby"
"""The standby's ``application_name``: what ``synchronous_standby_names`` on the primary
names and ``pg_stat_replication`` shows."""
SLOT = "ratchet_standby_slot"


def _skip_or_fail(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(message)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports below Linux's ephemeral range (so no port-0 socket
    of a concurrent test takes one while its server is down)."""
    ports: list[int] = []
    for _ in range(200):
        port = 30000 + random.randrange(0, 2700)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError("no free ports for the private PostgreSQL pair")


def _children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid`` (from /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed but not reaped yet, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    return bool(fields) and fields[0] != "Z"


class Node:
    """One cluster of the pair: its data directory, port and server log."""

    def __init__(self, pair: ReplicatedPair, name: str, port: int) -> None:
        self.pair = pair
        self.name = name
        self.port = port
        self.data = pair.dir / name
        self.log = pair.dir / f"{name}.log"

    @property
    def url(self) -> str:
        """A plain libpq URL of this node only (admin connections, checks)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def connect(self) -> psycopg.Connection[Any]:
        """An autocommit admin connection to this node (no Ratchet code involved)."""
        return psycopg.connect(self.url, autocommit=True, connect_timeout=5)

    def start(self, *settings: str) -> None:
        """``pg_ctl start -w`` with ``-c`` ``settings`` (no spaces in them)."""
        options = " ".join(
            [f"-p {self.port}", f"-k {self.pair.sock}", "-c listen_addresses=127.0.0.1",
             "-c max_connections=100", "-c fsync=on"] + [f"-c {s}" for s in settings]
        )  # fmt: skip
        self.pair.run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
            "-t", "60", "-o", options, "start",
        )  # fmt: skip

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid from ``postmaster.pid`` (None: no such file)."""
        try:
            first = (self.data / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    def kill9(self) -> list[int]:
        """SIGKILL the postmaster and every process it started (the host is gone).

        Returns:
            the pids signalled (empty when the node was not running).
        """
        pid = self.postmaster_pid()
        if pid is None or not _alive(pid):
            return []
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        return victims

    def server_log(self) -> str:
        try:
            return self.log.read_text("utf-8", "replace")
        except OSError:
            return ""


class ReplicatedPair:
    """A primary and one synchronous standby on loopback ports (see the module docstring).

    Attributes:
        primary: the node started first (dead after :meth:`kill_primary`).
        standby: the synchronous standby (the primary after :meth:`promote`).
    """

    def __init__(self) -> None:
        for tool in ("initdb", "pg_ctl", "pg_basebackup"):
            if not (PG_BIN / tool).exists():
                _skip_or_fail(
                    f"{tool} not found in {PG_BIN} (set RATCHET_TEST_PG_BIN to PostgreSQL's "
                    "bin directory); the failover test starts its own primary and standby"
                )
        self.run_as: list[str] = []
        owner: tuple[int, int] | None = None
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                _skip_or_fail("running as root and there is no 'postgres' user to run initdb as")
            runuser = shutil.which("runuser")
            if runuser is None:
                _skip_or_fail("running as root and runuser(1) is not available for initdb")
            self.run_as = [str(runuser), "-u", "postgres", "--"]
            owner = (pw.pw_uid, pw.pw_gid)
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-pgpair-"))
        if owner is not None:
            os.chown(self.dir, *owner)
        self.sock = self.dir / "sock"
        p1, p2 = _free_ports(2)
        self.primary = Node(self, "primary", p1)
        self.standby = Node(self, "standby", p2)

    def run(self, *cmd: str, timeout_s: float = 120.0) -> str:
        """Run a server binary (as ``postgres`` when root); raise with its output on failure."""
        proc = subprocess.run(
            [*self.run_as, *cmd], capture_output=True, text=True, timeout=timeout_s,
            cwd=str(self.dir), stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                f"{self.logs()[-4000:]}"
            )
        return proc.stdout

    def hosts_url(self, **params: str) -> str:
        """The multi-host URL a client uses: primary first, then standby, with ``params``
        as the query (e.g. ``target_session_attrs``, ``durability``, ``schema``)."""
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/postgres" + (f"?{query}" if query else "")
        )

    def setup(self, timeout_s: float = 60.0) -> None:
        """Create and start both nodes; return once the standby streams synchronously.

        Raises:
            RuntimeError: a server binary failed (its output and the server logs attached).
            ConditionTimeout: the standby was not ``sync`` within ``timeout_s`` seconds.
        """
        self.run("mkdir", "-p", str(self.sock))
        self.run(
            str(PG_BIN / "initdb"), "-D", str(self.primary.data), "-U", "postgres",
            "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        # initdb's trust pg_hba.conf already lets 127.0.0.1 connect for replication.
        self.primary.start(
            "wal_level=replica", "max_wal_senders=5", "max_replication_slots=5",
            f"synchronous_standby_names={STANDBY_NAME}",
        )  # fmt: skip
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user=postgres "
            f"application_name={STANDBY_NAME}"
        )
        self.run(
            str(PG_BIN / "pg_basebackup"), "-D", str(self.standby.data), "-d", conninfo,
            "-R", "-X", "stream", "-c", "fast", "-C", "-S", SLOT, "--no-sync",
        )  # fmt: skip
        # -R wrote primary_conninfo from the connection it used; say it explicitly so the
        # application_name that synchronous_standby_names matches is not left to chance.
        with (self.standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{conninfo}'\nprimary_slot_name = '{SLOT}'\n")
        self.standby.start("hot_standby=on", "wal_receiver_status_interval=1s")
        self.wait_sync(timeout_s)

    def sync_state(self) -> tuple[str, str] | None:
        """``(state, sync_state)`` of the standby in the primary's ``pg_stat_replication``."""
        with self.primary.connect() as conn:
            row = conn.execute(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def wait_sync(self, timeout_s: float) -> None:
        """Wait until the standby is ``streaming`` and ``sync`` on the primary."""
        wait_for(
            "the standby to stream as the synchronous standby",
            lambda: self.sync_state() == ("streaming", "sync"),
            timeout_s=timeout_s, interval_s=0.1,
        )  # fmt: skip

    def kill_primary(self) -> list[int]:
        """SIGKILL the primary's postmaster and its children (see :meth:`Node.kill9`)."""
        victims = self.primary.kill9()
        assert victims, "the primary was not running"
        wait_for("the primary's processes to be gone",
                 lambda: not any(_alive(p) for p in victims), timeout_s=10, interval_s=0.02)
        return victims

    def promote(self) -> None:
        """``pg_ctl promote -w``: the standby leaves recovery and accepts writes."""
        self.run(str(PG_BIN / "pg_ctl"), "-D", str(self.standby.data), "-w", "-t", "60",
                 "promote")

    def logs(self) -> str:
        return "\n".join(
            f"===== PostgreSQL {node.name} log (port {node.port})\n{node.server_log()[-20000:]}"
            for node in (self.primary, self.standby)
        )

    def destroy(self) -> None:
        """SIGKILL what is left of both nodes (their postmasters and children), remove the
        directory."""
        try:
            victims = [pid for node in (self.primary, self.standby) for pid in node.kill9()]
            with contextlib.suppress(Exception):
                wait_for("the pair's server processes to be gone",
                         lambda: not any(_alive(p) for p in victims), timeout_s=10,
                         interval_s=0.05)  # fmt: skip
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def replicated_pair() -> Iterator[ReplicatedPair]:
    """A started :class:`ReplicatedPair`, destroyed afterwards (also when setup fails)."""
    pair = ReplicatedPair()
    try:
        started = time.monotonic()
        pair.setup()
        print(f"primary :{pair.primary.port} + sync standby :{pair.standby.port} ready in "
              f"{time.monotonic() - started:.1f} s")
        yield pair
    finally:
        pair.destroy()
