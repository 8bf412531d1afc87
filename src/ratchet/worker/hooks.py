"""Worker lifecycle hooks: :class:`Middleware`, in the manner of dramatiq's middleware.

Metrics and tracing plug in here instead of in the claim loop; where an attempt ends (retry,
dead-letter, quarantine, budget) is not a hook's: it is the outcome table's
(:func:`ratchet.outcome.decide`), and a hook only observes it. Subclass
:class:`Middleware`, override the methods you need (each does nothing by default) and pass
instances as ``Worker(app, middleware=[...])``; they are called in list order.

Which thread calls what (the hook runs in the thread where the event happens, so keep it
short: a slow hook slows that thread). Task threads run at once, and so do writer threads
when the worker has more than one (``writers``): a middleware must be thread-safe.

=============================================  =========================================
``worker_start`` / ``worker_stop``             the thread that called :meth:`Worker.run`
``before_claim`` / ``after_claim``             the writer thread (claims ride on commits)
``before_commit`` / ``after_commit``           the writer thread (one call per transaction)
``before_attempt``                             the task thread, before the body runs
``after_attempt``                              the thread that learns the outcome: the
                                               writer thread once the final write committed,
                                               or the task thread when nothing was written
``before_step`` / ``after_step``               the task thread
``before_effect`` / ``after_effect``           the task thread
``late_effect``                                the task thread
``after_renew``                                the heartbeat thread
=============================================  =========================================

A hook that raises is logged (``ratchet.worker.hooks`` logger, with its traceback) and
otherwise ignored: it never stops the worker, fails a task or changes its outcome. Only
``Exception`` is caught; a hook must not raise ``BaseException`` (``SystemExit`` ...).

With no middleware installed the worker keeps ``None`` instead of a :class:`Hooks`
dispatcher and every call site is one ``is None`` test, so hooks cost nothing then.

Hooks are given the worker and the task context; the dispatcher types them as
:class:`WorkerLike` and :class:`ContextLike`, protocols of what a hook reads, which the
:class:`~ratchet.worker.runner.Worker` and :class:`~ratchet.worker.context.TaskContext`
satisfy. The worker's modules below the runner (the context, the heartbeat, the writer)
report to this module without importing the runner back.

:func:`add_default_middleware` lets a package above the worker (the OpenTelemetry tracing
of :mod:`ratchet.observe.tracing`) add a middleware every worker installs by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..breaker import DownstreamBreaker
from ..ledger.base import Claim, Ledger
from ..retry import RetryBudget
from .events import EffectSettlement
from .heartbeat import Heartbeat
from .stats import WorkerStats

__all__ = [
    "AppLike", "ContextLike", "DefaultMiddleware", "EffectSettlement", "Hooks", "Middleware",
    "WorkerLike", "add_default_middleware", "with_defaults",
]

log = logging.getLogger("ratchet.worker.hooks")


class AppLike(Protocol):
    """What a hook sees of the worker's :class:`~ratchet.app.App`."""

    @property
    def downstreams(self) -> Mapping[str, RetryBudget]:
        """Retry budgets of the declared downstreams, by name."""

    @property
    def breakers(self) -> Mapping[str, DownstreamBreaker]:
        """Circuit breakers of the declared downstreams, by name."""


class WorkerLike(Protocol):
    """What a hook is given as ``worker``: the :class:`~ratchet.worker.runner.Worker`,
    described by what hooks read (so that this module needs nothing above it)."""

    @property
    def app(self) -> AppLike:
        """The worker's application."""

    @property
    def holder(self) -> str:
        """The worker's identity (``host:pid:random`` by default)."""

    @property
    def names(self) -> Sequence[str]:
        """The task names it claims."""

    @property
    def concurrency(self) -> int:
        """Its task threads."""

    @property
    def ledger(self) -> Ledger:
        """Its ledger."""

    @property
    def heartbeat(self) -> Heartbeat:
        """The thread renewing its leases (``held()``: the leases it holds)."""

    @property
    def stats(self) -> WorkerStats:
        """Its counters."""


