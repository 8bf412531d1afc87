"""Effects: the intent-before-call, lookup-first protocol of ``ctx.effect`` (DESIGN §5).

:class:`EffectCalls` performs one effect once its arguments were checked
(:meth:`~ratchet.worker.context.TaskContext.effect`): reuse a recorded result; settle an
intent an earlier attempt left open (the lookup first; call again only when the lookup
confirms absence or the target honours the key, else ``UNKNOWN``); else record the intent,
call, record the result. A call sent after this holder's safe window closed, to a target
that does not deduplicate, is recorded as a late effect for reconciliation. The circuit
breaker of the effect's downstream is asked before the intent, then its rate limit
(:mod:`.ratewait`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Final, TypeVar

import tenacity

from ..breaker import DownstreamBreaker
from ..errors import (
    EffectOutcomeUnknown,
    FenceError,
    InvalidArguments,
    LedgerError,
    LedgerUnavailable,
    NonDeterministicReplay,
    PermanentError,
    StaleGeneration,
    TokenRejected,
    TransientError,
)
from ..faults import point as fault_point
from ..ledger.base import EffectRecord, EffectState, EffectWrite, LateEffect, TaskInfo
from ..ratelimit import RateLimit
from ..retry import FailureClass, classify, proves_not_executed
from ..serde import digest, dumps, loads, printable
from .checkpoints import Checkpoint, CheckpointState, ControlInterrupt, HistoryEnd
from .events import EffectSettlement
from .protocol import AwaitableRefused, Block, Call, Protocol, run_sync
from .ratewait import take_token

__all__ = ["LATE_EVIDENCE_WAIT_S", "NOT_FOUND", "EffectCalls", "EffectTarget", "NotFound",
           "check_effect_callable"]

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


class EffectCalls(CheckpointState):
    """The effect protocol of a task context (see the module docstring)."""

    def _effect(
        self, name: str, key: str, target: EffectTarget, params: Any,
    ) -> tuple[Any, EffectSettlement]:
        """:meth:`effect` without its checks and hooks; returns ``(value, how settled)``."""
        return run_sync(self._effect_g(name, key, target, params))

    def _effect_g(
        self, name: str, key: str, target: EffectTarget, params: Any,
    ) -> Protocol[tuple[Any, EffectSettlement]]:
        """:meth:`_effect` as a protocol generator (:mod:`ratchet.worker.protocol`)."""
        cp = self._checkpoint("effect", name)
        stored_name = self._effect_stored = cp.stored_name
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
        if self.compensating:  # compensation mode: the replay ends before a new call
            raise HistoryEnd(cp.describe())
        if record is not None and record.state in (EffectState.INTENT, EffectState.GIVEN_UP):
            # An earlier attempt recorded the intent but not the outcome (or an operator
            # gave up on it, then retried the task): query first.
            found, value = yield from self._settle_g(
                cp, key, params_digest, target,
                "intent without result from an earlier attempt", record.updated_at)
            if found:
                return value, "lookup"
            yield from self._settled_absent_g(cp, key, params_digest)
        breaker = self.breakers.get(self._downstream) if self._downstream else None
        # Raises CircuitOpen while the downstream's breaker is open: nothing is sent and no
        # intent recorded; the worker hands the attempt back (DESIGN §7).
        probe = breaker.acquire() if breaker is not None else False
        try:
            return (yield from self._send_g(cp, key, params_digest, target, breaker, probe,
                                            params))
        finally:
            if breaker is not None and not self._released:
                breaker.cancel(probe)  # ended before the call (e.g. the lease was lost)

    def _send_g(
        self, cp: Checkpoint, key: str, params_digest: str, target: EffectTarget,
        breaker: DownstreamBreaker | None, probe: bool, params: Any = None,
    ) -> Protocol[tuple[Any, EffectSettlement]]:
        """Record the intent, call, record the outcome (:meth:`_effect` after the checks
        of an existing record and the breaker)."""
        self._released = breaker is None
        stored_name = cp.stored_name
        yield from self._ensure_lease_g()
        limit = self.downstream_rates.get(self._downstream) if self._downstream else None
        if limit is not None and self._downstream is not None:
            # Raises RateWait while the downstream's bucket is empty: nothing is sent and
            # no intent recorded; the worker hands the attempt back (DESIGN §8).
            yield from self._take_token_g(self._downstream, limit, params)
        yield from self._commit_g(
            f"effect_intent:{stored_name}",
            effects=[EffectWrite(stored_name, key, params_digest, EffectState.INTENT,
                                 seq=cp.seq)],
        )
        self._effects[stored_name] = EffectRecord(
            stored_name, key, params_digest, EffectState.INTENT, None, self.generation,
            self.attempt, 1, False, self._ledger_now(), cp.seq,
        )
        fault_point("effect.after_intent")
        if self._on_block is not None:
            self._on_block()
        # The last check before the request leaves: the safe window (which keeps a margin
        # of the lease, DESIGN §4) must still be open. A holder frozen after this line can
        # still send late; what that means per kind of target is in the docstring.
        yield from self._ensure_lease_g()
        fault_point("effect.before_call")
        sent_at = self._ledger_now()
        downstream = self._downstream
        if downstream is not None:
            self.downstream_calls[downstream] = self.downstream_calls.get(downstream, 0) + 1
        try:
            result = yield target.send(key, self.generation)
        except Exception as exc:
            if breaker is not None:
                self._released = True
                breaker.release(probe, exc)
            if downstream is not None:
                self.failed_downstream = downstream
            in_window = self._lease.remaining_s() > 0
            if isinstance(exc, TokenRejected):
                yield from self._token_rejected_g(cp, key, params_digest, exc)
            if isinstance(exc, FenceError):
                raise
            if proves_not_executed(exc) or isinstance(exc, AwaitableRefused):
                # Evidence that nothing happened: the next attempt calls again (same key)
                # without a lookup, even when the target cannot be asked. (An awaitable
                # refused in a plain task was closed unrun: nothing left either.)
                yield from self._record_g(cp, key, params_digest, EffectState.NOT_DONE, None,
                                         False)
                raise
            late = (not in_window and not target.idempotent
                    and (yield from self._taken_over_g(LATE_EVIDENCE_WAIT_S)) is True)
            if late:
                # Sent after our safe window closed, and another holder has the task: the
                # request may have executed after its lookup. Keep the evidence now: what
                # this attempt writes next is fenced out (with no lookup the UNKNOWN
                # write, which would otherwise be the only trace, is rejected too).
                yield from self._record_late_g(cp, key, "unknown", printable(repr(exc)))
            if classify(exc) is not FailureClass.UNKNOWN_OUTCOME:
                raise
            try:
                found, value = yield from self._settle_g(
                    cp, key, params_digest, target,
                    f"call failed with unknown outcome: {exc!r}", sent_at)
            except StaleGeneration:
                if not late and not in_window and not target.idempotent:
                    yield from self._record_late_g(cp, key, "unknown", printable(repr(exc)))
                raise
            if found:
                return value, "lookup"
            yield from self._settled_absent_g(cp, key, params_digest)
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
        fault_point("effect.after_call")
        try:
            done = yield from self._record_done_g(cp, key, params_digest, result,
                                                  via_lookup=False)
            return done, "call"
        except StaleGeneration:
            # The reply came after our safe window closed and another holder took the task
            # over: the request may have executed after the new holder looked up (we were
            # frozen between the lease check and the send). Keep the evidence, unfenced,
            # unless the target deduplicates the key itself (then it was a replay).
            if not in_window and not target.idempotent:
                yield from self._record_late_g(cp, key, "done", _json_or_repr(result))
            raise
        except LedgerUnavailable:
            # The result write did not reach the ledger; if another holder has the task,
            # this late call is still evidence to keep (waiting for the ledger a while).
            if (not in_window and not target.idempotent
                    and (yield from self._taken_over_g(LATE_EVIDENCE_WAIT_S)) is True):
                yield from self._record_late_g(cp, key, "done", _json_or_repr(result))
            raise

    def _ensure_lease_g(self) -> Protocol[None]:
        """:meth:`~ratchet.worker.heartbeat.LeaseHandle.ensure`: at once while the lease's
        safe window is open, else a :class:`Block` (it waits for the heartbeat)."""
        lease = self._lease
        if lease.lost or lease.remaining_s() <= 0:
            yield Block(lease.ensure)
        else:
            lease.ensure()

    def _take_token_g(self, downstream: str, limit: RateLimit, params: Any) -> Protocol[None]:
        """A token of ``downstream``'s rate limit for this call (:mod:`.ratewait`)."""
        ledger, task_id, generation = self._writer.ledger, self.task_id, self.generation
        try:
            yield Block(lambda: take_token(ledger, task_id, generation, downstream, limit,
                                           params))
        except LedgerUnavailable as exc:
            self.ledger_outage = exc  # the worker's own ledger, not the task's code
            raise

    def _settled_absent_g(self, cp: Checkpoint, key: str, params_digest: str
                          ) -> Protocol[None]:
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
            yield from self._record_g(cp, key, params_digest, EffectState.NOT_DONE, None,
                                      False)
            raise ControlInterrupt(request)
        raise EffectOutcomeUnknown(
            cp.stored_name, key,
            f"an operator asked to {request} the task, and only calling again could settle "
            "the open intent (the target honours the key but no lookup confirmed the "
            "outcome); resolve it (ratchet resolve)")

    def _token_rejected_g(
        self, cp: Checkpoint, key: str, params_digest: str, exc: TokenRejected
    ) -> Protocol[None]:
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
        if (yield from self._taken_over_g(1.0)) is not False:
            return
        yield from self._record_g(cp, key, params_digest, EffectState.NOT_DONE, None, False)
        raise PermanentError(
            f"{cp.describe()}: the target refused fencing token {exc.token} for key {key!r}"
            f" (highest it has seen: {exc.highest}), but this claim (generation "
            f"{self.generation}) is the task's current one: another task uses the same key, "
            "or the target's tokens do not come from this task's claims. Keys of a fenced "
            "effect must belong to one task."
        ) from exc

    def _taken_over_g(self, wait_s: float) -> Protocol[bool | None]:
        """True when the ledger says another claim of this task exists (a read, not
        fenced); None when the ledger could not be read within ``wait_s`` seconds."""
        ledger, task_id = self._writer.ledger, self.task_id
        try:
            info: TaskInfo = yield Block(
                lambda: _until_ledger_answers(lambda: ledger.get(task_id), wait_s))
        except (LedgerError, OSError) as exc:
            log.error("task %s: cannot tell whether the task was taken over (%s)",
                      self.task_id, exc)
            return None
        return info.generation != self.generation

    def _record_late_g(self, cp: Checkpoint, key: str, outcome: str, detail: str | None
                       ) -> Protocol[None]:
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
        ledger = self._writer.ledger
        try:
            yield Block(lambda: _until_ledger_answers(lambda: ledger.record_late_effect(late),
                                                      LATE_EVIDENCE_WAIT_S))
        except (LedgerError, OSError) as exc:
            log.error("task %s: could not record the late effect of %s (key %s, "
                      "generation %d): %s", self.task_id, cp.describe(), key,
                      self.generation, exc)

    def _record_done_g(
        self, cp: Checkpoint, key: str, params_digest: str, result: Any, via_lookup: bool
    ) -> Protocol[Any]:
        result_json = dumps(result, what=f"result of {cp.describe()}")
        yield from self._record_g(cp, key, params_digest, EffectState.DONE, result_json,
                                  via_lookup)
        return loads(result_json)

    def _record_g(
        self,
        cp: Checkpoint,
        key: str,
        params_digest: str,
        state: EffectState,
        result_json: str | None,
        via_lookup: bool,
    ) -> Protocol[None]:
        name = cp.stored_name
        yield from self._commit_g(
            f"effect_{state.value}:{name}",
            effects=[EffectWrite(name, key, params_digest, state, result_json, via_lookup,
                                 cp.seq)],
        )
        self._effects[name] = EffectRecord(
            name, key, params_digest, state, result_json, self.generation, self.attempt, 0,
            via_lookup, 0.0, cp.seq,
        )

    def _settle_g(
        self,
        cp: Checkpoint,
        key: str,
        params_digest: str,
        target: EffectTarget,
        why: str,
        intent_at: float,
    ) -> Protocol[tuple[bool, Any]]:
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
                answer = yield target.ask(key, self.generation)
            except TokenRejected as exc:
                yield from self._token_rejected_g(cp, key, params_digest, exc)
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
                found = yield from self._record_done_g(cp, key, params_digest, answer,
                                                       via_lookup=True)
                return True, found
        if target.idempotent:
            return False, None
        raise EffectOutcomeUnknown(cp.stored_name, key, reason)


class EffectTarget:
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

    def send(self, key: str, token: int) -> Call:
        """The call of the target, as a protocol operation (with the fencing token when
        it checks tokens)."""
        args = (key, token) if self.fenced else (key,)
        return Call("the effect's call", self.call, *args)

    def ask(self, key: str, token: int) -> Call:
        """The target's lookup, as a protocol operation (with the fencing token when it
        checks tokens)."""
        assert self.lookup is not None
        args = (key, token) if self.fenced else (key,)
        return Call("the effect's lookup", self.lookup, *args)


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


def check_effect_callable(fn: object, args: int, what: str, shape: str) -> None:
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
