"""The sans-I/O protocol's two drivers (ratchet.worker.protocol): the same generator runs
under both, gets each operation's result or its exception thrown back in where it
yielded, and a plain driver refuses an awaitable from user code."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ratchet.errors import InvalidArguments
from ratchet.worker.protocol import Block, Call, Protocol, run_async, run_sync


def _flow(fn: Any) -> Protocol[list[Any]]:
    seen: list[Any] = []
    seen.append((yield Call("step 'a'", fn, 2)))
    try:
        yield Call("step 'b'", _boom)
    except ValueError as exc:  # thrown back in where it yielded
        seen.append(f"caught {exc}")
    seen.append((yield Block(threading.current_thread)).name != "")
    return seen


def _boom() -> None:
    raise ValueError("boom")


def _double(x: int) -> int:
    return 2 * x


async def _double_async(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


def test_the_sync_driver_runs_the_protocol() -> None:
    assert run_sync(_flow(_double)) == [4, "caught boom", True]


def test_the_async_driver_runs_the_same_protocol_with_sync_and_async_calls() -> None:
    assert asyncio.run(run_async(_flow(_double))) == [4, "caught boom", True]
    assert asyncio.run(run_async(_flow(_double_async))) == [4, "caught boom", True]


def test_the_async_driver_runs_blocking_machinery_off_the_loop() -> None:
    def names() -> Protocol[tuple[str, str]]:
        here = yield Call("step", lambda: threading.current_thread().name)
        there = yield Block(lambda: threading.current_thread().name)
        return here, there

    async def main() -> tuple[str, str]:
        return await run_async(names())

    here, there = asyncio.run(main())
    assert here == threading.current_thread().name  # user code: on the loop
    assert there != here  # Ratchet's blocking work: a thread of the loop's executor


def test_the_sync_driver_refuses_an_awaitable_and_closes_it() -> None:
    made: list[Any] = []

    def returns_coroutine(x: int) -> Any:
        coro = _double_async(x)
        made.append(coro)
        return coro

    with pytest.raises(InvalidArguments, match="async def"):
        run_sync(_flow(returns_coroutine))
    assert made and made[0].cr_frame is None  # closed: never left pending
