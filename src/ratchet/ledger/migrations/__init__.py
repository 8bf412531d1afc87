"""Versioned schema migrations, one directory per dialect.

File names are ``NNNN_description.sql``; ``NNNN`` is the schema version the file produces.

From :data:`ALIGNED_VERSION` on, a version number names the same schema on both dialects:
each later version is one file with the same name in ``sqlite/`` and ``postgresql/``, and
both directories end at the same version (``tests/test_ledger_schema.py`` holds this).
Below it the numbers name different steps per dialect (the first migrations were written
separately); an upgrade from any of them still ends at the same schema.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from importlib import resources

__all__ = ["ALIGNED_VERSION", "Migration", "load_migrations", "split_statements"]

ALIGNED_VERSION = 11
"""The first schema version that is the same schema on SQLite and PostgreSQL."""


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: the version it produces, its name and its SQL text."""

    version: int
    name: str
    sql: str


def load_migrations(dialect: str) -> list[Migration]:
    """All migrations of ``dialect`` (``"sqlite"``, ``"postgresql"``), sorted by version.

    Raises:
        RuntimeError: versions are not 1, 2, 3, ... without gaps (a packaging bug).
    """
    folder = resources.files(__package__).joinpath(dialect)
    found: list[Migration] = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append(Migration(version, entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{dialect} migrations are not numbered 1..N: {found}")
    return found


def split_statements(sql: str) -> list[str]:
    """Split a SQL script into complete statements (comments kept, empties dropped)."""
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in buffer.splitlines()
    ):
        statements.append(buffer.strip())
    return statements
