"""Rows 1-3 of the crash-point matrix (DESIGN §6): the submit side.

Each row kills a real client process (``python -c``, submitting through
:mod:`ratchet.testing.matrix.app`) with SIGKILL at a fault point of the submit path, lets
the client retry, runs the task in a real worker process and compares the end with the
crash-free control run, counting executions at the counting service.
"""

from __future__ import annotations

import inspect
import json
import sqlite3
from typing import Any

from ...app import App
from ...config import parse_ledger_url
from ...states import State
from ..checks import list_task_ids
from .app import CHARGE
from .context import CHARGE_PARAMS, Control, RowContext, pg_connection
from .rig import SIGKILLED, MatrixRig, RowFailed, expect

__all__ = ["caller_transactions_available", "row1", "row2", "row3"]

SUBMIT = """
import json, sys
from ratchet.testing.matrix import app as m
handle = m.app.submit(m.CHARGE, json.loads(sys.argv[1]), idempotency_key=sys.argv[2])
print("ANSWER " + json.dumps({"task_id": handle.task_id, "created": handle.created}), flush=True)
"""
"""A client: submit the charge with an idempotency key, print the answer it got."""

SUBMIT_IN_COMMIT = """
import json, os, sys
from ratchet import faults
from ratchet.testing.matrix import app as m
m.app.ledger.get  # opened (and migrated): the next write transaction is the submit's
os.environ["RATCHET_CRASH_AT"] = "commit.before_commit"
faults.reset()
handle = m.app.submit(m.CHARGE, json.loads(sys.argv[1]), idempotency_key=sys.argv[2])
print("ANSWER " + json.dumps({"task_id": handle.task_id, "created": handle.created}), flush=True)
"""
"""A client killed inside the submit's own transaction (statements run, COMMIT not sent)."""

CALLER_TABLE = "matrix_orders"
"""The caller's own table of row 2's caller's-transaction check (in the world's ledger
file, or its schema)."""

SUBMIT_WITH_CALLER = """
import json, sqlite3, sys
from ratchet import faults
from ratchet.config import parse_ledger_url
from ratchet.testing.matrix import app as m
config = parse_ledger_url(m.app.ledger_url or None)
m.app.ledger.get  # opened and migrated before the caller's transaction starts
if config.scheme == "sqlite":
    conn = sqlite3.connect(config.path)
    conn.execute("INSERT INTO matrix_orders (id) VALUES (?)", (sys.argv[2],))
else:
    import psycopg
    from psycopg import sql
    from ratchet.ledger.postgres import libpq_url
    conn = psycopg.connect(libpq_url(config))
    conn.execute(sql.SQL("SET search_path TO {}").format(
        sql.Identifier(config.options.get("schema", "ratchet"))))
    conn.execute("INSERT INTO matrix_orders (id) VALUES (%s)", (sys.argv[2],))
handle = m.app.submit(m.CHARGE, json.loads(sys.argv[1]), idempotency_key=sys.argv[2],
                      connection=conn)
before_commit = "test.matrix.caller_before_commit"  # a point of this caller's own code
faults.point(before_commit)
conn.commit()
print("ANSWER " + json.dumps({"task_id": handle.task_id, "created": handle.created}), flush=True)
"""
"""A caller that inserts its own row and submits the charge in its own open transaction,
then commits (``RATCHET_CRASH_AT=test.matrix.caller_before_commit``: killed before)."""


def caller_transactions_available() -> bool:
    """True when this build's ``App.submit`` takes ``connection=`` (the caller's open
    transaction)."""
    return "connection" in inspect.signature(App.submit).parameters


def task_ids(rig: MatrixRig) -> list[str]:
    """Every task id in the world's ledger (opened, and so made, first: a client killed
    before its first write leaves no ledger file behind)."""
    rig.ledger.now()
    return list_task_ids(rig.ledger_url)


def _answer(log: str) -> dict[str, Any]:
    expect("ANSWER " in log, f"the client printed no answer; its log ends:\n{log[-800:]}")
    answer: dict[str, Any] = json.loads(log.split("ANSWER ", 1)[1].splitlines()[0])
    return answer


def _submit(rig: MatrixRig, name: str, key: str, code: str = SUBMIT) -> dict[str, Any]:
    """Run a client to its end; return its answer."""
    proc = rig.python(name, code, json.dumps(CHARGE_PARAMS), key)
    status = proc.wait(30.0)
    expect(status == 0, f"client {name} exited {status}:\n{proc.log()[-800:]}")
    return _answer(proc.log())


