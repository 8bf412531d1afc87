"""The JSON HTTP API (``/api/...``): a FastAPI application mounted under ``/api`` by
:func:`ratchet.web.create_app`, its OpenAPI document at ``/api/openapi.json``.

Every route calls the public :class:`~ratchet.control.Control` API and returns its records
(``dataclasses.asdict`` JSON, as ``ratchet ... --json`` prints). Routes are plain ``def``
functions: Starlette runs them on its threadpool, concurrently, against the one Control
(thread-safe: see :class:`~ratchet.control.Control`; the ledgers are).

Open (no token ever): ``GET /api`` (an index of the endpoints), ``/api/health`` (200
when the ledger answers, 503 naming the error otherwise: ``"ledger": "corrupt"`` once any
call of this service found the ledger corrupt), ``/api/openapi.json``.

Reads (:func:`ratchet.web.auth.read_ok`: ``Authorization: Bearer $RATCHET_API_TOKEN``
when a token is configured, open otherwise): ``GET /api/status``, ``/api/tasks``
(``state``, ``type``, ``key``, ages, ``limit``, ``cursor``), ``/api/tasks/{task_id}``
(the task with its timeline), ``/api/tasks/{task_id}/batches`` (its ``ctx.batches``
runs; a sharded job's: its shards'), ``/api/tasks/{task_id}/check`` (whether its item
counts add up: 200 either way, ``ok`` in the body), ``/api/workers``,
``/api/definitions``, ``/api/schedules``, ``/api/pauses``, ``/api/limits`` (concurrency
and rate limits, the latest changes), ``/api/quarantine``, ``/api/late-effects``,
``/api/outbox`` and ``/api/outbox/messages`` (:mod:`ratchet.web.outboxapi`).

Mutations (:func:`ratchet.web.auth.token_ok`: the token when one is configured, else a
loopback peer): ``POST /api/tasks`` (submit, with an optional ``Idempotency-Key``
header), ``POST /api/tasks/{task_id}/cancel``, ``/retry``, ``/resolve``, ``/compensate``,
``POST /api/events`` (an event for the tasks waiting for it; the ``Idempotency-Key``
header is its id), ``POST /api/pauses``, ``POST /api/resume``, ``POST
/api/quarantine/{fingerprint}/replay``. The operator actions take a ``reason`` and record
the operator named by the ``X-Ratchet-Operator`` header (default ``api@<peer
address>``), as an event records its sender: the token is one shared secret, so it proves
the right to act, not who acts.

Errors are :class:`~ratchet.web.models.ErrorBody` JSON: 401 missing / wrong token, 403
submit on a service started without ``--app``, 404 unknown task, 409 wrong state or an
idempotency conflict (with both digests; also the same key and params with another
``tenant`` or pinned ``version``, naming the field), 413 params (or the request body) too large,
422 bad input (the fields in ``errors``; a JSON body with a key twice in one object too:
:mod:`ratchet.web.jsonbody`), 503 ledger unavailable (``ledger_corrupt``: the database
says its data is damaged; ``schema_too_old`` / ``schema_too_new``). The status and code of
every Ratchet error come from :data:`ratchet.errors.ERROR_TABLE`, as the dashboard's do.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations at
# definition time, and some name types local to build_api.
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Mount, Route

from .. import __version__
from ..control import (
    BatchProgress,
    ConservationReport,
    Control,
    ControlOutcome,
    DefinitionView,
    EventReceipt,
    ForkRecord,
    LateEffectView,
    LimitsReport,
    PauseRecord,
    PauseResult,
    QuarantineGroupView,
    ReplayReport,
    ScheduleView,
    StatusReport,
    TaskInfo,
    TaskPage,
    TaskTimeline,
    WorkerView,
)
from ..errors import (
    ERROR_TABLE,
    INTERNAL,
    IdempotencyConflict,
    IllegalTransition,
    InvalidArguments,
    LedgerCorrupt,
    RatchetError,
    UnknownTask,
    error_spec,
)
from ..serde import printable
from ..shards import job_shards, task_shard
from ..states import State
from ..validation import MAX_DURATION_S
from .auth import bearer, read_ok, token_ok
from .jsonbody import DuplicateKeyBody, StrictJsonRoute
from .models import (
    NO_NUL,
    ApiIndex,
    CancelBody,
    CompensateBody,
    EndpointView,
    ErrorBody,
    EventBody,
    FieldError,
    ForkBody,
    HealthBody,
    PauseBody,
    ReplayBody,
    ResolveBody,
    ResumeBody,
    RetryBody,
    SubmitBody,
    SubmitResponse,
)
from .outboxapi import add_outbox_routes
from .settings import WebSettings

__all__ = ["ApiError", "api_index", "build_api", "routes"]

OPERATOR_HEADER = "X-Ratchet-Operator"
"""The header naming the person behind a mutation (recorded as ``by=`` in the audit log)."""

_DESCRIPTIONS = {
    401: "Missing or wrong bearer token (with RATCHET_API_TOKEN set every route needs it "
         "but /health, /openapi.json and the index; without it, a mutation from a "
         "non-loopback peer).",
    403: "Submitting needs the task registry: this service was started without --app.",
    400: "The Host header names a host this service does not answer to (ratchet serve "
         "--allowed-host adds one): a guard against DNS rebinding (error host_not_allowed).",
    404: "No such task (or a path parameter that is empty or holds '/': no such route).",
    408: "The request body did not arrive within the service's body timeout (ratchet "
         "serve --body-timeout-s); the connection is closed.",
    409: "The task is in the wrong state for this action, or the Idempotency-Key belongs "
         "to a task with other params (both digests given), or the ledger refused the "
         "write for what it holds (write_rejected).",
    413: "The params are larger than the ledger's payload limit, or the request body is "
         "larger than the service accepts (ratchet.web.limits).",
    422: "Bad input; the message and errors name the field.",
    503: "The ledger is unavailable (ledger_unavailable: missing, unreachable), its "
         "schema is too old or too new for this service (schema_too_old: run ratchet "
         "migrate; schema_too_new: upgrade Ratchet), or it is corrupt (ledger_corrupt).",
}


class ApiError(Exception):
    """An error answer: HTTP ``status`` with an :class:`ErrorBody`.

    Args:
        status: the HTTP status code.
        error: the stable error code (see :class:`ErrorBody`).
        message: what went wrong and what to do.
        **extra: further :class:`ErrorBody` fields (``task_id``, ``state``, digests).
    """

    def __init__(self, status: int, error: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(error=error, message=message, **extra)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route for these error status codes."""
    return {code: {"model": ErrorBody, "description": _DESCRIPTIONS[code]} for code in codes}


