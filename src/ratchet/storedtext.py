"""Stored text that is not valid UTF-8, as a value every part of Ratchet can handle.

A SQLite file can hold bytes that are not UTF-8 in a ``TEXT`` column (or a ``BLOB`` where
text belongs): a damaged file, a hand edit, a foreign writer. The SQLite ledger reads such
a value as an :class:`UndecodableText`: a ``str`` whose characters are the stored bytes
with the invalid ones written as ``\\xNN`` escapes (so it can be encoded, printed, put in
JSON, HTML or a metric label), which remembers the stored bytes (:attr:`stored`) and says
that it is not the stored text itself. Every face that reads the ledger gets this one safe
value; the ones that show text add a note (``ratchet`` commands, the dashboard), and
:func:`ratchet.serde.loads` refuses it as not valid UTF-8 (a task never runs with it).

Written back through the SQLite ledger, it binds its stored bytes (``__conform__``), so
the rollups keyed by a task name (the status counts) keep the value they were read from.
PostgreSQL ``text`` holds only valid UTF-8 (without NUL), so it never produces one.
"""

from __future__ import annotations

import sqlite3
from typing import Any

__all__ = ["NOTE", "UndecodableText", "decode_stored", "is_undecodable"]

NOTE = "not valid UTF-8; shown with \\x escapes for the stored bytes"
"""What faces say next to an :class:`UndecodableText`."""


class UndecodableText(str):
    """Stored bytes that are not valid UTF-8, as printable text (``b"\\xffoo"`` →
    ``"\\\\xffoo"``).

    Equal only to an :class:`UndecodableText` of the same stored bytes (never to a plain
    ``str``, even one spelling the same escapes), and hashed by them, so counts per name
    never merge a damaged name with a real one. Copies and pickles keep the bytes.

    Args:
        stored: the bytes as stored.

    Attributes:
        stored: the bytes as stored.
        undecodable: always ``True``.
    """

    stored: bytes
    undecodable = True

    def __new__(cls, stored: bytes) -> UndecodableText:
        self = super().__new__(cls, stored.decode("utf-8", "backslashreplace"))
        self.stored = stored
        return self

    def __getnewargs__(self) -> tuple[bytes]:  # type: ignore[override]
        return (self.stored,)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, UndecodableText):
            return self.stored == other.stored
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((UndecodableText, self.stored))

    def __repr__(self) -> str:
        return f"UndecodableText({self.stored!r})"

    def __conform__(self, protocol: Any) -> Any:
        """sqlite3 binding: the stored bytes (a statement that writes them where text
        belongs casts them: ``CAST(:name AS TEXT)``)."""
        if protocol is sqlite3.PrepareProtocol:
            return self.stored
        return None

    @property
    def bad_offset(self) -> int:
        """Offset of the first byte that is not valid UTF-8."""
        try:
            self.stored.decode("utf-8")
        except UnicodeDecodeError as exc:
            return exc.start
        return 0


def decode_stored(data: bytes) -> str:
    """Stored bytes → text: a ``str`` when they are valid UTF-8, else an
    :class:`UndecodableText` (never an error)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return UndecodableText(data)


def is_undecodable(value: object) -> bool:
    """Whether ``value`` is stored text that was not valid UTF-8."""
    return isinstance(value, UndecodableText)
