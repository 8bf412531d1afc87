"""The registries: worker processes (:class:`WorkerInfo`) and the task definitions they
register (DESIGN §8), with the backlog per pinned version."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DefinitionChange",
    "DefinitionRecord",
    "DefinitionSpec",
    "VersionBacklog",
    "WorkerInfo",
    "WorkerSlots",
]


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One worker process in the registry (fast takeover of dead holders).

    Attributes:
        holder: the worker's lease-holder identity (unique per process start).
        host_id: identity of the host *and* PID namespace the process runs in (machine id,
            boot id, pid namespace): two workers with the same ``host_id`` can see each
            other's processes, so one may judge whether the other is alive.
        hostname: for people.
        pid: the process id, within ``host_id``'s PID namespace.
        pid_start: the process start time as the kernel reports it (``/proc/PID/stat``
            field 22, clock ticks since boot), so a recycled pid is not mistaken for the
            worker; ``None`` where unknown.
        started_at, last_seen: ledger clock, epoch seconds (``last_seen`` is the last
            registry heartbeat).
        state: ``alive``, ``stopped`` (clean exit) or ``dead`` (revoked).
    """

    holder: str
    host_id: str
    hostname: str
    pid: int
    pid_start: str | None
    started_at: float = 0.0
    last_seen: float = 0.0
    state: str = "alive"


@dataclass(frozen=True, slots=True)
class DefinitionSpec:
    """One definition a worker registers (:meth:`Ledger.register_definitions`).

    Attributes:
        name, version: the task type and its definition version.
        spec_json: the definition's spec as JSON text (``TaskDefinition.spec()``: retry
            policy, ``lease_s``, params JSON Schema; extensible).
    """

    name: str
    version: int
    spec_json: str


@dataclass(frozen=True, slots=True)
class DefinitionChange:
    """A registration that replaced a different stored spec of the same (name, version).

    Attributes:
        name, version: the definition.
        differences: the top-level spec keys whose values differ, sorted.
        old_spec_json, new_spec_json: the spec before and after.
    """

    name: str
    version: int
    differences: tuple[str, ...]
    old_spec_json: str
    new_spec_json: str


@dataclass(frozen=True, slots=True)
class DefinitionRecord:
    """One stored definition (:meth:`Ledger.definitions`).

    Attributes:
        name, version: the definition.
        spec_json: its spec, JSON text.
        first_registered_at, last_registered_at: ledger clock, epoch seconds.
        live_workers: workers alive in the registry, seen within the liveness window,
            that have this (name, version).
    """

    name: str
    version: int
    spec_json: str
    first_registered_at: float
    last_registered_at: float
    live_workers: int = 0


@dataclass(frozen=True, slots=True)
class VersionBacklog:
    """Ready tasks (``PENDING`` / ``RETRY_WAIT``) of one (name, version).

    Attributes:
        name, version: the pinned definition.
        ready: how many are ready or scheduled (``run_at`` may be in the future).
        oldest_run_at: the earliest ``run_at`` among them, epoch seconds.
        live_workers: live registered workers that have this version (0: the tasks wait
            until one starts).
    """

    name: str
    version: int
    ready: int
    oldest_run_at: float
    live_workers: int


@dataclass(frozen=True, slots=True)
class WorkerSlots:
    """A live worker's slots and the task types it serves (:meth:`Ledger.live_worker_slots`,
    the capacity figures of ``ratchet status``).

    Attributes:
        holder: the worker's identity.
        slots: its concurrency (task threads) as it recorded it
            (:meth:`Ledger.record_worker_slots`), None when it recorded none (a worker of
            an older release).
        names: the task types it registered (each once, whatever versions it runs),
            sorted. Its slots are shared by all of them.
        queues: the queues it serves (``ratchet worker --queues``), sorted; None: every
            queue.
    """

    holder: str
    slots: int | None
    names: tuple[str, ...]
    queues: tuple[str, ...] | None = None
