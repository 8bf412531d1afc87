"""JSON encoding of user data and params digests. Ratchet never pickles user data.

Limits (both directions raise a Ratchet error, never ``RecursionError`` or a
``json.JSONDecodeError``):

* :data:`MAX_JSON_DEPTH` — values nested deeper than this (lists and dicts inside each
  other) are refused by :func:`dumps` with :class:`~ratchet.errors.PayloadNotSerializable`.
  Python's own JSON codec recurses once per level and gives up near the interpreter's
  recursion limit (1,000 frames, minus the caller's stack), so the limit sits well below
  it: anything :func:`dumps` accepts, :func:`loads` decodes again in any thread.
* :func:`loads` of text that is not JSON (a corrupted row, invalid UTF-8 read back as an
  :class:`~ratchet.storedtext.UndecodableText` or as surrogate escapes, or nesting past
  the recursion limit) raises
  :class:`~ratchet.errors.UndecodableData`; :func:`loads_stored` returns an
  :class:`Undecodable` marker instead, for code that shows stored data (``ratchet inspect``).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Final

from .errors import PayloadNotSerializable, UndecodableData
from .storedtext import UndecodableText

__all__ = [
    "MAX_JSON_DEPTH",
    "Undecodable",
    "digest",
    "dumps",
    "dumps_rows",
    "loads",
    "loads_stored",
    "printable",
]

MAX_JSON_DEPTH = 200
"""Deepest nesting of lists/dicts :func:`dumps` accepts (a scalar is depth 0)."""


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
"""The canonical encoder, built once (``json.dumps`` with options builds one per call)."""

_FLAT_ENCODE: Callable[[Any, int], Any] | None = (
    None if c_make_encoder is None else c_make_encoder(
        None, _ENCODER.default, encode_basestring_ascii, None, ":", ",", True, False, False
    )
)
"""The C encoder of :data:`_ENCODER`'s canonical form, built once, without cycle tracking
(``markers=None``): used only for a list, tuple or dict whose items are all scalars (so it
cannot hold a cycle, nor anything nested). ``JSONEncoder.encode`` builds one per call.
Immutable, so threads share it. ``None`` where the C accelerator is missing."""

_SCALARS: Final = frozenset({str, int, float, bool, type(None)})
"""Exact types a flat container may hold for :data:`_FLAT_ENCODE` (subclasses take the
general path)."""

_CONSTANTS: Final[dict[str, Any]] = {"null": None, "true": True, "false": False}
"""Texts :func:`loads` answers without the JSON decoder (what :func:`dumps` writes for
``None``, ``True``, ``False``)."""


def dumps_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """Compact JSON of rows the caller built itself (dicts of ``str`` / ``int`` / ``float``
    / ``bool`` / ``None``, e.g. a ledger batch): no depth or cycle checks, one C encoder
    built once (:data:`_FLAT_ENCODE`).

    Raises:
        ValueError: a NaN or infinite float (no JSON for it).
        TypeError: a value JSON cannot hold.
    """
    if _FLAT_ENCODE is None:  # not CPython's C accelerator
        return _ENCODER.encode(rows)
    return "".join(_FLAT_ENCODE(rows, 0))


def dumps(value: Any, what: str = "value") -> str:
    """Encode ``value`` as compact JSON with sorted keys.

    Args:
        value: plain JSON data: ``str``, ``int``, ``float``, ``bool``, ``None``, and lists,
            tuples and ``str``-keyed dicts of them, at most :data:`MAX_JSON_DEPTH` deep.
        what: how to name the value in the error (``"params of task 'x'"``).

    Raises:
        PayloadNotSerializable: ``value`` holds something that is not plain JSON
            (objects, bytes, sets, NaN/Infinity, non-string dict keys, a cycle) or is
            nested deeper than :data:`MAX_JSON_DEPTH`.
    """
    # Fast paths (the same text as the general path below): scalars, and flat containers.
    cls = type(value)
    if value is None:
        return "null"
    if cls is str:
        return encode_basestring_ascii(value)
    if cls is bool:
        return "true" if value else "false"
    if cls is int:
        return int.__repr__(value)
    if cls is float and math.isfinite(value):
        return float.__repr__(value)
    if (cls is dict or cls is list or cls is tuple) and value and _FLAT_ENCODE is not None:
        scalars = _SCALARS
        if cls is dict:
            for key, item in value.items():
                if type(key) is not str or type(item) not in scalars:
                    break
            else:
                return _flat(value, what)
        else:
            for item in value:
                if type(item) not in scalars:
                    break
            else:
                return _flat(value, what)
    # The general path: anything nested, empty, subclassed, or not JSON at all.
    if isinstance(value, dict | list | tuple) and value:
        problem = _structure_problem(value, what)
        if problem is not None:
            raise PayloadNotSerializable(problem)
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _not_serialisable(what, exc) from None


def _flat(value: Any, what: str) -> str:
    """Encode a non-empty list, tuple or ``str``-keyed dict of scalars (nothing nested)."""
    assert _FLAT_ENCODE is not None
    try:
        return "".join(_FLAT_ENCODE(value, 0))
    except ValueError as exc:  # NaN / Infinity
        raise _not_serialisable(what, exc) from None


def _not_serialisable(what: str, exc: BaseException) -> PayloadNotSerializable:
    return PayloadNotSerializable(
        f"{what} is not JSON-serialisable: {exc}. Ratchet stores JSON only (never pickle); "
        "pass str/int/float/bool/None and lists/dicts of them with string keys."
    )


def _structure_problem(value: Any, what: str) -> str | None:
    """Why ``value`` cannot be stored (a non-string dict key, too deep), else ``None``.

    Iterative, so it cannot itself overflow the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return (
                f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; "
                "Ratchet refuses deeper JSON (flatten it, or store it elsewhere and pass a "
                "reference)"
            )
        if id(item) in seen:
            continue  # shared or circular: json.dumps reports a cycle
        seen.add(id(item))
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return (
                        f"{what} has a non-string dict key {key!r}; JSON keys are strings, and "
                        "Ratchet refuses to convert them silently (it would change the params "
                        "digest)"
                    )
                if isinstance(sub, dict | list | tuple):
                    stack.append((sub, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((x, depth + 1) for x in item if isinstance(x, dict | list | tuple))
    return None


def loads(text: str | None, what: str = "value") -> Any:
    """Decode JSON produced by :func:`dumps` (``None`` stays ``None``).

    Args:
        text: the JSON text.
        what: how to name the value in the error (``"params"``, ``"step 'quote'"``).

    Raises:
        UndecodableData: ``text`` is not valid JSON, holds characters that are not valid
            Unicode (surrogate escapes of invalid UTF-8), or is nested too deep to decode.
            The message names ``what`` and the problem, never the text itself.
    """
    if text is None:
        return None
    if type(text) is str and len(text) <= 5:  # what dumps writes for None, True, False, {}
        if text in _CONSTANTS:
            return _CONSTANTS[text]
        if text == "{}":
            return {}
    if type(text) is not str and isinstance(text, UndecodableText):
        raise UndecodableData(
            f"{what} is not valid UTF-8 text (byte {text.bad_offset} of the stored value)")
    if not text.isascii():  # O(1) for ASCII text; else find lone surrogates before decoding
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise UndecodableData(
                f"{what} is not valid UTF-8 text (character {exc.start})"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UndecodableData(
            f"{what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise UndecodableData(
            f"{what} is nested too deeply to decode (Ratchet writes at most "
            f"{MAX_JSON_DEPTH} levels)"
        ) from None
    except (TypeError, ValueError) as exc:
        raise UndecodableData(f"{what} cannot be decoded: {type(exc).__name__}") from None


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored value that could not be decoded, kept as text for people to look at.

    Attributes:
        text: the stored text, printable: bytes that are not valid UTF-8 as ``\\xNN``
            escapes (as SQLite reads them), lone surrogates as ``\\udcXX`` escapes.
        error: why it could not be decoded (no part of the text).
        undecodable: always ``True``; marks the record in JSON output
            (``dataclasses.asdict``).
    """

    text: str
    error: str
    undecodable: bool = True


def printable(text: str) -> str:
    """``text`` with lone surrogates (invalid UTF-8 read back with surrogate escapes)
    written as ``\\udcXX`` escapes and NUL as ``\\x00``, so it can be encoded as UTF-8,
    printed, and stored in a PostgreSQL ``text`` column (which cannot hold NUL). An
    :class:`~ratchet.storedtext.UndecodableText` without NUL is returned as it is (already
    escaped, and still marked)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    elif isinstance(text, UndecodableText):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def loads_stored(text: str | None, what: str = "value") -> Any:
    """:func:`loads`, but an undecodable value becomes an :class:`Undecodable` marker instead
    of an error (for showing stored data; never for running a task with it)."""
    try:
        return loads(text, what)
    except UndecodableData as exc:
        assert text is not None
        return Undecodable(str(printable(text)), str(exc))


def digest(*parts: str) -> str:
    """SHA-256 hex digest (first 32 hex chars) over the given canonical strings."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return "sha256:" + h.hexdigest()[:32]
