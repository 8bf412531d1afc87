"""Where the matrix runs: fresh worlds (a ledger of their own each, on the dialect the user
named), the crash-free control runs every row is compared with, and a row's context.

A world's ledger is never the user's: on SQLite a fresh file in a directory the run created
(next to the file the URL names, or in a temporary directory), on PostgreSQL a private
schema ``ratchet_matrix_<random>_<n>`` on the server the URL names, dropped at the end. The
URL's other parameters (durability, pool and libpq settings) are kept.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...config import parse_ledger_url
from ...errors import ConfigError, LedgerUnavailable
from ...states import State
from ..counting.process import CountingService, start_counting_service
from .app import CHARGE, DELIVER
from .rig import MatrixRig, expect

log = logging.getLogger("ratchet.testing.matrix")

_DROP_WAIT_S = 10.0
"""How long :meth:`Worlds.close` keeps trying to drop the run's schemas, seconds."""

__all__ = ["BATCH_PARAMS", "CHARGE_PARAMS", "Control", "Controls", "RowContext", "Worlds",
           "pg_connection"]

CHARGE_PARAMS: dict[str, Any] = {"order_id": "o-1", "amount_cents": 1234}
"""The params of the charge every charge row submits."""

BATCH_PARAMS: dict[str, Any] = {"n": 40, "size": 10, "parallel": 2}
"""The params of the batch task of row 9 (four batches of ten items, two in flight)."""


@dataclass(frozen=True)
class Control:
    """A crash-free run of one task: its result, step runs and executions per key."""

    result: Any
    step_runs: dict[str, int]
    executions: dict[str, int]
    items: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def pg_connection(ledger_url: str) -> Iterator[Any]:
    """An autocommit psycopg connection to the server of a PostgreSQL ``ledger_url``, its
    ``search_path`` set to the URL's schema.

    Raises:
        ConfigError: psycopg is not installed.
    """
    try:
        import psycopg
        from psycopg import sql

        from ...ledger.postgres import libpq_url
    except ImportError as exc:
        raise ConfigError(f"a PostgreSQL ledger needs psycopg 3 ({exc}); install it with: "
                          "pip install 'ratchet[postgres]'") from exc
    config = parse_ledger_url(ledger_url)
    with psycopg.connect(libpq_url(config), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(
            sql.Identifier(config.options.get("schema", "ratchet"))))
        yield conn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@dataclass
class Controls:
    """The control runs of one matrix run, by name, made once (under ``lock``)."""

    runs: dict[str, Control] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Worlds:
    """Makes fresh worlds on the dialect of ``ledger_url`` and removes them all at
    :meth:`close`.

    Args:
        ledger_url: the user's ledger URL (``None``: SQLite in a temporary directory). Only
            its dialect, server and parameters are used; its own file or schema is never
            touched.
        lease_s: lease of the tasks of every world, seconds.
        async_bodies: the worlds' workers run the charge task as an ``async def`` body
            (``MATRIX_ASYNC=1``): the same checkpoints, awaited on the worker's event loop.

    Raises:
        ConfigError: a malformed URL, or one that is neither SQLite nor PostgreSQL.
        LedgerUnavailable: the directory or the PostgreSQL server cannot be used.
    """

    def __init__(self, ledger_url: str | None, lease_s: float = 1.0,
                 async_bodies: bool = False) -> None:
        self.lease_s = lease_s
        self.async_bodies = async_bodies
        self.token = secrets.token_hex(4)
        self.schemas: list[str] = []
        self.rigs: list[MatrixRig] = []
        self._n = 0
        self._lock = threading.Lock()
        self.service: CountingService | None = None
        if ledger_url is None:
            self.base = "sqlite:///ledger.db"
            self.root = Path(tempfile.mkdtemp(prefix="ratchet-matrix-"))
            self.dialect = "sqlite"
            return
        config = parse_ledger_url(ledger_url)
        self.dialect = config.scheme
        self.base = config.url
        if config.scheme == "sqlite":
            parent = Path(config.path).expanduser().resolve().parent
            try:
                self.root = Path(tempfile.mkdtemp(prefix="ratchet-matrix-", dir=parent))
            except OSError as exc:
                raise LedgerUnavailable(
                    f"cannot make a directory for the matrix's ledger files in {parent}: "
                    f"{_first_line(exc)}") from exc
            return
        if config.scheme != "postgresql":
            raise ConfigError(f"the crash matrix runs on sqlite:// or postgresql:// ledgers, "
                              f"not {config.scheme}://")
        self._pg(lambda conn: conn.execute("SELECT 1"))
        self.root = Path(tempfile.mkdtemp(prefix="ratchet-matrix-"))

    def _pg(self, body: Callable[[Any], Any]) -> None:
        """Run ``body(connection)`` on an autocommit connection to the user's server.

        Raises:
            ConfigError: psycopg is not installed.
            LedgerUnavailable: no connection, or the statement failed.
        """
        try:
            import psycopg

            from ...ledger.postgres import libpq_url
        except ImportError as exc:
            raise ConfigError(f"a PostgreSQL ledger needs psycopg 3 ({exc}); install it with: "
                              "pip install 'ratchet[postgres]'") from exc
        conninfo = libpq_url(parse_ledger_url(self.base))
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                body(conn)
        except psycopg.Error as exc:
            raise LedgerUnavailable(
                f"PostgreSQL at {urlsplit(conninfo).hostname or 'the local socket'} cannot be "
                f"used: {_first_line(exc)}") from exc

    def url(self, name: str) -> str:
        """A fresh ledger URL for the world called ``name``."""
        with self._lock:
            self._n += 1
            return self._url(name, self._n)

    def _url(self, name: str, n: int) -> str:
        parts = urlsplit(self.base)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                 if k != "schema"]
        if self.dialect == "sqlite":
            path = self.root / f"{n:02d}-{name}.db"
            return f"sqlite:///{path}" + (f"?{urlencode(query)}" if query else "")
        schema = f"ratchet_matrix_{self.token}_{n}"
        self.schemas.append(schema)
        query.append(("schema", schema))
        return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))

    def world(self, name: str) -> MatrixRig:
        """A fresh world (its own ledger, step log, process logs); closed by :meth:`close`."""
        url = self.url(name)
        directory = self.root / f"{name}-{secrets.token_hex(3)}"
        directory.mkdir(parents=True)
        with self._lock:
            if self.service is None:
                self.service = start_counting_service(
                    self.root / "service.db", honour_keys=False,
                    log_path=self.root / "service.log")
            rig = MatrixRig(directory, url, lease_s=self.lease_s, service=self.service,
                            world=f"{directory.name}/", async_bodies=self.async_bodies)
            self.rigs.append(rig)
        return rig

    def release(self, rig: MatrixRig) -> None:
        """Stop what ``rig`` started (its ledger stays until :meth:`close`)."""
        rig.cleanup()

    def kill_all(self) -> None:
        """SIGKILL every process of every world now (an interrupted run)."""
        with self._lock:
            rigs = list(self.rigs)
        for rig in rigs:
            rig.procs.cleanup()

    def close(self) -> None:
        """Clean every world up: kill its processes, drop its schema, remove its files."""
        for rig in self.rigs:
            with contextlib.suppress(Exception):
                rig.cleanup()
        if self.service is not None:
            self.service.stop()
        if self.schemas:
            from psycopg import sql  # psycopg is there: the schemas were made with it

            def drop(conn: Any) -> None:
                for schema in self.schemas:
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                        sql.Identifier(schema)))

            # A drop can fail while a killed world's backend still holds its locks (the
            # server ends it a moment later): try again for a while before leaving it.
            deadline = time.monotonic() + _DROP_WAIT_S
            while True:
                try:
                    self._pg(drop)
                    break
                except LedgerUnavailable as exc:
                    if time.monotonic() >= deadline:
                        log.warning("crash matrix: could not drop its schemas %s: %s",
                                    ", ".join(self.schemas), exc)
                        break
                    time.sleep(0.2)  # a retry of the drop, not a wait before a check
        shutil.rmtree(self.root, ignore_errors=True)


