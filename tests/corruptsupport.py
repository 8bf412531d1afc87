"""Damaging a real SQLite ledger file the way a bad disk or a careless copy does, for the
corruption tests: bytes overwritten in the pages of the ``tasks`` table and its indexes, or
the file cut short. Processes that have the file open see the damage at their next read
(the damage is followed by a one-page write, which makes their page caches stale)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

__all__ = ["cut_in_half", "damage_task_pages", "truncate_ledger"]


def _checkpoint(path: Path) -> tuple[int, list[int], int]:
    """Move the WAL into the file (so the damage hits what readers read); return the page
    size, the root pages of ``tasks`` and its indexes, and ``user_version``."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        roots = [r[0] for r in conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE tbl_name = 'tasks' AND rootpage > 1")]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0, "the checkpoint before the damage did not complete"
        return page_size, roots, version
    finally:
        conn.close()


def _touch(path: Path, version: int) -> None:
    """A write of page 1 only (the same user_version): every open connection of every
    process drops its page cache at its next read, so it reads the damaged pages."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        conn.execute(f"PRAGMA user_version = {int(version)}")
    finally:
        conn.close()


def damage_task_pages(path: Path) -> None:
    """Overwrite the b-tree page header (type byte and cell counts) of the root page of
    ``tasks`` and of each of its indexes with 0xFF bytes: any read of the table is then
    ``database disk image is malformed`` (SQLITE_CORRUPT), while the file header, the
    schema and ``PRAGMA user_version`` stay readable."""
    page_size, roots, version = _checkpoint(path)
    assert roots, "no tasks table in the file"
    with open(path, "r+b") as f:
        for root in roots:
            f.seek((root - 1) * page_size)
            f.write(b"\xff" * 12)
        f.flush()
        os.fsync(f.fileno())
    _touch(path, version)


def truncate_ledger(path: Path) -> None:
    """Cut the file (WAL checkpointed into it first) short, just before the first root
    page of ``tasks`` and its indexes: every read of the table then meets a missing page
    (SQLITE_CORRUPT), whichever pages a process reads first."""
    page_size, roots, version = _checkpoint(path)
    _touch(path, version)  # first: a write could not read the cut file
    os.truncate(path, (min(roots) - 1) * page_size)


def cut_in_half(path: Path) -> None:
    """Cut the file (WAL checkpointed into it first, no WAL left) to half its length: even
    ``PRAGMA user_version`` of a new connection then reports SQLITE_CORRUPT (the header
    counts more pages than the file holds)."""
    _checkpoint(path)
    os.truncate(path, os.path.getsize(path) // 2)
