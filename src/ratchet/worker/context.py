"""What a running task sees: ``ctx.step`` and ``ctx.effect`` (DESIGN §5).

``ctx.step(name, fn, *args)`` runs a local computation once: its JSON result is committed
(fenced) with a done marker, and a later attempt returns the stored result without running
``fn``. The value returned is always the JSON round-trip of the result, so the first run
and a replay see the same thing.

A step's write is pipelined (DESIGN §5): ``ctx.step`` returns without waiting for the
ledger. The step rides along with the task's next write that must be durable (an effect
intent or result, the completion), in the same transaction, and is handed to the writer
without waiting when the next step starts. So nothing that leaves the process (an effect's
call, a reported result) ever depends on a step value that is not durable; after a crash a
step whose write was not yet durable simply runs again. ``ctx.step(..., durable=True)``
waits for the commit instead (for expensive steps).

``ctx.effect(name, call, key=..., lookup=..., idempotent=...)`` performs an external side
effect with the intent-before-call, lookup-first protocol:

1. the intent (name, key, params digest, attempt, generation) is committed before calling;
2. ``call(key)`` runs with the business idempotency key; its result is committed as done;
3. if an earlier attempt left an intent without a result, the outcome is unknown:
   ``lookup(key)`` is asked first — found: reuse the result, no call; ``NOT_FOUND``: call
   again with the same key; inconclusive (lookup raised) or no lookup: call again only if
   the target honours the key (``idempotent=True``), else the task goes to ``UNKNOWN``.

A call that times out or loses its reply (an unknown-outcome failure) goes straight to the
same lookup, never to failure. Before every new effect the lease must be confirmed
(``LeaseLost`` otherwise), and every write is fenced (``StaleGeneration``).

Every ``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` is a boundary: before any new
work it checks for an operator request on the claim (cancel, pause; read by the heartbeat)
and raises :class:`ControlInterrupt` when one is there and no effect intent is open (an
open one is settled first: the call's reply, or the lookup; a lookup that proves the call
never executed records it ``not_done`` and then stops, no new call is made).

A context belongs to the worker process: used from a child that task code forked, every
checkpoint (and the lease check) raises :class:`~ratchet.errors.ContextUsedInAnotherProcess`
at once (:mod:`ratchet.worker.forks`) instead of waiting for threads the child lacks.

Step and effect names and effect keys are checked where they enter
(:func:`ratchet.validation.check_identifier`: ``InvalidArguments``, a permanent failure).
Values read back from the ledger (params, stored step values, recorded effect results)
that cannot be decoded raise :class:`~ratchet.errors.UndecodableData`. A write the
database refuses raises :class:`~ratchet.errors.WriteRejected`; a pipelined step write
refused in the background raises it at the task's next step or effect.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import tenacity

from .. import faults
from ..breaker import DownstreamBreaker
from ..errors import (
    ContextUsedInAnotherProcess,
    EffectOutcomeUnknown,
    FenceError,
    InvalidArguments,
    LedgerError,
    LedgerUnavailable,
    NonDeterministicReplay,
    PermanentError,
    StaleGeneration,
    TokenRejected,
    TransactionMisuse,
    TransientError,
    UndecodableData,
    WriteRejected,
)
from ..ledger.base import (
    Claim,
    CommitOutcome,
    EffectRecord,
    EffectState,
    EffectWrite,
    LateEffect,
    TaskWrite,
)
from ..lookups import RegisteredLookup
from ..retry import FailureClass, classify, proves_not_executed
from ..serde import digest, dumps, loads, printable
from ..validation import MAX_KEY_BYTES, MAX_NAME_BYTES, check_checkpoint_name, check_identifier
from .heartbeat import LeaseHandle
from .hooks import EffectSettlement, Hooks
from .writer import LedgerWriter, WriterStopped

__all__ = ["NOT_FOUND", "Checkpoint", "ControlInterrupt", "NotFound", "Shutdown",
           "TaskContext"]

log = logging.getLogger("ratchet.worker")

T = TypeVar("T")


LATE_EVIDENCE_WAIT_S: Final = 30.0
"""How long a stale holder keeps trying to reach the ledger to record a late effect (or to
learn whether it was taken over), seconds: the evidence of a possible duplicate outlives a
short outage instead of being lost with it."""


class NotFound:
    """Type of :data:`NOT_FOUND`, the answer of a lookup that confirms the key is absent."""

    _instance: NotFound | None = None

    def __new__(cls) -> NotFound:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_FOUND"


NOT_FOUND: Final = NotFound()
"""Return this from a ``lookup`` to say: the target confirms this key never executed."""


class Shutdown(BaseException):
    """Raised at a step/effect boundary when the worker is stopping (task is released)."""


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


class TaskContext:
    """The handle a task function receives as its first argument.

    Attributes:
        task_id: the task's id.
        name: task name.
        generation: fencing token of this claim.
        attempt: 1-based claim count.
        params: the decoded params (a dict of keyword arguments; None until the worker
            decoded them, just before the task function is called).
        holder: the worker holding the lease.
        exception: what the task body raised in this attempt, once it ended (None if it
            returned); set by the worker for ``after_attempt`` hooks.
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
        self.lookups: Mapping[tuple[str, str], RegisteredLookup] = {}
        """Lookups registered with ``App.lookup`` by (task type, effect name) (the App's,
        set by the worker): the default of an effect given no ``lookup``."""
        self._released = True  # the breaker permit of the effect in flight was given back

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
                "ctx.step, ctx.effect and ctx.transaction cannot be called inside a "
                "transaction step's function; call them before or after ctx.transaction")
        if self._interrupt is not None:
            raise self._interrupt
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

    @property
    def fencing_token(self) -> int:
        """This claim's fencing token (the task's generation): grows with every claim of
        the task, so for a key that belongs to this task it only grows. Hand it to a target
        that checks tokens (``ctx.effect(..., fenced=True)`` does) or to
        :mod:`ratchet.fencing` for tables kept in another database."""
        return self.generation

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
                faults.point("step.after_commit")

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
                    faults.point("step.after_commit")
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

    # ------------------------------------------------------------------ steps

    def step(
        self, name: str, fn: Callable[..., T], *args: Any, durable: bool = False, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once per task and commit its result (fenced).

        Each call is its own checkpoint, identified by ``name`` and its occurrence (the
        N-th call of ``name`` in the task's code path; a loop calling ``ctx.step("item",
        ...)`` three times makes three checkpoints). A checkpoint committed by an earlier
        attempt returns the stored result without calling ``fn``. The calls must come in
        the recorded order (see :class:`~ratchet.errors.NonDeterministicReplay`).

        The commit is pipelined: it is made durable together with the task's next effect
        intent, effect result or completion (in the same transaction, before that write
        is acted on), or handed to the writer without waiting when the next step starts.
        Nothing outside the process sees a step value before it is durable; after a crash
        a step that was not yet durable runs again.

        Args:
            durable: wait until the step is committed before returning (for steps that
                are expensive to run again). Not passed to ``fn``.

        Returns:
            The JSON round-trip of ``fn``'s result.

        Raises:
            InvalidArguments: ``name`` is not a storable identifier (empty, not valid
                Unicode, NUL, over :data:`~ratchet.validation.MAX_NAME_BYTES`, or ending in
                ``#<digits>``, reserved for occurrences).
            NonDeterministicReplay: an earlier attempt recorded another checkpoint at this
                position of the code path (a permanent failure; nothing is reused).
            PayloadNotSerializable: the result is not plain JSON (a permanent failure).
            UndecodableData: the value stored by an earlier attempt cannot be decoded.
            StaleGeneration: another worker took the task over; nothing was written.
            WriteRejected: the database refused the step's write (``durable=True``, or a
                pipelined write of an earlier step).
        """
        self._boundary()
        check_checkpoint_name(name, "step name")
        if not callable(fn):
            raise InvalidArguments(f"ctx.step({name!r}, fn, ...): fn must be callable, got "
                                   f"{type(fn).__name__} {fn!r}")
        if self._hooks is None:
            return self._step(name, fn, args, kwargs, durable)[0]
        return self.hooked_step(name, lambda: self._step(name, fn, args, kwargs, durable))

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

    # ------------------------------------------------------------------ transaction steps

    def transaction(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(conn, *args, **kwargs)`` once per task in a ledger transaction that also
        checks this claim's generation and commits ``fn``'s JSON result as the step's
        checkpoint: the writes ``fn`` makes on ``conn`` commit together with the checkpoint
        or not at all, and a stale holder's transaction rolls back as a whole. For tables
        in the ledger's own database (the same SQLite file, or the same PostgreSQL
        database); tables elsewhere use :mod:`ratchet.fencing`.

        ``conn`` is a ``sqlite3.Connection`` or a ``psycopg.Connection``; ``fn`` must not
        commit, roll back or close it, and must not call ``ctx.step`` / ``ctx.effect`` /
        ``ctx.transaction``. Occurrences as for :meth:`step` (shared namespace with
        steps). Full rules and errors: :func:`ratchet.worker.transaction.run_transaction`.

        Returns:
            The JSON round-trip of ``fn``'s result (the stored value on a replay).

        Raises:
            StaleGeneration: another worker holds the task; ``fn`` was not called.
            TransactionMisuse: ``fn`` ended the transaction or nested a checkpoint.
            NonDeterministicReplay, InvalidArguments, PayloadNotSerializable,
            UndecodableData, WriteRejected, LedgerUnavailable: as for :meth:`step`.
            Exception: what ``fn`` raised, after everything was rolled back.
        """
        from .transaction import run_transaction

        return run_transaction(self, name, fn, args, kwargs)

    # ------------------------------------------------------------------ effects

    def effect(
        self,
        name: str,
        call: Callable[..., Any],
        *,
        key: str,
        lookup: Callable[..., Any] | None = None,
        idempotent: bool = False,
        fenced: bool = False,
        params: Any = None,
        in_flight_s: float | None = None,
        downstream: str | None = None,
    ) -> Any:
        """Perform an external side effect at most once per business ``key``.

        Each call is its own checkpoint, identified by ``name`` and its occurrence (the
        N-th call of ``name`` in the task's code path), like :meth:`step`.

        What "once" means depends on the target (DESIGN §5, "a frozen sender"): a holder
        frozen after its last lease check and before its request leaves can send it after
        another holder took the task over.

        * ``idempotent=True`` (the target honours the key): exactly once.
        * ``fenced=True`` (the target checks fencing tokens): exactly once.
        * ``lookup`` only: exactly once unless a sender was frozen past its lease; then its
          late call is detected, never silent: recorded as a late effect
          (:meth:`~ratchet.ledger.base.Ledger.late_effects`, ``ratchet status``,
          ``ratchet inspect``) for reconciliation.
        * neither: at least once; an outcome that cannot be established goes ``UNKNOWN``.

        Args:
            name: effect name (occurrences as for :meth:`step`).
            call: ``call(key) -> result``, or ``call(key, token)`` with ``fenced=True``;
                sends the request with ``key`` as its idempotency key. Its result must be
                plain JSON.
            key: business idempotency key, derived from the intent (e.g.
                ``f"charge:{order_id}"``), never from the attempt. It must not change
                between attempts of the same task (``NonDeterministicReplay`` if it does).
            lookup: ``lookup(key) -> result | NOT_FOUND`` (``lookup(key, token)`` with
                ``fenced=True``); asks the target whether ``key`` already executed.
                Raising means "inconclusive". None: the lookup registered for this task
                type and effect name with ``App.lookup`` (its ``in_flight_s`` too, unless
                given here), if any and not registered ``worker=False``.
            idempotent: the target itself deduplicates ``key`` (e.g. Stripe's
                Idempotency-Key), so calling again with it is safe when a lookup cannot
                settle the outcome.
            fenced: the target checks fencing tokens (Kleppmann): it rejects a request whose
                token (:attr:`fencing_token`, an int) is lower than the highest it has seen
                for ``key``, and a lookup records its token before answering (check and
                record atomic per key). ``call`` and ``lookup`` then get the token as their
                second argument, and a lookup's ``NOT_FOUND`` proves absence at once (no
                ``in_flight_s`` wait: an older request still in flight will be rejected).
                A call or lookup the target refused raises
                :class:`~ratchet.errors.TokenRejected`.
            params: what the call sends (for the params digest recorded with the intent).
            in_flight_s: how long a request of this effect can stay in flight at the target
                (client timeout plus the target's processing bound), seconds. A lookup's
                ``NOT_FOUND`` only proves absence once that long has passed since the request
                was sent (after an earlier attempt: since its intent was recorded, so add up to
                ``min(1, lease_s / 2)`` for the lease check before sending); before that, the
                task retries later and looks up again. Leave None
                only for targets that answer lookups for in-flight requests (or that honour
                the key, or check tokens): otherwise a request still in flight from a dead
                holder can execute after the lookup said "not found".
            downstream: the name of the system called (e.g. ``"psp"``): its requests count
                toward that downstream's retry budget (``app.downstream(name,
                budget=...)``), and a failure of this call charges the task's retry to it;
                with a circuit breaker (``app.downstream(name, breaker=...)``) the call is
                not sent while the breaker is open (DESIGN §7). None: no downstream.

        Returns:
            The JSON round-trip of the call's (or the lookup's) result.

        Raises:
            InvalidArguments: ``in_flight_s`` is not a finite number >= 0, or ``name`` or
                ``key`` is not a storable identifier (name up to
                :data:`~ratchet.validation.MAX_NAME_BYTES`, key up to
                :data:`~ratchet.validation.MAX_KEY_BYTES` UTF-8 bytes, no NUL or lone
                surrogate; a name may not end in ``#<digits>``).
            NonDeterministicReplay: the recorded history holds another checkpoint at this
                position, or this occurrence was recorded with another key.
            LeaseLost: the lease cannot be confirmed; the call was not made.
            StaleGeneration: another worker took the task over.
            TokenRejected: the (fenced) target refused this holder's token.
            EffectOutcomeUnknown: the outcome cannot be established; the task goes UNKNOWN.
            CircuitOpen: the downstream's circuit breaker is open; nothing was sent and no
                intent recorded (the worker hands the attempt back).
            UndecodableData: the result recorded by an earlier attempt cannot be decoded.
            WriteRejected: the database refused the intent or result write.
            Exception: what ``call`` raised, for the worker to classify.
        """
        self._boundary()
        check_checkpoint_name(name, "effect name")
        check_identifier(key, "effect key", MAX_KEY_BYTES)
        if in_flight_s is not None and (
            isinstance(in_flight_s, bool) or not isinstance(in_flight_s, int | float)
            or not math.isfinite(in_flight_s) or in_flight_s < 0
        ):
            raise InvalidArguments(
                f"in_flight_s must be a finite number of seconds >= 0 or None, got "
                f"{in_flight_s!r}"
            )
        _check_callable(call, 2 if fenced else 1, "call", "call(key, token)" if fenced
                        else "call(key)")
        registered = self.lookups.get((self.name, name)) if lookup is None else None
        if registered is not None and registered.worker:
            if registered.fenced != fenced:
                raise InvalidArguments(
                    f"the lookup registered for task {self.name!r} effect {name!r} "
                    f"(App.lookup) has fenced={registered.fenced}, but ctx.effect gives "
                    f"fenced={fenced}: register it with the effect's fenced")
            lookup = registered.fn
            if in_flight_s is None:
                in_flight_s = registered.in_flight_s
        if lookup is not None:
            _check_callable(lookup, 2 if fenced else 1, "lookup",
                            "lookup(key, token)" if fenced else "lookup(key)")
        if downstream is not None:
            check_identifier(downstream, "downstream name", MAX_NAME_BYTES)
        target = _Target(call, lookup, idempotent, fenced, in_flight_s)
        self._downstream = downstream
        hooks = self._hooks
        if hooks is None:
            return self._effect(name, key, target, params)[0]
        hooks.before_effect(self, name, key)
        t0 = time.perf_counter()
        try:
            value, settled = self._effect(name, key, target, params)
        except BaseException as exc:
            how: EffectSettlement = (
                "unknown" if isinstance(exc, EffectOutcomeUnknown) else "failed"
            )
            hooks.after_effect(self, name, key, how, time.perf_counter() - t0, exc)
            raise
        hooks.after_effect(self, name, key, settled, time.perf_counter() - t0, None)
        return value

    def _effect(
        self, name: str, key: str, target: _Target, params: Any,
    ) -> tuple[Any, EffectSettlement]:
        """:meth:`effect` without its checks and hooks; returns ``(value, how settled)``."""
        cp = self._checkpoint("effect", name)
        stored_name = cp.stored_name
        params_digest = digest(name, key, dumps(params, what=f"params of effect {name!r}"))
        record = self._effects.get(stored_name)
        if record is not None and record.key != key:
            raise NonDeterministicReplay(
                self.task_id, cp.seq, f"{cp.describe()} with idempotency key {record.key!r}",
                f"{cp.describe()} with idempotency key {key!r} (keys must come from the "
                "business intent, not the attempt)")
        if record is not None and record.params_digest != params_digest:
            raise PermanentError(
                f"{cp.describe()} (key {key!r}) was recorded with params digest "
                f"{record.params_digest} and is now asked with {params_digest}: the same key "
                "must always carry the same request (DESIGN §5)"
            )
        if record is not None and record.state is EffectState.DONE:
            return loads(record.result_json, f"recorded result of {cp.describe()}"), "cached"
        if record is not None and record.state in (EffectState.INTENT, EffectState.GIVEN_UP):
            # An earlier attempt recorded the intent but not the outcome (or an operator
            # gave up on it, then retried the task): query first.
            found, value = self._settle(cp, key, params_digest, target,
                                        "intent without result from an earlier attempt",
                                        record.updated_at)
            if found:
                return value, "lookup"
            self._settled_absent(cp, key, params_digest)
        breaker = self.breakers.get(self._downstream) if self._downstream else None
        # Raises CircuitOpen while the downstream's breaker is open: nothing is sent and no
        # intent recorded; the worker hands the attempt back (DESIGN §7).
        probe = breaker.acquire() if breaker is not None else False
        try:
            return self._send(cp, key, params_digest, target, breaker, probe)
        finally:
            if breaker is not None and not self._released:
                breaker.cancel(probe)  # ended before the call (e.g. the lease was lost)

    def _send(
        self, cp: Checkpoint, key: str, params_digest: str, target: _Target,
        breaker: DownstreamBreaker | None, probe: bool,
    ) -> tuple[Any, EffectSettlement]:
        """Record the intent, call, record the outcome (:meth:`_effect` after the checks
        of an existing record and the breaker)."""
        self._released = breaker is None
        stored_name = cp.stored_name
        self._lease.ensure()
        self._commit(
            f"effect_intent:{stored_name}",
            effects=[EffectWrite(stored_name, key, params_digest, EffectState.INTENT,
                                 seq=cp.seq)],
        )
        self._effects[stored_name] = EffectRecord(
            stored_name, key, params_digest, EffectState.INTENT, None, self.generation,
            self.attempt, 1, False, self._ledger_now(), cp.seq,
        )
        faults.point("effect.after_intent")
        if self._on_block is not None:
            self._on_block()
        # The last check before the request leaves: the safe window (which keeps a margin
        # of the lease, DESIGN §4) must still be open. A holder frozen after this line can
        # still send late; what that means per kind of target is in the docstring.
        self._lease.ensure()
        faults.point("effect.before_call")
        sent_at = self._ledger_now()
        downstream = self._downstream
        if downstream is not None:
            self.downstream_calls[downstream] = self.downstream_calls.get(downstream, 0) + 1
        try:
            result = target.send(key, self.generation)
        except Exception as exc:
            if breaker is not None:
                self._released = True
                breaker.release(probe, exc)
            if downstream is not None:
                self.failed_downstream = downstream
            in_window = self._lease.remaining_s() > 0
            if isinstance(exc, TokenRejected):
                self._token_rejected(cp, key, params_digest, exc)
            if isinstance(exc, FenceError):
                raise
            if proves_not_executed(exc):
                # Evidence that nothing happened: the next attempt calls again (same key)
                # without a lookup, even when the target cannot be asked.
                self._record(cp, key, params_digest, EffectState.NOT_DONE, None, False)
                raise
            late = (not in_window and not target.idempotent
                    and self._taken_over(LATE_EVIDENCE_WAIT_S) is True)
            if late:
                # Sent after our safe window closed, and another holder has the task: the
                # request may have executed after its lookup. Keep the evidence now: what
                # this attempt writes next is fenced out (with no lookup the UNKNOWN
                # write, which would otherwise be the only trace, is rejected too).
                self._record_late(cp, key, "unknown", printable(repr(exc)))
            if classify(exc) is not FailureClass.UNKNOWN_OUTCOME:
                raise
            try:
                found, value = self._settle(cp, key, params_digest, target,
                                            f"call failed with unknown outcome: {exc!r}",
                                            sent_at)
            except StaleGeneration:
                if not late and not in_window and not target.idempotent:
                    self._record_late(cp, key, "unknown", printable(repr(exc)))
                raise
            if found:
                return value, "lookup"
            self._settled_absent(cp, key, params_digest)
            raise TransientError(
                f"{cp.describe()} (key {key!r}) had an unknown outcome and the target "
                "confirmed it did not execute; retrying with the same key"
            ) from exc
        if breaker is not None:
            self._released = True
            breaker.release(probe, None)
        if downstream is not None and self.failed_downstream == downstream:
            self.failed_downstream = None  # it answered since
        # A reply that arrived inside the safe window proves the request executed before
        # the lease could expire, so before any takeover: the next holder's lookup sees it.
        in_window = self._lease.remaining_s() > 0
        faults.point("effect.after_call")
        try:
            return self._record_done(cp, key, params_digest, result, via_lookup=False), "call"
        except StaleGeneration:
            # The reply came after our safe window closed and another holder took the task
            # over: the request may have executed after the new holder looked up (we were
            # frozen between the lease check and the send). Keep the evidence, unfenced,
            # unless the target deduplicates the key itself (then it was a replay).
            if not in_window and not target.idempotent:
                self._record_late(cp, key, "done", _json_or_repr(result))
            raise
        except LedgerUnavailable:
            # The result write did not reach the ledger; if another holder has the task,
            # this late call is still evidence to keep (waiting for the ledger a while).
            if (not in_window and not target.idempotent
                    and self._taken_over(LATE_EVIDENCE_WAIT_S) is True):
                self._record_late(cp, key, "done", _json_or_repr(result))
            raise

    def _settled_absent(self, cp: Checkpoint, key: str, params_digest: str) -> None:
        """An open intent was settled as "call again" (a lookup confirmed the call did not
        execute, or the target honours the key). With an operator request on the task,
        no new call is made: a confirmed absence is recorded (``not_done``) and the request
        applied; without that proof the outcome stays unknown (``UNKNOWN``, the request
        kept for the resolution; DESIGN §3).

        Raises:
            ControlInterrupt: the request, once the effect is recorded not done.
            EffectOutcomeUnknown: only a new call could settle it, and a request forbids it.
        """
        request = self._lease.request
        if request is None:
            return
        if self._proved_absent:
            self._record(cp, key, params_digest, EffectState.NOT_DONE, None, False)
            raise ControlInterrupt(request)
        raise EffectOutcomeUnknown(
            cp.stored_name, key,
            f"an operator asked to {request} the task, and only calling again could settle "
            "the open intent (the target honours the key but no lookup confirmed the "
            "outcome); resolve it (ratchet resolve)")

    def _token_rejected(
        self, cp: Checkpoint, key: str, params_digest: str, exc: TokenRejected
    ) -> None:
        """The target refused this claim's fencing token. Return (the caller re-raises
        ``exc``: this holder is stale) when the ledger has a newer claim or cannot tell;
        when this claim is still the current one, the target's tokens for ``key`` come from
        elsewhere (another task uses the key, or the target counts its own): record the
        effect as not done (the target refused it) and fail permanently instead of idling
        until the lease expires.

        Raises:
            PermanentError: this claim is current, yet the target refused its token.
        """
        log.warning("task %s: %s", self.task_id, exc)
        if self._taken_over(1.0) is not False:
            return
        self._record(cp, key, params_digest, EffectState.NOT_DONE, None, False)
        raise PermanentError(
            f"{cp.describe()}: the target refused fencing token {exc.token} for key {key!r}"
            f" (highest it has seen: {exc.highest}), but this claim (generation "
            f"{self.generation}) is the task's current one: another task uses the same key, "
            "or the target's tokens do not come from this task's claims. Keys of a fenced "
            "effect must belong to one task."
        ) from exc

    def _taken_over(self, wait_s: float) -> bool | None:
        """True when the ledger says another claim of this task exists (a read, not
        fenced); None when the ledger could not be read within ``wait_s`` seconds."""
        try:
            info = _until_ledger_answers(lambda: self._writer.ledger.get(self.task_id), wait_s)
        except (LedgerError, OSError) as exc:
            log.error("task %s: cannot tell whether the task was taken over (%s)",
                      self.task_id, exc)
            return None
        return info.generation != self.generation

    def _record_late(self, cp: Checkpoint, key: str, outcome: str, detail: str | None) -> None:
        """Append a late-effect record for a call this stale holder sent after its safe
        window closed, to a target that does not deduplicate keys (never raises: a ledger
        failure here is logged; the stale rejection itself is audited anyway)."""
        log.warning(
            "task %s: %s (key %s) was sent by generation %d after a takeover; recording a "
            "late effect (possible duplicate at a target that cannot deduplicate)",
            self.task_id, cp.describe(), key, self.generation,
        )
        if self._hooks is not None:
            self._hooks.late_effect(self, cp.name, key, outcome)
        late = LateEffect(0, self.task_id, cp.stored_name, key, self.generation, self.holder,
                          0.0, outcome, detail)
        try:
            _until_ledger_answers(lambda: self._writer.ledger.record_late_effect(late),
                                  LATE_EVIDENCE_WAIT_S)
        except (LedgerError, OSError) as exc:
            log.error("task %s: could not record the late effect of %s (key %s, "
                      "generation %d): %s", self.task_id, cp.describe(), key,
                      self.generation, exc)

    def open_intents(self) -> list[str]:
        """Names of effects whose intent is recorded but whose outcome is not (safe to call
        from another thread than the task's: it reads a copy)."""
        return [n for n, r in list(self._effects.items()) if r.state is EffectState.INTENT]

    def _record_done(
        self, cp: Checkpoint, key: str, params_digest: str, result: Any, via_lookup: bool
    ) -> Any:
        result_json = dumps(result, what=f"result of {cp.describe()}")
        self._record(cp, key, params_digest, EffectState.DONE, result_json, via_lookup)
        return loads(result_json)

    def _record(
        self,
        cp: Checkpoint,
        key: str,
        params_digest: str,
        state: EffectState,
        result_json: str | None,
        via_lookup: bool,
    ) -> None:
        name = cp.stored_name
        self._commit(
            f"effect_{state.value}:{name}",
            effects=[EffectWrite(name, key, params_digest, state, result_json, via_lookup,
                                 cp.seq)],
        )
        self._effects[name] = EffectRecord(
            name, key, params_digest, state, result_json, self.generation, self.attempt, 0,
            via_lookup, 0.0, cp.seq,
        )

    def _settle(
        self,
        cp: Checkpoint,
        key: str,
        params_digest: str,
        target: _Target,
        why: str,
        intent_at: float,
    ) -> tuple[bool, Any]:
        """Resolve an unknown outcome. Returns ``(True, result)`` when the lookup found it,
        ``(False, None)`` when calling again with the same key is safe.

        Raises:
            TransientError: the lookup failed transiently, or said "not found" while a
                request may still be in flight; try again later (lookup first).
            TokenRejected: the fenced target refused this holder's token.
            EffectOutcomeUnknown: nothing can settle it and the target does not dedupe.
        """
        reason = f"{why}; no lookup given"
        what = cp.describe()
        self._proved_absent = False
        if target.lookup is not None:
            try:
                answer = target.ask(key, self.generation)
            except TokenRejected as exc:
                self._token_rejected(cp, key, params_digest, exc)
                raise
            except FenceError:
                raise
            except Exception as exc:
                cls = classify(exc)
                reason = f"{why}; lookup inconclusive: {exc!r}"
                if not target.idempotent and cls in (FailureClass.TRANSIENT,
                                                     FailureClass.OVERLOAD):
                    raise TransientError(
                        f"lookup for {what} (key {key!r}) failed: {exc!r}; will look up "
                        "again before any new call"
                    ) from exc
            else:
                if isinstance(answer, NotFound):
                    waited_s = self._ledger_now() - intent_at
                    in_flight_s = target.in_flight_s
                    if (not target.fenced and in_flight_s is not None
                            and waited_s < in_flight_s):
                        raise TransientError(
                            f"lookup for {what} (key {key!r}) found nothing, but the "
                            f"request sent {waited_s:.1f} s ago may still be in flight "
                            f"(in_flight_s={in_flight_s}); looking up again later",
                            retry_after_s=in_flight_s - waited_s,
                        )
                    log.info("%s key %s: lookup confirms not executed", what, key)
                    self._proved_absent = True
                    return False, None
                log.info("%s key %s: lookup found an earlier execution", what, key)
                return True, self._record_done(cp, key, params_digest, answer, via_lookup=True)
        if target.idempotent:
            return False, None
        raise EffectOutcomeUnknown(cp.stored_name, key, reason)


