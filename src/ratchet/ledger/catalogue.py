"""The SQL catalogue of a dialect: named statements read from ``ledger/sql/<dialect>.sql``
and the files of its concerns, ``ledger/sql/<dialect>.<concern>.sql`` (the outbox's).

A catalogue file is a sequence of blocks, each introduced by a ``-- name: NAME`` line (the
format of procrastinate's ``sql/queries.sql``). The engine refers to statements only by
name; every dialect's file names the same statements (``tests/test_ledger_catalogue.py``
checks it). Comment lines are kept out of the statement text. A block may hold several
statements, each ending with ``;`` at the end of a line; they are returned as a tuple.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["Catalogue", "load_catalogue"]

Catalogue = dict[str, tuple[str, ...]]
"""``{statement name: (sql text, ...)}`` — usually one statement per name."""

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$")


@functools.cache
def load_catalogue(dialect: str) -> Catalogue:
    """The named statements of ``dialect`` (``"sqlite"`` or ``"postgresql"``), read once.

    Raises:
        RuntimeError: the files name a statement twice or one holds text before its first
            name (a packaging bug).
    """
    folder = resources.files(__package__).joinpath("sql")
    files = sorted(f.name for f in folder.iterdir()
                   if f.name == f"{dialect}.sql"
                   or (f.name.startswith(f"{dialect}.") and f.name.endswith(".sql")))
    # One text: a name defined in two files is refused like one defined twice in a file.
    text = "\n".join(folder.joinpath(name).read_text("utf-8") for name in files)
    return parse_catalogue(text)


def parse_catalogue(text: str) -> Catalogue:
    """Parse catalogue text (see the module docstring) into ``{name: statements}``.

    Raises:
        RuntimeError: a name is defined twice, or SQL appears before the first name.
    """
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line.strip())
        if match:
            name = match.group(1)
            if name in blocks:
                raise RuntimeError(f"SQL catalogue names {name!r} twice")
            current = blocks[name] = []
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        if current is None:
            raise RuntimeError(f"SQL catalogue has text before the first name: {line!r}")
        current.append(line.rstrip())
    out: Catalogue = {}
    for name, lines in blocks.items():
        statements: list[str] = []
        buffer: list[str] = []
        for line in lines:
            buffer.append(line)
            if line.endswith(";"):
                statements.append("\n".join(buffer).rstrip(";").strip())
                buffer = []
        if buffer:
            statements.append("\n".join(buffer).strip())
        out[name] = tuple(statements)
    return out
