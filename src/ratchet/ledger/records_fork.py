"""The record of a fork: a task made from another task's history up to one of its
checkpoints (``ratchet fork``, DESIGN §8, fork)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FORK_AT_END", "LINEAGE_STEP", "ForkLinks", "ForkRecord"]

FORK_AT_END = "ratchet:end"
"""The fork point after the last recorded checkpoint: the fork holds the whole history and
runs what follows it with the version it pins (the step that failed is not recorded, so it
cannot be named)."""

LINEAGE_STEP = "ratchet:lineage"
"""Name of the reserved step a fork holds (written by the fork, without a position, so it
is no checkpoint of the code path and is loaded with every claim like the compensation
markers): its result is the JSON string of the lineage id, the task id of the first task
of the chain of forks (the original's lineage id when the original is itself a fork). A
task without it is its own lineage. :mod:`ratchet.fencing` keys its fence and done markers
by the lineage id, so a fork finds the original's."""


@dataclass(frozen=True, slots=True)
class ForkRecord:
    """One fork (a row of the ``forks`` table, schema 17).

    Attributes:
        task_id: the new task (the fork).
        source_id: the task it was forked from.
        from_step: the stored checkpoint name it was forked at (``name``: the first
            occurrence; ``name#N``: the N-th); the fork's history is the source's before it.
        from_seq: that checkpoint's 0-based position in the source's code path; the fork
            holds copies of the source's steps and effects at positions below it.
        source_version: the definition version the source pinned.
        version: the definition version the fork pins.
        created_at: when it was forked, ledger clock, epoch seconds.
        by: the operator who forked it.
        reason: why.
    """

    task_id: str
    source_id: str
    from_step: str
    from_seq: int
    source_version: int
    version: int
    created_at: float
    by: str
    reason: str


@dataclass(frozen=True, slots=True)
class ForkLinks:
    """The fork links of one task (``ratchet inspect``, the task page).

    Attributes:
        forked_from: the fork that made this task, or None when it was not forked.
        forks: the tasks forked from this one, oldest first.
    """

    forked_from: ForkRecord | None = None
    forks: tuple[ForkRecord, ...] = ()
