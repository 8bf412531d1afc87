"""Exactly-once and ledger-consistency checks, on either ledger, through the public API.

* :func:`check_exactly_once` compares what the ledger says (task states, effect records)
  with what the *external* service recorded (:class:`~ratchet.testing.services.ServiceRecords`,
  read from the service's own file): every succeeded task's effect executed exactly once,
  no key executed twice, no execution that no task accounts for, nothing left unfinished.
* :func:`check_ledger_consistent` checks the ledger's structural invariants (fencing
  generations, audit rows, leases) task by task.

Both read through :func:`ratchet.open_ledger` (``get_many``, ``timeline``); only where no API
exists do they look with read-only SQL (listing every task id; SQLite's integrity check).
Both return a report and, unless told otherwise, raise :class:`CheckFailed` — an
``AssertionError`` and a ``RatchetError`` — listing every violation.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import parse_ledger_url
from ..errors import ConfigError, LedgerUnavailable, RatchetError
from ..ledger import open_ledger
from ..ledger.base import EffectState, Ledger, TaskInfo, Timeline
from ..states import State
from .services import CountingService, ServiceRecords

__all__ = [
    "CheckFailed",
    "ConsistencyReport",
    "ExactlyOnceReport",
    "check_exactly_once",
    "check_ledger_consistent",
    "list_task_ids",
    "pause_outside_write_lock",
    "sqlite_write_locked",
]

_BUMPS = ("claim", "takeover", "revoke")
"""Audit kinds that each move a task's fencing generation up by one."""

MAX_LISTED = 10
"""Violations of one kind named in a message (the report holds all of them)."""


class CheckFailed(RatchetError, AssertionError):
    """A check found violations; ``report`` holds everything it saw."""

    def __init__(self, message: str, report: ExactlyOnceReport | ConsistencyReport) -> None:
        super().__init__(message)
        self.report = report


# ---------------------------------------------------------------------------- ledger access


@contextlib.contextmanager
def _ledger(ledger: str | Ledger) -> Iterator[Ledger]:
    if isinstance(ledger, str):
        opened = open_ledger(ledger, migrate=False, must_exist=True)
        try:
            yield opened
        finally:
            opened.close()
    else:
        yield ledger


def _pg_conninfo(url: str) -> tuple[str, str]:
    """``(libpq URL, schema)`` of a PostgreSQL ledger URL."""
    config = parse_ledger_url(url)
    try:
        from ..ledger.postgres import libpq_url
    except ImportError as exc:  # psycopg missing (an optional dependency)
        raise ConfigError(
            f"the PostgreSQL ledger needs psycopg 3 and psycopg_pool ({exc}); "
            "install them with: pip install 'ratchet[postgres]'"
        ) from exc
    return libpq_url(config), config.options.get("schema", "ratchet")


def list_task_ids(ledger_url: str) -> list[str]:
    """Every task id in the ledger at ``ledger_url``, oldest first by the ledger clock; tasks
    created in the same clock tick (one transaction; SQLite's clock has 1 ms resolution)
    come in id order, not submission order. Read-only SQL: the ledger API has no listing
    yet.

    Raises:
        ConfigError: malformed URL or an unsupported backend.
        LedgerUnavailable: the ledger cannot be read.
    """
    config = parse_ledger_url(ledger_url)
    query = "SELECT id FROM tasks ORDER BY created_at, id"
    if config.scheme == "sqlite":
        try:
            conn = sqlite3.connect(f"file:{config.path}?mode=ro", uri=True, timeout=30)
            try:
                return [str(r[0]) for r in conn.execute(query)]
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise LedgerUnavailable(f"cannot list the tasks of {config.path}: {exc}") from exc
    if config.scheme == "postgresql":
        import psycopg
        from psycopg import sql

        conninfo, schema = _pg_conninfo(ledger_url)
        try:
            with psycopg.connect(conninfo, connect_timeout=10) as pg:
                pg.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                pg.execute("SET TRANSACTION READ ONLY")
                return [str(r[0]) for r in pg.execute(query).fetchall()]
        except psycopg.Error as exc:
            raise LedgerUnavailable(f"cannot list the tasks of schema {schema!r}: {exc}") from exc
    raise ConfigError(f"unsupported ledger backend {config.scheme!r}")


def sqlite_write_locked(path: str | Path, timeout_s: float) -> bool:
    """True when some process holds the SQLite file's write lock for longer than
    ``timeout_s`` seconds (probed with ``BEGIN IMMEDIATE`` and an immediate rollback).

    A SQLite-only mechanic: a process frozen (SIGSTOP) *inside* a write transaction holds
    the single write lock, stalling every other writer; tests and the demo use this probe
    to avoid freezing a worker there. PostgreSQL locks rows, not the database.
    """
    conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


