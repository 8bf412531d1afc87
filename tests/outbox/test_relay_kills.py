"""Relays killed with SIGKILL at random moments (also at ``relay.after_publish``: confirmed,
not marked) while messages keep being emitted, and RabbitMQ restarted once mid-run: the
broker has every message at least once, per key first occurrences in outbox order, and
exactly once after dedupe by message id."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from outboxsupport import (
    AmqpSink,
    NatsSink,
    Producer,
    check_delivery,
    expected_of,
    plan,
    relay_cmd,
    unsent,
)
from pgsupport import private_schema

from ratchet.testing import ManagedProcess, ProcessGroup, wait_for

KILLS = 20
LEASE = "0.5s"
CRASH_WAIT_S = 20.0
"""How long a relay armed at ``relay.after_publish`` may take to get there after it first
held partitions (it needs a confirmed publish: rows in its partitions, a round or two)
before it is SIGKILLed like the others."""


def _rabbit(action: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", action], check=True, capture_output=True,
                   timeout=60)


def _kill_run(ledger_url: str, to_url: str, procs: ProcessGroup,
              restart_rabbit: bool) -> int:
    """Four relays at a time, each started as one ends. A relay is SIGKILLed at a random
    moment 0.1-1.0 s after it first held partitions; one armed at ``relay.after_publish``
    (four in ten) is left to kill itself there, SIGKILLed only if it has not within
    :data:`CRASH_WAIT_S`. Returns the kills (by the test or at the point)."""
    rng = random.Random(23)
    rows = plan(10, 100, "kill")
    producer = Producer(ledger_url, rows, chunk=20, pause_s=0.3)
    kills = at_point = n = 0
    armed: set[ManagedProcess] = set()

    def spawn() -> ManagedProcess:
        nonlocal n
        env: dict[str, str | None] = {}
        name = "relay"
        if rng.random() < 0.4:
            env = {"RATCHET_CRASH_AT": "relay.after_publish",
                   "RATCHET_CRASH_SKIP": str(rng.randrange(2))}
            name = "crashing-relay"
        n += 1
        relay = procs.spawn(f"{name}-{n}", relay_cmd(ledger_url, to_url, lease=LEASE,
                                                     batch=50, name=name), env)
        if env:
            armed.add(relay)
        return relay

    live: dict[ManagedProcess, float | None] = {spawn(): None, spawn(): None}
    producer.start()
    while kills < KILLS:
        # Starting a relay takes seconds (imports), so the kill moment is timed from when
        # it first held partitions. An armed relay is not killed at a random moment: a
        # publish takes longer than the 0.1 s it might get on a loaded machine, and then
        # no relay would reach its point.
        time.sleep(0.05)
        if restart_rabbit and kills == KILLS // 2:
            _rabbit("stop_app")
            _rabbit("start_app")
            restart_rabbit = False
        for relay, kill_at in list(live.items()):
            if not relay.alive():
                assert relay.returncode == -signal.SIGKILL, relay.describe()
                at_point += 1
            elif kill_at is None:
                if "holds " in relay.log():
                    live[relay] = time.monotonic() + (
                        CRASH_WAIT_S if relay in armed else rng.uniform(0.1, 1.0))
                continue
            elif time.monotonic() >= kill_at:
                relay.kill()
            else:
                continue
            kills += 1
            del live[relay]
        while len(live) < 4:
            live[spawn()] = None
    producer.join(60)
    assert producer.error is None and not producer.is_alive()
    assert at_point >= 1, "no relay reached relay.after_publish"
    for relay in live:
        relay.kill()
    last = procs.spawn("relay-last", relay_cmd(ledger_url, to_url, lease=LEASE))
    wait_for("the last relay holding every partition",
             lambda: "holds 32 partitions" in last.log(), timeout_s=60)
    wait_for("every row marked sent", lambda: unsent(ledger_url) == 0, timeout_s=60)
    assert last.stop() == 0, last.describe()
    return kills


@pytest.mark.slow
def test_rabbitmq_sees_every_message_in_order_per_key_through_kills_and_a_restart(
        amqp: AmqpSink, procs: ProcessGroup) -> None:
    with private_schema("rt_relay") as (url, _):
        assert _kill_run(url, amqp.to_url, procs, restart_rabbit=True) >= KILLS
        rows = plan(10, 100, "kill")
        report = check_delivery(amqp.drain({m for _, m in rows}), expected_of(rows))
    assert report.unique == len(rows)


@pytest.mark.slow
def test_jetstream_sees_every_message_in_order_per_key_through_kills(
        nats_sink: NatsSink, procs: ProcessGroup, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    assert _kill_run(url, nats_sink.to_url, procs, restart_rabbit=False) >= KILLS
    rows = plan(10, 100, "kill")
    report = check_delivery(nats_sink.drain({m for _, m in rows}), expected_of(rows))
    assert report.unique == len(rows)