def _submit_killed(rig: MatrixRig, name: str, key: str, point: str,
                   code: str = SUBMIT, arm: bool = True) -> None:
    """Run a client that must die with SIGKILL at fault point ``point`` (armed through
    ``RATCHET_CRASH_AT``, or by the client's code itself when ``arm`` is false) before it
    was answered."""
    proc = rig.python(name, code, json.dumps(CHARGE_PARAMS), key,
                      RATCHET_CRASH_AT=point if arm else None)
    status = proc.wait(30.0)
    expect(status == SIGKILLED,
           f"client {name} was to die at {point}, exited {status}:\n{proc.log()[-800:]}")
    expect("ANSWER" not in proc.log(), f"client {name} was answered before dying at {point}")


def finish_like_control(rig: MatrixRig, task_id: str, control: Control,
                        steps: dict[str, int] | None = None) -> None:
    """Run the task in a clean worker; it must end like the control run: same result, one
    execution of the charge at the service, each step run as ``steps`` says (default: like
    the control run)."""
    worker = rig.worker("clean")
    info = rig.wait_state(task_id)
    expect(worker.stop() == 0, "the clean worker did not stop gracefully on SIGTERM")
    check_like_control(rig, task_id, info.state, info.result, control, steps)


def check_like_control(rig: MatrixRig, task_id: str, state: object, result: Any,
                       control: Control, steps: dict[str, int] | None = None) -> None:
    """The end of a crashed run equals the control run (state, result, executions per key
    at the service, step runs in the external log).

    Raises:
        RowFailed: it does not.
    """
    expect(state is State.SUCCEEDED, f"the task ended {state}, the control run SUCCEEDED")
    expect(result == control.result,
           f"the result differs from the control run's: {result!r} != {control.result!r}")
    executions = rig.executions()
    expect(executions == control.executions,
           f"executions at the service {executions} != the control run's {control.executions}")
    runs = rig.step_counts(task_id)
    wanted = steps if steps is not None else control.step_runs
    expect(runs == wanted, f"step runs {runs} != expected {wanted}")
    bodies = {r.body for r in rig.step_runs(task_id)}
    body = "async" if rig.async_bodies else "def"
    expect(bodies <= {body}, f"step functions ran in {sorted(bodies)} bodies, not {body}")


def row1(ctx: RowContext) -> str:
    """Request received, nothing written: the client dies before the submit commits
    (``submit.before_commit``; and inside the submit's transaction,
    ``commit.before_commit``) and retries with the same idempotency key."""
    control = ctx.control_charge()
    rig = ctx.world("row1")
    rig.start_service()
    key = "order:o-1"
    _submit_killed(rig, "client-before", key, "submit.before_commit")
    expect(task_ids(rig) == [], "a task was written before the submit commit")
    _submit_killed(rig, "client-in-commit", key, "commit.before_commit", SUBMIT_IN_COMMIT,
                   arm=False)
    expect(task_ids(rig) == [],
           "a task of the transaction killed before its COMMIT is visible")
    first = _submit(rig, "client-retry", key)
    expect(bool(first["created"]), "the retry did not create the task")
    again = rig.app.submit(CHARGE, CHARGE_PARAMS, idempotency_key=key)
    expect((again.task_id, again.created) == (first["task_id"], False),
           f"a second retry with the same key answered {again.task_id}, not the same task "
           f"{first['task_id']}")
    task_id = str(first["task_id"])
    expect(task_ids(rig) == [task_id], "not exactly one task in the ledger")
    finish_like_control(rig, task_id, control)
    ctx.counts.update(rig.counts(task_id), tasks=1)
    return ("client killed before the submit and inside its commit: no task written; "
            "retried with the same key: one task, one execution")


