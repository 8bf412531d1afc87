"""Registered lookups: how to ask an effect's target whether a key executed, outside a task.

``ctx.effect(name, call, key=, lookup=)`` takes its lookup as a closure at run time, which
nothing outside the running task can call. ``ratchet reconcile`` (DESIGN §5,
reconciliation) needs the same question asked later, from an operator's process, so an
application registers its lookups by task type and effect name::

    @app.lookup("billing.charge", "charge")
    def charge_lookup(key: str) -> dict | NotFound:      # the result, or ratchet.NOT_FOUND
        return payments.lookup(key)

    @app.lookup("billing.charge_fenced", "charge", fenced=True)
    def fenced_lookup(key: str, token: int) -> dict | NotFound:
        return payments.lookup(key, token)

A worker uses the registered lookup of an effect when ``ctx.effect`` is given none (same
``fenced``; its ``in_flight_s`` when the effect gives none), so one registration serves
both; ``worker=False`` registers one for reconciliation only. Effect occurrences are
stored as ``name`` and ``name#N``; all occurrences of ``name`` share its lookup.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, InvalidArguments
from .validation import MAX_NAME_BYTES, check_checkpoint_name, check_finite, check_identifier

__all__ = ["RegisteredLookup", "effect_base_name", "make_lookup"]

_OCCURRENCE = re.compile(r"#[0-9]+$")


def effect_base_name(stored_name: str) -> str:
    """The effect name of a stored occurrence: ``"charge#3"`` → ``"charge"``, ``"charge"``
    → ``"charge"`` (DESIGN §5, occurrences)."""
    return _OCCURRENCE.sub("", stored_name)


@dataclass(frozen=True, slots=True)
class RegisteredLookup:
    """A lookup registered with :meth:`ratchet.App.lookup`.

    Attributes:
        task_type: the task name whose effects it answers for.
        effect: the effect name (without ``#N``).
        fn: ``fn(key) -> result | NOT_FOUND``, or ``fn(key, token)`` when ``fenced``;
            raising means "inconclusive".
        fenced: the target checks fencing tokens: ``fn`` gets a token as its second
            argument (reconcile passes the task's current generation, so the lookup fences
            out every older holder; a worker passes its claim's generation).
        in_flight_s: how long a request can stay in flight at the target, seconds (None:
            the target answers lookups for in-flight requests). A ``NOT_FOUND`` proves
            absence only once that long has passed since the intent was recorded.
        worker: a worker uses it for a ``ctx.effect`` given no ``lookup`` (False: for
            reconciliation only, e.g. a lookup against a reporting copy that lags, whose
            "not found" a worker must not act on, or an effect meant to go ``UNKNOWN``).
    """

    task_type: str
    effect: str
    fn: Callable[..., Any]
    fenced: bool = False
    in_flight_s: float | None = None
    worker: bool = True

    def ask(self, key: str, token: int) -> Any:
        """Call the lookup (with ``token`` when fenced). Raises what ``fn`` raises."""
        return self.fn(key, token) if self.fenced else self.fn(key)


def make_lookup(task_type: object, effect: object, fn: object, fenced: object,
                in_flight_s: object, worker: object = True) -> RegisteredLookup:
    """A checked :class:`RegisteredLookup`.

    Raises:
        InvalidArguments: the task type or effect name cannot be stored (an effect name
            ending in ``#<digits>`` included).
        ConfigError: ``fn`` is not callable with one (two when ``fenced``) positional
            argument(s), ``fenced`` is not a bool, ``in_flight_s`` is not None or a finite
            number of seconds >= 0.
    """
    name = check_identifier(task_type, "task type", MAX_NAME_BYTES)
    eff = check_checkpoint_name(effect, "effect name")
    for label, flag in (("fenced", fenced), ("worker", worker)):
        if not isinstance(flag, bool):
            raise ConfigError(f"{label} must be True or False, got {flag!r}")
    in_flight: float | None = None
    if in_flight_s is not None:
        try:
            in_flight = check_finite(in_flight_s, "in_flight_s", minimum=0.0)
        except InvalidArguments:
            raise ConfigError(f"in_flight_s must be a finite number of seconds >= 0 or None, "
                              f"got {in_flight_s!r}") from None
    shape = "lookup(key, token)" if fenced else "lookup(key)"
    if not callable(fn):
        raise ConfigError(f"lookup for {name!r} effect {eff!r} must be callable as {shape}, "
                          f"got {fn!r}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None  # a builtin without a readable signature: trusted
    if signature is not None:
        try:
            signature.bind(*range(2 if fenced else 1))
        except TypeError as exc:
            raise ConfigError(
                f"lookup for {name!r} effect {eff!r} is called as {shape}, but "
                f"{getattr(fn, '__qualname__', fn)!r} cannot take that ({exc})"
                + ("; fenced=True passes the fencing token as the second argument"
                   if fenced else "")) from None
    return RegisteredLookup(name, eff, fn, bool(fenced),
                            in_flight, bool(worker))
