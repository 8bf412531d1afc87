"""Periodic tasks: what ``@app.periodic`` registers (:class:`PeriodicTask`) and the task
row of one tick (:meth:`PeriodicTask.new_task`).

The schedule submits its task once per tick, with the idempotency key
``periodic:<schedule name>:<tick as a UTC instant>`` (:func:`ratchet.schedule.tick_key`):
any number of schedulers may submit the same tick, the key makes it one task. The
schedulers live in the workers (:mod:`ratchet.worker.scheduler`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, InvalidArguments
from ..ledger.base import NewTask, ScheduleSpec
from ..schedule import Schedule, tick_key
from ..validation import MAX_NAME_BYTES, check_identifier
from ._submitting import SubmitRequest, new_task_id, prepare_task
from ._taskdef import TaskDefinition

__all__ = ["MAX_MISFIRE_GRACE_S", "PeriodicTask", "find_definition", "periodic_task"]

MAX_MISFIRE_GRACE_S = 7 * 86400.0
"""The longest misfire grace, seconds (a week): a longer one would fire a backlog of a week
of ticks after an outage, which is what the grace is there to refuse."""


@dataclass(frozen=True, slots=True)
class PeriodicTask:
    """One schedule of an app: its name, the task it submits and when.

    Attributes:
        name: the schedule's name (unique per app; the ticks' keys start with it).
        task: the registered task name it submits (the newest version this app defines).
        schedule: when (:class:`~ratchet.schedule.Schedule`).
        misfire_grace_s: how late a tick may still be submitted, seconds (>= 1): after
            downtime, ticks later than this are recorded as missed, never run late.
        params: the params of every tick's task (plain JSON).
        template: the task row of a tick, without its id and key (validated at
            registration, so a tick never fails its params check).
    """

    name: str
    task: str
    schedule: Schedule
    misfire_grace_s: float
    params: Mapping[str, Any]
    template: NewTask

    def spec(self) -> ScheduleSpec:
        """What a scheduler registers in the ledger for this schedule."""
        return ScheduleSpec(self.name, self.task, self.schedule.spec(), self.schedule.tz,
                            self.misfire_grace_s)

    def new_task(self, tick_s: int) -> NewTask:
        """The task of the tick at ``tick_s`` (epoch seconds): a new id, the tick's key."""
        return dataclasses.replace(self.template, task_id=new_task_id(),
                                   idempotency_key=tick_key(self.name, tick_s))


def periodic_task(name: str, definition: TaskDefinition, *, cron: str | None,
                  every_s: float | None, tz: str, misfire_grace_s: float,
                  params: Mapping[str, Any] | None, max_payload_bytes: int) -> PeriodicTask:
    """Check one ``@app.periodic`` and build its :class:`PeriodicTask`.

    Raises:
        InvalidArguments: a bad name, schedule (:class:`~ratchet.schedule.Schedule`),
            grace, or params the task refuses.
    """
    check_identifier(name, "schedule name", MAX_NAME_BYTES)
    schedule = Schedule(cron=cron, every_s=every_s, tz=tz)
    grace_ok = (isinstance(misfire_grace_s, int | float)
                and not isinstance(misfire_grace_s, bool) and math.isfinite(misfire_grace_s)
                and 1 <= misfire_grace_s <= MAX_MISFIRE_GRACE_S)
    if not grace_ok:
        raise InvalidArguments(
            f"misfire_grace_s of schedule {name!r} must be seconds from 1 (a scheduler's "
            f"pass takes a moment after its tick) to "
            f"{MAX_MISFIRE_GRACE_S:g}, got {misfire_grace_s!r}")
    template = prepare_task(definition, SubmitRequest(
        definition.name, params, idempotency_key=tick_key(name, 0),
        version=definition.version), max_payload_bytes)
    return PeriodicTask(name, definition.name, schedule, float(misfire_grace_s),
                        dict(params or {}), template)


def find_definition(fn: Callable[..., Any], versions: Mapping[str, Mapping[int, TaskDefinition]],
                    schedule: str) -> TaskDefinition:
    """The definition whose function is ``fn`` (``@app.periodic`` goes above
    ``@app.task``).

    Raises:
        ConfigError: ``fn`` is not a registered task of this app.
    """
    for by_version in versions.values():
        for definition in by_version.values():
            if definition.fn is fn:
                return definition
    raise ConfigError(
        f"@app.periodic({schedule!r}) must be applied above @app.task(...) of the same app: "
        f"{getattr(fn, '__qualname__', fn)!r} is not a registered task")
