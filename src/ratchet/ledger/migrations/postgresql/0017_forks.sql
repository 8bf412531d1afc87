-- Ratchet ledger (PostgreSQL): forks of a task from a step (DESIGN §8, fork). Additive only.
--
-- * forks: one row per task made by `ratchet fork` (task_id, the new task), naming the task
--   it was forked from (source_id), the stored checkpoint name it was forked at (from_step,
--   its first occurrence unless `name#N`) and that checkpoint's position (from_seq: the new
--   task holds copies of the source's steps and effects before it), the source's pinned
--   version and the version the fork pins, who forked it, why and when (ledger clock). A
--   table of its own, not columns of tasks: reads of a task row stay the same on a ledger
--   a newer release has not migrated, and the hot rows are not widened.
-- * forks_source: the forks of a task (its page lists them).

CREATE TABLE forks (
    task_id        text PRIMARY KEY,
    source_id      text NOT NULL,
    from_step      text NOT NULL,
    from_seq       integer NOT NULL,
    source_version integer NOT NULL,
    version        integer NOT NULL,
    created_at     double precision NOT NULL,
    by             text NOT NULL,
    reason         text NOT NULL
);
CREATE INDEX forks_source ON forks (source_id, created_at);
