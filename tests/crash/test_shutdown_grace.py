"""``ratchet worker --shutdown-grace-s`` (and ``--max-stuck-threads``) with real processes
and real signals: a task stuck in task code (25 s, no step boundary) no longer
keeps a stopping worker alive. After SIGTERM the worker waits for the grace, hands the
task's lease back (a fenced release to PENDING, attempt not counted) and exits; a second
signal does it at once. A second worker then runs the task to completion, and its charge
is executed exactly once, counted by the external service. Both ledgers.
"""

from __future__ import annotations

import signal
import time

import crashapp
import pytest
from crashkit import Rig, wait_for

from ratchet import State
from ratchet.retry import TIME_LIMIT
from ratchet.worker.runner import EXIT_HANDED_BACK, EXIT_STUCK_THREADS

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

HANG_S = 25.0
GRACE_S = 2.0
MARGIN_S = 6.0
"""Exit after the grace: hand-back transaction, writer and heartbeat stop, process exit."""

PARAMS = {"order_id": "o-hang", "amount_cents": 4321}
KEY = "charge:o-hang"


def submit_hang(rig: Rig, where: str) -> str:
    return rig.app.submit(crashapp.HANG, {**PARAMS, "hang_s": HANG_S, "where": where}).task_id


def hanging(rig: Rig, task_id: str) -> bool:
    return any(r.step == "hang" for r in rig.step_runs(task_id))


def finish_elsewhere(rig: Rig, task_id: str) -> None:
    """The handed-back task is PENDING (not leased: no lease expiry to wait for); a second
    worker claims it (a plain claim, not a takeover) and completes it; one charge."""
    info = rig.get(task_id)
    assert info.state is State.PENDING, info
    assert info.holder is None and info.lease_until is None and info.attempt == 0, info
    b = rig.worker("b")
    done = rig.wait_state(task_id, timeout_s=45)
    assert done.state is State.SUCCEEDED, done
    assert done.result == {"charged_key": KEY, "charged": PARAMS["amount_cents"]}
    assert done.generation == 2 and done.attempt == 1
    assert rig.executions() == {KEY: 1}
    kinds = [e.kind for e in rig.ledger.timeline(task_id).events]
    assert kinds.count("claim") == 2 and "takeover" not in kinds, kinds
    assert b.stop() == 0
    rig.check_consistent()


@pytest.mark.parametrize("where", ["in_call", "after_effect"])
def test_sigterm_hands_back_a_stuck_task_when_the_grace_ends(rig: Rig, where: str) -> None:
    rig.start_service(honour_keys=False)
    task_id = submit_hang(rig, where)
    a = rig.worker("a", args=["--shutdown-grace-s", repr(GRACE_S)])
    wait_for("the task to hang in task code", lambda: hanging(rig, task_id), 30)

    sent = time.monotonic()
    a.signal(signal.SIGTERM)
    code = a.wait(timeout_s=GRACE_S + MARGIN_S)  # raises if the worker waits for the task
    elapsed = time.monotonic() - sent
    assert code == EXIT_HANDED_BACK, a.log()
    assert elapsed >= GRACE_S - 0.1, f"exited after {elapsed:.2f} s, before the grace ended"
    assert elapsed < HANG_S
    assert "handing back the leases of 1 running task(s)" in a.log()
    [back] = [e for e in rig.ledger.timeline(task_id).events
              if e.kind == "transition" and e.to_state == "PENDING"]
    assert back.generation == 1 and back.detail["reason"] == "shutdown grace of 2 s ended"
    finish_elsewhere(rig, task_id)


def test_a_second_signal_hands_back_at_once(rig: Rig) -> None:
    """Warm, then cold shutdown (as in Celery): SIGTERM starts a 60 s grace; a SIGINT a
    second later ends it at once."""
    rig.start_service(honour_keys=False)
    task_id = submit_hang(rig, "in_call")
    a = rig.worker("a", args=["--shutdown-grace-s", "60"])
    wait_for("the task to hang in task code", lambda: hanging(rig, task_id), 30)

    a.signal(signal.SIGTERM)
    wait_for("the worker to start stopping", lambda: "stop claiming" in a.log(), 10)
    time.sleep(0.6)  # past SIGNAL_REPEAT_S: a new signal, not the same one delivered twice
    sent = time.monotonic()
    a.signal(signal.SIGINT)
    code = a.wait(timeout_s=MARGIN_S)
    assert code == EXIT_HANDED_BACK, a.log()
    assert time.monotonic() - sent < MARGIN_S
    [back] = [e for e in rig.ledger.timeline(task_id).events
              if e.kind == "transition" and e.to_state == "PENDING"]
    assert back.detail["reason"] == "second signal"
    finish_elsewhere(rig, task_id)


def test_a_repeated_signal_is_one_stop(rig: Rig) -> None:
    """The same SIGTERM delivered twice at once (to the group and to the process) is not a
    second signal: the worker still waits for its grace."""
    rig.start_service(honour_keys=False)
    task_id = submit_hang(rig, "after_effect")
    a = rig.worker("a", args=["--shutdown-grace-s", repr(GRACE_S)])
    wait_for("the task to hang in task code", lambda: hanging(rig, task_id), 30)
    sent = time.monotonic()
    a.signal(signal.SIGTERM)
    a.signal(signal.SIGTERM)
    code = a.wait(timeout_s=GRACE_S + MARGIN_S)
    assert code == EXIT_HANDED_BACK, a.log()
    assert time.monotonic() - sent >= GRACE_S - 0.1
    finish_elsewhere(rig, task_id)


def test_a_time_limited_worker_exits_for_a_restart_at_max_stuck_threads(rig: Rig) -> None:
    """The worker's app gives the task a 0.5 s time limit: the stuck attempt is ended
    (RETRY_WAIT, error_class time_limit) and, with --max-stuck-threads 1, the worker exits
    with status 4 for a restart; a second worker completes the task, one charge.

    On a loaded machine the limit may end an attempt before its body reaches the hang (in
    the client's start-up, the intent's commit): that thread comes back at once and is not
    stuck, so the worker goes on and its next attempt (which hangs too in this worker)
    is the one that stops it. Every attempt before the last is such a time limit."""
    rig.start_service(honour_keys=False)
    task_id = submit_hang(rig, "after_effect")
    a = rig.worker("a", args=["--max-stuck-threads", "1", "--shutdown-grace-s", "5"],
                   env={"CRASH_TIME_LIMIT_S": "0.5"})
    code = a.wait(timeout_s=90)
    assert code == EXIT_STUCK_THREADS, a.log()
    assert "max_stuck_threads=1" in a.log()
    limited = [e for e in rig.ledger.timeline(task_id).events
               if e.kind == "transition" and e.to_state == "RETRY_WAIT"]
    assert limited, rig.ledger.timeline(task_id).events
    assert [e.generation for e in limited] == list(range(1, len(limited) + 1))
    assert all(e.detail["error_class"] == TIME_LIMIT for e in limited)
    n = len(limited)
    assert f"attempt {n} of 30 ran past its time limit of 0.5 s" in limited[-1].detail["error"]
    b = rig.worker("b")
    done = rig.wait_state(task_id, timeout_s=45)
    assert done.state is State.SUCCEEDED and done.generation == n + 1, done
    assert done.attempt == n + 1, done
    assert rig.executions() == {KEY: 1}
    assert b.stop() == 0
    rig.check_consistent()
