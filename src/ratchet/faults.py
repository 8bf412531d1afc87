"""Named fault points for crash tests (DESIGN §6).

Production code calls :func:`point` at named places (right after a commit, between an
effect's call and the commit of its result, ...). Nothing happens unless the process was
started with ``RATCHET_CRASH_AT=<name>`` — then the process kills itself with a real
``SIGKILL`` the ``RATCHET_CRASH_SKIP``-th + 1 time that point is reached — or with
``RATCHET_PAUSE_AT=<name>``, then it stops itself with ``SIGSTOP`` (a test later sends
``SIGCONT``), to model a holder paused past its lease. With ``RATCHET_CRASH_THREAD=<thread
name>`` only that thread's passes count and stop (``ratchet-writer``: the worker's task
writes and claims, not its lease renewals, whose number depends on the machine's speed).
With ``RATCHET_CRASH_AFTER=<name>`` nothing counts until that other point was reached (in
any thread): ``commit.before_commit`` after ``effect.after_call`` is the first write
transaction once the call returned, whatever polls and renewals came before it.

Point names (:data:`POINTS`; the crash-point matrix rows are DESIGN §6's):

* ``submit.before_commit`` — request received and checked, nothing written (matrix row 1)
* ``submit.after_commit`` — task row committed, client not answered (matrix row 3)
* ``claim.after_commit`` — claimed, nothing executed (row 4)
* ``effect.after_intent`` — intent committed, call not made (row 5)
* ``effect.before_call`` — lease checked a last time, call not sent (a frozen sender)
* ``effect.after_call`` — external call done, result not recorded (row 5)
* ``step.after_commit`` — step recorded, not acknowledged (row 6)
* ``transaction.before_begin`` — ``ctx.transaction`` body not yet run, fence not yet read
* ``transaction.after_commit`` — ``ctx.transaction`` committed, not acknowledged
* ``commit.before_commit`` — statements executed, transaction not committed (row 7)
* ``task.after_complete`` — completion committed, worker not yet moved on (row 6)
* ``batch.before_commit`` — a batch of ``ctx.batches`` processed, its commit not sent (row 9)
* ``batch.after_commit`` — a batch committed, not yet counted by the task (row 9)
* ``emit.after_commit`` — ``ctx.emit``'s checkpoint and outbox row committed, the call
  not returned (row 10)
* ``relay.before_publish`` — a relay's lease checked a last time, its batch not yet sent
  (a frozen relay)
* ``relay.after_publish`` — a batch published and confirmed, not marked sent (row 10)
* ``relay.after_mark`` — a batch marked sent

Names under ``test.`` are left to tests, for points they place in their own task code.
Any other name in ``RATCHET_CRASH_AT`` / ``RATCHET_PAUSE_AT`` is refused with a
:class:`~ratchet.errors.ConfigError` when the environment is read (a typo would otherwise
arm nothing, silently).
"""

from __future__ import annotations

import os
import signal
import threading

from .errors import ConfigError

__all__ = ["POINTS", "armed", "point", "reset"]

POINTS: frozenset[str] = frozenset({
    "submit.before_commit", "submit.after_commit", "claim.after_commit", "effect.after_intent",
    "effect.before_call", "effect.after_call", "step.after_commit", "transaction.before_begin",
    "transaction.after_commit", "commit.before_commit", "task.after_complete",
    "batch.before_commit", "batch.after_commit", "emit.after_commit", "relay.before_publish",
    "relay.after_publish", "relay.after_mark",
})
"""Every fault point the code reaches (the module docstring says where each one is)."""

TEST_PREFIX = "test."
"""Names under this prefix are accepted too: points a test places in its own code."""

_lock = threading.Lock()
_hits: dict[str, int] = {}
_armed: tuple[str | None, str | None, int, str | None, str | None] | None = None
_after_reached = False  # RATCHET_CRASH_AFTER's point was reached (any thread)


def _config() -> tuple[str | None, str | None, int, str | None, str | None]:
    """(crash point, pause point, skip, thread, after), read from the environment once per
    process."""
    global _armed
    if _armed is None:
        raw_skip = os.environ.get("RATCHET_CRASH_SKIP", "0")
        try:
            skip = int(raw_skip)
        except ValueError:
            raise ConfigError(
                f"RATCHET_CRASH_SKIP must be an integer (times to pass the point first), "
                f"got {raw_skip!r}"
            ) from None
        _armed = (_named("RATCHET_CRASH_AT"), _named("RATCHET_PAUSE_AT"), skip,
                  os.environ.get("RATCHET_CRASH_THREAD") or None,
                  _named("RATCHET_CRASH_AFTER"))
    return _armed


def _named(variable: str) -> str | None:
    """The point named by environment ``variable`` (None when unset or empty).

    Raises:
        ConfigError: the name is not in :data:`POINTS` and not under ``test.``.
    """
    name = os.environ.get(variable) or None
    if name is None or name in POINTS or name.startswith(TEST_PREFIX):
        return name
    raise ConfigError(
        f"{variable}={name!r} is not a fault point; known points: {', '.join(sorted(POINTS))}"
    )


def armed() -> dict[str, str]:
    """The armed points, read (and checked) from the environment: ``{variable: name}``,
    e.g. ``{"RATCHET_CRASH_AT": "effect.after_call"}``; empty when none is set.

    Raises:
        ConfigError: an unknown point name, or ``RATCHET_CRASH_SKIP`` not an integer.
    """
    crash, pause, _skip, _thread, _after = _config()
    named = {"RATCHET_CRASH_AT": crash, "RATCHET_PAUSE_AT": pause}
    return {variable: name for variable, name in named.items() if name is not None}


def point(name: str) -> None:
    """Reach fault point ``name``: kill or stop this process if a test asked for it.

    Raises:
        ConfigError: ``RATCHET_CRASH_SKIP`` is set but not an integer, or
            ``RATCHET_CRASH_AT`` / ``RATCHET_PAUSE_AT`` names an unknown point.
    """
    global _after_reached
    crash, pause, skip, thread, after = _config()
    if after is not None and not _after_reached:
        if name == after:
            _after_reached = True
        return  # nothing armed, nothing counted, until then
    if name != crash and name != pause:
        return
    if thread is not None and threading.current_thread().name != thread:
        return  # neither counted nor armed in this thread
    with _lock:
        count = _hits.get(name, 0)
        _hits[name] = count + 1
    if count != skip:
        return
    # pthread_kill on the calling thread: the signal is delivered before this call returns.
    # os.kill(getpid()) may be delivered to another thread while this one runs on a moment,
    # which would let the "crashed" thread perform one more side effect.
    signal.pthread_kill(threading.get_ident(), signal.SIGKILL if name == crash else signal.SIGSTOP)


def reset() -> None:
    """Forget how often each point was reached and re-read the environment (tests)."""
    global _armed, _after_reached
    with _lock:
        _hits.clear()
        _armed = None
        _after_reached = False
