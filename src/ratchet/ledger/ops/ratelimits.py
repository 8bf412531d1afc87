"""Rate limits as operators and workers write them (DESIGN §8, flow control): the
``rate_limits`` rows (registered from the code by workers, set and cleared by operators,
audited), the tasks they hold back, a downstream's token for one effect call, and the
live tasks per queue. The claim's spending of a task type's tokens is
:mod:`ratchet.ledger.ops.claims`.

Precedence: an operator's row (``source = 'operator'``) wins over the code's until an
operator clears it; the clear puts back the limit the newest registered definition of the
type declares (the stored spec), and the next registration keeps it right."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArguments, StaleGeneration
from ...ratelimit import MAX_PER_S, BucketState, refill
from ...serde import dumps
from ...validation import MAX_NAME_BYTES, check_identifier, check_int
from ..base import DefinitionSpec, FlowCount, RateLimitSetting
from ..dialect import Tx
from ..rows import (
    DEFINITIONS_OF,
    FLOW_COUNTS,
    RATE_HELD,
    RATE_LIMIT_CLEAR,
    RATE_LIMIT_LIST,
    RATE_LIMIT_SET,
    RATE_TAKE,
    RATE_TAKE_WAIT,
    insert_audit,
)
from ..shapes import RateSettingRow
from .core import EngineCore
from .schema import FLOW

__all__ = ["MAX_BURST", "RateLimits", "code_rate_limit", "register_code_limits"]

MAX_BURST = 2**31 - 1
"""The largest bucket a rate limit may have, tasks (PostgreSQL ``integer``)."""


def _setting(row: RateSettingRow) -> RateLimitSetting:
    return RateLimitSetting(row.scope, row.name, float(row.rate_per_s), int(row.burst),
                            row.key_param, row.source, int(row.version),
                            float(row.updated_at), row.updated_by, row.reason)


def _check_key_param(tx: Tx, name: str, key_param: str) -> None:
    """Refuse a key parameter the task type's newest stored definition does not have (a
    misspelt one would put every task in the bucket of its missing value). A type no worker
    registered yet, or whose params cannot be told, is not checked.

    Raises:
        InvalidArguments: the definition's params schema lists its fields and not this one.
    """
    stored = sorted(DEFINITIONS_OF.all(tx, {"names": [name]}), key=lambda r: int(r.version))
    if not stored:
        return
    try:
        spec = json.loads(stored[-1].spec)
        fields = spec["params_schema"]["properties"]
    except (ValueError, KeyError, TypeError):
        return
    if isinstance(fields, dict) and fields and key_param not in fields:
        raise InvalidArguments(
            f"task type {name!r} has no parameter {key_param!r} to key its rate limit by "
            f"(its parameters: {', '.join(sorted(fields))})")


def code_rate_limit(spec_json: str) -> tuple[float, int, str | None] | None:
    """``(per_s, burst, key_param)`` of the rate limit a definition's stored spec declares
    (``TaskDefinition.spec()["flow"]["rate_limit"]``), or None: none declared, or a spec
    of a release before flow control, or not readable."""
    try:
        spec = json.loads(spec_json)
        limit = spec.get("flow", {}).get("rate_limit") if isinstance(spec, dict) else None
        if not isinstance(limit, dict):
            return None
        per_s, burst, key = float(limit["per_s"]), int(limit["burst"]), limit.get("key_param")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not (math.isfinite(per_s) and per_s > 0 and burst >= 1):
        return None
    return per_s, burst, key if isinstance(key, str) else None


def _write_code_limit(tx: Tx, name: str, limit: tuple[float, int, str | None] | None,
                      holder: str) -> None:
    """Upsert (or drop) the code's row of one type; an operator's row is left alone."""
    if limit is None:
        tx.execute("rate_limit_code_drop", {"name": name})
        return
    per_s, burst, key_param = limit
    tx.execute("rate_limit_code", {"name": name, "per_s": per_s, "burst": burst,
                                   "key_param": key_param, "now": tx.now, "holder": holder})


def register_code_limits(tx: Tx, holder: str, definitions: Sequence[DefinitionSpec]) -> None:
    """In a worker's registration transaction: per task type it registers, the rate limit
    its newest registered version declares becomes the type's ``source = 'code'`` row
    (written only when it changed), unless an operator's row stands; a type whose code
    declares none loses its code row. With two workers of different code running at once,
    the last registration wins (each worker registers when it starts)."""
    newest: dict[str, DefinitionSpec] = {}
    for d in definitions:
        if d.name not in newest or d.version > newest[d.name].version:
            newest[d.name] = d
    for name in sorted(newest):
        _write_code_limit(tx, name, code_rate_limit(newest[name].spec_json), holder)


class RateLimits:
    """The rate-limit operations of the :class:`~ratchet.ledger.base.Ledger` contract."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def rate_limits(self) -> list[RateLimitSetting]:
        """See :meth:`Ledger.rate_limits` (none on a ledger before flow control)."""
        if not self.core.schema.has(FLOW):
            return []
        rows = self.core.dialect.run(lambda tx: RATE_LIMIT_LIST.all(tx), write=False)
        return [_setting(r) for r in rows]

    def rate_held(self) -> dict[str, int]:
        """See :meth:`Ledger.rate_held`."""
        if not self.core.schema.has(FLOW):
            return {}
        rows = self.core.dialect.run(lambda tx: RATE_HELD.all(tx, {"now": tx.now}),
                                     write=False)
        return {r.name: int(r.n) for r in rows}

    def flow_counts(self) -> list[FlowCount]:
        """See :meth:`Ledger.flow_counts` (none on a ledger before flow control)."""
        if not self.core.schema.has(FLOW):
            return []
        rows = self.core.dialect.run(lambda tx: FLOW_COUNTS.all(tx, {"now": tx.now}),
                                     write=False)
        return [FlowCount(r.name, r.queue, str(r.state), r.flow_wait, int(r.n),
                          int(r.due or 0)) for r in rows]

    def set_rate_limit(self, name: str, per_s: float, burst: int, key_param: str | None,
                       operator: str, reason: str) -> RateLimitSetting:
        """See :meth:`Ledger.set_rate_limit`. Audited as ``rate_limit_set`` (task id
        ``limit:rate:NAME``) with the old and new values, in the same transaction."""
        _check_rate(name, per_s, burst, key_param)
        self.core.schema.require(FLOW, "rate limits")

        def body(tx: Tx) -> RateLimitSetting:
            if key_param is not None:
                _check_key_param(tx, name, key_param)
            old = next((r for r in RATE_LIMIT_LIST.all(tx)
                        if r.scope == "type" and r.name == name), None)
            # An override of the rate keeps the buckets' key unless it names another.
            key = key_param if key_param is not None or old is None else old.key_param
            row = RATE_LIMIT_SET.first(tx, {
                "name": name, "per_s": per_s, "burst": burst, "key_param": key,
                "now": tx.now, "operator": operator, "reason": reason})
            assert row is not None
            new = _setting(row)
            insert_audit(tx, [(_audit_id(name), tx.now, "rate_limit_set", None, None, None,
                               None, dumps({
                                   "operator": operator, "reason": reason, "scope": "type",
                                   "name": name, "rate_per_s": per_s, "burst": burst,
                                   "key_param": key, "version": new.version,
                                   "previous": _values(old)}))])
            tx.execute("rate_recheck", {"name": name})
            return new

        return self.core.dialect.run(body)

    def clear_rate_limit(self, name: str, operator: str, reason: str) -> RateLimitSetting:
        """See :meth:`Ledger.clear_rate_limit`. Audited as ``rate_limit_cleared``; the
        limit the newest stored definition of the type declares (if any) becomes its row
        again in the same transaction."""
        self.core.schema.require(FLOW, "rate limits")

        def body(tx: Tx) -> RateLimitSetting:
            row = RATE_LIMIT_CLEAR.first(tx, {"name": name})
            if row is None:
                in_code = any(r.scope == "type" and r.name == name
                              for r in RATE_LIMIT_LIST.all(tx))
                raise InvalidArguments(
                    f"task type {name!r} has no operator's rate limit to clear"
                    + (" (its limit is declared in its code: change the code, or set one "
                       "to override it)" if in_code else ""))
            old = _setting(row)
            stored = sorted(DEFINITIONS_OF.all(tx, {"names": [name]}),
                            key=lambda r: int(r.version))
            code = code_rate_limit(stored[-1].spec) if stored else None
            if code is not None:
                _write_code_limit(tx, name, code, operator)
            insert_audit(tx, [(_audit_id(name), tx.now, "rate_limit_cleared", None, None,
                               None, None, dumps({
                                   "operator": operator, "reason": reason, "scope": "type",
                                   "name": name, "previous": _values(row),
                                   "code": None if code is None else {
                                       "rate_per_s": code[0], "burst": code[1],
                                       "key_param": code[2]}}))])
            tx.execute("rate_recheck", {"name": name})
            return old

        return self.core.dialect.run(body)

    def rate_take(self, task_id: str, generation: int, name: str, key: str, per_s: float,
                  burst: int) -> float:
        """See :meth:`WorkerLedger.rate_take`."""

        def body(tx: Tx) -> float:
            params: dict[str, Any] = {"id": task_id, "generation": generation, "name": name,
                                      "key": key, "per_s": per_s, "burst": burst,
                                      "now": tx.now}
            if RATE_TAKE.first(tx, params) is not None:
                return 0.0
            found = RATE_TAKE_WAIT.first(tx, params)
            if found is None or found.generation != generation or found.state != "RUNNING":
                raise StaleGeneration(task_id, generation, f"rate token of {name}")
            state = (None if found.tokens is None or found.updated_at is None
                     else BucketState(float(found.tokens), float(found.updated_at)))
            tokens = refill(state, tx.now, per_s, burst)
            return max(0.001, (1.0 - tokens) / per_s)

        return self.core.dialect.run(body)


def _values(row: RateSettingRow | None) -> dict[str, Any] | None:
    """A row's figures for an audit detail."""
    if row is None:
        return None
    return {"rate_per_s": float(row.rate_per_s), "burst": int(row.burst),
            "key_param": row.key_param, "source": row.source}


def _audit_id(name: str) -> str:
    """The ``task_id`` of a type's rate-limit audit rows (``limit:rate:NAME``: in the
    range ``ratchet limits`` lists)."""
    return f"limit:rate:{name}"


def _check_rate(name: str, per_s: float, burst: int, key_param: str | None) -> None:
    """Refuse a rate limit that cannot be stored (InvalidArguments)."""
    check_identifier(name, "task type", MAX_NAME_BYTES)
    if (isinstance(per_s, bool) or not isinstance(per_s, int | float)
            or not math.isfinite(per_s) or not 0 < per_s <= MAX_PER_S):
        raise InvalidArguments(
            f"a rate must be above 0 and at most {MAX_PER_S:g}/s, got {per_s!r}")
    check_int(burst, "burst", minimum=1, maximum=MAX_BURST)
    if key_param is not None:
        check_identifier(key_param, "key parameter", MAX_NAME_BYTES)
