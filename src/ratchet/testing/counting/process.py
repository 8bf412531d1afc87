"""Starting the counting service as its own process (``python -m <module>``, wait for
``READY <port>``) and the handle of a running one (stop it, read its file, get a client)."""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

from .client import CountingClient
from .protocol import ServiceError
from .records import ServiceRecords, TokenRejection, read_records, read_stored

__all__ = ["CountingService", "start_counting_service"]



class CountingService:
    """A running counting service process (see :func:`start_counting_service`).

    Attributes:
        port: the TCP port it listens on (loopback).
        db_path: its SQLite file.
        log_path: where its stderr goes.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, db_path: Path, log_path: Path
    ) -> None:
        self._proc = proc
        self.port = port
        self.db_path = db_path
        self.log_path = log_path

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The service's process id."""
        return self._proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self._proc.poll() is None

    def client(self, timeout_s: float = 1.0) -> CountingClient:
        """A new client of this service (close it, or use it as a context manager)."""
        return CountingClient(self.url, timeout_s=timeout_s)

    def records(self) -> ServiceRecords:
        """Executions, record ids and execution times, from the service's own file."""
        return read_records(self.db_path)

    def executions(self) -> dict[str, int]:
        """Executions per key, from the service's own file."""
        return read_records(self.db_path).executions

    def items(self) -> dict[str | int, int]:
        """How often each item was applied (the ``items`` of executed requests), from the
        service's own file."""
        return read_records(self.db_path).items

    def rejections(self) -> list[TokenRejection]:
        """Requests refused for a stale fencing token, in order, from the service's own file."""
        return read_records(self.db_path).rejections

    def stored(self) -> dict[str, dict[str, Any]]:
        """The stored record per key (``{"id", "key", "body", "created_at"}``)."""
        return read_stored(self.db_path)

    def log(self) -> str:
        """The service's stderr so far."""
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Stop the service: SIGTERM, wait up to ``timeout_s`` seconds, then SIGKILL.

        Returns:
            The exit status (negative: killed by that signal), or None if it cannot be reaped.
        """
        proc = self._proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=timeout_s)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return proc.poll()

    def __enter__(self) -> CountingService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} pid={self.pid} url={self.url} db={str(self.db_path)!r}>"


def start_counting_service(
    db_path: str | Path,
    *,
    honour_keys: bool = True,
    check_tokens: bool = False,
    reply_lost: float = 0.0,
    burst_503: float = 0.0,
    burst_len: int = 5,
    slow: float = 0.0,
    slow_s: float = 2.0,
    latency_s: float = 0.0,
    seed: int | None = None,
    port: int = 0,
    id_prefix: str = "ex_",
    ready_timeout_s: float = 30.0,
    log_path: str | Path | None = None,
    module: str = "ratchet.testing.services",
    extra_args: Sequence[str] = (),
) -> CountingService:
    """Spawn the service (``python -m <module>``) and wait until it prints ``READY <port>``.

    The child stops by itself when this process goes away (its stdin is a pipe from us).

    Args:
        db_path: the service's own SQLite file.
        honour_keys: deduplicate on ``Idempotency-Key`` (False: legacy, every POST executes).
        check_tokens: fenced mode (``--check-tokens``): refuse a stale ``Fencing-Token``.
        reply_lost: probability that an executed request's reply is dropped, in [0, 1].
        burst_503: probability that a request to ``/effects`` starts a 503 burst, in [0, 1].
        slow: probability that a POST sleeps ``slow_s`` before executing, in [0, 1].
        burst_len: 503 answers per burst.
        slow_s: sleep of a slow request, seconds.
        latency_s: mean processing time of every request, seconds.
        seed: fault RNG seed (None: random).
        port: TCP port (0: a free one).
        id_prefix: prefix of record ids.
        ready_timeout_s: how long to wait for ``READY``, seconds.
        log_path: file for the service's stderr (default ``<db_path>.log``).
        module: the module to run (one whose ``main`` accepts these options).
        extra_args: more command-line arguments for ``module`` (its own options, e.g. a
            service built on this one that does more than count).

    Returns:
        The running :class:`CountingService`.

    Raises:
        ServiceError: it exited or did not print ``READY`` in time (it is killed).
    """
    db = Path(db_path).resolve()
    log = Path(log_path) if log_path is not None else db.with_name(db.name + ".log")
    cmd = [
        sys.executable, "-m", module, "--port", str(port), "--db", str(db),
        "--reply-lost", repr(float(reply_lost)), "--burst-503", repr(float(burst_503)),
        "--burst-len", str(burst_len), "--slow", repr(float(slow)),
        "--slow-s", repr(float(slow_s)), "--latency-s", repr(float(latency_s)),
        "--id-prefix", id_prefix, "--exit-on-stdin-eof",
    ]  # fmt: skip
    if not honour_keys:
        cmd.append("--no-honour-keys")
    if check_tokens:
        cmd.append("--check-tokens")
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += [str(a) for a in extra_args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "ab") as log_file:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, env=env
        )
    lines: queue.Queue[bytes] = queue.Queue()
    stdout = cast(IO[bytes], proc.stdout)
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=ready_timeout_s)
    except queue.Empty:
        line = b""
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("READY "):
        proc.kill()
        proc.wait()
        tail = log.read_text("utf-8", "replace")[-2000:] if log.exists() else ""
        raise ServiceError(
            f"counting service did not become ready within {ready_timeout_s} s "
            f"(first line {text!r}, exit status {proc.poll()}); its stderr ({log}):\n{tail}"
        )
    return CountingService(proc, int(text.split()[1]), db, log)