NO_ROUTE: dict[int | str, dict[str, Any]] = {404: {
    "model": ErrorBody,
    "description": "No such route: the fingerprint is empty or holds '/' (an unknown "
                   "fingerprint of 16 hex digits replays nothing: 200)."}}
"""The 404 of ``POST /quarantine/{fingerprint}/replay``."""

BAD_HOST: dict[int | str, dict[str, Any]] = _errors(400)
"""The answer of every route to a ``Host`` it does not serve (:class:`ratchet.web.hosts.
HostGuard`, before the API)."""


def _json_error(status: int, body: ErrorBody, headers: dict[str, str] | None = None
                ) -> JSONResponse:
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def _from_ratchet(exc: RatchetError) -> ApiError:
    """The HTTP answer for a Ratchet error a Control call raised: the status and code of
    its row of :data:`ratchet.errors.ERROR_TABLE`, with the fields the error carries."""
    spec = error_spec(exc)
    message = printable(str(exc))
    if isinstance(exc, IdempotencyConflict):
        return ApiError(spec.http_status, spec.code, message, task_id=exc.task_id,
                        existing_digest=exc.existing_digest, new_digest=exc.new_digest)
    if isinstance(exc, UnknownTask):
        where = "body.name" if exc.version is None else "body.version"
        return ApiError(spec.http_status, spec.code, message,
                        errors=[FieldError(field=where, message=message)])
    if isinstance(exc, InvalidArguments) and exc.fields:
        return ApiError(spec.http_status, spec.code, message, errors=[
            FieldError(field=f"body.{path}", message=printable(problem))
            for path, problem in exc.fields])
    if spec.code == INTERNAL.code:
        message = f"{type(exc).__name__}: {message}"
    return ApiError(spec.http_status, spec.code, message)


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _message(error: Mapping[str, Any]) -> str:
    """A pydantic error's message, said plainly where pydantic's is cryptic."""
    loc = error.get("loc", ())
    if error.get("type") == "string_pattern_mismatch" and loc and loc[-1] == "reason":
        return "must say why (not blank, no NUL): it is kept in the audit log"
    if error.get("type") == "string_pattern_mismatch" and loc and loc[-1] == "fingerprint":
        return "must be the 16 hex digits GET /api/quarantine lists"
    if error.get("type") == "string_pattern_mismatch":
        return ("must not be empty" if error.get("input") == ""
                else "must not contain a NUL character")
    if error.get("type") == "value_error":  # a validator of ratchet.web.models
        return printable(str(error.get("msg", "invalid")).removeprefix("Value error, "))
    return printable(str(error.get("msg", "invalid")))


