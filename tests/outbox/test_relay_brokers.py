"""Relays against real brokers: a busy relay shares with a newcomer and per key order
holds; a frozen relay's late
publish is a duplicate and its late mark is rejected; a task's ctx.emit reaches the
broker through a real worker."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from outboxsupport import (
    AmqpSink,
    NatsSink,
    check_delivery,
    emit,
    expected_of,
    plan,
    relay_cmd,
    unsent,
)
from pgsupport import private_schema

from ratchet import App, open_ledger
from ratchet.outbox import new_message
from ratchet.testing import ProcessGroup, running_worker, wait_for


class Backlog(threading.Thread):
    """Emits rows round-robin over 50 keys, 500 per transaction, keeping at least ``depth``
    unsent (more than a relay publishes in a second) until :meth:`finish`."""

    def __init__(self, url: str, depth: int = 5000) -> None:
        super().__init__(daemon=True)
        self.url, self.depth = url, depth
        self.rows: list[tuple[str, str]] = []
        self.error: BaseException | None = None
        self.full = threading.Event()
        self._done = threading.Event()

    def finish(self) -> None:
        self._done.set()
        self.join(60)

    def run(self) -> None:
        try:
            ledger = open_ledger(self.url)
            try:
                while not self._done.is_set():
                    if len(ledger.outbox_fetch(list(range(32)), self.depth)) >= self.depth:
                        self.full.set()
                        self._done.wait(0.02)
                        continue
                    n = len(self.rows)
                    chunk = [(f"k{(n + i) % 50}", f"busy-{n + i}") for i in range(500)]
                    ledger.emit([new_message("test.event", {"n": n + i}, key=key,
                                             message_id=mid, max_payload_bytes=10_000)
                                 for i, (key, mid) in enumerate(chunk)])
                    self.rows.extend(chunk)
            finally:
                ledger.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.full.set()


def test_a_busy_relay_gives_a_newcomer_its_share_and_order_per_key_holds(
        amqp: AmqpSink, procs: ProcessGroup) -> None:
    with private_schema("rt_relay") as (url, _):
        backlog = Backlog(url)
        backlog.start()
        try:
            assert backlog.full.wait(60), "the backlog never filled"
            assert backlog.error is None
            # From here on the first relay always has a full batch: it goes from round to
            # round, its leases renewed inside rounds, and must still give back half of
            # its partitions when a second relay starts.
            first = procs.spawn("relay-0", relay_cmd(url, amqp.to_url, name="r0"))
            wait_for("the first relay marks rows sent",
                     lambda: len(backlog.rows) - unsent(url) > 0, timeout_s=60)
            second = procs.spawn("relay-1", relay_cmd(url, amqp.to_url, name="r1"))
            wait_for("the second relay holds its share",
                     lambda: "holds 16 partitions" in second.log(), timeout_s=60)
            wait_for("the first relay gave back half",
                     lambda: "holds 16 partitions" in first.log(), timeout_s=60)
        finally:
            backlog.finish()
        assert backlog.error is None
        wait_for("every row marked sent", lambda: unsent(url) == 0, timeout_s=60)
        relays = [first, second]
        for relay in relays:
            assert relay.stop() == 0, relay.describe()
    rows = backlog.rows
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
