"""The task context a replayed body receives: the public ``ctx`` API answered from the
task's recorded history, never from the world.

Each checkpoint the body makes is matched against the recorded position it lands on
(kind, stored name with its occurrence, an effect's idempotency key and params digest)
and returns the recorded value: a step's result without calling its function, an
effect's recorded result without calling the target, a sleep at once, an event's
recorded payload, a child's recorded id and outcome. Nothing is written and nothing
external is called. The run stops (:class:`ReplayStop`) at the first checkpoint that
differs from the history (a divergence), at the first one after the end of the history,
and at an effect whose outcome the history lacks (an intent without a result).

:class:`ReplayCore` holds that logic once; :class:`ReplayContext` (for a plain ``def``
body) and :class:`AsyncReplayContext` (for an ``async def`` body: the same methods,
awaitable) are thin faces over it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

from ..errors import ChildFailed, EventTimeout, InvalidArguments
from ..ledger.base import BATCH_RUN_PREFIX
from ..outbox import check_topic
from ..serde import digest, dumps, loads
from ..shards import Shard, check_shards
from ..validation import MAX_KEY_BYTES, check_checkpoint_name, check_identifier
from ..worker.checkpoints import EMIT_PREFIX, occurrence_name
from ..worker.waits import ChildHandle
from .history import RecordedCheckpoint, describe_call

__all__ = ["AsyncReplayContext", "ReplayContext", "ReplayCore", "ReplayStop"]

REPLAY_HOLDER = "replay"
"""The ``ctx.holder`` a replayed body sees."""


class ReplayStop(BaseException):
    """Ends a replayed body at a checkpoint (internal to replay; a ``BaseException`` so
    that task code catching ``Exception`` does not swallow it).

    Attributes:
        kind: ``"divergence"`` (the body called something else than the history holds at
            ``position``) or ``"history_end"`` (the history holds nothing at
            ``position``, or an effect there has no recorded outcome).
        position: 0-based position of the checkpoint.
        recorded: what the history holds there, for people (None past its end).
        new: what the body called there, for people.
    """

    def __init__(self, kind: str, position: int, recorded: str | None, new: str) -> None:
        super().__init__(f"{kind} at position {position}: recorded {recorded}, new {new}")
        self.kind = kind
        self.position = position
        self.recorded = recorded
        self.new = new


class ReplayCore:
    """The replay of one task's code path against its recorded history (see the module
    docstring). Shared by the sync and async contexts.

    Args:
        task_id: the task replayed.
        history: its recorded checkpoints (:func:`~ratchet.replay.history.recorded_history`).
    """

    def __init__(self, task_id: str, history: Sequence[RecordedCheckpoint]) -> None:
        self.task_id = task_id
        self.history = {c.position: c for c in history}
        self.length = max(self.history) + 1 if self.history else 0
        """Positions in the recorded history (its last position plus one)."""
        self.next_position = 0
        """The position the body's next checkpoint lands on (= positions replayed)."""
        self._occurrences: dict[tuple[str, str], int] = {}
        self.stopped: ReplayStop | None = None
        """The first stop of the replay (once set, every further checkpoint raises it
        again at once), or None."""

    def _stop(self, kind: str, position: int, recorded: str | None, new: str) -> NoReturn:
        """Stop the replay here: the first stop is kept (:attr:`stopped`) and raised.

        Raises:
            ReplayStop: always.
        """
        if self.stopped is None:
            self.stopped = ReplayStop(kind, position, recorded, new)
        raise self.stopped.with_traceback(None)

    def _next(self, kind: str, name: str, key: str | None = None) -> RecordedCheckpoint:
        """The recorded checkpoint the body's next ``kind``/``name`` call lands on.

        Raises:
            ReplayStop: it differs from the history, or the history ends before it, or
                the replay has already stopped (a body that caught the stop).
        """
        if self.stopped is not None:
            raise self.stopped.with_traceback(None)  # no traceback growing in a loop
        occurrence = self._occurrences.get((kind, name), 0) + 1
        self._occurrences[(kind, name)] = occurrence
        stored = occurrence_name(name, occurrence)
        position = self.next_position
        new = describe_call(kind, stored, key)
        recorded = self.history.get(position)
        if recorded is None:
            self._stop("history_end", position, None, new)
        if recorded.kind != kind or recorded.stored_name != stored or (
                kind == "effect" and recorded.key != key):
            self._stop("divergence", position, recorded.describe(), new)
        self.next_position = position + 1
        return recorded

    def value(self, kind: str, name: str) -> Any:
        """The recorded value of the body's next step-like checkpoint ``name``."""
        recorded = self._next(kind, name)
        return loads(recorded.value_json, f"stored value of {recorded.describe()}")

    def step(self, name: str, fn: object) -> Any:
        """``ctx.step`` / ``ctx.transaction``: the recorded result; ``fn`` is not called."""
        check_checkpoint_name(name, "step name")
        if not callable(fn):
            raise InvalidArguments(f"ctx.step({name!r}, fn, ...): fn must be callable, got "
                                   f"{type(fn).__name__} {fn!r}")
        return self.value("step", name)

    def effect(self, name: str, call: object, key: str, params: Any) -> Any:
        """``ctx.effect``: the recorded result; ``call`` (and any lookup) is not called.

        Raises:
            ReplayStop: another checkpoint, key or params digest is recorded here, or the
                effect has no recorded outcome (its intent only, or settled as not done).
        """
        check_checkpoint_name(name, "effect name")
        check_identifier(key, "effect key", MAX_KEY_BYTES)
        if not callable(call):
            raise InvalidArguments(f"ctx.effect({name!r}, call, ...): call must be callable")
        position = self.next_position
        recorded = self._next("effect", name, key)
        params_digest = digest(name, key, dumps(params, what=f"params of effect {name!r}"))
        if recorded.params_digest is not None and recorded.params_digest != params_digest:
            self.next_position = position
            self._stop(
                "divergence", position,
                f"{recorded.describe()} with params digest {recorded.params_digest}",
                f"{recorded.describe()} with params digest {params_digest} (the same key "
                "must always carry the same request)")
        if not recorded.settled:
            self.next_position = position
            self._stop(
                "history_end", position,
                f"{recorded.describe()} recorded as {recorded.state!r}, without a result "
                "(its outcome is unknown to the history)",
                recorded.describe())
        return loads(recorded.value_json, f"recorded result of {recorded.describe()}")

    def emit(self, topic: str) -> str:
        """``ctx.emit``: the recorded message id; nothing is written."""
        check_topic(topic)
        return str(self.value("step", f"{EMIT_PREFIX}{topic}"))

    def sleep(self, name: str) -> None:
        """``ctx.sleep`` / ``ctx.sleep_until``: returns at once once matched."""
        check_checkpoint_name(name, "sleep name")
        self.value("step", f"sleep:{name}")

    def wait_for_event(self, name: str, key: str, timeout_s: float | None) -> Any:
        """``ctx.wait_for_event``: the recorded payload (or the recorded timeout).

        Raises:
            EventTimeout: the history recorded the wait's timeout.
            ReplayStop: as :meth:`_next` (the history ends while the task waits).
        """
        check_checkpoint_name(name, "event name")
        check_identifier(key, "event key", MAX_KEY_BYTES)
        self.value("step", f"event-deadline:{name}")
        got = self.value("step", f"event:{name}")
        if isinstance(got, dict) and got.get("timeout"):
            raise EventTimeout(name, key, timeout_s)
        return got.get("payload") if isinstance(got, dict) else None

    def submit_many(self, stored: str, name: str) -> list[ChildHandle]:
        """``ctx.submit`` / ``ctx.submit_many``: the recorded children; nothing submitted."""
        check_checkpoint_name(name, "child task name")
        value = self.value("step", stored)
        ids = value.get("ids", []) if isinstance(value, dict) else []
        return [ChildHandle(str(i), name, self.task_id) for i in ids]

    def gather(self, handles: Iterable[ChildHandle], return_exceptions: bool) -> list[Any]:
        """``ctx.gather``: the children's recorded outcomes.

        Raises:
            ChildFailed: a recorded child did not succeed (not with ``return_exceptions``).
            InvalidArguments: a handle is not a child of this task.
        """
        for h in handles:
            if not isinstance(h, ChildHandle) or h.parent_id != self.task_id:
                raise InvalidArguments(
                    f"ctx.gather takes handles of this task's children (ctx.submit), got "
                    f"{h!r:.100}")
        value = self.value("step", "gather")
        results: list[Any] = []
        for item in value if isinstance(value, list) else []:
            if item.get("ok"):
                results.append(item.get("result"))
                continue
            failed = ChildFailed(item.get("id"), item.get("state"), item.get("error"))
            if not return_exceptions:
                raise failed
            results.append(failed)
        return results

    def batches(self, name: str) -> dict[str, Any]:
        """``ctx.batches``: the run's recorded report; no batch function is called."""
        check_checkpoint_name(name, "batches name")
        report: dict[str, Any] = self.value("step", f"{BATCH_RUN_PREFIX}{name}")
        return report