def pause_outside_write_lock(path: str | Path, pause: Callable[[], None],
                             timeout_s: float = 60.0) -> None:
    """Call ``pause`` (e.g. a worker's SIGSTOP) while this process holds the SQLite file's
    write lock, so that the paused process cannot be inside a write transaction: frozen
    there it would hold the lock and stall every other writer (see
    :func:`sqlite_write_locked`). Taking the lock waits for the transaction in progress,
    at most ``timeout_s`` seconds; it is released right after the pause.

    Raises:
        sqlite3.OperationalError: the lock was not free within ``timeout_s`` seconds.
    """
    conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            pause()
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def _sqlite_integrity(ledger_url: str) -> str | None:
    """SQLite's ``PRAGMA integrity_check`` verdict (None on another backend)."""
    config = parse_ledger_url(ledger_url)
    if config.scheme != "sqlite":
        return None
    conn = sqlite3.connect(f"file:{config.path}?mode=ro", uri=True, timeout=30)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _listed(items: Sequence[Any] | Mapping[str, Any]) -> str:
    if isinstance(items, Mapping):
        shown = [f"{k}: {v}" for k, v in list(items.items())[:MAX_LISTED]]
    else:
        shown = [str(i) for i in list(items)[:MAX_LISTED]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" (+{more} more)" if more > 0 else "")


# ---------------------------------------------------------------------------- exactly once


