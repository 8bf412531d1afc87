"""The transactional outbox's rules, without I/O (DESIGN §6, row 10): what a message is
(:class:`NewMessage`), its stable id (:func:`message_id_for`), the partition a relay leases
for it (:func:`partition_of`) and the checks of a topic and a key.

A message is written in the same transaction as the work that decided it (a task's fenced
checkpoint, or a caller's own transaction) and published later by a relay, which marks it
sent only once the broker confirmed it. A relay that dies between the two publishes it
again with the same message id: consumers deduplicate by that id (at-least-once
delivery, exactly-once effect on a consumer that keeps the ids it has seen).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArguments, PayloadTooLarge
from .serde import dumps
from .validation import MAX_KEY_BYTES, check_identifier

__all__ = ["MAX_TOPIC_BYTES", "OUTBOX_PARTITIONS", "NewMessage", "check_topic",
           "message_id_for", "new_message", "partition_of"]

OUTBOX_PARTITIONS = 32
"""Partitions of the outbox, fixed by the schema (``outbox_leases`` holds one row each): a
relay leases whole partitions, and every message of one key is in one partition."""

MAX_TOPIC_BYTES = 200
"""Upper bound of a topic in UTF-8 bytes (RabbitMQ routing keys and NATS subjects both
take it)."""

_TOPIC = re.compile(r"[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One outbox row to write.

    Attributes:
        message_id: the id consumers deduplicate by (the broker's ``message_id`` /
            ``Nats-Msg-Id``).
        topic: the routing key (RabbitMQ) or subject (NATS).
        key: the ordering key: messages of one key reach the broker in outbox order;
            None: no order with any other message.
        part: the partition (:func:`partition_of`).
        payload_json: the message, JSON text.
        task_id: the task that emitted it, or None (a caller's :meth:`ratchet.App.emit`).
    """

    message_id: str
    topic: str
    key: str | None
    part: int
    payload_json: str
    task_id: str | None = None


def check_topic(topic: object) -> str:
    """Return ``topic`` if a broker can route on it: dot-separated words of ASCII letters,
    digits, ``_`` and ``-`` (``order.paid``), at most :data:`MAX_TOPIC_BYTES`. The narrow
    set is what both RabbitMQ routing keys and NATS subjects accept without wildcards
    (``*``, ``>``, ``#``) or whitespace.

    Raises:
        InvalidArguments: anything else.
    """
    if not isinstance(topic, str) or not topic:
        raise InvalidArguments(f"an outbox topic must be a non-empty str, got {topic!r:.80}")
    if len(topic) > MAX_TOPIC_BYTES or _TOPIC.fullmatch(topic) is None:
        raise InvalidArguments(
            f"outbox topic {topic!r:.80} is not routable: use dot-separated words of "
            f"letters, digits, '_' and '-' (e.g. 'order.paid'), at most {MAX_TOPIC_BYTES} "
            "characters")
    return topic


def message_id_for(task_id: str, stored_name: str) -> str:
    """The id of the message a task emits at checkpoint ``stored_name`` (its occurrence,
    e.g. ``ratchet:emit:order.paid#2``): 32 hex chars of SHA-256 over both. It does not
    depend on the generation, so every holder that reaches the same emit derives the
    same id."""
    return hashlib.sha256(f"{task_id}\x00{stored_name}".encode()).hexdigest()[:32]


def partition_of(key: str | None, message_id: str) -> int:
    """The partition of a message: CRC-32 of its key (of its id when it has no key) modulo
    :data:`OUTBOX_PARTITIONS`. Stable across processes and releases (not Python's
    ``hash``), since rows store it."""
    basis = key if key is not None else message_id
    return zlib.crc32(basis.encode("utf-8", "surrogatepass")) % OUTBOX_PARTITIONS


def new_message(topic: str, message: Any, *, key: str | None, message_id: str,
                max_payload_bytes: int, task_id: str | None = None,
                what: str = "outbox message") -> NewMessage:
    """The :class:`NewMessage` of an emit, checked.

    Args:
        topic: see :func:`check_topic`.
        message: plain JSON (a mapping, list, str, number, bool or None).
        key: the ordering key, an identifier of at most ``MAX_KEY_BYTES`` bytes, or None.
        message_id: the message's id, an identifier of at most ``MAX_KEY_BYTES`` bytes.
        max_payload_bytes: the largest encoded message allowed (the app's payload limit).
        task_id: the emitting task, if any.

    Raises:
        InvalidArguments: a topic, key or message id that cannot be stored or routed.
        PayloadNotSerializable: ``message`` is not plain JSON.
        PayloadTooLarge: the encoded message is over ``max_payload_bytes``.
    """
    check_topic(topic)
    if key is not None:
        check_identifier(key, "outbox key", MAX_KEY_BYTES)
    check_identifier(message_id, "message_id", MAX_KEY_BYTES)
    if isinstance(message, Mapping):
        message = dict(message)
    payload = dumps(message, what=f"{what} on {topic!r}")
    size = len(payload.encode("utf-8"))
    if size > max_payload_bytes:
        raise PayloadTooLarge(size, max_payload_bytes)
    return NewMessage(message_id=message_id, topic=topic, key=key,
                      part=partition_of(key, message_id), payload_json=payload,
                      task_id=task_id)
