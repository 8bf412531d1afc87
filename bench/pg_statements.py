"""Where a PostgreSQL commit's time goes: each statement of ``commit_and_claim``, timed alone.

One thread submits N one-step tasks, claims a batch, then loops: a completion (step +
``SUCCEEDED``) for every claimed task and the next claim, in one ``commit_and_claim``
transaction, as a worker's writer does. The ledger's transaction object is patched to send
each statement in a round trip of its own (the real dialect groups them: DESIGN §10.1), so
the table shows the server's time per statement (plus one loopback round trip each), per
transaction and per statement. Prints figures; asserts nothing.

    .venv/bin/python bench/pg_statements.py --batch 80 --tasks 20000
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

import ratchet
import ratchet.ledger.pgtx as pgm
from ratchet.ledger.base import TaskWrite, Transition
from ratchet.serde import dumps
from ratchet.states import State


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=80, help="tasks per transaction (80)")
    p.add_argument("--tasks", type=int, default=20000, help="tasks in the ledger (20,000)")
    p.add_argument("--pg-url", default=os.environ.get(
        "RATCHET_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    p.add_argument("--prepared", choices=("on", "off"), default="on",
                   help="the ledger's prepared statements (URL option prepared=; on)")
    args = p.parse_args()
    schema = "rbench_stmts_" + uuid.uuid4().hex[:8]
    app = ratchet.App(f"{args.pg_url}?schema={schema}&prepared={args.prepared}")

    @app.task(name="noop")
    def noop(ctx: ratchet.TaskContext) -> None:
        return None

    try:
        for _ in range(args.tasks // 1000):
            app.submit_many([ratchet.SubmitRequest("noop", {})] * 1000)
        timings: dict[str, list[float]] = {}

        def timed(cur: Any, name: str, text: str) -> None:
            t = time.perf_counter()
            cur.execute(text.encode(), prepare=False)
            timings.setdefault(name, []).append(time.perf_counter() - t)

        def send(self: Any, name: str | None, params: Mapping[str, Any] | None = None,
                 tail: str | None = None,
                 more: Sequence[tuple[str, Mapping[str, Any] | None]] = ()) -> Any:
            cur = self._raw
            if not self.started:
                cur.execute("BEGIN")
                self.started = True
                cur.execute("SELECT " + pgm.NOW_EXPR)
                self._now = float(cur.fetchone()[0])
            for kept_name, part in zip(self._names, self._deferred, strict=True):
                timed(cur, kept_name, part)
            self._deferred, self._names = [], []
            results: list[list[tuple[Any, ...]]] = []
            for n, prm in ([(name, params)] if name is not None else []) + list(more):
                for part in self._bind(n, prm):
                    timed(cur, n, part)
                results.append(cur.fetchall() if cur.description is not None else [])
            self._results = results
            if tail:
                timed(cur, tail, tail)
            return cur

        def rows_many(self: Any, reads: Sequence[tuple[str, Mapping[str, Any] | None]]
                      ) -> list[list[tuple[Any, ...]]]:
            (name, params), *more = reads
            send(self, name, params, more=more)
            return list(self._results)

        def rows(self: Any, name: str, params: Mapping[str, Any] | None = None
                 ) -> list[tuple[Any, ...]]:
            return rows_many(self, [(name, params)])[0]

        pgm.PgTx._send = send  # type: ignore[method-assign]
        pgm.PgTx.rows_many = rows_many  # type: ignore[method-assign]
        pgm.PgTx.rows = rows  # type: ignore[method-assign]
        ledger = app.ledger
        claims = ledger.claim("bench", ["noop"], args.batch)
        done, t0 = 0, time.perf_counter()
        while claims:
            writes = [TaskWrite(c.task_id, c.generation, "bench", "finish",
                                steps=[("noop", dumps(None))],
                                transition=Transition(State.SUCCEEDED, result_json="null"))
                      for c in claims]
            _, claims = ledger.commit_and_claim(writes, "bench", ["noop"], args.batch)
            done += len(writes)
        elapsed = time.perf_counter() - t0
        txs = done / args.batch
        print(f"{done:,} tasks in {txs:,.0f} transactions of {args.batch}: {done / elapsed:,.0f}"
              " tasks/s with every statement in a round trip of its own")
        print(f"{'statement':16s} {'per tx ms':>9s} {'each ms':>8s} {'per task us':>11s}")
        total = 0.0
        for name, values in sorted(timings.items(), key=lambda kv: -sum(kv[1])):
            total += sum(values)
            spent = sum(values)
            print(f"{name:16s} {spent / txs * 1e3:9.2f} {spent / len(values) * 1e3:8.3f}"
                  f" {spent / done * 1e6:11.1f}")
        print(f"{'all':16s} {total / txs * 1e3:9.2f} {'':8s} {total / done * 1e6:11.1f}")
    finally:
        app.close()
        with psycopg.connect(args.pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