@dataclass
class ExactlyOnceReport:
    """What :func:`check_exactly_once` saw.

    Attributes:
        tasks: tasks checked.
        states: tasks per state (state value → count).
        executions: executions per key at the service (its own records).
        succeeded: succeeded tasks.
        succeeded_once: succeeded tasks whose every key executed exactly once.
        duplicated: keys executed more than once (key → executions).
        missing: succeeded tasks with a key never executed (task id → key).
        unexpected: executed keys no checked task accounts for (key → executions).
        not_terminal: tasks not SUCCEEDED, FAILED or CANCELLED (task id → state).
        mismatched: succeeded tasks whose recorded effect result does not name the
            service's record (task id → why).
        executed_not_succeeded: tasks not succeeded whose key executed (not a violation:
            an effect may precede a later failure; reported for the reader).
        violations: one line per broken rule; empty when everything holds.
    """

    tasks: int = 0
    states: dict[str, int] = field(default_factory=dict)
    executions: dict[str, int] = field(default_factory=dict)
    succeeded: int = 0
    succeeded_once: int = 0
    duplicated: dict[str, int] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)
    not_terminal: dict[str, str] = field(default_factory=dict)
    mismatched: dict[str, str] = field(default_factory=dict)
    executed_not_succeeded: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no rule is broken."""
        return not self.violations


def _records_of(service: ServiceRecords | CountingService | Mapping[str, int]) -> ServiceRecords:
    if isinstance(service, ServiceRecords):
        return service
    if isinstance(service, CountingService):
        return service.records()
    return ServiceRecords(dict(service), {}, [])


def check_exactly_once(
    ledger: str | Ledger,
    service: ServiceRecords | CountingService | Mapping[str, int],
    *,
    task_ids: Sequence[str] | None = None,
    keys: Mapping[str, str] | None = None,
    effect: str | None = None,
    result_id_field: str | None = None,
    require_terminal: bool = True,
    allow_unexpected: bool = False,
    raise_on_violation: bool = True,
    timelines: Mapping[str, Timeline] | None = None,
) -> ExactlyOnceReport:
    """Check that every effect happened exactly once, counted at the external service.

    Rules (each broken one is a violation):

    * no key executed more than once at the service;
    * every SUCCEEDED task's key(s) executed exactly once;
    * with ``require_terminal``: every task is SUCCEEDED, FAILED or CANCELLED;
    * unless ``allow_unexpected``: every executed key belongs to a checked task;
    * with ``result_id_field``: a succeeded task's DONE effect result carries the service's
      record id for its key under that field (the ledger recorded *the* execution).

    Args:
        ledger: a ledger URL (opened read-only, must exist) or an open ledger.
        service: the service's records (:meth:`CountingService.records`), the service
            itself, or a plain ``{key: executions}``.
        task_ids: the tasks to check (default: every task in the ledger).
        keys: task id → the effect key it must have executed once (default: the keys of
            the task's effect records in the ledger; a succeeded task with none is a
            violation when ``effect`` is named).
        effect: only effect records with this name count (default: all).
        result_id_field: see the rules (needs record ids: a ServiceRecords or service).
        require_terminal: unfinished tasks are a violation.
        allow_unexpected: executions of keys no checked task accounts for are allowed.
        raise_on_violation: raise :class:`CheckFailed` when a rule is broken.
        timelines: task id → its :meth:`~ratchet.ledger.base.Ledger.timeline`, when the
            caller has read them already (they are not read again).

    Returns:
        The :class:`ExactlyOnceReport`.

    Raises:
        CheckFailed: a rule is broken (with ``raise_on_violation``); lists the violations.
        LedgerUnavailable, TaskNotFound: the ledger cannot be read.
    """
    records = _records_of(service)
    report = ExactlyOnceReport(executions=dict(records.executions))
    with _ledger(ledger) as led:
        if task_ids is None:
            if not isinstance(ledger, str):
                raise TypeError("task_ids is required with an open ledger (pass the URL)")
            task_ids = list_task_ids(ledger)
        infos = led.get_many(list(task_ids))
        found = {i.task_id for i in infos}
        absent = [t for t in task_ids if t not in found]
        need_timeline = keys is None or result_id_field is not None
        known = dict(timelines or {})
        if need_timeline:
            for info in infos:
                if info.task_id not in known:
                    known[info.task_id] = led.timeline(info.task_id)
        timelines = known
    if absent:
        report.violations.append(f"{len(absent)} task(s) not in the ledger: {_listed(absent)}")
    report.tasks = len(infos)
    report.states = dict(Counter(i.state.value for i in infos))
    keys_of: dict[str, list[str]] = {}
    for info in infos:
        if keys is not None:
            keys_of[info.task_id] = [keys[info.task_id]] if info.task_id in keys else []
        else:
            keys_of[info.task_id] = [
                e.key
                for e in timelines[info.task_id].effects
                if effect is None or e.name == effect
            ]
    _judge(report, infos, keys_of, timelines, records, effect, result_id_field,
           require_terminal, allow_unexpected)  # fmt: skip
    if raise_on_violation and report.violations:
        raise CheckFailed(
            "exactly-once check failed:\n  " + "\n  ".join(report.violations), report
        )
    return report


def _judge(
    report: ExactlyOnceReport,
    infos: list[TaskInfo],
    keys_of: dict[str, list[str]],
    timelines: dict[str, Timeline],
    records: ServiceRecords,
    effect: str | None,
    result_id_field: str | None,
    require_terminal: bool,
    allow_unexpected: bool,
) -> None:
    executions = records.executions
    report.duplicated = {k: n for k, n in executions.items() if n > 1}
    accounted: set[str] = set()
    no_key: list[str] = []
    for info in infos:
        tid = info.task_id
        task_keys = keys_of[tid]
        accounted.update(task_keys)
        if not info.terminal:
            report.not_terminal[tid] = info.state.value
        if info.state is not State.SUCCEEDED:
            if any(executions.get(k) for k in task_keys):
                report.executed_not_succeeded.append(tid)
            continue
        report.succeeded += 1
        if not task_keys:
            if effect is not None:
                no_key.append(tid)
            continue
        bad = [k for k in task_keys if executions.get(k, 0) != 1]
        for k in bad:
            if executions.get(k, 0) == 0:
                report.missing[tid] = k
        if not bad:
            report.succeeded_once += 1
        if result_id_field is not None:
            why = _result_mismatch(timelines[tid], task_keys, records, effect, result_id_field)
            if why:
                report.mismatched[tid] = why
    report.unexpected = {k: n for k, n in executions.items() if k not in accounted}
    v = report.violations
    if report.duplicated:
        v.append(f"{len(report.duplicated)} key(s) executed more than once: "
                 f"{_listed(report.duplicated)}")  # fmt: skip
    if report.missing:
        v.append(f"{len(report.missing)} succeeded task(s) whose key never executed: "
                 f"{_listed(report.missing)}")  # fmt: skip
    if no_key:
        v.append(f"{len(no_key)} succeeded task(s) without a {effect!r} effect record: "
                 f"{_listed(no_key)}")  # fmt: skip
    if report.mismatched:
        v.append(f"{len(report.mismatched)} succeeded task(s) recorded another result than "
                 f"the service's: {_listed(report.mismatched)}")  # fmt: skip
    if require_terminal and report.not_terminal:
        v.append(f"{len(report.not_terminal)} task(s) not finished: "
                 f"{_listed(report.not_terminal)}")  # fmt: skip
    if not allow_unexpected and report.unexpected:
        v.append(f"{len(report.unexpected)} executed key(s) no task accounts for: "
                 f"{_listed(report.unexpected)}")  # fmt: skip


def _result_mismatch(
    timeline: Timeline,
    task_keys: list[str],
    records: ServiceRecords,
    effect: str | None,
    result_id_field: str,
) -> str | None:
    effects = [e for e in timeline.effects if effect is None or e.name == effect]
    for eff in effects:
        if eff.key not in task_keys:
            continue
        if eff.state is not EffectState.DONE:
            return f"effect {eff.name!r} is {eff.state.value}, not DONE"
        try:
            result = json.loads(eff.result_json or "null")
        except ValueError:
            return f"effect {eff.name!r} result is not JSON"
        got = result.get(result_id_field) if isinstance(result, dict) else None
        want = records.ids.get(eff.key)
        if got is None or got != want:
            return f"effect {eff.name!r} recorded {result_id_field}={got!r}, service has {want!r}"
    return None


# ---------------------------------------------------------------------------- consistency


@dataclass
class ConsistencyReport:
    """What :func:`check_ledger_consistent` saw.

    Attributes:
        tasks: tasks checked.
        integrity: SQLite's ``PRAGMA integrity_check`` verdict (None on PostgreSQL).
        violations: one line per broken invariant; empty when the ledger is consistent.
    """

    tasks: int = 0
    integrity: str | None = None
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no invariant is broken."""
        return not self.violations