def _sync_only(what: str) -> NoReturn:
    """What the worker's async context says of a call only plain ``def`` bodies have."""
    raise InvalidArguments(
        f"{what} is not available in an async def task (its batch functions run on "
        "threads of their own): make this task a plain def task")


class _ReplayAttributes:
    """What both replay contexts carry besides their methods: the attributes of
    :class:`~ratchet.TaskContext` (``task_id``, ``name``, ``generation``, ``attempt``,
    ``params``, ``holder``, ``shard``, ``app``...) from the task's record.

    Args:
        core: the replay of the task's code path.
        name: the task's name. generation, attempt: the task's recorded values.
        params: the decoded params. shard: its place in a sharded job, or None.
        app: the App whose definition is replayed.
    """

    def __init__(self, core: ReplayCore, name: str, generation: int, attempt: int,
                 params: dict[str, Any], shard: Shard | None, app: Any) -> None:
        self.core = core
        self.task_id = core.task_id
        self.name = name
        self.generation = generation
        self.attempt = attempt
        self.params = params
        self.holder = REPLAY_HOLDER
        self.shard = shard
        self.app = app
        self.exception: BaseException | None = None
        self.effect_downstream: str | None = None
        self.compensation_mode = False

    @property
    def fencing_token(self) -> int:
        """The task's recorded generation (as ``TaskContext.fencing_token``)."""
        return self.generation

    def check_process(self) -> None:
        """Nothing to check in a replay (no worker threads)."""

    def ensure_lease(self) -> None:
        """A replay holds no lease: always confirmed."""


