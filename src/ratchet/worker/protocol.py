"""The sans-I/O checkpoint protocol and its two drivers (DESIGN §5, async bodies).

The checkpoint and effect logic (:mod:`ratchet.worker.checkpoints`,
:mod:`ratchet.worker.effects`) is written once, as generator functions that never block:
where the protocol has to wait they ``yield`` an operation and receive its result (or
have its exception thrown back in with ``gen.throw``, so the protocol's own
``try``/``except`` logic handles it exactly where it stands). Generators compose with
``yield from``. Two drivers run them:

* :func:`run_sync` performs each operation in the calling thread (a task thread): the
  ``TaskContext`` methods are ``run_sync(self._..._g(...))``. A user callable that returns
  an awaitable there is refused (:class:`~ratchet.errors.InvalidArguments`: make the task
  ``async def``).
* :func:`run_async` performs them for an ``async def`` body on the worker's event loop:
  user coroutines are awaited on the loop; a durable commit is handed to the
  :class:`~ratchet.worker.writer.LedgerWriter` with a callback resolving an
  :class:`asyncio.Future` (no thread per in-flight task); other blocking work of Ratchet's
  own machinery (a lease confirmation that has to wait for the heartbeat, a ledger read
  or write) runs in the loop's small default executor (:func:`asyncio.to_thread`).

Operations (each a small object, never a copy of protocol logic):

* :class:`Commit`: make a :class:`~ratchet.ledger.base.TaskWrite` durable; result the
  :class:`~ratchet.ledger.base.CommitOutcome`.
* :class:`Block`: a blocking call of Ratchet's machinery, ``fn()``; result its return.
* :class:`Call`: user code, ``fn(*args, **kwargs)``; result its return (awaited when it
  is an awaitable and the driver is the async one).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from ..errors import InvalidArguments
from ..ledger.base import CommitOutcome, TaskWrite
from .writer import LedgerWriter

__all__ = ["AwaitableRefused", "Block", "Call", "Commit", "Op", "Protocol", "run_async",
           "run_sync"]

T = TypeVar("T")


class Op:
    """An operation a protocol generator yields (see the module docstring)."""

    __slots__ = ()


class Commit(Op):
    """Make ``write`` durable through ``writer``; the result is its
    :class:`~ratchet.ledger.base.CommitOutcome` (errors as
    :meth:`~ratchet.worker.writer.LedgerWriter.commit`)."""

    __slots__ = ("write", "writer")

    def __init__(self, writer: LedgerWriter, write: TaskWrite) -> None:
        self.writer = writer
        self.write = write


class Block(Op):
    """A blocking call of Ratchet's own machinery: ``fn()`` (a ledger read or write, a
    lease confirmation waiting for the heartbeat)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class Call(Op):
    """User code: ``fn(*args, **kwargs)`` (a step's function, an effect's call or
    lookup); ``what`` names it for errors (``"step 'fetch'"``)."""

    __slots__ = ("args", "fn", "kwargs", "what")

    def __init__(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.what = what
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


Protocol = Generator[Op, Any, T]
"""A protocol generator: yields :class:`Op`, receives each one's result, returns ``T``."""


class AwaitableRefused(InvalidArguments):
    """A user callable of a plain ``def`` task returned an awaitable: it was closed without
    running, so nothing was sent (an effect's call refused this way is recorded not done,
    never left open)."""


def _refuse_awaitable(what: str, value: Any) -> None:
    """Close an awaitable a user callable returned in a sync task and refuse it."""
    close = getattr(value, "close", None)
    if inspect.iscoroutine(value) and callable(close):
        close()  # never awaited: no "coroutine was never awaited" warning
    raise AwaitableRefused(
        f"{what} returned an awaitable ({type(value).__name__}), but this task is a plain "
        "def task: its steps and effects cannot await. Make the task `async def` (then "
        "`await ctx.step(...)` / `await ctx.effect(...)`), or pass a plain function")


def _perform_sync(op: Op) -> Any:
    if isinstance(op, Commit):
        return op.writer.commit(op.write)
    if isinstance(op, Call):
        value = op.fn(*op.args, **op.kwargs)
        if inspect.isawaitable(value):
            _refuse_awaitable(op.what, value)
        return value
    if isinstance(op, Block):
        return op.fn()
    raise TypeError(f"unknown protocol operation {op!r}")


def run_sync(gen: Protocol[T]) -> T:
    """Drive ``gen`` in the calling thread, performing each operation there; return what
    it returns, raise what it raises.

    Raises:
        InvalidArguments: a user callable returned an awaitable (the task must be
            ``async def`` to await it); thrown into the protocol at that point.
        BaseException: whatever the protocol raises.
    """
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = gen.send(send) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send = error = None
        try:
            send = _perform_sync(op)
        except BaseException as exc:
            error = exc
        finally:
            del op


def _commit_future(writer: LedgerWriter, write: TaskWrite) -> asyncio.Future[CommitOutcome]:
    """A future of ``write``'s commit, resolved from the writer thread's callback."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[CommitOutcome] = loop.create_future()

    def resolve(outcome: CommitOutcome | None, error: BaseException | None) -> None:
        if future.done():  # the task was cancelled meanwhile
            return
        if outcome is not None:
            future.set_result(outcome)
        else:
            future.set_exception(error if error is not None
                                 else RuntimeError("commit failed without an error"))

    def done(outcome: CommitOutcome | None, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(resolve, outcome, error)

    writer.submit(write, done)
    return future


async def _perform_async(op: Op) -> Any:
    if isinstance(op, Commit):
        return await _commit_future(op.writer, op.write)
    if isinstance(op, Call):
        value = op.fn(*op.args, **op.kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value
    if isinstance(op, Block):
        return await asyncio.to_thread(op.fn)
    raise TypeError(f"unknown protocol operation {op!r}")


async def run_async(gen: Protocol[T]) -> T:
    """Drive ``gen`` on the running event loop: user callables are called on the loop
    (their awaitables awaited), commits resolved by the writer's callbacks, other
    blocking machinery run in the loop's default executor. Returns what ``gen`` returns,
    raises what it raises; a cancellation (``asyncio.CancelledError``) is thrown into the
    protocol like any exception.
    """
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = gen.send(send) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send = error = None
        try:
            send = await _perform_async(op)
        except BaseException as exc:
            error = exc
        finally:
            del op
