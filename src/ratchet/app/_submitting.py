"""What one submit writes: the :class:`SubmitRequest`, its checks and the task row it
becomes (:func:`prepare_task`), with its new id (:func:`new_task_id`)."""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..errors import InvalidArguments, PayloadTooLarge
from ..ledger.base import NewTask
from ..serde import digest, dumps
from ..validation import MAX_KEY_BYTES, RESERVED_PREFIX, check_identifier
from ._flow import flow_fields
from ._taskdef import TaskDefinition

__all__ = ["SubmitRequest", "new_task_id", "prepare_task"]


_ID_LOCK = threading.Lock()
_id_ms = 0  # the millisecond of the last id made by this process
_id_seq = 0  # ids made by this process in that millisecond


def new_task_id() -> str:
    """A 32-hex-char id: 12 chars of millisecond time, 4 of a sequence within the
    millisecond and the process, 16 random: ids sort by creation (one process's ids in the
    order it made them; ordered concurrency keys admit tasks in ``(created_at, id)``
    order, DESIGN §8)."""
    global _id_ms, _id_seq
    ms = int(time.time() * 1000)
    with _ID_LOCK:
        if ms <= _id_ms:  # the same millisecond, or a clock that stepped back
            ms, _id_seq = _id_ms, _id_seq + 1
            if _id_seq > 0xFFFF:
                ms, _id_seq = ms + 1, 0
        else:
            _id_seq = 0
        _id_ms = ms
        seq = _id_seq
    return f"{ms:012x}{seq:04x}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One entry for :meth:`ratchet.App.submit_many`."""

    name: str
    params: Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    run_at: datetime | float | None = None
    delay_s: float = 0.0
    tenant: str | None = None
    version: int | None = None
    """The definition version to pin; ``None``: the newest this app defines."""
    reserved: Mapping[str, Any] | None = None
    """Framework keys stored with the params once they validated (a shard's place, a
    sharded job's count: :mod:`ratchet.shards`); their names hold a ``:``, which no
    parameter name can."""
    queue: str | None = None
    """The queue; ``None``: the task type's (``@app.task(queue=...)``)."""
    priority: int = 0
    """Higher first among a queue's ready tasks."""
    debounce_s: float | None = None
    """Collapse the submits of ``idempotency_key`` within this many seconds into one task."""
    debounce_max_s: float | None = None
    """The latest start of a debounced task, seconds after the group's first submit."""


def prepare_task(definition: TaskDefinition, request: SubmitRequest,
                 max_payload_bytes: int) -> NewTask:
    """The task row ``request`` becomes under ``definition`` (the version it pins), with a
    new id; nothing is written.

    Raises:
        InvalidArguments: params not a mapping or refused by the definition's schema, a
            naive or non-finite ``run_at``, a non-finite ``delay_s``, an idempotency key
            or tenant that cannot be stored.
        PayloadNotSerializable: params that are not plain JSON.
        PayloadTooLarge: params over ``max_payload_bytes`` once encoded.
    """
    if request.params is not None and not isinstance(request.params, Mapping):
        raise InvalidArguments(
            f"params must be a mapping of argument names to values, got "
            f"{type(request.params).__name__}"
        )
    params = dict(request.params or {})
    reserved = [k for k in params if isinstance(k, str) and k.startswith(RESERVED_PREFIX)]
    if reserved:
        # A shard's place and a sharded job's count travel under these keys: a submitter
        # who could set them could fan a job out or misplace a shard.
        raise InvalidArguments(
            f"params of task {request.name!r} may not use the key {reserved[0]!r}: keys "
            f"starting with {RESERVED_PREFIX!r} are Ratchet's own (App.submit_sharded sets "
            "them)")
    params_json = dumps(params, what=f"params of task {request.name!r}")
    definition.validate(params_json)
    if request.reserved:
        params_json = dumps({**params, **request.reserved},
                            what=f"params of task {request.name!r}")
    size = len(params_json.encode("utf-8"))
    if size > max_payload_bytes:
        raise PayloadTooLarge(size, max_payload_bytes)
    run_at_epoch_s: float | None = None
    if isinstance(request.run_at, datetime):
        if request.run_at.tzinfo is None:
            raise InvalidArguments("run_at must be timezone-aware (e.g. datetime.now(UTC))")
        run_at_epoch_s = request.run_at.timestamp()
    elif request.run_at is not None:
        if isinstance(request.run_at, bool) or not isinstance(request.run_at, int | float):
            raise InvalidArguments(
                f"run_at must be an aware datetime or epoch seconds, got {request.run_at!r}"
            )
        try:
            run_at_epoch_s = float(request.run_at)
        except OverflowError:
            raise InvalidArguments(f"run_at is out of range: {request.run_at!r}") from None
    if run_at_epoch_s is not None and not math.isfinite(run_at_epoch_s):
        raise InvalidArguments(f"run_at must be finite, got {request.run_at!r}")
    try:
        delay_ok = isinstance(request.delay_s, int | float) and math.isfinite(request.delay_s)
    except OverflowError:
        delay_ok = False
    if not delay_ok:
        raise InvalidArguments(
            f"delay_s must be a finite number of seconds, got {request.delay_s!r}"
        )
    if request.idempotency_key is not None:
        check_identifier(request.idempotency_key, "idempotency_key", MAX_KEY_BYTES)
    if request.tenant is not None:
        check_identifier(request.tenant, "tenant", MAX_KEY_BYTES)
    flow = flow_fields(definition.flow, definition.name, params, queue=request.queue,
                       priority=request.priority, tenant=request.tenant,
                       debounce_s=request.debounce_s, debounce_max_s=request.debounce_max_s,
                       idempotency_key=request.idempotency_key)
    key, delay_s = request.idempotency_key, max(0.0, request.delay_s)
    if "debounce_key" in flow:
        # The key names the debounce group, not one task for ever: once the group's task
        # started, the next submit opens a new window.
        key, delay_s = None, flow["debounce_s"]
    return NewTask(
        task_id=new_task_id(),
        name=definition.name,
        version=definition.version,
        params_json=params_json,
        params_digest=digest(definition.name, params_json),
        idempotency_key=key,
        max_attempts=definition.retry.max_attempts,
        lease_s=definition.lease_s,
        delay_s=delay_s,
        run_at_epoch_s=None if "debounce_key" in flow else run_at_epoch_s,
        quarantine_after=definition.retry.quarantine_after,
        tenant=request.tenant,
        **flow,
    )
