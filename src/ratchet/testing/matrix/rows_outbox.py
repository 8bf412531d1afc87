"""Row 10 of the crash-point matrix (DESIGN §6): the outbox relay killed after the broker
confirmed a batch and before it marked the batch sent. A clean relay publishes the batch
again with the same message ids; a consumer that deduplicates by message id sees every
emitted message exactly once, in order per key.

It needs a broker (``run_matrix(broker=...)``, ``ratchet crash-matrix --broker URL``): the
relays are real ``ratchet relay`` processes publishing to an exchange and queue, or a
stream, of the run's own (:mod:`~ratchet.testing.matrix.brokers`), read back by a consumer
of the row's own.
"""

from __future__ import annotations

import re
import secrets
import sys
from collections import Counter
from typing import Any

from ...outbox import OUTBOX_PARTITIONS
from ...states import State
from ..processes import ManagedProcess, wait_for
from .app import EMIT
from .brokers import Delivery, Sink, sink_for
from .context import RowContext
from .rig import SIGKILLED, MatrixRig, RowSkipped, expect

__all__ = ["EMIT_PARAMS", "NEEDS_BROKER", "row10"]

EMIT_PARAMS: dict[str, Any] = {"n": 20, "keys": 4}
"""Row 10's task: twenty messages over four keys."""

NEEDS_BROKER = "needs --broker URL (amqp:// or nats://)"
"""Row 10's detail when the run has no broker."""

RELAY_WAIT_S = 90.0
"""How long a relay may take to start, publish and (the crashing one) die, seconds."""

_STOPPED = re.compile(r"stopped: (\d+) published, (\d+) marked sent")


def _relay(rig: MatrixRig, sink: Sink, name: str, crash_at: str | None = None
           ) -> ManagedProcess:
    """Start ``ratchet relay`` on the world's ledger, publishing to ``sink``."""
    cmd = [sys.executable, "-m", "ratchet.cli.main", "relay", "--ledger", rig.ledger_url,
           "--to", sink.to_url, "--lease", "2s", "--batch", "100", "--name", name]
    return rig.procs.spawn(name, cmd, rig.env(RATCHET_CRASH_AT=crash_at))


def _unsent(rig: MatrixRig) -> list[str]:
    """The message ids of the world's outbox not marked sent, in outbox order."""
    rows = rig.ledger.outbox_fetch(list(range(OUTBOX_PARTITIONS)), 100_000)
    return [r.message_id for r in rows]


def _first_per_key(seen: list[Delivery]) -> dict[str, list[str]]:
    """Per key, the message ids in the order of their first arrival."""
    out: dict[str, list[str]] = {}
    ids: set[str] = set()
    for d in seen:
        if d.message_id not in ids:
            ids.add(d.message_id)
            out.setdefault(d.key or "", []).append(d.message_id)
    return out


def row10(ctx: RowContext) -> str:
    """Outbox published, not marked sent: a task emits twenty messages over four keys; a
    relay publishes them, the broker confirms, and the relay is SIGKILLed at
    ``relay.after_publish`` (nothing marked sent). A clean relay publishes them again with
    the same message ids and marks them sent. At the broker: every message arrived, the
    re-published ones twice with the same id (RabbitMQ) or once (JetStream drops the copy
    by ``Nats-Msg-Id``), first arrivals in emit order per key; deduplicated by message id,
    exactly the emitted set.

    Raises:
        RowSkipped: the run has no broker.
        RowFailed: a check did not hold, or the broker cannot be used.
    """
    if ctx.broker is None:
        raise RowSkipped(NEEDS_BROKER)
    rig = ctx.world("row10")
    sink = sink_for(ctx.broker, f"{ctx.worlds.token}{secrets.token_hex(2)}")
    sink.declare()
    try:
        return _run(ctx, rig, sink)
    finally:
        sink.delete()


def _run(ctx: RowContext, rig: MatrixRig, sink: Sink) -> str:
    n = EMIT_PARAMS["n"]
    task_id = rig.app.submit(EMIT, EMIT_PARAMS).task_id
    worker = rig.worker("worker")
    info = rig.wait_state(task_id, timeout_s=RELAY_WAIT_S)
    expect(info.state is State.SUCCEEDED, f"the emitting task ended {info.state.value}")
    expect(worker.stop() == 0, "the worker did not stop gracefully")
    emitted: list[tuple[str, str]] = [(k, m) for k, m in info.result["messages"]]
    ids = [m for _, m in emitted]
    expect(len(set(ids)) == n, f"the task emitted {len(set(ids))} distinct ids, not {n}")
    expect(_unsent(rig) == ids, "the outbox does not hold the emitted messages in order")
    per_key: dict[str, list[str]] = {}
    for key, mid in emitted:
        per_key.setdefault(key, []).append(mid)

    crashing = _relay(rig, sink, "relay-crashing", crash_at="relay.after_publish")
    status = crashing.wait(RELAY_WAIT_S)
    expect(status == SIGKILLED,
           f"the relay was to die at relay.after_publish, exited {status}")
    expect(_unsent(rig) == ids, "after the kill, messages were marked sent (or lost) in the "
                                "ledger")
    first = sink.read(sink.pending(), 30.0)
    republished = {d.message_id for d in first}
    expect(bool(republished), "the killed relay's batch is not at the broker")
    expect(republished <= set(ids), f"unexpected messages at the broker: "
                                     f"{sorted(republished - set(ids))[:3]}")

    clean = _relay(rig, sink, "relay")
    wait_for("the clean relay to mark every message sent", lambda: not _unsent(rig),
             RELAY_WAIT_S)
    expect(clean.stop(30.0) == 0, f"the clean relay did not stop gracefully: {clean.returncode}")
    stopped = _STOPPED.search(clean.log())
    published = int(stopped.group(1)) if stopped else -1
    expect(published == n, f"the clean relay published {published} messages, not {n}")

    amqp = sink.to_url.startswith("amqp")
    again = n if amqp else n - len(republished)
    seen = first + sink.read(again, 30.0)
    expect(sink.pending() == 0, f"{sink.pending()} more messages at the broker than published")
    arrivals = Counter(d.message_id for d in seen)
    wanted = {m: 2 if amqp and m in republished else 1 for m in ids}
    expect(dict(arrivals) == wanted,
           "arrivals per message id differ: "
           f"{ {m: c for m, c in arrivals.items() if wanted.get(m) != c} }")
    expect(_first_per_key(seen) == per_key, "first arrivals are not in emit order per key")
    expect(set(arrivals) == set(ids), "deduplicated by message id, not the emitted set")
    ctx.counts.update(emitted=n, deliveries=len(seen), distinct=len(arrivals),
                      duplicates=len(seen) - len(arrivals), republished=len(republished),
                      broker="rabbitmq" if amqp else "jetstream")
    dedupe = ("arrived again with the same message id" if amqp else
              "were dropped by JetStream by Nats-Msg-Id")
    return (f"relay killed after the broker confirmed {len(republished)} messages, before "
            f"marking them sent; the clean relay published them again and they {dedupe}; "
            f"deduplicated by message id: the {n} emitted, in order per key")
