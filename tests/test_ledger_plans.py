"""Query plans of the ledger's hot statements, pinned with EXPLAIN on both dialects.

The indexes are designed for the statements (migrations sqlite/0003, postgresql/0002), so
no statement steers the planner. These tests hold that: each hot statement is planned on a
ledger with a large backlog of finished tasks, of ready tasks and of running tasks, first
with no planner statistics (a new ledger, or a burst of submissions before autovacuum's
ANALYZE) and then after ANALYZE, and must use the index it was designed for.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pgsupport import private_schema
from psycopg import sql

from ratchet import open_ledger
from ratchet.ledger.base import ClaimScope, claim_kinds
from ratchet.ledger.catalogue import load_catalogue
from ratchet.ledger.ops.flowclaims import entries_of, entry_params
from ratchet.ledger.pgprepared import HOT_STATEMENTS, prepare_text

FINISHED = 100_000
READY = 20_000
RUNNING = 2_000
NAME = "plan.task"

_FILL = (
    "INSERT INTO tasks (id, name, version, params, params_digest, state, generation, attempt,"
    " max_attempts, lease_s, holder, lease_until, run_at, created_at, updated_at)"
)


def _plan(conn: psycopg.Connection[Any], name: str, params: dict[str, Any],
          generic: bool = False, analyze: bool = False) -> str:
    """The plan of catalogue statement ``name`` with ``params``; ``generic``: the generic
    plan of it prepared (what a pooled connection runs after five executions,
    ledger/pgprepared.py), the parameters unknown to the planner; ``analyze``: run it too
    (rolled back), with the rows each node produced."""
    (statement,) = load_catalogue("postgresql")[name]
    explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " if analyze else "EXPLAIN "
    with conn.transaction(force_rollback=True):
        if not generic:
            rows = conn.execute(explain + statement, params).fetchall()
        else:
            prepare, order = prepare_text(name, statement)
            conn.execute(prepare)
            try:
                (types,) = conn.execute(
                    "SELECT parameter_types::text[] FROM pg_prepared_statements "
                    "WHERE name = %s", (f"ratchet_{name}",)).fetchone() or (None,)
                assert types is not None and len(types) == len(order)
                args = ", ".join(f"%({p})s::{t}" for p, t in zip(order, types, strict=True))
                conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                # Bound on the client, as the ledger sends it (a utility statement's
                # parameters have no types the server could infer).
                bound = psycopg.ClientCursor(conn).mogrify(
                    f"{explain}EXECUTE ratchet_{name}({args})", params)
                rows = conn.execute(bound).fetchall()
            finally:
                conn.execute(f"DEALLOCATE ratchet_{name}")
    return "\n".join(str(r[0]) for r in rows)


@pytest.fixture(scope="module")
def pg_backlog() -> Iterator[psycopg.Connection[Any]]:
    """A PostgreSQL ledger with finished, ready and running tasks, no statistics yet."""
    with private_schema("rt_plan") as (url, schema):
        open_ledger(url).close()
        base = url.split("?", 1)[0]
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            # No autovacuum ANALYZE behind the test's back: "no statistics" must stay so.
            conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
            for prefix, state, holder, count in (
                ("f", "SUCCEEDED", None, FINISHED),
                ("r", "PENDING", None, READY),
                ("x", "RUNNING", "h1", RUNNING),
            ):
                conn.execute(
                    _FILL + " SELECT %s || g, %s, 1, '{}', 'd', %s, 1, 1, 3, 30, %s,"
                    " CASE WHEN %s::text IS NULL THEN NULL ELSE 1e12 END, g, 0, 0"
                    " FROM generate_series(1, %s) AS g",
                    (prefix, NAME, state, holder, holder, count),
                )
            yield conn


def test_pg_batch_effects_are_ranges_not_filters() -> None:
    """A resume reads the run's batch effects past the watermark, and a claim every effect
    but the batch ones, as ranges of effects_name_bytes (names compared bytewise,
    migration 0013): neither visits the effects of the finished batches, whatever the
    database's collation."""
    with private_schema("rt_plan_eff") as (url, schema):
        open_ledger(url).close()
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute(
                "INSERT INTO effects (task_id, name, key, params_digest, state, generation,"
                " attempt, updated_at) SELECT 't1', 'ratchet:batch:items@'"
                " || lpad(g::text, 20, '0') || '/touch', 'k' || g, 'd', 'done', 1, 1, 0"
                " FROM generate_series(1, 20000) AS g")
            conn.execute(
                "INSERT INTO effects (task_id, name, key, params_digest, state, generation,"
                " attempt, updated_at) SELECT 't' || g, 'charge', 'k' || g, 'd', 'done', 1,"
                " 1, 0 FROM generate_series(2, 20000) AS g")
            conn.execute("ANALYZE effects")
            lo = "ratchet:batch:items@" + "19990".rjust(20, "0") + "/"
            for name, params in (
                ("batch_effects", {"id": "t1", "lo": lo, "hi": "ratchet:batch:items~"}),
                ("claim_effects", {"ids": ["t1"]}),
            ):
                plan = _plan(conn, name, params)
                assert "effects_name_bytes" in plan and "Seq Scan" not in plan, (name, plan)
                conds = [ln for ln in plan.splitlines() if "Index Cond" in ln]
                assert conds and all("name" in ln for ln in conds), (name, plan)


