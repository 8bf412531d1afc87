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
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import pydantic

from .. import faults
from ..breaker import CircuitBreaker, DownstreamBreaker
from ..config import max_payload_bytes_from_env, redact_url
from ..errors import ConfigError, InvalidArguments, UnknownTask
from ..ledger import open_ledger
from ..ledger.base import ControlOutcome, Ledger, NewTask, TaskInfo
from ..lookups import RegisteredLookup, effect_base_name, make_lookup
from ..ratelimit import RateLimit
from ..retry import RetryBudget, RetryPolicy
from ..shards import SHARDS_PARAM, check_shards
from ..validation import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_identifier,
    check_int,
)
from . import _taskops as taskops
from ._async import AsyncCalls
from ._downstream import Downstreams
from ._flow import DEFAULT_QUEUE, FlowSpec
from ._messages import Messages
from ._periodic import PeriodicTask, find_definition, periodic_task
from ._submitgroup import SUBMIT_GROUP_MAX as SUBMIT_GROUP_MAX
from ._submitgroup import SubmitGroup as _SubmitGroup
from ._submitting import SubmitRequest, new_task_id, prepare_task
from ._taskdef import MIN_LEASE_S, TaskDefinition, check_lease_s, check_time_limit_s
from ._taskops import TaskPage
from .spans import submit_span

__all__ = ["MIN_LEASE_S", "App", "PeriodicTask", "SubmitRequest", "TaskDefinition", "TaskHandle",
           "new_task_id"]

F = TypeVar("F", bound=Callable[..., Any])


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

    async def wait_async(self, timeout_s: float | None = None) -> TaskInfo:
        """Await until the task settles, never blocking the loop (see :meth:`App.wait_async`)."""
        return await self.app.wait_async(self.task_id, timeout_s=timeout_s)


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



