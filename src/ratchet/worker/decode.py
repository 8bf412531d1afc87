"""Decoding values read back from the ledger, so that one undecodable value fails only its
own task (issue 7).

A task's params, a step's stored value and an effect's recorded result come back from the
ledger as JSON text. Text that cannot be decoded — bytes that were not valid UTF-8 (the
ledger hands them over as a ``str`` with surrogate escapes, e.g. ``'{"n":\\udcff}'``),
invalid JSON such as ``{oops``, or JSON nested too deeply for the decoder
(``RecursionError``) — raises :class:`UndecodableValue`. The worker records it as a
permanent failure of that task with ``error_class`` ``"undecodable"`` and runs the next
task; the message names the value (params, step ``'x'``, effect ``'y'`` result) and the
reason, never the stored bytes.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import PermanentError

__all__ = ["UNDECODABLE", "UndecodableValue", "decode_stored"]

UNDECODABLE = "undecodable"
"""``error_class`` recorded for a task failed by :class:`UndecodableValue`."""


class UndecodableValue(PermanentError):
    """A value stored in the ledger cannot be decoded; the task fails permanently.

    Attributes:
        what: which value, e.g. ``"params"``, ``"step 'quote'"``, ``"effect 'charge' result"``.
    """

    def __init__(self, what: str, reason: str) -> None:
        self.what = what
        super().__init__(f"stored {what} cannot be decoded: {reason}")


def decode_stored(text: str | None, what: str) -> Any:
    """Decode JSON text read from the ledger (``None`` stays ``None``).

    Args:
        text: the stored JSON text.
        what: how to name the value in the error (e.g. ``"params"``).

    Raises:
        UndecodableValue: ``text`` holds characters that were not valid UTF-8 (surrogate
            escapes), is not JSON, or nests too deeply to decode.
    """
    if text is None:
        return None
    if not text.isascii() and _has_surrogates(text):
        raise UndecodableValue(what, "not valid UTF-8 text")
    try:
        return json.loads(text)
    except RecursionError:
        raise UndecodableValue(what, "JSON nested too deeply to decode") from None
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise UndecodableValue(
                what, f"invalid JSON ({exc.msg} at character {exc.pos})"
            ) from None
        raise UndecodableValue(what, "invalid JSON") from None


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