def _field_error(error: Mapping[str, Any]) -> FieldError:
    """A pydantic / FastAPI error as a :class:`FieldError` (a body that is not JSON is
    ``body``, not FastAPI's ``body.<offset>``)."""
    if error.get("type") == "json_invalid":
        loc = tuple(error.get("loc", ()))
        ctx = error.get("ctx") or {}
        where = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        reason = f": {ctx['error']}" if isinstance(ctx, Mapping) and ctx.get("error") else ""
        return FieldError(field="body",
                          message=printable(f"the body is not valid JSON{reason}{where}"))
    return FieldError(field=_loc(tuple(error.get("loc", ()))), message=_message(error))


def _install_error_handlers(api: FastAPI) -> None:
    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return _json_error(exc.status, exc.body, headers)

    async def on_ratchet(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RatchetError)
        err = _from_ratchet(exc)
        return _json_error(err.status, err.body)

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        fields = [_field_error(e) for e in exc.errors()]
        summary = "; ".join(f"{f.field}: {f.message}" for f in fields[:5])
        return _json_error(422, ErrorBody(error="invalid", message=f"bad input: {summary}",
                                          errors=fields))

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc, DuplicateKeyBody):  # a JSON body with a key twice
            return _json_error(422, ErrorBody(
                error="invalid", message=f"bad input: body: {exc.detail}",
                errors=[FieldError(field="body", message=exc.detail)]))
        if exc.status_code == 400:  # FastAPI could not read the body (bytes that are not text)
            return _json_error(422, ErrorBody(
                error="invalid", message=f"bad input: body: {exc.detail} (send JSON text)",
                errors=[FieldError(field="body", message=str(exc.detail))]))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _json_error(exc.status_code, ErrorBody(error=code, message=str(exc.detail)),
                           dict(exc.headers) if exc.headers else None)

    api.add_exception_handler(ApiError, on_api_error)
    api.add_exception_handler(RatchetError, on_ratchet)
    api.add_exception_handler(RequestValidationError, on_validation)
    api.add_exception_handler(StarletteHTTPException, on_http)


def _header_text(value: str, header: str) -> str:
    """A header value as the client's UTF-8 text (HTTP servers hand header bytes over as
    Latin-1, so ``clé`` would arrive as ``clÃ©`` and not match the same key given to
    ``App.submit``, the CLI or a query parameter).

    Raises:
        ApiError: 422 when the bytes are not UTF-8.
    """
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        message = "must be UTF-8 text"
        raise ApiError(422, "invalid", f"bad input: header.{header}: {message}",
                       errors=[FieldError(field=f"header.{header}", message=message)]
                       ) from None


def _bearer_scheme(settings: WebSettings) -> HTTPBearer | None:
    """The OpenAPI ``bearer`` security scheme when a token is configured (every route that
    checks the token declares it); ``None`` in loopback mode, where none is asked for."""
    if settings.api_token is None:
        return None
    return HTTPBearer(auto_error=False, scheme_name="bearer",
                      description="RATCHET_API_TOKEN: every route needs it but /health, "
                                  "/openapi.json and the index.")


