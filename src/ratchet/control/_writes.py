"""The audited operator writes of :class:`ratchet.Control`: resolve, cancel, retry,
compensate, events, pause and resume, limits, quarantine replay, prune, reconcile
records, migrate, submit."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..app import TaskHandle
from ..app import _checks as opchecks
from ..app import _taskops as taskops
from ..config import max_payload_bytes_from_env
from ..errors import ConfigError, InvalidArguments, PayloadTooLarge
from ..ledger import open_ledger
from ..ledger.base import (
    ControlOutcome,
    EventReceipt,
    Limit,
    LimitScope,
    PauseResult,
    PruneReport,
    ResolveOutcome,
    TaskInfo,
)
from ..serde import dumps, printable
from ..validation import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_identifier,
    check_int,
    check_rate_per_s,
)
from ._reads import ControlReads
from ._records import (
    ReplayReport,
)

__all__ = ["ControlWrites"]


class ControlWrites(ControlReads):
    """The operator writes of :class:`ratchet.Control` (see there)."""

    def record_reconcile(self, task_type: str, summary: Mapping[str, Any],
                         findings: Sequence[tuple[str, str, int | None, Mapping[str, Any]]],
                         *, by: str | None = None) -> None:
        """Audit one reconcile run (:mod:`ratchet.reconcile` calls it), in one transaction:
        a ``reconcile`` row (task id ``reconcile:<task_type>``, the operator, ``summary``
        as its detail) and one row per finding ``(task_id, outcome, generation, detail)``
        of kind ``reconcile_<outcome>`` on the task it is about (``ratchet inspect``
        shows it; :meth:`reconcile_counts` counts them).

        Raises:
            InvalidArguments: a malformed type, operator or outcome name.
            PayloadNotSerializable: a detail is not plain JSON.
            LedgerUnavailable: no ledger there.
        """
        check_identifier(task_type, "task type", MAX_NAME_BYTES)
        who = opchecks.operator_name(by)
        rows = []
        for task_id, outcome, generation, detail in findings:
            if not isinstance(outcome, str) or not outcome.isidentifier():
                raise InvalidArguments(f"a finding's outcome must be a plain name, got "
                                       f"{outcome!r}")
            rows.append((opchecks.task_id(task_id), f"reconcile_{outcome}", generation,
                         dumps(dict(detail), what="a reconcile finding")))
        self._writer().record_reconcile(task_type, who,
                                        dumps(dict(summary), what="a reconcile summary"),
                                        rows)

    def prune_workers(self, older_than_s: float) -> list[str]:
        """Delete the registry rows of workers ``stopped`` (clean exit) or ``dead``
        (revoked) whose last heartbeat is more than ``older_than_s`` seconds old by the
        ledger clock; ``alive`` rows are never deleted (``ratchet workers --prune-after``;
        running workers do it themselves once a minute with a 24 h retention,
        :data:`ratchet.worker.registry.REGISTRY_RETENTION_S`).

        Returns:
            the holders whose rows were deleted, sorted.

        Raises:
            InvalidArguments: a negative or non-finite age. LedgerUnavailable: no ledger.
        """
        age = opchecks.check_age(older_than_s, "older_than_s")
        return self._writer().prune_workers(age)

    def resolve(
        self,
        task_id: str,
        outcome: str | ResolveOutcome,
        result: Any = None,
        *,
        reason: str,
        by: str | None = None,
    ) -> TaskInfo:
        """Settle an ``UNKNOWN`` task's open effect (audited); the task then resumes, or
        ends ``FAILED`` (give-up), or ``CANCELLED`` / ``PAUSED`` when a cancel / pause
        request was waiting for this resolution.

        Args:
            task_id: the task.
            outcome: ``"done"`` (the effect happened; ``result`` is its return value),
                ``"not-done"`` (it did not; the task calls again with the same key) or
                ``"give-up"`` (nobody can tell: the task ends ``FAILED`` with ``reason``,
                generation + 1, and its open effects are marked ``given_up``, so
                ``inspect`` shows the operator gave up on them; ``retry`` can run it
                again, lookup first).
            result: for ``done`` only: the effect's result, plain JSON (``None`` is
                recorded as null). Refused with ``not-done`` / ``give-up``.
            reason: why (kept in the audit log); must not be blank.
            by: the operator's name (default: the login name).

        Returns:
            the task after the change.

        Raises:
            InvalidArguments: unknown outcome, blank reason, a malformed operator name, a
                ``result`` with ``not-done`` / ``give-up``.
            PayloadNotSerializable: ``result`` is not plain JSON.
            TaskNotFound: no such task. IllegalTransition: the task is not ``UNKNOWN``.
            LedgerUnavailable: no ledger there.
        """
        try:
            verdict = ResolveOutcome(outcome)
        except ValueError:
            raise InvalidArguments(
                "outcome must be 'done', 'not-done' or 'give-up', got "
                f"{printable(str(outcome))!r}") from None
        if result is not None and verdict is not ResolveOutcome.DONE:
            raise InvalidArguments(
                f"a result is recorded only with outcome 'done', not {verdict.value!r} "
                "(nothing was changed)")
        reason, who = opchecks.operator_args(reason, by)
        result_json = dumps(result, what="the effect's result")
        return self._writer().resolve(opchecks.task_id(task_id), verdict, reason, who, result_json)

    def set_limit(
        self,
        scope: str | LimitScope,
        name: str = "",
        *,
        reserved: int = 0,
        maximum: int | None = None,
        reason: str,
        by: str | None = None,
    ) -> Limit:
        """Create or replace a cluster-wide concurrency limit (DESIGN §8), audited.

        Every worker's next claim obeys it: the ledger is the one copy (no per-process
        configuration). Tasks already running above a lowered cap finish (no preemption).

        Args:
            scope: ``"total"`` (``maximum`` = the cluster's slots; no name), ``"type"``
                (``name`` = a task name) or ``"tenant"`` (``name`` = a tenant, as given
                to ``App.submit(..., tenant=)``).
            name: the task type or tenant.
            reserved: slots of the total kept for the scope while it has ready work (lent
                to others while it has none; only with a total).
            maximum: at most this many RUNNING tasks of the scope (>= 1), or None.
            reason: why (audited); must not be blank. by: the operator (default: login).

        Returns:
            the stored :class:`~ratchet.ledger.base.Limit`.

        Raises:
            InvalidArguments: unknown scope, a name for the total or none for a type or
                tenant, ``reserved > maximum``, ``maximum < 1``, reservations adding up
                to more than the total, a blank reason. LedgerUnavailable: no ledger.
        """
        kind = opchecks.limit_scope(scope)
        reason, who = opchecks.operator_args(reason, by)
        if kind is not LimitScope.TOTAL:
            check_identifier(name, f"{kind.value} name", MAX_KEY_BYTES)
        return self._writer().set_limit(kind, name, reserved, maximum, who, reason)

    def clear_limit(
        self, scope: str | LimitScope, name: str = "", *, reason: str, by: str | None = None
    ) -> Limit:
        """Remove a concurrency limit (audited); returns what it was.

        Raises:
            InvalidArguments: unknown scope, no such limit, a blank reason.
            LedgerUnavailable: no ledger there.
        """
        kind = opchecks.limit_scope(scope)
        reason, who = opchecks.operator_args(reason, by)
        return self._writer().clear_limit(kind, name, who, reason)

    def prune(
        self,
        older_than_s: float,
        *,
        dry_run: bool = False,
        batch_size: int = 500,
        export: str | os.PathLike[str] | None = None,
        by: str | None = None,
    ) -> PruneReport:
        """Delete finished tasks (``SUCCEEDED``, ``FAILED``, ``CANCELLED``) that finished more
        than ``older_than_s`` seconds ago (ledger clock), with their steps, effects, late
        effects and audit rows, and audit rows older than that whose task is gone; in
        batches of ``batch_size`` tasks, each its own short transaction that never makes a
        claim or a commit wait (DESIGN §10.2). Non-terminal tasks are never deleted.
        Audited (kind ``prune``: who, the age, the counts) unless ``dry_run``.

        A task's idempotency key deduplicates submits only while its row exists, and its
        effect records go with it: after the prune, the same key submits a new task (the
        dedupe window is the retention age).

        Args:
            older_than_s: the age, seconds (``ratchet.validation.parse_duration_s("30d")``).
            dry_run: only count what would be deleted; change nothing.
            batch_size: tasks per transaction, 1-10000.
            export: a file to append one JSON line per pruned task to (its row and history,
                stored JSON as text), written and flushed to disk before the batch's
                delete commits. A batch whose commit then fails is exported again by the
                next prune (at least once).
            by: the operator's name (default: the login name).

        Returns:
            a :class:`PruneReport` (what was deleted, or would be).

        Raises:
            InvalidArguments: a negative or non-finite age, ``batch_size`` out of range, a
                malformed operator name, ``export`` with ``dry_run``.
            OSError: the export file cannot be opened or written (the batch is rolled back).
            LedgerUnavailable: no ledger there.
        """
        age = opchecks.check_age(older_than_s, "older_than_s")
        check_int(batch_size, "batch_size", minimum=1, maximum=10000)
        if dry_run and export is not None:
            raise InvalidArguments("a dry run deletes nothing, so it exports nothing: "
                                   "drop the export or the dry run")
        who = opchecks.operator_name(by)
        led = self._writer() if not dry_run else self._reader()
        if export is None:
            return led.prune(age, by=who, dry_run=dry_run,
                             batch_size=batch_size)
        with open(export, "a", encoding="utf-8") as out:
            def write(records: list[dict[str, Any]]) -> None:
                out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
                out.flush()
                os.fsync(out.fileno())

            return led.prune(age, by=who, batch_size=batch_size,
                             export=write)

    def cancel(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Cancel a task (``ratchet cancel``), audited with ``by``, ``reason`` and the
        ledger's time (DESIGN §3, arbitration).

        * ``PENDING`` (also scheduled for later), ``RETRY_WAIT``, ``PAUSED``: ``CANCELLED``
          at once, generation + 1 (``outcome="done"``): cancel before start wins.
        * ``RUNNING``: a cancel request is recorded (``outcome="requested"``); the holder
          learns of it within about a second and stops at its next step/effect boundary
          (its pipelined checkpoints committed first) with a fenced ``RUNNING ->
          CANCELLED``. An effect in flight is settled first (its reply, or a lookup); if
          the holder is dead, the ledger cancels once the lease has expired or the holder
          is revoked (at once when the lease already has).
        * An open effect intent (any state) or ``UNKNOWN``: the request is recorded and
          applied once the effect is settled: by the next holder's lookup, or by
          :meth:`resolve` (then ``CANCELLED`` instead of resuming). A lookup that cannot
          settle it leaves the task ``UNKNOWN`` with the request kept.
        * ``SUCCEEDED``, ``FAILED``, ``CANCELLED``: nothing changes (``outcome=
          "unchanged"``; a success committed first stays a success).

        Returns:
            what happened (:class:`~ratchet.ledger.base.ControlOutcome`).

        Raises:
            InvalidArguments: blank reason, malformed task id or operator name.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        return taskops.cancel(self._writer, task_id, reason, by)

    def retry(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Run a ``FAILED`` task again (``ratchet retry``), audited with ``by``, ``reason``
        and the ledger's time: a fresh set of attempts (the counter reset, the task's
        ``max_attempts`` again), generation + 1, ready now. Its history is kept: the audit
        trail, its steps (done steps stay done: it resumes from its checkpoint) and its
        effects (a done effect is not called again; one given up by ``resolve --outcome
        give-up`` is settled lookup first). The only move out of ``FAILED`` (DESIGN §3);
        ``SUCCEEDED`` and ``CANCELLED`` never move, and any state but ``FAILED`` is
        ``outcome="unchanged"``.

        Raises:
            InvalidArguments: blank reason, malformed task id or operator name.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        return taskops.retry(self._writer, task_id, reason, by)

    def compensate(self, task_id: str, *, reason: str, by: str | None = None
                   ) -> ControlOutcome:
        """Undo a ``FAILED`` task's completed effects (``ratchet compensate``), audited with
        ``by``, ``reason`` and the ledger's time: ``FAILED -> COMPENSATING``, an operator
        move (DESIGN §3). A worker then claims it and runs the compensation of each of its
        completed effects (``ctx.effect(..., compensate=...)``), newest first, each an
        effect named ``compensate:<effect>`` with key ``compensate:<key>`` (so a crash in
        the middle never runs one twice), and the task ends ``COMPENSATED`` (terminal); a
        compensation whose outcome cannot be known sends it to ``UNKNOWN``. Any state but
        ``FAILED`` is ``outcome="unchanged"`` (``message`` says why).

        Returns:
            what happened (:class:`~ratchet.ledger.base.ControlOutcome`, action
            ``"compensate"``).

        Raises:
            InvalidArguments: blank reason, malformed task id or operator name.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        return taskops.compensate(self._writer, task_id, reason, by)

    def send_event(self, name: str, *, key: str, payload: Any = None,
                   event_id: str | None = None, by: str | None = None) -> EventReceipt:
        """Send the event ``name`` for ``key`` (``ratchet send-event``; what
        :meth:`ratchet.App.send_event` does, audited with the sender ``by``): stored in the
        ledger's mailbox, and every task ``WAITING`` in ``ctx.wait_for_event(name,
        key=key)`` is made ready, with ``payload`` as what its wait returns. An event sent
        before anyone waits is kept: the next wait for it returns it at once.

        Args:
            name: the event's name (a storable identifier, at most 255 bytes in UTF-8).
            key: what it is about, e.g. an order id (at most 1024 bytes in UTF-8).
            payload: plain JSON (None is sent as null), at most the payload limit once
                encoded (the App's ``max_payload_bytes``, else
                ``RATCHET_MAX_PAYLOAD_BYTES``, bytes).
            event_id: the event's identity (at most 1024 bytes): a second send with the
                same id is the same event, delivered once (``duplicate=True``, nothing
                woken). Default: a new id for each call.
            by: who sends it (default: the login name), kept in the audit log.

        Returns:
            an :class:`~ratchet.ledger.base.EventReceipt`: the event id, its position
            among the events of ``(name, key)``, whether it was a duplicate, and how
            many waiting tasks it made ready.

        Raises:
            InvalidArguments: a malformed name, key, event id or sender, or an
                ``event_id`` already used for another event (name, key or payload).
            PayloadNotSerializable: ``payload`` is not plain JSON.
            PayloadTooLarge: ``payload`` is over the payload limit; nothing written.
            LedgerUnavailable: no ledger there.
        """
        check_identifier(name, "event name", MAX_NAME_BYTES)
        check_identifier(key, "event key", MAX_KEY_BYTES)
        if event_id is not None:
            check_identifier(event_id, "event id", MAX_KEY_BYTES)
        who = opchecks.operator_name(by)
        payload_json = dumps(payload, what="the event's payload")
        limit = (self._app.max_payload_bytes if self._app is not None
                 else max_payload_bytes_from_env())
        size = len(payload_json.encode("utf-8"))
        if size > limit:
            raise PayloadTooLarge(size, limit)
        return self._writer().send_event(name, key, payload_json, event_id, who)

    def pause(self, scope: str, target: str | None = None, *, reason: str,
              by: str | None = None) -> PauseResult:
        """Pause everything (``pause("all")``), a task type (``pause("type", name)``) or one
        task (``pause("task", task_id)``): a versioned, audited record (who, why, when;
        DESIGN §8). Once this returns, no new attempt starts in the scope until
        :meth:`resume`: every claim transaction reads the active pauses (PostgreSQL: under
        an advisory lock the pause takes, so a claim in flight finishes first). Running
        tasks in scope learn of it within about a second and stop at their next
        step/effect boundary: their checkpoint committed, the lease released, the attempt
        handed back, state ``PAUSED``; an effect in flight is settled first (never flipped
        to failed). One ``PENDING`` or ``RETRY_WAIT`` task is ``PAUSED`` at once; one
        ``UNKNOWN`` task stays ``UNKNOWN`` with the pause recorded, applied when a person
        resolves it (``PAUSED``; ``FAILED`` on give-up). A scope already
        paused is ``outcome="unchanged"`` (no second record).

        Limits: a task type's tasks that are ``PENDING`` stay ``PENDING`` (not claimed);
        a task whose holder died while its type is paused is taken over after resume.

        Raises:
            InvalidArguments: unknown scope, a missing / extra target, blank reason.
            TaskNotFound: no such task. LedgerUnavailable: no ledger there.
        """
        scope, key = opchecks.pause_scope(scope, target)
        why, who = opchecks.operator_args(reason, by)
        result = self._writer().pause(scope, key, why, who)
        if scope == "type" and key is not None and not self._type_known(key):
            # Pausing a type before its workers deploy is legitimate, so not refused; but
            # a typo would pause nothing, silently: say so.
            result = dataclasses.replace(result, message=(
                f"{result.message}; note: no worker has registered task type {key!r} and "
                "the ledger holds no task of it (check the name)"))
        return result

    def _type_known(self, name: str) -> bool:
        """Whether a worker registered a definition of ``name`` or the ledger holds a task
        of it."""
        if any(d.name == name for d in self.definitions()):
            return True
        return bool(self.list_tasks(name=name, limit=1).tasks)

    def resume(self, scope: str, target: str | None = None, *, reason: str,
               by: str | None = None, rate_per_s: float | None = None) -> PauseResult:
        """End the active pause of ``scope`` / ``target`` (same selectors as :meth:`pause`),
        audited: its ``PAUSED`` tasks not covered by another active pause go back to
        ``PENDING``, re-admitted at ``rate_per_s`` tasks per second (staggered ``run_at``;
        None: all at once), and pause requests not yet applied are withdrawn. No active
        pause there: ``outcome="unchanged"``.

        Raises:
            InvalidArguments: as :meth:`pause`, or ``rate_per_s`` not a finite number > 0.
            LedgerUnavailable: no ledger there.
        """
        scope, key = opchecks.pause_scope(scope, target)
        why, who = opchecks.operator_args(reason, by)
        if rate_per_s is not None:
            rate_per_s = check_rate_per_s(rate_per_s, "rate_per_s")
        return self._writer().resume(scope, key, why, who,
                                     None if rate_per_s is None else float(rate_per_s))

    def quarantine_replay(
        self,
        fingerprint: str,
        rate_per_s: float,
        *,
        dry_run: bool = False,
        reason: str | None = None,
        by: str | None = None,
        limit: int = 10_000,
    ) -> ReplayReport:
        """Replay the quarantined tasks of one fingerprint with fresh attempt counters.

        In one transaction, each quarantined ``FAILED`` task with ``fingerprint`` (oldest
        quarantine first) becomes ``PENDING`` with attempt, failure streak and crash count
        reset (its steps, effects and audit history kept, so done work is not redone), the
        i-th ready at ``ledger now + i / rate_per_s``, so workers admit them at that rate;
        each gets an ``operator_replay`` audit row (who, why, fingerprint, run_at). A dry
        run changes nothing and lists what would be replayed.

        Args:
            fingerprint: from :meth:`quarantine_list` (16 hex digits).
            rate_per_s: tasks per second, above 0 and at most 100,000.
            dry_run: only list.
            reason: why (audited); required unless ``dry_run``.
            by: the operator's name (default: the login name).
            limit: at most this many tasks (1 to 100,000).

        Raises:
            InvalidArguments: a malformed fingerprint, rate, limit, operator name, or a
                blank reason for a real replay. LedgerUnavailable: no ledger there.
        """
        fp = fingerprint.strip().lower() if isinstance(fingerprint, str) else fingerprint
        if not isinstance(fp, str) or len(fp) != 16 or any(c not in "0123456789abcdef"
                                                           for c in fp):
            raise InvalidArguments(
                f"fingerprint must be the 16 hex digits ratchet quarantine list shows, got "
                f"{printable(str(fingerprint))!r}")
        rate_per_s = check_rate_per_s(rate_per_s, "rate_per_s")
        opchecks.check_limit(limit, 100_000)
        if reason is None or not isinstance(reason, str) or not reason.strip():
            if not dry_run:
                raise InvalidArguments(opchecks.REASON_REQUIRED)
            reason = ""
        else:
            check_identifier(reason, "reason", 4 * MAX_KEY_BYTES)
        who = opchecks.operator_name(by)
        ledger = self._reader() if dry_run else self._writer()
        tasks = ledger.quarantine_replay(fp, float(rate_per_s), who, reason, dry_run, limit)
        return ReplayReport(fp, dry_run, float(rate_per_s), who, reason, tasks,
                            ledger.now())

    def migrate(self) -> int:
        """Create the ledger or apply pending schema migrations; return the schema version.

        Raises:
            SchemaTooNew: the ledger is newer than this Ratchet (left untouched).
            LedgerUnavailable: cannot be opened.
        """
        if self._app is not None and self._app.holds_ledger_object:
            return self._app.ledger.migrate()
        led = open_ledger(self._url, migrate=False, must_exist=False)
        try:
            return led.migrate()
        finally:
            led.close()

    def submit(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | float | None = None,
        delay_s: float = 0.0,
        tenant: str | None = None,
        version: int | None = None,
        queue: str | None = None,
        priority: int = 0,
    ) -> TaskHandle:
        """Submit one task through the App (see :meth:`ratchet.App.submit`; ``version``
        pins a definition version, default the newest the App defines; ``queue`` and
        ``priority`` as there: flow control, DESIGN §8).

        Raises:
            ConfigError: this Control was made without an App.
            UnknownTask: no such task name (or version); nothing written.
            InvalidArguments: the params do not validate; nothing written.
            PayloadNotSerializable: the params are not plain JSON; nothing written.
            PayloadTooLarge: the params are over the size limit; nothing written.
            IdempotencyConflict: the key was used with other params; nothing written.
            LedgerError: the ledger failed.
        """
        if self._app is None:
            raise ConfigError(
                "submit needs the application's task registry: use Control(app=...)"
            )
        return self._app.submit(
            name, params, idempotency_key=idempotency_key, run_at=run_at, delay_s=delay_s,
            tenant=tenant, version=version, queue=queue, priority=priority)

