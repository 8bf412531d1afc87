"""Every error Ratchet raises, in one tree.

::

    RatchetError
    ├── ConfigError                    malformed ledger URL, durability level, limits
    ├── SubmitError                    submit refused; nothing was written
    │   ├── UnknownTask                no task registered under that name
    │   ├── InvalidArguments           params do not bind to the task's signature
    │   ├── PayloadNotSerializable     params are not plain JSON
    │   ├── PayloadTooLarge            encoded params exceed the size limit
    │   └── IdempotencyConflict        same idempotency key, different params digest
    ├── LedgerError                    the storage layer
    │   ├── LedgerUnavailable          cannot open / reach the ledger
    │   ├── LedgerCorrupt              the database says its data is damaged: restore it
    │   ├── WriteRejected              the database refused this write (not an outage)
    │   ├── SchemaTooNew               ledger written by a newer Ratchet; left untouched
    │   ├── SchemaTooOld               a read-only call needs a newer schema (ratchet migrate)
    │   ├── TaskNotFound               no task with that id
    │   └── IllegalTransition          the state machine (DESIGN §3) forbids the move
    ├── FenceError                     this worker may no longer act for a task
    │   ├── StaleGeneration            a newer claim exists; the write changed nothing
    │   ├── TokenRejected              the target refused a lower fencing token
    │   └── LeaseLost                  the lease cannot be confirmed; no new effects
    ├── TaskFailure                    raised by task code to classify a failure (DESIGN §7)
    │   ├── TransientError             retry with backoff
    │   │   └── TimeLimitExceeded      an attempt ran past its task type's time_limit_s
    │   ├── PermanentError             fail now, no retry (dead-letter)
    │   │   ├── NonDeterministicReplay a replay called other checkpoints than recorded
    │   │   └── TransactionMisuse      a transaction step's code ended its transaction
    │   ├── OverloadError              downstream overloaded: back off harder
    │   │   └── CircuitOpen            the downstream's breaker is open: not sent, try later
    │   └── OutcomeUnknownError        the call may or may not have happened: look up first
    ├── EffectOutcomeUnknown           lookup could not settle an effect; task goes UNKNOWN
    ├── UndecodableData                stored or given JSON text cannot be decoded
    ├── ContextUsedInAnotherProcess    a task context used from a process its task forked
    └── WaitTimeout                    ``App.wait`` gave up before a terminal state

Driver errors (``sqlite3.Error``, ``psycopg.Error``) are converted at the ledger boundary with
``raise ... from exc`` so callers only ever catch ``RatchetError`` subclasses.

Each class has one row in :data:`ERROR_TABLE` (:class:`ErrorSpec`: HTTP status, error code,
CLI exit status); every face answers through :func:`error_spec`, so the API, the dashboard
and the command line agree on what an error means. The fields a face needs are attributes
of the error (``UnknownTask.version``, ``InvalidArguments.fields``, the digests of
``IdempotencyConflict``): no face parses a message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "ConfigError",
    "ContextUsedInAnotherProcess",
    "EffectOutcomeUnknown",
    "FenceError",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidArguments",
    "LeaseLost",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerUnavailable",
    "NonDeterministicReplay",
    "EventTimeout",
    "ChildFailed",
    "OutcomeUnknownError",
    "OverloadError",
    "CircuitOpen",
    "PayloadNotSerializable",
    "PayloadTooLarge",
    "PermanentError",
    "RatchetError",
    "SchemaTooNew",
    "SchemaTooOld",
    "StaleGeneration",
    "SubmitError",
    "TaskFailure",
    "TaskNotFound",
    "TimeLimitExceeded",
    "TokenRejected",
    "TransactionMisuse",
    "TransientError",
    "UndecodableData",
    "UnknownTask",
    "WaitTimeout",
    "WriteRejected",
]


class RatchetError(Exception):
    """Root of every error Ratchet raises."""


class ConfigError(RatchetError):
    """A setting (ledger URL, durability level, size limit) is malformed."""


class SubmitError(RatchetError):
    """A submission was refused before anything was written to the ledger."""


class UnknownTask(SubmitError):
    """No task is registered under the given name.

    Attributes:
        name: the name that was asked for.
        known: the names the app does know, sorted (with ``version``: the versions of
            that name it defines).
        version: the version that was asked for when the name is known but that version
            is not (the API then names ``body.version``); ``None`` when the name itself
            is unknown.
    """

    def __init__(self, name: str, known: list[str], version: int | None = None) -> None:
        self.name = name
        self.known = known
        self.version = version
        hint = ", ".join(known) if known else "none registered"
        if version is not None:
            super().__init__(
                f"unknown task {name!r} version {version!r}; this app defines: {hint}. "
                f"Register it with @app.task(name={name!r}, version={version!r}) in the "
                "module the app is imported from."
            )
            return
        super().__init__(
            f"unknown task {name!r}; registered tasks: {hint}. "
            "Register it with @app.task(name=...) in the module the app is imported from."
        )


class InvalidArguments(SubmitError):
    """Arguments of a Ratchet call are invalid: params that do not bind to the task
    function's signature, a malformed task name or idempotency key
    (:func:`ratchet.validation.check_identifier`), a bad ``run_at`` / ``delay_s``, an operator
    verdict or reason that is not allowed.

    Args:
        message: what is wrong and how to fix it.
        fields: the wrong fields when the check knows them, as ``(path, message)`` pairs:
            ``path`` is the dotted place in the call's arguments (``"params.amount_cents"``,
            ``"params"`` for the params object itself), ``message`` what is wrong there
            (``"Input should be a valid integer (got '5')"``). Empty when unknown.

    Attributes:
        fields: as given, a tuple.
    """

    def __init__(self, message: str = "",
                 fields: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.fields: tuple[tuple[str, str], ...] = tuple(fields)


class PayloadNotSerializable(SubmitError):
    """The params (or a step/effect result) cannot be encoded as plain JSON.

    Ratchet never pickles user data; convert values to str/int/float/bool/None/list/dict.
    """


class PayloadTooLarge(SubmitError):
    """The JSON-encoded params exceed the configured limit.

    Attributes:
        size_bytes: encoded size.
        limit_bytes: the configured ``max_payload_bytes``.
    """

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"payload is {size_bytes} bytes, over the limit of {limit_bytes} bytes; "
            "store large data elsewhere and pass a reference, or raise "
            "App(max_payload_bytes=...) / RATCHET_MAX_PAYLOAD_BYTES"
        )


class IdempotencyConflict(SubmitError):
    """The idempotency key is already used by a task with different params (DESIGN §5).

    Attributes:
        key: the idempotency key.
        existing_digest: params digest stored with the existing task.
        new_digest: params digest of the refused submission.
        task_id: id of the existing task.
    """

    def __init__(self, key: str, existing_digest: str, new_digest: str, task_id: str) -> None:
        self.key = key
        self.existing_digest = existing_digest
        self.new_digest = new_digest
        self.task_id = task_id
        super().__init__(
            f"idempotency key {key!r} already belongs to task {task_id} with params digest "
            f"{existing_digest}; this submission has digest {new_digest}. "
            "Use a new key for a different request, or resend the original params."
        )


class LedgerError(RatchetError):
    """The ledger (storage layer) failed or refused an operation."""


class LedgerUnavailable(LedgerError):
    """The ledger cannot be opened or reached (missing directory, dead server, locked file)."""


class LedgerCorrupt(LedgerError):
    """The database reports that the ledger's stored data is damaged (SQLite
    ``SQLITE_CORRUPT`` / ``SQLITE_NOTADB`` on a file that was a database; PostgreSQL SQLSTATE
    ``XX001`` data_corrupted / ``XX002`` index_corrupted).

    Not a :class:`LedgerUnavailable`: waiting does not repair it, so nothing retries it. A
    worker stops claiming and exits with :data:`EXIT_LEDGER_CORRUPT`; ``ratchet`` commands
    print it and exit with that status; ``/api/health`` answers 503 ``"ledger": "corrupt"``.

    Args:
        where: the ledger (SQLite path, PostgreSQL host/database/schema; no password).
        detail: what the database said, with its code (``database disk image is malformed
            [SQLITE_CORRUPT]``).
        remedy: a further way out for this database (SQLite: ``sqlite3 PATH .recover``),
            said after the default (stop every process using it, restore from a backup).

    Attributes:
        where, detail: as given.
    """

    def __init__(self, where: str, detail: str, remedy: str | None = None) -> None:
        self.where = where
        self.detail = detail
        super().__init__(
            f"ledger {where} is corrupt: {detail}. Stop every worker and service using it, "
            "then restore it from a backup" + (f", or {remedy}" if remedy else "")
            + " (nothing retries a corrupt ledger)"
        )


class WriteRejected(LedgerError):
    """The database refused one write for what it holds (a value over an index's row limit,
    a byte sequence the column's encoding forbids), not because it is unreachable.

    Retrying the same write cannot succeed; a caller that batched it with other writes
    should apply those without it (the worker's group commit does).
    """


class SchemaTooNew(LedgerError):
    """The ledger was written by a newer schema version; it is refused and never modified."""

    def __init__(self, found: int, supported: int, where: str) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"ledger {where} has schema version {found}, but this Ratchet supports up to "
            f"{supported}; upgrade Ratchet to open it (the ledger was not modified)"
        )


class SchemaTooOld(LedgerError):
    """A read-only caller of this release needs a newer schema than the ledger has (it
    never migrates: ``ratchet migrate``, or any worker of this release, upgrades it)."""

    def __init__(self, found: int, needed: int, what: str) -> None:
        self.found = found
        self.needed = needed
        super().__init__(
            f"{what} needs ledger schema version {needed}, but the ledger is at {found}: "
            "run `ratchet migrate` (a worker of this release also does it when it starts); "
            "nothing was changed"
        )


class TaskNotFound(LedgerError):
    """No task with the given id exists in the ledger."""


class IllegalTransition(LedgerError):
    """The transition table (DESIGN §3) does not allow this state change."""


class FenceError(RatchetError):
    """This worker may no longer act on behalf of a task."""


class StaleGeneration(FenceError):
    """A write carried an old fencing generation; the ledger changed nothing.

    Raised in the stale worker. The rejection is audited and counted (DESIGN §4).
    """

    def __init__(self, task_id: str, generation: int, operation: str) -> None:
        self.task_id = task_id
        self.generation = generation
        self.operation = operation
        super().__init__(
            f"stale generation {generation} for task {task_id}: {operation} rejected "
            "(another worker holds a newer claim)"
        )


class TokenRejected(FenceError):
    """The target refused a request because its fencing token is lower than the highest it
    has seen for the key (Kleppmann's fencing at the storage side; DESIGN §5).

    An effect's ``call`` or ``lookup`` raises it (``ctx.effect(..., fenced=True)``): nothing
    executed, and a newer claim of the task exists, so the worker abandons the attempt like
    a :class:`StaleGeneration`.

    Attributes:
        key: the effect's idempotency key.
        token: the token the request carried.
        highest: the highest token the target has seen for ``key``, if it said.
    """

    def __init__(self, key: str, token: int, highest: int | None = None) -> None:
        self.key = key
        self.token = token
        self.highest = highest
        seen = f" (highest seen: {highest})" if highest is not None else ""
        super().__init__(
            f"the target rejected fencing token {token} for key {key!r}{seen}: a newer "
            "holder of the task has reached it"
        )


class LeaseLost(FenceError):
    """The worker cannot confirm its lease (renewal failed or the safe window ran out).

    No new side effects may start; the task will be taken over after the lease expires.
    """


class TaskFailure(RatchetError):
    """Base for exceptions task code raises to classify a failure (DESIGN §7)."""


class TransientError(TaskFailure):
    """A failure expected to go away: retry with exponential backoff within the budget.

    Attributes:
        retry_after_s: earliest sensible retry in seconds, if known (the backoff is at least this).
    """

    def __init__(self, message: str = "transient failure", retry_after_s: float | None = None):
        self.retry_after_s = retry_after_s
        super().__init__(message)


class TimeLimitExceeded(TransientError):
    """An attempt ran past its task type's time limit (``@app.task(time_limit_s=...)``).

    The worker's watchdog ends the attempt at the limit (DESIGN §7, time limits): a failed
    attempt with ``error_class`` ``"time_limit"`` (:data:`ratchet.retry.TIME_LIMIT`),
    retried with backoff while attempts remain, else ``FAILED`` (``UNKNOWN`` while an
    effect's intent is open). The task thread cannot be killed; this is raised in it at its
    next ``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` so it stops there.

    Attributes:
        task_id: the task.
        attempt: the attempt (1-based) that ran out of time.
        max_attempts: attempts the task may make.
        time_limit_s: the limit, seconds.
    """

    def __init__(
        self, task_id: str, attempt: int, max_attempts: int, time_limit_s: float
    ) -> None:
        self.task_id = task_id
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.time_limit_s = time_limit_s
        super().__init__(
            f"task {task_id}: attempt {attempt} of {max_attempts} ran past its time limit "
            f"of {time_limit_s:g} s (time_limit_s)"
        )


class PermanentError(TaskFailure):
    """A failure retrying cannot fix (bad parameters, permission): fail now, dead-letter."""


class NonDeterministicReplay(PermanentError):
    """A replay called steps and effects differently from the recorded history (DESIGN §5,
    occurrences; Temporal calls it a non-determinism error).

    Raised at the first checkpoint that differs: another kind or name at the same position
    of the task's code path, or an effect occurrence with another idempotency key. A
    permanent failure: running again replays the same history. The recorded value is never
    reused for a different call.

    Attributes:
        task_id: the task.
        position: 0-based position of the checkpoint in the task's code path (the message
            counts from 1).
        recorded: what the history holds there (e.g. ``"step 'item' occurrence 2"``).
        new: what this run called.
    """

    def __init__(self, task_id: str, position: int, recorded: str, new: str) -> None:
        self.task_id = task_id
        self.position = position
        self.recorded = recorded
        self.new = new
        super().__init__(
            f"non-deterministic replay of task {task_id} at checkpoint {position + 1} of its "
            "code path: the "
            f"recorded history has {recorded}, this run called {new}; the code between "
            "checkpoints must make the same calls in the same order on every attempt (put "
            "what varies inside a step)"
        )


class EventTimeout(PermanentError):
    """``ctx.wait_for_event`` reached its ``timeout_s`` without the event (DESIGN §3,
    waits). The timeout is a checkpoint: a replay raises it again at the same wait, so
    when the task body does not catch it the task fails permanently (a saga's cue to
    compensate).

    Attributes:
        name: the event's name.
        key: the event's key.
        timeout_s: the timeout the wait was given, seconds.
    """

    def __init__(self, name: str, key: str, timeout_s: float | None) -> None:
        self.name = name
        self.key = key
        self.timeout_s = timeout_s
        super().__init__(f"no event {name!r} with key {key!r} within {timeout_s:g} s"
                         if timeout_s is not None else
                         f"no event {name!r} with key {key!r}")


class ChildFailed(PermanentError):
    """A child task awaited with ``ctx.gather`` / ``ctx.wait`` ended without success
    (``FAILED``, ``CANCELLED`` or ``COMPENSATED``). Its outcome is a checkpoint of the
    parent: a replay raises the same.

    Attributes:
        child_id: the child's task id.
        state: the state it ended in (its name).
        error: its last error (None when it has none).
    """

    def __init__(self, child_id: str, state: str, error: str | None) -> None:
        self.child_id = child_id
        self.state = state
        self.error = error
        super().__init__(f"child task {child_id} ended {state}"
                         + (f": {error}" if error else ""))


class TransactionMisuse(PermanentError):
    """The function of a transaction step (``ctx.transaction``) or fenced step
    (``ratchet.fencing.fenced_step``) ended the transaction it was given
    (``commit()``/``rollback()``/``close()``, ``COMMIT`` or ``ROLLBACK`` sent as SQL,
    ``executescript``), left it aborted after a failed statement it caught (PostgreSQL),
    or a checkpoint (``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` / ``fenced_step``)
    was called inside a step's or transaction step's function: its writes and the step's
    checkpoint could no longer commit together, or a replay would skip it. A permanent
    failure: the task's code must change."""


class OverloadError(TaskFailure):
    """The downstream is overloaded (HTTP 429/503, pool exhaustion): back off, do not pile on.

    Attributes:
        retry_after_s: the downstream's hint in seconds, if it gave one.
    """

    def __init__(self, message: str = "downstream overloaded", retry_after_s: float | None = None):
        self.retry_after_s = retry_after_s
        super().__init__(message)


class CircuitOpen(OverloadError):
    """The circuit breaker of a downstream is open (or half-open with every probe in
    flight): the call was not sent and its intent not recorded (DESIGN §7). The worker hands
    the attempt back and the task waits ``retry_after_s`` (``PENDING``); no attempt and no
    retry is spent.

    Attributes:
        downstream: the downstream's name.
        retry_after_s: seconds until the breaker may let a call through.
    """

    def __init__(self, downstream: str, retry_after_s: float) -> None:
        self.downstream = downstream
        super().__init__(f"circuit breaker of downstream {downstream!r} is open; retry in "
                         f"{retry_after_s:.2f} s", retry_after_s)


class OutcomeUnknownError(TaskFailure):
    """The call may have happened (timeout, reply lost): resolve by lookup, never by guessing."""


class EffectOutcomeUnknown(RatchetError):
    """An effect's outcome could not be established; the task moves to ``UNKNOWN``.

    An operator settles it with ``ratchet resolve TASK --outcome done|not-done``.
    """

    def __init__(self, effect: str, key: str, reason: str) -> None:
        self.effect = effect
        self.key = key
        self.reason = reason
        super().__init__(f"outcome of effect {effect!r} (key {key!r}) is unknown: {reason}")


class UndecodableData(RatchetError, ValueError):
    """JSON text cannot be decoded: not JSON, not valid Unicode (a row whose bytes were not
    valid UTF-8), or nested too deeply (:data:`ratchet.serde.MAX_JSON_DEPTH`).

    Raised by :func:`ratchet.serde.loads`; the message names the value, never its text.
    Also a ``ValueError`` (as ``json.JSONDecodeError`` is), so code written against
    ``json.loads`` keeps catching it.
    """


class ContextUsedInAnotherProcess(RatchetError):
    """A task context (``ctx.step`` / ``ctx.effect`` / ``ctx.transaction`` / a fenced step,
    its lease or its writer) was used from another process than the worker's: task code
    called ``os.fork()`` and the child used the context it inherited. The child has none of
    the worker's threads (writer, heartbeat) and its copies of their locks and ledger
    connections are not usable, so the call would block for ever; it fails at once instead.
    Do the context's work in the task's own process (the child can report back through a
    pipe, a file or its exit status).

    Attributes:
        owner_pid: the worker process the context belongs to.
        pid: the process that used it.
    """

    def __init__(self, what: str, owner_pid: int, pid: int) -> None:
        self.owner_pid = owner_pid
        self.pid = pid
        super().__init__(
            f"{what} belongs to the worker process (pid {owner_pid}), not to this process "
            f"(pid {pid}, forked by task code): it cannot be used here"
        )


class WaitTimeout(RatchetError):
    """``App.wait`` timed out before the task reached a terminal state."""


# ---------------------------------------------------------------------- the one table

EXIT_INTERNAL = 1
"""Exit status of a ``ratchet`` command stopped by an exception that is not a Ratchet error
(a bug): Python's own status for an uncaught exception."""

EXIT_ERROR = 2
"""Exit status of a ``ratchet`` command that stopped on a :class:`RatchetError` (it prints
one line saying what to fix); the status of a command-line usage error too."""

EXIT_LEDGER_CORRUPT = 5
"""Exit status of ``ratchet worker`` (and of every ``ratchet`` command) that stopped on a
:class:`LedgerCorrupt`: an operator must restore the ledger before anything runs again."""


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    """How every face reports one kind of error.

    Attributes:
        http_status: the status the API and the dashboard answer (``404``, ``503``...).
        code: the stable snake_case error code (the API's ``ErrorBody.error``, the
            dashboard's ``X-Ratchet-Error`` header), e.g. ``"not_found"``.
        exit_code: the exit status of a ``ratchet`` command that stopped on it.
    """

    http_status: int
    code: str
    exit_code: int


INTERNAL = ErrorSpec(500, "internal", EXIT_INTERNAL)
"""The spec of an exception outside the table (not a Ratchet error: a bug)."""

_INVALID = ErrorSpec(422, "invalid", EXIT_ERROR)
_UNAVAILABLE = ErrorSpec(503, "ledger_unavailable", EXIT_ERROR)
_NOT_FOR_FACES = ErrorSpec(500, "internal", EXIT_ERROR)
"""Errors raised inside a worker or by task code: none reaches a face unless something is
wrong, so a face that sees one says so as an internal error."""

ERROR_TABLE: Mapping[type[RatchetError], ErrorSpec] = MappingProxyType({
    RatchetError: _NOT_FOR_FACES,
    ConfigError: ErrorSpec(500, "config_error", EXIT_ERROR),
    SubmitError: _INVALID,
    UnknownTask: _INVALID,
    InvalidArguments: _INVALID,
    PayloadNotSerializable: _INVALID,
    PayloadTooLarge: ErrorSpec(413, "payload_too_large", EXIT_ERROR),
    IdempotencyConflict: ErrorSpec(409, "idempotency_conflict", EXIT_ERROR),
    LedgerError: _UNAVAILABLE,
    LedgerUnavailable: _UNAVAILABLE,
    LedgerCorrupt: ErrorSpec(503, "ledger_corrupt", EXIT_LEDGER_CORRUPT),
    # Refused for what the database holds: the same write cannot succeed later.
    WriteRejected: ErrorSpec(409, "write_rejected", EXIT_ERROR),
    SchemaTooNew: ErrorSpec(503, "schema_too_new", EXIT_ERROR),
    SchemaTooOld: ErrorSpec(503, "schema_too_old", EXIT_ERROR),
    TaskNotFound: ErrorSpec(404, "not_found", EXIT_ERROR),
    IllegalTransition: ErrorSpec(409, "wrong_state", EXIT_ERROR),
    FenceError: _NOT_FOR_FACES,
    StaleGeneration: _NOT_FOR_FACES,
    TokenRejected: _NOT_FOR_FACES,
    LeaseLost: _NOT_FOR_FACES,
    TaskFailure: _NOT_FOR_FACES,
    TransientError: _NOT_FOR_FACES,
    TimeLimitExceeded: _NOT_FOR_FACES,
    PermanentError: _NOT_FOR_FACES,
    NonDeterministicReplay: _NOT_FOR_FACES,
    EventTimeout: _NOT_FOR_FACES,
    ChildFailed: _NOT_FOR_FACES,
    TransactionMisuse: _NOT_FOR_FACES,
    OverloadError: _NOT_FOR_FACES,
    CircuitOpen: _NOT_FOR_FACES,
    OutcomeUnknownError: _NOT_FOR_FACES,
    EffectOutcomeUnknown: _NOT_FOR_FACES,
    UndecodableData: _INVALID,
    ContextUsedInAnotherProcess: _NOT_FOR_FACES,
    WaitTimeout: ErrorSpec(504, "wait_timeout", EXIT_ERROR),
})
"""Every :class:`RatchetError` class with its :class:`ErrorSpec` (docs/DESIGN.md, "Errors:
one table"). A subclass defined elsewhere (an application's own) takes its nearest
ancestor's row (:func:`error_spec`)."""


def error_spec(exc: BaseException | type[BaseException]) -> ErrorSpec:
    """The :class:`ErrorSpec` of an exception (or exception class): the row of the first
    class of its MRO that :data:`ERROR_TABLE` has; :data:`INTERNAL` for an exception that
    is not a :class:`RatchetError`."""
    cls = exc if isinstance(exc, type) else type(exc)
    for klass in cls.__mro__:
        spec = ERROR_TABLE.get(klass)
        if spec is not None:
            return spec
    return INTERNAL