class App(Messages, AsyncCalls):
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
        self.max_payload_bytes = check_int(limit, "max_payload_bytes (bytes)", minimum=1,
                                           error=ConfigError)
        self.tasks: dict[str, TaskDefinition] = {}
        """The newest version of each registered name (what :meth:`submit` pins)."""
        self.versions: dict[str, dict[int, TaskDefinition]] = {}
        """Every registered version of each name: ``versions[name][version]``."""
        self._downstreams = Downstreams()
        self.downstreams: dict[str, RetryBudget] = self._downstreams.budgets
        """Retry budgets of downstreams by name (:meth:`downstream`)."""
        self.breakers: dict[str, DownstreamBreaker] = self._downstreams.breakers
        """Circuit breakers of downstreams by name (:meth:`downstream`), this process's."""
        self.downstream_rates: dict[str, RateLimit] = self._downstreams.rates
        """Rate limits of downstreams by name (:meth:`downstream`)."""
        self.lookups: dict[tuple[str, str], RegisteredLookup] = {}
        """Registered lookups by (task type, effect name) (:meth:`lookup`)."""
        self.periodic_tasks: dict[str, PeriodicTask] = {}
        """The schedules of :meth:`periodic`, by schedule name."""
        self._submit_group = _SubmitGroup()

    def downstream(
        self, name: str, *, budget: RetryBudget | None = None,
        breaker: CircuitBreaker | None = None, rate_limit: RateLimit | None = None,
    ) -> None:
        """Configure the downstream ``name``, what effects declare with ``ctx.effect(...,
        downstream=name)`` (DESIGN §7, §8).

        Args:
            name: the downstream's name.
            budget: a cluster-wide retry budget: requests those effects send count as its
                calls, and a task whose attempt failed in such an effect retries only within
                the budget (else it waits, ``RETRY_WAIT`` with the reason).
            breaker: a circuit breaker (:mod:`ratchet.breaker`; per worker process):
                overloads open it, and while it is open effects toward the downstream are
                not sent and their tasks wait (``PENDING``) instead of spending retries.
            rate_limit: a cluster-wide rate limit (:class:`~ratchet.ratelimit.RateLimit`;
                its ``key`` applies to the effect's ``params=``): each call takes a token
                of the key's bucket in the ledger first; with none left the call is not
                sent and the task waits (``PENDING``, ``flow_wait`` ``"rate"``) until the
                bucket has one, spending no attempt (:mod:`ratchet.worker.ratewait`).

        Raises:
            ConfigError: none given, ``budget`` not a :class:`~ratchet.retry.RetryBudget`,
                ``breaker`` not a :class:`~ratchet.breaker.CircuitBreaker`, ``rate_limit``
                not a :class:`~ratchet.ratelimit.RateLimit`, or the name configured
                twice.
            InvalidArguments: the name cannot be stored.
        """
        self._downstreams.add(name, budget, breaker, rate_limit)

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
        """Close the ledger connections this app opened (and let the threads of its async
        calls end)."""
        self._close_async_executor()
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
        queue: str = DEFAULT_QUEUE,
        rate_limit: RateLimit | None = None,
        concurrency_key: Callable[[Mapping[str, Any]], Any] | None = None,
        max_per_key: int = 1,
        ordered: bool = False,
        fair: bool = False,
        fair_key: Callable[[Mapping[str, Any]], Any] | None = None,
    ) -> Callable[[F], F]:
        """Register a function as a task type (one version of a name).

        The function is called as ``fn(ctx, **params)`` with a
        :class:`~ratchet.worker.context.TaskContext`, or, for an ``async def`` function,
        ``await fn(ctx, **params)`` with an :class:`~ratchet.AsyncTaskContext` on the
        worker's event loop (``TaskDefinition.is_async``); its first parameter receives the
        context. Its
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
            queue: the named queue of its tasks (default ``"default"``; flow control,
                DESIGN §8).
            rate_limit: a :class:`~ratchet.ratelimit.RateLimit`: a token bucket per key.
            concurrency_key: a function of the params naming the concurrency key.
            max_per_key: how many tasks of one key hold a slot at once (default 1).
            ordered: one task of a key at a time, in submit order.
            fair: claims go round-robin across tenants.
            fair_key: a function of the params naming the fairness key (implies fair).

        Raises:
            ConfigError: the same (name, version) twice, a bad flow-control argument,
                no context first parameter, a positional-only parameter
                after it, an annotation pydantic cannot validate, a lease below
                :data:`MIN_LEASE_S`, a ``time_limit_s`` that is not a finite number > 0 or
                None, a ``retry`` that is not a :class:`RetryPolicy`, a version below 1;
                each message names the function and what is expected.
            InvalidArguments: the name cannot be stored (not text, empty, a lone surrogate,
                NUL, over :data:`~ratchet.validation.MAX_NAME_BYTES` bytes): checked here,
                so a bad name never reaches a worker's claims.
        """
        if callable(name):  # @app.task without parentheses: the function came as the name
            raise InvalidArguments(
                f"@app.task needs parentheses: write @app.task(name=\"...\") (or "
                f"@app.task() for the default name "
                f"{getattr(name, '__module__', '?')}.{getattr(name, '__qualname__', '?')})")
        check_lease_s(lease_s)
        check_time_limit_s(time_limit_s)
        if name is not None:
            check_identifier(name, "task name", MAX_NAME_BYTES)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"retry must be a ratchet.RetryPolicy, got {type(retry).__name__}")
        flow = FlowSpec(queue, rate_limit, concurrency_key, max_per_key, ordered, fair,
                        fair_key)

        def decorator(fn: F) -> F:
            task_name = name or f"{fn.__module__}.{fn.__qualname__}"
            check_identifier(task_name, "task name", MAX_NAME_BYTES)
            versions = self.versions.setdefault(task_name, {})
            if version in versions:
                raise ConfigError(
                    f"task name {task_name!r} version {version!r} is registered twice "
                    f"({versions[version].fn.__qualname__} and {fn.__qualname__}); give "
                    "the new function another version=")
            definition = TaskDefinition(
                task_name, fn, version, retry or RetryPolicy(), lease_s, time_limit_s, params,
                flow)
            versions[version] = definition
            newest = self.tasks.get(task_name)
            if newest is None or newest.version < version:
                self.tasks[task_name] = definition
            return fn

        return decorator

    def periodic(
        self,
        name: str,
        *,
        cron: str | None = None,
        every_s: float | None = None,
        tz: str = "UTC",
        misfire_grace_s: float = 60.0,
        params: Mapping[str, Any] | None = None,
    ) -> Callable[[F], F]:
        """Submit a task on a schedule: applied above ``@app.task(...)``.

        Every tick (an instant of :class:`~ratchet.schedule.Schedule`) becomes exactly one
        task, with the idempotency key ``periodic:<name>:<tick, UTC>``
        (``periodic:report:2026-12-04T13:00:00Z``, :attr:`TaskInfo.idempotency_key`).
        Every worker runs a scheduler (``ratchet worker --no-scheduler`` turns it off);
        no leader: the key makes the ticks several schedulers submit one task. After
        downtime, ticks at most ``misfire_grace_s`` late are submitted, once each; older
        ones are recorded as missed (``ratchet schedules``), never run late. Daylight
        saving time: see :mod:`ratchet.schedule`.

        Args:
            name: the schedule's name, unique in the app (a stored name: text, no NUL).
            cron: a five-field cron expression, read in ``tz`` (exactly one of ``cron`` and
                ``every_s``).
            every_s: an interval, a whole number of seconds >= 1, anchored to the epoch.
            tz: the IANA time zone of ``cron``; default ``"UTC"``.
            misfire_grace_s: how late, in seconds (0 .. a week), a tick may still be
                submitted; default 60.
            params: the params of each tick's task (checked here against the task).

        Raises:
            ConfigError: the name is used twice, or the decorated function is not a task of
                this app (``@app.periodic`` must be above ``@app.task``).
            InvalidArguments: a bad name, schedule, grace or params.
        """

        def decorator(fn: F) -> F:
            if name in self.periodic_tasks:
                raise ConfigError(f"schedule name {name!r} is registered twice; give each "
                                  "@app.periodic its own name")
            definition = find_definition(fn, self.versions, name)
            self.periodic_tasks[name] = periodic_task(
                name, definition, cron=cron, every_s=every_s, tz=tz,
                misfire_grace_s=misfire_grace_s, params=params,
                max_payload_bytes=self.max_payload_bytes)
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
        return prepare_task(self.definition(request.name, request.version), request,
                            self.max_payload_bytes)

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
        queue: str | None = None,
        priority: int = 0,
        debounce_s: float | None = None,
        debounce_max_s: float | None = None,
        connection: Any = None,
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
            queue: the queue; default the task type's (``@app.task(queue=...)``).
            priority: a whole number, higher first among the queue's ready tasks
                (default 0; strict: see DESIGN §8, flow control).
            debounce_s: with ``idempotency_key``: the submits of that key within this many
                seconds collapse into one task, run with the last params ``debounce_s``
                after the last submit but no later than ``debounce_max_s`` after the
                first (default ``debounce_s``: a window fixed from the first submit), and
                every caller gets its id (``created`` is True
                only for the submit that opened the window). A submit made once the task
                was claimed opens a new window (DESIGN §8, debounce).
            debounce_max_s: the latest start, seconds after the first submit of the window
                (default ``debounce_s``).
            connection: write the task in your own open transaction on the ledger's
                database (a psycopg 3 ``Connection``; on SQLite the ``sqlite3.Connection``
                on the ledger's file), under a savepoint: the task exists if and only if
                your transaction commits, and workers are woken at that commit. Not
                grouped with other threads' submits (DESIGN §6, row 2). A psycopg
                ``AsyncConnection``: use :meth:`submit_async`.

        Raises:
            UnknownTask: no task of that name (or that ``version``); nothing was
                written.
            InvalidArguments: the params do not validate against the task's signature;
                nothing was written.
            PayloadNotSerializable: the params are not plain JSON; nothing was written.
            PayloadTooLarge: the params are over the size limit; nothing was written.
            IdempotencyConflict: the key was used before with other params; nothing was
                written.
            InvalidArguments: also a ``connection`` of the wrong kind, on another
                database, in autocommit mode or in a failed transaction.
            LedgerError: the ledger failed (:class:`~ratchet.errors.LedgerUnavailable`:
                the outcome may be unknown; submit again with the same idempotency key).
        """
        return self._submit_one(SubmitRequest(
            name, params, idempotency_key, run_at, delay_s, tenant=tenant, version=version,
            queue=queue, priority=priority, debounce_s=debounce_s,
            debounce_max_s=debounce_max_s), connection)

    def _submit_one(self, request: SubmitRequest, connection: Any = None) -> TaskHandle:
        """:meth:`submit` of one prepared request (also :meth:`submit_sharded`'s): its span,
        the group commit (or the caller's transaction), the fault points before and after
        it."""
        with submit_span(request.name, idempotency_key=request.idempotency_key,
                         tenant=request.tenant) as span:
            task = self._prepare(request)
            if span.trace_context is not None:
                task = dataclasses.replace(task, trace_context=span.trace_context)
            faults.point("submit.before_commit")
            if connection is not None:
                (result,) = self.ledger.submit([task], connection)
            else:
                result = self._submit_group.submit(self.ledger, task)
            span.submitted(result.task_id, result.created, task.version)
        faults.point("submit.after_commit")
        return TaskHandle(result.task_id, task.name, result.created, self)

    def submit_many(self, requests: Iterable[SubmitRequest], *,
                    connection: Any = None) -> list[TaskHandle]:
        """Submit several tasks in one ledger transaction, all-or-nothing.

        Args:
            requests: :class:`SubmitRequest` items (name, params, idempotency_key, run_at /
                delay_s): a list, or any iterable (read once).
            connection: write them in your own open transaction (see :meth:`submit`).

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
            if isinstance(request, SubmitRequest) and request.reserved:
                raise InvalidArguments(
                    f"submit_many: item {index} sets SubmitRequest.reserved, which only "
                    "Ratchet sets (use App.submit_sharded for a sharded job)")
            if not isinstance(request, SubmitRequest):
                raise InvalidArguments(
                    f"submit_many takes ratchet.SubmitRequest items; item {index} is a "
                    f"{type(request).__name__} ({request!r:.80}). Use "
                    "SubmitRequest(name, params, idempotency_key=...)"
                )
        with submit_span("", many=True) as span:
            new = [self._prepare(r) for r in requests]
            if span.trace_context is not None:
                new = [dataclasses.replace(t, trace_context=span.trace_context) for t in new]
            faults.point("submit.before_commit")
            results = self.ledger.submit(new, connection)
            span.submitted_many(len(new), sum(r.created for r in results))
        faults.point("submit.after_commit")
        return [
            TaskHandle(res.task_id, task.name, res.created, self)
            for res, task in zip(results, new, strict=True)
        ]

    def submit_sharded(self, name: str, params: Mapping[str, Any] | None = None, *,
                       shards: int, key: str | None = None,
                       tenant: str | None = None) -> TaskHandle:
        """Submit a sharded job: a parent task of ``name`` over a fixed logical shard space
        of ``shards``, which a worker turns into one child task of ``name`` per shard
        (``ctx.shard`` tells each its index and the count; :meth:`ratchet.Shard.owns`
        says whether a business key is its own), waits for all of them, and ends with
        ``{"shards", "totals", "results"}`` (``totals``: the shards' numeric result
        fields summed, e.g. their ``ctx.batches`` reports). Shards are tasks: leased,
        retried and taken over like any other, so a lost worker's shards move to another
        worker; the shard space never changes (DESIGN §8, logical shards). A shard that
        fails makes the job ``FAILED`` once every shard has ended.

        Args:
            name: a registered task name (the parent and every shard run it; its function
                sees ``ctx.shard``).
            params: the params of every shard (validated like :meth:`submit`'s).
            shards: the shard count, 1 .. :data:`ratchet.shards.MAX_SHARDS`.
            key: the job's idempotency key (the same key and params: the same job).
            tenant: as for :meth:`submit`.

        Returns:
            The parent's handle (``handle.result()`` waits for the job).

        Raises:
            InvalidArguments: ``shards`` out of range, or as :meth:`submit`.
            UnknownTask: as :meth:`submit`.
            PayloadNotSerializable: as :meth:`submit`.
            PayloadTooLarge: as :meth:`submit`.
            IdempotencyConflict: as :meth:`submit`.
            LedgerError: as :meth:`submit`.
        """
        count = check_shards(shards)
        return self._submit_one(SubmitRequest(name, params, key, tenant=tenant,
                                              reserved={SHARDS_PARAM: count}))

    def submit_children(self, parent_id: str, name: str,
                        params_list: Sequence[Mapping[str, Any]],
                        keys: Sequence[str],
                        reserved: Sequence[Mapping[str, Any]] | None = None,
                        ) -> list[TaskHandle]:
        """Submit children of the task ``parent_id`` in one ledger transaction (what
        ``ctx.submit`` / ``ctx.submit_many`` call; task code uses those): each is linked
        to its parent (the fan-in of ``ctx.gather``, the cancel cascade) and deduplicated
        by its idempotency key (``keys``, one per item). ``reserved``: per item, framework
        keys stored with its params after they validated (a shard's place,
        :mod:`ratchet.shards`), or None.

        Raises:
            Same as :meth:`submit_many`; nothing of the batch is written on an error.
        """
        extra = list(reserved) if reserved is not None else [None] * len(keys)
        with submit_span(name, many=True) as span:
            new = [dataclasses.replace(
                       self._prepare(SubmitRequest(name, params, key, reserved=more)),
                       parent_id=parent_id)
                   for params, key, more in zip(params_list, keys, extra, strict=True)]
            if span.trace_context is not None:
                new = [dataclasses.replace(t, trace_context=span.trace_context) for t in new]
            results = self.ledger.submit(new) if new else []
            span.submitted_many(len(new), sum(r.created for r in results))
        return [TaskHandle(res.task_id, task.name, res.created, self)
                for res, task in zip(results, new, strict=True)]

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
        with self._operator_ledger(write=False) as ledger:
            return taskops.list_tasks(ledger, **filters)

    def cancel(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Cancel a task, audited: :meth:`ratchet.Control.cancel` on this App's ledger
        (which documents the arbitration rules and errors).

        Returns:
            A :class:`~ratchet.ledger.base.ControlOutcome` (``outcome``: ``done``,
            ``requested`` or ``unchanged``).
        """
        with self._operator_ledger(write=True) as ledger:
            return taskops.cancel(ledger, task_id, reason, by)

    def retry(self, task_id: str, *, reason: str, by: str | None = None) -> ControlOutcome:
        """Run a ``FAILED`` task again with a fresh set of attempts, audited:
        :meth:`ratchet.Control.retry` on this App's ledger (which documents it)."""
        with self._operator_ledger(write=True) as ledger:
            return taskops.retry(ledger, task_id, reason, by)

    def _operator_ledger(self, *, write: bool) -> taskops.LedgerOnDemand:
        """The ledger of an operator call made through the App, as :class:`ratchet.Control`
        opens it: the App's ledger object if it holds one, else a handle of its own on the
        App's URL, which must exist (read calls never create or migrate it)."""
        return taskops.LedgerOnDemand(
            self.ledger_url, write=write,
            given=self.ledger if self.holds_ledger_object else None)

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
        return taskops.wait_settled(self.get, task_id, timeout_s, poll_s)

    def __repr__(self) -> str:
        """``<ratchet.App ledger='...' tasks=[...]>``, the ledger URL with its password
        redacted."""
        if self.holds_ledger_object:
            where = f"<{type(self._ledger_arg).__name__}>"
        else:
            raw = self.ledger_url or os.environ.get("RATCHET_LEDGER_URL") or "default"
            where = redact_url(raw)
        return f"<ratchet.App ledger={where!r} tasks={sorted(self.tasks)}>"
