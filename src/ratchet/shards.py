"""Logical shards (DESIGN §8; seed 003 §1.1): a job split over a fixed shard space by a
stable business key, never by worker. Core: no I/O.

A sharded job (``App.submit_sharded``) is a parent task and one child per shard; a child
learns its place from ``ctx.shard`` (:class:`Shard`). Which shard an item belongs to is a
stable hash of its business key modulo the count (:func:`shard_of`): the same on every
process, every run and every Python version (never ``hash()``, which is salted per
process). The shard space is fixed when the job is submitted; a lost worker's shards are
tasks like any other, so their leases expire and another worker takes them over.

The shard of a task travels in its stored params under keys no Python parameter can have
(:data:`SHARD_PARAM`, :data:`SHARDS_PARAM`: a name with ``:`` is not an identifier); the
worker removes them before calling the task function.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .errors import InvalidArguments, UndecodableData

__all__ = ["MAX_SHARDS", "SHARDS_PARAM", "SHARD_PARAM", "Shard", "check_shards", "job_shards",
           "shard_of", "shard_place", "task_shard"]

SHARD_PARAM = "ratchet:shard"
"""Stored-params key of a shard task: ``{"index": i, "count": n}``."""

SHARDS_PARAM = "ratchet:shards"
"""Stored-params key of a sharded job's parent: the shard count."""

MAX_SHARDS = 4096
"""Most shards one job may have (each is a task; the parent gathers them all)."""


def shard_of(key: str, count: int) -> int:
    """The shard (``0 .. count - 1``) of business key ``key`` in a space of ``count``:
    the first 8 bytes of its SHA-256, big-endian, modulo ``count``. Stable across
    processes, runs and versions.

    Raises:
        InvalidArguments: ``count`` is not an int in 1 .. :data:`MAX_SHARDS`.
    """
    check_shards(count)
    digest = hashlib.sha256(str(key).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % count


def check_shards(count: object) -> int:
    """``count`` if it is an int in 1 .. :data:`MAX_SHARDS`.

    Raises:
        InvalidArguments: otherwise.
    """
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
        raise InvalidArguments(
            f"shards must be an int from 1 to {MAX_SHARDS}, got {count!r}")
    return count


@dataclass(frozen=True, slots=True)
class Shard:
    """Where a shard task stands in its job's shard space (``ctx.shard``).

    Attributes:
        index: this shard's number, ``0 .. count - 1``.
        count: how many shards the job has (fixed when it was submitted).
    """

    index: int
    count: int

    def owns(self, key: str) -> bool:
        """True when business key ``key`` belongs to this shard (:func:`shard_of`)."""
        return shard_of(key, self.count) == self.index


def shard_place(value: object) -> Shard:
    """The :class:`Shard` stored under :data:`SHARD_PARAM` (``{"index": i, "count": n}``).

    Raises:
        UndecodableData: not such an object, or ``index`` not in ``0 .. count - 1``, or
            ``count`` not in 1 .. :data:`MAX_SHARDS`.
    """
    index = value.get("index") if isinstance(value, dict) else None
    count = value.get("count") if isinstance(value, dict) else None
    if (isinstance(index, bool) or isinstance(count, bool) or not isinstance(index, int)
            or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS
            or not 0 <= index < count):
        raise UndecodableData(
            f"params key {SHARD_PARAM!r} holds {value!r:.100}, not a shard's place (index "
            f"0 .. count - 1, count 1 .. {MAX_SHARDS})")
    return Shard(index, count)


def task_shard(params: object) -> Shard | None:
    """The shard place stored in a task's decoded ``params`` (:data:`SHARD_PARAM`), or None
    when it has none or it is not a valid place (the faces' and the check's reading; the
    worker refuses an invalid one with :func:`shard_place`)."""
    found = params.get(SHARD_PARAM) if isinstance(params, dict) else None
    if found is None:
        return None
    try:
        return shard_place(found)
    except UndecodableData:
        return None


def job_shards(params: object) -> int | None:
    """The shard count stored in a sharded job parent's decoded ``params``
    (:data:`SHARDS_PARAM`), or None when the task is not a valid sharded job."""
    found = params.get(SHARDS_PARAM) if isinstance(params, dict) else None
    if isinstance(found, bool) or not isinstance(found, int) or not 1 <= found <= MAX_SHARDS:
        return None
    return found
