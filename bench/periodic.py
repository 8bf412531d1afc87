"""The scheduler's ledger cost per tick with 1,000 periodic schedules registered.

Run::

    .venv/bin/python bench/periodic.py                         # SQLite and PostgreSQL
    .venv/bin/python bench/periodic.py --ledger sqlite --passes 20

One App registers ``--schedules`` schedules of one no-op task; a scheduler
(``ratchet.worker.scheduler.Scheduler``, the worker's thread, driven here pass by pass
with an injected ledger clock and local clock, so no waiting) fires them. Two shapes:

* ``aligned``: every schedule ``every_s=60``: all of them are due at every minute, so one
  pass decides 1,000 ticks and submits 1,000 tasks (one transaction);
* ``spread``: schedule i is ``cron "i%60 * * * *"``: each minute about 1/60 of them are due,
  the common case (a pass for ~17 ticks, 1,000 registered).

For each pass: wall time of ``Scheduler.run_once`` (the transaction included), ledger
transactions, statements (each named catalogue statement sent) and, on PostgreSQL, round
trips (``_PgTx._send`` calls: BEGIN and the clock travel with the first). Then a second
scheduler (another worker) makes its pass at the same instant: it reads the cursors the
first moved and submits nothing (its cost is the price of having no leader). Between ticks
a scheduler touches the ledger not at all (it knows each schedule's next tick), except one
``schedule_seen`` statement every 30 s for all its schedules.

Prints figures; asserts nothing (a measurement tool, not a test).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ratchet  # noqa: E402
from ratchet.testing import inject_clock  # noqa: E402
from ratchet.worker.scheduler import Scheduler  # noqa: E402

T0 = datetime(2030, 1, 1, tzinfo=UTC).timestamp()


class Counts:
    def __init__(self) -> None:
        self.transactions = 0
        self.statements = 0
        self.round_trips = 0

    def reset(self) -> tuple[int, int, int]:
        out = (self.transactions, self.statements, self.round_trips)
        self.transactions = self.statements = self.round_trips = 0
        return out


class CountingTx:
    """The dialect's transaction, counting the named statements sent through it."""

    def __init__(self, tx: Any, counts: Counts) -> None:
        self._tx = tx
        self._counts = counts

    @property
    def now(self) -> float:
        return float(self._tx.now)

    def rows(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        self._counts.statements += 1
        return self._tx.rows(name, params)

    def rows_many(self, reads: Sequence[tuple[str, Mapping[str, Any] | None]]) -> Any:
        self._counts.statements += len(reads)
        return self._tx.rows_many(reads)

    def one(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        self._counts.statements += 1
        return self._tx.one(name, params)

    def execute(self, name: str, params: Mapping[str, Any] | None = None) -> int:
        self._counts.statements += 1
        return int(self._tx.execute(name, params))

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], **scalars: Any) -> None:
        if rows:
            self._counts.statements += 1
        self._tx.batch(name, rows, **scalars)

    def wake(self) -> None:
        self._tx.wake()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


class CountingDialect:
    def __init__(self, inner: Any, counts: Counts) -> None:
        self._inner = inner
        self._counts = counts

    def run(self, body: Callable[[Any], Any], *, write: bool = True) -> Any:
        self._counts.transactions += 1
        return self._inner.run(lambda tx: body(CountingTx(tx, self._counts)), write=write)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def count_round_trips(counts: Counts) -> None:
    try:
        import ratchet.ledger.postgres as pgm
    except ImportError:
        return
    send = pgm._PgTx._send

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts.round_trips += 1
        return send(self, *args, **kwargs)

    pgm._PgTx._send = counted  # type: ignore[method-assign]


def make_app(url: str, n: int, shape: str) -> ratchet.App:
    app = ratchet.App(url, durability="fsync")

    def noop(ctx: ratchet.TaskContext) -> None:
        return None

    app.task("bench.periodic")(noop)
    for i in range(n):
        if shape == "aligned":
            app.periodic(f"s{i:04d}", every_s=60, misfire_grace_s=120)(noop)
        else:
            app.periodic(f"s{i:04d}", cron=f"{i % 60} * * * *", misfire_grace_s=120)(noop)
    return app


