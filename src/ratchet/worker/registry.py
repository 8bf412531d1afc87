"""Worker registry and fast takeover of dead holders on the same host.

Waiting a whole lease after a crash is the common weakness of task queues (an hour in some
rescuers, tens of seconds in others). A lease exists because, across hosts, nobody can tell
a dead worker from a slow one. On one host we can: the kernel knows whether a process
exists. So every worker registers itself in the ledger (``host_id``, pid, process start
time, heartbeat), and a :class:`Registrar` thread in every worker looks at the other
workers registered with *its own* ``host_id``; when one's process is gone, it revokes that
holder's leases in the ledger (:meth:`~ratchet.ledger.base.Ledger.revoke_holder`: a
conditional update that bumps each task's generation), and the tasks are claimable at once.

Rules:

* Only a worker with the same ``host_id`` judges a holder; ``host_id`` covers the machine,
  its boot and the PID namespace, so a container never judges another container's pids.
  Holders elsewhere are taken over only when their lease expires by the ledger's clock.
* "Gone" means no such pid, a zombie, or a pid whose start time differs from the
  registered one (the pid was recycled). A stopped (SIGSTOP) process is *not* gone.
  Existence is asked of the kernel (``kill(pid, 0)``); status and start time come from
  psutil.
* Being wrong is safe: a revoked holder that was in fact alive is fenced like any stale
  holder — its next write carries an old generation and changes nothing.
* Retention: once a minute each registrar deletes the rows of workers ``stopped`` or
  ``dead`` last seen more than :data:`REGISTRY_RETENTION_S` ago (``alive`` rows never;
  ``ratchet workers --prune-after AGE`` does the same on demand). A pruned dead holder
  that is in fact still running stays fenced: its heartbeat updates no row and it never
  registers again.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

import psutil

from ..errors import LedgerCorrupt, RatchetError
from ..ledger.base import Ledger, WorkerInfo
from .backoff import RepeatedFailure

__all__ = ["GONE_STATES", "REGISTRY_RETENTION_S", "SLOTS_REFRESH_S", "TOUCH_INTERVAL_S",
           "UNRESPONSIVE_FLOOR_S", "Registrar", "host_identity", "process_gone",
           "process_start_time", "process_state"]

log = logging.getLogger("ratchet.worker.registry")

REGISTRY_RETENTION_S = 86_400.0
"""Registry rows of ``stopped`` / ``dead`` workers are deleted this many seconds after their
last heartbeat (24 h)."""

SLOTS_REFRESH_S = 3600.0
"""Seconds between a worker's slots records (:meth:`Ledger.record_worker_slots`, written at
registration and again this often: a registry row written again by a restart of the
registry, or a failed first write, is set again within the hour)."""

TOUCH_INTERVAL_S = 5.0
"""Seconds between a worker's registry heartbeats (``last_seen``; its lease renewals move
``last_seen`` too)."""

UNRESPONSIVE_FLOOR_S = 2 * TOUCH_INTERVAL_S
"""An ``alive`` worker is shown unresponsive (``ratchet workers``) once its last heartbeat is
older than its lease, and never before this many seconds: two missed registry heartbeats
(an idle worker with a short lease touches the registry only every
:data:`TOUCH_INTERVAL_S`)."""


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


def host_identity() -> str:
    """``machine-id/boot-id/pid-namespace`` of this process (hostname where unknown).

    Two processes with the same identity see the same pids, so one may judge whether the
    other is alive. A reboot or another PID namespace gives another identity.
    """
    machine = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or socket.gethostname()
    boot = _read("/proc/sys/kernel/random/boot_id") or "boot?"
    try:
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pidns = "pidns?"
    return f"{machine}/{boot}/{pidns}"


def process_start_time(pid: int) -> str | None:
    """When process ``pid`` started, as psutil reports it (epoch seconds, ``"%.2f"``), or
    None if unknown (no such process, or hidden from us)."""
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return None


def _exists(pid: int) -> bool:
    """``kill(pid, 0)``: True when the process exists, even one we may not signal or see.

    Not ``psutil.pid_exists``: on Linux it falls back to listing ``/proc``, which under
    ``hidepid`` hides other users' live processes (they would look dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


GONE_STATES = frozenset({"gone", "zombie"})
""":func:`process_state` answers of a process that will never write again."""


def process_state(pid: int, start_time: str | None) -> str:
    """What the OS says of process ``pid`` (started at ``start_time``, if known).

    Returns:
        ``"gone"`` (no such process, dead, or another process on a recycled pid: its start
        time differs from ``start_time``), ``"zombie"`` (exited, not yet reaped),
        ``"stopped"`` (SIGSTOP / SIGTSTP: it runs nothing until continued),
        ``"tracing-stop"`` (stopped by a debugger), ``"disk-sleep"`` (waiting on I/O it
        cannot be interrupted in), or ``"running"`` (running, sleeping, idle: it can run).
        A process we cannot look at (``hidepid``, another user's) is ``"running"``. (A
        start time registered by an older Ratchet, in kernel clock ticks, never matches:
        such a holder is ``"gone"`` and revoked, which is safe — a live holder is fenced
        like any stale one.)
    """
    if not _exists(pid):
        return "gone"
    try:
        proc = psutil.Process(pid)
        status = proc.status()
        created = f"{proc.create_time():.2f}"
    except psutil.ZombieProcess:
        return "zombie"
    except psutil.NoSuchProcess:
        # kill(0) said it exists: either it died in between (look again) or psutil
        # cannot see it in /proc (hidepid), which is not death.
        return "running" if _exists(pid) else "gone"
    except psutil.AccessDenied:
        return "running"
    if status == psutil.STATUS_DEAD or (start_time is not None and created != start_time):
        return "gone"
    if status == psutil.STATUS_ZOMBIE:
        return "zombie"
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_DISK_SLEEP):
        return str(status)
    return "running"


