"""Error fingerprints for quarantine (DESIGN §7, "Poison tasks").

A fingerprint names "the same error": task type + exception class + the exception's
message with its variable parts replaced, hashed to 16 hex digits. Two failures of one task
type with the same class and messages that differ only in ids, numbers or quoted values
("order 123 timed out" / "order 456 timed out") have the same fingerprint.

Normalisation (:func:`normalise`), applied in this order to ``str(exc)`` (at most the first
2,000 characters):

1. quoted values — ``'...'``, ``"..."`` and ```...``` on one line, the opening quote not
   right after a letter or digit (so the apostrophe of "can't" opens nothing) — become
   ``'<q>'``;
2. UUIDs (8-4-4-4-12 hex digits, any case) become ``<uuid>``;
3. hex ids — ``0x`` followed by hex digits, or a run of 8 or more hex digits holding at
   least one digit and one letter (memory addresses, hashes, object ids) — become
   ``<hex>``;
4. numbers (digit runs, with an optional fraction or exponent) become ``<n>``;
5. runs of whitespace become one space; leading and trailing whitespace is dropped.

Words are kept ("connection refused" and "connection reset" differ), so a new kind of
failure starts a new streak. The fingerprint of a worker that died holding the task (lease
expiry, revocation) is :func:`worker_died` of the task type.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["WORKER_DIED_CLASS", "exception_class", "fingerprint", "normalise", "of_exception",
           "worker_died"]

WORKER_DIED_CLASS = "ratchet.WorkerDied"
"""The exception class recorded in the fingerprint of deliveries whose worker died."""

_MAX_MESSAGE = 2000
_QUOTED = re.compile(r"(?<!\w)(?:'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`)")
_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b"
                  r"|\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")


def normalise(message: str) -> str:
    """``message`` with its variable parts replaced (the rules in the module docstring).

    >>> normalise("order 123 timed out after 2.5 s")
    'order <n> timed out after <n> s'
    >>> normalise("no row 'abc' at 0x7f3a2c")
    "no row '<q>' at <hex>"
    """
    text = message[:_MAX_MESSAGE]
    text = _QUOTED.sub("'<q>'", text)
    text = _UUID.sub("<uuid>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text).strip()


def fingerprint(task_type: str, exc_class: str, message: str) -> str:
    """The fingerprint (16 lowercase hex digits) of an error of ``exc_class`` (a qualified
    class name) with ``message`` in a task of type ``task_type``; the message is
    normalised here."""
    text = "\x1f".join((task_type, exc_class, normalise(message)))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def exception_class(exc: BaseException) -> str:
    """The qualified name of ``exc``'s class (``module.QualName``; builtins without module)."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def of_exception(task_type: str, exc: BaseException) -> str:
    """The fingerprint of ``exc`` raised by a task of type ``task_type``."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ is still the same error each time
        message = ""
    return fingerprint(task_type, exception_class(exc), message)


def worker_died(task_type: str) -> str:
    """The fingerprint of a delivery of ``task_type`` whose worker died holding it."""
    return fingerprint(task_type, WORKER_DIED_CLASS, "the worker died holding the task")