class _Target:
    """How to reach one effect's target: its call, lookup and what it guarantees."""

    __slots__ = ("call", "fenced", "idempotent", "in_flight_s", "lookup")

    def __init__(
        self, call: Callable[..., Any], lookup: Callable[..., Any] | None, idempotent: bool,
        fenced: bool, in_flight_s: float | None,
    ) -> None:
        self.call = call
        self.lookup = lookup
        self.idempotent = idempotent
        self.fenced = fenced
        self.in_flight_s = in_flight_s

    def send(self, key: str, token: int) -> Any:
        """Call the target (with the fencing token when it checks tokens)."""
        return self.call(key, token) if self.fenced else self.call(key)

    def ask(self, key: str, token: int) -> Any:
        """Ask the target's lookup (with the fencing token when it checks tokens)."""
        assert self.lookup is not None
        return self.lookup(key, token) if self.fenced else self.lookup(key)


def _until_ledger_answers(call: Callable[[], T], wait_s: float) -> T:
    """``call()``, tried again while the ledger is unreachable (``LedgerError``,
    ``OSError``), backing off from 0.05 s to at most 1 s, for up to ``wait_s`` seconds.

    Raises:
        LedgerError, OSError: the last failure, once ``wait_s`` has passed.
    """
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type((LedgerError, OSError)),
        wait=tenacity.wait_exponential(multiplier=0.05, max=1.0),
        stop=tenacity.stop_after_delay(wait_s),
        reraise=True,
    )
    return retrying(call)


def _check_callable(fn: object, args: int, what: str, shape: str) -> None:
    """Refuse a ``call``/``lookup`` that cannot take ``args`` positional arguments, before
    any intent is recorded (a ``TypeError`` after the intent would send the task to
    ``UNKNOWN`` although nothing was called).

    Raises:
        InvalidArguments: ``fn`` is not callable, or its signature cannot bind ``args``
            positional arguments (signatures that cannot be read are not checked).
    """
    if not callable(fn):
        raise InvalidArguments(f"ctx.effect {what} must be callable as {shape}, got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a readable signature: trust it
    try:
        signature.bind(*range(args))
    except TypeError as exc:
        raise InvalidArguments(
            f"ctx.effect calls its {what} as {shape}, but {fn!r} cannot take {args} "
            f"positional argument(s) ({exc})"
            + ("; fenced=True passes the fencing token as the second argument" if args == 2
               else "")
        ) from None


def _json_or_repr(value: Any) -> str:
    """``value`` as JSON text for a late-effect record, or its repr if it is not JSON."""
    try:
        return dumps(value)
    except Exception:
        return printable(repr(value))
