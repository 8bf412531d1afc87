"""Checks for the identifiers that enter the ledger: task names, idempotency keys, step and
effect names, effect keys.

Every such value is stored in an indexed ``text`` column on both ledgers, so it must be
text both dialects can store and index: valid Unicode without lone surrogates (SQLite and
PostgreSQL store UTF-8), no NUL character (PostgreSQL ``text`` cannot hold one), and short
enough for a B-tree index entry (PostgreSQL refuses an entry over about 2,700 bytes; the
limits below leave room for the other columns of composite keys). The checks run where the
value enters (``@app.task``, ``submit``, ``ctx.step``, ``ctx.effect``), so a bad value is
the caller's error there and never a failed ledger write later.
"""

from __future__ import annotations

import math
import re

from .errors import InvalidArguments

__all__ = [
    "RESERVED_PREFIX",
    "MAX_DELAY_S",
    "MAX_DURATION_S",
    "MAX_KEY_BYTES",
    "MAX_NAME_BYTES",
    "check_checkpoint_name",
    "check_finite",
    "check_int",
    "check_identifier",
    "check_queue_name",
    "duration_text",
    "parse_duration_s",
    "parse_rate_per_s",
]

MAX_NAME_BYTES = 200
"""Upper bound, in UTF-8 bytes, of a task, step or effect name."""

MAX_KEY_BYTES = 1024
"""Upper bound, in UTF-8 bytes, of an idempotency key or effect key."""


def check_queue_name(value: object, error: type[Exception] | None = None) -> str:
    """Return ``value`` if it can name a queue: an identifier (:func:`check_identifier`)
    without a comma or surrounding whitespace, since ``ratchet worker --queues a,b``
    splits on commas and strips spaces: such a queue could never be served by name.

    Raises:
        InvalidArguments (or ``error``): anything else.
    """
    try:
        name = check_identifier(value, "queue name", MAX_NAME_BYTES)
        if "," in name or name != name.strip():
            raise InvalidArguments(
                f"queue name {name!r} may not hold a comma or start or end with whitespace "
                "(ratchet worker --queues could not name it)")
    except InvalidArguments as exc:
        if error is None:
            raise
        raise error(str(exc)) from None
    return name


def check_identifier(value: object, what: str, max_bytes: int) -> str:
    """Return ``value`` if it can be stored and indexed as an identifier, else raise.

    Args:
        value: the candidate; must be a non-empty ``str``.
        what: how to name it in the error (e.g. ``"task name"``, ``"step name"``).
        max_bytes: the limit in UTF-8 bytes (:data:`MAX_NAME_BYTES` or :data:`MAX_KEY_BYTES`).

    Raises:
        InvalidArguments: not a string, empty, not encodable as UTF-8 (a lone surrogate
            such as ``"\\ud800"``), containing NUL, or longer than ``max_bytes``.
    """
    if not isinstance(value, str):
        raise InvalidArguments(f"{what} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidArguments(f"{what} must not be empty")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArguments(
            f"{what} is not valid Unicode text (character {exc.start}: a lone surrogate "
            f"{value[exc.start]!r} cannot be stored)"
        ) from None
    if "\x00" in value:
        raise InvalidArguments(f"{what} contains a NUL character (position {value.index(chr(0))})")
    if len(encoded) > max_bytes:
        raise InvalidArguments(
            f"{what} is {len(encoded)} bytes in UTF-8, over the limit of {max_bytes}"
            " (use a shorter name, or a hash of a long key)"
        )
    return value


_OCCURRENCE_SUFFIX = re.compile(r"#[0-9]+\Z")


RESERVED_PREFIX = "ratchet:"
"""Checkpoint names starting with this are Ratchet's own (``ratchet:batches:<name>``,
``ratchet:compensating``): a step, effect or wait name may not."""


def check_checkpoint_name(value: object, what: str) -> str:
    """:func:`check_identifier` for a step or effect name, which also may not end in
    ``#<digits>``: the ledger stores the N-th call of a name as ``name#N`` (DESIGN §5,
    occurrences), so such a name would collide with another checkpoint.

    Raises:
        InvalidArguments: as :func:`check_identifier` (limit :data:`MAX_NAME_BYTES`), the
            name ends in ``#<digits>``, or it starts with :data:`RESERVED_PREFIX`.
    """
    name = check_identifier(value, what, MAX_NAME_BYTES)
    if name.startswith(RESERVED_PREFIX):
        raise InvalidArguments(
            f"{what} {name!r} starts with {RESERVED_PREFIX!r}, which is reserved for the "
            "checkpoints Ratchet records itself (batch runs, compensation markers); choose "
            "another name")
    if _OCCURRENCE_SUFFIX.search(name):
        raise InvalidArguments(
            f"{what} {name!r} ends in '#<digits>', which is reserved for occurrences (the "
            "N-th call of a name is stored as 'name#N'); choose another name"
        )
    return name


