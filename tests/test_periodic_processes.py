"""Periodic tasks with real ``ratchet worker`` processes, on both ledgers.

* Four workers, each running the scheduler, fire an ``every_s=1`` schedule for a minute:
  one task per tick, no tick missing between the first and the last, no key twice, and the
  schedule's fired count equals the tasks (no tick counted twice).
* The only scheduler is SIGKILLed just before a tick and a new one starts after it: the
  tick is still one task (within the misfire grace), and the ticks after it follow.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ratchet import App, Control, State, TaskContext
from ratchet.testing import ProcessGroup, wait_for

APP = '''
import ratchet

app = ratchet.App()


@app.periodic("beat", every_s={every_s}, misfire_grace_s=60)
@app.task(name="periodic.beat")
def beat(ctx):
    return None
'''


def tick_of(key: str) -> int:
    text = key.split(":", 2)[2]
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp())


def reader(url: str) -> App:
    app = App(url)

    @app.task(name="periodic.beat")
    def beat(ctx: TaskContext) -> None:
        return None

    return app


def beat_keys(app: App) -> list[str]:
    page = app.list_tasks(name="periodic.beat", limit=1000)
    tasks = list(page.tasks)
    while page.next_cursor is not None:
        page = app.list_tasks(name="periodic.beat", limit=1000, cursor=page.next_cursor)
        tasks += page.tasks
    return [t.idempotency_key or "" for t in tasks]


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path / "procs", pythonpath=[tmp_path])
    try:
        yield group
    finally:
        group.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_four_schedulers_give_one_task_per_tick_for_a_minute(
    ledger_url: str, tmp_path: Path, procs: ProcessGroup
) -> None:
    (tmp_path / "beatapp.py").write_text(textwrap.dedent(APP.format(every_s=1)))
    workers = [procs.worker("beatapp:app", ledger_url, name=f"w{i}", concurrency=2)
               for i in range(4)]
    for w in workers:
        w.holder()
    app = reader(ledger_url)
    try:
        started = time.time()
        wait_for("a minute of ticks", lambda: time.time() >= started + 60, timeout_s=70,
                 interval_s=0.5)
        for w in workers:
            assert w.stop() == 0, w.log()
        keys = beat_keys(app)
        assert len(keys) == len(set(keys))  # no key twice
        ticks = sorted(tick_of(k) for k in keys)
        assert len(ticks) >= 55, ticks
        assert ticks == list(range(ticks[0], ticks[-1] + 1))  # no gap
        (view,) = Control(app=app).schedules()
        assert view.fired == len(ticks) and view.missed == 0
        assert view.last_fired_at == ticks[-1]
        done = [t for t in app.list_tasks(name="periodic.beat", limit=1000).tasks
                if t.state is State.SUCCEEDED]
        assert done  # the workers ran them too
    finally:
        app.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_scheduler_killed_just_before_a_tick_and_replaced_after_it_fires_it_once(
    ledger_url: str, tmp_path: Path, procs: ProcessGroup
) -> None:
    every_s = 5
    (tmp_path / "beatapp.py").write_text(textwrap.dedent(APP.format(every_s=every_s)))
    first = procs.worker("beatapp:app", ledger_url, name="first")
    first.holder()
    app = reader(ledger_url)
    try:
        wait_for("a first tick", lambda: beat_keys(app), timeout_s=30)
        # The next tick at least two seconds away (a slow machine may be past the one after
        # the first tick already).
        nxt = (int(time.time()) + 3) // every_s * every_s + every_s
        # Killed one second before the next tick: it cannot have fired it.
        wait_for("one second before the tick", lambda: time.time() >= nxt - 1, timeout_s=10,
                 interval_s=0.01)
        first.kill()
        assert nxt not in [tick_of(k) for k in beat_keys(app)]
        wait_for("two seconds after the tick", lambda: time.time() >= nxt + 2, timeout_s=10,
                 interval_s=0.01)
        second = procs.worker("beatapp:app", ledger_url, name="second")
        second.holder()
        wait_for("the tick and the next one after it", lambda: {nxt, nxt + every_s} <= {
            tick_of(k) for k in beat_keys(app)}, timeout_s=30)
        ticks = [tick_of(k) for k in beat_keys(app)]
        assert ticks.count(nxt) == 1
        assert second.stop() == 0, second.log()
        ticks = sorted(tick_of(k) for k in beat_keys(app))
        assert ticks == list(range(ticks[0], ticks[-1] + 1, every_s))  # none missing
        (view,) = Control(app=app).schedules()
        assert view.missed == 0 and view.fired == len(ticks)
    finally:
        app.close()
