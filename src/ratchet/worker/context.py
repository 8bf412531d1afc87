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

import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import EffectOutcomeUnknown, InvalidArguments
from ..params import register_context_class
from ..validation import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_checkpoint_name,
    check_finite,
    check_identifier,
)
from .batches import BatchCalls
from .checkpoints import Checkpoint as Checkpoint
from .checkpoints import ControlInterrupt as ControlInterrupt
from .checkpoints import Shutdown as Shutdown
from .effects import NOT_FOUND as NOT_FOUND
from .effects import EffectTarget, check_effect_callable
from .effects import NotFound as NotFound
from .events import EffectSettlement
from .transaction import run_transaction
from .waits import ChildHandle as ChildHandle

__all__ = ["NOT_FOUND", "Checkpoint", "ChildHandle", "ControlInterrupt", "NotFound", "Shutdown",
           "TaskContext"]

T = TypeVar("T")


class TaskContext(BatchCalls):
    """The handle a task function receives as its first argument.

    Attributes:
        task_id: the task's id.
        lineage_id: the id of the first task of its chain of forks (``ratchet fork``); its
            own ``task_id`` when it is not a fork (:mod:`ratchet.fencing` keys by it).
        name: task name.
        generation: fencing token of this claim.
        attempt: 1-based claim count.
        params: the decoded params (a dict of keyword arguments; None until the worker
            decoded them, just before the task function is called).
        holder: the worker holding the lease.
        exception: what the task body raised in this attempt, once it ended (None if it
            returned); set by the worker for ``after_attempt`` hooks.

    Built by the worker for each attempt (arguments:
    :class:`~ratchet.worker.checkpoints.CheckpointState`); the checkpoint log lives in
    :mod:`ratchet.worker.checkpoints`, the effect protocol in :mod:`ratchet.worker.effects`,
    transaction steps in :mod:`ratchet.worker.transaction`.
    """
    @property
    def fencing_token(self) -> int:
        """This claim's fencing token (the task's generation): grows with every claim of
        the task, so for a key that belongs to this task it only grows. Hand it to a target
        that checks tokens (``ctx.effect(..., fenced=True)`` does) or to
        :mod:`ratchet.fencing` for tables kept in another database."""
        return self.generation
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
            NonDeterministicReplay: as for :meth:`step`.
            InvalidArguments: as for :meth:`step`.
            PayloadNotSerializable: as for :meth:`step`.
            UndecodableData: as for :meth:`step`.
            WriteRejected: as for :meth:`step`.
            LedgerUnavailable: as for :meth:`step`.
            Exception: what ``fn`` raised, after everything was rolled back.
        """
        return run_transaction(self, name, fn, args, kwargs)

    # ------------------------------------------------------------------ the outbox

    def emit(self, topic: str, message: Any, *, key: str | None = None,
             message_id: str | None = None) -> str:
        """Write ``message`` to the transactional outbox, once per task: the outbox row
        commits in the same fenced transaction as this emit's checkpoint, so a stale
        holder's emit never becomes visible, and a later attempt that replays this
        position returns the recorded message id and writes nothing (DESIGN §6, row 10).
        Returns once the row is durable. A relay (``ratchet relay``) then publishes it
        and marks it sent once the broker confirmed it; a relay that dies in between
        publishes it again with the same message id, for consumers to deduplicate.

        Each call is a checkpoint of the code path (a step named ``ratchet:emit:<topic>``,
        numbered per occurrence like any step).

        Args:
            topic: the RabbitMQ routing key / NATS subject, dot-separated words
                (``"order.paid"``).
            message: plain JSON, size-limited like params.
            key: the ordering key: messages of one key reach the broker in the order
                their transactions committed. None: no order with other messages.
            message_id: the id consumers deduplicate by; default one derived from the task
                and this emit's position, the same for every holder of the task.

        Returns:
            The message id.

        Raises:
            InvalidArguments: a topic, key or message id that cannot be stored or routed.
            PayloadNotSerializable: ``message`` is not plain JSON (a permanent failure).
            PayloadTooLarge: the message is over the payload limit.
            NonDeterministicReplay: an earlier attempt recorded another checkpoint here.
            StaleGeneration: another worker took the task over; nothing was written.
            TransactionMisuse: called inside a step's or a transaction step's function
                (inside ``ctx.transaction``, write it with ``app.emit(...,
                connection=conn)``: it then commits with the transaction step).
        """
        self._boundary()
        return self._emit(topic, message, key, message_id)

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
        compensate: Callable[[str, Any], Any] | None = None,
        compensate_lookup: Callable[[str], Any] | None = None,
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
            compensate: ``compensate(key, result)`` undoes this effect once it completed
                (a saga, DESIGN §5): when the task ends ``FAILED`` (permanent error,
                attempts exhausted, an operator's give-up) or an operator runs ``ratchet
                compensate``, the compensations of its completed effects run in reverse
                order, each an effect of its own named ``compensate:<name>`` whose key
                ``compensate:<key>`` it receives, with this effect's recorded ``result``;
                then the task is ``COMPENSATED``.
            compensate_lookup: ``compensate_lookup(key) -> result | NOT_FOUND``: whether
                the compensation with that key already happened (as ``lookup`` for the
                effect); without it, a compensation whose outcome is lost goes
                ``UNKNOWN`` unless the target deduplicates the key.

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
        scope = self._batch_scope()
        if scope is not None:  # called from a batch function: the batch's own effect
            if compensate is not None or compensate_lookup is not None:
                raise InvalidArguments(
                    f"effect {name!r}: an effect inside a batch function cannot register a "
                    "compensation (a batch is not replayed once committed)")
            return scope.effect(name, call, key=key, lookup=lookup, idempotent=idempotent,
                                fenced=fenced, params=params, in_flight_s=in_flight_s,
                                downstream=downstream)
        self._boundary()
        check_checkpoint_name(name, "effect name")
        check_identifier(key, "effect key", MAX_KEY_BYTES)
        if in_flight_s is not None:
            in_flight_s = check_finite(in_flight_s, "in_flight_s (seconds, or None)",
                                       minimum=0.0)
        check_effect_callable(call, 2 if fenced else 1, "call", "call(key, token)" if fenced
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
            check_effect_callable(lookup, 2 if fenced else 1, "lookup",
                            "lookup(key, token)" if fenced else "lookup(key)")
        if downstream is not None:
            check_identifier(downstream, "downstream name", MAX_NAME_BYTES)
        if compensate is not None:
            check_effect_callable(compensate, 2, "compensate", "compensate(key, result)")
        if compensate_lookup is not None:
            check_effect_callable(compensate_lookup, 1, "compensate_lookup",
                                  "compensate_lookup(key)")
        target = EffectTarget(call, lookup, idempotent, fenced, in_flight_s)
        self._downstream = downstream
        hooks = self._hooks
        if hooks is None:
            value = self._effect(name, key, target, params)[0]
            if compensate is not None:
                self.register_compensation(self._effect_stored, key, value, compensate,
                                           compensate_lookup)
            return value
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
        if compensate is not None:
            self.register_compensation(self._effect_stored, key, value, compensate,
                                       compensate_lookup)
        return value


# Task functions' first parameter is checked against this class (ratchet.params sits below
# the worker and cannot import it).
register_context_class(TaskContext)
