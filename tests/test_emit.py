"""``ctx.emit`` and ``App.emit``: outbox rows written in the transaction that decided them
(DESIGN §6, row 10). A task's emit commits with its fenced checkpoint, so a stale holder's
emit never becomes visible and a replay writes nothing new; the message id is stable
across holders. Both ledgers; rows are read from the database itself."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from test_caller_transaction import Caller, outbox_rows

from ratchet import (
    App,
    InvalidArguments,
    PayloadNotSerializable,
    PayloadTooLarge,
    State,
    TaskContext,
    TransactionMisuse,
)
from ratchet.ledger.base import TaskWrite, Transition
from ratchet.outbox import message_id_for, new_message, partition_of
from ratchet.testing import fast_retry_policy, running_worker, wait_for


def test_a_task_emits_once_per_position_across_attempts(app: App) -> None:
    """The first attempt emits twice and then fails; the second replays both emits
    (recorded ids, no new rows) and emits a third message: three rows in all, each id
    derived from the task and the emit's position."""
    attempts: list[int] = []

    @app.task(name="pay", retry=fast_retry_policy(max_attempts=3))
    def pay(ctx: TaskContext, order_id: str) -> list[str]:
        attempts.append(ctx.attempt)
        ids = [ctx.emit("order.paid", {"order_id": order_id, "n": 1}, key=order_id),
               ctx.emit("order.paid", {"order_id": order_id, "n": 2}, key=order_id)]
        if ctx.attempt == 1:
            raise ConnectionError("the attempt fails after its emits")
        ids.append(ctx.emit("order.receipt", {"order_id": order_id}, key=order_id))
        return ids

    handle = app.submit("pay", {"order_id": "o-1"})
    with running_worker(app):
        info = handle.wait(30)
    assert info.state is State.SUCCEEDED and attempts == [1, 2]
    rows = outbox_rows(app)
    assert [r[1] for r in rows] == info.result
    assert info.result == [
        message_id_for(handle.task_id, "ratchet:emit:order.paid"),
        message_id_for(handle.task_id, "ratchet:emit:order.paid#2"),
        message_id_for(handle.task_id, "ratchet:emit:order.receipt"),
    ]
    assert [(r[2], r[3], r[4], r[5]) for r in rows] == [
        ("order.paid", "o-1", '{"n":1,"order_id":"o-1"}', handle.task_id),
        ("order.paid", "o-1", '{"n":2,"order_id":"o-1"}', handle.task_id),
        ("order.receipt", "o-1", '{"order_id":"o-1"}', handle.task_id),
    ]


def test_a_stale_holder_emit_is_never_written(app: App) -> None:
    """A write carrying outbox rows at an old generation is rejected as a whole; at the
    current generation it commits them (once, even if sent twice)."""

    @app.task(name="noop")
    def noop(ctx: TaskContext) -> None:
        return None

    handle = app.submit("noop")
    (claim,) = app.ledger.claim("holder-a", ["noop"], 1)
    msg = new_message("order.paid", {"n": 1}, key="k", message_id="m-1",
                      max_payload_bytes=1000, task_id=handle.task_id)
    stale = TaskWrite(handle.task_id, claim.generation - 1, "holder-old", "emit:order.paid",
                      steps=[("ratchet:emit:order.paid", '"m-1"', 0)], outbox=[msg])
    (outcome,) = app.ledger.commit([stale])
    assert outcome.stale and not outcome.ok
    assert outbox_rows(app) == []
    current = TaskWrite(handle.task_id, claim.generation, "holder-a", "emit:order.paid",
                        steps=[("ratchet:emit:order.paid", '"m-1"', 0)], outbox=[msg])
    assert app.ledger.commit([current])[0].ok
    again = TaskWrite(handle.task_id, claim.generation, "holder-a", "complete",
                      outbox=[msg], transition=Transition(State.SUCCEEDED, result_json="null"))
    assert app.ledger.commit([again])[0].ok
    assert [r[1] for r in outbox_rows(app)] == ["m-1"]


