"""The SQLite ledger's file as a file: made whole before it appears at its path, and
watched while it is open.

A new ledger is built in a temporary file next to its path and hard-linked into place
(:func:`create_whole`), so the path never holds a file that is empty or half-migrated: a
ledger file Ratchet made always holds the complete schema, and an existing file that is
empty was truncated by someone else (:func:`file_problem`), never a ledger "not yet
made". The link fails when a file is already there, so two processes creating the same
ledger at once end up on one file: the first to link it.

An open SQLite connection keeps reading what it has cached (pages, and the WAL index in
the ``-shm`` file) when its file is truncated, replaced or removed under it, and never
reports an error. :func:`file_problem` is the cheap look (one ``stat``; never an
``open``, which would drop SQLite's locks) the dialect takes every :data:`FILE_CHECK_S`
of use to notice.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable

__all__ = ["EMPTY_DETAIL", "FILE_CHECK_S", "MAGIC", "create_whole", "file_identity",
           "file_problem"]

MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""

FILE_CHECK_S = 0.25
"""Seconds between two looks at the open file (:func:`file_problem`) by one dialect."""

EMPTY_DETAIL = ("the file is empty (0 bytes): a ledger Ratchet created is never empty, so "
                "it was truncated")
"""What :func:`file_problem` says of an empty file."""

_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK}
"""``link()`` errors of a filesystem that has no hard links (FAT, some network mounts)."""

Identity = tuple[int, int]
"""``(st_dev, st_ino)`` of a file."""


def _fsync(path: str, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_whole(path: str, build: Callable[[str], None]) -> bool:
    """Make the file at ``path`` with ``build`` unless a file is there (race-safe).

    ``build(temp)`` writes the complete file at ``temp``, a new empty file (mode 0600) in
    the same directory; it is synced and hard-linked to ``path``, which fails when
    anything exists there (then this call's file is discarded). On a filesystem without
    hard links the file is renamed into place after a check that the path is free (not
    race-safe against another process creating it at that instant). The temporary file
    and its ``-wal``, ``-shm`` and ``-journal`` companions are removed in every case.

    Args:
        path: where the file must appear (absolute).
        build: writes the whole file at the path it is given; closes it before returning.

    Returns:
        True when this call put its file at ``path``; False when one was already there.

    Raises:
        OSError: the temporary file could not be made or linked.
        Exception: what ``build`` raised (nothing appears at ``path``).
    """
    directory, name = os.path.split(path)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".new", dir=directory)
    os.close(fd)
    try:
        build(temp)
        _fsync(temp)
        try:
            os.link(temp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            if os.path.lexists(path):
                return False
            os.rename(temp, path)
        with contextlib.suppress(OSError):  # the new name survives a power loss
            _fsync(directory)
        return True
    finally:
        for leftover in (temp, temp + "-wal", temp + "-shm", temp + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def file_identity(path: str) -> Identity:
    """``(st_dev, st_ino)`` of the file at ``path``.

    Raises:
        OSError: no such file, or it cannot be looked at.
    """
    st = os.stat(path)
    return st.st_dev, st.st_ino


def file_problem(path: str, opened: Identity | None) -> str | None:
    """What is wrong with the ledger file at ``path``, or None: it is gone, it is another
    file than the one opened (``opened``: its :func:`file_identity`; None: not checked), or
    it is empty. One ``stat``; a file that cannot be looked at now (permissions) is not
    called damaged.

    It never opens the file: SQLite holds POSIX advisory locks on it, which the kernel
    drops for the whole process when *any* descriptor of the file in the process is closed
    (fcntl(2)). A look through ``open()``/``close()`` would release the locks of every open
    connection, so another process could take the file for its last user, checkpoint and
    delete the ``-wal`` and ``-shm`` files under them. A header overwritten in place is
    left to SQLite, which reports it (``SQLITE_NOTADB``) at the next read of that page.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ("the file was removed while in use: the open connections see only the "
                "deleted file")
    except OSError:
        return None
    if opened is not None and (st.st_dev, st.st_ino) != opened:
        return ("the file was replaced while in use (another file is at its path now): "
                "the open connections see only the old one")
    if st.st_size == 0:
        return EMPTY_DETAIL
    return None
