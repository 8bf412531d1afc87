"""The task listing and the audited cancel, retry and compensate, on a ledger: what
:class:`ratchet.Control` and :class:`ratchet.App` (``app.list_tasks``, ``app.cancel``,
``app.retry``) both do, below both."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tenacity

from ..config import parse_ledger_url
from ..errors import InvalidArguments, WaitTimeout
from ..ledger import open_ledger
from ..ledger.base import ControlOutcome, Ledger, TaskInfo, TaskQuery
from ..states import State
from ..validation import MAX_KEY_BYTES, check_finite, check_identifier
from ._checks import check_limit, check_optional_age, operator_args, parse_cursor, states, task_id

__all__ = ["LedgerOnDemand", "TaskPage", "cancel", "compensate", "list_tasks", "retry"]


@dataclass(frozen=True, slots=True)
class TaskPage:
    """A page of ``ratchet tasks`` / :meth:`Control.list_tasks`.

    Attributes:
        tasks: the tasks, newest first (params and results decoded).
        next_cursor: pass it as ``cursor=`` (``--cursor``) for the next page; None when
            this page is the last.
    """

    tasks: list[TaskInfo]
    next_cursor: str | None


class LedgerOnDemand:
    """The ledger of one or more operator calls, opened at first use (so that arguments
    are checked first) and closed at exit: ``given`` if not None (an open ledger, never
    closed here), else the one at ``url``, which must exist (nothing is created; migrated
    first if older when ``write``).

    Calling it returns the ledger.

    Raises:
        ConfigError: a malformed URL (when made).
        LedgerUnavailable: no ledger there, or unreachable (when called).
    """

    def __init__(self, url: str | None, *, write: bool, given: Ledger | None = None) -> None:
        self._url = url
        self._write = write
        self._given = given
        self._opened: Ledger | None = None
        if given is None:
            parse_ledger_url(url)  # a malformed URL fails before any argument (ConfigError)

    def __call__(self) -> Ledger:
        if self._given is not None:
            return self._given
        if self._opened is None:
            self._opened = open_ledger(self._url, migrate=self._write, must_exist=True)
        return self._opened

    def __enter__(self) -> LedgerOnDemand:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._opened is not None:
            self._opened.close()
            self._opened = None


def list_tasks(
    ledger: Callable[[], Ledger],
    *,
    state: str | State | Sequence[str | State] | None = None,
    name: str | Sequence[str] | None = None,
    key: str | None = None,
    older_than_s: float | None = None,
    newer_than_s: float | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> TaskPage:
    """Tasks of ``ledger()``, newest first, filtered and paginated (:meth:`Control.list_tasks`
    documents the arguments).

    Raises:
        InvalidArguments: an unknown state, a negative or non-finite age, ``limit`` out of
            range, a malformed cursor.
        LedgerUnavailable: no ledger there.
    """
    wanted = states(state)
    names = (None if name is None else
             (name,) if isinstance(name, str) else tuple(name))
    if names is not None:
        for n in names:
            check_identifier(n, "task name", MAX_KEY_BYTES)
    if key is not None:
        check_identifier(key, "idempotency key", MAX_KEY_BYTES)
    check_limit(limit, 1000)
    older = check_optional_age(older_than_s, "older_than_s")
    newer = check_optional_age(newer_than_s, "newer_than_s")
    led = ledger()
    now = led.now() if older is not None or newer is not None else 0.0
    query = TaskQuery(
        states=wanted, names=names, key=key,
        created_from=None if newer is None else now - newer,
        created_to=None if older is None else now - older,
        limit=limit + 1, after=parse_cursor(cursor),
    )
    found = led.list_tasks(query)
    page = found[:limit]
    more = len(found) > limit and page
    next_cursor = f"{page[-1].created_at!r}:{page[-1].task_id}" if more else None
    return TaskPage(page, next_cursor)


def cancel(ledger: Callable[[], Ledger], task: str, reason: str,
           by: str | None) -> ControlOutcome:
    """Cancel ``task`` on ``ledger()``, audited (:meth:`Control.cancel` documents the rules).

    Raises:
        InvalidArguments: blank reason, malformed task id or operator name.
        TaskNotFound: no such task. LedgerUnavailable: no ledger there.
    """
    why, who = operator_args(reason, by)
    return ledger().cancel(task_id(task), why, who)


def retry(ledger: Callable[[], Ledger], task: str, reason: str,
          by: str | None) -> ControlOutcome:
    """Run the ``FAILED`` ``task`` again on ``ledger()``, audited (:meth:`Control.retry`).

    Raises:
        InvalidArguments: blank reason, malformed task id or operator name.
        TaskNotFound: no such task. LedgerUnavailable: no ledger there.
    """
    why, who = operator_args(reason, by)
    return ledger().retry(task_id(task), why, who)


def compensate(ledger: Callable[[], Ledger], task: str, reason: str,
               by: str | None) -> ControlOutcome:
    """Send the ``FAILED`` ``task`` to ``COMPENSATING`` on ``ledger()``, audited
    (:meth:`Control.compensate` documents the rules).

    Raises:
        InvalidArguments: blank reason, malformed task id or operator name.
        TaskNotFound: no such task. LedgerUnavailable: no ledger there.
    """
    why, who = operator_args(reason, by)
    return ledger().compensate(task_id(task), why, who)


def wait_settled(get: Callable[[str], TaskInfo], task_id: str, timeout_s: float | None,
                 poll_s: float) -> TaskInfo:
    """Poll ``get(task_id)`` until the task is terminal or ``UNKNOWN``
    (:meth:`ratchet.App.wait`), every ``poll_s`` seconds growing to 0.5 s.

    Raises:
        WaitTimeout: ``timeout_s`` seconds passed first.
        InvalidArguments: ``timeout_s`` or ``poll_s`` is not a finite number >= 0.
    """
    return tenacity.Retrying(**_wait_policy(task_id, timeout_s, poll_s))(get, task_id)


async def wait_settled_async(get: Callable[[str], Awaitable[TaskInfo]], task_id: str,
                             timeout_s: float | None, poll_s: float) -> TaskInfo:
    """:func:`wait_settled` for a coroutine: ``await get(task_id)`` polled with
    ``asyncio.sleep`` between reads (:meth:`ratchet.App.wait_async`).

    Raises:
        Same as :func:`wait_settled`.
    """
    policy = _wait_policy(task_id, timeout_s, poll_s)
    result: TaskInfo = await tenacity.AsyncRetrying(**policy)(get, task_id)
    return result


def _wait_policy(task_id: str, timeout_s: float | None, poll_s: float) -> dict[str, Any]:
    """The tenacity arguments of a wait (one policy for :func:`wait_settled` and
    :func:`wait_settled_async`), the arguments checked first."""
    for label, value in (("timeout_s", timeout_s), ("poll_s", poll_s)):
        if value is None and label == "timeout_s":
            continue
        try:
            check_finite(value, label, minimum=0.0)
        except InvalidArguments:
            raise InvalidArguments(f"{label} must be a finite number of seconds >= 0, "
                                   f"got {value!r}") from None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    backoff = tenacity.wait_exponential(multiplier=max(poll_s, 0.001), exp_base=1.5, max=0.5)

    def until_deadline(state: tenacity.RetryCallState) -> float:
        # the exponential poll interval, never past the deadline (one last look there)
        pause = backoff(state)
        return pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))

    def timed_out(state: tenacity.RetryCallState) -> TaskInfo:
        info = state.outcome.result() if state.outcome is not None else None
        where = f"still {info.state}" if info is not None else "not settled"
        raise WaitTimeout(
            f"task {task_id} is {where} after {timeout_s} s (is a worker running for it?)"
        )

    return {
        "retry": tenacity.retry_if_result(
            lambda info: not (info.terminal or info.state is State.UNKNOWN)),
        "wait": until_deadline,
        "stop": (tenacity.stop_never if timeout_s is None
                 else tenacity.stop_after_delay(timeout_s)),
        "retry_error_callback": timed_out,
    }
