"""A SQLite ledger on a small volume of its own (a real tmpfs mounted for the test) that
fills up while a real worker process runs: the full disk is a clear ``SQLITE_FULL``,
nothing committed is lost, the worker logs its failing claims, lease renewals and final
commits once each (then a summary, with backoff for the claims), and once space is freed
the ledger and the worker carry on by themselves, through more tasks than the freed space
could hold as WAL (SQLite's own checkpoint waits for about 4 MiB of WAL, more than this
volume has). Also the backoff and log throttling
of :class:`~ratchet.worker.backoff.RepeatedFailure` on their own."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratchet import App, Control, LedgerUnavailable, TaskContext
from ratchet.testing.processes import ProcessGroup, wait_for
from ratchet.worker.backoff import RepeatedFailure

pytestmark = pytest.mark.timeout(240)

VOLUME = "3m"
"""The tmpfs size: below the WAL size at which SQLite checkpoints by itself (~4 MiB)."""

BEFORE = 20
"""Tasks run before the volume is filled."""

AFTER = 80
"""Tasks run once space is freed: about 95 KiB of WAL each, over twice the room freed."""

HOLDERS = 4
"""Tasks running when the volume fills: their lease renewals and final commits fail."""

MODULE = '''
import os, time
import ratchet

app = ratchet.App()


@app.task(name="full.pad")
def pad(ctx, pad):
    return {"length": len(pad)}


@app.task(name="full.hold", lease_s=2.0)
def hold(ctx, gate):
    while not os.path.exists(gate):
        time.sleep(0.01)
    return {}
'''


def _make_app(url: str) -> App:
    app = App(url)

    @app.task(name="full.pad")
    def pad(ctx: TaskContext, pad: str) -> dict[str, int]:
        return {"length": len(pad)}

    @app.task(name="full.hold", lease_s=2.0)
    def hold(ctx: TaskContext, gate: str) -> None:
        raise AssertionError("runs in the worker process only")

    return app


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs mounted for this test only (unmounted after). Skipped with the
    reason where mounting is not permitted (not root, no CAP_SYS_ADMIN); a failure under
    ``CI=true``, whose machines run as root."""
    where = tmp_path / "volume"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={VOLUME},mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        reason = (f"cannot mount a tmpfs for the full-disk test (needs root): "
                  f"{mounted.stderr.strip() or mounted.returncode}")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(path: Path) -> int:
    """Write ``path`` until the volume is full (ENOSPC); return its size in bytes."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    written = 0
    try:
        while True:
            written += os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return written


def _pad() -> dict[str, str]:
    return {"pad": os.urandom(1500).hex()}


def _submit_until(app: App, deadline: float) -> str:
    """Submit one task, trying again while the ledger says the disk is full (a later
    write may make the room), until ``deadline`` (monotonic)."""
    while True:
        try:
            return app.submit("full.pad", _pad()).task_id
        except LedgerUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_full_volume_loses_nothing_and_recovers_once_space_is_freed(
    volume: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "fullapp.py").write_text(MODULE)
    url = f"sqlite:///{volume}/l.db"
    app = _make_app(url)
    control = Control(url)
    with ProcessGroup(tmp_path / "logs", pythonpath=[project]) as group:
        try:
            worker = group.worker("fullapp:app", url, poll_interval_s=0.02,
                                  concurrency=HOLDERS + 1)
            worker.holder()
            committed = [app.submit("full.pad", _pad()).task_id for _ in range(BEFORE)]
            wait_for("the first tasks to succeed", lambda: control.status().counts.get(
                "full.pad", {}).get("SUCCEEDED", 0) == BEFORE, timeout_s=60)
            # Tasks running through the outage: renewals fail, then their final commits.
            gate = tmp_path / "gate"
            holders = [app.submit("full.hold", {"gate": str(gate)}).task_id
                       for _ in range(HOLDERS)]
            wait_for("the holding tasks to run", lambda: control.status().counts.get(
                "full.hold", {}).get("RUNNING", 0) == HOLDERS, timeout_s=60)
            # Tasks that become ready during the outage: the worker's claims then fail.
            committed += [app.submit("full.pad", _pad(), delay_s=1.0).task_id
                          for _ in range(10)]
            filler = volume / "filler"
            freed = _fill(filler)
            with pytest.raises(LedgerUnavailable, match="disk is full"):
                for _ in range(5000):  # what still fits (in a WAL page or two), until none
                    committed.append(app.submit("full.pad", _pad()).task_id)
            # Every acknowledged task is there, while the disk is still full.
            assert {control.get(task_id).task_id for task_id in committed} == set(committed)
            wait_for("the worker to meet the full disk",
                     lambda: "disk is full" in worker.log(), timeout_s=60)
            # The outage lasts a few seconds: long enough for a poll every 20 ms to have
            # logged a hundred lines without backoff.
            outage_ends = time.monotonic() + 3.0
            wait_for("a lease renewal to fail", lambda: "lease renewal failed" in worker.log(),
                     timeout_s=30)
            gate.touch()  # the holding tasks end: their final commits fail
            wait_for("a final commit to fail", lambda: "final commit failed" in worker.log(),
                     timeout_s=30)
            while time.monotonic() < outage_ends:
                with pytest.raises(LedgerUnavailable, match="disk is full"):
                    app.submit("full.pad", _pad())
                time.sleep(0.1)
            filler.unlink()
            assert freed < AFTER * 95 * 1024 / 2
            deadline = time.monotonic() + 120
            after = [_submit_until(app, deadline) for _ in range(AFTER)]

            def all_succeeded() -> bool:
                try:
                    counts = control.status().counts.get("full.pad", {})
                except LedgerUnavailable:  # the status read's mark write met a full disk
                    return False
                held = control.status().counts.get("full.hold", {})
                return (counts.get("SUCCEEDED", 0) == len(committed) + len(after)
                        and held.get("SUCCEEDED", 0) == len(holders))

            wait_for("every task, before and after the full disk, to succeed", all_succeeded,
                     timeout_s=max(deadline - time.monotonic(), 30))
            assert worker.alive(), worker.describe()
            log = worker.log()
            failed = log.count("claim failed")
            assert 1 <= failed <= 3, log[-4000:]
            # Each failing path logs its first failure, a count per 10 s, its recovery.
            renewals = log.count("lease renewal failed")
            assert 1 <= renewals <= 3, log[-4000:]
            resends = log.count("sending it again")
            assert 1 <= resends <= 3, log[-4000:]
        finally:
            control.close()
            app.close()


def test_repeated_failure_backs_off_and_summarises(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    failures = RepeatedFailure("claim", logging.getLogger("test.backoff"), base_s=0.1,
                               max_s=2.0, summary_every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "test.backoff")
    delays = []
    for _ in range(8):
        assert failures.ready()
        delays.append(failures.failed(RuntimeError("disk full")))
        assert not failures.ready()
        now[0] += delays[-1]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert [r.getMessage() for r in caplog.records] == [
        "claim failed: disk full (repeats are summarised every 10 s)"]
    now[0] += 10.0
    failures.failed(RuntimeError("disk still full"))
    assert len(caplog.records) == 2
    assert caplog.records[1].getMessage().startswith("claim failed 8 more times in ")
    assert "9 in a row" in caplog.records[1].getMessage()
    failures.succeeded()
    assert failures.ready() and failures.failures == 0
    assert caplog.records[2].getMessage().startswith("claim works again after 9 failures")
    failures.succeeded()  # nothing more to say
    assert len(caplog.records) == 3
