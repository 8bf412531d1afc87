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

Step and effect names and effect keys are checked where they enter
(:func:`ratchet.validation.check_identifier`: ``InvalidArguments``, a permanent failure).
Values read back from the ledger (params, stored step values, recorded effect results)
that cannot be decoded raise :class:`~ratchet.errors.UndecodableData`. A write the
database refuses raises :class:`~ratchet.errors.WriteRejected`; a pipelined step write
refused in the background raises it at the task's next step or effect.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from .. import faults
from ..errors import (
    EffectOutcomeUnknown,
    InvalidArguments,
    LedgerUnavailable,
    PermanentError,
    StaleGeneration,
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
    TaskWrite,
)
from ..retry import FailureClass, classify, proves_not_executed
from ..serde import digest, dumps, loads
from ..validation import MAX_KEY_BYTES, MAX_NAME_BYTES, check_identifier
from .heartbeat import LeaseHandle
from .hooks import EffectSettlement, Hooks
from .writer import LedgerWriter, WriterStopped

__all__ = ["NOT_FOUND", "NotFound", "Shutdown", "TaskContext"]

log = logging.getLogger("ratchet.worker")

T = TypeVar("T")


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
        self._ledger_t0 = claim.ledger_now
        self._mono_t0 = time.monotonic()
        self._on_block = on_block
        # Steps run in this attempt whose commit is not known yet (pipelined), in order;
        # the first ``_sent`` of them were handed to the writer by a flush.
        self._unsaved: list[tuple[str, str]] = []
        self._sent = 0
        self._saved: set[str] = set()  # names a flush confirmed (set by the writer thread)
        self._flush_stale = False
        self._flush_rejected: WriteRejected | None = None  # a flush the database refused

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

    def _boundary(self) -> None:
        if self._stopping.is_set():
            raise Shutdown()
        if self._flush_stale:
            raise StaleGeneration(self.task_id, self.generation, "step flush")
        if self._flush_rejected is not None:
            raise self._flush_rejected

    def unsaved_steps(self) -> list[tuple[str, str]]:
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

    def steps_saved(self, steps: list[tuple[str, str]]) -> None:
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
        """Hand the steps not yet sent to the writer without waiting (pipelined)."""
        batch = self._unsaved[self._sent :]
        if not batch:
            return
        self._sent = len(self._unsaved)
        write = TaskWrite(self.task_id, self.generation, self.holder,
                          f"step:{batch[-1][0]}", steps=batch)

        def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
            if outcome is None:
                if isinstance(error, WriteRejected):
                    self._flush_rejected = error  # raised at the next step or effect
                return  # not durable: the task's next write carries these steps again
            if outcome.stale:
                self._flush_stale = True
                return
            self._saved.update(n for n, _ in batch)
            for _ in batch:
                faults.point("step.after_commit")

        try:
            self._writer.submit(write, done)
        except WriterStopped:
            self._sent = 0  # writer stopping: the next write carries them

    @property
    def lease(self) -> LeaseHandle:
        """The lease this context runs under."""
        return self._lease

    def ensure_lease(self) -> None:
        """Raise :class:`~ratchet.errors.LeaseLost` unless the lease is confirmed right now."""
        self._lease.ensure()

    # ------------------------------------------------------------------ steps

    def step(
        self, name: str, fn: Callable[..., T], *args: Any, durable: bool = False, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once per task and commit its result (fenced).

        Names are unique within a task: a name already committed (in this or an earlier
        attempt) returns the stored result without calling ``fn``.

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
                Unicode, NUL, over :data:`~ratchet.validation.MAX_NAME_BYTES`).
            PayloadNotSerializable: the result is not plain JSON (a permanent failure).
            UndecodableData: the value stored by an earlier attempt cannot be decoded.
            StaleGeneration: another worker took the task over; nothing was written.
            WriteRejected: the database refused the step's write (``durable=True``, or a
                pipelined write of an earlier step).
        """
        self._boundary()
        check_identifier(name, "step name", MAX_NAME_BYTES)
        hooks = self._hooks
        if hooks is None:
            return self._step(name, fn, args, kwargs, durable)[0]
        hooks.before_step(self, name)
        t0 = time.perf_counter()
        try:
            value, cached = self._step(name, fn, args, kwargs, durable)
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
        stored = self._steps.get(name)
        if stored is not None:
            return loads(stored, f"stored value of step {name!r}"), True
        if self._sent < len(self._unsaved):
            self._flush_steps()
        result_json = dumps(fn(*args, **kwargs), what=f"result of step {name!r}")
        self._steps[name] = result_json
        self._unsaved.append((name, result_json))
        if durable:
            self._commit(f"step:{name}")
        return loads(result_json), False

    # ------------------------------------------------------------------ effects

    def effect(
        self,
        name: str,
        call: Callable[[str], Any],
        *,
        key: str,
        lookup: Callable[[str], Any] | None = None,
        idempotent: bool = False,
        params: Any = None,
        in_flight_s: float | None = None,
    ) -> Any:
        """Perform an external side effect at most once per business ``key``.

        Args:
            name: effect name, unique within the task.
            call: ``call(key) -> result``; sends the request with ``key`` as its
                idempotency key. Its result must be plain JSON.
            key: business idempotency key, derived from the intent (e.g.
                ``f"charge:{order_id}"``), never from the attempt. It must not change
                between attempts of the same task (``PermanentError`` if it does).
            lookup: ``lookup(key) -> result | NOT_FOUND``; asks the target whether ``key``
                already executed. Raising means "inconclusive".
            idempotent: the target itself deduplicates ``key`` (e.g. Stripe's
                Idempotency-Key), so calling again with it is safe when a lookup cannot
                settle the outcome.
            params: what the call sends (for the params digest recorded with the intent).
            in_flight_s: how long a request of this effect can stay in flight at the target
                (client timeout plus the target's processing bound), seconds. A lookup's
                ``NOT_FOUND`` only proves absence once that long has passed since the request
                was sent (after an earlier attempt: since its intent was recorded, so add up to
                ``min(1, lease_s / 2)`` for the lease check before sending); before that, the
                task retries later and looks up again. Leave None
                only for targets that answer lookups for in-flight requests (or that honour
                the key): otherwise a request still in flight from a dead holder can
                execute after the lookup said "not found".

        Returns:
            The JSON round-trip of the call's (or the lookup's) result.

        Raises:
            InvalidArguments: ``in_flight_s`` is not a finite number >= 0, or ``name`` or
                ``key`` is not a storable identifier (name up to
                :data:`~ratchet.validation.MAX_NAME_BYTES`, key up to
                :data:`~ratchet.validation.MAX_KEY_BYTES` UTF-8 bytes, no NUL or lone
                surrogate).
            LeaseLost: the lease cannot be confirmed; the call was not made.
            StaleGeneration: another worker took the task over.
            EffectOutcomeUnknown: the outcome cannot be established; the task goes UNKNOWN.
            UndecodableData: the result recorded by an earlier attempt cannot be decoded.
            WriteRejected: the database refused the intent or result write.
            Exception: what ``call`` raised, for the worker to classify.
        """
        self._boundary()
        check_identifier(name, "effect name", MAX_NAME_BYTES)
        check_identifier(key, "effect key", MAX_KEY_BYTES)
        if in_flight_s is not None and (
            isinstance(in_flight_s, bool) or not isinstance(in_flight_s, int | float)
            or not math.isfinite(in_flight_s) or in_flight_s < 0
        ):
            raise InvalidArguments(
                f"in_flight_s must be a finite number of seconds >= 0 or None, got "
                f"{in_flight_s!r}"
            )
        hooks = self._hooks
        if hooks is None:
            return self._effect(name, call, key, lookup, idempotent, params, in_flight_s)[0]
        hooks.before_effect(self, name, key)
        t0 = time.perf_counter()
        try:
            value, settled = self._effect(name, call, key, lookup, idempotent, params,
                                          in_flight_s)
        except BaseException as exc:
            how: EffectSettlement = (
                "unknown" if isinstance(exc, EffectOutcomeUnknown) else "failed"
            )
            hooks.after_effect(self, name, key, how, time.perf_counter() - t0, exc)
            raise
        hooks.after_effect(self, name, key, settled, time.perf_counter() - t0, None)
        return value

    def _effect(
        self,
        name: str,
        call: Callable[[str], Any],
        key: str,
        lookup: Callable[[str], Any] | None,
        idempotent: bool,
        params: Any,
        in_flight_s: float | None,
    ) -> tuple[Any, EffectSettlement]:
        """:meth:`effect` without its checks and hooks; returns ``(value, how settled)``."""
        params_digest = digest(name, key, dumps(params, what=f"params of effect {name!r}"))
        record = self._effects.get(name)
        if record is not None and record.key != key:
            raise PermanentError(
                f"effect {name!r} changed its idempotency key from {record.key!r} to {key!r}; "
                "keys must come from the business intent, not the attempt"
            )
        if record is not None and record.params_digest != params_digest:
            raise PermanentError(
                f"effect {name!r} (key {key!r}) was recorded with params digest "
                f"{record.params_digest} and is now asked with {params_digest}: the same key "
                "must always carry the same request (DESIGN §5)"
            )
        if record is not None and record.state is EffectState.DONE:
            return loads(record.result_json, f"recorded result of effect {name!r}"), "cached"
        if record is not None and record.state is EffectState.INTENT:
            # An earlier attempt recorded the intent but not the outcome: query first.
            found, value = self._settle(name, key, params_digest, lookup, idempotent,
                                        "intent without result from an earlier attempt",
                                        record.updated_at, in_flight_s)
            if found:
                return value, "lookup"
        self._lease.ensure()
        self._commit(
            f"effect_intent:{name}",
            effects=[EffectWrite(name, key, params_digest, EffectState.INTENT)],
        )
        self._effects[name] = EffectRecord(
            name, key, params_digest, EffectState.INTENT, None, self.generation, self.attempt,
            1, False, self._ledger_now(),
        )
        faults.point("effect.after_intent")
        self._lease.ensure()
        sent_at = self._ledger_now()
        if self._on_block is not None:
            self._on_block()
        try:
            result = call(key)
        except Exception as exc:
            if proves_not_executed(exc):
                # Evidence that nothing happened: the next attempt calls again (same key)
                # without a lookup, even when the target cannot be asked.
                self._record(name, key, params_digest, EffectState.NOT_DONE, None, False)
                raise
            if classify(exc) is not FailureClass.UNKNOWN_OUTCOME:
                raise
            found, value = self._settle(name, key, params_digest, lookup, idempotent,
                                        f"call failed with unknown outcome: {exc!r}",
                                        sent_at, in_flight_s)
            if found:
                return value, "lookup"
            raise TransientError(
                f"effect {name!r} (key {key!r}) had an unknown outcome and the target "
                "confirmed it did not execute; retrying with the same key"
            ) from exc
        faults.point("effect.after_call")
        return self._record_done(name, key, params_digest, result, via_lookup=False), "call"

    def open_intents(self) -> list[str]:
        """Names of effects whose intent is recorded but whose outcome is not."""
        return [n for n, r in self._effects.items() if r.state is EffectState.INTENT]

    def _record_done(
        self, name: str, key: str, params_digest: str, result: Any, via_lookup: bool
    ) -> Any:
        result_json = dumps(result, what=f"result of effect {name!r}")
        self._record(name, key, params_digest, EffectState.DONE, result_json, via_lookup)
        return loads(result_json)

    def _record(
        self,
        name: str,
        key: str,
        params_digest: str,
        state: EffectState,
        result_json: str | None,
        via_lookup: bool,
    ) -> None:
        self._commit(
            f"effect_{state.value}:{name}",
            effects=[EffectWrite(name, key, params_digest, state, result_json, via_lookup)],
        )
        self._effects[name] = EffectRecord(
            name, key, params_digest, state, result_json, self.generation, self.attempt, 0,
            via_lookup, 0.0,
        )

    def _settle(
        self,
        name: str,
        key: str,
        params_digest: str,
        lookup: Callable[[str], Any] | None,
        idempotent: bool,
        why: str,
        intent_at: float,
        in_flight_s: float | None,
    ) -> tuple[bool, Any]:
        """Resolve an unknown outcome. Returns ``(True, result)`` when the lookup found it,
        ``(False, None)`` when calling again with the same key is safe.

        Raises:
            TransientError: the lookup failed transiently, or said "not found" while a
                request may still be in flight; try again later (lookup first).
            EffectOutcomeUnknown: nothing can settle it and the target does not dedupe.
        """
        reason = f"{why}; no lookup given"
        if lookup is not None:
            try:
                answer = lookup(key)
            except Exception as exc:
                cls = classify(exc)
                reason = f"{why}; lookup inconclusive: {exc!r}"
                if not idempotent and cls in (FailureClass.TRANSIENT, FailureClass.OVERLOAD):
                    raise TransientError(
                        f"lookup for effect {name!r} (key {key!r}) failed: {exc!r}; will look up "
                        "again before any new call"
                    ) from exc
            else:
                if isinstance(answer, NotFound):
                    waited_s = self._ledger_now() - intent_at
                    if in_flight_s is not None and waited_s < in_flight_s:
                        raise TransientError(
                            f"lookup for effect {name!r} (key {key!r}) found nothing, but the "
                            f"request sent {waited_s:.1f} s ago may still be in flight "
                            f"(in_flight_s={in_flight_s}); looking up again later",
                            retry_after_s=in_flight_s - waited_s,
                        )
                    log.info("effect %s key %s: lookup confirms not executed", name, key)
                    return False, None
                log.info("effect %s key %s: lookup found an earlier execution", name, key)
                return True, self._record_done(name, key, params_digest, answer, via_lookup=True)
        if idempotent:
            return False, None
        raise EffectOutcomeUnknown(name, key, reason)
