-- Ratchet ledger statements, SQLite dialect.
--
-- One block per statement, named by a "-- name: NAME" line (procrastinate's
-- sql/queries.sql style); the engine (ledger/ops/*.py) refers to statements only by name
-- and postgresql.sql names the same ones. Parameters are named (:name). A list parameter
-- (names, ids, keys) arrives as a JSON array and is read with json_each. A statement the
-- engine runs as a batch is run once per row (executemany). A block may hold several
-- statements separated by ";" at the end of a line: they run in order and the rows of the
-- last one are returned.
-- Times are ledger-clock epoch seconds; the clock is read inside the transaction ("now").

-- name: now
SELECT (julianday('now') - 2440587.5) * 86400.0;

-- name: prepared_types
-- Not used on SQLite (statements are cached by the driver); kept for the catalogue.
SELECT NULL AS name, NULL AS parameter_types WHERE 0;

-- name: claim_probe
-- A lock-free look, so that idle polling does not take SQLite's write lock (now: the
-- ledger clock, read with the "now" statement just before).
SELECT EXISTS (SELECT 1 FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')
               AND run_at <= :now)
    OR EXISTS (SELECT 1 FROM tasks WHERE lease_until IS NOT NULL AND state = 'RUNNING'
               AND lease_until < :now)
    OR EXISTS (SELECT 1 FROM tasks WHERE state IN ('WAITING', 'COMPENSATING')
               AND run_at <= :now);

-- name: clock_repair_ready
-- After a backward step of the ledger clock (ledger/clock.py): a ready row written ahead
-- of the clock waits at most its own wait (run_at - updated_at) from now; a release
-- (run_at <= updated_at) is ready at once. Every other statement that rewrites updated_at
-- of a row whose run_at it keeps (claim_takeover, retire, transition, control_move)
-- re-anchors that run_at by the same expression, the identity unless updated_at > now, so
-- run_at - updated_at stays the row's own wait (resume_tasks and this repair read it).
UPDATE tasks SET run_at = MIN(run_at, :now + MAX(run_at - updated_at, 0)), updated_at = :now
WHERE state IN ('PENDING', 'RETRY_WAIT') AND updated_at > :now;

-- name: clock_repair_leases
-- After a backward step: no lease ends later than now + its lease_s.
UPDATE tasks SET lease_until = :now + lease_s
WHERE lease_until IS NOT NULL AND state = 'RUNNING' AND lease_until > :now + lease_s;

-- name: clock_repair_buckets
-- After a backward step: a rate bucket written ahead of the clock is brought back to it
-- (its tokens kept; a bucket's clock otherwise never goes back).
UPDATE rate_buckets SET updated_at = :now WHERE updated_at > :now;

-- name: submit_insert
-- run_at: the given time, else now + delay (delay >= 0, seconds).
-- A task with a concurrency key (ckey) is written WAITING for a slot (wait_kind 'key',
-- run_at far ahead, its own run_at kept in due_at); key_fill admits it when one is free.
-- The conflict target names the keyed rows only: it matches today's full unique index
-- and a partial one (no entry for key-less tasks) a later schema may put in its place.
INSERT INTO tasks (id, name, version, params, params_digest, idempotency_key, state,
                   max_attempts, lease_s, run_at, created_at, updated_at, quarantine_after,
                   tenant, trace_context, parent_id, queue, priority, fair_key, ckey,
                   ckey_max, due_at, wait_kind, flow_wait, rate_key, debounce_key,
                   debounce_until)
VALUES (:id, :name, :version, :params, :digest, :key,
        CASE WHEN :ckey IS NULL THEN 'PENDING' ELSE 'WAITING' END, :max_attempts, :lease_s,
        CASE WHEN :ckey IS NULL THEN COALESCE(:run_at, :now + :delay) ELSE 1e15 END,
        :now, :now, :quarantine_after, :tenant, :trace, :parent, :queue, :priority,
        :fair_key, :ckey, :ckey_max,
        CASE WHEN :ckey IS NULL THEN NULL ELSE COALESCE(:run_at, :now + :delay) END,
        CASE WHEN :ckey IS NULL THEN NULL ELSE 'key' END,
        CASE WHEN :ckey IS NOT NULL THEN 'key' WHEN :debounce_key IS NOT NULL
             THEN 'debounce' END,
        :rate_key, :debounce_key, :now + :debounce_max_s)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

-- name: submit_debounce
-- Debounced submits (DESIGN §8, debounce): one row per (name, debounce key) of a batch
-- (a JSON array), inserted in that order. A group whose task is still open (generation 0,
-- PENDING or WAITING: tasks_debounce) collapses into it: its params become the row's, it
-- starts `delay` seconds from now but never after the debounce_until its first submit set
-- (a task waiting for a concurrency key slot keeps run_at far ahead: its wanted start is
-- due_at). Else the row is a new task, written as submit_insert writes one. Returns each
-- group's task (its start: run_at, or due_at for a task waiting for a slot).
INSERT INTO tasks AS t (id, name, version, params, params_digest, idempotency_key, state,
                        max_attempts, lease_s, run_at, created_at, updated_at,
                        quarantine_after, tenant, trace_context, parent_id, queue, priority,
                        fair_key, ckey, ckey_max, due_at, wait_kind, flow_wait, rate_key,
                        debounce_key, debounce_until)
SELECT u.id, u.name, u.version, u.params, u.digest, NULL,
       CASE WHEN u.ckey IS NULL THEN 'PENDING' ELSE 'WAITING' END, u.max_attempts,
       u.lease_s,
       CASE WHEN u.ckey IS NULL THEN :now + u.delay ELSE 1e15 END,
       :now, :now, u.quarantine_after, u.tenant, u.trace, u.parent, u.queue,
       u.priority, u.fair_key, u.ckey, u.ckey_max,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE :now + u.delay END,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE 'key' END,
       CASE WHEN u.ckey IS NULL THEN 'debounce' ELSE 'key' END,
       u.rate_key, u.debounce_key, :now + u.debounce_max_s
FROM (SELECT json_extract(value, '$.id') AS id,
             json_extract(value, '$.name') AS name,
             json_extract(value, '$.version') AS version,
             json_extract(value, '$.params') AS params,
             json_extract(value, '$.digest') AS digest,
             json_extract(value, '$.max_attempts') AS max_attempts,
             json_extract(value, '$.lease_s') AS lease_s,
             json_extract(value, '$.delay') AS delay,
             json_extract(value, '$.quarantine_after') AS quarantine_after,
             json_extract(value, '$.tenant') AS tenant,
             json_extract(value, '$.trace') AS trace,
             json_extract(value, '$.parent') AS parent,
             json_extract(value, '$.queue') AS queue,
             json_extract(value, '$.priority') AS priority,
             json_extract(value, '$.fair_key') AS fair_key,
             json_extract(value, '$.ckey') AS ckey,
             json_extract(value, '$.ckey_max') AS ckey_max,
             json_extract(value, '$.rate_key') AS rate_key,
             json_extract(value, '$.debounce_key') AS debounce_key,
             json_extract(value, '$.debounce_max_s') AS debounce_max_s
      FROM json_each(:rows)) AS u
WHERE true
ORDER BY u.name, u.debounce_key
ON CONFLICT (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND generation = 0 AND state IN ('PENDING', 'WAITING')
DO UPDATE SET
    params = excluded.params, params_digest = excluded.params_digest,
    run_at = CASE WHEN t.wait_kind = 'key' THEN t.run_at
                  ELSE MIN(COALESCE(excluded.due_at, excluded.run_at),
                           COALESCE(t.debounce_until, 1e15)) END,
    due_at = CASE WHEN t.wait_kind = 'key'
                  THEN MIN(COALESCE(excluded.due_at, excluded.run_at),
                           COALESCE(t.debounce_until, 1e15))
                  ELSE t.due_at END,
    flow_wait = CASE WHEN t.wait_kind = 'key' THEN t.flow_wait ELSE 'debounce' END,
    updated_at = MAX(t.updated_at, :now)
RETURNING id, name, debounce_key, state,
          CASE WHEN wait_kind = 'key' THEN due_at ELSE run_at END;

-- name: submit_queues
-- The (name, queue) pairs a batch used (task_queues).
INSERT INTO task_queues (name, queue) VALUES (:name, :queue) ON CONFLICT DO NOTHING;

-- name: key_fill
-- Admit the oldest tasks waiting for a slot of (name, concurrency key) into its free
-- slots, each admission audited (the same ordered pick, before the update moves them):
-- what the triggers of schema 15 do when a holder ends.
INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
SELECT id, :now, 'wake', 'WAITING', 'PENDING', generation, NULL,
       json_object('cause', 'key slot', 'key', :key)
FROM tasks WHERE id IN (
    SELECT id FROM tasks
    WHERE name = :name AND ckey = :key AND state = 'WAITING' AND wait_kind = 'key'
    ORDER BY created_at, id
    LIMIT MAX(0, :max - (SELECT count(*) FROM tasks
                         WHERE name = :name AND ckey = :key AND key_slot = 1)));
UPDATE tasks SET state = 'PENDING', key_slot = 1, wait_kind = NULL, flow_wait = NULL,
                 run_at = COALESCE(due_at, :now), due_at = NULL,
                 updated_at = MAX(updated_at, :now)
WHERE id IN (
    SELECT id FROM tasks
    WHERE name = :name AND ckey = :key AND state = 'WAITING' AND wait_kind = 'key'
    ORDER BY created_at, id
    LIMIT MAX(0, :max - (SELECT count(*) FROM tasks
                         WHERE name = :name AND ckey = :key AND key_slot = 1)));

-- name: key_refill_take
-- SQLite admits at once (one writer): key_refill stays empty; kept for the catalogue.
DELETE FROM key_refill RETURNING name, key, max;

-- name: submit_present
-- Which of a re-sent batch's task ids the lost transaction wrote (ids are unique per task).
SELECT t.id FROM json_each(:ids) AS k CROSS JOIN tasks AS t ON t.id = k.value;

-- name: submit_existing
-- The keys drive the join (one probe of the key index each). Written as an IN list, the
-- planner scanned the table once statistics showed a column of NULL keys (no task of an
-- ANALYZEd ledger without keys): tests/test_ledger_plans.py.
SELECT t.idempotency_key, t.id, t.params_digest, t.created_at
FROM json_each(:keys) AS k CROSS JOIN tasks AS t ON t.idempotency_key = k.value;

-- name: audit_insert
INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
VALUES (:task_id, :at, :kind, :from_state, :to_state, :generation, :holder, :detail);

-- name: claim_expired
-- Expired leases of the given task names, oldest first (tasks_leased: lease_until IS NOT NULL
-- holds exactly the RUNNING rows). Versions: entry i of :names claims versions :lo[i] ..
-- :hi[i] of that name (a worker sends its (name, version) pairs, lo = hi); :served: the
-- queues the worker serves (NULL: every queue).
SELECT id, holder, generation, attempt, max_attempts, name, control_request, crash_count,
       quarantine_after
FROM tasks
WHERE lease_until IS NOT NULL AND lease_until < :now AND state = 'RUNNING'
  AND name IN (SELECT value FROM json_each(:names))
  AND EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
              AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                    AND json_extract(:hi, '$[' || n.key || ']'))
  AND (:served IS NULL OR queue IN (SELECT value FROM json_each(:served)))
ORDER BY lease_until LIMIT :limit;

-- name: claim_takeover
-- run_at re-anchored like every write that keeps it and rewrites updated_at (ledger/clock.py).
UPDATE tasks SET holder = :holder, generation = generation + 1, attempt = attempt + 1,
                 run_at = MIN(run_at, :now + MAX(run_at - updated_at, 0)),
                 lease_until = :now + lease_s, updated_at = :now
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'RUNNING'
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, 'RUNNING', control_request, trace_context;

-- name: claim_ready
-- The ready set of the claimed (name, version range) entries (as in claim_expired; a
-- worker's exact pairs are matched by a list built once per statement, the per-row range
-- test only runs for rows that miss it: 0.2 us a task, bench/README.md), every queue: the
-- few tasks with a priority by (priority DESC, run_at) on tasks_ready_priority, the rest
-- in run_at order on tasks_ready (tasks_ready holds only claimable rows), each walk
-- stopped at the limit (the first named: after ANALYZE of a ledger without priorities,
-- SQLite walked the whole ready set instead and sorted it), then the first by (priority DESC, run_at); then the lease:
-- holder, generation + 1 and lease_until from the ledger clock. The previous state goes
-- through a temporary table because SQLite's RETURNING shows only new values.
DELETE FROM temp.claim_pick;
INSERT INTO temp.claim_pick (id, from_state)
SELECT id, state FROM (
    SELECT * FROM (
        SELECT id, state, priority, run_at FROM tasks INDEXED BY tasks_ready_priority
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0 AND run_at <= :now
          AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY priority DESC, run_at LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT id, state, priority, run_at FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority = 0 AND run_at <= :now
          AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY run_at LIMIT :limit))
ORDER BY priority DESC, run_at, id LIMIT :limit;
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: claim_flow
-- What flow control a claim must know, in one statement (sent with the claim's other
-- reads): the (name, queue) pairs ever submitted of the claimed names (task_queues, a
-- small table; the claim walks the ready set once per pair it serves), the rate limits on
-- task types (rate_limits), and whether any claimable task has a priority (an empty probe
-- of tasks_ready_priority: without one, claims take claim_fifo, one walk, no sort).
SELECT 'queue', name, queue, NULL, NULL, NULL FROM task_queues WHERE name IN (SELECT value FROM json_each(:names))
UNION ALL
SELECT 'rate', name, NULL, rate_per_s, burst, key_param FROM rate_limits WHERE scope = 'type'
UNION ALL
SELECT 'priority', NULL, NULL, NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_ready_priority
               WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0);

-- name: claim_fifo
-- claim_ready while no claimable task has a priority (claim_priorities): the ready set in
-- run_at order (tasks_ready), every queue, stopped at the limit; then the lease.
DELETE FROM temp.claim_pick;
INSERT INTO temp.claim_pick (id, from_state)
SELECT id, state FROM tasks
WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now
  AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
ORDER BY run_at LIMIT :limit;
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: claim_fifo_queues
-- claim_ready_queues while no claimable task has a priority: per served queue a walk of
-- tasks_ready_queue stopped at the limit, then the oldest of those.
DELETE FROM temp.claim_pick;
INSERT INTO temp.claim_pick (id, from_state)
SELECT t.id, t.state FROM json_each(:served) AS q
JOIN tasks AS t ON t.id IN (
    SELECT r.id FROM tasks AS r
    WHERE r.queue = q.value AND r.state IN ('PENDING', 'RETRY_WAIT') AND r.run_at <= :now
      AND r.name IN (SELECT value FROM json_each(:names))
  AND ((r.name, r.version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = r.name
                  AND r.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
    ORDER BY r.run_at LIMIT :limit)
ORDER BY t.run_at, t.id LIMIT :limit;
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: claim_ready_queues
-- claim_ready for a worker that serves some queues (:served): per served queue a walk of
-- tasks_ready_queue (queue, run_at) stopped at the limit (a walk of every queue filtered
-- would cross other queues' backlogs; one IN list made SQLite sort the served queues'
-- whole ready set), and the tasks with a priority as in claim_ready (its queue test kept
-- off the index with a unary +: on tasks_ready_queue it visited every ready row).
DELETE FROM temp.claim_pick;
INSERT INTO temp.claim_pick (id, from_state)
SELECT id, state FROM (
    SELECT * FROM (
        SELECT id, state, priority, run_at FROM tasks INDEXED BY tasks_ready_priority
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0 AND run_at <= :now
          AND +queue IN (SELECT value FROM json_each(:served))
          AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY priority DESC, run_at LIMIT :limit)
    UNION ALL
    SELECT t.id, t.state, t.priority, t.run_at FROM json_each(:served) AS q
    JOIN tasks AS t ON t.id IN (
        SELECT r.id FROM tasks AS r
        WHERE r.queue = q.value AND r.state IN ('PENDING', 'RETRY_WAIT') AND r.priority = 0
          AND r.run_at <= :now
          AND r.name IN (SELECT value FROM json_each(:names))
  AND ((r.name, r.version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = r.name
                  AND r.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY r.run_at LIMIT :limit))
ORDER BY priority DESC, run_at, id LIMIT :limit;
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: claim_candidates
-- The ready tasks a claim under flow control (fairness, rate limits) chooses from, in the
-- served queues (:served; NULL: every queue), as claim_ready orders them; not yet claimed:
-- the engine plans which it takes (claim_ids) and which wait for a token (rate_defer).
SELECT * FROM (
    SELECT * FROM (
        SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at
        FROM tasks INDEXED BY tasks_ready_priority
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0 AND run_at <= :now
          AND (:served IS NULL OR queue IN (SELECT value FROM json_each(:served)))
          AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY priority DESC, run_at LIMIT :limit)
    UNION ALL
    SELECT * FROM (
        SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
        WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority = 0 AND run_at <= :now
          AND (:served IS NULL OR queue IN (SELECT value FROM json_each(:served)))
          AND name IN (SELECT value FROM json_each(:names))
  AND ((name, version) IN (SELECT n.value, l.value FROM json_each(:names) AS n
                           JOIN json_each(:lo) AS l ON l.key = n.key
                           JOIN json_each(:hi) AS h ON h.key = n.key WHERE l.value = h.value)
       OR EXISTS (SELECT 1 FROM json_each(:names) AS n WHERE n.value = tasks.name
                  AND tasks.version BETWEEN json_extract(:lo, '$[' || n.key || ']')
                                        AND json_extract(:hi, '$[' || n.key || ']')))
        ORDER BY run_at LIMIT :limit))
ORDER BY priority DESC, run_at, id LIMIT :limit;

-- name: claim_fair_keys
-- The fairness keys with tasks ready now of one (name, queue), in key order after
-- :after (where the engine's round-robin stopped last; NULL: from the first), at most
-- :limit: a skip scan of tasks_ready_fair, one index probe per key.
WITH RECURSIVE k(fk, n) AS (
    SELECT (SELECT fair_key FROM tasks
            WHERE name = :name AND queue = :queue AND state IN ('PENDING', 'RETRY_WAIT')
              AND fair_key IS NOT NULL AND run_at <= :now
              AND (:after IS NULL OR fair_key > :after)
            ORDER BY fair_key LIMIT 1), 1
    UNION ALL
    SELECT (SELECT fair_key FROM tasks
            WHERE name = :name AND queue = :queue AND state IN ('PENDING', 'RETRY_WAIT')
              AND fair_key IS NOT NULL AND run_at <= :now AND fair_key > k.fk
            ORDER BY fair_key LIMIT 1), k.n + 1
    FROM k WHERE k.fk IS NOT NULL AND k.n < :limit)
SELECT fk FROM k WHERE fk IS NOT NULL;

-- name: claim_fair_candidates
-- Per fairness key of one (name, queue) entry, its first :per_key ready tasks by
-- (priority DESC, run_at), on tasks_ready_fair (named: SQLite chose tasks_ready_queue and
-- sorted the queue's ready set).
SELECT t.id, t.name, t.tenant, t.fair_key, t.rate_key, t.params, t.priority, t.run_at
FROM json_each(:keys) AS k
JOIN tasks AS t ON t.id IN (
    SELECT r.id FROM tasks AS r INDEXED BY tasks_ready_fair
    WHERE r.name = :name AND r.queue = :queue AND r.fair_key = k.value
      AND r.state IN ('PENDING', 'RETRY_WAIT') AND r.run_at <= :now
      AND r.version BETWEEN :lo AND :hi
    ORDER BY r.priority DESC, r.run_at LIMIT :per_key);

-- name: claim_fair_unkeyed
-- The tasks of a fair (name, queue) entry stored without a fairness key (submitted by code
-- that did not declare the type fair), oldest first (see the PostgreSQL catalogue).
SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
WHERE name = :name AND queue = :queue AND fair_key IS NULL
  AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now
  AND version BETWEEN :lo AND :hi
ORDER BY run_at LIMIT :per_key;

-- name: claim_ids
-- Claim the chosen candidates, as claim_ready does.
DELETE FROM temp.claim_pick;
INSERT INTO temp.claim_pick (id, from_state)
SELECT id, state FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids)) AND state IN ('PENDING', 'RETRY_WAIT');
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: rate_buckets_open
-- The buckets a claim spends from, created full where never used.
INSERT INTO rate_buckets (scope, name, key, tokens, updated_at)
VALUES (:scope, :name, :key, :tokens, :now)
ON CONFLICT DO NOTHING;

-- name: rate_buckets_lock
-- The buckets' tokens (SQLite's write lock, held since BEGIN, serialises the claims).
SELECT b.scope, b.name, b.key, b.tokens, b.updated_at
FROM json_each(:scopes) AS s
JOIN json_each(:names) AS n ON n.key = s.key
JOIN json_each(:keys) AS k ON k.key = s.key
JOIN rate_buckets AS b ON b.scope = s.value AND b.name = n.value AND b.key = k.value
ORDER BY b.scope, b.name, b.key;

-- name: rate_buckets_save
-- The buckets' new tokens as of :at (see the PostgreSQL catalogue).
UPDATE rate_buckets SET tokens = :tokens, updated_at = :at
WHERE scope = :scope AND name = :name AND key = :key;

-- name: rate_defer
-- Candidates whose bucket is empty wait, without spending an attempt, until it holds a
-- token for them (run_at; flow_wait 'rate').
UPDATE tasks SET run_at = :run_at, flow_wait = 'rate', updated_at = :now
WHERE id = :id AND state IN ('PENDING', 'RETRY_WAIT');

-- name: rate_recheck
-- A type's limit changed (set or cleared by an operator): its tasks waiting for a token
-- are due again at once, and the next claim checks them against the new limit (moved by
-- the old one, a task of a 1/d limit would wait days after the limit was raised).
UPDATE tasks SET run_at = :now, updated_at = :now
WHERE name = :name AND flow_wait = 'rate' AND state IN ('PENDING', 'RETRY_WAIT')
  AND run_at > :now;

-- name: claim_steps
SELECT task_id, name, result, generation, committed_at, seq FROM steps
WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: claim_steps_taken
-- PostgreSQL only (a claim in one round trip); kept for the catalogue.
SELECT true;

-- name: claim_effects_taken
-- PostgreSQL only (a claim in one round trip); kept for the catalogue.
SELECT true;

-- name: claim_effects
-- Effects made inside a batch function ('ratchet:batch:...') belong to one batch, not to
-- the code path: ctx.batches reads those it needs (batch_effects), so a resume does not
-- load one row per finished batch. Two ranges of the primary key on either side of that
-- prefix (';' follows ':'; names compare bytewise), so the claim does not visit them
-- either (a NOT LIKE filter would read every one of them).
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id IN (SELECT value FROM json_each(:ids))
  AND name < 'ratchet:batch:'
UNION ALL
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id IN (SELECT value FROM json_each(:ids))
  AND name >= 'ratchet:batch;';

-- name: open_intents
SELECT task_id, name, key FROM effects
WHERE task_id IN (SELECT value FROM json_each(:ids)) AND state = 'intent'
ORDER BY task_id, name;

-- name: retire
-- A holder gone on its final attempt: FAILED, or UNKNOWN with an open effect intent (or an
-- operator's request applied: CANCELLED, PAUSED). The generation moves on, so whatever the
-- old holder still writes is fenced out; run_at is re-anchored (clock_repair_ready).
UPDATE tasks SET state = :state, holder = NULL, lease_until = NULL,
                 run_at = MIN(run_at, :now + MAX(run_at - updated_at, 0)),
                 generation = generation + 1, last_error = :error, last_traceback = NULL,
                 error_class = :error_class, updated_at = :now, control_request = :request
WHERE id = :id AND generation = :generation AND state = 'RUNNING';

-- name: renew
UPDATE tasks SET lease_until = :now + lease_s
WHERE (id, generation) IN (SELECT i.value, g.value FROM json_each(:ids) AS i
                           JOIN json_each(:generations) AS g ON g.key = i.key)
  AND holder = :holder AND state = 'RUNNING' AND lease_until >= :now
RETURNING id, generation, lease_until;

-- name: renew_held
-- Leases a renewal did not extend that are still ours and unexpired (none on SQLite: the
-- write lock serialises everything, so renew extends every valid lease it is asked for).
SELECT id, generation, lease_until FROM tasks
WHERE (id, generation) IN (SELECT i.value, g.value FROM json_each(:ids) AS i
                           JOIN json_each(:generations) AS g ON g.key = i.key)
  AND holder = :holder AND state = 'RUNNING' AND lease_until >= :now;

-- name: worker_seen
UPDATE workers SET last_seen = :now WHERE holder = :holder AND state <> 'dead';

-- name: fence_read
-- The fence of a commit: state and generation of every task the batch writes (and an
-- operator's request, which the engine arbitrates against the write's transition).
SELECT id, state, generation, attempt, name, control_request FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: steps_upsert
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
VALUES (:task_id, :name, :result, :generation, :now, :seq)
ON CONFLICT (task_id, name) DO UPDATE SET result = excluded.result,
    generation = excluded.generation, committed_at = excluded.committed_at,
    seq = excluded.seq;

-- name: effects_intent
-- A re-sent intent (after a lost COMMIT reply) is not counted as a new call.
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
VALUES (:task_id, :name, :key, :digest, 'intent', NULL, :generation, :attempt, 1, 0, :now,
        :seq)
ON CONFLICT (task_id, name) DO UPDATE SET state = 'intent', key = excluded.key,
    params_digest = excluded.params_digest, generation = excluded.generation,
    attempt = excluded.attempt, seq = excluded.seq,
    calls = effects.calls + CASE WHEN :resend AND effects.state = 'intent'
        AND effects.generation = excluded.generation AND effects.key = excluded.key
        THEN 0 ELSE 1 END,
    updated_at = excluded.updated_at;

-- name: effects_outcome
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
VALUES (:task_id, :name, :key, :digest, :state, :result, :generation, :attempt, 0,
        :via_lookup, :now, :seq)
ON CONFLICT (task_id, name) DO UPDATE SET state = excluded.state, result = excluded.result,
    generation = excluded.generation, via_lookup = excluded.via_lookup,
    updated_at = excluded.updated_at, seq = COALESCE(excluded.seq, effects.seq);

-- name: transition
-- A fenced RUNNING -> state change. run_at is set for RETRY_WAIT / PENDING (backoff,
-- release delay); one ready now never moves later than it was (a clock stepped back
-- since the claim leaves it claimable, ledger/clock.py), one kept is re-anchored
-- (clock_repair_ready: a PAUSED row's wait stays its own); a release (to PENDING) hands its
-- attempt back; only RUNNING keeps the lease. A new error replaces the traceback too
-- (NULL when it has none); flow_wait is the row's ('rate': a downstream's rate limit
-- handed the attempt back; else NULL).
UPDATE tasks SET state = :state,
    run_at = CASE WHEN :run_at IS NULL THEN MIN(run_at, :now + MAX(run_at - updated_at, 0))
                  WHEN :run_at <= :now THEN MIN(run_at, :run_at)
                  ELSE :run_at END,
    attempt = CASE WHEN :release THEN attempt - 1 ELSE attempt END,
    holder = CASE WHEN :keep THEN holder ELSE NULL END,
    lease_until = CASE WHEN :keep THEN lease_until ELSE NULL END,
    result = COALESCE(:result, result), last_error = COALESCE(:error, last_error),
    last_traceback = CASE WHEN :error IS NULL THEN last_traceback ELSE :traceback END,
    error_class = COALESCE(:error_class, error_class), updated_at = :now,
    control_request = CASE WHEN :keep THEN control_request ELSE :request END,
    flow_wait = :flow_wait
WHERE id = :id AND generation = :generation AND state = 'RUNNING';

-- name: resolve_lock
SELECT state, generation, name, control_request FROM tasks WHERE id = :id;

-- name: resolve_open_effects
SELECT name, key FROM effects WHERE task_id = :id AND state = 'intent' ORDER BY name;

-- name: resolve_effects
UPDATE effects SET state = :state, result = :result, updated_at = :now
WHERE task_id = :id AND state = 'intent';

-- name: resolve_task
UPDATE tasks SET state = 'PENDING', run_at = MIN(run_at, :now), updated_at = :now
WHERE id = :id AND state = 'UNKNOWN' AND generation = :generation;

-- name: holder_running
SELECT id, holder, generation, attempt, max_attempts, name, control_request, crash_count,
       quarantine_after
FROM tasks WHERE holder = :holder AND state = 'RUNNING' ORDER BY id;

-- name: revoke_retry
UPDATE tasks SET state = 'RETRY_WAIT', holder = NULL, lease_until = NULL,
    generation = generation + 1, run_at = MIN(run_at, :now), updated_at = :now,
    last_error = :error, last_traceback = NULL, error_class = 'holder_gone'
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'RUNNING' AND holder = :holder;

-- name: worker_dead
UPDATE workers SET state = 'dead' WHERE holder = :holder;

-- name: worker_register
INSERT INTO workers (holder, host_id, hostname, pid, pid_start, started_at, last_seen, state)
VALUES (:holder, :host_id, :hostname, :pid, :pid_start, :now, :now, 'alive')
ON CONFLICT (holder) DO UPDATE SET host_id = excluded.host_id,
    hostname = excluded.hostname, pid = excluded.pid, pid_start = excluded.pid_start,
    started_at = excluded.started_at, last_seen = excluded.last_seen, state = 'alive';

-- name: worker_touch
UPDATE workers SET last_seen = :now, state = :state WHERE holder = :holder AND state <> 'dead';

-- name: workers_all
SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state
FROM workers ORDER BY started_at;

-- name: workers_prune
-- Registry retention: rows of workers stopped or dead (never alive ones) last seen before
-- the cutoff (a few rows: the registry is small).
DELETE FROM workers WHERE state IN ('stopped', 'dead') AND last_seen < :cutoff
RETURNING holder;

-- name: worker_definitions_prune
-- Their (name, version) rows, deleted first in the same transaction.
DELETE FROM worker_definitions WHERE holder IN (
    SELECT holder FROM workers WHERE state IN ('stopped', 'dead') AND last_seen < :cutoff);

-- name: workers_on_host
SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state
FROM workers WHERE host_id = :host_id AND state = 'alive' ORDER BY started_at;

-- name: task_get
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE id = :id;

-- name: task_get_many
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE id IN (SELECT value FROM json_each(:ids));

-- name: timeline_audit
SELECT seq, task_id, at, kind, from_state, to_state, generation, holder, detail
FROM audit WHERE task_id = :id ORDER BY seq;

-- name: timeline_steps
SELECT name, result, generation, committed_at, seq FROM steps
WHERE task_id = :id ORDER BY seq NULLS FIRST, committed_at;

-- name: timeline_effects
SELECT name, key, params_digest, state, result, generation, attempt, calls, via_lookup,
       updated_at, seq
FROM effects WHERE task_id = :id ORDER BY seq NULLS FIRST, updated_at;

-- name: stats_counts
-- Counts per (name, state) without reading the history (DESIGN §9): the non-terminal tasks
-- exactly (tasks_active), plus the finished ones: the rollup (finished before the counts
-- mark) and what finished since (tasks_finished from the mark on; :upto is the mark, read
-- first by counts_read_mark).
SELECT name, state, SUM(n) FROM (
    SELECT name, state, COUNT(*) AS n FROM tasks
    WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') GROUP BY name, state
    UNION ALL
    SELECT name, state, COUNT(*) FROM tasks
    WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= :upto
    GROUP BY name, state
    UNION ALL
    SELECT name, state, n FROM finished_counts)
GROUP BY name, state HAVING SUM(n) > 0;

-- name: stats_oldest
SELECT MIN(run_at) FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now;

-- name: stats_kinds
-- Audit rows ever written, per kind: the rollup (before the counts mark, kept when prune
-- deletes the rows) plus the rows since the mark (audit_at). Every kind (a few dozen rows;
-- the engine picks the ones it reports): a kind filter here would be pushed into the
-- window and make it walk an index of kinds, i.e. every claim ever audited.
SELECT kind, SUM(n) FROM (
    SELECT kind, n FROM audit_counts
    UNION ALL
    SELECT kind, COUNT(*) FROM audit WHERE at >= :upto GROUP BY kind)
GROUP BY kind;

-- name: stats_unknown
-- Written with tasks_active's predicate, so the partial index serves it.
SELECT COUNT(*) FROM tasks
WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND state = 'UNKNOWN';

-- name: status_ready
-- ratchet status, per type (DESIGN §9): the PENDING / RETRY_WAIT tasks scheduled after the
-- ledger clock and the oldest run_at of those ready now; one pass over tasks_ready (the
-- backlog, never the history).
SELECT name, SUM(CASE WHEN run_at > :now THEN 1 ELSE 0 END),
       MIN(CASE WHEN run_at <= :now THEN run_at END)
FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') GROUP BY name;

-- name: status_unknown
-- UNKNOWN tasks of the given types (:names, JSON: those the counts show with UNKNOWN tasks)
-- and the earliest updated_at (when each entered UNKNOWN), and how many entered it since
-- :from_at and since :recent_at (they left the work a worker can do: the drain rate counts
-- them): one seek of
-- tasks_active per type (its predicate written out), never a walk of the whole backlog.
SELECT name, COUNT(*), MIN(updated_at),
       SUM(CASE WHEN updated_at >= :from_at THEN 1 ELSE 0 END),
       SUM(CASE WHEN updated_at >= :recent_at THEN 1 ELSE 0 END) FROM tasks
WHERE name IN (SELECT value FROM json_each(:names))
  AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND state = 'UNKNOWN'
GROUP BY name;

-- name: status_quarantined
-- Quarantined FAILED tasks per type (tasks_quarantine: only quarantined rows).
SELECT name, COUNT(*) FROM tasks WHERE quarantined = 1 AND state = 'FAILED' GROUP BY name;

-- name: status_arrivals
-- Tasks created in the window (:from_at, up to the read's clock) per type, those since
-- :recent_at (the window's recent part) and the newest created_at: a range of
-- tasks_created (two bounds: a planner without statistics still takes the index).
SELECT name, COUNT(*), SUM(CASE WHEN created_at >= :recent_at THEN 1 ELSE 0 END),
       MAX(created_at)
FROM tasks WHERE created_at >= :from_at AND created_at <= :now
GROUP BY name;

-- name: status_completions
-- Tasks finished in the window per type, and since :recent_at: a range of tasks_finished
-- (index only).
SELECT name, COUNT(*), SUM(CASE WHEN updated_at >= :recent_at THEN 1 ELSE 0 END)
FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= :from_at
  AND updated_at <= :now
GROUP BY name;

-- name: status_attempts
-- Attempts that ended in the window per type, and their summed duration (ratchet status:
-- the mean attempt duration, DESIGN §9). An attempt is a claim (or takeover) and its
-- holder's own end of it, the fenced RUNNING -> X transition of the same generation, any
-- outcome but a release (RUNNING -> PENDING: handed back at a shutdown, mostly a
-- prefetched task that never ran); a retire of a holder gone has no holder and is not
-- one, and a park's wait is not in one (its wake is a new claim). The newest :limit ends only: a backward walk of
-- audit_at (both bounds written) stopped at the limit, then per end a seek of audit_task
-- for its claim and a primary-key probe of tasks for its type.
SELECT t.name, COUNT(*), SUM(e.at - e.claimed_at) FROM (
    SELECT e.task_id, e.at,
           (SELECT c.at FROM audit AS c
            WHERE c.task_id = e.task_id AND c.seq < e.seq AND c.generation = e.generation
              AND c.kind IN ('claim', 'takeover')
            ORDER BY c.seq DESC LIMIT 1) AS claimed_at
    FROM audit AS e
    WHERE e.at >= :from_at AND e.at <= :now
      AND e.kind = 'transition' AND e.from_state = 'RUNNING' AND e.to_state <> 'PENDING'
      AND e.holder IS NOT NULL
    ORDER BY e.at DESC LIMIT :limit) AS e
JOIN tasks AS t ON t.id = e.task_id
WHERE e.claimed_at IS NOT NULL
GROUP BY t.name;

-- name: throughput_arrivals
-- Tasks created per bucket of :bucket_s seconds in [:from_at, :to_at), of one type
-- (:name) or all (NULL): a range of tasks_created.
SELECT CAST((created_at - :from_at) / :bucket_s AS INTEGER), COUNT(*) FROM tasks
WHERE created_at >= :from_at AND created_at < :to_at AND (:name IS NULL OR name = :name)
GROUP BY 1;

-- name: throughput_completions
-- Tasks finished per bucket, as throughput_arrivals: a range of tasks_finished.
SELECT CAST((updated_at - :from_at) / :bucket_s AS INTEGER), COUNT(*) FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= :from_at
  AND updated_at < :to_at AND (:name IS NULL OR name = :name)
GROUP BY 1;

-- name: late_effect_insert
-- Append-only, unfenced: a call sent by a holder whose claim had been taken over.
INSERT INTO late_effects (task_id, effect, key, generation, holder, at, outcome, detail)
VALUES (:task_id, :effect, :key, :generation, :holder, :now, :outcome,
        :detail);

-- name: late_effects_all
-- A late effect's kind is read with it, from its effect's record as it is now (the new
-- holder may settle the record after the late effect was recorded): 'accounted_for' when a
-- lookup hit settled the record and only one intent was ever recorded (calls = 1: one
-- request was sent, the late one, and the hit found it), else 'possible_duplicate'.
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup <> 0 AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
ORDER BY l.seq DESC LIMIT :limit;

-- name: late_effects_task
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup <> 0 AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
WHERE l.task_id = :id ORDER BY l.seq DESC LIMIT :limit;

-- name: effects_of_type
-- ratchet reconcile / Control.effects: the effect records of one task type's tasks, newest
-- task first (tasks_created, from :created_from on), by effect name within a task; keyset
-- pagination on (created_at, id, effect name). The COALESCE bounds are the index range
-- (a later page starts at its cursor instead of scanning the window again from its newest
-- end); the OR below them is the exact keyset condition. Effects are read by their primary key
-- (task_id, name) and deleted with their task (prune): no index of their own.
SELECT t.id, t.state, t.generation, t.created_at,
       e.name, e.key, e.params_digest, e.state, e.result, e.generation, e.attempt, e.calls,
       e.via_lookup, e.updated_at, e.seq
FROM tasks AS t JOIN effects AS e ON e.task_id = t.id
WHERE t.name = :name
  AND t.created_at >= COALESCE(:created_from, -1e308)
  AND t.created_at <= COALESCE(:cursor_at, 1e308)
  AND (:cursor_at IS NULL OR t.created_at < :cursor_at
       OR (t.created_at = :cursor_at AND (t.id < :cursor_id
           OR (t.id = :cursor_id AND e.name > :cursor_name))))
ORDER BY t.created_at DESC, t.id DESC, e.name
LIMIT :limit;

-- name: late_effects_of_type
-- ratchet reconcile: late effects of one task type's tasks (the table holds the rare calls
-- of stale holders: a scan of it, each row's task by primary key).
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup <> 0 AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l JOIN tasks AS t ON t.id = l.task_id
LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
WHERE t.name = :name AND (:since IS NULL OR l.at >= :since)
ORDER BY l.seq DESC LIMIT :limit;

-- name: stats_late
-- Every late effect, and those accounted for (the kind of late_effects_all).
SELECT COUNT(*), COALESCE(SUM(e.state = 'done' AND e.via_lookup <> 0 AND e.calls = 1
                              AND e.key = l.key), 0)
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect;

-- name: transaction_step_read
-- A transaction step's checkpoint (ctx.transaction), read after a lost COMMIT reply: it
-- commits atomically with the user's writes.
SELECT generation FROM steps WHERE task_id = :task_id AND name = :name;

-- name: tasks_list
-- ratchet tasks / Control.list_tasks: newest first, filters optional (NULL: no filter),
-- keyset pagination on (created_at, id) so pages neither skip nor repeat rows while tasks
-- are added. A scan of the tasks table ordered by created_at (an operator's query, not a
-- hot path).
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, NULL, NULL, queue, priority, ckey,
       key_slot, rate_key, flow_wait
FROM tasks
WHERE (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:names IS NULL OR name IN (SELECT value FROM json_each(:names)))
  AND (:key IS NULL OR idempotency_key = :key)
  AND (:created_from IS NULL OR created_at >= :created_from)
  AND (:created_to IS NULL OR created_at < :created_to)
  AND (:cursor_at IS NULL OR created_at < :cursor_at
       OR (created_at = :cursor_at AND id < :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: limits_all
-- Bulkheads (DESIGN §8): every concurrency limit. Read by every claim; an empty table
-- keeps the unlimited claim.
SELECT scope, name, reserved, maximum, version, updated_at, updated_by, reason
FROM limits ORDER BY scope, name;

-- name: limits_lock
-- Nothing to take: a SQLite claim holds the database's write lock (BEGIN IMMEDIATE), so
-- claims are serialised already.
SELECT 1;

-- name: limits_running
-- Slots in use: RUNNING rows (lease_until IS NOT NULL holds exactly them: tasks_leased)
-- per (name, tenant), expired leases included.
SELECT name, tenant, count(*) FROM tasks
WHERE lease_until IS NOT NULL AND state = 'RUNNING'
GROUP BY name, tenant;

-- name: limits_ready
-- Which reserved scopes have ready work (their idle reservation is lent out otherwise).
-- Tasks of a paused type are not ready work (:paused; the engine leaves paused types out
-- of the type list): a paused type's reservation is lent out like an idle one.
SELECT 'type', n.value FROM json_each(:names) AS n
WHERE EXISTS (SELECT 1 FROM tasks WHERE tasks.name = n.value
              AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now)
UNION ALL
SELECT 'tenant', t.value FROM json_each(:tenants) AS t
WHERE EXISTS (SELECT 1 FROM tasks WHERE tasks.tenant = t.value
              AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now
              AND tasks.name NOT IN (SELECT value FROM json_each(:paused)));

-- name: claim_limited
-- claim_ready under bulkheads (only when a limit applies; the numbers come from
-- ledger/bulkheads.py, lists as JSON arrays): by priority, then oldest first, at most
-- :name_limits[i] tasks of :names[i] (its cap), of which the first :name_reserved[i] come out of the slots owed
-- to it and the rest out of a pool shared by every name, at most :pool tasks in all; the
-- same per tenant (:tenants, :tenant_limits, :tenant_reserved, :tenant_pool; a tenant
-- without a limit row, or a task without a tenant, takes only from :tenant_pool); at most
-- :limit in all. Versions as in claim_ready: entry i claims versions :lo[i] .. :hi[i] of
-- :names[i], and a name may have several entries (one per version a worker runs; the
-- engine sends no two overlapping entries); its numbers are the name's, repeated per
-- entry, and rn_name ranks the name's tasks across all its entries, so a cap holds across
-- versions. Per entry that may take something, its first :limit ready tasks in the
-- served queues (:served; NULL: all) by priority, then run_at (two correlated walks as
-- in claim_ready), skipping the tenants that may take nothing, so
-- a capped tenant's backlog never hides the others'); then the caps filter in turn (name,
-- then tenant, then the two pools); a row one filter drops may still have used a rank of
-- an earlier one: the claim may take fewer, never more.
DELETE FROM temp.claim_pick;
WITH l AS (
    SELECT n.value AS name, json_extract(:lo, '$[' || n.key || ']') AS lo,
           json_extract(:hi, '$[' || n.key || ']') AS hi,
           json_extract(:name_limits, '$[' || n.key || ']') AS lim,
           json_extract(:name_reserved, '$[' || n.key || ']') AS own
    FROM json_each(:names) AS n),
tl AS (
    SELECT tn.value AS tenant, json_extract(:tenant_limits, '$[' || tn.key || ']') AS n,
           json_extract(:tenant_reserved, '$[' || tn.key || ']') AS own
    FROM json_each(:tenants) AS tn),
by_name AS (
    SELECT t.id, t.state, t.priority, t.run_at, t.tenant, l.lim AS name_limit,
           l.own AS name_own,
           row_number() OVER (PARTITION BY t.name
                              ORDER BY t.priority DESC, t.run_at, t.id) AS rn_name
    FROM l JOIN tasks AS t ON t.id IN (
        SELECT * FROM (
            SELECT r.id FROM tasks AS r
            WHERE r.name = l.name AND r.state IN ('PENDING', 'RETRY_WAIT')
              AND r.priority <> 0 AND r.run_at <= :now AND r.version BETWEEN l.lo AND l.hi
              AND (:served IS NULL OR r.queue IN (SELECT value FROM json_each(:served)))
              AND COALESCE((SELECT MIN(y.n, y.own + :tenant_pool) FROM tl AS y
                            WHERE y.tenant = r.tenant), :tenant_pool) > 0
            ORDER BY r.priority DESC, r.run_at LIMIT :limit)
        UNION ALL
        SELECT * FROM (
            SELECT r.id FROM tasks AS r
            WHERE r.name = l.name AND r.state IN ('PENDING', 'RETRY_WAIT')
              AND r.priority = 0 AND r.run_at <= :now AND r.version BETWEEN l.lo AND l.hi
              AND (:served IS NULL OR r.queue IN (SELECT value FROM json_each(:served)))
              AND COALESCE((SELECT MIN(y.n, y.own + :tenant_pool) FROM tl AS y
                            WHERE y.tenant = r.tenant), :tenant_pool) > 0
            ORDER BY r.run_at LIMIT :limit))
    WHERE MIN(l.lim, l.own + :pool) > 0),
by_tenant AS (
    SELECT c.id, c.state, c.priority, c.run_at, c.rn_name, c.name_own,
           COALESCE(tl.n, 1073741824) AS tenant_limit, COALESCE(tl.own, 0) AS tenant_own,
           row_number() OVER (PARTITION BY tl.tenant
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rn_tenant
    FROM by_name AS c LEFT JOIN tl ON tl.tenant = c.tenant
    WHERE c.rn_name <= c.name_limit),
pooled AS (
    SELECT id, state, priority, run_at, rn_name, name_own, rn_tenant, tenant_own,
           sum(CASE WHEN rn_name > name_own THEN 1 ELSE 0 END)
               OVER (ORDER BY priority DESC, run_at, id ROWS UNBOUNDED PRECEDING) AS pool_rank,
           sum(CASE WHEN rn_tenant > tenant_own THEN 1 ELSE 0 END)
               OVER (ORDER BY priority DESC, run_at, id ROWS UNBOUNDED PRECEDING) AS tenant_pool_rank
    FROM by_tenant WHERE rn_tenant <= tenant_limit)
INSERT INTO temp.claim_pick (id, from_state)
SELECT id, state FROM pooled
WHERE (rn_name <= name_own OR pool_rank <= :pool)
  AND (rn_tenant <= tenant_own OR tenant_pool_rank <= :tenant_pool)
ORDER BY priority DESC, run_at, id LIMIT :limit;
UPDATE tasks SET state = 'RUNNING', holder = :holder, generation = generation + 1,
                 attempt = attempt + 1, lease_until = :now + lease_s, updated_at = :now,
                 flow_wait = NULL
WHERE id IN (SELECT id FROM temp.claim_pick)
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, (SELECT p.from_state FROM temp.claim_pick p WHERE p.id = tasks.id),
          control_request, trace_context;

-- name: limit_upsert
INSERT INTO limits (scope, name, reserved, maximum, version, updated_at, updated_by, reason)
VALUES (:scope, :name, :reserved, :maximum, 1, :now, :operator, :reason)
ON CONFLICT (scope, name) DO UPDATE SET reserved = excluded.reserved,
    maximum = excluded.maximum, version = limits.version + 1,
    updated_at = excluded.updated_at, updated_by = excluded.updated_by,
    reason = excluded.reason
RETURNING scope, name, reserved, maximum, version, updated_at, updated_by, reason;

-- name: limit_delete
DELETE FROM limits WHERE scope = :scope AND name = :name
RETURNING scope, name, reserved, maximum, version, updated_at, updated_by, reason;

-- name: slot_ready
-- ratchet limits: ready tasks per (name, tenant) and the oldest one's run_at.
SELECT name, tenant, count(*), min(run_at) FROM tasks
WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= :now
GROUP BY name, tenant;

-- name: limits_audit
-- The latest limit changes (limit_set / limit_cleared audit rows), newest first. Their
-- task ids are "limit:SCOPE[:NAME]": a range of audit_task (task_id, seq), the few rows of
-- the limits' history (audit_kind is gone since the retention migration; a walk of every
-- audit row for them was the plan: tests/test_ledger_plans.py).
SELECT seq, task_id, at, kind, from_state, to_state, generation, holder, detail
FROM audit WHERE task_id >= 'limit:' AND task_id < 'limit;'
  AND kind IN ('limit_set', 'limit_cleared', 'rate_limit_set', 'rate_limit_cleared')
ORDER BY seq DESC LIMIT :limit;

-- name: rate_limit_list
-- Rate limits (DESIGN §8, flow control): every row, the code's and the operators', by
-- scope and name (a small table).
SELECT scope, name, rate_per_s, burst, key_param, source, version, updated_at, updated_by,
       reason
FROM rate_limits ORDER BY scope, name;

-- name: rate_limit_set
-- An operator's rate limit of a task type: it replaces the code's row (source
-- 'operator') and stands until an operator clears it.
INSERT INTO rate_limits (scope, name, rate_per_s, burst, key_param, source, version,
                         updated_at, updated_by, reason)
VALUES ('type', :name, :per_s, :burst, :key_param, 'operator', 1, :now, :operator, :reason)
ON CONFLICT (scope, name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    burst = excluded.burst, key_param = excluded.key_param, source = 'operator',
    version = rate_limits.version + 1, updated_at = excluded.updated_at,
    updated_by = excluded.updated_by, reason = excluded.reason
RETURNING scope, name, rate_per_s, burst, key_param, source, version, updated_at,
          updated_by, reason;

-- name: rate_limit_clear
-- An operator's rate limit of a task type, removed (a code row is not an operator's).
DELETE FROM rate_limits WHERE scope = 'type' AND name = :name AND source = 'operator'
RETURNING scope, name, rate_per_s, burst, key_param, source, version, updated_at,
          updated_by, reason;

-- name: rate_limit_code
-- A worker's registration: the rate limit its code declares for a task type, unless an
-- operator's row stands (it wins until cleared). An unchanged row is not written.
INSERT INTO rate_limits (scope, name, rate_per_s, burst, key_param, source, version,
                         updated_at, updated_by, reason)
VALUES ('type', :name, :per_s, :burst, :key_param, 'code', 1, :now, :holder,
        'declared in code')
ON CONFLICT (scope, name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    burst = excluded.burst, key_param = excluded.key_param,
    version = rate_limits.version + 1, updated_at = excluded.updated_at,
    updated_by = excluded.updated_by, reason = excluded.reason
WHERE rate_limits.source = 'code'
  AND (rate_limits.rate_per_s IS NOT excluded.rate_per_s
       OR rate_limits.burst IS NOT excluded.burst
       OR rate_limits.key_param IS NOT excluded.key_param);

-- name: rate_limit_code_drop
-- A worker's registration of a task type whose code declares no rate limit: the code's
-- row goes (an operator's stays).
DELETE FROM rate_limits WHERE scope = 'type' AND name = :name AND source = 'code';

-- name: rate_held
-- Tasks a rate limit holds back now, per type: PENDING / RETRY_WAIT with flow_wait 'rate'
-- and a run_at still to come (tasks_flow_wait: only rows flow control holds).
SELECT name, COUNT(*) FROM tasks
WHERE flow_wait = 'rate' AND state IN ('PENDING', 'RETRY_WAIT') AND run_at > :now
GROUP BY name;

-- name: rate_take
-- A downstream's token for one effect call (DESIGN §8, flow control), fenced: taken only
-- while the task is RUNNING under the caller's generation. The bucket is refilled at
-- per_s since its last write (a clock stepped back adds nothing), at most burst; a row
-- comes back only when a token was taken (a new bucket starts full).
INSERT INTO rate_buckets (scope, name, key, tokens, updated_at)
SELECT 'downstream', :name, :key, :burst - 1.0, :now
WHERE EXISTS (SELECT 1 FROM tasks WHERE id = :id AND generation = :generation
              AND state = 'RUNNING')
ON CONFLICT (scope, name, key) DO UPDATE SET
    tokens = MIN(:burst * 1.0, rate_buckets.tokens
                 + MAX(0.0, :now - rate_buckets.updated_at) * :per_s) - 1.0,
    updated_at = MAX(rate_buckets.updated_at, :now)
WHERE MIN(:burst * 1.0, rate_buckets.tokens
          + MAX(0.0, :now - rate_buckets.updated_at) * :per_s) >= 1.0
RETURNING tokens;

-- name: rate_take_wait
-- After rate_take took nothing: the task's generation and state (fenced out?) and the
-- bucket (when will it hold a token?).
SELECT t.generation, t.state, b.tokens, b.updated_at
FROM tasks t LEFT JOIN rate_buckets b
  ON b.scope = 'downstream' AND b.name = :name AND b.key = :key
WHERE t.id = :id;

-- name: flow_counts
-- ratchet status by queue, and the flow gauges (DESIGN §8, §9): live tasks per (name,
-- queue, state, flow_wait), with those of them due now. The backlog from tasks_ready, the
-- RUNNING rows from tasks_leased, the parked WAITING / COMPENSATING rows from
-- tasks_waiting: never the history.
SELECT name, queue, state, flow_wait, COUNT(*),
       SUM(CASE WHEN run_at <= :now THEN 1 ELSE 0 END)
FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') GROUP BY name, queue, state, flow_wait
UNION ALL
SELECT name, queue, 'RUNNING', NULL, COUNT(*), COUNT(*) FROM tasks
WHERE lease_until IS NOT NULL AND state = 'RUNNING' GROUP BY name, queue
UNION ALL
SELECT name, queue, state, flow_wait, COUNT(*), 0 FROM tasks
WHERE state IN ('WAITING', 'COMPENSATING') GROUP BY name, queue, state, flow_wait;

-- name: definitions_of
-- The stored definitions of the given names (a worker's registration compares specs).
SELECT name, version, spec FROM definitions
WHERE name IN (SELECT value FROM json_each(:names));

-- name: definition_upsert
INSERT INTO definitions (name, version, spec, first_registered_at, last_registered_at)
VALUES (:name, :version, :spec, :now, :now)
ON CONFLICT (name, version) DO UPDATE SET spec = excluded.spec,
    last_registered_at = excluded.last_registered_at;

-- name: worker_definitions_clear
DELETE FROM worker_definitions WHERE holder = :holder;

-- name: worker_definition_insert
INSERT INTO worker_definitions (holder, name, version) VALUES (:holder, :name, :version)
ON CONFLICT DO NOTHING;

-- name: worker_definition_specs
-- The spec of every definition each registered worker has (ratchet workers: its lease).
SELECT w.holder, d.spec FROM worker_definitions AS w
JOIN definitions AS d ON d.name = w.name AND d.version = w.version;

-- name: definitions_all
SELECT name, version, spec, first_registered_at, last_registered_at FROM definitions
ORDER BY name, version;

-- name: ready_by_version
-- Ready tasks per (name, version), for the versions no live worker has (ratchet status).
SELECT name, version, COUNT(*), MIN(run_at) FROM tasks
WHERE state IN ('PENDING', 'RETRY_WAIT')
GROUP BY name, version;

-- name: live_definitions
-- (name, version) pairs of workers alive in the registry and seen since :since.
SELECT d.name, d.version, COUNT(*) FROM worker_definitions AS d
JOIN workers AS w ON w.holder = d.holder
WHERE w.state = 'alive' AND w.last_seen >= :since
GROUP BY d.name, d.version;

-- name: live_worker_slots
-- Live workers (alive in the registry and seen since :since), one row per task type
-- each registered, with its slots and queues (NULL for a worker that recorded none; queues
-- NULL: every queue).
-- The registry is small.
SELECT DISTINCT w.holder, d.name, w.slots, w.queues
FROM workers AS w JOIN worker_definitions AS d ON d.holder = w.holder
WHERE w.state = 'alive' AND w.last_seen >= :since;

-- name: worker_slots_set
UPDATE workers SET slots = :slots, queues = :queues WHERE holder = :holder;

-- name: counts_read_mark
-- The counts mark (see stats_counts, migration 0005).
SELECT upto FROM counts_mark;

-- name: counts_lock
-- Advancing the counts (inside BEGIN IMMEDIATE): the mark and the horizon up to which
-- every finished task and audit row is committed. The write lock serialises every writer
-- and each reads the clock after taking it, so that is now.
SELECT upto, :now FROM counts_mark;

-- name: counts_window_tasks
SELECT name, state, COUNT(*) FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= :from_at
  AND updated_at < :to_at
GROUP BY name, state;

-- name: counts_window_audit
SELECT kind, COUNT(*) FROM audit WHERE at >= :from_at AND at < :to_at GROUP BY kind;

-- name: counts_add_tasks
-- CAST: a name read back as UndecodableText binds its stored bytes (a BLOB); as TEXT they
-- are the name the tasks rows hold, so the rollup and the rows since the mark sum as one.
INSERT INTO finished_counts (name, state, n) VALUES (CAST(:name AS TEXT), :state, :n)
ON CONFLICT (name, state) DO UPDATE SET n = finished_counts.n + excluded.n;

-- name: counts_add_audit
INSERT INTO audit_counts (kind, n) VALUES (CAST(:kind AS TEXT), :n)
ON CONFLICT (kind) DO UPDATE SET n = audit_counts.n + excluded.n;

-- name: counts_set_mark
UPDATE counts_mark SET upto = :upto;

-- name: counts_mark_share
-- The mark, read by a prune batch (SQLite: the write lock already serialises it with an
-- advance of the counts).
SELECT upto FROM counts_mark;

-- name: prune_count
-- Dry run: what a prune at :cutoff would delete (finished tasks, their rows, and audit
-- rows older than :cutoff whose task is gone).
WITH old AS (SELECT id FROM tasks
             WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at < :cutoff)
SELECT (SELECT COUNT(*) FROM old),
       (SELECT COUNT(*) FROM steps WHERE task_id IN (SELECT id FROM old)),
       (SELECT COUNT(*) FROM effects WHERE task_id IN (SELECT id FROM old)),
       (SELECT COUNT(*) FROM late_effects WHERE task_id IN (SELECT id FROM old)),
       (SELECT COUNT(*) FROM audit WHERE task_id IN (SELECT id FROM old))
       + (SELECT COUNT(*) FROM audit AS a WHERE a.at < :cutoff
          AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = a.task_id));

-- name: prune_pick
-- One batch: the oldest finished tasks, an ordered walk of tasks_finished stopped at the
-- batch size (inside BEGIN IMMEDIATE: nothing else writes meanwhile).
SELECT id FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at < :cutoff
ORDER BY updated_at LIMIT :limit;

-- name: prune_tasks
-- Finished only, whatever was picked: a non-terminal task is never pruned.
DELETE FROM tasks WHERE id IN (SELECT value FROM json_each(:ids))
  AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
RETURNING id, name, state, updated_at;

-- name: prune_steps
DELETE FROM steps WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_effects
DELETE FROM effects WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_late_effects
DELETE FROM late_effects WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_forks
-- A pruned fork's link goes with it (the original's link rows stay with their forks).
DELETE FROM forks WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_batch_runs
DELETE FROM batch_runs WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_audit
DELETE FROM audit WHERE task_id IN (SELECT value FROM json_each(:ids))
RETURNING kind, at;

-- name: prune_audit_walk
-- Audit rows older than the cutoff, oldest first after (from_at, from_seq): one bounded
-- step of an ordered walk of audit_at (the rows of tasks still in the ledger are left).
SELECT seq, task_id, at FROM audit
WHERE at >= :from_at AND (at > :from_at OR seq > :from_seq) AND at < :cutoff
ORDER BY at LIMIT :limit;

-- name: prune_audit_gone
-- Of the walked rows, those whose task is gone (ledger-wide records such as prune's own,
-- rows of tasks deleted before): a primary-key probe per row and per task.
DELETE FROM audit WHERE seq IN (SELECT value FROM json_each(:seqs))
  AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = audit.task_id)
RETURNING kind, at;

-- name: prune_export_audit
SELECT seq, task_id, at, kind, from_state, to_state, generation, holder, detail FROM audit
WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY task_id, seq;

-- name: prune_export_late
SELECT seq, task_id, effect, key, generation, holder, at, outcome, detail FROM late_effects
WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY task_id, seq;

-- name: control_lock
-- An operator command's read of its task (the write lock is held: BEGIN IMMEDIATE).
SELECT state, generation, name, control_request, holder, lease_until, attempt, max_attempts,
       updated_at
FROM tasks WHERE id = :id;

-- name: control_move
-- An operator's move of a task that is not running (cancel, resume, retry, give-up; checked
-- against OPERATOR_MOVES by the engine), conditional on the state and generation read.
-- bump: added to the generation (1: whatever an older holder still writes is fenced out);
-- reset: a fresh set of attempts and quarantine counters (retry); run_at: when it is ready
-- (NULL: kept, re-anchored as in clock_repair_ready; ready now: never later than it was,
-- ledger/clock.py).
UPDATE tasks SET state = :state, generation = generation + :bump, holder = NULL,
    lease_until = NULL, control_request = :request,
    run_at = CASE WHEN :run_at IS NULL THEN MIN(run_at, :now + MAX(run_at - updated_at, 0))
                  WHEN :run_at <= :now THEN MIN(run_at, :run_at)
                  ELSE :run_at END,
    attempt = CASE WHEN :reset THEN 0 ELSE attempt END,
    quarantined = CASE WHEN :reset THEN 0 ELSE quarantined END,
    fingerprint_count = CASE WHEN :reset THEN 0 ELSE fingerprint_count END,
    crash_count = CASE WHEN :reset THEN 0 ELSE crash_count END,
    last_error = COALESCE(:error, last_error),
    last_traceback = CASE WHEN :error IS NULL THEN last_traceback ELSE NULL END,
    error_class = COALESCE(:error_class, error_class), updated_at = :now
WHERE id = :id AND state = :from_state AND generation = :generation;

-- name: control_request_set
-- Record (or replace) an operator's request on a task, for its holder or its next one.
UPDATE tasks SET control_request = :request
WHERE id = :id AND state = :from_state AND generation = :generation;

-- name: control_requests
-- The requests on the leases a worker holds (its heartbeat polls this): a request on the
-- row (cancel, or the pause of that one task), or an active pause of its type or of
-- everything. Walks the worker's own RUNNING rows (tasks_holder).
SELECT t.id, t.generation, COALESCE(t.control_request, 'pause') FROM tasks AS t
WHERE t.holder = :holder AND t.state = 'RUNNING'
  AND (t.control_request IS NOT NULL OR EXISTS (
      SELECT 1 FROM pauses AS p WHERE p.resumed_at IS NULL
        AND (p.scope = 'all' OR (p.scope = 'type' AND p.target = t.name))));

-- name: claim_gate
-- Taken by every claim before it reads the active pauses (PostgreSQL: a shared advisory
-- lock that pause_gate takes exclusively). SQLite's write lock serializes already.
SELECT 1;

-- name: pause_gate
-- Taken by a pause of a type or of everything before it records the pause: a claim in
-- flight finishes first, every later claim sees the pause (SQLite: the write lock).
SELECT 1;

-- name: pauses_active
SELECT id, scope, target, version, paused_by, reason, created_at FROM pauses
WHERE resumed_at IS NULL ORDER BY id;

-- name: pause_version
-- The ledger's control version: the highest version a pause or resume has taken.
SELECT MAX(COALESCE(MAX(version), 0), COALESCE(MAX(resumed_version), 0)) FROM pauses;

-- name: pause_insert
INSERT INTO pauses (scope, target, version, paused_by, reason, created_at)
VALUES (:scope, :target, :version, :by, :reason, :now)
RETURNING id;

-- name: pause_resume
UPDATE pauses SET resumed_at = :now, resumed_by = :by, resume_reason = :reason,
                  resumed_version = :version
WHERE resumed_at IS NULL AND scope = :scope AND target = :target
RETURNING id, version;

-- name: paused_tasks
-- PAUSED tasks of a type (NULL: of every type), oldest pause first (tasks_paused).
SELECT id, name, generation, control_request FROM tasks
WHERE state = 'PAUSED' AND (:name IS NULL OR name = :name)
ORDER BY updated_at, id;

-- name: resume_tasks
-- Re-admit PAUSED tasks, each at its own run_at (a resume's rate staggers them), never
-- before the run_at it had (a delayed task keeps its schedule through a pause), that one
-- capped at its wait when paused (run_at - updated_at) from now: a pause written ahead of
-- a clock stepped back since does not stretch it (ledger/clock.py).
UPDATE tasks SET state = 'PENDING',
                 run_at = MAX(MIN(run_at, :now + MAX(run_at - updated_at, 0)), :run_at),
                 updated_at = :now,
                 control_request = NULLIF(control_request, 'pause')
WHERE id = :id AND state = 'PAUSED' AND generation = :generation;

-- name: running_by_type
-- RUNNING tasks per type (tasks_holder): those in a paused scope are short of a boundary.
SELECT name, COUNT(*) FROM tasks WHERE holder IS NOT NULL AND state = 'RUNNING'
GROUP BY name;

-- name: quarantine_read
-- Retry governance (DESIGN §7): the failure streak of tasks whose failure write carries an
-- error fingerprint (read with the commit's fence; the rows are the fence's).
SELECT id, fingerprint, fingerprint_count, quarantine_after FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids));

-- name: quarantine_mark
-- The engine's verdict on a failure or a dead holder's delivery: the streak, the crash
-- count and the quarantine flag (NULL: unchanged).
UPDATE tasks SET fingerprint = COALESCE(:fingerprint, fingerprint),
    fingerprint_count = COALESCE(:count, fingerprint_count),
    crash_count = COALESCE(:crashes, crash_count), quarantined = :quarantined,
    quarantined_at = CASE WHEN :quarantined THEN :now ELSE quarantined_at END
WHERE id = :id;

-- name: quarantine_groups
-- ratchet quarantine list: quarantined FAILED tasks per fingerprint (tasks_quarantine).
SELECT fingerprint, name, COUNT(*), MIN(quarantined_at), MAX(quarantined_at) FROM tasks
WHERE quarantined = 1 AND state = 'FAILED'
GROUP BY fingerprint, name ORDER BY MAX(quarantined_at) DESC, fingerprint LIMIT :limit;

-- name: quarantine_samples
-- The newest :per_group tasks of each listed fingerprint, with their last error.
SELECT fingerprint, id, last_error, error_class FROM (
    SELECT fingerprint, id, last_error, error_class, quarantined_at,
           ROW_NUMBER() OVER (PARTITION BY fingerprint
                              ORDER BY quarantined_at DESC, id DESC) AS n
    FROM tasks
    WHERE quarantined = 1 AND state = 'FAILED'
      AND fingerprint IN (SELECT value FROM json_each(:fingerprints)))
WHERE n <= :per_group ORDER BY fingerprint, quarantined_at DESC, id DESC;

-- name: quarantine_pick
-- The quarantined FAILED tasks of one fingerprint, oldest quarantine first (a replay).
SELECT id, name, generation, fingerprint_count, crash_count, updated_at FROM tasks
WHERE quarantined = 1 AND state = 'FAILED' AND fingerprint = :fingerprint
ORDER BY quarantined_at, id LIMIT :limit;

-- name: quarantine_replay_task
-- An operator's replay: back to PENDING with fresh attempt counters at a staggered run_at.
UPDATE tasks SET state = 'PENDING', attempt = 0,
    run_at = CASE WHEN :run_at <= :now THEN MIN(run_at, :run_at) ELSE :run_at END, quarantined = 0,
    fingerprint_count = 0, crash_count = 0, updated_at = :now
WHERE id = :id AND state = 'FAILED' AND quarantined = 1;

-- name: quarantine_lock
-- The tasks a replay writes that are still quarantined (SQLite: the write lock is held).
SELECT id FROM tasks
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'FAILED' AND quarantined = 1
ORDER BY id;

-- name: budget_lock
-- Retry budgets (DESIGN §7): the budgets a commit admits retries for. SQLite's write lock
-- already serialises every writer; the keys come back for the engine.
SELECT value FROM json_each(:keys) ORDER BY value;

-- name: budget_window
-- The counts of the given budgets from the last 301 s on (future buckets hold reserved
-- retries), summed over workers.
SELECT budget, bucket, SUM(calls), SUM(retries) FROM budget_counts
WHERE budget IN (SELECT value FROM json_each(:keys)) AND bucket >= :now - 301
GROUP BY budget, bucket;

-- name: budget_bump
-- Calls counted and retries reserved by one commit, in the rows of its own worker.
INSERT INTO budget_counts (budget, bucket, holder, calls, retries)
VALUES (:budget, :bucket, :holder, :calls, :retries)
ON CONFLICT (budget, bucket, holder) DO UPDATE SET calls = calls + excluded.calls,
    retries = retries + excluded.retries;

-- name: budget_prune
-- Buckets no window can reach any more.
DELETE FROM budget_counts
WHERE budget IN (SELECT value FROM json_each(:keys)) AND bucket < :before;

-- ---------------------------------------------------------------- workflows (waits, events,
-- children, compensation: DESIGN §3 waits, §5 compensation)

-- name: wake_due
-- The claim's wake-up: parked rows (WAITING, COMPENSATING) whose run_at has passed become
-- PENDING, so the claim that follows can take them (tasks_waiting; a bounded batch, oldest
-- first). wait_kind stays until the next wait ('compensate' tells the audit where it came
-- from).
UPDATE tasks SET state = 'PENDING', updated_at = :now
WHERE id IN (SELECT id FROM tasks WHERE state IN ('WAITING', 'COMPENSATING')
             AND run_at <= :now ORDER BY run_at LIMIT :wake_limit)
RETURNING id, generation, wait_kind;

-- name: wait_set
-- What a task that just parked itself (RUNNING -> WAITING, in the same transaction) waits
-- for; a wait on children counts them with wait_children.
UPDATE tasks SET wait_kind = :kind, wait_name = :name, wait_key = :key, wait_step = :step,
    wait_seq = :seq, wait_after = :after, wait_count = NULL
WHERE id = :id AND generation = :generation AND state = 'WAITING';

-- name: wait_event_check
-- The mailbox, read by the wait itself: the first event of its (name, key) sent since the
-- task was submitted that it has not received yet is delivered at once (written as the
-- wait's checkpoint, the task made PENDING). Events sent later find the task WAITING
-- (event_deliver); SQLite's write lock orders the two.
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT t.id, t.wait_step, json_object('seq', e.seq, 'payload', json(e.payload)),
       t.generation, :now, t.wait_seq
FROM tasks AS t JOIN events AS e ON e.name = t.wait_name AND e.key = t.wait_key
WHERE t.id = :id AND t.generation = :generation AND t.state = 'WAITING'
  AND e.seq > COALESCE(t.wait_after, 0) AND e.sent_at >= t.created_at
ORDER BY e.seq LIMIT 1
ON CONFLICT (task_id, name) DO NOTHING;
UPDATE tasks SET state = 'PENDING', run_at = MIN(run_at, :now), updated_at = :now
WHERE id = :id AND generation = :generation AND state = 'WAITING'
  AND EXISTS (SELECT 1 FROM steps AS s WHERE s.task_id = tasks.id AND s.name = tasks.wait_step)
RETURNING id;

-- name: wait_children
-- A parent parks on its children: those not ended yet are marked awaited (their end is
-- counted by the tasks_fan_in trigger), the parent waits for that many, and is PENDING at
-- once when none is left. Its other children are unmarked first: a wait it left without
-- their end (a pause, then a resume) must not count them against this one.
UPDATE tasks SET awaited = 0
WHERE parent_id = :id AND awaited = 1
  AND id NOT IN (SELECT value FROM json_each(:children));
UPDATE tasks SET awaited = 1
WHERE id IN (SELECT value FROM json_each(:children)) AND parent_id = :id
  AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED');
UPDATE tasks SET wait_count = (
    SELECT COUNT(*) FROM tasks AS c
    WHERE c.id IN (SELECT value FROM json_each(:children)) AND c.parent_id = :id
      AND c.awaited = 1)
WHERE id = :id AND generation = :generation AND state = 'WAITING';
UPDATE tasks SET state = 'PENDING', run_at = MIN(run_at, :now), updated_at = :now
WHERE id = :id AND generation = :generation AND state = 'WAITING' AND wait_count <= 0
RETURNING id, state;

-- name: event_insert
-- The mailbox: an event id sent again is the same event (nothing written).
INSERT INTO events (event_id, name, key, payload, sent_at, sent_by)
VALUES (:event_id, :name, :key, :payload, :now, :by)
ON CONFLICT (event_id) DO NOTHING
RETURNING seq;

-- name: event_get
SELECT seq, event_id, name, key, payload, sent_at FROM events WHERE event_id = :event_id;

-- name: event_deliver
-- A new event reaches every task WAITING on its (name, key) that was submitted before it
-- was sent and has not received it: written as each wait's checkpoint (a replay sees the
-- same payload), and the tasks made PENDING (tasks_wait_event).
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT id, wait_step, json_object('seq', :seq, 'payload', json(:payload)), generation,
       :now, wait_seq
FROM tasks
WHERE state = 'WAITING' AND wait_name = :name AND wait_key = :key AND wait_kind = 'event'
  AND COALESCE(wait_after, 0) < :seq
ON CONFLICT (task_id, name) DO NOTHING;
UPDATE tasks SET state = 'PENDING', run_at = MIN(run_at, :now), updated_at = :now
WHERE state = 'WAITING' AND wait_name = :name AND wait_key = :key AND wait_kind = 'event'
  AND COALESCE(wait_after, 0) < :seq
RETURNING id, generation;

-- name: events_prune
-- Retention: events sent before the cutoff (events_sent_at).
DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE sent_at < :cutoff
                                 ORDER BY sent_at LIMIT :limit);

-- name: task_children
-- The tasks a parent submitted with ctx.submit, oldest first (tasks_parent).
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE parent_id = :id ORDER BY created_at, id;

-- name: task_wait
-- What a task waits for, and its parent (inspect, status).
SELECT id, parent_id, state, wait_kind, wait_name, wait_key, wait_count, run_at
FROM tasks WHERE id IN (SELECT value FROM json_each(:ids));

-- name: compensating_mark
-- A task entering COMPENSATING: a fresh set of attempts for its compensations, and
-- wait_kind 'compensate' (the wake-up's audit names where it came from).
UPDATE tasks SET attempt = 0, wait_kind = 'compensate'
WHERE id IN (SELECT value FROM json_each(:ids)) AND state = 'COMPENSATING';

-- name: compensable_read
-- Whether a task recorded an effect with a compensation (its marker step).
SELECT task_id FROM steps
WHERE task_id IN (SELECT value FROM json_each(:ids)) AND name = 'ratchet:compensable';

-- batches: long work with a contiguous watermark (DESIGN §6 row 9) -----------------------

-- name: batch_runs_read
-- The batch runs of the given tasks: a commit carrying batch marks reads them under its
-- write lock (after the fence read); inspect and the conservation check read them too.
SELECT task_id, run, watermark, above, succeeded, failed, skipped, batches, total, done,
       started_at, updated_at, generation
FROM batch_runs WHERE task_id IN (SELECT value FROM json_each(:ids))
ORDER BY task_id, run;

-- name: batch_runs_upsert
-- A run's new state, computed by the commit from the marks and the row it read.
INSERT INTO batch_runs (task_id, run, watermark, above, succeeded, failed, skipped, batches,
                        total, done, started_at, updated_at, generation)
VALUES (:task_id, :run, :watermark, :above, :succeeded, :failed, :skipped, :batches,
        :total, :done, :started_at, :now, :generation)
ON CONFLICT (task_id, run) DO UPDATE SET watermark = excluded.watermark,
    above = excluded.above, succeeded = excluded.succeeded, failed = excluded.failed,
    skipped = excluded.skipped, batches = excluded.batches, total = excluded.total,
    done = excluded.done, updated_at = excluded.updated_at,
    generation = excluded.generation;

-- name: batch_effects
-- The effects of one run's batches at or past its watermark (names sort by the
-- zero-padded position: one range of the effects' primary key).
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id = :id AND name >= :lo AND name < :hi;

-- name: batch_runs_active
-- Watermarks of the unfinished runs of tasks not yet ended, per task type (metrics).
SELECT t.name, COUNT(*), SUM(b.watermark), SUM(b.succeeded + b.failed + b.skipped)
FROM batch_runs AS b JOIN tasks AS t ON t.id = b.task_id
WHERE b.done = 0 AND t.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
GROUP BY t.name ORDER BY t.name;

-- ---------------------------------------------------------------- schedules
-- Periodic schedules (ledger/ops/schedules.py). Cursors and tick instants are whole epoch
-- seconds.

-- name: schedules_all
SELECT name, task, spec, tz, misfire_grace_s, cursor_at, last_fired_at, fired, missed,
       last_missed_at, last_missed_reason, first_registered_at, registered_at, registered_by,
       seen_at, seen_by
FROM schedules ORDER BY name;

-- name: schedule_register
-- A scheduler's registration: a new schedule's cursor starts at :cursor (the registration
-- instant: no tick before it fires); a known one keeps its cursor and counts.
INSERT INTO schedules (name, task, spec, tz, misfire_grace_s, cursor_at,
                       first_registered_at, registered_at, registered_by, seen_at, seen_by)
VALUES (:name, :task, :spec, :tz, :grace, :cursor, :now, :now, :holder, :now, :holder)
ON CONFLICT (name) DO UPDATE SET task = excluded.task, spec = excluded.spec,
    tz = excluded.tz, misfire_grace_s = excluded.misfire_grace_s,
    registered_at = excluded.registered_at, registered_by = excluded.registered_by,
    seen_at = excluded.seen_at, seen_by = excluded.seen_by;

-- name: schedule_cursors
-- The rows of the given schedules a pass decides from (SQLite's write lock serialises
-- passes; PostgreSQL skips the rows another pass holds).
SELECT name, task, spec, tz, misfire_grace_s, cursor_at, last_fired_at, fired, missed,
       last_missed_at, last_missed_reason, first_registered_at, registered_at, registered_by,
       seen_at, seen_by
FROM schedules WHERE name IN (SELECT value FROM json_each(:names)) ORDER BY name;

-- name: schedule_advance
-- The compare-and-set of the cursors: a row moves only from the cursor its pass read
-- (u.from_s); the rows that moved come back (RETURNING), the others were moved by another
-- scheduler. :rows is a JSON array of {name, from_s, to_s, fired_s, nfired, nmissed,
-- missed_s, reason}.
UPDATE schedules SET cursor_at = u.to_s,
    last_fired_at = COALESCE(u.fired_s, schedules.last_fired_at),
    fired = schedules.fired + u.nfired, missed = schedules.missed + u.nmissed,
    last_missed_at = COALESCE(u.missed_s, schedules.last_missed_at),
    last_missed_reason = COALESCE(u.reason, schedules.last_missed_reason),
    seen_at = :now, seen_by = :holder
FROM (SELECT json_extract(value, '$.name') AS name, json_extract(value, '$.from_s') AS from_s,
             json_extract(value, '$.to_s') AS to_s, json_extract(value, '$.fired_s') AS fired_s,
             json_extract(value, '$.nfired') AS nfired,
             json_extract(value, '$.nmissed') AS nmissed,
             json_extract(value, '$.missed_s') AS missed_s,
             json_extract(value, '$.reason') AS reason
      FROM json_each(:rows)) AS u
WHERE schedules.name = u.name AND schedules.cursor_at = u.from_s
RETURNING name, task, spec, tz, misfire_grace_s, cursor_at, last_fired_at, fired, missed,
       last_missed_at, last_missed_reason, first_registered_at, registered_at, registered_by,
       seen_at, seen_by;

-- name: schedule_seen
-- Running schedulers say which schedules their code still has.
UPDATE schedules SET seen_at = :now, seen_by = :holder
WHERE name IN (SELECT value FROM json_each(:names));