def _task_violations(tl: Timeline) -> list[str]:
    task = tl.task
    tid, g = task.task_id, task.generation
    out: list[str] = []
    current = 0
    for ev in tl.events:  # in audit order
        if ev.kind in _BUMPS:
            if ev.generation != current + 1:
                out.append(f"{tid}: {ev.kind} row #{ev.seq} carries generation "
                           f"{ev.generation}, expected {current + 1}")  # fmt: skip
            current = ev.generation if ev.generation is not None else current + 1
        elif ev.kind == "stale_rejected":
            if ev.generation is None or ev.generation >= g:
                out.append(f"{tid}: stale_rejected row #{ev.seq} names generation "
                           f"{ev.generation}, not older than the task's {g}")  # fmt: skip
        elif ev.generation is not None and ev.generation > current:
            # A retirement (expired final attempt) bumps the generation in a transition row.
            if ev.generation != current + 1:
                out.append(f"{tid}: {ev.kind} row #{ev.seq} jumps the generation from "
                           f"{current} to {ev.generation}")  # fmt: skip
            current = ev.generation
    if current != g:
        out.append(f"{tid}: generation {g} but its audit rows account for {current}")
    for kind, rows in (("step", tl.steps), ("effect", tl.effects)):
        for row in rows:
            if not 1 <= row.generation <= g:
                out.append(f"{tid}: {kind} {row.name!r} written by generation "
                           f"{row.generation}, outside 1..{g}")  # fmt: skip
    if task.state is State.SUCCEEDED and (
        task.holder is not None or task.lease_until is not None or task.result is None
    ):
        out.append(f"{tid}: SUCCEEDED but holder={task.holder!r} "
                   f"lease_until={task.lease_until!r} result={task.result!r}")  # fmt: skip
    if task.state is State.RUNNING and (task.holder is None or task.lease_until is None):
        out.append(f"{tid}: RUNNING without a holder or lease")
    return out


def check_ledger_consistent(
    ledger_url: str,
    *,
    task_ids: Sequence[str] | None = None,
    raise_on_violation: bool = True,
    timelines: Mapping[str, Timeline] | None = None,
) -> ConsistencyReport:
    """Check the ledger's structural invariants, task by task (either backend).

    * SQLite: the file passes ``PRAGMA integrity_check``;
    * every bump of a task's fencing generation is audited, in order: its claim,
      takeover and revoke rows (and a retirement's transition row) carry 1..g, g being
      the task's generation;
    * every step and effect row was written by a claimed generation, never a newer one;
    * SUCCEEDED tasks hold no lease and have a result; RUNNING tasks have holder and lease;
    * every ``stale_rejected`` row names an older generation than the task's.

    Args:
        ledger_url: the ledger (opened read-only; it must exist).
        task_ids: tasks to check (default: every task).
        raise_on_violation: raise :class:`CheckFailed` when an invariant is broken.
        timelines: task id → its timeline, when the caller has read them already.

    Returns:
        The :class:`ConsistencyReport`.

    Raises:
        CheckFailed: an invariant is broken (with ``raise_on_violation``).
        LedgerUnavailable: the ledger cannot be read.
    """
    report = ConsistencyReport(integrity=_sqlite_integrity(ledger_url))
    if report.integrity not in (None, "ok"):
        report.violations.append(f"SQLite integrity_check: {report.integrity}")
    ids = list(task_ids) if task_ids is not None else list_task_ids(ledger_url)
    known = timelines or {}
    with _ledger(ledger_url) as led:
        for tid in ids:
            tl = known.get(tid) or led.timeline(tid)
            report.violations.extend(_task_violations(tl))
            report.tasks += 1
    if raise_on_violation and report.violations:
        raise CheckFailed(
            "ledger consistency check failed:\n  " + "\n  ".join(report.violations[:50]),
            report,
        )
    return report
