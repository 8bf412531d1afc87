"""The app of the HTTP API tests (``ratchet serve --app tests.web.webapp:app``, or
:func:`make_app` for an App of one's own).

* ``web.echo(text)``: one step, returns ``{"echo": text}``.
* ``web.fail()``: a permanent error: ``FAILED`` at once (for retry).
* ``web.unknown(order_id)``: an effect whose call raises ``OutcomeUnknownError`` and has no
  lookup: the task goes ``UNKNOWN`` (for resolve).
* ``web.poison()``: the same error every time; quarantined after 2 failures in a row (for
  replay).
* ``web.pinned(text)``: versions 1 and 2 (for an Idempotency-Key replay pinning another).
* ``web.await(order_id)``: waits for the event ``shipped`` of its order and returns its
  payload (``WAITING`` until then; for ``POST /api/events``).
* ``web.fanout(n)``: submits ``n`` ``web.await`` children (orders ``f-0`` ...) and
  gathers them (a parent with a children tree).
"""

from __future__ import annotations

from typing import Any

from ratchet import App, OutcomeUnknownError, PermanentError, RetryPolicy, TaskContext
from ratchet.testing import fast_retry_policy

__all__ = ["app", "make_app"]

POISON_POLICY = fast_retry_policy(max_attempts=10, base_delay_s=0.01, max_delay_s=0.05,
                                  quarantine_after=2)


def make_app(ledger_url: str | None = None) -> App:
    """A fresh App with the test tasks, on ``ledger_url`` (None: ``RATCHET_LEDGER_URL``)."""
    app = App(ledger_url) if ledger_url is not None else App()

    @app.task(name="web.echo")
    def echo(ctx: TaskContext, text: str) -> dict[str, Any]:
        return ctx.step("echo", lambda: {"echo": text})

    @app.task(name="web.fail", retry=RetryPolicy(max_attempts=1))
    def fail(ctx: TaskContext) -> None:
        raise PermanentError("web.fail always fails")

    @app.task(name="web.unknown")
    def unknown(ctx: TaskContext, order_id: str) -> Any:
        def call(key: str) -> Any:
            raise OutcomeUnknownError(f"the reply for {key} was lost")

        return ctx.effect("send", call, key=f"send:{order_id}")

    @app.task(name="web.poison", retry=POISON_POLICY)
    def poison(ctx: TaskContext) -> None:
        raise RuntimeError("poisoned input")

    @app.task(name="web.await")
    def await_event(ctx: TaskContext, order_id: str) -> Any:
        return ctx.wait_for_event("shipped", key=order_id)

    @app.task(name="web.fanout")
    def fanout(ctx: TaskContext, n: int) -> list[Any]:
        handles = ctx.submit_many("web.await", [{"order_id": f"f-{i}"} for i in range(n)])
        return ctx.gather(handles)

    for version in (1, 2):
        @app.task(name="web.pinned", version=version)
        def pinned(ctx: TaskContext, text: str) -> str:
            return text

    return app


app = make_app()