def _read_dependency(settings: WebSettings, scheme: HTTPBearer | None
                     ) -> Callable[..., None] | None:
    """The dependency every read takes when a token is configured (401 without it:
    :func:`ratchet.web.auth.read_ok`); ``None`` in loopback mode (reads are open)."""
    if scheme is None:
        return None

    def reader(request: Request, _credentials: Annotated[Any, Depends(scheme)]) -> None:
        presented = bearer(request.headers.get("authorization"))
        if not read_ok(settings, presented):
            raise ApiError(401, "unauthorized",
                           "this service has RATCHET_API_TOKEN: reads need "
                           "'Authorization: Bearer <RATCHET_API_TOKEN>' too"
                           if presented is None else "wrong bearer token")

    return reader


def _operator_dependency(settings: WebSettings, scheme: HTTPBearer | None
                         ) -> Callable[..., str]:
    """The dependency every mutation takes: checks the rule of :mod:`ratchet.web.auth`
    (401 otherwise) and returns the operator name to audit.

    With a token configured the OpenAPI document declares the bearer scheme on the
    mutations; without one (loopback only) it declares none, since none is asked for.
    """

    def check(request: Request, operator: str | None) -> str:
        peer = request.client.host if request.client else None
        presented = bearer(request.headers.get("authorization"))
        if not token_ok(settings, presented, peer):
            if settings.api_token is None:
                raise ApiError(401, "unauthorized",
                               "without RATCHET_API_TOKEN only loopback clients may mutate")
            raise ApiError(401, "unauthorized",
                           "this mutation needs 'Authorization: Bearer <RATCHET_API_TOKEN>'"
                           if presented is None else "wrong bearer token")
        return (_header_text(operator, OPERATOR_HEADER) if operator is not None
                else f"api@{peer or 'unknown'}")

    operator_header = Header(
        alias=OPERATOR_HEADER, min_length=1, max_length=1024, pattern=NO_NUL,
        description="Who acts (recorded with the reason in the audit log); default "
                    "api@<peer address>.")

    if scheme is None:
        def loopback(
            request: Request,
            operator: Annotated[str | None, operator_header] = None,
        ) -> str:
            return check(request, operator)

        return loopback

    def with_token(
        request: Request,
        _credentials: Annotated[Any, Depends(scheme)],
        operator: Annotated[str | None, operator_header] = None,
    ) -> str:
        return check(request, operator)

    return with_token


def _same_request_or_conflict(body: SubmitBody, task: TaskInfo, key: str) -> None:
    """A submit the Idempotency-Key matched to an existing ``task`` (same name and params:
    the ledger's digest) must also agree on what the digest leaves out: the tenant, and
    the pinned version when the request gives one (without one it takes the newest, which
    may have changed since). Else a 409 ``idempotency_conflict`` naming each difference
    (both digests, which are equal). ``delay_s`` cannot be compared: the task stores an
    absolute ``run_at``, so a replay with another delay answers the original (its
    ``run_at`` says when it runs).

    Raises:
        ApiError: 409 on a difference.
    """
    differs: list[FieldError] = []
    if body.tenant != task.tenant:
        differs.append(FieldError(
            field="body.tenant",
            message=f"the task has tenant {task.tenant!r}, this request {body.tenant!r}"))
    if body.version is not None and body.version != task.version:
        differs.append(FieldError(
            field="body.version",
            message=f"the task has version {task.version}, this request {body.version}"))
    if not differs:
        return
    what = "; ".join(f"{d.field.removeprefix('body.')}: {d.message}" for d in differs)
    spec = ERROR_TABLE[IdempotencyConflict]
    raise ApiError(
        spec.http_status, spec.code, printable(
            f"idempotency key {key!r} already belongs to task {task.task_id} with the same "
            f"name and params (digest {task.params_digest}) but another request: {what}. "
            "Use a new key for a different request, or resend the original one."),
        errors=differs, task_id=task.task_id, existing_digest=task.params_digest,
        new_digest=task.params_digest)


def _unchanged_is_conflict(outcome: ControlOutcome) -> ControlOutcome:
    """A cancel / retry that changed nothing (the task's state does not allow it) is a
    409 naming the state; ``done`` and ``requested`` are answers."""
    if outcome.outcome == "unchanged":
        spec = ERROR_TABLE[IllegalTransition]
        raise ApiError(spec.http_status, spec.code, printable(outcome.message),
                       task_id=outcome.task_id, state=outcome.state.value)
    return outcome


