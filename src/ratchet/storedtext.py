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

A state column (``tasks.state``, ``effects.state``) holding a value that is not one of the
states Ratchet writes (invalid UTF-8, a BLOB, or any unknown string such as ``'BOGUS'``,
which PostgreSQL can hold too: its state columns have no CHECK constraint) is read as a
:class:`StoredState`: the value as stored, which no state comparison matches, so the row
is listed and shown (with :data:`STATE_NOTE`) but never claimed or moved.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import CoreSchema

__all__ = ["NOTE", "STATE_NOTE", "StoredState", "UndecodableText", "decode_stored",
           "is_undecodable", "stored_note"]

NOTE = "not valid UTF-8; shown with \\x escapes for the stored bytes"
"""What faces say next to an :class:`UndecodableText`."""


class UndecodableText(str):
    """Stored bytes that are not valid UTF-8, as printable text (``b"\\xffoo"`` →
    ``"\\\\xffoo"``).

    Equal only to an :class:`UndecodableText` of the same stored bytes (never to a plain
    ``str``, even one spelling the same escapes), and hashed by them, so counts per name
    never merge a damaged name with a real one. Copies and pickles keep the bytes.
    ``UndecodableText(stored)`` takes the bytes as stored.

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


STATE_NOTE = "not a known state; shown as stored"
"""What faces say next to a :class:`StoredState`."""


class StoredState(str):
    """A state column's value that is not a known state (``'BOGUS'``, or stored bytes that
    are not valid UTF-8, then with ``\\x`` escapes), carried as stored.

    A ``str`` (prints, encodes and goes into JSON as the stored text) that is never equal
    to a :class:`~ratchet.states.State` or :class:`~ratchet.ledger.EffectState` member:
    every ``state is State.X`` test and ``in TERMINAL`` check is false for it, so no read
    path fails on the row and no worker or operator move takes it for a known state.
    ``value`` is the instance itself (the spelling code uses for an enum member's text).
    ``StoredState(stored)`` takes the column's value as read (``str``,
    :class:`UndecodableText`, or any other value a foreign writer left, shown with
    ``str``).

    Attributes:
        stored: the value as read.
    """

    stored: object

    def __new__(cls, stored: object) -> StoredState:
        self = super().__new__(cls, stored if isinstance(stored, str) else str(stored))
        self.stored = stored
        return self

    def __getnewargs__(self) -> tuple[object]:  # type: ignore[override]
        return (self.stored,)

    @property
    def value(self) -> str:
        """The stored text (this instance, so faces that show it can add the note)."""
        return self

    def __repr__(self) -> str:
        return f"StoredState({self.stored!r})"

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        """Its schema in the API's OpenAPI document (records that carry one, such as
        ``TaskInfo.state``): a string."""
        return handler.generate_schema(str)


def stored_note(value: object) -> str | None:
    """The note a face shows next to ``value``: :data:`NOTE` for an
    :class:`UndecodableText`, :data:`STATE_NOTE` for a :class:`StoredState` (both for one
    whose stored bytes are not valid UTF-8), None for anything else."""
    if isinstance(value, UndecodableText):
        return NOTE
    if isinstance(value, StoredState):
        if isinstance(value.stored, UndecodableText):
            return f"{STATE_NOTE}; {NOTE}"
        return STATE_NOTE
    return None
