"""Request bodies and the error body of the JSON API (:mod:`ratchet.web.api`).

The responses are the :class:`~ratchet.control.Control` records themselves (frozen
dataclasses; their JSON is ``dataclasses.asdict``, the same as ``ratchet ... --json``), so
the OpenAPI document is generated from the records the API returns and cannot drift from
them. Bodies refuse unknown fields (a typo is a 422 naming it, never silently ignored).

Size limits are :mod:`ratchet.validation`'s, counted as it counts them: UTF-8 bytes
(:func:`utf8_at_most`; the schema's ``maxLength`` in characters is the same number, a
bound no value within the byte limit passes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..control import TaskInfo
from ..validation import (
    MAX_DELAY_S,
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    MAX_RATE_PER_S,
    MAX_VERSION,
)

__all__ = [
    "ApiIndex",
    "CancelBody",
    "CompensateBody",
    "EndpointView",
    "ErrorBody",
    "EventBody",
    "FieldError",
    "ForkBody",
    "HealthBody",
    "PauseBody",
    "ReplayBody",
    "ResolveBody",
    "ResumeBody",
    "RetryBody",
    "SubmitBody",
    "SubmitResponse",
]

NO_NUL = r"^[^\x00]+$"
"""Identifiers (names, ids, keys) are stored text: no NUL."""

MAX_REASON_BYTES = 4 * MAX_KEY_BYTES
"""Upper bound, in UTF-8 bytes, of an operator's reason (the one
:mod:`ratchet.reconcile` checks too)."""


def utf8_at_most(limit: int) -> AfterValidator:
    """A pydantic validator refusing text over ``limit`` UTF-8 bytes (as
    :func:`ratchet.validation.check_identifier` counts; a lone surrogate counts its three
    bytes here and is refused by that check after)."""
    def check(value: str) -> str:
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise ValueError(f"is {size} bytes in UTF-8, over the limit of {limit}")
        return value

    return AfterValidator(check)


Reason = Annotated[
    str,
    Field(min_length=1, max_length=MAX_REASON_BYTES, pattern=r"^[^\x00]*\S[^\x00]*$",
          description="Why (kept in the audit log with the operator); not blank."),
    utf8_at_most(MAX_REASON_BYTES),
]
"""The ``reason`` every mutation must give."""

TaskName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_BYTES, pattern=NO_NUL,
          description="A task name the service's app registers."),
    utf8_at_most(MAX_NAME_BYTES),
]

Key = Annotated[
    str,
    Field(max_length=MAX_KEY_BYTES, pattern=NO_NUL),
    utf8_at_most(MAX_KEY_BYTES),
]
"""A key-sized identifier: a task id, a pause target (the pattern refuses it empty)."""

Tenant = Annotated[Key, Field(min_length=1)]



class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitBody(_Body):
    """``POST /api/tasks``: one task to submit (``App.submit``)."""

    name: TaskName
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the task function (plain JSON), validated "
                    "against its signature or params model.")
    version: int | None = Field(
        default=None, ge=1, le=MAX_VERSION,
        description="Definition version to pin (default: the newest the app defines).")
    tenant: Tenant | None = Field(default=None,
                               description="Whose work it is (tenant limits count it).")
    delay_s: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_S, allow_inf_nan=False,
                           description="Earliest start, seconds from now.")


class SubmitResponse(BaseModel):
    """The answer to a submit: 201 when this request created the task, 200 when the
    ``Idempotency-Key`` already named it (same name and params)."""

    task_id: str
    name: str
    created: bool = Field(description="True: this request wrote the task; False: a replay.")
    task: TaskInfo


class CancelBody(_Body):
    """``POST /api/tasks/{task_id}/cancel``."""

    reason: Reason


class RetryBody(_Body):
    """``POST /api/tasks/{task_id}/retry``."""

    reason: Reason


class CompensateBody(_Body):
    """``POST /api/tasks/{task_id}/compensate``: undo a ``FAILED`` task's completed
    effects."""

    reason: Reason


class ForkBody(_Body):
    """``POST /api/tasks/{task_id}/fork``: a new task from an ended task's history before
    one of its checkpoints (``Control.fork``)."""

    from_step: Annotated[Key, Field(min_length=1, description=(
        "The stored checkpoint name to run again from (name: its first occurrence; "
        "name#N: the N-th; ratchet:end for after the last recorded one)."))]
    version: int | None = Field(
        default=None, ge=1, le=MAX_VERSION,
        description="Definition version the fork pins (default: the original's).")
    reason: Reason


class EventBody(_Body):
    """``POST /api/events``: an event for the tasks waiting for it (``ctx.wait_for_event``);
    the ``Idempotency-Key`` header is its id."""

    name: Annotated[
        str,
        Field(min_length=1, max_length=MAX_NAME_BYTES, pattern=NO_NUL,
              description="The event name (what ctx.wait_for_event waits for)."),
        utf8_at_most(MAX_NAME_BYTES),
    ]
    key: Annotated[Key, Field(min_length=1, description="What the event is about, e.g. "
                                                        "an order id.")]
    payload: Any = Field(default=None, description="What the wait returns: plain JSON "
                                                   "(default null), at most the ledger's "
                                                   "payload limit once encoded.")


class ResolveBody(_Body):
    """``POST /api/tasks/{task_id}/resolve``: settle an ``UNKNOWN`` task's open effect."""

    outcome: Literal["done", "not-done", "give-up"] = Field(
        description="done: the effect happened (result = its return value); not-done: it "
                    "did not (called again with the same key); give-up: nobody can tell "
                    "(the task ends FAILED).")
    result: Any = Field(default=None, description="With outcome done only: the effect's "
                                                  "result, plain JSON.")
    reason: Reason


