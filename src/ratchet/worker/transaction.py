"""Transaction steps: ``ctx.transaction(name, fn, *args, **kwargs)`` (DESIGN §5).

When the task's own tables live in the ledger's database (the same SQLite file, or the
same PostgreSQL database), ``fn(conn, *args, **kwargs)`` runs on a connection of a ledger
transaction that also

1. reads the task's fence under lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the task
   row's lock) and goes no further if another worker took the task over: ``fn`` is not
   called, the rejection is audited (``stale_rejected``) and ``StaleGeneration`` raised;
2. records ``fn``'s JSON result as the step's checkpoint (with the task's pipelined steps);
3. commits: ``fn``'s writes and the checkpoint together, or neither.

A later attempt finds the checkpoint and returns the stored value without calling ``fn``:
exactly once for local writes, with no lookup and no idempotency key (DBOS calls these
transaction steps). A stale holder's transaction (a holder frozen past its lease, then
resumed) rolls back as a whole.

:func:`run_transaction` is the implementation; ``TaskContext.transaction`` calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import LedgerUnavailable, StaleGeneration, TransactionMisuse, WriteRejected
from ..faults import point as fault_point
from ..ledger.base import TaskWrite
from ..serde import dumps, loads
from ..validation import check_checkpoint_name
from .checkpoints import CheckpointState, HistoryEnd

__all__ = ["run_transaction"]


def run_transaction(
    ctx: CheckpointState,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Run ``fn(conn, *args, **kwargs)`` once per task inside a fenced ledger transaction
    and commit its writes together with its result (``ctx.transaction``).

    ``conn`` is the DB-API connection of the ledger's own transaction: a
    ``sqlite3.Connection`` on the ledger's SQLite file, or a ``psycopg.Connection``
    (psycopg 3) to the ledger's PostgreSQL database whose ``search_path`` is the database's
    default (not the ledger's schema): tables are found as in any other session of the
    database. The task's tables must live there; a task whose tables are elsewhere uses
    :mod:`ratchet.fencing`. An App has one ledger, so the connection always belongs to it.

    Rules for ``fn``:

    * Do not commit, roll back or close ``conn`` (nor use it as ``with conn:``): Ratchet
      does, with the checkpoint. These calls raise
      :class:`~ratchet.errors.TransactionMisuse`; a ``COMMIT`` sent as SQL is
      detected afterwards and raises it too (a permanent failure). On PostgreSQL,
      recover from a failed statement with a savepoint (``with conn.transaction():``).
    * Keep it short, and touch only the database: on SQLite it holds the ledger file's
      single write lock (every other worker's ledger writes wait); on PostgreSQL it holds
      the task row's lock (renewals skip it until it commits: its lease is not extended
      meanwhile), and the server ends a
      session idle inside a transaction for more than 3 s (rolling everything back).
    * It may run more than once when the database rolled the transaction back (a deadlock,
      a connection lost before ``COMMIT``, a lost ``COMMIT`` reply whose transaction did not
      commit); only one run ever commits. Side effects outside the database are not undone:
      use ``ctx.effect`` for those, before or after the transaction step, never inside
      ``fn`` (a checkpoint inside ``fn`` raises ``TransactionMisuse``).

    Args:
        ctx: the running task's context.
        name: the step name; occurrences as for ``ctx.step`` (the N-th call of ``name`` is
            its own checkpoint). Transaction steps and ``ctx.step`` share one namespace.
        fn: ``fn(conn, *args, **kwargs) -> JSON value``.
        args: positional arguments passed to ``fn`` after ``conn``.
        kwargs: keyword arguments passed to ``fn``.

    Returns:
        The JSON round-trip of ``fn``'s result (the stored value on a replay).

    Raises:
        InvalidArguments: ``name`` is not a storable step name.
        NonDeterministicReplay: an earlier attempt recorded another checkpoint here.
        StaleGeneration: another worker holds the task; ``fn`` was not called.
        TransactionMisuse: ``fn`` ended or aborted the transaction, or called
            ``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` (nothing recorded).
        PayloadNotSerializable: the result is not plain JSON (``fn``'s writes rolled back).
        UndecodableData: the value stored by an earlier attempt cannot be decoded.
        WriteRejected: the database refused the checkpoint's write (nothing committed).
        LedgerUnavailable: the ledger cannot be reached (nothing committed, or the outcome
            was settled as not committed).
        Exception: what ``fn`` raised, after everything was rolled back.
    """
    ctx._boundary()
    check_checkpoint_name(name, "transaction step name")
    return ctx.hooked_step(name, lambda: _transaction(ctx, name, fn, args, kwargs))


def _transaction(
    ctx: CheckpointState, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[Any, bool]:
    """:func:`run_transaction` without its checks and hooks; ``(value, cached)``."""
    cp = ctx._checkpoint("step", name)
    stored_name = cp.stored_name
    stored = ctx._steps.get(stored_name)
    if stored is not None:
        return loads(stored, f"stored value of transaction {cp.describe()}"), True
    if ctx.compensating:  # compensation mode: the replay ends before new work
        raise HistoryEnd(cp.describe())
    carried = ctx.unsaved_steps()
    operation = f"transaction:{stored_name}"
    write = TaskWrite(ctx.task_id, ctx.generation, ctx.holder, operation, steps=carried)
    raised: list[BaseException] = []  # what fn raised (not the ledger)

    def body(conn: Any) -> tuple[Any, ...]:
        nested = ctx._next_seq
        ctx._in_transaction = True  # see CheckpointState._boundary
        try:
            value = fn(conn, *args, **kwargs)
        except BaseException as exc:
            raised.append(exc)
            raise
        finally:
            ctx._in_transaction = False
        if ctx._next_seq != nested:
            # ctx.step / ctx.effect / ctx.transaction inside fn: their checkpoints would not
            # be part of this transaction (and an effect's write would wait for this
            # transaction's own locks). Nothing of this attempt's unsaved steps may be
            # recorded by the failure write (the nested ones would be out of order).
            ctx.discard_unsaved_steps()
            raise TransactionMisuse(
                f"transaction {cp.describe()}: its function called ctx.step, ctx.effect or "
                "ctx.transaction; call them before or after ctx.transaction, not inside")
        return (stored_name, dumps(value, what=f"result of transaction {cp.describe()}"),
                cp.seq)

    # A holder frozen here (past its last look at the ledger) is fenced by the
    # transaction's own fence read when it resumes.
    fault_point("transaction.before_begin")
    if ctx._on_block is not None:
        ctx._on_block()
    try:
        outcome, entry = ctx._writer.ledger.transaction_step(write, body)
    except WriteRejected:
        if not raised:
            ctx.discard_unsaved_steps()  # one of them may be what was refused
        raise
    except LedgerUnavailable as exc:
        if not raised or raised[-1] is not exc:
            ctx.ledger_outage = exc  # the worker's own ledger, not the task's code
        raise
    if outcome.stale:
        raise StaleGeneration(ctx.task_id, ctx.generation, operation)
    assert entry is not None
    ctx.steps_saved(carried)
    result_json: str = entry[1]
    ctx._steps[stored_name] = result_json
    fault_point("transaction.after_commit")
    return loads(result_json), False