def run_shape(url: str, n: int, shape: str, passes: int, counts: Counts) -> dict[str, Any]:
    app = make_app(url, n, shape)
    other = make_app(url, n, shape)
    clock, other_clock = inject_clock(app.ledger), inject_clock(other.ledger)
    now = [T0 - 1]
    clock.freeze(now[0])
    other_clock.freeze(now[0])
    engine, other_engine = app.ledger, other.ledger
    engine.dialect = CountingDialect(engine.dialect, counts)  # type: ignore[attr-defined]
    other_engine.dialect = CountingDialect(other_engine.dialect, counts)  # type: ignore[attr-defined]
    first = Scheduler(app.ledger, app.periodic_tasks, "bench-1", clock=lambda: now[0],
                      seen_every_s=math.inf)
    second = Scheduler(other.ledger, other.periodic_tasks, "bench-2", clock=lambda: now[0],
                       seen_every_s=math.inf)
    counts.reset()
    t = time.perf_counter()
    first.register()
    register_ms = (time.perf_counter() - t) * 1000
    register_counts = counts.reset()
    second.register()
    counts.reset()
    rows: list[tuple[float, int, int, int, int]] = []
    loser: list[tuple[float, int, int, int]] = []
    for k in range(passes):
        at = T0 + 60 * k + 0.5
        now[0] = at
        clock.freeze(at)
        other_clock.freeze(at)
        t = time.perf_counter()
        fired = first.run_once()
        took = (time.perf_counter() - t) * 1000
        tx, st, rt = counts.reset()
        ticks = 0 if fired is None else len(fired.submitted)
        rows.append((took, ticks, tx, st, rt))
        t = time.perf_counter()
        second.run_once()
        took = (time.perf_counter() - t) * 1000
        tx, st, rt = counts.reset()
        loser.append((took, tx, st, rt))
    app.close()
    other.close()
    ms = [r[0] for r in rows]
    ticks = [r[1] for r in rows]
    return {
        "register_ms": register_ms, "register": register_counts,
        "pass_ms_p50": statistics.median(ms), "pass_ms_max": max(ms),
        "ticks_per_pass": statistics.median(ticks),
        "ms_per_tick": statistics.median(r[0] / r[1] for r in rows if r[1]),
        "tx": statistics.median(r[2] for r in rows),
        "statements": statistics.median(r[3] for r in rows),
        "round_trips": statistics.median(r[4] for r in rows),
        "loser_ms_p50": statistics.median(r[0] for r in loser),
        "loser_statements": statistics.median(r[2] for r in loser),
        "loser_round_trips": statistics.median(r[3] for r in loser),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ledger", default="sqlite,postgresql")
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--passes", type=int, default=10, help="ticks (minutes) per shape")
    p.add_argument("--shapes", default="aligned,spread")
    p.add_argument("--pg-url", default=os.environ.get(
        "RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = p.parse_args()
    counts = Counts()
    count_round_trips(counts)
    print(f"ratchet {ratchet.__version__}, {args.schedules} schedules, {args.passes} passes "
          "per shape; per pass: median (max)")
    header = (f"{'ledger':<10} {'shape':<8} {'due/pass':>8} {'pass ms':>16} {'ms/tick':>8} "
              f"{'tx':>3} {'stmts':>5} {'rtrips':>6} | {'2nd sched ms':>12} {'stmts':>5} "
              f"{'rtrips':>6} | {'register ms':>11}")
    print(header)
    for ledger in args.ledger.split(","):
        for shape in args.shapes.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                if ledger == "sqlite":
                    url = f"sqlite:///{tmp}/bench.db"
                    schema = None
                else:
                    schema = "rbench_periodic_" + uuid.uuid4().hex[:8]
                    url = f"{args.pg_url}?schema={schema}"
                try:
                    r = run_shape(url, args.schedules, shape, args.passes, counts)
                finally:
                    if schema is not None:
                        import psycopg

                        with psycopg.connect(args.pg_url, autocommit=True) as conn:
                            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            print(f"{ledger:<10} {shape:<8} {r['ticks_per_pass']:>8.0f} "
                  f"{r['pass_ms_p50']:>7.1f} ({r['pass_ms_max']:>6.1f}) "
                  f"{r['ms_per_tick']:>8.3f} {r['tx']:>3.0f} {r['statements']:>5.0f} "
                  f"{r['round_trips']:>6.0f} | {r['loser_ms_p50']:>12.1f} "
                  f"{r['loser_statements']:>5.0f} {r['loser_round_trips']:>6.0f} | "
                  f"{r['register_ms']:>11.1f}")


if __name__ == "__main__":
    main()