def build_api(control: Control, settings: WebSettings) -> FastAPI:
    """The API application (mount it under ``/api``; its OpenAPI document is then
    ``/api/openapi.json`` with server ``/api``).

    Args:
        control: every route's Control (shared by the threadpool's threads).
        settings: the service settings (the token rule of :mod:`ratchet.web.auth`).
    """
    token_mode = settings.api_token is not None
    api = FastAPI(
        title="Ratchet API", version=__version__, openapi_url="/openapi.json",
        docs_url=None, redoc_url=None, responses=BAD_HOST,
        description="Submit, inspect and operate Ratchet tasks. When the service has a "
                    "token, every route but /health, /openapi.json and the index needs "
                    "'Authorization: Bearer $RATCHET_API_TOKEN' (reads included); without "
                    "one it listens on loopback only, reads are open and loopback clients "
                    "may mutate. Operator actions take a reason and are audited with the "
                    f"operator named by {OPERATOR_HEADER}.")
    api.router.route_class = StrictJsonRoute  # a JSON body with a key twice is a 422
    _install_error_handlers(api)
    scheme = _bearer_scheme(settings)
    Operator = Annotated[str, Depends(_operator_dependency(settings, scheme))]
    TaskId = Annotated[str, Path(max_length=1024, pattern=NO_NUL, description="The task id.")]
    reader = _read_dependency(settings, scheme)
    reads = APIRouter(dependencies=[Depends(reader)] if reader is not None else [],
                      route_class=StrictJsonRoute)

    def read_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
        """A read's error responses: 401 too when a token is configured."""
        return _errors(*((401,) if token_mode else ()), *codes)

    # ------------------------------------------------------------------ open

    @api.get("/health", response_model=HealthBody,
             responses={503: {"model": HealthBody,
                              "description": "The ledger does not answer, or is corrupt "
                                             "(the error says why)."}},
             summary="Whether the service and its ledger answer (no token needed)")
    def health(request: Request) -> JSONResponse:
        try:
            schema_version = control.schema_version()
            now = control.ledger_now()
            # Two small reads see a damaged header, not a damaged task page: report what
            # any other call of this service found too.
            corrupt = control.ledger_corruption()
            if corrupt is not None:
                raise corrupt
        except RatchetError as exc:
            # The message names where the ledger is (a path, a host): with a token
            # configured, only a client that sends it reads more than the error class.
            detail = (f": {exc}" if read_ok(settings, bearer(request.headers.get(
                "authorization"))) else " (send the bearer token for the message)")
            down = HealthBody(status="error", version=__version__,
                              ledger="corrupt" if isinstance(exc, LedgerCorrupt) else "down",
                              error=printable(f"{type(exc).__name__}{detail}"))
            return JSONResponse(down.model_dump(mode="json"), status_code=503,
                                headers={"Cache-Control": "no-store"})
        return JSONResponse(HealthBody(status="ok", ledger="up", version=__version__,
                                       schema_version=schema_version,
                                       ledger_now=now).model_dump(mode="json"),
                            headers={"Cache-Control": "no-store"})

    @api.get("/", response_model=ApiIndex,
             summary="This index: the endpoints, the OpenAPI document, the auth rule")
    def index(request: Request) -> ApiIndex:
        return api_index(api, settings, request.scope.get("root_path", ""))

    # ------------------------------------------------------------------ reads

    @reads.get("/status", response_model=StatusReport, responses=read_errors(422, 503),
               summary="Counts per type and state, capacity, unknowns, audit counters, "
                       "pauses")
    def get_status(
        drain_within_s: Annotated[float | None, Query(
            gt=0, le=MAX_DURATION_S, allow_inf_nan=False,
            description="Seconds to drain each backlog in: each type's slots_needed "
                        "(the slots that drain it within that time while tasks keep "
                        "arriving). Without it, slots_needed is null.")] = None,
    ) -> StatusReport:
        return control.status(drain_within_s=drain_within_s)

    @reads.get("/tasks", response_model=TaskPage, responses=read_errors(422, 503),
               summary="List tasks, newest first (keyset pagination)")
    def list_tasks(
        state: Annotated[list[State] | None, Query(
            description="Only these states (repeat the parameter for several).")] = None,
        task_type: Annotated[str | None, Query(alias="type", max_length=1024, pattern=NO_NUL,
                                               description="Only this task type.")] = None,
        key: Annotated[str | None, Query(max_length=1024, pattern=NO_NUL,
                                         description="The submit idempotency key.")] = None,
        older_than_s: Annotated[float | None, Query(ge=0, allow_inf_nan=False,
                                                    description="Created more than this many "
                                                                "seconds ago.")] = None,
        newer_than_s: Annotated[float | None, Query(ge=0, allow_inf_nan=False,
                                                    description="Created less than this many "
                                                                "seconds ago.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Tasks per page.")] = 50,
        cursor: Annotated[str | None, Query(
            max_length=2048, pattern=NO_NUL,
            description="next_cursor of the previous page.")] = None,
    ) -> TaskPage:
        return control.list_tasks(state=state, name=task_type, key=key,
                                  older_than_s=older_than_s, newer_than_s=newer_than_s,
                                  limit=limit, cursor=cursor)

    @reads.get("/tasks/{task_id}", response_model=TaskTimeline,
               responses=read_errors(404, 422, 503),
               summary="A task with its timeline (events, steps, effects, late effects)")
    def get_task(task_id: TaskId) -> TaskTimeline:
        return control.inspect(task_id)

    @reads.get("/tasks/{task_id}/batches", response_model=list[BatchProgress],
               responses=read_errors(404, 422, 503),
               summary="A task's batch runs: watermark, total, counts, rate, ETA (a "
                       "sharded job: its shards' runs)")
    def get_batches(task_id: TaskId) -> list[BatchProgress]:
        task = control.get(task_id)  # 404 for no such task
        if job_shards(task.params) is None:
            return control.batch_progress(task_id)
        shards = [c.task_id for c in control.children(task_id)
                  if task_shard(c.params) is not None]
        return [*control.batch_progress(task_id), *control.batch_progress_many(shards)]

    @reads.get("/tasks/{task_id}/check", response_model=ConservationReport,
               responses=read_errors(404, 422, 503),
               summary="Whether a task's item counts add up (200 either way: see ok)")
    def get_check(task_id: TaskId) -> ConservationReport:
        return control.check(task_id)

    @reads.get("/workers", response_model=list[WorkerView], responses=read_errors(503),
               summary="The worker registry")
    def get_workers() -> list[WorkerView]:
        return control.workers()

    @reads.get("/definitions", response_model=list[DefinitionView],
               responses=read_errors(503), summary="Task definitions workers registered")
    def get_definitions() -> list[DefinitionView]:
        return control.definitions()

    @reads.get("/schedules", response_model=list[ScheduleView], responses=read_errors(503),
               summary="Periodic schedules: next tick, last fired tick, missed ticks")
    def get_schedules() -> list[ScheduleView]:
        return control.schedules()

    @reads.get("/pauses", response_model=list[PauseRecord], responses=read_errors(503),
               summary="The active pauses")
    def get_pauses() -> list[PauseRecord]:
        return control.pauses()

    @reads.get("/limits", response_model=LimitsReport, responses=read_errors(503),
               summary="Concurrency limits with their use, rate limits with the tasks "
                       "they hold back, the latest limit changes")
    def get_limits() -> LimitsReport:
        return control.limits()

    @reads.get("/quarantine", response_model=list[QuarantineGroupView],
               responses=read_errors(422, 503),
               summary="Quarantined tasks grouped by error fingerprint")
    def get_quarantine(
        limit: Annotated[int, Query(ge=1, le=10_000, description="At most this many "
                                                                  "groups.")] = 100,
    ) -> list[QuarantineGroupView]:
        return control.quarantine_list(limit)

    @reads.get("/late-effects", response_model=list[LateEffectView],
               responses=read_errors(422, 503),
               summary="Calls stale holders sent after a takeover (possible duplicates)")
    def get_late_effects(
        task_id: Annotated[str | None, Query(max_length=1024, pattern=NO_NUL,
                                             description="Only this task's.")] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    ) -> list[LateEffectView]:
        return control.late_effects(task_id, limit)

    add_outbox_routes(reads, control, read_errors)
    api.include_router(reads)

    # ------------------------------------------------------------------ mutations

    @api.post("/tasks", status_code=201, response_model=SubmitResponse,
              responses={200: {"model": SubmitResponse,
                               "description": "The Idempotency-Key already names this task "
                                              "(same name and params): the original."},
                         **_errors(401, 403, 408, 409, 413, 422, 503)},
              summary="Submit a task (Idempotency-Key: same key and params → the original)")
    def submit(
        body: SubmitBody,
        response: Response,
        _operator: Operator,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key", min_length=1, max_length=1024, pattern=NO_NUL,
            description="The task's idempotency key: the same key with the same name and "
                        "params returns the original task (200); with other params, 409 "
                        "naming both digests.")] = None,
    ) -> SubmitResponse:
        if not control.can_submit:
            raise ApiError(
                403, "submit_unavailable",
                "submitting needs the application's task registry (to check the task name "
                "and params): start the service with `ratchet serve --app MODULE:APP`")
        if idempotency_key is not None:
            idempotency_key = _header_text(idempotency_key, "Idempotency-Key")
        handle = control.submit(body.name, body.params, idempotency_key=idempotency_key,
                                delay_s=body.delay_s, tenant=body.tenant,
                                version=body.version)
        task = control.get(handle.task_id)
        if not handle.created:
            _same_request_or_conflict(body, task, idempotency_key or "")
            response.status_code = 200
        return SubmitResponse(task_id=handle.task_id, name=handle.name,
                              created=handle.created, task=task)

    @api.post("/tasks/{task_id}/cancel", response_model=ControlOutcome,
              responses=_errors(401, 404, 408, 409, 413, 422, 503),
              summary="Cancel a task (running: at its next step boundary)")
    def cancel(task_id: TaskId, body: CancelBody, operator: Operator) -> ControlOutcome:
        return _unchanged_is_conflict(control.cancel(task_id, reason=body.reason, by=operator))

    @api.post("/tasks/{task_id}/retry", response_model=ControlOutcome,
              responses=_errors(401, 404, 408, 409, 413, 422, 503),
              summary="Run a FAILED task again, from its checkpoint")
    def retry(task_id: TaskId, body: RetryBody, operator: Operator) -> ControlOutcome:
        return _unchanged_is_conflict(control.retry(task_id, reason=body.reason, by=operator))

    @api.post("/tasks/{task_id}/compensate", response_model=ControlOutcome,
              responses=_errors(401, 404, 408, 409, 413, 422, 503),
              summary="Undo a FAILED task's completed effects (then COMPENSATED)")
    def compensate(task_id: TaskId, body: CompensateBody, operator: Operator
                   ) -> ControlOutcome:
        return _unchanged_is_conflict(control.compensate(task_id, reason=body.reason,
                                                         by=operator))

    @api.post("/tasks/{task_id}/fork", status_code=201, response_model=ForkRecord,
              responses=_errors(401, 404, 408, 409, 413, 422, 503),
              summary="Fork an ended task from a step: a new task, linked to it")
    def fork(task_id: TaskId, body: ForkBody, operator: Operator) -> ForkRecord:
        new_id = control.fork(task_id, body.from_step, version=body.version,
                              reason=body.reason, by=operator)
        record = control.fork_links(new_id).forked_from
        if record is None:  # written in the fork's own transaction: never
            raise ApiError(500, INTERNAL.code, f"fork {new_id} has no link")
        return record

    @api.post("/events", status_code=201, response_model=EventReceipt,
              responses={200: {"model": EventReceipt,
                               "description": "The Idempotency-Key names an event already "
                                              "sent: the same event, delivered once "
                                              "(duplicate true, nothing woken)."},
                         **_errors(401, 408, 409, 413, 422, 503)},
              summary="Send an event to the tasks waiting for it (Idempotency-Key: its id)")
    def send_event(
        body: EventBody,
        response: Response,
        operator: Operator,
        idempotency_key: Annotated[str | None, Header(
            alias="Idempotency-Key", min_length=1, max_length=1024, pattern=NO_NUL,
            description="The event's id: a resend of the same event with it is "
                        "delivered once (200, duplicate true); another event with it is "
                        "refused (422). Default: a new id.")] = None,
    ) -> EventReceipt:
        if idempotency_key is not None:
            idempotency_key = _header_text(idempotency_key, "Idempotency-Key")
        receipt = control.send_event(body.name, key=body.key, payload=body.payload,
                                     event_id=idempotency_key, by=operator)
        if receipt.duplicate:
            response.status_code = 200
        return receipt

    @api.post("/tasks/{task_id}/resolve", response_model=TaskInfo,
              responses=_errors(401, 404, 408, 409, 413, 422, 503),
              summary="Settle an UNKNOWN task's open effect (done / not-done / give-up)")
    def resolve(task_id: TaskId, body: ResolveBody, operator: Operator) -> TaskInfo:
        try:
            return control.resolve(task_id, body.outcome, body.result, reason=body.reason,
                                   by=operator)
        except IllegalTransition as exc:  # not UNKNOWN: say which state it is in
            spec = error_spec(exc)
            raise ApiError(spec.http_status, spec.code, printable(str(exc)), task_id=task_id,
                           state=control.get(task_id).state.value) from None

    @api.post("/pauses", response_model=PauseResult,
              responses=_errors(401, 404, 408, 413, 422, 503),
              summary="Pause everything, a task type or one task")
    def pause(body: PauseBody, operator: Operator) -> PauseResult:
        return control.pause(body.scope, body.target, reason=body.reason, by=operator)

    @api.post("/resume", response_model=PauseResult,
              responses=_errors(401, 408, 413, 422, 503),
              summary="End a pause (optionally re-admitting at a rate)")
    def resume(body: ResumeBody, operator: Operator) -> PauseResult:
        return control.resume(body.scope, body.target, reason=body.reason, by=operator,
                              rate_per_s=body.rate_per_s)

    @api.post("/quarantine/{fingerprint}/replay", response_model=ReplayReport,
              responses={**_errors(401, 408, 413, 422, 503), **NO_ROUTE},
              summary="Re-queue one fingerprint's quarantined tasks at a rate (or dry run)")
    def replay(
        fingerprint: Annotated[str, Path(pattern=r"^[0-9a-fA-F]{16}$",
                                         description="16 hex digits (GET /api/quarantine).")],
        body: ReplayBody,
        operator: Operator,
    ) -> ReplayReport:
        return control.quarantine_replay(fingerprint, body.rate_per_s, dry_run=body.dry_run,
                                         reason=body.reason, by=operator, limit=body.limit)

    return api


