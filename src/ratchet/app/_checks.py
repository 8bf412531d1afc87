"""Argument checks of the operator calls (:class:`ratchet.Control`, and the few the
:class:`ratchet.App` offers itself): each returns the value checked, or raises
:class:`~ratchet.errors.InvalidArguments` naming the argument and what is expected."""

from __future__ import annotations

import getpass
import json
import math
import os
from collections.abc import Sequence

from ..errors import InvalidArguments
from ..ledger.base import LimitScope
from ..serde import printable
from ..states import State
from ..validation import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_finite,
    check_identifier,
    check_int,
)

__all__ = [
    "REASON_REQUIRED",
    "check_age",
    "check_limit",
    "check_optional_age",
    "check_seconds",
    "default_operator",
    "limit_scope",
    "operator_args",
    "operator_name",
    "parse_cursor",
    "parse_effect_cursor",
    "pause_scope",
    "states",
    "task_id",
]

REASON_REQUIRED = "reason (--reason) must say why: it is kept in the audit log"
"""The message of the :class:`~ratchet.errors.InvalidArguments` an operator write without a
reason raises; the CLI prints it for a missing ``--reason`` too (one style)."""


def default_operator() -> str:
    """The operator name recorded when none is given: ``$USER``, else the login name, else
    ``"unknown"`` (a container without a passwd entry)."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def task_id(value: object) -> str:
    """``value`` if it can name a task (a storable identifier), else InvalidArguments."""
    return check_identifier(value, "task id", MAX_KEY_BYTES)


def operator_name(by: object) -> str:
    """``by``, or :func:`default_operator` when None, checked storable."""
    who = by if by is not None else default_operator()
    return check_identifier(who, "operator name", MAX_KEY_BYTES)


def operator_args(reason: object, by: object) -> tuple[str, str]:
    """``(reason, operator)`` of an operator command, checked: a reason that says
    something, an operator name that can be stored (default :func:`default_operator`)."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidArguments(REASON_REQUIRED)
    check_identifier(reason, "reason", 4 * MAX_KEY_BYTES)
    return reason, operator_name(by)


def check_seconds(value: object, what: str, top: float) -> float:
    """``value`` as a finite number of seconds in (0, ``top``]."""
    try:
        seconds = check_finite(value, what, maximum=top)
    except InvalidArguments:
        seconds = 0.0
    if seconds <= 0:
        raise InvalidArguments(f"{what} must be a number of seconds above 0 and at most "
                               f"{top:g}, got {value!r}")
    return seconds


def check_age(age: object, label: str) -> float:
    """``age`` as a finite number of seconds >= 0."""
    try:
        return check_finite(age, label, minimum=0.0)
    except InvalidArguments:
        raise InvalidArguments(
            f"{label} must be a finite number of seconds >= 0, got {age!r}") from None


def check_optional_age(age: object, label: str) -> float | None:
    """``age`` as :func:`check_age`, or None (no bound) when None."""
    return None if age is None else check_age(age, label)


def check_limit(limit: object, top: int) -> int:
    """``limit`` if it is an integer from 1 to ``top``."""
    return check_int(limit, "limit", minimum=1, maximum=top)


def states(state: str | State | Sequence[str | State] | None) -> tuple[State, ...] | None:
    """``state`` (one or several names or :class:`State` values, case-insensitive) as
    states, or None."""
    if state is None:
        return None
    items: list[str | State] = [state] if isinstance(state, str | State) else list(state)
    out: list[State] = []
    for item in items:
        if isinstance(item, State):
            out.append(item)
            continue
        try:
            out.append(State(str(item).upper()))
        except ValueError:
            raise InvalidArguments(
                f"unknown state {item!r}; states are "
                f"{', '.join(s.value for s in State)}") from None
    return tuple(out)


def parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    """A task page's ``next_cursor`` back into ``(created_at, task_id)``."""
    if cursor is None:
        return None
    at, sep, after_id = str(cursor).partition(":")
    try:
        value = float(at)
        if not sep or not after_id or not math.isfinite(value):
            raise ValueError
    except ValueError:
        raise InvalidArguments(f"malformed cursor {cursor!r}: pass the next_cursor of the "
                               "previous page") from None
    return value, after_id


def parse_effect_cursor(cursor: str | None) -> tuple[float, str, str] | None:
    """An effect page's ``next_cursor`` back into ``(created_at, task_id, name)``."""
    if cursor is None:
        return None
    try:
        at, after_id, name = json.loads(cursor)
        if not isinstance(after_id, str) or not isinstance(name, str):
            raise ValueError
        created_at = check_finite(at, "cursor")
    except (ValueError, TypeError, InvalidArguments):
        raise InvalidArguments(f"malformed cursor {printable(str(cursor))!r}: pass the "
                               "next_cursor of the previous page") from None
    return created_at, after_id, name


def limit_scope(scope: object) -> LimitScope:
    """``scope`` (``total``, ``type``, ``tenant``; case-insensitive) as a
    :class:`~ratchet.ledger.base.LimitScope`."""
    try:
        return LimitScope(str(scope).lower())
    except ValueError:
        raise InvalidArguments(
            f"unknown limit scope {scope!r}; scopes are total, type, tenant") from None


def pause_scope(scope: object, target: object) -> tuple[str, str]:
    """``(scope, target)`` of a pause / resume: ``all`` without a target, ``type`` with a
    task type, ``task`` with a task id."""
    if scope not in ("all", "type", "task"):
        raise InvalidArguments(f"scope must be 'all', 'type' or 'task', got {scope!r}")
    if scope == "all":
        if target not in (None, ""):
            raise InvalidArguments("a pause of everything takes no target")
        return "all", ""
    if target is None:
        raise InvalidArguments(f"a {scope} pause needs its target (the task "
                               f"{'type' if scope == 'type' else 'id'})")
    if scope == "type":
        return "type", check_identifier(target, "task type", MAX_NAME_BYTES)
    return "task", task_id(target)
