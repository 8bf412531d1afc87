"""The checkpoint log of a running task: what ``ctx.step`` records and replays (DESIGN §5).

:class:`CheckpointState` is the state of one attempt's :class:`~ratchet.worker.context.TaskContext`
below its public methods: the recorded history of checkpoints (kind, stored name,
position) and the check of each new checkpoint against it (occurrences,
:class:`~ratchet.errors.NonDeterministicReplay`), the pipelined step writes (steps run but
not yet durable, flushed without waiting or carried by the task's next durable write), the
boundary every checkpoint starts with (the stop, an operator request, a forked child, a
misuse), and the lease. Effects (:mod:`ratchet.worker.effects`) and transaction steps
(:mod:`ratchet.worker.transaction`) build on it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..breaker import DownstreamBreaker
from ..config import max_payload_bytes_from_env
from ..errors import (
    ContextUsedInAnotherProcess,
    InvalidArguments,
    LedgerUnavailable,
    NonDeterministicReplay,
    StaleGeneration,
    TransactionMisuse,
    UndecodableData,
    WriteRejected,
)
from ..faults import point as fault_point
from ..ledger.base import (
    COMPENSATING_STEP,
    LINEAGE_STEP,
    Claim,
    CommitOutcome,
    EffectRecord,
    EffectState,
    TaskWrite,
)
from ..lookups import RegisteredLookup
from ..outbox import check_topic, message_id_for, new_message
from ..ratelimit import RateLimit
from ..serde import dumps, loads
from ..shards import SHARD_PARAM, SHARDS_PARAM, Shard, check_shards, shard_place
from .heartbeat import LeaseHandle
from .hooks import Hooks
from .writer import LedgerWriter, WriterStopped

__all__ = ["EMIT_PREFIX", "Checkpoint", "CheckpointState", "ControlInterrupt", "HistoryEnd",
           "Shutdown", "StepKind", "describe_checkpoint", "occurrence_name"]



def _lineage_id(task_id: str, stored: str | None) -> str:
    """The lineage id a lineage step's stored JSON names, else ``task_id`` (no step, or a
    value that is not a non-empty JSON string)."""
    if stored is None:
        return task_id
    try:
        value = loads(stored, "lineage step")
    except UndecodableData:
        return task_id
    return value if isinstance(value, str) and value else task_id


class Shutdown(BaseException):
    """Raised at a step/effect boundary when the worker is stopping (task is released)."""


class HistoryEnd(BaseException):
    """Compensation mode (:mod:`ratchet.worker.waits`): the replay reached a checkpoint
    its recorded history lacks (internal; the compensations run next)."""


class ControlInterrupt(BaseException):
    """Raised at a step/effect boundary (before any new work) when an operator asked for
    this task: ``request`` is ``"cancel"`` (the worker commits a fenced ``RUNNING ->
    CANCELLED``) or ``"pause"`` (``RUNNING -> PAUSED``, the lease released and the attempt
    handed back). Never raised while an effect intent of the task is open: the effect is
    settled first (its call's reply, or the lookup; DESIGN §3, arbitration). Internal:
    task code should not catch it (like :class:`Shutdown`)."""

    def __init__(self, request: str) -> None:
        super().__init__(request)
        self.request = request


EMIT_PREFIX = "ratchet:emit:"
"""The stored step name of an emit is this plus its topic (occurrence-numbered)."""

StepKind = str
"""``"step"`` (also transaction steps) or ``"effect"``."""


def occurrence_name(name: str, occurrence: int) -> str:
    """The stored checkpoint name of the ``occurrence``-th (1-based) call of ``name``:
    ``name`` for the first, ``name#N`` for the N-th (DESIGN §5, occurrences)."""
    return name if occurrence == 1 else f"{name}#{occurrence}"


def describe_checkpoint(kind: StepKind, stored_name: str) -> str:
    """``"step 'item' (occurrence 2)"`` for the stored name ``item#2`` (for errors)."""
    base, sep, n = stored_name.rpartition("#")
    if sep and n.isdigit() and base:
        return f"{kind} {base!r} (occurrence {n})"
    return f"{kind} {stored_name!r} (occurrence 1)"


class Checkpoint:
    """One step or effect call, identified by kind, name and occurrence (DESIGN §5).

    Attributes:
        kind: ``"step"`` or ``"effect"``.
        name: the name the task code gave.
        occurrence: 1-based: the N-th call of ``name`` (of this kind) in the code path.
        stored_name: the name the ledger stores (:func:`occurrence_name`).
        seq: 0-based position among all checkpoints of the task's code path.
    """

    __slots__ = ("kind", "name", "occurrence", "seq", "stored_name")

    def __init__(self, kind: StepKind, name: str, occurrence: int, seq: int) -> None:
        self.kind = kind
        self.name = name
        self.occurrence = occurrence
        self.stored_name = occurrence_name(name, occurrence)
        self.seq = seq

    def describe(self) -> str:
        """For errors: ``"effect 'charge' (occurrence 2)"``."""
        return f"{self.kind} {self.name!r} (occurrence {self.occurrence})"


class CheckpointState:
    """The state of one attempt's task context and its checkpoint log (see the module
    docstring); :class:`~ratchet.worker.context.TaskContext` is the class task code sees.

    Args:
        claim: the claim the attempt runs under (its recorded steps and effects).
        holder: the worker holding the lease.
        writer: the worker's ledger writer.
        lease: the claim's lease.
        stopping: set when the worker stops (the next boundary raises :class:`Shutdown`).
        on_block: called before the task thread waits for the ledger (the executor wakes
            another thread meanwhile).
        hooks: the middleware dispatcher, or None.
    """

    def __init__(
        self,
        claim: Claim,
        holder: str,
        writer: LedgerWriter,
        lease: LeaseHandle,
        stopping: threading.Event,
        on_block: Callable[[], None] | None = None,
        hooks: Hooks | None = None,
    ) -> None:
        self._pid = os.getpid()  # the worker process: a forked child may not use it
        self.task_id = claim.task_id
        self.name = claim.name
        self.generation = claim.generation
        self.attempt = claim.attempt
        self.params: Any = None
        self._params_json = claim.params_json
        self.holder = holder
        self.exception: BaseException | None = None
        self._hooks = hooks
        self._writer = writer
        self.ledger_outage: LedgerUnavailable | None = None
        """Set when this task's write to the worker's own ledger found it unreachable (the
        runner then hands the attempt back instead of counting it)."""
        self._lease = lease
        self._stopping = stopping
        self._steps: dict[str, str] = (
            {n: s.result_json for n, s in claim.steps.items()} if claim.steps else {}
        )
        self._effects: dict[str, EffectRecord] = dict(claim.effects)
        self.lineage_id = _lineage_id(self.task_id, self._steps.get(LINEAGE_STEP))
        """The id of the first task of this task's chain of forks (``ratchet fork``): read
        from the reserved lineage step a fork holds (loaded with the claim); this task's
        own id when it is not a fork. :mod:`ratchet.fencing` keys its fence and done
        markers by it, so a fork finds what the original committed there."""
        # The recorded order of checkpoints: position -> (kind, stored name). Rows written
        # without a position (an older release) are matched by name only.
        self._history: dict[int, tuple[StepKind, str]] = {}
        self._recorded_seq: dict[tuple[StepKind, str], int] = {}
        if claim.steps or claim.effects:
            for n, st in claim.steps.items():
                if st.seq is not None:
                    self._history[st.seq] = ("step", n)
                    self._recorded_seq[("step", n)] = st.seq
            for n, ef in claim.effects.items():
                if ef.seq is not None:
                    self._history[ef.seq] = ("effect", n)
                    self._recorded_seq[("effect", n)] = ef.seq
        self._next_seq = 0
        self._occurrences: dict[tuple[StepKind, str], int] = {}
        self._ledger_t0 = claim.ledger_now
        self._mono_t0 = time.monotonic()
        self._on_block = on_block
        # Steps run in this attempt whose commit is not known yet (pipelined), in order, as
        # (stored name, result JSON, position); the first ``_sent`` of them were handed to
        # the writer by a flush.
        self._unsaved: list[tuple[str, str, int | None]] = []
        self._sent = 0
        self._saved: set[str] = set()  # names a flush confirmed (set by the writer thread)
        self._flush_stale = False
        self._flush_rejected: WriteRejected | None = None  # a flush the database refused
        self._flush_inflight = False  # a pipelined flush awaits its outcome (one at a time)
        self._flush_failed = False  # a flush was lost to an outage: resend from the first
        self._in_transaction = False  # inside a transaction step's fn (worker/transaction.py)
        self._in_step = False  # inside a step's fn: checkpoints there are refused
        self._interrupt: BaseException | None = None  # raised at the next boundary
        self._proved_absent = False  # the last _settle's lookup confirmed "not executed"
        self.downstream_calls: dict[str, int] = {}
        """Requests this attempt's effects sent, per declared downstream (retry budgets,
        DESIGN §7)."""
        self.failed_downstream: str | None = None
        """The downstream of the effect whose call raised last in this attempt, if any."""
        self._downstream: str | None = None  # of the effect being performed
        self.breakers: Mapping[str, DownstreamBreaker] = {}
        """Circuit breakers by downstream (the App's, set by the worker)."""
        self.downstream_rates: Mapping[str, RateLimit] = {}
        """Rate limits by downstream (the App's, set by the worker)."""
        self.lookups: Mapping[tuple[str, str], RegisteredLookup] = {}
        """Lookups registered with ``App.lookup`` by (task type, effect name) (the App's,
        set by the worker): the default of an effect given no ``lookup``."""
        self._released = True  # the breaker permit of the effect in flight was given back
        self.app: Any = None
        """The worker's :class:`~ratchet.App` (set by the worker): a task's children are
        submitted and read through it (:mod:`ratchet.worker.waits`)."""
        self.compensation_mode = COMPENSATING_STEP in self._steps
        """True when this attempt runs the task's compensations (it ends
        ``COMPENSATED``)."""
        self.compensating = self.compensation_mode
        """True while a compensation-mode attempt replays the recorded history: a
        checkpoint the history lacks ends the replay (:class:`HistoryEnd`)."""
        self.compensations_found: list[Any] = []
        """Compensations registered by this attempt's effects, in effect order."""
        self._event_after: dict[tuple[str, str], int] = {}
        self._effect_stored = ""  # stored name of the effect being performed
        self._scope = ""  # a batch's context: the prefix of its checkpoints' stored names
        self._parent: CheckpointState | None = None  # a batch's context: the task's
        self.shard: Shard | None = None
        """Where this task stands in its sharded job (``ctx.shard``: index and count), or
        None when it is not a shard (set with the params, :meth:`load_params`)."""
        self.shard_job: int | None = None
        """The shard count when this task is a sharded job's parent (``App.submit_sharded``;
        the worker runs the job's fan-out and fan-in instead of the task function)."""

    @property
    def effect_downstream(self) -> str | None:
        """The ``downstream=`` of the effect being performed (in ``before_effect`` /
        ``after_effect`` hooks: that effect's), or None when it declared none."""
        return self._downstream

    def load_params(self) -> dict[str, Any]:
        """Decode the task's stored params (sets :attr:`params`) and return them.

        Raises:
            UndecodableData: the stored params are not valid UTF-8 / JSON, or not an object.
        """
        params = loads(self._params_json, "params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise UndecodableData(f"params are a JSON {type(params).__name__}, not an object")
        shard = params.pop(SHARD_PARAM, None)
        job = params.pop(SHARDS_PARAM, None)
        if shard is not None:
            self.shard = shard_place(shard)
        if job is not None:
            try:
                self.shard_job = check_shards(job)
            except InvalidArguments as exc:
                raise UndecodableData(f"params key {SHARDS_PARAM!r}: {exc}") from None
        self.params = params
        return params

    # ------------------------------------------------------------------ plumbing

    def _ledger_now(self) -> float:
        """Estimate of the ledger clock, epoch seconds (never ahead of it: the claim's
        ledger time plus local monotonic time elapsed since the context was built)."""
        return self._ledger_t0 + (time.monotonic() - self._mono_t0)

    def check_process(self) -> None:
        """Raise unless called in the worker process this context belongs to.

        Raises:
            ContextUsedInAnotherProcess: task code forked and the child uses the context
                (its calls would wait for the worker's threads, which the child lacks).
        """
        pid = os.getpid()
        if pid != self._pid:
            raise ContextUsedInAnotherProcess(
                f"the task context of {self.name} {self.task_id}", self._pid, pid)

    def _boundary(self) -> None:
        if os.getpid() != self._pid:  # first: before any lock the fork may have copied held
            self.check_process()
        if self._in_step:
            # A replay returns the step's stored value without running its function, so
            # checkpoints made inside it would vanish from the replayed code path.
            raise TransactionMisuse(
                "ctx.step, ctx.effect, ctx.transaction and ratchet.fencing.fenced_step "
                "cannot be called inside a step's function (a replay returns the step's "
                "stored value without running it); call them one after the other")
        if self._in_transaction:
            # Inside a transaction step's fn: a checkpoint's write would wait for the row
            # or file lock that the step's own transaction holds.
            raise TransactionMisuse(
                "ctx.step, ctx.effect, ctx.emit and ctx.transaction cannot be called inside "
                "a transaction step's function; call them before or after ctx.transaction "
                "(a message that must commit with the step's writes: app.emit(..., "
                "connection=conn))")
        if self._interrupt is not None:
            raise self._interrupt
        if self._parent is not None and self._parent._interrupt is not None:
            raise self._parent._interrupt
        if self._stopping.is_set():
            raise Shutdown()
        self.check_control()
        if self._flush_stale:
            raise StaleGeneration(self.task_id, self.generation, "step flush")
        if self._flush_rejected is not None:
            raise self._flush_rejected

    def check_control(self) -> None:
        """Raise :class:`ControlInterrupt` when an operator request (cancel, pause) reached
        this claim and no effect intent of the task is open (an open one is settled first:
        the code path runs on to it, replaying what is done).

        Raises:
            ControlInterrupt: stop here; the runner commits the fenced move.
        """
        self.check_process()
        request = self._lease.request
        if request is not None and not self.open_intents():
            raise ControlInterrupt(request)

    def _checkpoint(self, kind: StepKind, name: str) -> Checkpoint:
        """Allocate the next checkpoint of the code path for ``kind``/``name`` and check it
        against the recorded history.

        Raises:
            NonDeterministicReplay: the history holds another checkpoint at this position,
                or this checkpoint was recorded at another position.
        """
        key = (kind, name)
        occurrence = self._occurrences.get(key, 0) + 1
        self._occurrences[key] = occurrence
        seq = self._next_seq
        self._next_seq = seq + 1
        cp = Checkpoint(kind, name, occurrence, seq)
        if self._scope:  # a batch's checkpoint: its own, outside the task's code path
            cp.stored_name = self._scope + cp.stored_name
            return cp
        if self._history:
            recorded = self._history.get(seq)
            if recorded is not None and recorded != (kind, cp.stored_name):
                raise NonDeterministicReplay(
                    self.task_id, seq, describe_checkpoint(*recorded), cp.describe())
            at = self._recorded_seq.get((kind, cp.stored_name))
            if at is not None and at != seq:
                raise NonDeterministicReplay(
                    self.task_id, seq, f"{cp.describe()} at checkpoint {at}",
                    f"{cp.describe()} at checkpoint {seq}")
        return cp

    def unsaved_steps(self) -> list[tuple[str, str, int | None]]:
        """Steps of this attempt not yet confirmed durable: the task's next write carries
        them (again, if a flush is still in flight: rewriting a step is idempotent)."""
        saved = self._saved
        if not saved:  # nothing confirmed by a flush (the common case): all of them
            return self._unsaved[:]
        return [s for s in self._unsaved if s[0] not in saved]

    def discard_unsaved_steps(self) -> None:
        """Forget the steps not yet durable (a write carrying them was refused): the
        task's failure write must not carry them again."""
        self._unsaved = []
        self._sent = 0

    def steps_saved(self, steps: list[tuple[str, str, int | None]]) -> None:
        """A write carrying ``steps`` committed: they are durable now."""
        # Everything unsaved was carried by that write or confirmed by a flush before it.
        self._unsaved = []
        self._sent = 0
        if steps:
            for _ in steps:
                fault_point("step.after_commit")

    def _commit(self, operation: str, **parts: Any) -> None:
        carried = self.unsaved_steps()
        if carried:
            parts["steps"] = [*carried, *parts.get("steps", ())]
        write = TaskWrite(self.task_id, self.generation, self.holder, operation, **parts)
        if self._on_block is not None:
            self._on_block()
        try:
            outcome = self._writer.commit(write)
        except WriteRejected:
            self.discard_unsaved_steps()  # one of them may be what was refused
            raise
        except LedgerUnavailable as exc:
            self.ledger_outage = exc  # the worker's own ledger, not the task's code
            raise
        if outcome.stale:
            raise StaleGeneration(self.task_id, self.generation, operation)
        self.steps_saved(carried)

    def _flush_steps(self) -> None:
        """Hand the steps not yet sent to the writer without waiting (pipelined).

        At most one flush per task is in flight: the next one is built only once the
        previous one's outcome is known, so after a flush lost to an outage the next one
        carries every step not confirmed, from the first. The durable history stays a
        prefix of the code path (a later flush never commits without an earlier one).
        """
        if self._flush_inflight:
            return  # these steps go with the next flush or the next durable write
        if self._flush_failed:
            self._flush_failed = False
            batch = self.unsaved_steps()
        else:
            batch = self._unsaved[self._sent :]
        if not batch:
            return
        self._sent = len(self._unsaved)
        write = TaskWrite(self.task_id, self.generation, self.holder,
                          f"step:{batch[-1][0]}", steps=batch)

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            try:
                if outcome is None:
                    if isinstance(error, WriteRejected):
                        self._flush_rejected = error  # raised at the next step or effect
                    else:
                        self._flush_failed = True  # the next flush starts from the first
                    return  # not durable: the next flush or write carries them again
                if outcome.stale:
                    self._flush_stale = True
                    return
                self._saved.update(s[0] for s in batch)
                for _ in batch:
                    fault_point("step.after_commit")
            finally:
                self._flush_inflight = False

        self._flush_inflight = True
        try:
            self._writer.submit(write, done)
        except WriterStopped:
            self._flush_inflight = False
            self._sent = 0  # writer stopping: the next write carries them

    def interrupt(self, exc: BaseException) -> None:
        """Make the task's next ``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` raise
        ``exc`` (any thread; e.g. the worker ended the attempt at its time limit)."""
        self._interrupt = exc

    @property
    def lease(self) -> LeaseHandle:
        """The lease this context runs under."""
        return self._lease

    def ensure_lease(self) -> None:
        """Raise :class:`~ratchet.errors.LeaseLost` unless the lease is confirmed right now
        (:class:`~ratchet.errors.ContextUsedInAnotherProcess` in a forked child)."""
        self.check_process()
        self._lease.ensure()

    def hooked_step(self, name: str, run: Callable[[], tuple[Any, bool]]) -> Any:
        """``run()`` (a step's body, returning ``(value, cached)``) between the middleware's
        ``before_step`` and ``after_step`` hooks (timed, with the exception if it raised);
        returns the value. Also used by transaction steps."""
        hooks = self._hooks
        if hooks is None:
            return run()[0]
        hooks.before_step(self, name)
        t0 = time.perf_counter()
        try:
            value, cached = run()
        except BaseException as exc:
            hooks.after_step(self, name, False, time.perf_counter() - t0, exc)
            raise
        hooks.after_step(self, name, cached, time.perf_counter() - t0, None)
        return value

    def _step(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
        durable: bool,
    ) -> tuple[Any, bool]:
        """:meth:`step` without its checks and hooks; returns ``(value, cached)``."""
        cp = self._checkpoint("step", name)
        stored_name = cp.stored_name
        stored = self._steps.get(stored_name)
        if stored is not None:
            return loads(stored, f"stored value of {cp.describe()}"), True
        if self.compensating:
            raise HistoryEnd(cp.describe())
        if self._sent < len(self._unsaved):
            self._flush_steps()
        self._in_step = True
        try:
            value = fn(*args, **kwargs)
        finally:
            self._in_step = False
        result_json = dumps(value, what=f"result of {cp.describe()}")
        self._steps[stored_name] = result_json
        self._unsaved.append((stored_name, result_json, cp.seq))
        if durable:
            self._commit(f"step:{stored_name}")
        return loads(result_json), False

    def _emit(self, topic: str, message: Any, key: str | None,
              message_id: str | None) -> str:
        """:meth:`~ratchet.worker.context.TaskContext.emit` after its boundary: the emit's
        checkpoint (a step named ``ratchet:emit:<topic>``, whose value is the message id)
        and the outbox row, committed together and fenced; a replay returns the recorded
        id and writes nothing."""
        check_topic(topic)
        cp = self._checkpoint("step", f"{EMIT_PREFIX}{topic}")
        stored = self._steps.get(cp.stored_name)
        if stored is not None:
            recorded = loads(stored, f"stored value of {cp.describe()}")
            return str(recorded)
        if self.compensating:
            raise HistoryEnd(cp.describe())
        mid = message_id if message_id is not None else message_id_for(
            self.task_id, cp.stored_name)
        limit = (self.app.max_payload_bytes if self.app is not None
                 else max_payload_bytes_from_env())
        try:
            msg = new_message(topic, message, key=key, message_id=mid,
                              max_payload_bytes=limit, task_id=self.task_id,
                              what=f"message of {cp.describe()}",
                              chosen_id=message_id is not None)
            result_json = dumps(mid)
            self._steps[cp.stored_name] = result_json
            self._unsaved.append((cp.stored_name, result_json, cp.seq))
            self._commit(f"emit:{topic}", outbox=[msg])
        except BaseException:
            # Not known durable (a refused message, an outage whose commit may have gone
            # through): the position is given back, so an emit the task code makes again
            # here is this very checkpoint, with the same message id (written once).
            self._steps.pop(cp.stored_name, None)
            self._unsaved = [u for u in self._unsaved if u[0] != cp.stored_name]
            self._occurrences[("step", cp.name)] -= 1
            self._next_seq = cp.seq
            raise
        fault_point("emit.after_commit")
        return mid

    def open_intents(self) -> list[str]:
        """Names of effects whose intent is recorded but whose outcome is not (safe to call
        from another thread than the task's: it reads a copy)."""
        return [n for n, r in list(self._effects.items()) if r.state is EffectState.INTENT]

