"""``ratchet relay`` as an operator meets it when the broker is not there or the URL's
set-up is refused: a broker that cannot be reached is retried with backoff (a warning per
try, no traceback) and SIGTERM still stops the relay at once; a set-up the broker refuses
whatever the retries (a bad stream name) ends the relay with exit status 2."""

from __future__ import annotations

import signal
import socket
import subprocess
import uuid
from pathlib import Path

from outboxsupport import AmqpSink, emit, relay_cmd, require_broker, unsent

from ratchet.ledger import open_ledger
from ratchet.testing import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_relay_whose_broker_is_down_retries_quietly_and_stops_on_sigterm(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    open_ledger(url).close()
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        proc = subprocess.Popen(relay_cmd(url, f"nats://127.0.0.1:{_free_port()}"),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for("two retries of the unreachable broker",
                 lambda: log.read_text().count("broker unreachable") >= 2, timeout_s=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text
    assert "retrying in" in text


def test_a_stream_name_the_broker_refuses_exits_2(tmp_path: Path) -> None:
    require_broker("NATS", "127.0.0.1", 4222)
    url = f"sqlite:///{tmp_path}/l.db"
    open_ledger(url).close()
    done = subprocess.run(relay_cmd(url, "nats://127.0.0.1:4222?stream=a.b"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "invalid stream name" in done.stderr and "check --to" in done.stderr


def test_a_message_no_queue_takes_stays_unsent_until_one_is_bound(tmp_path: Path) -> None:
    """RabbitMQ drops a message that no bound queue takes: published mandatory, it is
    returned, counted as refused and kept unsent (failing, with its error), then delivered
    once a queue is bound."""
    require_broker("RabbitMQ", "127.0.0.1", 5672)
    url = f"sqlite:///{tmp_path}/l.db"
    open_ledger(url).close()
    sink = AmqpSink("amqp://guest:guest@127.0.0.1:5672/", f"rt-noq-{uuid.uuid4().hex[:10]}")
    emit(url, [("k", "m-1")])
    log = tmp_path / "relay.log"
    with log.open("w") as out:
        proc = subprocess.Popen(relay_cmd(url, sink.to_url), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        def failing() -> bool:
            ledger = open_ledger(url)
            try:
                (row,) = ledger.outbox_fetch(list(range(32)), 10)
                return row.attempts >= 1
            finally:
                ledger.close()

        wait_for("the unroutable message to be refused", failing, timeout_s=60)
        assert unsent(url) == 1
        sink.declare()  # the exchange and a queue bound to all of it
        seen = sink.drain({"m-1"}, timeout_s=120)
        assert [s.message_id for s in seen][:1] == ["m-1"]
        wait_for("the message to be marked sent", lambda: unsent(url) == 0, timeout_s=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sink.delete()
