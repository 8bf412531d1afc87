"""Task bodies that make a replay hard to stop or end in a ``BaseException``, for the
replay tests (``ratchet replay --app stopapp:app --ledger URL``).

``loop`` (and ``loop_async``, the same as ``async def``):

* version 1: step ``first``, returns ``"done"``;
* version 2: then retries a new step ``poll`` with a bare ``except:`` until it succeeds
  (or :data:`RELEASE` is set): the replay's stop at the end of the history is swallowed;
* version 3: catches the stop at ``poll`` once, then calls step ``after``.

``raises`` (and ``raises_async``): step ``s``, then raises the ``BaseException`` its
``kind`` parameter names.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from ratchet import App, RetryPolicy

RELEASE = threading.Event()
"""Set by the tests to let a body stuck in its retry loop end."""

ONCE = RetryPolicy(max_attempts=1)

KINDS: dict[str, type[BaseException]] = {
    "keyboard": KeyboardInterrupt, "base": BaseException, "generator_exit": GeneratorExit,
    "cancelled": asyncio.CancelledError, "system_exit": SystemExit,
}


def _raise(kind: str) -> None:
    if kind in KINDS:
        raise KINDS[kind](kind)


def make_app(url: str | None) -> App:
    """An App on ``url`` with every version of the tasks above."""
    app = App(url)
    for version in (1, 2, 3):
        def loop(ctx: Any, version: int = version) -> Any:
            ctx.step("first", lambda: 1)
            if version == 2:
                while not RELEASE.is_set():
                    try:
                        ctx.step("poll", lambda: "ready")
                        break
                    except:  # noqa: E722 - the careless retry loop under test
                        RELEASE.wait(0.01)
            elif version == 3:
                with contextlib.suppress(BaseException):  # the stop, caught once
                    ctx.step("poll", lambda: "ready")
                ctx.step("after", lambda: 2)
            return "done"

        async def loop_async(ctx: Any, version: int = version) -> Any:
            await ctx.step("first", lambda: 1)
            if version == 2:
                while not RELEASE.is_set():
                    try:
                        await ctx.step("poll", lambda: "ready")
                        break
                    except:  # noqa: E722 - the careless retry loop under test
                        await asyncio.sleep(0.01)
            elif version == 3:
                with contextlib.suppress(BaseException):  # the stop, caught once
                    await ctx.step("poll", lambda: "ready")
                await ctx.step("after", lambda: 2)
            return "done"

        app.task(name="loop", version=version, retry=ONCE)(loop)
        app.task(name="loop_async", version=version, retry=ONCE)(loop_async)

    @app.task(name="raises", retry=ONCE)
    def raises(ctx: Any, kind: str) -> Any:
        ctx.step("s", lambda: 1)
        _raise(kind)
        return kind

    @app.task(name="raises_async", retry=ONCE)
    async def raises_async(ctx: Any, kind: str) -> Any:
        await ctx.step("s", lambda: 1)
        _raise(kind)
        return kind

    return app


app = make_app(None)
