"""Named fault points for crash tests (DESIGN §6).

Production code calls :func:`point` at named places (right after a commit, between an
effect's call and the commit of its result, ...). Nothing happens unless the process was
started with ``RATCHET_CRASH_AT=<name>`` — then the process kills itself with a real
``SIGKILL`` the ``RATCHET_CRASH_SKIP``-th + 1 time that point is reached — or with
``RATCHET_PAUSE_AT=<name>``, then it stops itself with ``SIGSTOP`` (a test later sends
``SIGCONT``), to model a holder paused past its lease.

Point names in use:

* ``submit.after_commit`` — task row committed, client not answered (matrix row 3)
* ``claim.after_commit`` — claimed, nothing executed (row 4)
* ``effect.after_intent`` — intent committed, call not made (row 5)
* ``effect.after_call`` — external call done, result not recorded (row 5)
* ``step.after_commit`` — step recorded, not acknowledged (row 6)
* ``commit.before_commit`` — statements executed, transaction not committed (row 7)
* ``task.after_complete`` — completion committed, worker not yet moved on (row 6)
"""

from __future__ import annotations

import os
import signal
import threading

from .errors import ConfigError

__all__ = ["point", "reset"]

_lock = threading.Lock()
_hits: dict[str, int] = {}
_armed: tuple[str | None, str | None, int] | None = None


def _config() -> tuple[str | None, str | None, int]:
    """(crash point, pause point, skip), read from the environment once per process."""
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
        _armed = (
            os.environ.get("RATCHET_CRASH_AT") or None,
            os.environ.get("RATCHET_PAUSE_AT") or None,
            skip,
        )
    return _armed


def point(name: str) -> None:
    """Reach fault point ``name``: kill or stop this process if a test asked for it.

    Raises:
        ConfigError: ``RATCHET_CRASH_SKIP`` is set but not an integer.
    """
    crash, pause, skip = _config()
    if name != crash and name != pause:
        return
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
    global _armed
    with _lock:
        _hits.clear()
        _armed = None