class RowContext:
    """What a row's function gets: fresh worlds, the control runs, the broker of the run
    (:attr:`broker`: the ``--broker`` URL, ``None`` when none was given) and the counts to
    report (fill :attr:`counts` with what the external side counted)."""

    def __init__(self, worlds: Worlds, controls: Controls, broker: str | None = None) -> None:
        self.worlds = worlds
        self.broker = broker
        self._controls = controls.runs
        self._control_lock = controls.lock
        self.counts: dict[str, Any] = {}
        self.opened: list[MatrixRig] = []

    def world(self, name: str) -> MatrixRig:
        """A fresh world for this row (see :meth:`Worlds.world`)."""
        rig = self.worlds.world(name)
        self.opened.append(rig)
        return rig

    def control_charge(self) -> Control:
        """The crash-free run of the charge (cached for the whole matrix).

        Raises:
            RowFailed: the control run itself did not end as expected.
        """
        with self._control_lock:
            return self._control_charge()

    def _control_charge(self) -> Control:
        if "charge" not in self._controls:
            rig = self.world("control-charge")
            rig.start_service()
            task_id = rig.app.submit(CHARGE, CHARGE_PARAMS).task_id
            worker = rig.worker("control")
            info = rig.wait_state(task_id)
            expect(info.state is State.SUCCEEDED, f"the control run ended {info.state.value}")
            expect(worker.stop() == 0, "the control worker did not stop cleanly")
            self._controls["charge"] = Control(info.result, rig.step_counts(task_id),
                                               rig.executions())
            self.worlds.release(rig)
        return self._controls["charge"]

    def control_batches(self) -> Control:
        """The crash-free run of row 9's batch task (cached for the whole matrix).

        Raises:
            RowFailed: the control run itself did not end as expected.
        """
        with self._control_lock:
            return self._control_batches()

    def _control_batches(self) -> Control:
        if "batches" not in self._controls:
            rig = self.world("control-batches")
            rig.start_service()
            task_id = rig.app.submit(DELIVER, BATCH_PARAMS).task_id
            worker = rig.worker("control")
            info = rig.wait_state(task_id)
            expect(info.state is State.SUCCEEDED, f"the control run ended {info.state.value}")
            expect(worker.stop() == 0, "the control worker did not stop cleanly")
            self._controls["batches"] = Control(
                info.result, {}, {k.split("@")[1]: v for k, v in rig.executions().items()},
                rig.items())
            self.worlds.release(rig)
        return self._controls["batches"]
