"""Fork a task from a step (``ratchet fork``, DESIGN §8, fork): the call of
:class:`ratchet.Control` and the links a task page shows."""

from __future__ import annotations

from typing import Any

from ..app import _checks as opchecks
from ..app._submitting import new_task_id
from ..app._taskdef import TaskDefinition
from ..ledger.base import ForkLinks
from ..serde import dumps
from ..validation import (
    MAX_KEY_BYTES,
    MAX_VERSION,
    RESERVED_PREFIX,
    check_identifier,
    check_int,
)
from ._reads import ControlReads

__all__ = ["ControlFork"]


def _check_params(definition: TaskDefinition, params: Any) -> None:
    """Check a task's params (decoded) against ``definition`` (the version a fork pins) as
    submit does (:meth:`TaskDefinition.validate`), without the keys Ratchet adds itself
    (a shard's place).

    Raises:
        InvalidArguments: the params do not fit the definition's signature (the message
            names each field).
    """
    if isinstance(params, dict):
        params = {k: v for k, v in params.items() if not k.startswith(RESERVED_PREFIX)}
    definition.validate(dumps(params, what=f"params of task {definition.name!r}"))


class ControlFork(ControlReads):
    """The fork calls of :class:`ratchet.Control` (see there)."""

    def fork(self, task_id: str, from_step: str, *, version: int | None = None,
             reason: str, by: str | None = None) -> str:
        """Make a new task from ``task_id``'s history up to, not including, its checkpoint
        ``from_step`` (``ratchet fork``; DESIGN §8, fork), pinned to ``version``, linked to
        the original and audited ``forked`` on both with ``by``, ``reason`` and the ledger's
        time. One transaction; the original is not changed.

        Use it to run a task again from a step with fixed code: the fork replays the
        copied checkpoints (steps before the fork point return their recorded values,
        effects before it are not called again) and runs the rest with the version it
        pins. Effects from the fork point on are called again, with the keys the code
        gives: keys derived from the params are the same, so a target that honours keys
        does not execute them twice; any other target may (a lookup-only target is not
        asked first, a fenced target accepts the fork's tokens: its generation is above
        every task of its lineage). The fork's ``ctx.lineage_id`` is the original's (its
        lineage's first task), so :func:`ratchet.fencing.fenced_step` finds the original's
        done markers and does not run a fenced step again. One task of a lineage runs at a
        time: while one has not ended, a fork, ``retry`` or ``compensate`` of the others
        is refused. Messages emitted before the fork point are not
        emitted again; those after it get ids derived from the new task id (unless the
        code passes ``message_id``).

        Args:
            task_id: the original; it must have ended ``SUCCEEDED``, ``FAILED`` or
                ``CANCELLED`` (cancel a live one first).
            from_step: a stored checkpoint name of the original as ``ratchet inspect``
                lists it: ``name`` for its first occurrence, ``name#N`` for the N-th (a
                step, an effect, an emit ``ratchet:emit:<topic>``), or
                :data:`~ratchet.control.FORK_AT_END` (``"ratchet:end"``): after the last
                recorded checkpoint. A step that failed is not recorded: to run it again
                with the fix, fork from the end (or from an earlier checkpoint).
            version: the definition version the fork pins (default: the original's). It
                must be one a worker registered, or one this Control's App defines. When
                this Control has the App (``Control(app=...)``) and it defines that
                version, the original's params are checked against its signature as
                submit checks them.
            reason: why (required, audited).
            by: the operator (default: ``$USER`` / the login name).

        Returns:
            the new task's id (``inspect`` it; it is ``PENDING``, no attempt spent).

        Raises:
            InvalidArguments: blank reason, malformed id, step name, version or operator;
                the original has not ended (or was compensated); no checkpoint
                ``from_step`` (the message lists the recorded ones in order); an unknown
                version; params the pinned version's signature refuses (checked when this
                Control has the App).
            IllegalTransition: another task of the original's fork lineage (an earlier
                fork of it, the task it was forked from) has not ended: two tasks with
                one history would run side by side.
            TaskNotFound: no such task. SchemaTooOld: the ledger cannot be migrated to
                schema 17 by this caller. LedgerUnavailable: no ledger there.
        """
        why, who = opchecks.operator_args(reason, by)
        tid = opchecks.task_id(task_id)
        step = check_identifier(from_step, "step name", MAX_KEY_BYTES)
        if version is not None:
            check_int(version, "version", minimum=1, maximum=MAX_VERSION)
        known: list[int] = []
        if self._app is not None:
            task = self._reader().get(tid)
            versions = self._app.versions.get(task.name, {})
            known = sorted(versions)
            definition = versions.get(task.version if version is None else version)
            if definition is not None:
                _check_params(definition, task.params)
        return self._writer().fork(tid, step, new_task_id(), version, why, who,
                                   known).task_id

    def fork_links(self, task_id: str) -> ForkLinks:
        """The fork that made ``task_id`` (``forked_from``) and the tasks forked from it
        (``forks``, oldest first): :class:`~ratchet.ledger.base.ForkLinks` of
        :class:`~ratchet.ledger.base.ForkRecord` (new task, original, step, position,
        versions, when, who, why). Empty for a task never forked and on a ledger below
        schema 17.

        Raises:
            InvalidArguments: a malformed task id. LedgerUnavailable: no ledger there.
        """
        return self._reader().fork_links(opchecks.task_id(task_id))

