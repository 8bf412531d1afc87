"""Replay a task's function against its recorded history: :func:`replay` (one task) and
:func:`replay_sample` (the recent tasks of a type, to check a new definition version
before it is deployed).

The body runs in this process with a replay context (:mod:`ratchet.replay.context`):
every checkpoint returns its recorded value, sleeps and waits return at once, nothing is
written to the ledger and nothing external is called. The run ends at the first
divergence, at the end of the recorded history, or when the body returns or raises; the
:class:`ReplayReport` says which.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..app import App, TaskDefinition
from ..control import Control
from ..errors import InvalidArguments, UndecodableData
from ..errortext import error_message, error_summary
from ..ledger.base import Timeline
from ..serde import Undecodable, dumps, loads
from ..shards import SHARD_PARAM, SHARDS_PARAM, shard_place
from ..states import State
from .context import AsyncReplayContext, ReplayContext, ReplayCore
from .history import recorded_history

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_SAMPLE", "Divergence", "ReplayReport", "replay",
           "replay_sample"]

MAX_SAMPLE = 10_000
"""The most tasks :func:`replay_sample` replays in one call."""

DEFAULT_TIMEOUT_S = 60.0
"""How long (seconds) a replayed body may run before the replay reports it did not stop."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a replayed body left its recorded history.

    Attributes:
        position: 0-based position in the task's code path (the N-th checkpoint is
            position N - 1); the history's length when the body ended differently.
        recorded: what the history holds there (``"effect 'charge' (occurrence 1) key
            'charge:o-7'"``, or how the recorded run ended).
        new: what the replayed body did there (the call, or how it ended).
    """

    position: int
    recorded: str
    new: str

    def __str__(self) -> str:
        return (f"diverges at position {self.position}: recorded {self.recorded}; "
                f"the new code {self.new}")


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What replaying one task found.

    Attributes:
        task_id: the task.
        name: its task type.
        version: the definition version the body was taken from.
        recorded_version: the version the task ran with.
        state: the task's state in the ledger (``"SUCCEEDED"``, ``"FAILED"``...).
        positions: checkpoints of the history the body reached and matched.
        recorded_positions: checkpoints in the recorded history.
        reproduced: True when the body matched every recorded checkpoint and ended as the
            recorded run did (the same result, or an exception of the recorded error's
            type), or matched the whole history of a task that has not ended.
        divergence: where the body left the history, or None.
        history_end: set when the history ended before the body did: ``"history ends at
            position N; the new code would next call X"`` (not a divergence: the body
            went further than any attempt recorded, e.g. past the step a failed run
            stopped at); None otherwise.
        error: what the body raised (``"ValueError: no stock"``), or None.
        result: what the body returned (its JSON round-trip), or None.
        timed_out: True when the body did not end within the replay's time bound (it
            caught the replay's stop and went on, or loops without checkpoints): a
            divergence, with the reason in ``error``.
    """

    task_id: str
    name: str
    version: int
    recorded_version: int
    state: str
    positions: int
    recorded_positions: int
    reproduced: bool
    divergence: Divergence | None = None
    history_end: str | None = None
    error: str | None = None
    result: Any = None
    timed_out: bool = False

    @property
    def summary(self) -> str:
        """How the replay ended, in one line: the divergence, the history's end, that it
        reproduces the history, or what the new code did where the recorded run did not
        succeed."""
        if self.timed_out and self.error is not None:
            return self.error
        if self.divergence is not None:
            return str(self.divergence)
        if self.history_end is not None:
            return self.history_end
        if self.reproduced:
            return "reproduces the recorded history" + (
                f" (raises {self.error})" if self.error else "")
        if self.error is not None:
            return f"the new code raises {self.error}"
        return (f"the new code returns {_short(self.result)}; the recorded run has not "
                f"succeeded ({self.state})")

    def __str__(self) -> str:
        head = f"{self.name} {self.task_id} (version {self.version}"
        if self.version != self.recorded_version:
            head += f", recorded with version {self.recorded_version}"
        return (f"{head}, {self.state}): {self.positions} of {self.recorded_positions} "
                f"positions; {self.summary}")


def _short(value: Any, limit: int = 120) -> str:
    try:
        text = dumps(value)
    except Exception:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _params(task_params: Any) -> tuple[dict[str, Any], Any]:
    """The keyword arguments of the body and its shard place, from the task's params.

    Raises:
        UndecodableData: the params could not be decoded, or are not an object.
        InvalidArguments: the task is a sharded job's parent (it runs no task function).
    """
    if isinstance(task_params, Undecodable):
        raise UndecodableData(f"the task's params cannot be decoded: {task_params}")
    params = dict(task_params) if isinstance(task_params, dict) else (
        {} if task_params is None else None)
    if params is None:
        raise UndecodableData(f"params are a JSON {type(task_params).__name__}, not an object")
    if params.pop(SHARDS_PARAM, None) is not None:
        raise InvalidArguments("the task is a sharded job's parent: it runs no task function "
                               "of its own (replay its shards)")
    shard = params.pop(SHARD_PARAM, None)
    return params, shard_place(shard) if shard is not None else None


def _run_body(call: Callable[[], Any], is_async: bool, timeout_s: float
              ) -> tuple[bool, Any, BaseException | None]:
    """Run a body on a daemon thread of its own (an async body: on an event loop of its
    own in that thread) for at most ``timeout_s`` seconds.

    Returns:
        ``(ended, value, raised)``: whether the body ended in time, what it returned, and
        any ``BaseException`` it raised (a :class:`ReplayStop` included). A body that has
        not ended is left running on its daemon thread.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(call()) if is_async else call()
        except BaseException as exc:  # every way a body ends is reported, none escapes
            box["error"] = exc

    thread = threading.Thread(target=target, name="ratchet-replay", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return False, None, None
    return True, box.get("value"), box.get("error")


def _same_error(recorded: str | None, raised: BaseException) -> bool:
    """Whether the recorded error (``"Type: message"``) is of ``raised``'s type."""
    line = error_summary(recorded)
    kind = type(raised).__name__
    return bool(line) and (line == kind or line.startswith(f"{kind}:"))


def _check_run_arguments(version: int | None, timeout_s: float) -> None:
    """Refuse a version below 1 and a time bound that is not a positive number.

    Raises:
        InvalidArguments: either is out of range.
    """
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 1):
        raise InvalidArguments(f"version must be an integer >= 1 (versions are integers "
                               f">= 1), got {version!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
            not 0 < timeout_s < float("inf"):
        raise InvalidArguments(f"timeout_s must be a positive number of seconds, got "
                               f"{timeout_s!r}")


def _run(app: App, definition: TaskDefinition, timeline: Timeline,
         timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplayReport:
    task = timeline.task
    state = task.state.value if isinstance(task.state, State) else str(task.state)
    history = recorded_history(timeline)
    core = ReplayCore(task.task_id, history)
    params, shard = _params(task.params)
    is_async = bool(getattr(definition, "is_async", False)) or \
        inspect.iscoroutinefunction(definition.fn)
    ctx_type = AsyncReplayContext if is_async else ReplayContext
    ctx = ctx_type(core, task.name, task.generation, task.attempt, params, shard, app)

    def report(reproduced: bool, **parts: Any) -> ReplayReport:
        return ReplayReport(task.task_id, task.name, definition.version, task.version, state,
                            core.next_position, core.length, reproduced, **parts)

    ended, value, raised = _run_body(lambda: definition.fn(ctx, **params), is_async,
                                     timeout_s)
    stop = core.stopped
    if not ended:
        if stop is None:
            stuck = f"the body did not end within {timeout_s:g} s (a loop without checkpoints?)"
            recorded = "the recorded run"
        else:
            why = "a divergence" if stop.kind == "divergence" else "the end of the history"
            stuck = (f"the body did not stop within {timeout_s:g} s after the replay stopped "
                     f"it at position {stop.position} ({why}; its next call: {stop.new}); "
                     "it caught ReplayStop?")
            recorded = stop.recorded or "the end of the history"
        position = core.next_position if stop is None else stop.position
        return report(False, error=stuck, timed_out=True,
                      divergence=Divergence(position, recorded, "does not stop"))
    if stop is not None:  # raised, or caught by the body and then returned or raised
        if stop.kind == "divergence":
            assert stop.recorded is not None
            return report(False, divergence=Divergence(stop.position, stop.recorded,
                                                       f"calls {stop.new}"))
        where = f"history ends at position {stop.position}"
        if stop.recorded is not None:
            where = f"history ends at position {stop.position} ({stop.recorded})"
        return report(False, history_end=f"{where}; the new code would next call {stop.new}")
    end = core.next_position
    how = (f"raises {error_message(raised)}" if raised is not None else "returns")
    if end < core.length:  # the body ended before the history did
        return report(False, error=None if raised is None else error_message(raised),
                      divergence=Divergence(end, core.history[end].describe()
                                            if end in core.history else "a checkpoint",
                                            how))
    recorded_end = (f"the run ended {state}" + (f" with {error_summary(task.last_error)}"
                                                if task.last_error else ""))
    if raised is not None:
        error = error_message(raised)
        if _same_error(task.last_error, raised) and task.state is not State.SUCCEEDED:
            return report(True, error=error)
        return report(False, error=error, divergence=Divergence(end, recorded_end, how))
    try:
        result = loads(dumps(value, what="the replayed body's result"))
    except Exception as exc:
        return report(False, error=error_message(exc), divergence=Divergence(
            end, recorded_end, f"returns a result that is not JSON ({error_message(exc)})"))
    if task.state is State.SUCCEEDED:
        if result == task.result:
            return report(True, result=result)
        return report(False, result=result, divergence=Divergence(
            end, f"the result {_short(task.result)}", f"returns {_short(result)}"))
    # The recorded run has not succeeded (it failed, waits, or runs): matching its whole
    # history is all a replay can check; a return where it failed is new behaviour.
    ended = task.terminal or task.last_error is not None
    return report(not ended, result=result)


def replay(app: App, task_id: str, *, version: int | None = None,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> ReplayReport:
    """Run task ``task_id``'s function locally against its recorded history.

    Steps return their recorded values and effects their recorded results without being
    called, sleeps and waits return at once (a wait: its recorded event), children are
    not submitted (their recorded ids and outcomes are returned); nothing is written to
    the ledger and nothing external is called. The run stops at the first checkpoint that
    differs from the history (:attr:`ReplayReport.divergence`: the position, the recorded
    call, the new call), or at the first one the history lacks
    (:attr:`ReplayReport.history_end`, with the call the code would make next), or when the
    body ends: its result is compared with a ``SUCCEEDED`` task's recorded one, and an
    exception it raises reproduces a recorded failure of the same type. A plain ``def``
    body gets a :class:`~ratchet.replay.context.ReplayContext`, an ``async def`` one an
    :class:`~ratchet.replay.context.AsyncReplayContext` (run with :func:`asyncio.run`).
    Whatever the body raises (``KeyboardInterrupt``, ``SystemExit``,
    ``asyncio.CancelledError``, any ``BaseException``) is reported, never re-raised.

    The body runs on a daemon thread of its own (an async body: on an event loop of its
    own in that thread). Once the replay has stopped the body, every further checkpoint
    call raises at once; a body that still does not end within ``timeout_s`` (it caught
    the stop with a bare ``except:`` and loops, or loops without checkpoints) is reported
    as a divergence with :attr:`ReplayReport.timed_out` set, and its thread is left
    running (a daemon thread: it does not keep the process alive, but it holds what the
    body holds and uses a core until the process ends).

    Args:
        app: the application holding the task's definition; its ledger is read (never
            written, never created or migrated).
        task_id: the task to replay.
        version: the definition version to run; None: the version the task ran with.
            Another version checks new code against the task's history before deploying it.
        timeout_s: how long (seconds) the body may run before the replay reports that it
            does not stop (default :data:`DEFAULT_TIMEOUT_S`).

    Returns:
        A :class:`ReplayReport`.

    Raises:
        TaskNotFound: no task with that id.
        UnknownTask: the app does not define the task's name, or that version of it.
        UndecodableData: the task's params cannot be decoded.
        InvalidArguments: a malformed task id, a version below 1, a ``timeout_s`` that is
            not a positive number, or a sharded job's parent (replay its shards).
        LedgerUnavailable: the ledger cannot be reached.
    """
    _check_run_arguments(version, timeout_s)
    with Control(app=app) as control:
        timeline = control.history(task_id)
    task = timeline.task
    definition = app.definition(task.name, task.version if version is None else version)
    return _run(app, definition, timeline, timeout_s)


def _sampled(app: App, definition: TaskDefinition, timeline: Timeline,
             timeout_s: float) -> ReplayReport:
    """:func:`_run`, with a task that cannot be replayed (params that cannot be decoded, a
    sharded job's parent) reported as not reproduced, its reason in ``error``."""
    try:
        return _run(app, definition, timeline, timeout_s)
    except (UndecodableData, InvalidArguments) as exc:
        task = timeline.task
        state = task.state.value if isinstance(task.state, State) else str(task.state)
        return ReplayReport(task.task_id, task.name, definition.version, task.version, state,
                            0, len(recorded_history(timeline)), False,
                            error=f"not replayed: {error_message(exc)}")


def replay_sample(app: App, name: str, *, version: int | None = None,
                  sample: int = 100, timeout_s: float = DEFAULT_TIMEOUT_S
                  ) -> list[ReplayReport]:
    """Replay the most recent tasks of type ``name`` that have a history (they were claimed
    at least once; any state, any recorded version) with the app's definition
    ``version`` (``ratchet replay --type T --version N --sample S``): a new definition
    checked against recorded histories of the old one before it is deployed.

    Args:
        app: the application (its definition of ``name`` is run; its ledger is read).
        name: the task type.
        version: the definition version to run; None: the newest the app defines.
        sample: how many tasks at most (1 .. :data:`MAX_SAMPLE`), newest first.
        timeout_s: how long (seconds) each body may run (see :func:`replay`).

    Returns:
        One :class:`ReplayReport` per task, newest first (empty when none ran yet).

    Raises:
        UnknownTask: the app does not define ``name`` or that version of it.
        InvalidArguments: ``sample`` out of range, a version below 1, a ``timeout_s``
            that is not a positive number.
        LedgerUnavailable: the ledger cannot be reached.
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or not 1 <= sample <= MAX_SAMPLE:
        raise InvalidArguments(f"sample must be an int from 1 to {MAX_SAMPLE}, got {sample!r}")
    _check_run_arguments(version, timeout_s)
    definition = app.definition(name, version)
    reports: list[ReplayReport] = []
    with Control(app=app) as control:
        cursor: str | None = None
        while len(reports) < sample:
            page = control.list_tasks(name=name, limit=min(1000, max(50, sample)),
                                      cursor=cursor)
            for info in page.tasks:
                if info.attempt < 1:
                    continue  # never claimed: no history to replay
                reports.append(_sampled(app, definition, control.history(info.task_id),
                                        timeout_s))
                if len(reports) >= sample:
                    break
            cursor = page.next_cursor
            if cursor is None:
                break
    return reports