def test_app_emit_checks_what_it_is_given(app: App) -> None:
    app.ledger.migrate()
    for topic in ("", "order paid", "order.*", "order.>", "a..b", ".a", "é", 7):
        with pytest.raises(InvalidArguments, match="topic"):
            app.emit(topic, {})  # type: ignore[arg-type]
    with pytest.raises(PayloadNotSerializable):
        app.emit("order.paid", {"when": object()})
    small = App(app.ledger, max_payload_bytes=64)
    with pytest.raises(PayloadTooLarge):
        small.emit("order.paid", {"blob": "x" * 100})
    with pytest.raises(InvalidArguments, match="outbox key"):
        app.emit("order.paid", {}, key="")
    assert outbox_rows(app) == []
    first = app.emit("order.paid", {"n": 1}, message_id="same")
    second = app.emit("order.paid", {"n": 2}, message_id="same")
    assert first == second == "same"
    ((_, mid, _, key, payload, task_id),) = outbox_rows(app)
    assert (mid, key, payload, task_id) == ("same", None, '{"n":1}', None)


def test_partitions_are_stable_and_keep_a_key_together() -> None:
    assert partition_of("order-17", "a") == partition_of("order-17", "b")
    assert partition_of(None, "m-1") == partition_of("m-1", "other")
    assert {partition_of(f"k{i}", "m") for i in range(500)} == set(range(32))


def test_inside_a_transaction_step_emit_goes_through_the_step_connection(app: App) -> None:
    """``ctx.emit`` inside ``ctx.transaction``'s function is refused (its write would wait
    for the step's own lock); ``app.emit(..., connection=conn)`` there commits with the
    step: exactly one row although the task's next attempt replays the step."""
    attempts: list[int] = []

    @app.task(name="refused")
    def refused(ctx: TaskContext) -> None:
        ctx.transaction("t", lambda conn: ctx.emit("order.paid", {}))

    @app.task(name="joined", retry=fast_retry_policy(max_attempts=3))
    def joined(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        mid: str = ctx.transaction(
            "t", lambda conn: app.emit("order.paid", {"in": "step"}, key="k",
                                       connection=conn))
        if ctx.attempt == 1:
            raise ConnectionError("after the transaction step")
        return mid

    bad = app.submit("refused")
    good = app.submit("joined")
    with running_worker(app):
        info = bad.wait(30)
        assert info.state is State.FAILED and info.last_error is not None
        assert TransactionMisuse.__name__ in info.last_error
        assert "app.emit(..., connection=conn)" in info.last_error
        done = good.wait(30)
    assert done.state is State.SUCCEEDED and attempts == [1, 2]
    ((_, mid, topic, key, payload, task_id),) = outbox_rows(app)
    assert (mid, topic, key, payload, task_id) == (done.result, "order.paid", "k",
                                                   '{"in":"step"}', None)


def test_per_key_order_is_commit_order(app: App) -> None:
    """Two callers emit to one key in overlapping transactions: the second waits for the
    first's key lock (PostgreSQL) or write lock (SQLite), so its row takes the later id
    and the outbox order per key is the commit order."""
    app.ledger.migrate()
    caller = Caller(app.ledger_url or "")
    first = caller.connect()
    second = caller.connect() if caller.pg else caller.connect(check_same_thread=False)
    try:
        app.emit("order.paid", {"n": "first"}, key="k", message_id="first", connection=first)
        started = threading.Event()
        errors: list[BaseException] = []

        def later() -> None:
            try:
                started.set()
                app.emit("order.paid", {"n": "second"}, key="k", message_id="second",
                         connection=second)
                second.commit()
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=later)
        thread.start()
        started.wait(10)
        if caller.pg:
            wait_for("the second emit to wait for the key's lock",
                     lambda: _waiting_on_lock(caller, second), timeout_s=20)
        first.commit()
        thread.join(30)
        assert errors == []
    finally:
        first.close()
        second.close()
    assert [r[1] for r in outbox_rows(app)] == ["first", "second"]


def _waiting_on_lock(caller: Caller, conn: Any) -> bool:
    pid = conn.info.backend_pid
    with psycopg.connect(caller.url.split("?", 1)[0]) as probe:
        row = probe.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                            (pid,)).fetchone()
    return row is not None and row[0] == "Lock"
