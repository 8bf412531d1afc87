"""An App's calls for asyncio callers (a base class of :class:`ratchet.App`):
``await app.submit_async(...)``, ``submit_many_async``, ``emit_async`` and
``await app.wait_async(...)``, which never block the event loop.

Each is its sync call, run off the loop: the same validation, the same errors, the same
ledger code (one copy). The ledger's write runs in a thread of the loop's default
executor while the coroutine awaits it. With ``connection=`` a psycopg
``AsyncConnection``, that thread writes on the caller's connection inside the caller's
transaction, each statement sent on the caller's loop
(:class:`~ratchet.ledger.loopbridge.LoopConnection`); a sync connection (psycopg
``Connection``, ``sqlite3.Connection`` opened with ``check_same_thread=False``) is used
from the thread as it is. Waits poll with ``asyncio.sleep`` between reads made off the
loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from ..ledger.base import TaskInfo
from ..ledger.loopbridge import LoopConnection, is_async_connection
from . import _taskops as taskops
from ._submitting import SubmitRequest

__all__ = ["AsyncCalls", "off_loop"]

T = TypeVar("T")
H_co = TypeVar("H_co", covariant=True)


class _App(Protocol[H_co]):
    """What the async calls use of :class:`ratchet.App` (``H_co``: its TaskHandle)."""

    @property
    def submit(self) -> Callable[..., H_co]: ...

    @property
    def submit_many(self) -> Callable[..., Sequence[H_co]]: ...

    def emit(self, topic: str, message: Any, *, key: str | None = None,
             message_id: str | None = None, connection: Any = None) -> str: ...

    def get(self, task_id: str) -> TaskInfo: ...


async def off_loop(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a thread of the running loop's default executor, with
    the caller's context variables (a trace span), awaited.

    Cancelling the awaiting coroutine waits for the call in flight to end before the
    cancellation goes on, so that nothing of it runs on the caller's connection once the
    caller goes on (the write may have happened: submit again with the same idempotency
    key to know).

    Raises:
        What ``fn`` raises; CancelledError.
    """
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    future = loop.run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        raise


def _bridged(connection: Any) -> Any:
    """``connection`` as the sync code in a worker thread can use it: an asyncio
    connection bridged to the running loop; any other as it is."""
    if is_async_connection(connection):
        return LoopConnection.on_running_loop(connection)
    return connection


class AsyncCalls:
    """The asyncio calls of :class:`ratchet.App` (a base class of it)."""

    async def submit_async(
        self: _App[H_co],
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
    ) -> H_co:
        """:meth:`ratchet.App.submit` for a coroutine: ``handle = await
        app.submit_async(name, params, ...)``, the same arguments, checks, errors and
        :class:`~ratchet.app.TaskHandle`, without blocking the event loop (the ledger
        write runs in a worker thread the coroutine awaits). Cancelling the call waits for
        the write in flight to end first (see :func:`off_loop`).

        Args:
            name: as :meth:`ratchet.App.submit`, like ``params``, ``idempotency_key``,
                ``run_at``, ``delay_s``, ``tenant``, ``version``, ``queue``, ``priority``,
                ``debounce_s`` and ``debounce_max_s``.
            connection: write the task in your own open transaction (see
                :meth:`ratchet.App.submit`): a psycopg ``AsyncConnection`` on the ledger's
                database (its statements are sent on your event loop, under the savepoint
                ``ratchet_join``; do not use the connection from another coroutine until
                this call returns), a psycopg ``Connection``, or on SQLite the
                ``sqlite3.Connection`` on the ledger's file opened with
                ``check_same_thread=False`` (it is used from the worker thread).

        Raises:
            UnknownTask: as :meth:`ratchet.App.submit`.
            InvalidArguments: as :meth:`ratchet.App.submit`; also a ``sqlite3.Connection``
                bound to its thread (``check_same_thread=True``).
            PayloadNotSerializable: as :meth:`ratchet.App.submit`.
            PayloadTooLarge: as :meth:`ratchet.App.submit`.
            IdempotencyConflict: as :meth:`ratchet.App.submit`.
            LedgerError: as :meth:`ratchet.App.submit`.
        """
        return await off_loop(
            self.submit, name, params, idempotency_key=idempotency_key, run_at=run_at,
            delay_s=delay_s, tenant=tenant, version=version, queue=queue, priority=priority,
            debounce_s=debounce_s, debounce_max_s=debounce_max_s,
            connection=_bridged(connection))

    async def submit_many_async(self: _App[H_co], requests: Iterable[SubmitRequest], *,
                                connection: Any = None) -> list[H_co]:
        """:meth:`ratchet.App.submit_many` for a coroutine (all-or-nothing, in one ledger
        transaction or in yours: ``connection`` as :meth:`submit_async`).

        Raises:
            Same as :meth:`ratchet.App.submit_many`.
        """
        return list(await off_loop(self.submit_many, requests,
                                   connection=_bridged(connection)))

    async def emit_async(self: _App[Any], topic: str, message: Any, *, key: str | None = None,
                         message_id: str | None = None, connection: Any = None) -> str:
        """:meth:`ratchet.App.emit` for a coroutine (``connection`` as
        :meth:`submit_async`).

        Returns:
            The message id.

        Raises:
            Same as :meth:`ratchet.App.emit`.
        """
        return await off_loop(self.emit, topic, message, key=key, message_id=message_id,
                              connection=_bridged(connection))

    async def wait_async(self: _App[Any], task_id: str, timeout_s: float | None = None,
                         poll_s: float = 0.05) -> TaskInfo:
        """:meth:`ratchet.App.wait` for a coroutine: until the task is terminal
        (SUCCEEDED, FAILED, CANCELLED) or UNKNOWN, reading it off the loop every
        ``poll_s`` seconds (growing to 0.5 s) with ``asyncio.sleep`` between reads.

        Args:
            task_id: the task.
            timeout_s: give up after this many seconds (None waits forever; or cancel the
                coroutine, e.g. ``asyncio.timeout``).
            poll_s: first polling interval in seconds.

        Raises:
            WaitTimeout: the timeout passed first (the same error as :meth:`App.wait`).
            TaskNotFound: no such task.
            InvalidArguments: ``timeout_s`` or ``poll_s`` is not a finite number >= 0.
        """
        get = self.get

        async def read(tid: str) -> TaskInfo:
            return await off_loop(get, tid)

        return await taskops.wait_settled_async(read, task_id, timeout_s, poll_s)
