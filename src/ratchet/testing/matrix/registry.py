"""The rows of the crash-point matrix (DESIGN §6): what each one crashes, the mechanism
it proves, and the function that runs it, in a registry a build can extend.

A row without a function is listed (its crash point and mechanism) but cannot run in this
build: the runner reports it as ``skip`` with :attr:`Row.unavailable` as the reason.
:func:`register_row` adds or replaces a row. A row that can run in this build but not in this
run (row 10 without a broker) raises :class:`~ratchet.testing.matrix.rig.RowSkipped`, also
reported as ``skip``.

Writing a row: a function ``(ctx: RowContext) -> str`` that opens fresh worlds with
``ctx.world(name)`` (a :class:`~ratchet.testing.matrix.rig.MatrixRig`: its own ledger,
the run's counting service behind a key prefix of its own, its processes), starts real
processes there (``rig.worker(name, crash_at=...)``, ``rig.procs.spawn(...)`` with
``rig.env(...)``), compares the end with a crash-free control run, checks counts read at
the external side (``rig.executions()``, ``rig.items()``, ``rig.step_counts()``) with
:func:`~ratchet.testing.matrix.rig.expect`, puts them in ``ctx.counts`` and returns a
one-line detail.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...errors import InvalidArguments
from .context import RowContext
from .rows_holder import row8, row9
from .rows_outbox import row10
from .rows_submit import row1, row2, row3
from .rows_worker import row4, row5, row6, row7

__all__ = ["FIRST_ROW", "LAST_ROW", "ROWS", "Row", "RowFunction", "parse_rows", "register_row"]

RowFunction = Callable[[RowContext], str]
"""A row: runs its worlds (``ctx.world``), compares with the control run, fills
``ctx.counts`` and returns a one-line detail; raises ``RowFailed`` (or any error) when a
check does not hold."""

FIRST_ROW, LAST_ROW = 1, 10
"""The rows of DESIGN §6's table."""


@dataclass(frozen=True)
class Row:
    """One row of the matrix.

    Attributes:
        number: the row of DESIGN §6's table (1-10).
        point: the crash point, in the table's words.
        mechanism: what makes the point recoverable.
        faults: the fault points (``ratchet.faults``) or signals the row uses.
        run: the row's function; ``None``: not runnable in this build.
        unavailable: why ``run`` is ``None`` (shown as the row's detail).
    """

    number: int
    point: str
    mechanism: str
    faults: tuple[str, ...] = ()
    run: RowFunction | None = None
    unavailable: str = ""


ROWS: dict[int, Row] = {row.number: row for row in (
    Row(1, "request received, nothing written",
        "client retries with the same idempotency key",
        ("submit.before_commit", "commit.before_commit"), row1),
    Row(2, "task state written, not dispatched", "state row is the dispatch",
        ("SIGKILL", "test.matrix.caller_before_commit"), row2),
    Row(3, "dispatched, client not answered", "idempotency key returns the same task id",
        ("submit.after_commit",), row3),
    Row(4, "claimed, nothing executed", "lease expiry, generation+1",
        ("claim.after_commit",), row4),
    Row(5, "external effect done, not recorded", "intent record + key + lookup first",
        ("effect.after_intent", "effect.after_call"), row5),
    Row(6, "step recorded, not acknowledged", "done markers + terminal check",
        ("step.after_commit",), row6),
    Row(7, "in the middle of a step commit", "one atomic fenced transaction",
        ("commit.before_commit",), row7),
    Row(8, "holder paused past its lease, then resumes",
        "fencing generation rejects the late write", ("effect.after_call (SIGSTOP)",), row8),
    Row(9, "a later batch committed, an earlier one lost", "contiguous watermark",
        ("batch.before_commit",), row9),
    Row(10, "outbox published, not marked sent", "stable message id, consumer dedupe",
        ("relay.after_publish",), row10),
)}
"""Every row, by number (:func:`register_row` changes it)."""


def register_row(row: Row) -> None:
    """Add ``row`` to the matrix, replacing the row of the same number.

    Raises:
        InvalidArguments: the number is outside 1-10, or a row without ``run`` gives no
            ``unavailable`` reason.
    """
    if not FIRST_ROW <= row.number <= LAST_ROW:
        raise InvalidArguments(f"a matrix row is numbered {FIRST_ROW}-{LAST_ROW}, got "
                               f"{row.number}")
    if row.run is None and not row.unavailable:
        raise InvalidArguments(f"row {row.number} has no function and no reason why")
    ROWS[row.number] = row


def parse_rows(text: str | None) -> list[int]:
    """The rows ``--rows`` selects: ``None`` (every row), ``N``, ``A-B`` or a comma list of
    those (``1-3,5``), in ascending order without repeats.

    Raises:
        InvalidArguments: malformed, empty, a range going down, or a row outside 1-10.
    """
    if text is None:
        return list(range(FIRST_ROW, LAST_ROW + 1))
    chosen: set[int] = set()
    hint = f"--rows takes N, A-B or a comma list of those, with rows {FIRST_ROW}-{LAST_ROW}"
    for part in text.split(","):
        bounds = [b.strip() for b in part.strip().split("-")]
        if len(bounds) > 2 or not all(b.isascii() and b.isdigit() for b in bounds):
            raise InvalidArguments(f"{hint}; got {text!r}")
        low, high = int(bounds[0]), int(bounds[-1])
        if low > high:
            raise InvalidArguments(f"{hint}; the range {part.strip()!r} goes down")
        if low < FIRST_ROW or high > LAST_ROW:
            raise InvalidArguments(f"{hint}; {part.strip()!r} is outside {FIRST_ROW}-"
                                   f"{LAST_ROW}")
        chosen.update(range(low, high + 1))
    return sorted(chosen)
