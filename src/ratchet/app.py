"""The application object: task registry, submit, get, wait.

Example::

    app = ratchet.App()                      # sqlite:///ratchet.db, or RATCHET_LEDGER_URL

    @app.task(name="billing.charge", version=1, retry=RetryPolicy(max_attempts=8), lease_s=15.0)
    def charge(ctx: TaskContext, order_id: str, amount_cents: int) -> dict:
        ...

    handle = app.submit("billing.charge", {"order_id": "o-1", "amount_cents": 1200},
                        idempotency_key="order-o-1")
    info = handle.wait(timeout_s=30)
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic
import tenacity

from . import faults
from .breaker import CircuitBreaker, DownstreamBreaker
from .config import max_payload_bytes_from_env, redact_url
from .errors import (
    ConfigError,
    IdempotencyConflict,
    InvalidArguments,
    LedgerError,
    LedgerUnavailable,
    PayloadTooLarge,
    UnknownTask,
    WaitTimeout,
)
from .ledger import open_ledger
from .ledger.base import ControlOutcome, Ledger, NewTask, SubmitResult, TaskInfo
from .lookups import RegisteredLookup, effect_base_name, make_lookup
from .params import ParamsSchema, check_task_function
from .retry import RetryBudget, RetryPolicy
from .serde import digest, dumps
from .states import State
from .validation import MAX_KEY_BYTES, MAX_NAME_BYTES, check_identifier

if TYPE_CHECKING:
    from .control import TaskPage

__all__ = ["MIN_LEASE_S", "App", "SubmitRequest", "TaskDefinition", "TaskHandle", "new_task_id"]

F = TypeVar("F", bound=Callable[..., Any])

MIN_LEASE_S = 1.0
"""Shortest lease a task type may declare, in seconds.