@pytest.mark.parametrize("generic", [False, True], ids=["text", "prepared-generic"])
@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_pg_hot_statements_use_their_indexes(
    pg_backlog: psycopg.Connection[Any], analyzed: bool, generic: bool
) -> None:
    """Sent as text (planned with its values) and prepared (the generic plan a pooled
    connection settles on), each hot statement walks the index it was designed for."""
    conn = pg_backlog
    if analyzed:
        conn.execute("ANALYZE tasks")
    hot = set(HOT_STATEMENTS)

    def _pg_plan(c: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> str:
        return _plan(c, name, params, generic=generic and name in hot)

    now = 1e11
    # Bare names (every version), a worker's (name, version) pairs, several versions.
    for kinds in ([NAME], [NAME, "other.task"], [(NAME, 1)], [(NAME, 2), ("other.task", 1)],
                  [(NAME, 1), (NAME, 2)]):
        walks = entries_of(claim_kinds(kinds), [], None)
        params = entry_params(walks, ClaimScope(), now, 20)
        plan = _pg_plan(conn, "claim_ready", {**params, "holder": "h"})
        # An ordered walk of tasks_ready per name that stops at the limit: never a bitmap
        # scan of the ready set followed by a sort of all of it. The version is checked
        # on the index entry (an index condition), not on the row read afterwards.
        assert "Index Scan using tasks_ready" in plan, plan
        assert "Bitmap" not in plan and "Seq Scan on tasks" not in plan, plan
        # The only sort is of the walks' results (at most 2 x entries x limit rows).
        sorts = [ln for ln in plan.splitlines() if "Sort Key" in ln]
        assert all("ranked." in ln for ln in sorts), plan
        assert "Index Scan using tasks_ready_priority" in plan, plan
        # Without prioritised tasks: one ordered walk per pair, stopped at the limit.
        plan = _pg_plan(conn, "claim_fifo",
                        {**params, "holder": "h", "checked": False, "audited": False})
        assert "Index Scan using tasks_ready on" in plan, plan
        assert "Seq Scan on tasks" not in plan, plan
        assert all("tasks_leased" in ln for ln in plan.splitlines()
                   if "Bitmap Index Scan" in ln), plan  # only the checked probe
        assert all("p.run_at" in ln for ln in plan.splitlines() if "Sort Key" in ln), plan
        index_cond = next(ln for ln in plan.splitlines()
                          if "Index Cond" in ln and "run_at" in ln)
        assert "version" in index_cond, plan
        # The same walk sent with the claim's reads, behind its checks of the picture (each
        # an index probe: no pause, limit, rate limit, priority or expired lease).
        plan = _pg_plan(conn, "claim_fifo",
                        {**params, "holder": "h", "checked": True, "audited": True})
        assert "Index Scan using tasks_ready on" in plan, plan
        assert "Seq Scan on tasks" not in plan, plan
        assert "tasks_leased" in plan and "tasks_ready_priority" in plan, plan
        assert all("tasks_leased" in ln for ln in plan.splitlines()
                   if "Bitmap Index Scan" in ln), plan  # only the expired-lease probe
        # Bulkheads (DESIGN §8): the limited claim walks tasks_ready per (name, version
        # range) entry the same way, the version on the index entry; the numbers are per
        # name, repeated per entry.
        plan = _pg_plan(conn, "claim_limited", {
            **params, "ename_limits": [20] * len(walks),
            "ename_reserved": [2] * len(walks), "pool": 10, "tenants": ["acme"],
            "tenant_limits": [5], "tenant_reserved": [0], "tenant_pool": 15, "limit": 20,
            "holder": "h"})
        assert "Index Scan using tasks_ready" in plan, plan
        assert "Bitmap" not in plan and "Seq Scan on tasks" not in plan, plan
        index_cond = next(ln for ln in plan.splitlines()
                          if "Index Cond" in ln and "run_at" in ln)
        assert "version" in index_cond, plan
    # Unchecked, the speculative walk's checks never run: folded away when planned with
    # its values, never executed under the generic plan (the OR stops at NOT checked).
    walks = entries_of(claim_kinds([NAME]), [], None)
    unchecked = {**entry_params(walks, ClaimScope(), now, 5), "holder": "h", "checked": False,
                 "audited": False}
    checks = ("pauses", "limits", "rate_limits", "tasks_leased", "tasks_ready_priority")
    folded = _plan(conn, "claim_fifo", unchecked, analyze=True)
    assert not any(c in folded for c in checks), folded
    lazy = _plan(conn, "claim_fifo", unchecked, generic=True, analyze=True)
    probes = [ln for ln in lazy.splitlines() if "->" in ln and any(c in ln for c in checks)]
    assert probes and all("never executed" in ln for ln in probes), lazy
    plan = _pg_plan(conn, "limits_running", {})
    assert "tasks_leased" in plan and "Seq Scan on tasks" not in plan, plan
    plan = _pg_plan(conn, "limits_ready", {"names": [NAME], "tenants": ["acme"],
                                          "paused": ["p.t"], "now": now})
    assert "tasks_ready" in plan and "Seq Scan on tasks" not in plan, plan
    # Control: the heartbeat's read of operator requests walks the worker's own rows.
    plan = _pg_plan(conn, "control_requests", {"holder": "h1"})
    assert "tasks_holder" in plan and "Seq Scan on tasks" not in plan, plan
    ids = [f"x{i}" for i in range(1, 81)]
    rows = [{"id": i, "generation": 1, "state": "SUCCEEDED", "run_at": None, "release": False,
             "keep": False, "result": "1", "error": None, "error_class": None} for i in ids]
    plan = _pg_plan(conn, "transition", {"rows": json.dumps(rows), "now": now})
    # Primary-key probes of the written tasks, not a join against every running task.
    assert "Index Scan on tasks_pkey" in plan or "Index Scan using tasks_pkey" in plan, plan
    assert "Seq Scan on tasks" not in plan and "tasks_holder" not in plan, plan
    plan = _pg_plan(conn, "fence_read", {"ids": ids})
    assert "tasks_pkey" in plan and "Seq Scan" not in plan, plan
    plan = _pg_plan(conn, "holder_running", {"holder": "h1"})
    assert "tasks_holder" in plan, plan
    plan = _pg_plan(conn, "claim_expired",
                    {"now": now, **claim_kinds([(NAME, 1)]), "limit": 20, "served": None})
    assert "tasks_leased" in plan and "Seq Scan" not in plan, plan
    # ratchet status' per-version backlog reads the ready set only, never the finished.
    plan = _pg_plan(conn, "ready_by_version", {})
    assert "tasks_ready" in plan and "Seq Scan on tasks" not in plan, plan


def test_pg_fenced_writes_probe_the_primary_key_while_draining() -> None:
    """A drain's shape: a fresh ledger (no statistics) of 20,000 PENDING tasks with 32 of
    them RUNNING. The transition and retire statements must probe tasks_pkey; joined on
    their JSON rows alone, the planner hash-joined a sequential scan of every task
    (3.6 ms a commit, bench/README.md)."""
    with private_schema("rt_plan_drain") as (url, schema):
        open_ledger(url).close()
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
            conn.execute(
                _FILL + " SELECT 'p' || g, %s, 1, '{}', 'd', CASE WHEN g <= 32 THEN"
                " 'RUNNING' ELSE 'PENDING' END, 1, 1, 3, 30, CASE WHEN g <= 32 THEN 'h'"
                " END, CASE WHEN g <= 32 THEN 1e12 END, g, 0, 0"
                " FROM generate_series(1, 20000) AS g", (NAME,))
            rows = [{"id": f"p{i}", "generation": 1, "state": "SUCCEEDED", "run_at": None,
                     "release": False, "keep": False, "result": "1", "error": None,
                     "error_class": None} for i in range(1, 33)]
            plan = _plan(conn, "transition", {"rows": json.dumps(rows), "now": 1e11})
            assert "tasks_pkey" in plan and "Seq Scan on tasks" not in plan, plan
            retire = [{"id": f"p{i}", "generation": 1, "state": "FAILED", "error": "x"}
                      for i in range(1, 33)]
            plan = _plan(conn, "retire", {"rows": json.dumps(retire), "now": 1e11})
            assert "tasks_pkey" in plan and "Seq Scan on tasks" not in plan, plan


def _sqlite_plan(conn: sqlite3.Connection, name: str, params: dict[str, Any]) -> str:
    return "\n".join(
        " / ".join(str(r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + text, params))
        for text in load_catalogue("sqlite")[name]
    )


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_sqlite_hot_statements_use_their_indexes(tmp_path: Path, analyzed: bool) -> None:
    path = tmp_path / "l.db"
    open_ledger(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TEMP TABLE claim_pick (id TEXT PRIMARY KEY, from_state TEXT)")
    for prefix, state, holder, count in (
        ("f", "SUCCEEDED", None, FINISHED // 4),
        ("r", "PENDING", None, READY // 4),
        ("x", "RUNNING", "h1", RUNNING),
    ):
        conn.execute(
            "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?) "
            + _FILL + " SELECT ? || i, ?, 1, '{}', 'd', ?, 1, 1, 3, 30, ?,"
            " CASE WHEN ? IS NULL THEN NULL ELSE 1e12 END, i, 0, 0 FROM g",
            (count, prefix, NAME, state, holder, holder),
        )
    conn.commit()
    if analyzed:
        conn.execute("ANALYZE")
    params: dict[str, Any] = {
        "now": 1e11, "limit": 20, "holder": "h",
        **{k: json.dumps(v) for k, v in claim_kinds([(NAME, 1)]).items()},
        "ids": json.dumps(["x1", "x2"]), "generations": json.dumps([1, 1]),
        "keys": json.dumps(["k1"]), "id": "x1", "generation": 1, "state": "SUCCEEDED",
        "run_at": None, "release": 0, "keep": 0, "result": None, "error": None,
        "error_class": None, "traceback": None, "request": None, "served": None,
        "flow_wait": None,
    }
    for kinds in ([NAME], [(NAME, 1)], [(NAME, 2), ("other.task", 1)], [(NAME, 1), (NAME, 2)]):
        ready = {**params, **{k: json.dumps(v) for k, v in claim_kinds(kinds).items()}}
        plan = _sqlite_plan(conn, "claim_ready", ready)
        # Two walks (tasks with a priority, then the rest in run_at order), each stopped
        # at the limit; the only sort is of their results (at most 2 x limit rows).
        assert "tasks_ready_priority" in plan and "USING INDEX tasks_ready (" in plan, plan
        assert plan.count("TEMP B-TREE") == 1, plan
        assert re.search(r"SCAN \(subquery-\d+\) / USE TEMP B-TREE FOR ORDER BY", plan), plan
        assert "SCAN tasks\n" not in plan + "\n" and "SCAN tasks /" not in plan, plan
    for kinds in ([NAME], [(NAME, 1)], [(NAME, 2), ("other.task", 1)]):
        fifo = {**params, **{k: json.dumps(v) for k, v in claim_kinds(kinds).items()}}
        plan = _sqlite_plan(conn, "claim_fifo", fifo)
        # Without prioritised tasks: the one run_at walk claims always had, no sort.
        assert "USING INDEX tasks_ready" in plan and "TEMP B-TREE" not in plan, plan
    plan = _sqlite_plan(conn, "claim_flow", {**params, "names": json.dumps([NAME])})
    assert "tasks_ready_priority" in plan and "SCAN tasks\n" not in plan + "\n", plan
    served = {**params, "served": json.dumps(["critical", "default"])}
    plan = _sqlite_plan(conn, "claim_ready_queues", served)
    # A worker serving some queues walks each one on tasks_ready_queue (queue, run_at).
    assert "USING INDEX tasks_ready_queue (queue=? AND run_at<?)" in plan, plan
    assert plan.count("TEMP B-TREE") == 1, plan
    plan = _sqlite_plan(conn, "claim_fifo_queues", served)
    assert "USING INDEX tasks_ready_queue (queue=? AND run_at<?)" in plan, plan
    for kinds in ([NAME, "other.task"], [(NAME, 1)], [(NAME, 1), (NAME, 2)]):
        entries = len(claim_kinds(kinds)["names"])
        plan = _sqlite_plan(conn, "claim_limited", {
            **params, **{k: json.dumps(v) for k, v in claim_kinds(kinds).items()},
            "name_limits": json.dumps([20] * entries),
            "name_reserved": json.dumps([2] * entries), "pool": 10, "tenants": '["acme"]',
            "tenant_limits": "[5]", "tenant_reserved": "[0]", "tenant_pool": 15})
        # Bulkheads: each entry's oldest ready rows through tasks_ready, found by primary
        # key.
        assert "USING INDEX tasks_ready" in plan and "SCAN tasks" not in plan, plan
        assert "SEARCH t USING PRIMARY KEY" in plan, plan
    plan = _sqlite_plan(conn, "limits_running", params)
    assert "tasks_leased" in plan and "SCAN tasks" not in plan, plan
    plan = _sqlite_plan(conn, "limits_ready", {**params, "names": json.dumps([NAME]),
                                               "tenants": '["acme"]', "paused": '["p.t"]'})
    assert "tasks_ready" in plan and "SCAN tasks" not in plan, plan
    plan = _sqlite_plan(conn, "claim_expired", params)
    assert "tasks_leased" in plan and "SCAN tasks" not in plan, plan
    plan = _sqlite_plan(conn, "ready_by_version", params)
    assert "SCAN tasks USING INDEX tasks_ready" in plan, plan
    plan = _sqlite_plan(conn, "transition", params)
    assert "PRIMARY KEY" in plan and "tasks_holder" not in plan, plan
    # The heartbeat's read of operator requests walks the worker's own rows.
    plan = _sqlite_plan(conn, "control_requests", params)
    assert "tasks_holder" in plan and "SCAN t " not in plan + " ", plan
    for name in ("fence_read", "task_get_many", "claim_takeover", "submit_existing"):
        plan = _sqlite_plan(conn, name, params)
        assert "SCAN tasks" not in plan and "SCAN t " not in plan + " ", (name, plan)
    # A claim skips the task's batch effects by two ranges of the primary key, and
    # ctx.batches reads those past the watermark as one range: neither visits the effects
    # of the finished batches (resuming is not O(finished batches)).
    plan = _sqlite_plan(conn, "claim_effects", params)
    assert "(task_id=? AND name<?)" in plan and "(task_id=? AND name>?)" in plan, plan
    plan = _sqlite_plan(conn, "batch_effects", {**params, "lo": "a", "hi": "b"})
    assert "(task_id=? AND name>? AND name<?)" in plan, plan
    conn.close()


# ---------------------------------------------------------------------- retention, listing
# Migrations sqlite/0005 and postgresql/0004 (DESIGN §9, §10.2): prune walks tasks_finished
# in batches, the listing walks tasks_created, status reads the non-terminal tasks and what
# finished or was audited since the counts mark from their indexes, never the history.

_HISTORY = 100_000  # finished tasks, with two audit rows and a step each
_IDS = [f"f{i}" for i in range(1, 201)]


@pytest.fixture(scope="module")
def pg_history() -> Iterator[psycopg.Connection[Any]]:
    """A PostgreSQL ledger whose history dominates: finished tasks (finish time g), their
    audit rows and steps, plus ready and running tasks; no statistics yet."""
    with private_schema("rt_plan_hist") as (url, schema):
        open_ledger(url).close()
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            for table in ("tasks", "audit", "steps"):
                conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)")
                             .format(sql.Identifier(table)))
            conn.execute(
                _FILL + " SELECT 'f' || g, %s, 1, '{}', 'd', 'SUCCEEDED', 1, 1, 3, 30, NULL,"
                " NULL, g, g, g FROM generate_series(1, %s) AS g", (NAME, _HISTORY))
            conn.execute(
                _FILL + " SELECT 'r' || g, %s, 1, '{}', 'd', 'PENDING', 0, 0, 3, 30, NULL,"
                " NULL, g, 1e6 + g, 1e6 + g FROM generate_series(1, %s) AS g", (NAME, READY))
            conn.execute(
                _FILL + " SELECT 'x' || g, %s, 1, '{}', 'd', 'RUNNING', 1, 1, 3, 30, 'h1',"
                " 1e12, g, 1e6 + g, 1e6 + g FROM generate_series(1, %s) AS g", (NAME, RUNNING))
            conn.execute("INSERT INTO audit (task_id, at, kind) SELECT 'f' || (g / 2), g / 2,"
                         " 'claim' FROM generate_series(2, %s) AS g", (2 * _HISTORY + 1,))
            conn.execute("INSERT INTO steps (task_id, name, result, generation, committed_at)"
                         " SELECT 'f' || g, 's', '1', 1, g FROM generate_series(1, %s) AS g",
                         (_HISTORY,))
            yield conn


_LIST = {"states": None, "names": None, "key": None, "created_from": None,
         "created_to": None, "cursor_at": None, "cursor_id": None, "limit": 51}


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_pg_prune_listing_and_status_use_their_indexes(
    pg_history: psycopg.Connection[Any], analyzed: bool
) -> None:
    conn = pg_history
    if analyzed:
        conn.execute("ANALYZE")
    batch = {"cutoff": _HISTORY / 2, "limit": 100}
    plan = _plan(conn, "prune_pick", batch)
    # The oldest finished tasks from tasks_finished; never a scan of the table.
    assert "tasks_finished" in plan and "Seq Scan" not in plan, plan
    _pg_capacity_plans(conn)
    for cursor in ({}, {"cursor_at": 1e6 + 5.0, "cursor_id": "r5"}):
        plan = _plan(conn, "tasks_list", {**_LIST, **cursor})
        # Newest first: a backward walk of tasks_created stopped at the page, no sort.
        assert "Index Scan Backward using tasks_created" in plan, plan
        assert "Sort" not in plan and "Seq Scan" not in plan, plan
    # ratchet limits' latest changes: a range of audit_task, never every audit row.
    plan = _plan(conn, "limits_audit", {"limit": 20})
    assert "audit_task" in plan and "Seq Scan on audit" not in plan, plan
    # Status counts the running tasks from tasks_leased and the audit since the mark from
    # audit_at, also on a table drained before its first ANALYZE (a scan of the table reads
    # every dead row version a drain left, of audit every row ever audited).
    upto = {"upto": float(_HISTORY - 10)}
    assert "tasks_leased" in _plan(conn, "stats_counts", upto)
    plan = _plan(conn, "stats_kinds", upto)
    assert "audit_at" in plan and "Seq Scan on audit " not in plan + " ", plan
    if not analyzed:
        return
    plan = _plan(conn, "stats_counts", upto)
    for index in ("tasks_ready", "tasks_leased", "tasks_parked", "tasks_finished"):
        assert index in plan, (index, plan)
    assert "Seq Scan on tasks" not in plan, plan
    # With statistics (autovacuum's ANALYZE): every prune statement probes by id or walks
    # its index in order, and status reads no history.
    assert "Index Scan using tasks_finished" in _plan(conn, "prune_pick", batch)
    assert "Sort" not in _plan(conn, "prune_pick", batch)
    for name, index in (("prune_tasks", "tasks_pkey"), ("prune_steps", "steps_pkey"),
                        ("prune_audit", "audit_task"), ("prune_export_audit", "audit_task")):
        plan = _plan(conn, name, {"ids": _IDS})
        assert index in plan and "Seq Scan" not in plan, (name, plan)
    plan = _plan(conn, "prune_audit_walk", {"cutoff": _HISTORY / 2, "from_at": 0.0,
                                               "from_seq": 0, "limit": 100})
    assert "Index Scan using audit_at" in plan and "Sort" not in plan, plan
    plan = _plan(conn, "prune_audit_gone", {"seqs": list(range(1, 201))})
    assert "audit_pkey" in plan and "tasks_pkey" in plan and "Seq Scan" not in plan, plan
    window = {"from_at": float(_HISTORY - 100), "to_at": float(_HISTORY)}
    assert "tasks_finished" in _plan(conn, "counts_window_tasks", window)
    assert "audit_at" in _plan(conn, "counts_window_audit", window)
    plan = _plan(conn, "stats_unknown", {})
    assert "tasks_parked" in plan and "Seq Scan" not in plan, plan


def test_pg_hot_tables_are_vacuumed_and_analyzed_early(
    pg_history: psycopg.Connection[Any]
) -> None:
    # A drain leaves two dead row versions per task: the hot tables are vacuumed and
    # analyzed after 2 % (tasks, audit) or 5 % (steps, effects) changed, not 10-20 %.
    options = dict(pg_history.execute(
        "SELECT relname, reloptions FROM pg_class WHERE relnamespace = "
        "current_schema()::regnamespace AND relname IN ('tasks', 'audit', 'steps', 'effects')"
    ).fetchall())
    for table, factor in (("tasks", "0.02"), ("audit", "0.02"), ("steps", "0.05"),
                          ("effects", "0.05")):
        for option in ("autovacuum_vacuum_scale_factor", "autovacuum_analyze_scale_factor",
                       "autovacuum_vacuum_insert_scale_factor"):
            assert f"{option}={factor}" in options[table], (table, options[table])


def _pg_capacity_plans(conn: psycopg.Connection[Any]) -> None:
    """The capacity view (Control.status, Control.throughput; DESIGN §9): the backlog from
    tasks_ready, the rest from partial indexes, the window's arrivals and completions by
    range scans of tasks_created / tasks_finished, never the history."""
    now = 1e6 + READY
    for name, index, params in (
        ("status_ready", "tasks_ready", {"now": now}),
        ("status_unknown", "tasks_parked", {"names": [NAME, "other"], "from_at": 0.0,
                                             "recent_at": 50.0}),
        ("status_quarantined", "tasks_quarantine", {}),
        ("status_arrivals", "tasks_created",
         {"from_at": now - 100, "recent_at": now - 25, "now": now}),
        ("status_completions", "tasks_finished",
         {"from_at": float(_HISTORY - 100), "recent_at": float(_HISTORY - 25), "now": now}),
        ("throughput_arrivals", "tasks_created",
         {"from_at": now - 100, "to_at": now, "bucket_s": 10.0, "name": None}),
        ("throughput_arrivals", "tasks_created",
         {"from_at": now - 100, "to_at": now, "bucket_s": 10.0, "name": NAME}),
        ("throughput_completions", "tasks_finished",
         {"from_at": float(_HISTORY - 100), "to_at": float(_HISTORY), "bucket_s": 10.0,
          "name": NAME}),
    ):
        plan = _plan(conn, name, params)
        assert index in plan and "Seq Scan on tasks" not in plan, (name, plan)
    # The mean attempt duration: the newest ends of the window (a backward walk of
    # audit_at stopped at the limit), each one's claim by a seek of audit_task and its
    # type by a primary-key probe; never a scan of the audit or of the tasks.
    plan = _plan(conn, "status_attempts", {"from_at": float(_HISTORY - 100),
                                              "now": float(_HISTORY), "limit": 10_000})
    for index in ("audit_at", "audit_task", "tasks_pkey"):
        assert index in plan, (index, plan)
    assert "Seq Scan" not in plan, plan
    plan = _plan(conn, "live_worker_slots", {"since": 0.0})
    assert "audit" not in plan, plan  # the registry: two small tables


def _sqlite_table_scan(plan: str, table: str) -> bool:
    """Whether an EXPLAIN QUERY PLAN line scans ``table`` itself (not one of its indexes)."""
    return any(step.strip() == f"SCAN {table}" for step in plan.replace("\n", " / ").split("/"))


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_sqlite_prune_listing_and_status_use_their_indexes(
    tmp_path: Path, analyzed: bool
) -> None:
    path = tmp_path / "l.db"
    open_ledger(f"sqlite:///{path}").close()
    conn = sqlite3.connect(path)
    count = _HISTORY // 4
    for prefix, state, holder, n, base in (("f", "SUCCEEDED", None, count, 0),
                                           ("r", "PENDING", None, READY // 4, 1e6),
                                           ("x", "RUNNING", "h1", RUNNING, 1e6)):
        conn.execute(
            "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < ?) "
            + _FILL + " SELECT ? || i, ?, 1, '{}', 'd', ?, 1, 1, 3, 30, ?,"
            " CASE WHEN ? IS NULL THEN NULL ELSE 1e12 END, i, ? + i, ? + i FROM g",
            (n, prefix, NAME, state, holder, holder, base, base))
    conn.execute("WITH RECURSIVE g(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM g WHERE i < ?)"
                 " INSERT INTO audit (task_id, at, kind) SELECT 'f' || (i / 2), i / 2, 'claim'"
                 " FROM g", (2 * count + 1,))
    conn.commit()
    if analyzed:
        conn.execute("ANALYZE")
    params: dict[str, Any] = {
        "cutoff": count / 2, "limit": 100, "ids": json.dumps(_IDS), "from_at": 0.0,
        "from_seq": 0, "seqs": json.dumps(list(range(1, 201))), "upto": float(count - 10),
        "to_at": float(count), **_LIST,
    }
    plan = _sqlite_plan(conn, "prune_pick", params)
    assert "tasks_finished" in plan and "TEMP B-TREE" not in plan, plan
    for name, index in (("prune_tasks", "PRIMARY KEY"), ("prune_steps", "PRIMARY KEY"),
                        ("prune_effects", "PRIMARY KEY"), ("prune_audit", "audit_task"),
                        ("prune_late_effects", "late_effects_task"),
                        ("prune_export_audit", "audit_task")):
        plan = _sqlite_plan(conn, name, params)
        assert index in plan and "SCAN audit" not in plan, (name, plan)
    plan = _sqlite_plan(conn, "prune_audit_walk", params)
    assert "audit_at" in plan and "TEMP B-TREE" not in plan, plan
    plan = _sqlite_plan(conn, "prune_audit_gone", params)
    assert "SCAN audit" not in plan and "SCAN t" not in plan, plan
    plan = _sqlite_plan(conn, "tasks_list", params)
    assert "tasks_created" in plan and "TEMP B-TREE" not in plan, plan
    plan = _sqlite_plan(conn, "limits_audit", params)
    assert "audit_task" in plan and not _sqlite_table_scan(plan, "audit"), plan
    plan = _sqlite_plan(conn, "stats_counts", params)
    assert "tasks_active" in plan and "tasks_finished" in plan, plan
    assert not _sqlite_table_scan(plan, "tasks"), plan
    plan = _sqlite_plan(conn, "stats_kinds", params)
    assert "audit_at" in plan and not _sqlite_table_scan(plan, "audit"), plan
    for name in ("counts_window_tasks", "counts_window_audit", "stats_unknown"):
        plan = _sqlite_plan(conn, name, {**params, "from_at": float(count - 100)})
        assert "USING" in plan and not _sqlite_table_scan(plan, "tasks"), (name, plan)
        assert not _sqlite_table_scan(plan, "audit"), (name, plan)
    # The capacity view (Control.status, Control.throughput; DESIGN §9).
    recent = 1e6 + READY // 4
    for name, index, extra in (
        ("status_ready", "tasks_ready", {"now": recent}),
        ("status_unknown", "tasks_active", {"names": json.dumps([NAME, "other"]),
                                             "from_at": 0.0, "recent_at": 50.0}),
        ("status_quarantined", "tasks_quarantine", {}),
        ("status_arrivals", "tasks_created",
         {"from_at": recent - 100, "recent_at": recent - 25, "now": recent}),
        ("status_completions", "tasks_finished",
         {"from_at": float(count - 100), "recent_at": float(count - 25), "now": recent}),
        ("throughput_arrivals", "tasks_created",
         {"from_at": recent - 100, "to_at": recent, "bucket_s": 10.0, "name": None}),
        ("throughput_arrivals", "tasks_created",
         {"from_at": recent - 100, "to_at": recent, "bucket_s": 10.0, "name": NAME}),
        ("throughput_completions", "tasks_finished",
         {"from_at": float(count - 100), "to_at": float(count), "bucket_s": 10.0,
          "name": NAME}),
    ):
        plan = _sqlite_plan(conn, name, {**params, **extra})
        assert index in plan and not _sqlite_table_scan(plan, "tasks"), (name, plan)
    plan = _sqlite_plan(conn, "status_attempts", {**params, "from_at": float(count - 100),
                                                  "now": float(count), "limit": 10_000})
    assert "audit_at" in plan and "audit_task" in plan, plan
    assert not _sqlite_table_scan(plan, "audit") and not _sqlite_table_scan(plan, "tasks"), plan
    plan = _sqlite_plan(conn, "live_worker_slots", {**params, "since": 0.0})
    assert "audit" not in plan, plan
    conn.close()