class ReplayContext(_ReplayAttributes):
    """The context a replayed plain ``def`` body receives: the methods of
    :class:`~ratchet.TaskContext`, answered from the recorded history (module docstring).
    Arguments that only shape the first run (``durable=``, ``lookup=``, ``idempotent=``,
    ``fenced=``, ``in_flight_s=``, ``downstream=``, compensations, batch sizes) are
    accepted and ignored; names, keys and params are checked as the worker checks them."""

    def step(self, name: str, fn: Callable[..., Any], *args: Any, durable: bool = False,
             **kwargs: Any) -> Any:
        """The recorded result of this step (``fn`` is not called)."""
        return self.core.step(name, fn)

    def transaction(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The recorded result of this transaction step (``fn`` is not called)."""
        check_checkpoint_name(name, "transaction step name")
        return self.core.step(name, fn)

    def emit(self, topic: str, message: Any, *, key: str | None = None,
             message_id: str | None = None) -> str:
        """The recorded message id (nothing written)."""
        return self.core.emit(topic)

    def effect(self, name: str, call: Callable[..., Any], *, key: str,
               lookup: Callable[..., Any] | None = None, idempotent: bool = False,
               fenced: bool = False, params: Any = None, in_flight_s: float | None = None,
               downstream: str | None = None,
               compensate: Callable[[str, Any], Any] | None = None,
               compensate_lookup: Callable[[str], Any] | None = None) -> Any:
        """The recorded result of this effect (neither ``call`` nor ``lookup`` is called)."""
        return self.core.effect(name, call, key, params)

    def sleep(self, name: str, seconds: float) -> None:
        """Returns at once (the sleep is matched against the history)."""
        self.core.sleep(name)

    def sleep_until(self, name: str, when: datetime | float) -> None:
        """Returns at once (the sleep is matched against the history)."""
        self.core.sleep(name)

    def wait_for_event(self, name: str, *, key: str, timeout_s: float | None = None) -> Any:
        """The recorded payload (``EventTimeout`` if the history recorded the timeout)."""
        return self.core.wait_for_event(name, key, timeout_s)

    def submit(self, name: str, params: Mapping[str, Any] | None = None, *,
               key: str | None = None) -> ChildHandle:
        """The recorded child (nothing submitted)."""
        handles = self.core.submit_many(f"submit:{name}", name)
        return handles[0] if handles else ChildHandle("", name, self.task_id)

    def submit_many(self, name: str, params_list: Iterable[Mapping[str, Any]], *,
                    keys: Sequence[str] | None = None) -> list[ChildHandle]:
        """The recorded children (nothing submitted)."""
        return self.core.submit_many(f"submit_many:{name}", name)

    def submit_shards(self, name: str, params: Mapping[str, Any], count: int
                      ) -> list[ChildHandle]:
        """The recorded shards (nothing submitted)."""
        check_shards(count)
        return self.core.submit_many(f"submit_many:{name}", name)

    def gather(self, handles: Sequence[ChildHandle], *,
               return_exceptions: bool = False) -> list[Any]:
        """The children's recorded outcomes (``ChildFailed`` as recorded)."""
        return self.core.gather(list(handles), return_exceptions)

    def wait(self, handle: ChildHandle) -> Any:
        """One child's recorded outcome."""
        return self.core.gather([handle], False)[0]

    def batches(self, name: str, source: Any, fn: Callable[..., Any], *, size: int,
                parallel: int = 1, total: int | None = None) -> dict[str, Any]:
        """The run's recorded report (no batch is processed)."""
        return self.core.batches(name)


class AsyncReplayContext(_ReplayAttributes):
    """The context a replayed ``async def`` body receives: the methods of
    ``ratchet.AsyncTaskContext`` (awaitable), answered from the recorded history by the
    same :class:`ReplayCore` as :class:`ReplayContext`."""

    async def step(self, name: str, fn: Callable[..., Any], *args: Any,
                   durable: bool = False, **kwargs: Any) -> Any:
        """The recorded result of this step (``fn`` is not called or awaited)."""
        return self.core.step(name, fn)

    async def transaction(self, name: str, fn: Callable[..., Any], *args: Any,
                          **kwargs: Any) -> Any:
        """The recorded result of this transaction step (``fn`` is not called)."""
        check_checkpoint_name(name, "transaction step name")
        return self.core.step(name, fn)

    async def emit(self, topic: str, message: Any, *, key: str | None = None,
                   message_id: str | None = None) -> str:
        """The recorded message id (nothing written)."""
        return self.core.emit(topic)

    async def effect(self, name: str, call: Callable[..., Any], *, key: str,
                     lookup: Callable[..., Any] | None = None, idempotent: bool = False,
                     fenced: bool = False, params: Any = None,
                     in_flight_s: float | None = None, downstream: str | None = None,
                     compensate: Callable[[str, Any], Any] | None = None,
                     compensate_lookup: Callable[[str], Any] | None = None) -> Any:
        """The recorded result of this effect (neither ``call`` nor ``lookup`` runs)."""
        return self.core.effect(name, call, key, params)

    async def sleep(self, name: str, seconds: float) -> None:
        """Returns at once (the sleep is matched against the history)."""
        self.core.sleep(name)

    async def sleep_until(self, name: str, when: datetime | float) -> None:
        """Returns at once (the sleep is matched against the history)."""
        self.core.sleep(name)

    async def wait_for_event(self, name: str, *, key: str,
                             timeout_s: float | None = None) -> Any:
        """The recorded payload (``EventTimeout`` if the history recorded the timeout)."""
        return self.core.wait_for_event(name, key, timeout_s)

    async def submit(self, name: str, params: Mapping[str, Any] | None = None, *,
                     key: str | None = None) -> ChildHandle:
        """The recorded child (nothing submitted)."""
        handles = self.core.submit_many(f"submit:{name}", name)
        return handles[0] if handles else ChildHandle("", name, self.task_id)

    async def submit_many(self, name: str, params_list: Iterable[Mapping[str, Any]], *,
                          keys: Sequence[str] | None = None) -> list[ChildHandle]:
        """The recorded children (nothing submitted)."""
        return self.core.submit_many(f"submit_many:{name}", name)

    async def gather(self, handles: Sequence[ChildHandle], *,
                     return_exceptions: bool = False) -> list[Any]:
        """The children's recorded outcomes (``ChildFailed`` as recorded)."""
        return self.core.gather(list(handles), return_exceptions)

    async def wait(self, handle: ChildHandle) -> Any:
        """One child's recorded outcome."""
        return self.core.gather([handle], False)[0]

    def submit_shards(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not available in an async body, as in the worker's ``AsyncTaskContext``.

        Raises:
            InvalidArguments: always.
        """
        _sync_only("ctx.submit_shards")

    def batches(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Not available in an async body, as in the worker's ``AsyncTaskContext``.

        Raises:
            InvalidArguments: always.
        """
        _sync_only("ctx.batches")
