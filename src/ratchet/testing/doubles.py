"""Test doubles for your own suite: a proxy that counts, delays or fails chosen calls of a
ledger (or of any object, e.g. a ledger's dialect), and a retry policy fast enough for tests.

    flaky = LedgerProxy(open_ledger(url), fail={"renew": LedgerUnavailable("cut off")})
    app = App(flaky)            # every other call goes to the real ledger
    ...
    assert flaky.calls["renew"] >= 1
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from ..retry import RetryPolicy

__all__ = ["Failure", "LedgerProxy", "fast_retry_policy"]

Failure = BaseException | Callable[..., BaseException | None]
"""What :class:`LedgerProxy` does instead of (or after) a call: an exception instance, raised
on every call, or a callable given the call's arguments that returns the exception to raise
or None to let the call through."""


class LedgerProxy:
    """Wraps ``inner`` (a :class:`~ratchet.ledger.base.Ledger`, a dialect, any object): every
    attribute is ``inner``'s, and every method call is counted, and optionally delayed,
    failed, or checked after it returned. Thread-safe (the count is taken under a lock).

    Per method name, in this order on each call:

    1. ``calls[name] += 1`` (failed and delayed calls count too);
    2. ``delay_s[name]``: sleep that many seconds before anything else;
    3. ``fail[name]``: an exception instance is raised and ``inner`` is not called; a
       callable ``(*args, **kwargs) -> BaseException | None`` is called with the call's
       arguments (it may record them, or block on a gate) and the exception it returns is
       raised, ``inner`` not called; None lets the call through;
    4. the real call ``inner.name(*args, **kwargs)``;
    5. ``after[name]``: a callable ``(result, *args, **kwargs) -> BaseException | None``
       given the real call's result; an exception it returns is raised *instead of
       returning the result*, after the call took effect (a reply lost after COMMIT).

    ``fail``, ``delay_s`` and ``after`` are plain dicts: a test may change them while the
    proxy is in use (``proxy.fail["commit"] = exc``; ``del proxy.fail["commit"]``).
    Attributes that are not callable are read through unchanged; setting an attribute on
    the proxy sets it on the proxy, not on ``inner``.

    Args:
        inner: the object wrapped.
        fail: method name -> :data:`Failure`.
        delay_s: method name -> seconds to sleep before the call (>= 0).
        after: method name -> check of the result (see step 5).

    Attributes:
        inner: the object wrapped.
        calls: number of calls per method name (a :class:`collections.Counter`).
    """

    def __init__(
        self,
        inner: Any,
        *,
        fail: Mapping[str, Failure] | None = None,
        delay_s: Mapping[str, float] | None = None,
        after: Mapping[str, Callable[..., BaseException | None]] | None = None,
    ) -> None:
        self.inner = inner
        self.fail: dict[str, Failure] = dict(fail or {})
        self.delay_s: dict[str, float] = dict(delay_s or {})
        self.after: dict[str, Callable[..., BaseException | None]] = dict(after or {})
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def proxied(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            delay = self.delay_s.get(name, 0.0)
            if delay > 0:
                time.sleep(delay)
            failure = self.fail.get(name)
            if failure is not None:
                exc = failure if isinstance(failure, BaseException) else failure(*args, **kwargs)
                if exc is not None:
                    raise exc
            result = value(*args, **kwargs)
            check = self.after.get(name)
            if check is not None:
                exc = check(result, *args, **kwargs)
                if exc is not None:
                    raise exc
            return result

        return proxied

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.inner!r} calls={dict(self.calls)}>"


def fast_retry_policy(**overrides: Any) -> RetryPolicy:
    """A :class:`~ratchet.RetryPolicy` for tests: 3 attempts, 0.02 s then 0.04 s backoff (capped
    at 0.1 s), no jitter, so a retried task finishes in well under a second.

    Args:
        overrides: any other :class:`~ratchet.RetryPolicy` field (e.g. ``max_delay_s=0.05``,
            ``quarantine_after=3``).

    Raises:
        ValueError: an override out of range (as :class:`~ratchet.RetryPolicy` raises).
    """
    fields: dict[str, Any] = {
        "max_attempts": 3,
        "base_delay_s": 0.02,
        "max_delay_s": 0.1,
        "jitter": 0.0,
    }
    fields.update(overrides)
    return RetryPolicy(**fields)
