-- Ratchet ledger (SQLite): fork a task from a step (schema 17, DESIGN §8, fork). The same
-- statements as on PostgreSQL (see its postgresql.fork.sql); the write lock (BEGIN
-- IMMEDIATE) serialises a fork with every other write of the source.

-- name: fork_source
-- The source task's row, as much of it as a fork copies.
SELECT id, name, version, state, generation, params, params_digest, max_attempts, lease_s,
       quarantine_after, tenant, queue, priority, fair_key, ckey, ckey_max, rate_key
FROM tasks WHERE id = :id;

-- name: fork_history
-- The source's checkpoints in code-path order (kind, stored name, position); rows written
-- without a position (an older release, the marker steps) come first with NULL.
SELECT kind, name, seq FROM (
    SELECT 'step' AS kind, name, seq FROM steps WHERE task_id = :id
    UNION ALL
    SELECT 'effect' AS kind, name, seq FROM effects WHERE task_id = :id
) ORDER BY seq NULLS FIRST, kind, name;

-- name: fork_copy_steps
-- The source's steps before the fork point, and its compensable marker, as the fork's.
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT :new_id, name, result, generation, committed_at, seq FROM steps
WHERE task_id = :id
  AND ((seq IS NOT NULL AND seq < :seq) OR (seq IS NULL AND name = :marker));

-- name: fork_copy_effects
-- The source's effects before the fork point as the fork's, in the state they are in (an
-- open intent stays one: the fork settles it by lookup first).
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
SELECT :new_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq FROM effects
WHERE task_id = :id AND seq IS NOT NULL AND seq < :seq;

-- name: fork_generation
-- The fork starts above the source's generation: fencing tokens of the keys it shares
-- with the source keep rising.
UPDATE tasks SET generation = :generation WHERE id = :id AND generation = 0;

-- name: fork_insert
INSERT INTO forks (task_id, source_id, from_step, from_seq, source_version, version,
                   created_at, by, reason)
VALUES (:task_id, :source_id, :from_step, :from_seq, :source_version, :version, :now, :by,
        :reason);

-- name: fork_links
-- The fork that made a task and the forks made from it, oldest first.
SELECT task_id, source_id, from_step, from_seq, source_version, version, created_at, by,
       reason
FROM forks WHERE task_id = :id
UNION ALL
SELECT task_id, source_id, from_step, from_seq, source_version, version, created_at, by,
       reason
FROM forks WHERE source_id = :id
ORDER BY created_at, task_id;

-- name: fork_lineage_root
-- A task's lineage step (the JSON of its lineage id), when it is a fork.
SELECT result FROM steps WHERE task_id = :id AND name = :name;

-- name: fork_lineage_lock
-- Serialises the writes that start a task of one lineage (fork, retry, compensate). On
-- SQLite the write lock (BEGIN IMMEDIATE) already does: nothing to take.
SELECT 1 WHERE :root IS NOT NULL;

-- name: fork_lineage
-- The tasks of a lineage: its first task and the forks made from it and from them, as far
-- as the links go (state, generation).
WITH RECURSIVE lineage (id) AS (
    SELECT :root
    UNION
    SELECT f.task_id FROM forks f JOIN lineage l ON f.source_id = l.id
)
SELECT t.id, t.state, t.generation FROM tasks t JOIN lineage l ON t.id = l.id
ORDER BY t.id;

-- name: fork_linked
-- Which of the tasks are linked by a fork (made by one, or forked from).
SELECT task_id FROM forks WHERE task_id IN (SELECT value FROM json_each(:ids))
UNION
SELECT source_id FROM forks WHERE source_id IN (SELECT value FROM json_each(:ids));