_DURATION = re.compile(
    r"\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)\s*(s|m|h|d)?\s*\Z")
_UNIT_S = {None: 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

MAX_DURATION_S = 100 * 365 * 86400.0
"""The longest duration :func:`parse_duration_s` accepts by default, seconds (100 years):
an age or window past it means nothing on a ledger's clock (and ``now - age`` would
reach before the epoch)."""


def duration_text(seconds: float) -> str:
    """``seconds`` in the largest unit that divides it, as the options take it (``1d``,
    ``90m``, ``0.1s``), followed by `` (N s)`` when that unit is not seconds."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit} ({seconds:.0f} s)"
    return f"{seconds:g}s"


def parse_duration_s(text: str, what: str, *, unit_required: bool = False,
                     minimum_s: float = 0.0, maximum_s: float = MAX_DURATION_S,
                     above_zero: bool = False) -> float:
    """``"90"``, ``"90s"``, ``"5m"``, ``"1.5h"``, ``"7d"``, ``"1e3s"`` as seconds (a float
    from ``minimum_s`` to ``maximum_s``); ``m`` is minutes.

    Args:
        text: the option's value.
        what: the option, for errors (e.g. ``"--older-than"``).
        unit_required: refuse a bare number other than 0 (for destructive options such as
            ``prune --older-than``, where ``30`` meant as days would delete nearly
            everything).
        minimum_s: the lower bound, seconds (inclusive; default 0).
        maximum_s: the upper bound, seconds (inclusive; default :data:`MAX_DURATION_S`).
        above_zero: refuse 0 as well (a window, an interval).

    Raises:
        InvalidArguments: not a duration ("must be a duration like ..."), or one out of
            range ("must be at most 1d (86400 s), got 2d"), named by ``what``.
    """
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidArguments(
            f"{what} must be a duration like 90s, 5m, 1.5h or 7d"
            f"{'' if unit_required else ' (seconds if no unit)'}, got {text!r}")
    if unit_required and match.group(2) is None and float(match.group(1)) != 0:
        raise InvalidArguments(
            f"{what} needs a unit: {text.strip()}s, {text.strip()}m (minutes), "
            f"{text.strip()}h or {text.strip()}d, got {text!r} (a bare number is refused here "
            "because it deletes)")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]  # inf for 1e999: too long
    shown = text.strip() if len(text.strip()) <= 40 else text.strip()[:40] + "..."
    if seconds > maximum_s:
        raise InvalidArguments(
            f"{what} must be at most {duration_text(maximum_s)}, got {shown}")
    if above_zero and seconds <= 0:
        raise InvalidArguments(f"{what} must be above 0, got {shown}")
    if seconds < minimum_s:
        raise InvalidArguments(
            f"{what} must be at least {duration_text(minimum_s)}, got {shown}")
    return seconds


_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:/\s*(s|m|h))?\s*\Z")
MAX_VERSION = 2**31 - 1
"""Largest definition version (the ledger stores a 32-bit integer)."""

MAX_DELAY_S = 1e9
"""The longest delay of a submit the CLI and the HTTP API accept, seconds (about 31 years)."""

MAX_RATE_PER_S = 100_000.0
"""Largest replay rate accepted, tasks per second."""


MIN_RATE_PER_S = 1.0 / 3600.0
"""Smallest admission rate (one task per hour): a slower one would schedule tasks so far
ahead (``n / rate`` seconds) that they look lost, and ``1 / rate`` overflows near 0."""


def check_rate_per_s(rate: object, what: str) -> float:
    """``rate`` as tasks per second, a finite number from :data:`MIN_RATE_PER_S` to
    :data:`MAX_RATE_PER_S` (resume and quarantine replay admit tasks at it).

    Raises:
        InvalidArguments: a bool, not a number, NaN/inf, or out of range (named by
            ``what``).
    """
    value = math.nan
    if not isinstance(rate, bool) and isinstance(rate, int | float):
        try:
            value = float(rate)
        except OverflowError:  # an int beyond any float
            value = math.inf
    if not (math.isfinite(value) and MIN_RATE_PER_S <= value <= MAX_RATE_PER_S):
        shown = repr(rate) if len(repr(rate)) <= 40 else repr(rate)[:40] + "..."
        raise InvalidArguments(
            f"{what} must be a number of tasks per second from {MIN_RATE_PER_S:.6g} (one an "
            f"hour) to {MAX_RATE_PER_S:g}, got {shown}")
    return value


def parse_rate_per_s(text: str, what: str) -> float:
    """``"5/s"``, ``"300/m"``, ``"1000/h"`` or ``"5"`` (per second) as tasks per second,
    a finite number above 0 and at most :data:`MAX_RATE_PER_S`.

    Raises:
        InvalidArguments: anything else (named by ``what``, e.g. ``"--rate"``).
    """
    match = _RATE.match(text) if isinstance(text, str) else None
    rate = (float(match.group(1)) / _UNIT_S[match.group(2) or "s"]) if match else 0.0
    if match is None or not MIN_RATE_PER_S <= rate <= MAX_RATE_PER_S:
        raise InvalidArguments(
            f"{what} must be a rate like 5/s, 300/m or 1000/h (per second if no unit), from "
            f"1/h to {MAX_RATE_PER_S:g}/s, got {text!r}")
    return rate


def _shown(value: object) -> str:
    """``repr(value)``, cut to 40 characters (an int of 10,000 digits has no repr at all:
    Python refuses to convert one over 4,300 digits to text)."""
    try:
        text = repr(value)
    except ValueError:
        return f"an {type(value).__name__} too long to show"
    return text if len(text) <= 40 else text[:40] + "..."


def check_int(value: object, what: str, *, minimum: int | None = None,
              maximum: int | None = None, error: type[Exception] = InvalidArguments) -> int:
    """``value`` if it is an ``int`` (not a bool) within ``[minimum, maximum]`` where given.

    A bool is refused although it is an ``int`` subclass: ``True == 1``, so ``limit=True``
    would pass as 1 and hide a mistake (a flag passed where a count was meant).

    Args:
        value: the candidate.
        what: how to name it in the error (e.g. ``"limit"``, ``"Worker concurrency"``).
        minimum, maximum: the bounds (inclusive); None for no bound on that side.
        error: the exception class to raise, called with the message (the caller's contract:
            ``InvalidArguments`` for a call's argument, ``ConfigError`` for a configuration
            value, ``ValueError`` outside Ratchet's errors).

    Raises:
        error: not an int, a bool, or out of range, with the message
            ``"{what} must be an integer from A to B, got V"`` (``">= A"`` / ``"<= B"``
            with one bound, nothing more with none).
    """
    if (isinstance(value, int) and not isinstance(value, bool)
            and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)):
        return value
    if minimum is not None and maximum is not None:
        bounds = f" from {minimum} to {maximum}"
    elif minimum is not None:
        bounds = f" >= {minimum}"
    elif maximum is not None:
        bounds = f" <= {maximum}"
    else:
        bounds = ""
    raise error(f"{what} must be an integer{bounds}, got {_shown(value)}")


def check_finite(value: object, what: str, *, minimum: float | None = None,
                 maximum: float | None = None, above_minimum: bool = False,
                 error: type[Exception] = InvalidArguments) -> float:
    """``value`` as a float: an int or float (not a bool), finite, and within
    ``[minimum, maximum]`` where given (above ``minimum`` when ``above_minimum``, for a
    rate or a timeout that cannot be 0).

    Raises:
        error: (default :class:`~ratchet.errors.InvalidArguments`) anything else, with the
            message ``"{what} must be a finite number >= A and <= B, got V"`` (``"> A"``
            when ``above_minimum``).
    """
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
    low_ok = minimum is None or number > minimum or (number == minimum and not above_minimum)
    if not math.isfinite(number) or not low_ok or (maximum is not None and number > maximum):
        low = "" if minimum is None else f" {'>' if above_minimum else '>='} {minimum:g}"
        high = "" if maximum is None else f"{' and' if low else ''} <= {maximum:g}"
        raise error(f"{what} must be a finite number{low}{high}, got {_shown(value)}")
    return number


# Bounds of the worker's options (here, in the core, so that every face checks the same
# numbers as Worker does without importing the worker).

MAX_CONCURRENCY = 1024
"""Most task threads one worker process runs (``concurrency``). Each is an OS thread with
its stack, and all share one interpreter lock: past a few hundred, more threads add
contention, not throughput; run more processes instead."""

MAX_ASYNC_CONCURRENCY = 10_000
"""Most ``async def`` task bodies one worker process runs at once on its event loop
(``async_concurrency``): each holds a coroutine and its task context, no thread."""

MAX_PREFETCH = 1024
"""Most tasks one worker holds claimed beyond ``concurrency`` (``prefetch``). A prefetched
task is leased and renewed but not running, and no other worker can take it: past the
default's 32 the claim and completion batches stop growing (see
:func:`ratchet.worker.default_prefetch`) while more work sits hidden in one process."""

MAX_WRITERS = 32
"""Most writer threads (``writers``): each holds a ledger connection and runs transactions
of its own; more than the database has cores only queues."""

MAX_STUCK_THREADS = 4 * MAX_CONCURRENCY
"""Largest ``max_stuck_threads``: every stuck thread stays in the process until it returns
(stack, sockets, memory), so a larger cap is no cap."""

MAX_POLL_INTERVAL_S = 60.0
"""Longest ``poll_interval_s`` (seconds): an idle worker on SQLite (no NOTIFY) finds new
work only when it polls."""
