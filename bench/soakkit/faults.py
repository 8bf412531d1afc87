"""The soak's processes (workers and relays, each in a slot that is restarted after a kill)
and the fault schedule run during the drain.

The schedule is planned over the feed's duration (tasks are submitted over that time, so
the drain lasts at least as long and every fault lands in it): SIGKILLs spread evenly (the
worker is started again at once), SIGSTOPs longer than the lease followed by SIGCONT,
``pg_terminate_backend`` of the ledger's sessions (by ``application_name``), one server
restart, one partition of a namespace from the database longer than the lease, and relay
SIGKILLs when relays run. Each injected fault is counted by kind.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ratchet.testing import ManagedProcess

from .cluster import PgServer
from .netns import Namespace

__all__ = ["FaultPlan", "FaultRunner", "Slot", "plan_faults"]


@dataclass
class Slot:
    """A place for one long-running process (a worker or a relay) and how to start it."""

    name: str
    kind: str
    start: Callable[[Slot], ManagedProcess]
    ns: Namespace | None = None
    proc: ManagedProcess | None = None
    stopped: bool = False
    starts: int = 0
    exits: list[int | None] = field(default_factory=list)

    def spawn(self) -> None:
        """Start (or start again) the slot's process."""
        self.starts += 1
        self.proc = self.start(self)

    def kill_and_restart(self) -> None:
        """SIGKILL the process, reap it and start a new one at once."""
        if self.proc is not None:
            self.proc.signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.exits.append(self.proc.popen.wait(timeout=10))
        self.stopped = False
        self.spawn()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass(frozen=True)
class FaultPlan:
    """How many faults of each kind, and their lengths (seconds)."""

    kills: int
    stops: int
    pg_terminates: int
    pg_restarts: int
    partitions: int
    relay_kills: int
    stop_s: float
    partition_s: float


def plan_faults(quick: bool, lease_s: float, relays: int) -> FaultPlan:
    """The fault counts of a run: ``--quick`` a few of each, else at least 50 kills."""
    stop_s, partition_s = lease_s + 2.0, 2 * lease_s + 2.0
    if quick:
        return FaultPlan(8, 2, 3, 1, 1, 2 if relays else 0, stop_s, partition_s)
    return FaultPlan(60, 8, 12, 1, 1, 8 if relays else 0, stop_s, partition_s)


