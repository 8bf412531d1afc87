"""``ratchet.testing``: what your own test suite needs to prove a task runs exactly once.

* process control of real ``ratchet worker`` subprocesses (:class:`ProcessGroup`,
  :class:`WorkerProcess`: holder name, SIGKILL / SIGSTOP / SIGCONT / SIGTERM, logs) and
  :func:`wait_for` (poll a condition with a deadline, never a fixed sleep);
* a counting external service over real HTTP on loopback, in its own process with its own
  SQLite file (:func:`start_counting_service`, :class:`CountingClient`): honours the
  idempotency key or not, has a lookup endpoint, injects lost replies, 503 bursts and
  slow replies, and counts every execution per key;
* the checks (:func:`check_exactly_once`, :func:`check_ledger_consistent`): one
  implementation on both ledgers, returning a report and raising :class:`CheckFailed`
  (an ``AssertionError``) with every violation listed;
* a steppable, freezable ledger clock (:func:`inject_clock`, :class:`LedgerClock`, from
  :mod:`ratchet.testing.clock`);
* test doubles (:class:`LedgerProxy`: counts, delays or fails chosen calls of a ledger;
  :func:`fast_retry_policy`, from :mod:`ratchet.testing.doubles`);
* the ledger contract suite every dialect passes (:mod:`ratchet.testing.contract`, not
  imported here: it needs pytest);
* :func:`replay` (:func:`replay_sample`): run a task's function against its recorded
  history, nothing external called, and report where it diverges (from
  :mod:`ratchet.replay`);
* an in-process worker for pytest (:func:`running_worker`, :func:`worker_fixture`, from
  :mod:`ratchet.testing.worker`).

The how-to page: [Testing your tasks](../how-to/testing.md) (``docs/how-to/testing.md``).
"""

from __future__ import annotations

from ..replay import Divergence, ReplayReport, replay, replay_sample
from .checks import (
    CheckFailed,
    ConsistencyReport,
    ExactlyOnceReport,
    check_exactly_once,
    check_ledger_consistent,
    list_task_ids,
    pause_outside_write_lock,
    sqlite_write_locked,
)
from .clock import LedgerClock, inject_clock
from .doubles import LedgerProxy, fast_retry_policy
from .processes import (
    ConditionTimeout,
    ManagedProcess,
    ProcessGroup,
    WorkerProcess,
    clean_env,
    wait_for,
)
from .services import (
    CountingClient,
    CountingService,
    FaultSettings,
    ServiceError,
    ServiceRecords,
    read_records,
    read_stored,
    start_counting_service,
)
from .worker import WorkerCrashed, running_worker, worker_fixture

__all__ = [
    "CheckFailed",
    "ConditionTimeout",
    "ConsistencyReport",
    "CountingClient",
    "CountingService",
    "Divergence",
    "ExactlyOnceReport",
    "FaultSettings",
    "LedgerClock",
    "LedgerProxy",
    "ManagedProcess",
    "ProcessGroup",
    "ReplayReport",
    "ServiceError",
    "ServiceRecords",
    "WorkerCrashed",
    "WorkerProcess",
    "check_exactly_once",
    "check_ledger_consistent",
    "clean_env",
    "fast_retry_policy",
    "inject_clock",
    "list_task_ids",
    "read_records",
    "read_stored",
    "replay",
    "replay_sample",
    "pause_outside_write_lock",
    "sqlite_write_locked",
    "start_counting_service",
    "running_worker",
    "wait_for",
    "worker_fixture",
]
