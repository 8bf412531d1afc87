"""Structured worker logs: ``ratchet worker --log-format json`` (DESIGN §9).

* :class:`JsonFormatter`: one JSON object per line with ``ts`` (UTC, ISO 8601, ms),
  ``level``, ``logger``, ``message`` and the correlation fields known where the line was
  logged: ``task_id``, ``type``, ``generation``, ``attempt``, ``max_attempts``,
  ``version``, ``holder``, ``effect`` and ``key`` (inside an effect), ``trace_id`` /
  ``span_id`` (when a span is current, :mod:`ratchet.observe.tracing`); ``exc`` holds a
  traceback. Fields come from the record (``logging``'s ``extra=``) first, then from the
  task thread's current attempt (a context variable set by :class:`AttemptLog`), so a
  task's own ``logging`` calls carry them too.
* :class:`AttemptLog`: worker middleware logging exactly one line per attempt outcome on
  the ``ratchet.attempt`` logger (success included): ``event`` ``"attempt"``,
  ``outcome`` (the state written, or ``stale`` / ``lease_lost`` / ``abandoned``),
  ``duration_s`` (seconds from ``before_attempt`` to the outcome, final write included)
  and ``error`` (the last line of what the body raised). INFO for ``SUCCEEDED``, WARNING
  for a retry or a release, ERROR otherwise.
* :func:`setup_logging`: the worker's root handler on stderr, text or JSON; the HTTP
  clients' per-request INFO lines (httpx, httpcore) are off unless the level is DEBUG.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import sys
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..errortext import error_message, error_summary
from ..worker.hooks import ContextLike, EffectSettlement, Middleware, WorkerLike
from . import tracing

if TYPE_CHECKING:
    from ..ledger.base import Claim

__all__ = ["CHATTY_LOGGERS", "CORRELATION_FIELDS", "AttemptLog", "JsonFormatter",
           "LogFormat", "setup_logging"]

LogFormat = Literal["text", "json"]

CORRELATION_FIELDS = ("task_id", "type", "generation", "attempt", "max_attempts", "version",
                      "holder", "effect", "key", "outcome", "duration_s", "error", "event",
                      "trace_id", "span_id")
"""Record attributes (``extra=``) the JSON formatter copies, in this order."""

CHATTY_LOGGERS = ("httpx", "httpcore")
"""Libraries that log every request at INFO: the task's chatter, not the worker's; set to
WARNING unless the worker logs at DEBUG."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"

_current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "ratchet_log_fields", default=None)
"""The correlation fields of the attempt running in this thread (set by AttemptLog)."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring for the keys).
    Values that are not JSON are written as their ``str``; never raises on odd input.

    Args:
        ascii_only: escape every non-ASCII character (``\\u00e9``), for a stream that
            is not UTF-8 (its error handler would write ``\\xe9``: not JSON).
    """

    def __init__(self, ascii_only: bool = False) -> None:
        super().__init__()
        self.ascii_only = ascii_only

    def format(self, record: logging.LogRecord) -> str:
        """The record as one JSON object (no newline inside: messages are escaped)."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": _message(record),
        }
        ambient = _current.get()
        if ambient is not None:
            out.update(ambient)
        attrs = record.__dict__
        for name in CORRELATION_FIELDS:
            if name in attrs:
                out[name] = attrs[name]
        if "trace_id" not in out:
            ids = tracing.current_ids()
            if ids is not None:
                out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = record.stack_info
        try:
            return json.dumps(out, default=str, ensure_ascii=self.ascii_only,
                              allow_nan=False)
        except (TypeError, ValueError):  # non-str keys, a cycle, NaN: written as text
            return json.dumps({k: _plain(v) for k, v in out.items()},
                              ensure_ascii=self.ascii_only)


def _message(record: logging.LogRecord) -> str:
    """The record's message; a format string its arguments do not fit is kept as text."""
    try:
        return record.getMessage()
    except Exception as exc:
        return (f"{record.msg!s} (log arguments {record.args!r} do not fit the format: "
                f"{type(exc).__name__}: {exc})")


