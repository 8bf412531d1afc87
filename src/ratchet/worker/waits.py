"""Workflow calls of a task context (DESIGN §3, waits; §5, compensation): durable sleep,
events, child tasks with fan-out and fan-in, and the compensations of completed effects.

Each call is a checkpoint of the task's code path, like ``ctx.step``: its first run records
what it decided (a sleep's deadline, an event's timeout, a child's id, the children's
results), and a replay returns the recorded value. A call that must wait raises
:class:`Suspend`, which the worker turns into the fenced ``RUNNING -> WAITING`` write: the
lease is released and the slot freed, no thread or memory is held, and the ledger makes the
task ``PENDING`` again at its deadline, when its event arrives or when its last awaited
child ends (:mod:`ratchet.ledger.ops.waits`). The next claim replays the code path to the
same call, which now returns.

Compensation mode: a task sent to ``COMPENSATING`` (it failed for good with completed
effects that have a compensation, or an operator ran ``ratchet compensate``) is replayed
from its recorded history only: every checkpoint returns its recorded value, and the first
one the history lacks (or an exception of the body) ends the replay (:class:`HistoryEnd`).
The compensations registered by the replayed effects then run in reverse order, each an
effect of its own (``compensate:<effect>``, key ``compensate:<key>``) through the same
intent-and-lookup protocol, and the task ends ``COMPENSATED``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import ChildFailed, EventTimeout, InvalidArguments
from ..ledger.base import COMPENSABLE_STEP, COMPENSATING_STEP, FOREVER, TaskInfo, WaitSpec
from ..serde import dumps, loads
from ..states import State
from ..validation import MAX_KEY_BYTES, check_checkpoint_name, check_finite, check_identifier
from .checkpoints import HistoryEnd
from .effects import EffectCalls

__all__ = ["ChildHandle", "Compensation", "HistoryEnd", "Suspend", "WorkflowCalls"]

_ENDED = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.COMPENSATED})


class Suspend(BaseException):
    """Raised by a wait that must park the task (internal: the worker writes
    ``RUNNING -> WAITING``). ``until``: its deadline, ledger-clock epoch seconds (a wait
    without one: :data:`~ratchet.ledger.base.FOREVER`); ``wait``: what it waits for;
    ``reason``: one line for the audit trail."""

    def __init__(self, until: float, wait: WaitSpec, reason: str) -> None:
        super().__init__(reason)
        self.until = until
        self.wait = wait
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ChildHandle:
    """A child task submitted by ``ctx.submit``: pass it to ``ctx.gather`` / ``ctx.wait``.

    Attributes:
        task_id: the child's id.
        name: the child's task name.
        parent_id: the task that submitted it.
    """

    task_id: str
    name: str
    parent_id: str


@dataclass(frozen=True, slots=True)
class Compensation:
    """A completed effect's compensation, registered as the replay passes the effect.

    Attributes:
        effect: the effect's stored name (``charge`` or ``charge#2``).
        key: the effect's idempotency key.
        result: the effect's recorded result.
        fn: ``fn(key, result)`` undoes it; receives ``compensate:<key>``.
        lookup: ``lookup(key)`` answers whether that compensation already happened, or None.
    """

    effect: str
    key: str
    result: Any
    fn: Callable[[str, Any], Any]
    lookup: Callable[[str], Any] | None


def _epoch_s(when: datetime | float, what: str) -> float:
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise InvalidArguments(f"{what}: a datetime needs a tzinfo (e.g. "
                                   "datetime.now(timezone.utc)); a naive one is ambiguous")
        return when.timestamp()
    return check_finite(when, f"{what} (epoch seconds or an aware datetime)")


class WorkflowCalls(EffectCalls):
    """Sleep, events, children and compensation of a task context (see the module
    docstring)."""


    # ------------------------------------------------------------------ recording

    def _recorded(self, name: str) -> tuple[Any, int, str]:
        """Allocate the next checkpoint of the code path for the workflow call ``name``
        (stored as a step); return its stored value (or None), position and stored name.
        In compensation mode a checkpoint the history lacks ends the replay."""
        self._boundary()
        cp = self._checkpoint("step", name)
        stored = self._steps.get(cp.stored_name)
        if stored is None:
            if self.compensating:
                raise HistoryEnd(cp.describe())
            return None, cp.seq, cp.stored_name
        return loads(stored, f"stored value of {cp.describe()}"), cp.seq, cp.stored_name

    def _record_value(self, stored_name: str, seq: int, value: Any) -> None:
        """Record a workflow call's value (pipelined like a step: durable with the task's
        next durable write, e.g. the wait's own)."""
        text = dumps(value, what=f"value of {stored_name}")
        self._steps[stored_name] = text
        self._unsaved.append((stored_name, text, seq))

    def _ledger_clock(self) -> float:
        """The ledger's clock now, read from the ledger (one round trip), for a deadline
        fixed at a call's first reach. The context's own estimate (the claim's clock plus
        local time since the context was built) is never ahead of the ledger, so a
        deadline measured from it would come early by however long the claim waited
        before its body started (prefetch)."""
        if self.app is None:
            return self._ledger_now()
        return max(float(self.app.ledger.now()), self._ledger_now())

    # ------------------------------------------------------------------ sleep

    def sleep(self, name: str, seconds: float) -> None:
        """Sleep durably for ``seconds`` from the first time this call is reached.

        The deadline (ledger clock) is fixed then and recorded as a checkpoint: a replay
        never recomputes it. Until it passes the task is ``WAITING``: its lease released,
        its slot freed, no thread held; the ledger makes it claimable at the deadline and
        the replay returns from this call. Occurrences as for ``ctx.step``.

        Raises:
            InvalidArguments: ``seconds`` is not a finite number >= 0, or ``name`` is not a
                storable identifier.
            NonDeterministicReplay: the history holds another checkpoint here.
        """
        check_checkpoint_name(name, "sleep name")
        seconds = check_finite(seconds, "seconds", minimum=0.0)
        self._sleep(name, lambda now: now + seconds)

    def sleep_until(self, name: str, when: datetime | float) -> None:
        """Sleep durably until ``when`` (an aware ``datetime``, or epoch seconds on the
        ledger's clock); see :meth:`sleep`. A time already past returns at once (still a
        checkpoint).

        Raises:
            InvalidArguments: ``when`` is a naive datetime or not a finite number, or
                ``name`` is not a storable identifier.
            NonDeterministicReplay: the history holds another checkpoint here.
        """
        check_checkpoint_name(name, "sleep name")
        until = _epoch_s(when, "sleep_until's when")
        self._sleep(name, lambda now: until)

    def _sleep(self, name: str, deadline_of: Callable[[float], float]) -> None:
        value, seq, stored = self._recorded(f"sleep:{name}")
        now = self._ledger_now()
        if value is None:
            deadline = deadline_of(self._ledger_clock())
            self._record_value(stored, seq, {"until": deadline})
        else:
            deadline = float(value["until"])
        if now >= deadline:
            return
        if self.compensating:  # compensation mode: the recorded history ends here
            raise HistoryEnd(f"sleep {name!r}")
        raise Suspend(deadline, WaitSpec("sleep"), f"sleep {name!r} until {deadline:.3f}")

    # ------------------------------------------------------------------ events

    def wait_for_event(self, name: str, *, key: str, timeout_s: float | None = None) -> Any:
        """Wait durably for the event ``(name, key)`` and return its payload.

        Events are stored (a mailbox): one sent after this task was submitted but before
        it reached this call is not lost. Each wait receives the first event of its
        ``(name, key)`` it has not received yet (a second wait on the same pair gets a
        later event); every task waiting on the pair receives it. The delivery is a
        checkpoint: a replay returns the same payload. Until an event comes the task is
        ``WAITING`` (no lease, no slot).

        Args:
            name: the event's name (``"shipped"``).
            key: the event's key (an order id; a task's own id for a signal,
                ``App.signal``).
            timeout_s: seconds from the first time this call is reached (recorded); None:
                wait without a deadline.

        Raises:
            EventTimeout: ``timeout_s`` passed without the event (a checkpoint too: a
                replay raises it again).
            InvalidArguments: a name or key that is not a storable identifier, or a timeout
                that is not a finite number >= 0.
            NonDeterministicReplay: the history holds another checkpoint here.
        """
        check_checkpoint_name(name, "event name")
        check_identifier(key, "event key", MAX_KEY_BYTES)
        if timeout_s is not None:
            timeout_s = check_finite(timeout_s, "timeout_s (seconds, or None)", minimum=0.0)
        limit, seq, stored = self._recorded(f"event-deadline:{name}")
        now = self._ledger_now()
        if limit is None:
            deadline = FOREVER if timeout_s is None else self._ledger_clock() + timeout_s
            self._record_value(stored, seq, {"until": deadline})
        else:
            deadline = float(limit["until"])
        got, seq, stored = self._recorded(f"event:{name}")
        pair = (name, key)
        if got is not None:
            if got.get("timeout"):
                raise EventTimeout(name, key, timeout_s)
            self._event_after[pair] = max(self._event_after.get(pair, 0), int(got["seq"]))
            return got.get("payload")
        if now >= deadline:
            self._record_value(stored, seq, {"timeout": True})
            raise EventTimeout(name, key, timeout_s)
        if self.compensating:
            raise HistoryEnd(f"event {name!r}")
        raise Suspend(deadline, WaitSpec("event", name, key, stored, seq,
                                      self._event_after.get(pair, 0)),
                      f"wait for event {name!r} key {key!r}")

    # ------------------------------------------------------------------ children

    def submit(self, name: str, params: Mapping[str, Any] | None = None, *,
               key: str | None = None) -> ChildHandle:
        """Submit a child task and return its handle (for :meth:`gather` / :meth:`wait`).

        Its idempotency key is ``key``, else derived from this task's id and this call's
        occurrence, so a replay finds the same child, never a second one. The child's id
        is a checkpoint of this task. Cancelling this task cancels its unfinished
        children.

        Raises:
            UnknownTask, InvalidArguments, PayloadNotSerializable, PayloadTooLarge: as
                ``App.submit`` (nothing was written).
            IdempotencyConflict: ``key`` was used before with other params.
            NonDeterministicReplay: the history holds another checkpoint here.
        """
        check_checkpoint_name(name, "child task name")
        return WorkflowCalls.submit_many(self, name, [params or {}],
                                         keys=None if key is None else [key], _one=True)[0]

    def submit_many(self, name: str, params_list: Iterable[Mapping[str, Any]], *,
                    keys: Sequence[str] | None = None, _one: bool = False,
                    _reserved: Sequence[Mapping[str, Any]] | None = None,
                    ) -> list[ChildHandle]:
        """Submit many children of one task type in one ledger transaction (fan-out; 10,000
        is one call) and return their handles in order. Keys as for :meth:`submit`
        (``keys``: one per item, or None for derived keys). One checkpoint for the batch.

        Raises:
            InvalidArguments: ``keys`` is not one per item.
            Same as :meth:`submit`; on any error no child was written.
        """
        value, seq, stored = self._recorded(f"submit:{name}" if _one else f"submit_many:{name}")
        if value is not None:
            return [ChildHandle(i, name, self.task_id) for i in value["ids"]]
        items = [dict(p) for p in params_list]
        if keys is not None and len(keys) != len(items):
            raise InvalidArguments(f"submit_many: {len(keys)} keys for {len(items)} params")
        derived = keys if keys is not None else (
            [f"{self.task_id}/{stored}"] if _one
            else [f"{self.task_id}/{stored}/{i}" for i in range(len(items))])
        handles = self.app.submit_children(self.task_id, name, items, list(derived),
                                           reserved=_reserved)
        ids = [h.task_id for h in handles]
        self._record_value(stored, seq, {"ids": ids})
        return [ChildHandle(i, name, self.task_id) for i in ids]

    def gather(self, handles: Sequence[ChildHandle], *,
               return_exceptions: bool = False) -> list[Any]:
        """Wait durably until every child in ``handles`` has ended; return their results
        in order.

        The task is ``WAITING`` meanwhile (no thread, no polling by it): the ledger wakes
        it once, when the last of them ends. The outcome is a checkpoint: a replay returns
        (or raises) the same.

        Args:
            handles: children of this task (from :meth:`submit` / :meth:`submit_many`).
            return_exceptions: put a :class:`~ratchet.errors.ChildFailed` in the place of
                a child that did not succeed instead of raising it.

        Raises:
            ChildFailed: a child ended ``FAILED``, ``CANCELLED`` or ``COMPENSATED`` (the
                first such in order; not with ``return_exceptions``).
            InvalidArguments: a handle is not a child of this task.
            NonDeterministicReplay: the history holds another checkpoint here.
        """
        handles = list(handles)
        for h in handles:
            if not isinstance(h, ChildHandle) or h.parent_id != self.task_id:
                raise InvalidArguments(
                    f"ctx.gather takes handles of this task's children (ctx.submit), got "
                    f"{h!r:.100}")
        value, seq, stored = self._recorded("gather")
        if value is None:
            ids = [h.task_id for h in handles]
            infos = {i.task_id: i for i in self.app.ledger.get_many(ids)} if ids else {}
            if any(infos.get(i) is None or infos[i].state not in _ENDED for i in ids):
                if self.compensating:
                    raise HistoryEnd("gather")
                left = sum(1 for i in ids if infos.get(i) is None
                           or infos[i].state not in _ENDED)
                raise Suspend(FOREVER,
                              WaitSpec("children", children=tuple(dict.fromkeys(ids))),
                              f"wait for {left} of {len(ids)} children")
            value = [_outcome(infos[i]) for i in ids]
            self._record_value(stored, seq, value)
        results: list[Any] = []
        for item in value:
            if item["ok"]:
                results.append(item["result"])
                continue
            failed = ChildFailed(item["id"], item["state"], item.get("error"))
            if not return_exceptions:
                raise failed
            results.append(failed)
        return results

    def wait(self, handle: ChildHandle) -> Any:
        """Wait durably for one child (:meth:`gather` of one) and return its result.

        Raises:
            ChildFailed: the child did not succeed.
        """
        return WorkflowCalls.gather(self, [handle])[0]

    # ------------------------------------------------------------------ compensation

    def register_compensation(self, effect: str, key: str, result: Any,
                               fn: Callable[[str, Any], Any],
                               lookup: Callable[[str], Any] | None) -> None:
        """A completed effect with a compensation (first run or replay): remember it, and
        record once that the task has one (the ledger then compensates a task an operator
        gives up on)."""
        self.compensations_found.append(Compensation(effect, key, result, fn, lookup))
        if COMPENSABLE_STEP not in self._steps:
            self._steps[COMPENSABLE_STEP] = "true"
            self._unsaved.append((COMPENSABLE_STEP, "true", None))

    def mark_compensating(self) -> None:
        """The task enters ``COMPENSATING``: its final write carries the marker step that
        puts the next claim in compensation mode."""
        self._steps[COMPENSATING_STEP] = "true"
        self._unsaved.append((COMPENSATING_STEP, "true", None))

    def run_compensations(self) -> list[dict[str, Any]]:
        """Compensation mode: run the registered compensations in reverse order, each an
        effect named ``compensate:<effect>`` with key ``compensate:<key>`` (its lookup
        ``lookup``); return what each returned (``[{"effect", "key", "result"}]``).

        Raises:
            Exception: whatever ``ctx.effect`` raises for a compensation (a failure is
                retried like any attempt's; an outcome that cannot be known goes
                ``UNKNOWN``).
        """
        self.compensating = False  # the compensations themselves run as new checkpoints
        done: list[dict[str, Any]] = []
        for comp in reversed(self.compensations_found):
            fn, result = comp.fn, comp.result
            value = self.sync_effect(  # type: ignore[attr-defined]
                f"compensate:{comp.effect}", lambda k, fn=fn, result=result: fn(k, result),
                key=f"compensate:{comp.key}", lookup=comp.lookup)
            done.append({"effect": comp.effect, "key": f"compensate:{comp.key}",
                         "result": value})
        return done


def _outcome(info: TaskInfo) -> dict[str, Any]:
    """A child's end as recorded by ``gather``."""
    if info.state is State.SUCCEEDED:
        return {"ok": True, "id": info.task_id, "result": info.result}
    return {"ok": False, "id": info.task_id, "state": str(info.state.value
            if isinstance(info.state, State) else info.state), "error": info.last_error}
