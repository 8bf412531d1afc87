"""Quarantine after deliveries whose worker died (DESIGN §7), with real processes.

A task whose worker is SIGKILLed while running it, three times, is quarantined by the
ledger (the worker is dead, so the ledger counts): after the third death it is neither
taken over nor re-queued, work submitted later still runs, and a replay re-runs it. Both
ways a dead holder is noticed are covered — revocation by a same-host peer (fast takeover)
and lease expiry — on both ledgers. Runs are counted at the counting service.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from ratchet import App, Control, State
from ratchet.fingerprint import worker_died
from ratchet.testing import ProcessGroup, WorkerProcess, start_counting_service, wait_for

pytestmark = [pytest.mark.crash, pytest.mark.timeout(150)]

CRASH_DIR = Path(__file__).resolve().parent
if str(CRASH_DIR) not in sys.path:
    sys.path.insert(0, str(CRASH_DIR))


@pytest.mark.parametrize("fast_takeover", [True, False], ids=["revoked", "lease-expired"])
def test_a_task_whose_worker_dies_three_times_is_quarantined_and_replayed(
    tmp_path: Path, ledger_url: str, fast_takeover: bool
) -> None:
    heal = tmp_path / "healed"
    service = start_counting_service(tmp_path / "service.db", honour_keys=False)
    procs = ProcessGroup(tmp_path / "procs", pythonpath=[CRASH_DIR], cwd=CRASH_DIR,
                         env={"POISON_PAY_URL": service.url, "POISON_HEAL_FILE": str(heal)})
    import poisonapp

    app = App(ledger_url)
    app.tasks.update(poisonapp.app.tasks)  # the same task definitions, this test's ledger
    try:
        handle = app.submit("poison.hang", {})

        def runs() -> int:
            return service.executions().get(f"run:{handle.task_id}", 0)

        def worker(n: int) -> WorkerProcess:
            return procs.worker("poisonapp:app", ledger_url, name=f"worker-{n}",
                                fast_takeover=fast_takeover, args=["--prefetch", "0"])

        for n in range(1, 4):
            w = worker(n)
            wait_for(f"run {n} at the service", lambda n=n: runs() >= n, 30)
            w.signal(signal.SIGKILL)
            w.wait()
        survivor = worker(4)
        wait_for("the quarantine", lambda: handle.get().state is State.FAILED, 30)
        marker = app.submit("poison.marker", {})
        wait_for("the marker", lambda: marker.get().state is State.SUCCEEDED, 30)
        assert runs() == 3  # never redelivered after the third death
        info = handle.get()
        assert info.error_class == "lease_expired"
        with Control(ledger_url) as control:
            [group] = control.quarantine_list()
            assert group.fingerprint == worker_died("poison.hang")
            assert group.task_ids == [handle.task_id]
            heal.touch()
            report = control.quarantine_replay(group.fingerprint, 5.0, reason="fixed",
                                               by="ops")
            assert [t.crashes for t in report.tasks] == [3]
        wait_for("the replay", lambda: handle.get().state is State.SUCCEEDED, 30)
        assert runs() == 4
        assert survivor.stop() == 0
    except BaseException:
        print(procs.dump())
        raise
    finally:
        procs.cleanup()
        service.stop()
        app.close()
