"""Brokers for the outbox tests: RabbitMQ (127.0.0.1:5672, guest) and NATS with JetStream
(127.0.0.1:4222). A broker that cannot be reached skips its tests with a message, and fails
them under ``CI=true`` (``.ci/run`` starts both)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from outboxsupport import AmqpSink, NatsSink, require_broker

from ratchet.testing import ProcessGroup

AMQP_URL = os.environ.get("RATCHET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("RATCHET_TEST_NATS_URL", "nats://127.0.0.1:4222")


@pytest.fixture
def amqp() -> Iterator[AmqpSink]:
    """A fresh exchange and a durable queue bound to all of it (deleted afterwards)."""
    require_broker("RabbitMQ", "127.0.0.1", 5672)
    sink = AmqpSink(AMQP_URL, f"rt-{uuid.uuid4().hex[:10]}")
    sink.declare()
    yield sink
    sink.delete()


@pytest.fixture
def nats_sink() -> Iterator[NatsSink]:
    """A fresh JetStream stream on its own subject prefix (deleted afterwards)."""
    require_broker("NATS", "127.0.0.1", 4222)
    tag = uuid.uuid4().hex[:10]
    sink = NatsSink(NATS_URL, stream=f"RT{tag}", prefix=f"rt{tag}")
    sink.declare()
    yield sink
    sink.delete()


@pytest.fixture
def procs(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ProcessGroup]:
    """The test's subprocesses; their logs are printed when the test failed."""
    group = ProcessGroup(tmp_path / "procs")
    try:
        yield group
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            print(group.dump())
        group.cleanup()
