-- Ratchet ledger, schema version 6 (SQLite): retention and a status that does not read the
-- whole history (DESIGN §9, §10.2). Additive only: processes of the previous release keep
-- working while it is applied (they never read or write the new tables).
--
-- * tasks_created: ratchet tasks / list_tasks walks it newest first (keyset on
--   (created_at, id)) instead of sorting the table.
-- * tasks_finished: finished tasks by finish time (updated_at never changes once a task is
--   terminal), for prune's oldest-first batches and for status's count of what finished
--   since the counts mark. Covering (name, state; the primary key comes with every entry
--   of a WITHOUT ROWID table), so neither reads the table.
-- * tasks_active: the non-terminal tasks by (name, state), for status's exact counts of
--   everything that is not finished (the claim cannot use it: its WHERE clause does not
--   name this predicate).
-- * audit_at: audit rows by time, for status's count of what happened since the counts
--   mark and for prune's pass over audit rows whose task is gone. audit_kind goes: only the
--   old whole-table count of status read it (an older process's status still answers,
--   by a scan), and a planner walked it for status's GROUP BY kind instead of reading
--   the few rows since the mark; every audit row written costs one index entry less.
-- * finished_counts, audit_counts, counts_mark: a rollup maintained outside the hot path
--   (by status and prune, never by a claim or a commit): finished_counts holds, per task
--   name and terminal state, how many tasks in the ledger finished before counts_mark.upto;
--   audit_counts holds, per kind, how many audit rows were ever written before it (kept
--   when prune deletes them). Status adds what finished or happened since the mark.

CREATE INDEX tasks_created ON tasks (created_at, id);
CREATE INDEX tasks_finished ON tasks (updated_at, name, state)
    WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
CREATE INDEX tasks_active ON tasks (name, state)
    WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
CREATE INDEX audit_at ON audit (at);
DROP INDEX audit_kind;

CREATE TABLE finished_counts (
    name  TEXT NOT NULL,
    state TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (name, state)
) WITHOUT ROWID;

CREATE TABLE audit_counts (
    kind TEXT PRIMARY KEY,
    n    INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE counts_mark (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    upto REAL NOT NULL
);
INSERT INTO counts_mark (id, upto) VALUES (1, 0);