def process_gone(pid: int, start_time: str | None) -> bool:
    """True when process ``pid`` (started at ``start_time``, if known) no longer runs
    (:func:`process_state` is ``gone`` or ``zombie``): a zombie will never write again; a
    stopped process is not gone."""
    return process_state(pid, start_time) in GONE_STATES


class Registrar(threading.Thread):
    """Registers this worker, heartbeats the registry, and revokes dead same-host holders.

    Args:
        ledger: the worker's ledger.
        holder: this worker's holder identity.
        scan_interval_s: seconds between looks at the other workers of this host (a dead
            holder's tasks are claimable within about this long plus one poll).
        touch_interval_s: seconds between registry heartbeats (``last_seen``).
        retention_s: stopped / dead rows last seen longer ago than this are deleted.
        prune_interval_s: seconds between those deletions.
        slots: this worker's concurrency (task threads), recorded at registration and every
            ``slots_refresh_s`` seconds for the capacity figures of ``ratchet status``;
            None records nothing.
        slots_refresh_s: seconds between those records (:data:`SLOTS_REFRESH_S`).
        queues: the queues this worker serves, recorded with its slots (None: every
            queue).
    """

    def __init__(
        self,
        ledger: Ledger,
        holder: str,
        scan_interval_s: float = 0.25,
        touch_interval_s: float = TOUCH_INTERVAL_S,
        retention_s: float = REGISTRY_RETENTION_S,
        prune_interval_s: float = 60.0,
        slots: int | None = None,
        slots_refresh_s: float = SLOTS_REFRESH_S,
        queues: Sequence[str] | None = None,
    ) -> None:
        super().__init__(name="ratchet-registry", daemon=True)
        self.ledger = ledger
        self.holder = holder
        self.host_id = host_identity()
        self.scan_interval_s = scan_interval_s
        self.touch_interval_s = touch_interval_s
        self.retention_s = retention_s
        self.prune_interval_s = prune_interval_s
        self.slots = slots
        self.queues = queues
        self.slots_refresh_s = slots_refresh_s
        self._slots_due = slots is not None  # until written (a failed write is tried again)
        self.revoked: dict[str, list[str]] = {}
        self._stop_event = threading.Event()
        self._registered = False
        # A ledger that stays unavailable: its first error and a summary now and then, not
        # a line per scan.
        self._failures = RepeatedFailure("worker registry", log, level=logging.WARNING)

    def info(self) -> WorkerInfo:
        """This worker's registry entry."""
        pid = os.getpid()
        return WorkerInfo(self.holder, self.host_id, socket.gethostname(), pid,
                          process_start_time(pid))

    def register(self) -> None:
        """Write this worker's entry, and its slots when it has them (called once before
        the first claim)."""
        self.ledger.register_worker(self.info())
        self._registered = True
        self._record_slots()

    def _record_slots(self) -> None:
        """Record this worker's slots (when it has them)."""
        if self.slots is not None:
            self.ledger.record_worker_slots(self.holder, self.slots, self.queues)
            self._slots_due = False

    def scan_once(self) -> dict[str, list[str]]:
        """Look at every live same-host worker once; revoke those whose process is gone.

        Returns:
            ``{holder: [task ids taken away]}`` for this scan.
        """
        revoked: dict[str, list[str]] = {}
        for worker in self.ledger.list_workers(self.host_id):
            if worker.holder == self.holder or worker.host_id != self.host_id:
                continue
            if not process_gone(worker.pid, worker.pid_start):
                continue
            reason = f"process {worker.pid} on {worker.hostname} is gone"
            tasks = self.ledger.revoke_holder(worker.holder, by=self.holder, reason=reason)
            revoked[worker.holder] = tasks
            self.revoked[worker.holder] = tasks
            log.warning(
                "revoked %d lease(s) of dead worker %s (%s)", len(tasks), worker.holder, reason
            )
        return revoked

    def run(self) -> None:
        since_touch = 0.0
        # The first prune at a random point of the first interval: workers started
        # together do not all write at once.
        since_prune = random.random() * self.prune_interval_s
        since_slots = 0.0
        while not self._stop_event.wait(self.scan_interval_s):
            try:
                if not self._registered:
                    self.register()
                self.scan_once()
                since_touch += self.scan_interval_s
                since_prune += self.scan_interval_s
                since_slots += self.scan_interval_s
                if self._slots_due or since_slots >= self.slots_refresh_s:
                    since_slots = 0.0
                    self._record_slots()
                if since_touch >= self.touch_interval_s:
                    since_touch = 0.0
                    self.ledger.touch_worker(self.holder)
                    self._failures.succeeded()  # a write: the reads alone may pass
                if since_prune >= self.prune_interval_s:
                    since_prune = 0.0
                    pruned = self.ledger.prune_workers(self.retention_s)
                    if pruned:
                        log.info("worker registry: pruned %d stopped/dead worker row(s)",
                                 len(pruned))
            except LedgerCorrupt:
                pass  # the worker's claim path reports it once, and stops the worker
            except RatchetError as exc:
                self._failures.failed(exc)

    def stop(self, clean: bool = True) -> None:
        """Stop the thread; on a clean exit mark this worker ``stopped`` in the registry."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)
        if clean and self._registered:
            try:
                self.ledger.touch_worker(self.holder, state="stopped")
            except LedgerCorrupt:  # said once already, by the worker's claim path
                log.warning("worker registry: could not mark %s stopped (corrupt ledger)",
                            self.holder)
            except RatchetError as exc:
                log.warning("worker registry: could not mark %s stopped: %s", self.holder, exc)