def row2(ctx: RowContext) -> str:
    """Task state written, not dispatched: the committed row is the dispatch. The only
    worker dies (SIGKILL) before the task is submitted; the task waits, nothing runs; a
    worker started later picks it up. And, when this build has it, the caller's own
    transaction: a caller killed between its own insert (and ``submit(connection=)``) and
    its commit leaves neither row."""
    control = ctx.control_charge()
    rig = ctx.world("row2")
    rig.start_service()
    dead = rig.worker("A")
    dead.holder(60.0)
    expect(dead.kill() == SIGKILLED, "the first worker was not killed")
    task_id = rig.app.submit(CHARGE, CHARGE_PARAMS).task_id
    info = rig.get(task_id)
    expect(info.state is State.PENDING and info.holder is None,
           f"the task is {info.state.value} with no worker alive")
    expect(rig.executions() == {} and rig.step_runs() == [], "something ran with no worker")
    finish_like_control(rig, task_id, control)
    ctx.counts.update(rig.counts(task_id), tasks=1)
    detail = "task committed with no live worker: a worker started later ran it once"
    if not caller_transactions_available():
        ctx.counts["caller_transaction"] = "not available"
        return (detail + "; the caller's-transaction check is not available in this build "
                "(App.submit has no connection=)")
    caller_transaction(ctx, control)
    return detail + "; a caller killed before its own commit left neither its row nor a task"


def _caller_rows(rig: MatrixRig) -> int:
    """Rows in the caller's table of the world."""
    config = parse_ledger_url(rig.ledger_url)
    query = "SELECT count(*) FROM matrix_orders"  # CALLER_TABLE
    if config.scheme == "sqlite":
        conn = sqlite3.connect(config.path)
        try:
            return int(conn.execute(query).fetchone()[0])
        finally:
            conn.close()
    with pg_connection(rig.ledger_url) as pg:
        row = pg.execute(query).fetchone()
    return int(row[0]) if row else 0


def _make_caller_table(rig: MatrixRig) -> None:
    config = parse_ledger_url(rig.ledger_url)
    rig.app.ledger.get  # noqa: B018 - opened and migrated: the file or schema exists
    ddl = "CREATE TABLE matrix_orders (id text PRIMARY KEY)"  # CALLER_TABLE
    if config.scheme == "sqlite":
        conn = sqlite3.connect(config.path)
        try:
            conn.execute(ddl)
            conn.commit()
        finally:
            conn.close()
        return
    with pg_connection(rig.ledger_url) as pg:
        pg.execute(ddl)


def caller_transaction(ctx: RowContext, control: Control) -> None:
    """Row 2's second half: ``App.submit(..., connection=)`` inside the caller's own
    transaction; SIGKILL between the caller's insert and its commit.

    Raises:
        RowFailed: a row survived the kill, or the committed submit did not run once.
    """
    rig = ctx.world("row2-caller")
    rig.start_service()
    _make_caller_table(rig)
    key = "order:o-1"
    _submit_killed(rig, "caller-killed", key, "test.matrix.caller_before_commit",
                   SUBMIT_WITH_CALLER)
    orders, tasks = _caller_rows(rig), task_ids(rig)
    expect(orders == 0 and tasks == [],
           f"the killed caller's transaction left {orders} order row(s) and {len(tasks)} "
           "task(s); it must leave neither")
    answer = _submit(rig, "caller", key, SUBMIT_WITH_CALLER)
    task_id = str(answer["task_id"])
    expect(_caller_rows(rig) == 1 and task_ids(rig) == [task_id],
           "the committed caller's transaction did not leave its row and one task")
    finish_like_control(rig, task_id, control)
    ctx.counts["caller_transaction"] = {"orders": 1, "tasks": 1,
                                        "executions": rig.executions()}
    if f"charge:{CHARGE_PARAMS['order_id']}" not in rig.executions():
        raise RowFailed("the caller's task did not charge")


def row3(ctx: RowContext) -> str:
    """Dispatched, client not answered: the client dies right after the submit committed
    (``submit.after_commit``) and retries with the same idempotency key: the same task id,
    nothing new written."""
    control = ctx.control_charge()
    rig = ctx.world("row3")
    rig.start_service()
    key = "order:o-1"
    _submit_killed(rig, "client-killed", key, "submit.after_commit")
    ids = task_ids(rig)
    expect(len(ids) == 1, f"{len(ids)} tasks after the commit; the task row must be there")
    task_id = ids[0]
    answer = _submit(rig, "client-retry", key)
    expect(answer == {"task_id": task_id, "created": False},
           f"the retry answered {answer}, not the committed task {task_id}")
    expect(task_ids(rig) == [task_id], "the retry wrote a second task")
    finish_like_control(rig, task_id, control)
    info = rig.get(task_id)
    expect(info.generation == 1, f"the task was claimed {info.generation} times, not once")
    ctx.counts.update(rig.counts(task_id), tasks=1)
    return "client killed after the submit committed; its retry got the same task id"
