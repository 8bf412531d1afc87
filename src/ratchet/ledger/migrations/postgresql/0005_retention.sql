-- Ratchet ledger, schema version 5 (PostgreSQL): retention and a status that does not read
-- the whole history (DESIGN §9, §10.2). Additive only: processes of the previous release
-- keep working while it is applied (they never read or write the new tables).
--
-- * tasks_created: ratchet tasks / list_tasks walks it newest first (keyset on
--   (created_at, id)) instead of sorting the table.
-- * tasks_finished: finished tasks by finish time (updated_at never changes once a task is
--   terminal), for prune's oldest-first batches (an ordered walk stopped at the batch size)
--   and for status's count of what finished since the counts mark.
-- * tasks_parked: the tasks neither ready, running nor finished (UNKNOWN, PAUSED) by
--   (name, state), for status's exact counts; ready and running tasks are counted from
--   tasks_ready and tasks_leased. (A partial index of every non-terminal task was tried:
--   its predicate is implied by "state = 'RUNNING'", and the planner took it for the
--   claim's expired-lease scan instead of tasks_leased: tests/test_ledger_plans.py.)
-- * audit_at: audit rows by time, for status's count of what happened since the counts
--   mark and for prune's pass over audit rows whose task is gone. audit_kind goes: only the
--   old whole-table count of status read it (an older process's status still answers,
--   by a scan), and a planner walked it for status's GROUP BY kind instead of reading
--   the few rows since the mark; every audit row written costs one index entry less.
-- * finished_counts, audit_counts, counts_mark: a rollup maintained outside the hot path
--   (by status and prune, never by a claim or a commit, so no worker ever waits on a
--   counter row): finished_counts holds, per task name and terminal state, how many tasks
--   in the ledger finished before counts_mark.upto; audit_counts holds, per kind, how many
--   audit rows were ever written before it (kept when prune deletes them). Status adds
--   what finished or happened since the mark.

CREATE INDEX tasks_created ON tasks (created_at, id);
CREATE INDEX tasks_finished ON tasks (updated_at)
    WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
CREATE INDEX tasks_parked ON tasks (name, state)
    WHERE state NOT IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED',
                        'CANCELLED');
CREATE INDEX audit_at ON audit (at);
DROP INDEX audit_kind;

CREATE TABLE finished_counts (
    name  text NOT NULL,
    state text NOT NULL,
    n     bigint NOT NULL,
    PRIMARY KEY (name, state)
);

CREATE TABLE audit_counts (
    kind text PRIMARY KEY,
    n    bigint NOT NULL
);

CREATE TABLE counts_mark (
    id   integer PRIMARY KEY CHECK (id = 1),
    upto double precision NOT NULL
);
INSERT INTO counts_mark (id, upto) VALUES (1, 0);