def _plain(value: Any) -> Any:
    """``value`` if it is a JSON scalar (a finite float), else its ``str``."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return str(value)


def setup_logging(level: str, fmt: LogFormat = "text") -> None:
    """Configure the root logger for a worker process: one stderr handler, ``fmt``
    ``"text"`` (the classic line: time, level, logger, pid, message) or ``"json"``
    (:class:`JsonFormatter`, ASCII-only when stderr is not UTF-8); :data:`CHATTY_LOGGERS`
    to WARNING unless ``level`` is DEBUG.

    Args:
        level: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.
        fmt: the line format.

    Raises:
        ValueError: an unknown ``fmt`` or ``level``.
    """
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    encoding = (getattr(sys.stderr, "encoding", None) or "").lower().replace("_", "-")
    handler.setFormatter(JsonFormatter(ascii_only=encoding not in ("utf-8", "utf8"))
                         if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])
    if level != "DEBUG":
        for chatty in CHATTY_LOGGERS:
            logging.getLogger(chatty).setLevel(logging.WARNING)


def _fields(worker: WorkerLike, claim: Claim) -> dict[str, Any]:
    return {"task_id": claim.task_id, "type": claim.name, "generation": claim.generation,
            "attempt": claim.attempt, "max_attempts": claim.max_attempts,
            "version": claim.version, "holder": worker.holder}


_LEVELS = {"SUCCEEDED": logging.INFO, "RETRY_WAIT": logging.WARNING,
           "PENDING": logging.WARNING}


class AttemptLog(Middleware):
    """Worker middleware: one log line per attempt outcome, and the attempt's correlation
    fields for every line logged in its task thread while it runs (see the module
    docstring). Install it after :class:`~ratchet.observe.tracing.TracingMiddleware`
    (the worker puts that one first) so the outcome line carries the attempt span's ids.

    Args:
        logger: where outcome lines go; default ``ratchet.attempt``.
    """

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("ratchet.attempt")
        self._open: dict[tuple[str, int],
                         tuple[float, dict[str, Any], int, tuple[str, str] | None]] = {}
        self._lock = threading.Lock()

    def before_attempt(self, worker: WorkerLike, claim: Claim) -> None:
        """Start timing the attempt; its fields become this thread's correlation fields."""
        fields = _fields(worker, claim)
        ids = tracing.current_ids()  # the attempt span, current now (it ends elsewhere)
        with self._lock:
            self._open[(claim.task_id, claim.generation)] = (
                time.perf_counter(), fields, threading.get_ident(), ids)
        _current.set(fields)

    def after_attempt(
        self, worker: WorkerLike, claim: Claim, outcome: str, exception: BaseException | None
    ) -> None:
        """Log the outcome line (``event`` ``"attempt"``, ``outcome``, ``duration_s``)."""
        with self._lock:
            opened = self._open.pop((claim.task_id, claim.generation), None)
        if opened is None:  # never started (a prefetched claim released at shutdown)
            fields, duration_s, ids = _fields(worker, claim), 0.0, None
        else:
            t0, fields, thread, ids = opened
            duration_s = time.perf_counter() - t0
            if thread == threading.get_ident():
                _current.set(None)
        level = _LEVELS.get(outcome, logging.ERROR)
        if not self.log.isEnabledFor(level):
            return
        # The type and the first line of the message (not its last line: httpx's
        # raise_for_status() ends its message with a "For more information" line).
        error = error_summary(error_message(exception)) if exception is not None else ""
        self.log.log(
            level, "task %s %s gen=%d attempt %d/%d: %s in %.3f s%s", claim.name,
            claim.task_id, claim.generation, claim.attempt, claim.max_attempts, outcome,
            duration_s, f" ({error})" if error else "",
            extra={**fields, "event": "attempt", "outcome": outcome,
                   "duration_s": round(duration_s, 6), **({"error": error} if error else {}),
                   **({"trace_id": ids[0], "span_id": ids[1]} if ids is not None else {})})

    def before_effect(self, ctx: ContextLike, name: str, key: str) -> None:
        """Lines logged inside the effect also carry ``effect`` and ``key``."""
        fields = _current.get()
        if fields is not None:
            _current.set({**fields, "effect": name, "key": key})

    def after_effect(
        self, ctx: ContextLike, name: str, key: str, settled: EffectSettlement,
        duration_s: float, exception: BaseException | None,
    ) -> None:
        """Back to the attempt's fields."""
        fields = _current.get()
        if fields is not None and "effect" in fields:
            _current.set({k: v for k, v in fields.items() if k not in ("effect", "key")})