Where it comes from: a worker trusts a lease only until ``confirmed expiry - margin``
(``worker.heartbeat.margin_for``: 20 % of the lease, at most 2 s) and renews it every third
of the lease, each renewal one ledger round trip (a group-committed, fsynced transaction;
tens of milliseconds on a busy disk or a remote PostgreSQL). At 1 s the worker has a 0.2 s
margin and 0.33 s between renewals: a slow commit or a scheduling hiccup of a loaded host
still fits. Far below that the lease expires before the claim's own commit returns, so a
task is taken over again and again without ever running its effect (a 1 ms lease cycled
through 15-19 generations a second)."""


def new_task_id() -> str:
    """A 32-hex-char id: 12 chars of millisecond time (so ids sort by creation) + 20 random."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(10)}"


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """A registered task type: one version of one name (DESIGN §8, "Definitions").

    Attributes:
        name: the registered name (``"billing.charge"``).
        fn: the function, called as ``fn(ctx, **params)``.
        version: definition version pinned by every instance at submit; a worker claims
            only the (name, version) pairs its app defines and runs each with its version.
        retry: the retry policy.
        lease_s: lease length in seconds, at least :data:`MIN_LEASE_S`; renewed every
            ``lease_s / 3`` while running.
        time_limit_s: most seconds one attempt may run (None: no limit, the default);
            see :func:`check_time_limit_s` and DESIGN §7 (time limits).
        params_model: the pydantic model validating the params, or ``None`` (the
            function's signature is the schema; :mod:`ratchet.params`).

    Raises:
        ConfigError: a lease below :data:`MIN_LEASE_S`, a time limit that is not a finite
            number of seconds > 0 (or None), a ``retry`` that is not a
            :class:`RetryPolicy`, a version outside 1 .. 2**31 - 1 (the ledger stores a
            32-bit integer), ``fn`` not callable, or a function that cannot be called as
            ``fn(ctx, **params)`` (:func:`ratchet.params.check_task_function`).
    """

    name: str
    fn: Callable[..., Any]
    version: int
    retry: RetryPolicy
    lease_s: float
    time_limit_s: float | None = None
    params_model: type[pydantic.BaseModel] | None = None
    _schema: ParamsSchema | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_lease_s(self.lease_s)
        check_time_limit_s(self.time_limit_s)
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(
                f"retry must be a ratchet.RetryPolicy, got {type(self.retry).__name__}"
            )
        if isinstance(self.version, bool) or not isinstance(self.version, int) \
                or not 1 <= self.version < 2**31:
            raise ConfigError(
                f"version must be an integer from 1 to 2**31 - 1, got {self.version!r}"
            )
        if not callable(self.fn):
            raise ConfigError(f"task {self.name!r}: {self.fn!r} is not callable")
        object.__setattr__(self, "_schema",
                           check_task_function(self.name, self.fn, self.params_model))

    def validate(self, params_json: str) -> None:
        """Check the params' JSON text against the function's signature (or the params
        model), in pydantic's strict JSON mode; nothing is converted (:mod:`ratchet.params`).

        Raises:
            InvalidArguments: a missing required field, an unknown field, a wrong type;
                the message names each field.
        """
        if self._schema is not None:
            self._schema.validate(self.name, self.version, params_json)

    @property
    def params_schema(self) -> dict[str, Any]:
        """The JSON Schema of the params (``{"type": "object"}`` when not introspectable)."""
        return self._schema.json_schema if self._schema is not None else {"type": "object"}

    def spec(self) -> dict[str, Any]:
        """The definition as the ledger stores it (``definitions.spec``, JSON): retry
        policy, ``lease_s``, the params schema and its source. Extensible: a key added
        later is one more entry; readers ignore keys they do not know."""
        return {
            "retry": dataclasses.asdict(self.retry),
            "lease_s": self.lease_s,
            "time_limit_s": self.time_limit_s,
            "params_schema": self.params_schema,
            "params_source": self._schema.source if self._schema is not None else "none",
        }


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One entry for :meth:`App.submit_many`."""

    name: str
    params: Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    run_at: datetime | float | None = None
    delay_s: float = 0.0
    tenant: str | None = None
    version: int | None = None
    """The definition version to pin; ``None``: the newest this app defines."""


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """What :meth:`App.submit` returns.

    Attributes:
        task_id: the task's id (the existing one when the idempotency key matched).
        name: the task name.
        created: False when the submission was deduplicated by its idempotency key.
    """

    task_id: str
    name: str
    created: bool
    app: App

    def get(self) -> TaskInfo:
        """Current snapshot of the task (see :meth:`App.get`)."""
        return self.app.get(self.task_id)

    def wait(self, timeout_s: float | None = None) -> TaskInfo:
        """Block until the task settles (see :meth:`App.wait`)."""
        return self.app.wait(self.task_id, timeout_s=timeout_s)


def _check_ledger_arg(ledger: object) -> None:
    """Refuse a ``ledger`` argument that is neither a URL, ``None`` nor a ledger object.

    Raises:
        ConfigError: e.g. a number, bytes or a dict was passed.
    """
    if ledger is None or isinstance(ledger, str):
        return
    if not all(hasattr(ledger, op) for op in ("submit", "claim", "commit", "get")):
        raise ConfigError(
            f"ledger must be a URL (e.g. 'sqlite:///ratchet.db'), None, or an open ledger; "
            f"got {type(ledger).__name__}"
        )


def check_lease_s(lease_s: object) -> float:
    """``lease_s`` as a float if it is a valid lease length, in seconds.

    Raises:
        ConfigError: not a finite number, or below :data:`MIN_LEASE_S`.
    """
    if (
        isinstance(lease_s, bool)
        or not isinstance(lease_s, int | float)
        or not math.isfinite(lease_s)
    ):
        raise ConfigError(f"lease_s must be a finite number of seconds, got {lease_s!r}")
    if lease_s < MIN_LEASE_S:
        raise ConfigError(
            f"lease_s must be at least {MIN_LEASE_S} s (ratchet.app.MIN_LEASE_S), got "
            f"{lease_s!r}: a shorter lease expires before the worker can renew it, so the "
            "task is taken over again and again without running"
        )
    return float(lease_s)


def check_time_limit_s(time_limit_s: object) -> float | None:
    """``time_limit_s`` as a float (or None: no limit) if it is a valid time limit of one
    attempt, in seconds (DESIGN §7, time limits: the worker ends an attempt that runs
    longer, as a failed attempt with ``error_class`` ``"time_limit"``).

    Raises:
        ConfigError: not None and not a finite number > 0 (a bool, NaN, infinity, 0 or a
            negative number; "no limit" is None).
    """
    if time_limit_s is None:
        return None
    if (
        isinstance(time_limit_s, bool)
        or not isinstance(time_limit_s, int | float)
        or not math.isfinite(time_limit_s)
        or time_limit_s <= 0
    ):
        raise ConfigError(
            f"time_limit_s must be a finite number of seconds > 0, or None for no limit; "
            f"got {time_limit_s!r}"
        )
    return float(time_limit_s)


SUBMIT_GROUP_MAX = 256
"""Most tasks one shared submit transaction writes (:class:`_SubmitGroup`); callers past
it wait for the next transaction."""


class _PendingSubmit:
    """One :meth:`App.submit` call queued for a shared transaction: its task, then its
    outcome (``result`` or ``error``), and whether it was made the next leader."""

    __slots__ = ("error", "lead", "result", "task", "wakeup")

    def __init__(self, task: NewTask) -> None:
        self.task = task
        self.result: SubmitResult | None = None
        self.error: BaseException | None = None
        self.lead = False
        self.wakeup: threading.Event | None = None

    def outcome(self) -> SubmitResult:
        """The result. Raises the error this submit got."""
        if self.error is not None:
            raise self.error
        if self.result is None:  # a bug of the group, never a silent success
            raise LedgerError("submit finished without an outcome (ratchet bug)")
        return self.result


_GROUPS: weakref.WeakSet[_SubmitGroup] = weakref.WeakSet()
"""Every live :class:`_SubmitGroup`, reset in a forked child (a fork while another
thread led or waited would otherwise leave the child's submits waiting forever)."""


def _reset_groups_after_fork() -> None:
    for group in list(_GROUPS):
        group._after_fork()


os.register_at_fork(after_in_child=_reset_groups_after_fork)


class _SubmitGroup:
    """Group commit for :meth:`App.submit`: concurrent callers share one transaction.

    Leader/follower, no thread of its own and no added delay. A caller that finds no
    submit transaction in flight runs one at once with its own task (the uncontended case:
    one lock taken twice, nothing else). Callers that arrive while one is in flight queue
    their task and sleep; when the transaction ends, its leader hands leadership to the
    first queued caller, which takes everything queued (up to :data:`SUBMIT_GROUP_MAX`,
    FIFO) into one ``ledger.submit(batch)`` and answers each caller with its own
    :class:`~ratchet.ledger.base.SubmitResult` or error once the batch has committed.

    The same outcome per caller as the calls run one after the other:

    * the same idempotency key twice in a batch with the same params: the first creates
      the task, the second gets ``created=False`` and the same id (the engine's dedupe);
      with *different* params the later caller is left for a later batch (FIFO per key),
      where it meets the committed row and gets its own ``IdempotencyConflict``;
    * :class:`~ratchet.errors.IdempotencyConflict` rolls the whole batch back (the ledger
      is all-or-nothing); the engine has audited it once, so it goes to one caller whose
      key and params digest it names and the rest of the batch is sent again;
    * :class:`~ratchet.errors.LedgerUnavailable` goes to every caller of the batch (a
      transaction lost during ``COMMIT`` may have been applied: it is not re-sent task by
      task, as the worker's writer does);
    * any other error (:class:`~ratchet.errors.WriteRejected`, ...) makes the leader
      submit the batch's tasks one by one, so only the task that fails alone gets it.
    """

    def __init__(self, max_batch: int = SUBMIT_GROUP_MAX) -> None:
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: deque[_PendingSubmit] = deque()  # waiting, in no transaction yet
        self._busy = False  # a leader is running; False implies an empty queue
        self.transactions = 0
        """Batches sent (a batch re-sent after a conflict or split counts once)."""
        _GROUPS.add(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's in-flight submits are not this process's."""
        self._lock = threading.Lock()
        self._queue = deque()
        self._busy = False

    @property
    def waiting(self) -> int:
        """Callers queued for the next transaction."""
        return len(self._queue)

    def submit(self, ledger: Ledger, task: NewTask) -> SubmitResult:
        """Write ``task`` (in a transaction shared with concurrent callers) and return its
        result once committed.

        Raises:
            IdempotencyConflict, LedgerError: as ``ledger.submit([task])`` would.
        """
        me = _PendingSubmit(task)
        with self._lock:
            if self._busy:
                wakeup = me.wakeup = threading.Event()
                self._queue.append(me)
            else:
                self._busy = True
                wakeup = None
        if wakeup is None:
            batch = [me]
        else:
            try:
                wakeup.wait()
            except BaseException:  # interrupted while queued: leave the queue cleanly
                self._abandon(me)
                raise
            if not me.lead:
                return me.outcome()
            batch = self._take()
        try:
            self._send(ledger, batch)
        except BaseException as exc:  # KeyboardInterrupt in the leader: nobody hangs
            for p in batch:
                if p is not me and p.result is None and p.error is None:
                    p.error = LedgerUnavailable(
                        f"the shared submit transaction was interrupted in another thread "
                        f"({type(exc).__name__}); the outcome is unknown: submit again "
                        "with the same idempotency key"
                    )
            raise
        finally:
            self._hand_off()
            for p in batch:
                if p.wakeup is not None and p is not me:
                    p.wakeup.set()
        return me.outcome()

    def _take(self) -> list[_PendingSubmit]:
        """The next batch, FIFO from the queue (the new leader is its head). A task whose
        idempotency key is already in the batch with other params waits for a later batch,
        and so does every later task with that key (their order is kept)."""
        batch: list[_PendingSubmit] = []
        deferred: list[_PendingSubmit] = []
        digests: dict[str, str] = {}
        blocked: set[str] = set()
        with self._lock:
            queue = self._queue
            while queue and len(batch) < self.max_batch:
                p = queue.popleft()
                key = p.task.idempotency_key
                if key is not None and (
                    key in blocked
                    or digests.setdefault(key, p.task.params_digest) != p.task.params_digest
                ):
                    blocked.add(key)
                    deferred.append(p)
                    continue
                batch.append(p)
            queue.extendleft(reversed(deferred))
        return batch

    def _abandon(self, me: _PendingSubmit) -> None:
        """A queued caller leaves (interrupted): out of the queue, and if it had just been
        made leader, leadership passes on. Taken into a batch already, its task may still
        be written (an outcome unknown to it, as for any interrupted submit)."""
        with self._lock:
            if me in self._queue:
                self._queue.remove(me)
            lead = me.lead
        if lead:
            self._hand_off()

    def _hand_off(self) -> None:
        """End this leader's turn: wake the first queued caller as the next leader, or
        mark the group idle."""
        with self._lock:
            if not self._queue:
                self._busy = False
                return
            head = self._queue[0]
            head.lead = True
        assert head.wakeup is not None
        head.wakeup.set()

    def _send(self, ledger: Ledger, batch: list[_PendingSubmit]) -> None:
        """Submit ``batch`` and set each entry's result or error (see the class)."""
        self.transactions += 1
        pending = list(batch)
        while pending:
            try:
                results = ledger.submit([p.task for p in pending])
            except IdempotencyConflict as exc:
                culprit = next((p for p in pending
                                if p.task.idempotency_key == exc.key
                                and p.task.params_digest == exc.new_digest), None)
                if culprit is None:  # not one of ours (a ledger of another kind)
                    if len(pending) == 1:
                        pending[0].error = exc
                    else:
                        self._one_by_one(ledger, pending)
                    return
                culprit.error = exc  # audited once by the ledger: one caller gets it
                pending.remove(culprit)
            except LedgerUnavailable as exc:
                for p in pending:
                    p.error = exc
                return
            except Exception as exc:
                if len(pending) == 1:
                    pending[0].error = exc
                else:
                    self._one_by_one(ledger, pending)
                return
            else:
                for p, result in zip(pending, results, strict=True):
                    p.result = result
                return

    @staticmethod
    def _one_by_one(ledger: Ledger, pending: list[_PendingSubmit]) -> None:
        """Submit each task in its own transaction, so only a task that fails alone gets
        an error. Once the ledger is unavailable, the rest get that error untried."""
        down: LedgerUnavailable | None = None
        for p in pending:
            if down is not None:
                p.error = down
                continue
            try:
                [p.result] = ledger.submit([p.task])
            except LedgerUnavailable as exc:
                p.error = down = exc
            except Exception as exc:
                p.error = exc


class App:
    """A Ratchet application: the task registry plus a handle on the ledger.

    Args:
        ledger: a ledger URL, an open :class:`~ratchet.ledger.base.Ledger`, or ``None`` for
            ``RATCHET_LEDGER_URL`` (default ``sqlite:///ratchet.db``). Opened lazily.
        durability: ``"fsync"`` (default) or ``"buffered"``; overrides the URL's setting.
        max_payload_bytes: limit on the JSON-encoded params of one task, in bytes
            (default ``RATCHET_MAX_PAYLOAD_BYTES`` or 1 MiB).

    Raises:
        ConfigError: ``max_payload_bytes`` is not positive.
    """

    def __init__(
        self,
        ledger: str | Ledger | None = None,
        *,
        durability: str | None = None,
        max_payload_bytes: int | None = None,
    ) -> None:
        _check_ledger_arg(ledger)
        if durability is not None and not isinstance(durability, str):
            raise ConfigError(f"durability must be a string, got {type(durability).__name__}")
        self._ledger_arg = ledger
        self._durability = durability
        self._ledger: Ledger | None = ledger if not isinstance(ledger, str | None) else None
        self._lock = threading.Lock()
        limit = max_payload_bytes if max_payload_bytes is not None else max_payload_bytes_from_env()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigError(f"max_payload_bytes must be an integer > 0 (bytes), got {limit!r}")
        self.max_payload_bytes = limit
        self.tasks: dict[str, TaskDefinition] = {}
        """The newest version of each registered name (what :meth:`submit` pins)."""
        self.versions: dict[str, dict[int, TaskDefinition]] = {}
        """Every registered version of each name: ``versions[name][version]``."""
        self.downstreams: dict[str, RetryBudget] = {}
        """Retry budgets of downstreams by name (:meth:`downstream`)."""
        self.breakers: dict[str, DownstreamBreaker] = {}
        """Circuit breakers of downstreams by name (:meth:`downstream`), this process's."""
        self.lookups: dict[tuple[str, str], RegisteredLookup] = {}
        """Registered lookups by (task type, effect name) (:meth:`lookup`)."""
        self._submit_group = _SubmitGroup()

    def downstream(
        self, name: str, *, budget: RetryBudget | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        """Configure the downstream ``name``, what effects declare with ``ctx.effect(...,
        downstream=name)`` (DESIGN §7).

        Args:
            name: the downstream's name.
            budget: a cluster-wide retry budget: requests those effects send count as its
                calls, and a task whose attempt failed in such an effect retries only within
                the budget (else it waits, ``RETRY_WAIT`` with the reason).
            breaker: a circuit breaker (:mod:`ratchet.breaker`; per worker process):
                overloads open it, and while it is open effects toward the downstream are
                not sent and their tasks wait (``PENDING``) instead of spending retries.

        Raises:
            ConfigError: neither given, ``budget`` not a :class:`~ratchet.retry.RetryBudget`,
                ``breaker`` not a :class:`~ratchet.breaker.CircuitBreaker`, or the name
                configured twice.
            InvalidArguments: the name cannot be stored.
        """
        check_identifier(name, "downstream name", MAX_NAME_BYTES)
        if budget is None and breaker is None:
            raise ConfigError(f"downstream {name!r}: give a budget, a breaker or both")
        if budget is not None and not isinstance(budget, RetryBudget):
            raise ConfigError(
                f"budget must be a ratchet.RetryBudget, got {type(budget).__name__}")
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise ConfigError(
                f"breaker must be a ratchet.CircuitBreaker, got {type(breaker).__name__}")
        if name in self.downstreams or name in self.breakers:
            raise ConfigError(f"downstream {name!r} is configured twice")
        if budget is not None:
            self.downstreams[name] = budget
        if breaker is not None:
            self.breakers[name] = DownstreamBreaker(name, breaker)

    def lookup(
        self, task_type: str, effect: str, *, fenced: bool = False,
        in_flight_s: float | None = None, worker: bool = True,
    ) -> Callable[[F], F]:
        """Register ``fn`` as the lookup of ``task_type``'s effect ``effect`` (a decorator;
        :mod:`ratchet.lookups`): ``fn(key) -> result | NOT_FOUND`` (``fn(key, token)`` with
        ``fenced=True``), raising when it cannot tell. ``ratchet reconcile`` asks it
        whether the target agrees with the ledger, and a worker uses it for every
        occurrence of that effect whose ``ctx.effect`` is given no ``lookup`` (with the
        same ``fenced``; ``in_flight_s`` as the effect's default).

        Args:
            task_type: the task name (it need not be registered yet).
            effect: the effect name as ``ctx.effect`` gives it (no ``#N``).
            fenced: the target checks fencing tokens (``ctx.effect(..., fenced=True)``).
            in_flight_s: seconds a request can stay in flight at the target (see
                ``ctx.effect``); a ``NOT_FOUND`` proves absence only after that long.
            worker: False: for reconciliation only, never a worker's default (a lookup
                against a copy that lags, or an effect meant to go ``UNKNOWN``).

        Raises:
            ConfigError: the pair registered twice, ``fn`` not callable as a lookup,
                a bad ``fenced`` / ``in_flight_s`` / ``worker``.
            InvalidArguments: the type or effect name cannot be stored.
        """
        # checked now, so a bad name or option fails at the decorator line, not at first use
        probe = make_lookup(task_type, effect, lambda *args: None, fenced, in_flight_s, worker)

        def decorator(fn: F) -> F:
            registered = make_lookup(probe.task_type, probe.effect, fn, fenced, in_flight_s,
                                     worker)
            pair = (registered.task_type, registered.effect)
            if pair in self.lookups:
                raise ConfigError(f"a lookup for task {pair[0]!r} effect {pair[1]!r} is "
                                  "registered twice")
            self.lookups[pair] = registered
            return fn

        return decorator

    def registered_lookup(self, task_type: str, stored_effect: str) -> RegisteredLookup | None:
        """The lookup registered for ``task_type``'s effect (a stored occurrence name such
        as ``"charge#2"`` is accepted), or None."""
        return self.lookups.get((task_type, effect_base_name(stored_effect)))

    # ------------------------------------------------------------------ configuration

    def configure(self, ledger: str | None = None, durability: str | None = None) -> None:
        """Point the app at another ledger before first use (the CLI's ``--ledger``).

        The app's module usually builds ``App()`` without a URL (``RATCHET_LEDGER_URL`` or
        ``sqlite:///ratchet.db``); ``configure`` lets a command, a service or a test aim the
        same app at another ledger without editing the module::

            from myapp import app
            app.configure(ledger=f"sqlite:///{tmp_path}/test.db")

        Args:
            ledger: a ledger URL (``sqlite:///PATH`` or ``postgresql://...``, optionally
                ``?schema=NAME``); None: keep the current one.
            durability: ``fsync``, ``buffered`` or ``replicated`` (DESIGN §1); None: keep.

        Raises:
            ConfigError: the ledger is already open (a submit, a worker or
                :attr:`ledger` opened it; configure first), or an argument is not a string.
        """
        with self._lock:
            if self._ledger is not None and (ledger is not None or durability is not None):
                raise ConfigError("App.configure() must be called before the ledger is opened")
            if ledger is not None and not isinstance(ledger, str):
                raise ConfigError(f"ledger must be a URL string, got {type(ledger).__name__}")
            if durability is not None and not isinstance(durability, str):
                raise ConfigError(
                    f"durability must be a string, got {type(durability).__name__}"
                )
            if ledger is not None:
                self._ledger_arg = ledger
            if durability is not None:
                self._durability = durability

    @property
    def ledger_url(self) -> str | None:
        """The configured ledger URL (``None``: ``RATCHET_LEDGER_URL`` or the default, or
        an open ledger object was given). Holds any password: never print it; use
        :func:`ratchet.config.redact_url`."""
        return self._ledger_arg if isinstance(self._ledger_arg, str) else None

    @property
    def holds_ledger_object(self) -> bool:
        """True when the App was given an open :class:`~ratchet.ledger.base.Ledger`."""
        return self._ledger_arg is not None and not isinstance(self._ledger_arg, str)

    @property
    def ledger(self) -> Ledger:
        """The ledger, opened (and migrated) on first use."""
        if self._ledger is None:
            with self._lock:
                if self._ledger is None:
                    url = self._ledger_arg if isinstance(self._ledger_arg, str) else None
                    self._ledger = open_ledger(url, durability=self._durability)
        return self._ledger

    def close(self) -> None:
        """Close the ledger connections this app opened."""
        with self._lock:
            if self._ledger is not None and not isinstance(self._ledger_arg, Ledger):
                self._ledger.close()
                self._ledger = None

    # ------------------------------------------------------------------ registry

    def task(
        self,
        name: str | None = None,
        *,
        version: int = 1,
        retry: RetryPolicy | None = None,
        lease_s: float = 15.0,
        time_limit_s: float | None = None,
        params: type[pydantic.BaseModel] | None = None,
    ) -> Callable[[F], F]:
        """Register a function as a task type (one version of a name).

        The function is called as ``fn(ctx, **params)`` with a
        :class:`~ratchet.worker.context.TaskContext`; it must be a plain ``def`` (``async def``
        is reserved for a later version) whose first parameter receives the context. Its
        return value must be JSON-serialisable. Several functions may register the same
        name with different versions: :meth:`submit` pins the newest unless given
        ``version=``, and a worker claims every version its app defines, running each
        task with the function of the version it pinned (DESIGN §8).

        Args:
            name: registered name; default ``module.qualname``.
            version: definition version pinned by each instance (1 .. 2**31 - 1).
            retry: retry policy; default ``RetryPolicy()``.
            lease_s: lease length in seconds, at least :data:`MIN_LEASE_S` (1 s).
            time_limit_s: most seconds one attempt may run, a finite number > 0; default
                None (no limit). An attempt past it is ended by the worker as a failed
                attempt (``error_class`` ``"time_limit"``; retried while attempts remain)
                and its slot is freed; the thread itself cannot be killed (DESIGN §7).
            params: a pydantic model the params must validate against (strict JSON mode)
                instead of the function's signature; its fields must be parameters of the
                function.

        Raises:
            ConfigError: the same (name, version) twice, ``async def``, no context first
                parameter, a positional-only parameter after it, an annotation pydantic
                cannot validate, a lease below :data:`MIN_LEASE_S`, a ``time_limit_s``
                that is not a finite number > 0 or None, a ``retry`` that is not a
                :class:`RetryPolicy`, a version below 1; each message names the function
                and what is expected.
            InvalidArguments: the name cannot be stored (not text, empty, a lone surrogate,
                NUL, over :data:`~ratchet.validation.MAX_NAME_BYTES` bytes): checked here,
                so a bad name never reaches a worker's claims.
        """
        check_lease_s(lease_s)
        check_time_limit_s(time_limit_s)
        if name is not None:
            check_identifier(name, "task name", MAX_NAME_BYTES)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"retry must be a ratchet.RetryPolicy, got {type(retry).__name__}")

        def decorator(fn: F) -> F:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            check_identifier(task_name, "task name", MAX_NAME_BYTES)
            if inspect.iscoroutinefunction(fn):
                raise ConfigError(
                    f"task {task_name!r} is async; this version runs plain def tasks only"
                )
            versions = self.versions.setdefault(task_name, {})
            if version in versions:
                raise ConfigError(
                    f"task name {task_name!r} version {version!r} is registered twice "
                    f"({versions[version].fn.__qualname__} and {fn.__qualname__}); give "
                    "the new function another version=")
            definition = TaskDefinition(
                task_name, fn, version, retry or RetryPolicy(), lease_s, time_limit_s, params
            )
            versions[version] = definition
            newest = self.tasks.get(task_name)
            if newest is None or newest.version < version:
                self.tasks[task_name] = definition
            return fn

        return decorator

    def definition(self, name: str, version: int | None = None) -> TaskDefinition:
        """The registered definition of ``name``: the given ``version``, or the newest.

        Raises:
            UnknownTask: no such name, or the app does not define that version of it.
        """
        if not isinstance(name, str):
            raise UnknownTask(repr(name), sorted(self.tasks))
        try:
            newest = self.tasks[name]
        except KeyError:
            raise UnknownTask(name, sorted(self.tasks)) from None
        if version is None:
            return newest
        valid = isinstance(version, int) and not isinstance(version, bool)
        found = self.versions[name].get(version) if valid else None
        if found is None:
            raise UnknownTask(
                name, [f"{name} version {v}" for v in sorted(self.versions[name])],
                version=version if valid else None)
        return found

    def definitions(self) -> list[TaskDefinition]:
        """Every registered definition, every version, by (name, version)."""
        return [d for name in sorted(self.versions)
                for _, d in sorted(self.versions[name].items())]

    # ------------------------------------------------------------------ submit

    def _prepare(self, request: SubmitRequest) -> NewTask:
        definition = self.definition(request.name, request.version)
        if request.params is not None and not isinstance(request.params, Mapping):
            raise InvalidArguments(
                f"params must be a mapping of argument names to values, got "
                f"{type(request.params).__name__}"
            )
        params = dict(request.params or {})
        params_json = dumps(params, what=f"params of task {request.name!r}")
        definition.validate(params_json)
        size = len(params_json.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(size, self.max_payload_bytes)
        run_at_epoch_s: float | None = None
        if isinstance(request.run_at, datetime):
            if request.run_at.tzinfo is None:
                raise InvalidArguments("run_at must be timezone-aware (e.g. datetime.now(UTC))")
            run_at_epoch_s = request.run_at.timestamp()
        elif request.run_at is not None:
            if isinstance(request.run_at, bool) or not isinstance(request.run_at, int | float):
                raise InvalidArguments(
                    f"run_at must be an aware datetime or epoch seconds, got {request.run_at!r}"
                )
            try:
                run_at_epoch_s = float(request.run_at)
            except OverflowError:
                raise InvalidArguments(f"run_at is out of range: {request.run_at!r}") from None
        if run_at_epoch_s is not None and not math.isfinite(run_at_epoch_s):
            raise InvalidArguments(f"run_at must be finite, got {request.run_at!r}")
        try:
            delay_ok = isinstance(request.delay_s, int | float) and math.isfinite(request.delay_s)
        except OverflowError:
            delay_ok = False
        if not delay_ok:
            raise InvalidArguments(
                f"delay_s must be a finite number of seconds, got {request.delay_s!r}"
            )
        if request.idempotency_key is not None:
            check_identifier(request.idempotency_key, "idempotency_key", MAX_KEY_BYTES)
        if request.tenant is not None:
            check_identifier(request.tenant, "tenant", MAX_KEY_BYTES)
        return NewTask(
            task_id=new_task_id(),
            name=definition.name,
            version=definition.version,
            params_json=params_json,
            params_digest=digest(definition.name, params_json),
            idempotency_key=request.idempotency_key,
            max_attempts=definition.retry.max_attempts,
            lease_s=definition.lease_s,
            delay_s=max(0.0, request.delay_s),
            run_at_epoch_s=run_at_epoch_s,
            quarantine_after=definition.retry.quarantine_after,
            tenant=request.tenant,
        )

    def submit(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | float | None = None,
        delay_s: float = 0.0,
        tenant: str | None = None,
        version: int | None = None,
    ) -> TaskHandle:
        """Submit one task; the task row is the dispatch (no separate message to lose).

        Calls from several threads share transactions (:class:`_SubmitGroup`): while one
        submit transaction is in flight, the callers that arrive queue their task and the
        next transaction writes them all (one commit, one fsync). Each call still returns
        only once its own row is committed, with its own result or error, exactly as if
        the calls had run one after the other. A call that finds no transaction in flight
        runs its own at once: no delay, no other thread involved.

        Args:
            name: a registered task name.
            params: keyword arguments for the task function (plain JSON values).
            idempotency_key: submit dedupe key: resubmitting with the same key and params
                returns the same task id and writes nothing.
            run_at: earliest start, as an aware ``datetime`` or epoch seconds.
            delay_s: earliest start as seconds from now (ignored when ``run_at`` is given).
            tenant: whose work this is (stored on the task; tenant limits of ``ratchet
                limits`` count it, DESIGN §8); not part of the idempotency digest.
            version: the definition version to pin; default the newest this app defines.
                The task waits (``PENDING``) until a worker that has this version runs.

        Raises:
            UnknownTask, InvalidArguments, PayloadNotSerializable, PayloadTooLarge,
            IdempotencyConflict: the submission was refused and nothing was written.
            LedgerError: the ledger failed (:class:`~ratchet.errors.LedgerUnavailable`:
                the outcome may be unknown; submit again with the same idempotency key).
        """
        from .observe.tracing import submit_span  # here: observe imports the worker

        with submit_span(name, idempotency_key=idempotency_key, tenant=tenant) as span:
            task = self._prepare(
                SubmitRequest(name, params, idempotency_key, run_at, delay_s, tenant=tenant,
                              version=version))
            if span.trace_context is not None:
                task = dataclasses.replace(task, trace_context=span.trace_context)
            result = self._submit_group.submit(self.ledger, task)
            span.submitted(result.task_id, result.created, task.version)
        faults.point("submit.after_commit")
        return TaskHandle(result.task_id, task.name, result.created, self)

    def submit_many(self, requests: Iterable[SubmitRequest]) -> list[TaskHandle]:
        """Submit several tasks in one ledger transaction, all-or-nothing.

        Args:
            requests: :class:`SubmitRequest` items (name, params, idempotency_key, run_at /
                delay_s): a list, or any iterable (read once).

        Raises:
            InvalidArguments: ``requests`` is not iterable, or an item is not a
                :class:`SubmitRequest`.
            Same as :meth:`submit`; on any error nothing of the batch is written.
        """
        if isinstance(requests, str | bytes | Mapping | SubmitRequest):
            raise InvalidArguments(
                f"submit_many takes a list of ratchet.SubmitRequest, got {type(requests).__name__}"
            )
        try:
            requests = list(requests)
        except TypeError:
            raise InvalidArguments(
                f"submit_many takes a list of ratchet.SubmitRequest, got {type(requests).__name__}"
            ) from None
        for index, request in enumerate(requests):
            if not isinstance(request, SubmitRequest):
                raise InvalidArguments(
                    f"submit_many takes ratchet.SubmitRequest items; item {index} is a "
                    f"{type(request).__name__} ({request!r:.80}). Use "
                    "SubmitRequest(name, params, idempotency_key=...)"
                )
        from .observe.tracing import submit_span  # here: observe imports the worker

        with submit_span("", many=True) as span:
            new = [self._prepare(r) for r in requests]
            if span.trace_context is not None:
                new = [dataclasses.replace(t, trace_context=span.trace_context) for t in new]
            results = self.ledger.submit(new)
            span.submitted_many(len(new), sum(r.created for r in results))
        faults.point("submit.after_commit")
        return [
            TaskHandle(res.task_id, task.name, res.created, self)
            for res, task in zip(results, new, strict=True)
        ]

    # ------------------------------------------------------------------ read

    def get(self, task_id: str) -> TaskInfo:
        """A snapshot of one task. Raises :class:`~ratchet.errors.TaskNotFound`."""
        return self.ledger.get(check_identifier(task_id, "task id", MAX_KEY_BYTES))

    def list_tasks(self, **filters: Any) -> TaskPage:
        """Tasks of this App's ledger, newest first, filtered and paginated: the same as
        :meth:`ratchet.Control.list_tasks` (``state=``, ``name=``, ``key=``,
        ``older_than_s=``, ``newer_than_s=``, ``limit=``, ``cursor=``), which documents the
        arguments and errors.

        Returns:
            A :class:`~ratchet.control.TaskPage` (``tasks``, ``next_cursor``).
        """
        from .control import Control

        with Control(app=self) as control:
            return control.list_tasks(**filters)

    def cancel(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Cancel a task, audited: :meth:`ratchet.Control.cancel` on this App's ledger
        (which documents the arbitration rules and errors).

        Returns:
            A :class:`~ratchet.ledger.base.ControlOutcome` (``outcome``: ``done``,
            ``requested`` or ``unchanged``).
        """
        from .control import Control

        with Control(app=self) as control:
            return control.cancel(task_id, reason=reason, by=by)

    def retry(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Run a ``FAILED`` task again with a fresh set of attempts, audited:
        :meth:`ratchet.Control.retry` on this App's ledger (which documents it)."""
        from .control import Control

        with Control(app=self) as control:
            return control.retry(task_id, reason=reason, by=by)

    def wait(
        self, task_id: str, timeout_s: float | None = None, poll_s: float = 0.05
    ) -> TaskInfo:
        """Block until the task is terminal (SUCCEEDED, FAILED, CANCELLED) or UNKNOWN.

        ``UNKNOWN`` ends the wait too: it needs a person (``ratchet resolve``), not time.

        Args:
            task_id: the task.
            timeout_s: give up after this many seconds (None waits forever).
            poll_s: first polling interval in seconds; grows to 0.5 s.

        Raises:
            WaitTimeout: the timeout passed first.
            TaskNotFound: no such task.
            InvalidArguments: ``timeout_s`` or ``poll_s`` is not a finite number >= 0.
        """
        for label, value in (("timeout_s", timeout_s), ("poll_s", poll_s)):
            if value is None and label == "timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < 0:
                raise InvalidArguments(f"{label} must be a finite number of seconds >= 0, "
                                       f"got {value!r}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        backoff = tenacity.wait_exponential(multiplier=max(poll_s, 0.001), exp_base=1.5, max=0.5)

        def until_deadline(state: tenacity.RetryCallState) -> float:
            # the exponential poll interval, never past the deadline (one last look there)
            pause = backoff(state)
            return pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))

        def timed_out(state: tenacity.RetryCallState) -> TaskInfo:
            info = state.outcome.result() if state.outcome is not None else None
            where = f"still {info.state}" if info is not None else "not settled"
            raise WaitTimeout(
                f"task {task_id} is {where} after {timeout_s} s (is a worker running for it?)"
            )

        poller = tenacity.Retrying(
            retry=tenacity.retry_if_result(
                lambda info: not (info.terminal or info.state is State.UNKNOWN)
            ),
            wait=until_deadline,
            stop=tenacity.stop_never if timeout_s is None else tenacity.stop_after_delay(timeout_s),
            retry_error_callback=timed_out,
        )
        return poller(self.get, task_id)

    def __repr__(self) -> str:
        """``<ratchet.App ledger='...' tasks=[...]>``, the ledger URL with its password
        redacted."""
        if self.holds_ledger_object:
            where = f"<{type(self._ledger_arg).__name__}>"
        else:
            raw = self.ledger_url or os.environ.get("RATCHET_LEDGER_URL") or "default"
            where = redact_url(raw)
        return f"<ratchet.App ledger={where!r} tasks={sorted(self.tasks)}>"