class FaultRunner:
    """Runs a :class:`FaultPlan` over ``duration_s`` in a thread; counts what it injected.

    Args:
        plan: the faults.
        duration_s: the window they are spread over, from :meth:`start`.
        workers: the worker slots (kills and stops pick among them).
        relays: the relay slots (may be empty).
        server: the PostgreSQL server (terminations and the restart).
        app_name: ``application_name`` of the ledger's sessions.
        namespaces: where a partition may cut (empty: no partition, the reason given).
        no_partition_reason: why there is no partition.
        seed: random seed of the choices.
        log: where to print one line per fault.
    """

    def __init__(self, plan: FaultPlan, duration_s: float, workers: Sequence[Slot],
                 relays: Sequence[Slot], server: PgServer, app_name: str,
                 namespaces: Sequence[Namespace], no_partition_reason: str | None,
                 seed: int, log: Callable[[str], None]) -> None:
        self.plan, self.duration_s = plan, duration_s
        self.workers, self.relays = list(workers), list(relays)
        self.server, self.app_name = server, app_name
        self.namespaces = list(namespaces)
        self.skipped: dict[str, str] = {}
        if not self.namespaces:
            self.skipped["partition"] = no_partition_reason or "no namespaces"
        if not self.relays:
            self.skipped["relay_kill"] = "no relay runs"
        self.rng = random.Random(seed)
        self.log = log
        self.injected: Counter[str] = Counter()
        self.errors: list[str] = []
        self.terminated_sessions = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._timers: list[threading.Thread] = []
        self.t0 = 0.0

    def events(self) -> list[tuple[float, str]]:
        """The planned ``(seconds from start, kind)`` list, in time order."""
        p, d, out = self.plan, self.duration_s, []

        def spread(n: int, kind: str, lo: float = 0.03, hi: float = 0.92) -> None:
            for i in range(n):
                at = lo + (hi - lo) * (i + self.rng.uniform(0.2, 0.8)) / max(n, 1)
                out.append((at * d, kind))

        spread(p.kills, "kill")
        spread(p.stops, "stop", 0.05, 0.85)
        spread(p.pg_terminates, "pg_terminate")
        if "relay_kill" not in self.skipped:
            spread(p.relay_kills, "relay_kill")
        out += [(0.45 * d, "pg_restart")] * p.pg_restarts
        if "partition" not in self.skipped:
            out += [(0.62 * d, "partition")] * p.partitions
        return sorted(out)

    def start(self) -> None:
        """Start the schedule now."""
        self.t0 = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Stop injecting; SIGCONT stopped workers, heal partitions, wait for the ends."""
        self._stop.set()
        self._thread.join(timeout=60)
        for t in self._timers:
            t.join(timeout=60)
        self.undo_all()

    def undo_all(self) -> None:
        """SIGCONT every stopped worker, heal every partition (idempotent)."""
        for slot in self.workers:
            if slot.stopped and slot.proc is not None:
                slot.proc.signal(signal.SIGCONT)
                slot.stopped = False
        for ns in self.namespaces:
            if ns.partitioned:
                with contextlib.suppress(Exception):
                    ns.heal()

    def _run(self) -> None:
        for at, kind in self.events():
            if self._stop.wait(max(0.0, self.t0 + at - time.monotonic())):
                return
            try:
                getattr(self, f"_do_{kind}")()
            except Exception as exc:  # a fault that failed is reported, the soak goes on
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
                self.log(f"fault {kind} failed: {exc}")

    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        def run() -> None:
            self._stop.wait(delay_s)
            fn()
        t = threading.Thread(target=run, daemon=True)
        self._timers.append(t)
        t.start()

    def _note(self, kind: str, what: str) -> None:
        self.injected[kind] += 1
        self.log(f"[{time.monotonic() - self.t0:6.1f}s] {kind}: {what}")

    def _running(self) -> list[Slot]:
        return [s for s in self.workers if s.alive() and not s.stopped]

    def _do_kill(self) -> None:
        with self.lock:
            live = self._running()
            if not live:
                return
            slot = self.rng.choice(live)
            slot.kill_and_restart()
        self._note("sigkill", slot.name)

    def _do_relay_kill(self) -> None:
        slot = self.rng.choice(self.relays)
        slot.kill_and_restart()
        self._note("relay_sigkill", slot.name)

    def _do_stop(self) -> None:
        with self.lock:
            live = self._running()
            if len(live) < 2:
                return
            slot = self.rng.choice(live)
            assert slot.proc is not None
            slot.proc.signal(signal.SIGSTOP)
            slot.stopped = True
            proc = slot.proc
        self._note("sigstop", f"{slot.name} for {self.plan.stop_s:.1f}s")

        def cont() -> None:
            with self.lock:
                proc.signal(signal.SIGCONT)
                if slot.proc is proc:
                    slot.stopped = False
        self._later(self.plan.stop_s, cont)

    def _do_pg_terminate(self) -> None:
        rows = self.server.sql(
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()", self.app_name)
        n = sum(1 for _, ok in rows if ok)
        self.terminated_sessions += n
        self._note("pg_terminate", f"{n} ledger session(s)")

    def _do_pg_restart(self) -> None:
        def run() -> None:
            t = time.monotonic()
            try:
                self.server.restart()
            except Exception as exc:
                self.errors.append(f"pg_restart: {exc}")
                self.log(f"pg_restart failed: {exc}; making sure the server runs")
                self.server.ensure_running()
                return
            self._note("pg_restart", f"{self.server.restart_kind}, {time.monotonic() - t:.1f}s")
        t = threading.Thread(target=run, daemon=True)
        self._timers.append(t)
        t.start()

    def _do_partition(self) -> None:
        ns = self.rng.choice(self.namespaces)
        ns.partition()
        self._note("partition", f"{ns.name} cut from the database for "
                                f"{self.plan.partition_s:.1f}s")

        def heal() -> None:
            ns.heal()
            self.log(f"[{time.monotonic() - self.t0:6.1f}s] healed {ns.name}")
        self._later(self.plan.partition_s, heal)

    def shortfall(self) -> list[str]:
        """Kinds whose planned count was not injected (skipped kinds excepted)."""
        p = self.plan
        want = {"sigkill": p.kills, "sigstop": p.stops, "pg_terminate": p.pg_terminates,
                "pg_restart": p.pg_restarts, "partition": p.partitions,
                "relay_sigkill": p.relay_kills}
        short = []
        for kind, n in want.items():
            if kind in self.skipped or (kind == "relay_sigkill" and not self.relays):
                continue
            if self.injected[kind] < n:
                short.append(f"{kind} {self.injected[kind]}/{n}")
        return short