class PauseBody(_Body):
    """``POST /api/pauses``: pause everything, a task type or one task."""

    scope: Literal["all", "type", "task"]
    target: Key | None = Field(default=None,
                               description="The task type (scope type) or task id (scope "
                                           "task); none for all.")
    reason: Reason


class ResumeBody(_Body):
    """``POST /api/resume``: end the active pause of a scope."""

    scope: Literal["all", "type", "task"]
    target: Key | None = None
    reason: Reason
    rate_per_s: float | None = Field(
        default=None, gt=0.0, le=MAX_RATE_PER_S, allow_inf_nan=False,
        description="Re-admit the paused tasks at this many per second (default: at once).")


class ReplayBody(_Body):
    """``POST /api/quarantine/{fingerprint}/replay``."""

    rate_per_s: float = Field(gt=0.0, le=MAX_RATE_PER_S, allow_inf_nan=False,
                              description="Admission rate, tasks per second.")
    dry_run: bool = Field(default=False, description="Only list what would be replayed.")
    reason: Annotated[str, Field(max_length=MAX_REASON_BYTES, pattern=r"^[^\x00]*$"),
                      utf8_at_most(MAX_REASON_BYTES)] | None = Field(
        default=None, description="Why (audited); required unless dry_run.")
    limit: int = Field(default=10_000, ge=1, le=100_000,
                       description="At most this many tasks.")


class FieldError(BaseModel):
    """One wrong input field."""

    field: str = Field(description="Where: body.reason, query.limit, header.idempotency-key.")
    message: str


class ErrorBody(BaseModel):
    """Every error the API returns (4xx and 5xx).

    ``error`` is a stable code: ``host_not_allowed`` (400: the ``Host`` header names a host
    the service does not answer to, :mod:`ratchet.web.hosts`), ``unauthorized`` (401),
    ``submit_unavailable`` (403),
    ``not_found`` (404), ``method_not_allowed`` (405), ``wrong_state`` (409),
    ``idempotency_conflict`` (409, with both digests), ``write_rejected`` (409),
    ``payload_too_large`` (413), ``invalid`` (422, the fields in ``errors``),
    ``internal`` / ``config_error`` (500), ``ledger_unavailable`` (503),
    ``schema_too_old`` / ``schema_too_new`` (503), ``ledger_corrupt`` (503: the database
    says the ledger's data is damaged). A Ratchet error's status and code are its row of
    :data:`ratchet.errors.ERROR_TABLE`.
    """

    error: str
    message: str
    errors: list[FieldError] = Field(default_factory=list)
    task_id: str | None = None
    state: str | None = None
    existing_digest: str | None = Field(
        default=None, description="idempotency_conflict: the digest stored with the task.")
    new_digest: str | None = Field(
        default=None, description="idempotency_conflict: this request's digest.")


class HealthBody(BaseModel):
    """``GET /api/health`` (no token needed): 200 when the ledger answers, 503 otherwise
    (``ledger``: ``down``, or ``corrupt`` when a call of this service found it damaged).

    ``ledger_now`` and ``schema_version`` come from two small reads (the ledger clock and
    the schema version), never from the task tables.
    """

    status: Literal["ok", "error"]
    ledger: Literal["up", "down", "corrupt"]
    schema_version: int | None = Field(default=None,
                                       description="The ledger's schema version (up).")
    ledger_now: float | None = Field(default=None,
                                     description="The ledger clock, epoch seconds (up).")
    version: str = Field(description="This Ratchet's version.")
    error: str | None = Field(default=None, description="Why the ledger is down (down).")


class EndpointView(BaseModel):
    """One route of the API in :class:`ApiIndex`."""

    method: str
    path: str = Field(description="Absolute path, e.g. /api/tasks/{task_id}.")
    summary: str
    needs_token: bool = Field(description="True: send 'Authorization: Bearer <token>'.")


class ApiIndex(BaseModel):
    """``GET /api``: where things are (no token needed)."""

    name: str
    version: str
    openapi: str = Field(description="Path of the OpenAPI document.")
    health: str = Field(description="Path of the health check.")
    auth: str = Field(description="The rule in force (ratchet.web.auth).")
    endpoints: list[EndpointView]
