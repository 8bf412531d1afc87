"""Relays against real brokers: two relays keep per key order; a frozen relay's late
publish is a duplicate and its late mark is rejected; a task's ctx.emit reaches the
broker through a real worker."""

from __future__ import annotations

import signal
from pathlib import Path

from outboxsupport import (
    AmqpSink,
    NatsSink,
    Producer,
    check_delivery,
    emit,
    expected_of,
    plan,
    relay_cmd,
    unsent,
)
from pgsupport import private_schema

from ratchet import App
from ratchet.testing import ProcessGroup, running_worker, wait_for


def test_two_relays_keep_outbox_order_per_key(amqp: AmqpSink, procs: ProcessGroup) -> None:
    rows = plan(50, 100, "two")
    with private_schema("rt_relay") as (url, _):
        relays = [procs.spawn(f"relay-{i}", relay_cmd(url, amqp.to_url, name=f"r{i}"))
                  for i in range(2)]
        producer = Producer(url, rows, chunk=100, pause_s=0.02)
        producer.start()
        producer.join(120)
        assert producer.error is None
        wait_for("every row marked sent", lambda: unsent(url) == 0, timeout_s=60)
        for relay in relays:
            assert relay.stop() == 0, relay.describe()
    report = check_delivery(amqp.drain({m for _, m in rows}), expected_of(rows))
    assert report.unique == len(rows)
    assert all(" 0 published" not in r.log() for r in relays), "one relay did all the work"


def test_a_frozen_relays_late_publish_is_a_duplicate_and_its_mark_is_rejected(
        nats_sink: NatsSink, procs: ProcessGroup, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    rows = plan(10, 20, "frozen")
    emit(url, rows)
    frozen = procs.spawn("frozen", relay_cmd(url, nats_sink.to_url, lease="1s", batch=500,
                                             name="frozen"),
                         {"RATCHET_PAUSE_AT": "relay.before_publish"})
    frozen.wait_stopped(timeout_s=60)  # fetched every row, lease checked, nothing sent
    other = procs.spawn("other", relay_cmd(url, nats_sink.to_url, lease="1s", name="other"))
    wait_for("the other relay marked every row", lambda: unsent(url) == 0, timeout_s=60)
    wait_for("the broker has every message",
             lambda: len(nats_sink.drain({m for _, m in rows}, timeout_s=1)) >= len(rows))
    frozen.signal(signal.SIGCONT)
    wait_for("the frozen relay's mark was rejected",
             lambda: "not marked sent" in frozen.log(), timeout_s=30)
    assert frozen.stop() == 0, frozen.describe()
    assert other.stop() == 0, other.describe()
    seen = nats_sink.drain({m for _, m in rows})
    check_delivery(seen, expected_of(rows))
    # JetStream dropped the late copies itself (same Nats-Msg-Id within its window).
    assert len(seen) == len(rows)


def test_a_tasks_emit_reaches_the_broker(amqp: AmqpSink, procs: ProcessGroup,
                                          tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    app = App(url)

    @app.task(name="pay")
    def pay(ctx, order: str) -> str:  # type: ignore[no-untyped-def]
        return ctx.emit("order.paid", {"order": order}, key=order)

    try:
        with running_worker(app):
            handles = [app.submit("pay", {"order": f"o{i}"}) for i in range(5)]
            ids = [str(h.wait(timeout_s=30).result) for h in handles]
        relay = procs.spawn("relay", relay_cmd(url, amqp.to_url))
        wait_for("every row marked sent", lambda: unsent(url) == 0, timeout_s=60)
        assert relay.stop() == 0, relay.describe()
    finally:
        app.close()
    seen = amqp.drain(set(ids))
    assert {s.message_id for s in seen} == set(ids)
    assert sorted(s.key or "" for s in seen) == [f"o{i}" for i in range(5)]