class ContextLike(Protocol):
    """What a hook is given as ``ctx``: the running task's
    :class:`~ratchet.worker.context.TaskContext`, described by what hooks read."""

    @property
    def task_id(self) -> str:
        """The task's id."""

    @property
    def name(self) -> str:
        """The task name."""

    @property
    def generation(self) -> int:
        """The claim's fencing token."""

    @property
    def attempt(self) -> int:
        """1-based claim count."""

    @property
    def holder(self) -> str:
        """The worker holding the lease."""

    @property
    def params(self) -> Any:
        """The decoded params (None until decoded)."""

    @property
    def exception(self) -> BaseException | None:
        """What the body raised, once it ended."""

    @property
    def effect_downstream(self) -> str | None:
        """The ``downstream=`` of the effect being performed."""

    @property
    def downstream_calls(self) -> Mapping[str, int]:
        """Requests this attempt's effects sent, per declared downstream."""

    @property
    def failed_downstream(self) -> str | None:
        """The downstream of the effect whose call raised last, if any."""


class Middleware:
    """Base class of worker middleware; every hook does nothing unless overridden.

    Durations are in seconds (``time.perf_counter`` differences). ``outcome`` of
    :meth:`after_attempt` is the state written (``"SUCCEEDED"``, ``"RETRY_WAIT"``,
    ``"FAILED"``, ``"UNKNOWN"``, ``"PENDING"``) or ``"stale"`` / ``"lease_lost"`` /
    ``"abandoned"`` when the worker wrote nothing final.

    ``worker`` is the running :class:`~ratchet.Worker` and ``ctx`` the task's
    :class:`~ratchet.TaskContext` (they satisfy :class:`WorkerLike` and
    :class:`ContextLike`, what the worker's own hooks read). The base class types them
    ``Any`` so that a subclass may annotate them as ``Worker`` / ``TaskContext`` (or the
    protocols) and a type checker accepts the override: this module sits below the
    worker and cannot name its classes.
    """

    def worker_start(self, worker: Any) -> None:
        """The worker is about to claim for the first time."""

    def worker_stop(self, worker: Any) -> None:
        """The worker has stopped: every task ended and every final write was handled."""

    def before_claim(self, worker: Any, limit: int) -> None:
        """A claim of at most ``limit`` tasks is about to be sent (``after_claim`` follows
        only if its transaction commits)."""

    def after_claim(self, worker: Any, claims: list[Claim]) -> None:
        """A claim committed with ``claims`` (possibly empty); their bodies have not run."""

    def before_attempt(self, worker: Any, claim: Claim) -> None:
        """The task body of ``claim`` is about to run."""

    def after_attempt(
        self, worker: Any, claim: Claim, outcome: str, exception: BaseException | None
    ) -> None:
        """The attempt ended with ``outcome``; ``exception`` is what the body raised, if any."""

    def before_step(self, ctx: Any, name: str) -> None:
        """``ctx.step(name, ...)`` starts (after the name was validated)."""

    def after_step(
        self, ctx: Any, name: str, cached: bool, duration_s: float,
        exception: BaseException | None,
    ) -> None:
        """``ctx.step`` ended; ``cached``: the stored value was returned without running."""

    def before_effect(self, ctx: Any, name: str, key: str) -> None:
        """``ctx.effect(name, key=key)`` starts (after name and key were validated)."""

    def after_effect(
        self, ctx: Any, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        """``ctx.effect`` ended, settled as ``settled`` (see :data:`EffectSettlement`)."""

    def before_commit(self, worker: Any, batch_size: int) -> None:
        """A group commit of ``batch_size`` task writes is about to be sent."""

    def after_commit(
        self, worker: Any, batch_size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """That group commit ended; ``error`` is the ledger's error when it failed."""

    def after_renew(
        self, worker: Any, leases: int, refused: int, duration_s: float,
        error: BaseException | None,
    ) -> None:
        """One batched renewal of ``leases`` held leases ended after ``duration_s`` seconds
        (request to reply). ``refused``: leases the ledger would not renew (revoked by an
        operator or the worker registry, or taken over after expiry): they are lost.
        ``error``: the ledger's error when the whole renewal failed (nothing confirmed)."""

    def late_effect(self, ctx: Any, name: str, key: str, outcome: str) -> None:
        """This worker, no longer the task's holder, sent effect ``name`` (key ``key``)
        after its safe window closed to a target that does not deduplicate; a late-effect
        record is being written (``outcome``: ``"done"`` or ``"unknown"``)."""


class Hooks:
    """Calls every middleware's hook in order, logging (and swallowing) what one raises.

    Bound to one worker, so callers that do not know the worker (the writer) need not pass
    it. Used only when at least one middleware is installed.

    Args:
        worker: the worker the hooks report on.
        middleware: the middleware, called in this order.
    """

    def __init__(self, worker: WorkerLike, middleware: Sequence[Middleware]) -> None:
        self.worker = worker
        self.middleware = tuple(middleware)

    def _failed(self, mw: Middleware, hook: str) -> None:
        log.exception("middleware %s.%s failed (ignored)", type(mw).__name__, hook)

    def worker_start(self) -> None:
        """Call ``worker_start`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.worker_start(self.worker)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "worker_start")

    def worker_stop(self) -> None:
        """Call ``worker_stop`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.worker_stop(self.worker)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "worker_stop")

    def before_claim(self, limit: int) -> None:
        """Call ``before_claim`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.before_claim(self.worker, limit)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "before_claim")

    def after_claim(self, claims: list[Claim]) -> None:
        """Call ``after_claim`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_claim(self.worker, claims)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_claim")

    def before_attempt(self, claim: Claim) -> None:
        """Call ``before_attempt`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.before_attempt(self.worker, claim)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "before_attempt")

    def after_attempt(self, claim: Claim, outcome: str, exception: BaseException | None) -> None:
        """Call ``after_attempt`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_attempt(self.worker, claim, outcome, exception)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_attempt")

    def before_step(self, ctx: ContextLike, name: str) -> None:
        """Call ``before_step`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.before_step(ctx, name)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "before_step")

    def after_step(
        self, ctx: ContextLike, name: str, cached: bool, duration_s: float,
        exception: BaseException | None,
    ) -> None:
        """Call ``after_step`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_step(ctx, name, cached, duration_s, exception)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_step")

    def before_effect(self, ctx: ContextLike, name: str, key: str) -> None:
        """Call ``before_effect`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.before_effect(ctx, name, key)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "before_effect")

    def after_effect(
        self, ctx: ContextLike, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        """Call ``after_effect`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_effect(ctx, name, key, settled, duration_s, exception)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_effect")

    def before_commit(self, batch_size: int) -> None:
        """Call ``before_commit`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.before_commit(self.worker, batch_size)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "before_commit")

    def after_commit(
        self, batch_size: int, duration_s: float, error: BaseException | None
    ) -> None:
        """Call ``after_commit`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_commit(self.worker, batch_size, duration_s, error)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_commit")

    def after_renew(
        self, leases: int, refused: int, duration_s: float, error: BaseException | None
    ) -> None:
        """Call ``after_renew`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.after_renew(self.worker, leases, refused, duration_s, error)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "after_renew")

    def late_effect(self, ctx: ContextLike, name: str, key: str, outcome: str) -> None:
        """Call ``late_effect`` on every middleware."""
        for mw in self.middleware:
            try:
                mw.late_effect(ctx, name, key, outcome)
            except BaseException:  # even SystemExit from a plugin: log, go on
                self._failed(mw, "late_effect")


DefaultMiddleware = Callable[[Sequence[Middleware]], Middleware | None]
"""``provider(given) -> Middleware | None``: called by every new worker with the
middleware it was given; a middleware returned is put first."""

_defaults: list[DefaultMiddleware] = []


def add_default_middleware(provider: DefaultMiddleware) -> None:
    """Have every :class:`~ratchet.worker.runner.Worker` built from now on call
    ``provider`` with the middleware it was given and put what it returns (if not None)
    first. Adding the same provider twice adds it once. Used by
    :mod:`ratchet.observe.tracing`, which the ``ratchet`` package imports: a worker traces
    by itself when OpenTelemetry records (DESIGN §9)."""
    if provider not in _defaults:
        _defaults.append(provider)


def with_defaults(given: Sequence[Middleware]) -> tuple[Middleware, ...]:
    """``given`` with the middleware of every :func:`add_default_middleware` provider in
    front (the last provider added first), those returning None left out."""
    installed = tuple(given)
    for provider in _defaults:
        extra = provider(installed)
        if extra is not None:
            installed = (extra, *installed)
    return installed
