-- Ratchet ledger (PostgreSQL): fork a task from a step (schema 17, DESIGN §8, fork). The
-- source's row is locked (FOR UPDATE) for the fork's transaction: an operator command or a
-- holder's commit of the source waits, so the history copied is the one whose state was
-- checked.

-- name: fork_source
-- The source task's row, as much of it as a fork copies.
SELECT id, name, version, state, generation, params, params_digest, max_attempts, lease_s,
       quarantine_after, tenant, queue, priority, fair_key, ckey, ckey_max, rate_key
FROM tasks WHERE id = %(id)s FOR UPDATE;

-- name: fork_history
-- The source's checkpoints in code-path order (kind, stored name, position); rows written
-- without a position (an older release, the marker steps) come first with NULL.
SELECT kind, name, seq FROM (
    SELECT 'step' AS kind, name, seq FROM steps WHERE task_id = %(id)s
    UNION ALL
    SELECT 'effect' AS kind, name, seq FROM effects WHERE task_id = %(id)s
) AS h ORDER BY seq NULLS FIRST, kind, name;

-- name: fork_copy_steps
-- The source's steps before the fork point, and its compensable marker, as the fork's.
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT %(new_id)s, name, result, generation, committed_at, seq FROM steps
WHERE task_id = %(id)s
  AND ((seq IS NOT NULL AND seq < %(seq)s) OR (seq IS NULL AND name = %(marker)s));

-- name: fork_copy_effects
-- The source's effects before the fork point as the fork's, in the state they are in (an
-- open intent stays one: the fork settles it by lookup first).
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
SELECT %(new_id)s, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq FROM effects
WHERE task_id = %(id)s AND seq IS NOT NULL AND seq < %(seq)s;

-- name: fork_generation
-- The fork starts above the source's generation: fencing tokens of the keys it shares
-- with the source keep rising.
UPDATE tasks SET generation = %(generation)s WHERE id = %(id)s AND generation = 0;

-- name: fork_insert
INSERT INTO forks (task_id, source_id, from_step, from_seq, source_version, version,
                   created_at, by, reason)
VALUES (%(task_id)s, %(source_id)s, %(from_step)s, %(from_seq)s, %(source_version)s, %(version)s, %(now)s, %(by)s,
        %(reason)s);

-- name: fork_links
-- The fork that made a task and the forks made from it, oldest first.
SELECT task_id, source_id, from_step, from_seq, source_version, version, created_at, by,
       reason
FROM forks WHERE task_id = %(id)s
UNION ALL
SELECT task_id, source_id, from_step, from_seq, source_version, version, created_at, by,
       reason
FROM forks WHERE source_id = %(id)s
ORDER BY created_at, task_id;

-- name: fork_lineage_root
-- A task's lineage step (the JSON of its lineage id), when it is a fork.
SELECT result FROM steps WHERE task_id = %(id)s AND name = %(name)s;

-- name: fork_lineage_lock
-- Serialises the writes that start a task of one lineage (fork, retry, compensate): a
-- transaction-scoped advisory lock on the lineage id, taken after the task's own row lock
-- (those writes lock no other task's row, so no lock order can cross).
SELECT 1 FROM pg_advisory_xact_lock(1381256270,
                                    hashtext(current_schema() || ':' || %(root)s));

-- name: fork_lineage
-- The tasks of a lineage: its first task and the forks made from it and from them, as far
-- as the links go (state, generation).
WITH RECURSIVE lineage (id) AS (
    SELECT CAST(%(root)s AS text)
    UNION
    SELECT f.task_id FROM forks f JOIN lineage l ON f.source_id = l.id
)
SELECT t.id, t.state, t.generation FROM tasks t JOIN lineage l ON t.id = l.id
ORDER BY t.id;

-- name: fork_linked
-- Which of the tasks are linked by a fork (made by one, or forked from).
SELECT task_id FROM forks WHERE task_id = ANY(%(ids)s::text[])
UNION
SELECT source_id FROM forks WHERE source_id = ANY(%(ids)s::text[]);
