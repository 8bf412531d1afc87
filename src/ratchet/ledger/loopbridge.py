"""A caller's asyncio database connection, usable from a worker thread
(:class:`LoopConnection`): what lets ``await app.submit_async(..., connection=aconn)``
write its rows on a psycopg ``AsyncConnection`` inside the caller's transaction with
the one joined-transaction code the sync ``connection=`` uses (:meth:`Dialect.join`,
:class:`~ratchet.ledger.pgtx.PgTx`).

The ledger's statements run in a worker thread, as for a sync connection; each one the
thread sends is dispatched to the caller's event loop (``run_coroutine_threadsafe``) and
the thread blocks on its result, while the caller's coroutine awaits the thread: the loop
is never blocked and the async connection is only ever used on its own loop. Nothing here
depends on a driver: the dialect decides which async connections it can join.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import InvalidArguments

__all__ = ["LoopConnection", "LoopCursor", "is_async_connection", "target_of"]

T = TypeVar("T")


def is_async_connection(connection: object) -> bool:
    """True for an asyncio DB connection (its ``commit`` is a coroutine function), such
    as psycopg's ``AsyncConnection``; False for a DB-API one or None."""
    commit = getattr(type(connection), "commit", None)
    return commit is not None and inspect.iscoroutinefunction(commit)


def target_of(connection: Any) -> Any:
    """The caller's connection itself: ``connection.target`` for a
    :class:`LoopConnection`, else ``connection``."""
    return connection.target if isinstance(connection, LoopConnection) else connection


class LoopConnection:
    """An async connection (``target``) seen from a worker thread: attribute reads pass
    through (``info``, ``closed``, ``broken``, ``autocommit``), and :meth:`cursor` gives a
    :class:`LoopCursor` whose every call runs on ``loop``.

    Made on the loop's thread (:meth:`on_running_loop`); used from another thread only.

    Raises:
        InvalidArguments: (:meth:`call`) used on the loop's own thread, where waiting for
            the loop would wait forever (call ``await app.submit_async``, not
            ``app.submit``, from a coroutine).
    """

    __slots__ = ("_loop_thread", "loop", "target")

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        self.target = target
        self.loop = loop
        self._loop_thread = loop_thread

    @classmethod
    def on_running_loop(cls, target: Any) -> LoopConnection:
        """``target`` bridged to the running loop (call it from a coroutine).

        Raises:
            RuntimeError: no running event loop.
        """
        return cls(target, asyncio.get_running_loop(), threading.get_ident())

    def call(self, make: Callable[[], Awaitable[T] | T]) -> T:
        """Run ``make()`` on the loop (awaiting it if it returns an awaitable) and return
        its result, blocking this thread; its exception is raised here."""
        if threading.get_ident() == self._loop_thread:
            raise InvalidArguments(
                "an async connection= is used from its own event loop's thread, which "
                "would block the loop: use `await app.submit_async(...)` (or "
                "`submit_many_async`, `emit_async`) with an AsyncConnection")

        async def run() -> T:
            value = make()
            if inspect.isawaitable(value):
                return await value
            return value

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()

    def cursor(self, **kwargs: Any) -> LoopCursor:
        """A :class:`LoopCursor` over ``target.cursor(**kwargs)``."""
        return LoopCursor(self, self.call(lambda: self.target.cursor(**kwargs)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def __repr__(self) -> str:
        return f"<LoopConnection {self.target!r}>"


class LoopCursor:
    """A sync cursor over an async one (see :class:`LoopConnection`): ``execute``,
    ``fetchone``, ``fetchall``, ``nextset``, ``rowcount``, ``close``, and ``with``."""

    __slots__ = ("_bridge", "_cur")

    def __init__(self, bridge: LoopConnection, cur: Any) -> None:
        self._bridge = bridge
        self._cur = cur

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> LoopCursor:
        self._bridge.call(lambda: self._cur.execute(query, params, **kwargs))
        return self

    def fetchone(self) -> Any:
        return self._bridge.call(self._cur.fetchone)

    def fetchall(self) -> Any:
        return self._bridge.call(self._cur.fetchall)

    def nextset(self) -> Any:
        return self._bridge.call(self._cur.nextset)

    @property
    def rowcount(self) -> int:
        return int(self._cur.rowcount)

    def close(self) -> None:
        self._bridge.call(self._cur.close)

    def __enter__(self) -> LoopCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
