"""The tasks the replay tests record and replay, in several definition versions.

``order`` (steps and an effect against the counting service):

* version 1: ``quote`` (step), ``charge`` (effect, key ``charge:<order>``), ``receipt``
  (step); returns all three;
* version 2: the same code (reproduces version 1's histories);
* version 3: ``quote`` renamed ``price`` (diverges at position 0);
* version 4: the effect's key changed to ``pay:<order>`` (diverges at position 1);
* version 5: ``receipt`` moved before ``charge`` (diverges at position 1);
* version 6: returns another result (diverges at the end);
* version 7: renames ``quote`` for orders whose id ends in ``-2`` only (a sample of
  histories where some diverge and some reproduce).

``pipeline`` (fails after step 2 of 3):

* version 1: ``one`` (step), ``two`` (effect), ``three`` (a step whose function raises);
* version 2: ``three`` fixed.

``audit`` raises ``ValueError`` in its body after one step (version 1), and returns
instead in version 2.

The module's ``app`` has no ledger URL: ``ratchet replay --ledger URL`` aims it; the
tests record with :func:`make_app` (its own App on the test's ledger). ``SERVICE_URL`` is
set by the tests before recording; a replay never calls the service.
"""

from __future__ import annotations

from typing import Any

from ratchet import App, RetryPolicy, TaskContext
from ratchet.testing import CountingClient

SERVICE_URL = "http://127.0.0.1:9"
"""The counting service the effects call (set by the tests before recording)."""

ONCE = RetryPolicy(max_attempts=1)


def _charge(key: str, amount: int) -> Any:
    with CountingClient(SERVICE_URL, timeout_s=5.0) as client:
        return client.execute(key, {"amount": amount})["id"]


def _order(ctx: TaskContext, order_id: str, *, quote_name: str = "quote",
           key_prefix: str = "charge", receipt_first: bool = False,
           extra: bool = False) -> Any:
    quote = ctx.step(quote_name, lambda: {"amount": 10 * len(order_id)})
    amount = int(quote["amount"])
    receipt: Any = None
    if receipt_first:
        receipt = ctx.step("receipt", lambda: f"receipt-{order_id}")
    charge = ctx.effect("charge", lambda k: _charge(k, amount), key=f"{key_prefix}:{order_id}",
                        params={"amount": amount})
    if not receipt_first:
        receipt = ctx.step("receipt", lambda: f"receipt-{order_id}")
    result = {"order": order_id, "amount": amount, "charge": charge, "receipt": receipt}
    if extra:
        result["extra"] = True
    return result


def _pipeline(ctx: TaskContext, n: int, fixed: bool) -> Any:
    one = ctx.step("one", lambda: n + 1)
    two = ctx.effect("two", lambda k: _charge(k, one), key=f"two:{n}", params={"amount": one})

    def three() -> int:
        if not fixed:
            raise RuntimeError(f"step three cannot handle {n}")
        return one * 2

    return {"one": one, "two": two, "three": ctx.step("three", three)}


def _audit(ctx: TaskContext, n: int, fixed: bool) -> Any:
    seen = ctx.step("count", lambda: n)
    if seen > 2 and not fixed:
        raise ValueError(f"audit found {seen} entries, at most 2 allowed")
    return {"seen": seen}


def make_app(url: str | None) -> App:
    """An App on ``url`` with every version of ``order``, ``pipeline`` and ``audit``."""
    app = App(url)
    for version, kwargs in ((1, {}), (2, {}), (3, {"quote_name": "price"}),
                            (4, {"key_prefix": "pay"}), (5, {"receipt_first": True}),
                            (6, {"extra": True}), (7, {"quote_name": "-2"})):
        def order(ctx: TaskContext, order_id: str, kw: dict[str, Any] = kwargs) -> Any:
            if kw.get("quote_name") == "-2":
                kw = {"quote_name": "price" if order_id.endswith("-2") else "quote"}
            return _order(ctx, order_id, **kw)

        app.task(name="order", version=version, retry=ONCE)(order)
    for version, fixed in ((1, False), (2, True)):
        def pipeline(ctx: TaskContext, n: int, fixed: bool = fixed) -> Any:
            return _pipeline(ctx, n, fixed)

        def audit(ctx: TaskContext, n: int, fixed: bool = fixed) -> Any:
            return _audit(ctx, n, fixed)

        app.task(name="pipeline", version=version, retry=ONCE)(pipeline)
        app.task(name="audit", version=version, retry=ONCE)(audit)
    return app


app = make_app(None)