def api_index(api: FastAPI, settings: WebSettings, prefix: str) -> ApiIndex:
    """The index of ``GET /api``: every operation of ``api``'s OpenAPI document (so it
    cannot drift from the routes), where that document and the health check are, and the
    auth rule in force.

    Args:
        api: the application :func:`build_api` made.
        settings: the service settings (the rule in force).
        prefix: where ``api`` is mounted, e.g. ``/api`` (behind a proxy's root path too).
    """
    endpoints = [
        EndpointView(method=method.upper(), path=prefix + path,
                     summary=str(op.get("summary", "")), needs_token="security" in op)
        for path, ops in api.openapi().get("paths", {}).items() if path != "/"
        for method, op in ops.items()]
    rule = ("RATCHET_API_TOKEN is set: every endpoint but the health check, this index "
            "and the OpenAPI document needs 'Authorization: Bearer <token>'"
            if settings.api_token is not None else
            "no RATCHET_API_TOKEN: loopback only; reads are open, mutations from loopback "
            "need no token")
    return ApiIndex(name="Ratchet API", version=__version__,
                    openapi=f"{prefix}/openapi.json", health=f"{prefix}/health", auth=rule,
                    endpoints=endpoints)


def routes(control: Control, settings: WebSettings) -> list[BaseRoute]:
    """The API's routes: :func:`build_api` mounted at ``/api``, and its index at ``/api``
    itself (not a redirect to ``/api/``)."""
    api = build_api(control, settings)

    async def index(request: Request) -> JSONResponse:
        body = api_index(api, settings, request.scope.get("root_path", "") + "/api")
        return JSONResponse(body.model_dump(mode="json"))

    return [Route("/api", index, methods=["GET"]), Mount("/api", app=api)]
