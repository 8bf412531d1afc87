"""JSON encoding of user data and params digests. Ratchet never pickles user data."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import PayloadNotSerializable

__all__ = ["canonical_json", "digest", "dumps", "loads"]


def dumps(value: Any, what: str = "value") -> str:
    """Encode ``value`` as compact JSON with sorted keys.

    Raises:
        PayloadNotSerializable: ``value`` holds something that is not plain JSON
            (objects, bytes, sets, NaN/Infinity, non-string dict keys).
    """
    bad_key = _non_string_key(value) if isinstance(value, dict | list | tuple) else _NONE
    if bad_key is not _NONE:
        raise PayloadNotSerializable(
            f"{what} has a non-string dict key {bad_key!r}; JSON keys are strings, and Ratchet "
            "refuses to convert them silently (it would change the params digest)"
        )
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadNotSerializable(
            f"{what} is not JSON-serialisable: {exc}. Ratchet stores JSON only (never pickle); "
            "pass str/int/float/bool/None and lists/dicts of them with string keys."
        ) from exc


_NONE = object()


def _non_string_key(value: Any) -> object:
    """The first dict key anywhere in ``value`` that is not a ``str``, else ``_NONE``."""
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue  # shared or circular: json.dumps reports a cycle below
        seen.add(id(item))
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return key
                if isinstance(sub, dict | list | tuple):
                    stack.append(sub)
        elif isinstance(item, list | tuple):
            stack.extend(x for x in item if isinstance(x, dict | list | tuple))
    return _NONE


def loads(text: str | None) -> Any:
    """Decode JSON produced by :func:`dumps` (``None`` stays ``None``)."""
    if text is None:
        return None
    return json.loads(text)


def canonical_json(value: Any, what: str = "value") -> str:
    """Canonical JSON (sorted keys, no spaces) used for digests; same as :func:`dumps`."""
    return dumps(value, what)


def digest(*parts: str) -> str:
    """SHA-256 hex digest (first 32 hex chars) over the given canonical strings."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return "sha256:" + h.hexdigest()[:32]
