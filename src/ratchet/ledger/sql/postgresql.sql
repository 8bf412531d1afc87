-- Ratchet ledger statements, PostgreSQL dialect.
--
-- One block per statement, named by a "-- name: NAME" line (procrastinate's
-- sql/queries.sql style); the engine (ledger/ops/*.py) refers to statements only by name
-- and sqlite.sql names the same ones. Parameters are named (%(name)s). A list parameter
-- arrives as an array (= ANY). A statement the engine runs as a batch gets its rows as one
-- JSON array, %(rows)s, read with json_to_recordset (the values shared by all rows are
-- plain parameters): one round trip per batch whatever its size, and one json.dumps on the
-- client instead of adapting an array per column (half the time per 100-row batch). Rows a
-- transaction locks are locked in id order.
-- Times are ledger-clock epoch seconds: the server's now(), read with the transaction's
-- BEGIN.

-- name: now
SELECT extract(epoch FROM now())::float8;

-- name: prepared_types
-- The parameter types the server inferred for the ledger's prepared statements on this
-- session (ledger/pgprepared.py casts each EXECUTE argument to its type).
SELECT name, parameter_types::text[] FROM pg_prepared_statements
WHERE name LIKE 'ratchet\_%%';

-- name: claim_probe
-- Not needed on PostgreSQL (claims never block each other); kept for the catalogue.
SELECT true;

-- name: clock_repair_ready
-- After a backward step of the ledger clock (ledger/clock.py): a ready row written ahead
-- of the clock waits at most its own wait (run_at - updated_at) from now; a release
-- (run_at <= updated_at) is ready at once. Rows locked by others (a claim in flight) are
-- skipped, not waited for. Every other statement that rewrites updated_at of a row whose
-- run_at it keeps (claim_takeover, retire, transition, control_move) re-anchors that run_at
-- by the same expression, the identity unless updated_at > now, so run_at - updated_at
-- stays the row's own wait (resume_tasks and this repair read it).
UPDATE tasks t
SET run_at = LEAST(t.run_at, %(now)s::float8 + GREATEST(t.run_at - t.updated_at, 0)),
    updated_at = %(now)s
FROM (SELECT id FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT')
        AND updated_at > %(now)s::float8 ORDER BY id FOR UPDATE SKIP LOCKED) AS s
WHERE t.id = s.id;

-- name: clock_repair_leases
-- After a backward step: no lease ends later than now + its lease_s (tasks_leased; rows
-- locked by their holder's renewal or commit are skipped).
UPDATE tasks t SET lease_until = %(now)s::float8 + t.lease_s
FROM (SELECT id FROM tasks WHERE lease_until IS NOT NULL AND state = 'RUNNING'
        AND lease_until > %(now)s::float8 + lease_s ORDER BY id FOR UPDATE SKIP LOCKED) AS s
WHERE t.id = s.id;

-- name: clock_repair_buckets
-- After a backward step: a rate bucket written ahead of the clock is brought back to it
-- (its tokens kept; a bucket's clock otherwise never goes back).
UPDATE rate_buckets SET updated_at = %(now)s::float8 WHERE updated_at > %(now)s::float8;

-- name: submit_insert
-- run_at: the given time, else now + delay (delay >= 0, seconds).
-- Rows arrive in idempotency-key order (and are inserted in that order), so two batches
-- sharing keys lock them in the same order: no deadlock.
-- A task with a concurrency key (ckey) is written WAITING for a slot (wait_kind 'key',
-- run_at far ahead, its own run_at kept in due_at); key_fill admits it when one is free.
-- The conflict target names the keyed rows only: it matches today's full unique index
-- and a partial one (no entry for key-less tasks) a later schema may put in its place.
INSERT INTO tasks (id, name, version, params, params_digest, idempotency_key, state,
                   max_attempts, lease_s, run_at, created_at, updated_at, quarantine_after,
                   tenant, trace_context, parent_id, queue, priority, fair_key, ckey,
                   ckey_max, due_at, wait_kind, flow_wait, rate_key, debounce_key,
                   debounce_until)
SELECT u.id, u.name, u.version, u.params, u.digest, u.key,
       CASE WHEN u.ckey IS NULL THEN 'PENDING' ELSE 'WAITING' END, u.max_attempts,
       u.lease_s,
       CASE WHEN u.ckey IS NULL THEN COALESCE(u.run_at, %(now)s + u.delay) ELSE 1e15 END,
       %(now)s, %(now)s, u.quarantine_after, u.tenant, u.trace, u.parent, u.queue,
       u.priority, u.fair_key, u.ckey, u.ckey_max,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE COALESCE(u.run_at, %(now)s + u.delay) END,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE 'key' END,
       CASE WHEN u.ckey IS NOT NULL THEN 'key' WHEN u.debounce_key IS NOT NULL
            THEN 'debounce' END,
       u.rate_key, u.debounce_key, %(now)s + u.debounce_max_s
FROM json_to_recordset(%(rows)s::json)
     AS u(id text, name text, version int, params text, digest text, key text,
          max_attempts int, lease_s float8, run_at float8, delay float8,
          quarantine_after int, tenant text, trace text, parent text, queue text,
          priority int, fair_key text, ckey text, ckey_max int, rate_key text,
          debounce_key text, debounce_max_s float8)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

-- name: submit_debounce
-- Debounced submits (DESIGN §8, debounce): one row per (name, debounce key) of a batch,
-- inserted in that order, so two batches sharing groups lock them in the same order.
-- A group whose task is still open (generation 0, PENDING or WAITING: tasks_debounce)
-- collapses into it: its params become the row's, it starts `delay` seconds from now but
-- never after the debounce_until its first submit set (a task waiting for a concurrency
-- key slot keeps run_at far ahead: its wanted start is due_at). Else the row is a new
-- task, written as submit_insert writes one. Returns each group's task (its start: run_at,
-- or due_at for a task waiting for a slot).
INSERT INTO tasks AS t (id, name, version, params, params_digest, idempotency_key, state,
                        max_attempts, lease_s, run_at, created_at, updated_at,
                        quarantine_after, tenant, trace_context, parent_id, queue, priority,
                        fair_key, ckey, ckey_max, due_at, wait_kind, flow_wait, rate_key,
                        debounce_key, debounce_until)
SELECT u.id, u.name, u.version, u.params, u.digest, NULL,
       CASE WHEN u.ckey IS NULL THEN 'PENDING' ELSE 'WAITING' END, u.max_attempts,
       u.lease_s,
       CASE WHEN u.ckey IS NULL THEN %(now)s + u.delay ELSE 1e15 END,
       %(now)s, %(now)s, u.quarantine_after, u.tenant, u.trace, u.parent, u.queue,
       u.priority, u.fair_key, u.ckey, u.ckey_max,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE %(now)s + u.delay END,
       CASE WHEN u.ckey IS NULL THEN NULL ELSE 'key' END,
       CASE WHEN u.ckey IS NULL THEN 'debounce' ELSE 'key' END,
       u.rate_key, u.debounce_key, %(now)s + u.debounce_max_s
FROM json_to_recordset(%(rows)s::json)
     AS u(id text, name text, version int, params text, digest text, max_attempts int,
          lease_s float8, delay float8, quarantine_after int, tenant text, trace text,
          parent text, queue text, priority int, fair_key text, ckey text, ckey_max int,
          rate_key text, debounce_key text, debounce_max_s float8)
ORDER BY u.name, u.debounce_key
ON CONFLICT (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND generation = 0 AND state IN ('PENDING', 'WAITING')
DO UPDATE SET
    params = EXCLUDED.params, params_digest = EXCLUDED.params_digest,
    run_at = CASE WHEN t.wait_kind = 'key' THEN t.run_at
                  ELSE LEAST(COALESCE(EXCLUDED.due_at, EXCLUDED.run_at),
                             COALESCE(t.debounce_until, 1e15)) END,
    due_at = CASE WHEN t.wait_kind = 'key'
                  THEN LEAST(COALESCE(EXCLUDED.due_at, EXCLUDED.run_at),
                             COALESCE(t.debounce_until, 1e15))
                  ELSE t.due_at END,
    flow_wait = CASE WHEN t.wait_kind = 'key' THEN t.flow_wait ELSE 'debounce' END,
    updated_at = GREATEST(t.updated_at, %(now)s)
RETURNING t.id, t.name, t.debounce_key, t.state,
          CASE WHEN t.wait_kind = 'key' THEN t.due_at ELSE t.run_at END;

-- name: submit_queues
-- The (name, queue) pairs a batch used, for the claims' walk per pair (task_queues).
INSERT INTO task_queues (name, queue)
SELECT u.name, u.queue FROM json_to_recordset(%(rows)s::json) AS u(name text, queue text)
ORDER BY u.name, u.queue
ON CONFLICT DO NOTHING;

-- name: key_fill
-- Admit the oldest tasks waiting for a slot of each (name, concurrency key) into its free
-- slots (ratchet_key_fill, under the key's advisory lock, tried: a key whose lock another
-- transaction holds is left in key_refill for the claims' wake-up).
SELECT ratchet_key_fill(k.name, k.key, k.max, %(now)s::float8)
FROM json_to_recordset(%(rows)s::json) AS k(name text, key text, max int)
ORDER BY k.name, k.key;

-- name: key_refill_take
-- The keys whose admission found their lock taken (key_refill), at most 100, each row
-- taken by one claim (SKIP LOCKED: a claim never waits for another's).
DELETE FROM key_refill WHERE ctid IN (
    SELECT ctid FROM key_refill ORDER BY name, key LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING name, key, max;

-- name: submit_present
-- Which of a re-sent batch's task ids the lost transaction wrote (ids are unique per task).
SELECT id FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: submit_existing
SELECT idempotency_key, id, params_digest, created_at FROM tasks
WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: audit_insert
INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
SELECT u.task_id, u.at, u.kind, u.from_state, u.to_state, u.generation, u.holder, u.detail
FROM ROWS FROM (json_to_recordset(%(rows)s::json)
         AS (task_id text, at float8, kind text, from_state text, to_state text,
             generation bigint, holder text, detail text)) WITH ORDINALITY
     AS u(task_id, at, kind, from_state, to_state, generation, holder, detail, n)
ORDER BY u.n;

-- name: claim_expired
-- Expired leases of the given task names, oldest first (tasks_leased: lease_until IS NOT NULL
-- holds exactly the RUNNING rows). Versions: entry i of names claims versions lo[i] ..
-- hi[i] of that name (a worker sends its (name, version) pairs, lo = hi); served: the
-- queues the worker serves (NULL: every queue).
SELECT id, holder, generation, attempt, max_attempts, name, control_request, crash_count,
       quarantine_after
FROM tasks
WHERE lease_until IS NOT NULL AND lease_until < %(now)s AND state = 'RUNNING'
  AND name = ANY(%(names)s::text[])
  AND EXISTS (SELECT 1 FROM unnest(%(names)s::text[], %(lo)s::int[], %(hi)s::int[])
                            AS n(name, lo, hi)
              WHERE n.name = tasks.name AND tasks.version BETWEEN n.lo AND n.hi)
  AND (%(served)s::text[] IS NULL OR queue = ANY(%(served)s::text[]))
ORDER BY lease_until LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: claim_takeover
-- run_at re-anchored like every write that keeps it and rewrites updated_at (ledger/clock.py).
UPDATE tasks SET holder = %(holder)s, generation = generation + 1, attempt = attempt + 1,
                 run_at = LEAST(run_at, %(now)s::float8 + GREATEST(run_at - updated_at, 0)),
                 lease_until = %(now)s + lease_s, updated_at = %(now)s
WHERE id = ANY(%(ids)s::text[]) AND state = 'RUNNING'
RETURNING id, name, version, params, generation, attempt, max_attempts, lease_s,
          lease_until, 'RUNNING', control_request, trace_context;

-- name: claim_ready
-- FOR UPDATE SKIP LOCKED on the ready set: concurrent claimers never wait on each other and
-- never get the same row. Entry i of enames / equeues / elo / ehi is a (name, queue) pair of
-- task_queues the worker serves and a version range of that name. Per entry two ordered
-- walks, each stopped at the limit: tasks_ready_priority (name, queue, priority DESC,
-- run_at) over the few tasks with a priority, and tasks_ready (name, queue, run_at,
-- version) over the rest (priority 0 as a filter), the version checked on the index entry
-- (other versions' tasks are skipped without reading their rows); then the first of
-- those by (priority DESC, run_at) are taken (at most 2 x entries x limit rows sorted).
-- The walks stay index scans whatever the statistics (tests/test_ledger_plans.py; a
-- single ordered scan with "name = ANY" made the planner sort the whole ready set when it
-- had no statistics; priority as a key column of the one walk would cross every future
-- row of a priority before the next). Rows locked but not taken are released at commit.
-- (FOR UPDATE is not allowed under UNION: one CTE per walk.) bench/ prints its EXPLAIN.
WITH e AS (
    SELECT * FROM unnest(%(enames)s::text[], %(equeues)s::text[], %(elo)s::int[],
                         %(ehi)s::int[]) AS n(name, queue, lo, hi)),
ranked AS (
    SELECT p.id, p.state, p.priority, p.run_at FROM e
    CROSS JOIN LATERAL (
        SELECT id, state, priority, run_at FROM tasks
        WHERE tasks.name = e.name AND tasks.queue = e.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0
          AND run_at <= %(now)s AND tasks.version BETWEEN e.lo AND e.hi
        ORDER BY priority DESC, run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p),
plain AS (
    SELECT p.id, p.state, 0 AS priority, p.run_at FROM e
    CROSS JOIN LATERAL (
        SELECT id, state, run_at FROM tasks
        WHERE tasks.name = e.name AND tasks.queue = e.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority = 0
          AND run_at <= %(now)s AND tasks.version BETWEEN e.lo AND e.hi
        ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p),
picked AS (
    SELECT id, state FROM (SELECT * FROM ranked UNION ALL SELECT * FROM plain) AS c
    ORDER BY priority DESC, run_at, id LIMIT %(limit)s)
UPDATE tasks t SET state = 'RUNNING', holder = %(holder)s, generation = t.generation + 1,
                   attempt = t.attempt + 1, lease_until = %(now)s + t.lease_s,
                   updated_at = %(now)s, flow_wait = NULL
FROM picked WHERE t.id = picked.id
RETURNING t.id, t.name, t.version, t.params, t.generation, t.attempt, t.max_attempts,
          t.lease_s, t.lease_until, picked.state, t.control_request, t.trace_context;

-- name: claim_flow
-- What flow control a claim must know, in one statement (sent with the claim's other
-- reads): the (name, queue) pairs ever submitted of the claimed names (task_queues, a
-- small table; the claim walks the ready set once per pair it serves), the rate limits on
-- task types (rate_limits), and whether any claimable task has a priority (an empty probe
-- of tasks_ready_priority: without one, claims take claim_fifo, one walk, no sort).
SELECT 'queue', name, queue, NULL, NULL, NULL FROM task_queues WHERE name = ANY(%(names)s::text[])
UNION ALL
SELECT 'rate', name, NULL, rate_per_s, burst, key_param FROM rate_limits WHERE scope = 'type'
UNION ALL
SELECT 'priority', NULL, NULL, NULL, NULL, NULL
WHERE EXISTS (SELECT 1 FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0);

-- name: claim_fifo
-- claim_ready while no claimable task has a priority (claim_priorities): per (name, queue)
-- pair one walk of tasks_ready stopped at the limit, then the oldest of those.
-- checked (speculative claims, ops/claims.py): sent with the claim's reads, in their round
-- trip, as the walk of the pairs the engine's previous claim of the same kinds found; it
-- then takes something only while that claim's picture still holds: no active pause, no
-- concurrency limit, no rate limit on the names, no ready task with a priority, and no
-- expired lease that claim_expired would take (its names, versions and served queues:
-- takeovers come first). Otherwise it takes nothing and says so with one row whose id is
-- NULL, and the engine claims as before, from the reads. It runs after the pause gate of
-- the same string, so a pause cannot start between the check and the claim. Unchecked,
-- the checks are never evaluated (the OR stops at NOT checked) and no such row comes.
-- audited (a claim in one round trip, ops/claims.py): the claims' audit rows are written
-- here, as the engine's insert_audit writes them, for a string that ends in COMMIT.
WITH plain AS (
    SELECT 1 AS ok
    WHERE NOT %(checked)s::bool OR (
          NOT EXISTS (SELECT 1 FROM pauses WHERE resumed_at IS NULL)
      AND NOT EXISTS (SELECT 1 FROM limits)
      AND NOT EXISTS (SELECT 1 FROM rate_limits
                      WHERE scope = 'type' AND name = ANY(%(enames)s::text[]))
      AND NOT EXISTS (SELECT 1 FROM tasks
                      WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0)
      AND NOT EXISTS (
          SELECT 1 FROM tasks
          WHERE lease_until IS NOT NULL AND lease_until < %(now)s AND state = 'RUNNING'
            AND name = ANY(%(names)s::text[])
            AND EXISTS (SELECT 1 FROM unnest(%(names)s::text[], %(lo)s::int[], %(hi)s::int[])
                                      AS n(name, lo, hi)
                        WHERE n.name = tasks.name AND tasks.version BETWEEN n.lo AND n.hi)
            AND (%(served)s::text[] IS NULL OR queue = ANY(%(served)s::text[]))))),
picked AS (
    SELECT p.id, p.state
    FROM plain CROSS JOIN
         unnest(%(enames)s::text[], %(equeues)s::text[], %(elo)s::int[],
                %(ehi)s::int[]) AS e(name, queue, lo, hi)
    CROSS JOIN LATERAL (
        SELECT id, state, run_at FROM tasks
        WHERE tasks.name = e.name AND tasks.queue = e.queue
          AND state IN ('PENDING', 'RETRY_WAIT')
          AND run_at <= %(now)s AND tasks.version BETWEEN e.lo AND e.hi
        ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p
    ORDER BY p.run_at, p.id LIMIT %(limit)s),
claimed AS (
    UPDATE tasks t SET state = 'RUNNING', holder = %(holder)s, generation = t.generation + 1,
                       attempt = t.attempt + 1, lease_until = %(now)s + t.lease_s,
                       updated_at = %(now)s, flow_wait = NULL
    FROM picked WHERE t.id = picked.id
    RETURNING t.id, t.name, t.version, t.params, t.generation, t.attempt, t.max_attempts,
              t.lease_s, t.lease_until, picked.state, t.control_request, t.trace_context),
audited AS (
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    SELECT c.id, %(now)s, 'claim', c.state, 'RUNNING', c.generation, %(holder)s,
           json_build_object('attempt', c.attempt, 'lease_s', c.lease_s)::text
    FROM claimed AS c WHERE %(audited)s::bool)
SELECT * FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT 1 FROM plain);

-- name: claim_fifo_queues
-- PostgreSQL walks (name, queue) pairs in claim_fifo whatever the queues served; kept for
-- the catalogue.
SELECT true;

-- name: claim_ready_queues
-- PostgreSQL walks (name, queue) pairs in claim_ready whatever the queues served; kept for
-- the catalogue (SQLite walks the served queues in a statement of its own).
SELECT true;

-- name: claim_candidates
-- The ready tasks a claim under flow control (fairness, rate limits) chooses from: per
-- entry as in claim_ready (both walks), locked, not yet claimed: the engine plans which
-- it takes (claim_ids) and which wait for a token (rate_defer).
WITH e AS (
    SELECT * FROM unnest(%(enames)s::text[], %(equeues)s::text[], %(elo)s::int[],
                         %(ehi)s::int[]) AS n(name, queue, lo, hi)),
ranked AS (
    SELECT p.* FROM e
    CROSS JOIN LATERAL (
        SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
        WHERE tasks.name = e.name AND tasks.queue = e.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0
          AND run_at <= %(now)s AND tasks.version BETWEEN e.lo AND e.hi
        ORDER BY priority DESC, run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p),
plain AS (
    SELECT p.* FROM e
    CROSS JOIN LATERAL (
        SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
        WHERE tasks.name = e.name AND tasks.queue = e.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority = 0
          AND run_at <= %(now)s AND tasks.version BETWEEN e.lo AND e.hi
        ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS p)
SELECT * FROM (SELECT * FROM ranked UNION ALL SELECT * FROM plain) AS c
ORDER BY priority DESC, run_at, id LIMIT %(limit)s;

-- name: claim_fair_keys
-- The fairness keys with tasks ready now of one (name, queue), in key order after
-- %(after)s (where the engine's round-robin stopped last; NULL: from the first), at most
-- %(limit)s: a skip scan of tasks_ready_fair, one index probe per key (a key whose tasks
-- are all scheduled later is passed over inside its probe, never listed: 64 such keys
-- must not hide the ones after them).
WITH RECURSIVE k(fk, n) AS (
    SELECT (SELECT fair_key FROM tasks
            WHERE name = %(name)s AND queue = %(queue)s AND state IN ('PENDING', 'RETRY_WAIT')
              AND fair_key IS NOT NULL AND run_at <= %(now)s
              AND (%(after)s::text IS NULL OR fair_key > %(after)s)
            ORDER BY fair_key LIMIT 1), 1
    UNION ALL
    SELECT (SELECT fair_key FROM tasks
            WHERE name = %(name)s AND queue = %(queue)s AND state IN ('PENDING', 'RETRY_WAIT')
              AND fair_key IS NOT NULL AND run_at <= %(now)s AND fair_key > k.fk
            ORDER BY fair_key LIMIT 1), k.n + 1
    FROM k WHERE k.fk IS NOT NULL AND k.n < %(limit)s)
SELECT fk FROM k WHERE fk IS NOT NULL;

-- name: claim_fair_candidates
-- Per fairness key of one (name, queue) entry, its first %(per_key)s ready tasks by
-- (priority DESC, run_at) (tasks_ready_fair), locked.
SELECT p.* FROM unnest(%(keys)s::text[]) AS k(fk)
CROSS JOIN LATERAL (
    SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
    WHERE name = %(name)s AND queue = %(queue)s AND fair_key = k.fk
      AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s
      AND version BETWEEN %(lo)s AND %(hi)s
    ORDER BY priority DESC, run_at LIMIT %(per_key)s FOR UPDATE SKIP LOCKED) AS p;

-- name: claim_fair_unkeyed
-- The tasks of a fair (name, queue) entry stored without a fairness key (submitted by code
-- that did not declare the type fair), oldest first, locked: a walk of tasks_ready that
-- passes over the keyed ones, so the engine runs it only when the keyed walks left room
-- or once in FAIR_UNKEYED_EVERY claims.
SELECT id, name, tenant, fair_key, rate_key, params, priority, run_at FROM tasks
WHERE name = %(name)s AND queue = %(queue)s AND fair_key IS NULL
  AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s
  AND version BETWEEN %(lo)s AND %(hi)s
ORDER BY run_at LIMIT %(per_key)s FOR UPDATE SKIP LOCKED;

-- name: claim_ids
-- Claim the chosen candidates (locked by claim_candidates / claim_fair_candidates in this
-- transaction), as claim_ready does.
UPDATE tasks t SET state = 'RUNNING', holder = %(holder)s, generation = t.generation + 1,
                   attempt = t.attempt + 1, lease_until = %(now)s + t.lease_s,
                   updated_at = %(now)s, flow_wait = NULL
FROM (SELECT id, state FROM tasks WHERE id = ANY(%(ids)s::text[])
        AND state IN ('PENDING', 'RETRY_WAIT') ORDER BY id) AS picked
WHERE t.id = picked.id
RETURNING t.id, t.name, t.version, t.params, t.generation, t.attempt, t.max_attempts,
          t.lease_s, t.lease_until, picked.state, t.control_request, t.trace_context;

-- name: rate_buckets_open
-- The buckets a claim spends from, created full where never used (so that the lock that
-- follows finds every one of them: two claims never both count a new bucket as full).
INSERT INTO rate_buckets (scope, name, key, tokens, updated_at)
SELECT u.scope, u.name, u.key, u.tokens, %(now)s
FROM json_to_recordset(%(rows)s::json) AS u(scope text, name text, key text, tokens float8)
ORDER BY u.scope, u.name, u.key
ON CONFLICT DO NOTHING;

-- name: rate_buckets_lock
-- The buckets' tokens, locked in key order until the claim commits (claims spending from
-- one bucket take turns; claims of other buckets do not wait).
SELECT b.scope, b.name, b.key, b.tokens, b.updated_at
FROM rate_buckets b
JOIN unnest(%(scopes)s::text[], %(names)s::text[], %(keys)s::text[]) AS u(scope, name, key)
  ON b.scope = u.scope AND b.name = u.name AND b.key = u.key
ORDER BY b.scope, b.name, b.key FOR UPDATE OF b;

-- name: rate_buckets_save
-- The buckets' new tokens as of at: the claim's clock, or the bucket's own when that is
-- later (a bucket's clock never goes back, ratchet/ratelimit.py).
UPDATE rate_buckets b SET tokens = u.tokens, updated_at = u.at
FROM json_to_recordset(%(rows)s::json)
     AS u(scope text, name text, key text, tokens float8, at float8)
WHERE b.scope = u.scope AND b.name = u.name AND b.key = u.key;

-- name: rate_defer
-- Candidates whose bucket is empty wait, without spending an attempt, until it holds a
-- token for them (run_at; flow_wait 'rate'). Locked by this claim's candidates read.
UPDATE tasks t SET run_at = u.run_at, flow_wait = 'rate', updated_at = %(now)s
FROM json_to_recordset(%(rows)s::json) AS u(id text, run_at float8)
WHERE t.id = u.id AND t.state IN ('PENDING', 'RETRY_WAIT');

-- name: rate_recheck
-- A type's limit changed (set or cleared by an operator): its tasks waiting for a token
-- are due again at once, and the next claim checks them against the new limit (moved by
-- the old one, a task of a 1/d limit would wait days after the limit was raised).
UPDATE tasks SET run_at = %(now)s::float8, updated_at = %(now)s::float8
WHERE name = %(name)s AND flow_wait = 'rate' AND state IN ('PENDING', 'RETRY_WAIT')
  AND run_at > %(now)s::float8;

-- name: claim_steps
SELECT task_id, name, result, generation, committed_at, seq FROM steps
WHERE task_id = ANY(%(ids)s::text[]);

-- name: claim_effects
-- Effects made inside a batch function ('ratchet:batch:...') belong to one batch, not to
-- the code path: ctx.batches reads those it needs (batch_effects), so a resume does not
-- load one row per finished batch. The names on either side of that prefix, compared
-- bytewise (';' follows ':'): two ranges of effects_name_bytes, so the claim does not
-- visit the batch effects either (a NOT LIKE filter would read every one of them).
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id = ANY(%(ids)s::text[])
  AND (name COLLATE "C" < 'ratchet:batch:' OR name COLLATE "C" >= 'ratchet:batch;');

-- name: claim_steps_taken
-- claim_steps of the tasks this transaction claimed for %(holder)s that ran before
-- (generation > 1): a claim in one round trip (ops/claims.py) reads them after its walk,
-- in the same string, by what the walk wrote (this holder, RUNNING, updated at this
-- transaction's clock); the engine keeps the rows of the ids the walk returned.
SELECT task_id, name, result, generation, committed_at, seq FROM steps
WHERE task_id IN (SELECT id FROM tasks WHERE holder = %(holder)s AND state = 'RUNNING'
                  AND updated_at = %(now)s AND generation > 1);

-- name: claim_effects_taken
-- claim_effects of the tasks this transaction claimed for %(holder)s that ran before, as
-- claim_steps_taken finds them.
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id IN (SELECT id FROM tasks WHERE holder = %(holder)s
                                 AND state = 'RUNNING' AND updated_at = %(now)s
                                 AND generation > 1)
  AND (name COLLATE "C" < 'ratchet:batch:' OR name COLLATE "C" >= 'ratchet:batch;');

-- name: open_intents
SELECT task_id, name, key FROM effects
WHERE task_id = ANY(%(ids)s::text[]) AND state = 'intent'
ORDER BY task_id, name;

-- name: retire
-- A holder gone on its final attempt: FAILED, or UNKNOWN with an open effect intent (or an
-- operator's request applied: CANCELLED, PAUSED). The generation moves on, so whatever the
-- old holder still writes is fenced out; run_at is re-anchored (clock_repair_ready).
UPDATE tasks t SET state = u.state, holder = NULL, lease_until = NULL,
                   run_at = LEAST(t.run_at, %(now)s::float8
                                  + GREATEST(t.run_at - t.updated_at, 0)),
                   generation = t.generation + 1, last_error = u.error,
                   last_traceback = NULL, error_class = u.error_class, updated_at = %(now)s,
                   control_request = u.request
FROM json_to_recordset(%(rows)s::json)
     AS u(id text, generation bigint, state text, error text, error_class text,
          request text)
WHERE t.id = u.id AND t.generation = u.generation AND t.state = 'RUNNING'
  AND t.id = ANY(ARRAY(SELECT j ->> 'id' FROM json_array_elements(%(rows)s::json) AS j));

-- name: renew
-- Rows are locked in id order first, like every fenced write, so a renewal and a commit of
-- the same worker never deadlock. A row locked by another transaction (a transaction
-- step of ours running its user code, a commit in flight) is skipped, not waited for:
-- renew_held reports it still held at its current lease_until, and the next renewal
-- round extends it. So one slow transaction step cannot hold up every other lease.
WITH wanted AS (
    SELECT * FROM unnest(%(ids)s::text[], %(generations)s::bigint[]) AS w(id, gen)),
locked AS (
    SELECT t.id FROM tasks t JOIN wanted w ON t.id = w.id AND t.generation = w.gen
    WHERE t.holder = %(holder)s AND t.state = 'RUNNING' AND t.lease_until >= %(now)s
    ORDER BY t.id FOR UPDATE OF t SKIP LOCKED)
UPDATE tasks t SET lease_until = %(now)s + t.lease_s FROM locked
WHERE t.id = locked.id
RETURNING t.id, t.generation, t.lease_until;

-- name: renew_held
-- Leases a renewal did not extend (their row was locked) that are still ours and unexpired.
SELECT t.id, t.generation, t.lease_until FROM tasks t
JOIN unnest(%(ids)s::text[], %(generations)s::bigint[]) AS w(id, gen)
  ON t.id = w.id AND t.generation = w.gen
WHERE t.holder = %(holder)s AND t.state = 'RUNNING' AND t.lease_until >= %(now)s;

-- name: worker_seen
UPDATE workers SET last_seen = %(now)s WHERE holder = %(holder)s AND state <> 'dead';

-- name: fence_read
-- The fence of a commit: every task row the batch writes, locked in id order (and an
-- operator's request, which the engine arbitrates against the write's transition).
SELECT id, state, generation, attempt, name, control_request FROM tasks
WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR UPDATE;

-- name: steps_upsert
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT u.task_id, u.name, u.result, u.generation, %(now)s, u.seq
FROM json_to_recordset(%(rows)s::json)
     AS u(task_id text, name text, result text, generation bigint, seq int)
ON CONFLICT (task_id, name) DO UPDATE SET result = excluded.result,
    generation = excluded.generation, committed_at = excluded.committed_at,
    seq = excluded.seq;

-- name: effects_intent
-- A re-sent intent (after a lost COMMIT reply) is not counted as a new call.
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
SELECT u.task_id, u.name, u.key, u.digest, 'intent', NULL, u.generation, u.attempt, 1,
       false, %(now)s, u.seq
FROM json_to_recordset(%(rows)s::json)
     AS u(task_id text, name text, key text, digest text, generation bigint, attempt int,
          seq int)
ON CONFLICT (task_id, name) DO UPDATE SET state = 'intent', key = excluded.key,
    params_digest = excluded.params_digest, generation = excluded.generation,
    attempt = excluded.attempt, seq = excluded.seq,
    calls = effects.calls + CASE WHEN %(resend)s::bool AND effects.state = 'intent'
        AND effects.generation = excluded.generation AND effects.key = excluded.key
        THEN 0 ELSE 1 END,
    updated_at = excluded.updated_at;

-- name: effects_outcome
INSERT INTO effects (task_id, name, key, params_digest, state, result, generation, attempt,
                     calls, via_lookup, updated_at, seq)
SELECT u.task_id, u.name, u.key, u.digest, u.state, u.result, u.generation, u.attempt, 0,
       u.via_lookup, %(now)s, u.seq
FROM json_to_recordset(%(rows)s::json)
     AS u(task_id text, name text, key text, digest text, state text, result text,
          generation bigint, attempt int, via_lookup bool, seq int)
ON CONFLICT (task_id, name) DO UPDATE SET state = excluded.state, result = excluded.result,
    generation = excluded.generation, via_lookup = excluded.via_lookup,
    updated_at = excluded.updated_at, seq = COALESCE(excluded.seq, effects.seq);

-- name: transition
-- A fenced RUNNING -> state change per row. run_at is set for RETRY_WAIT / PENDING
-- (backoff, release delay); one ready now never moves later than it was (a clock stepped
-- back since the claim leaves it claimable, ledger/clock.py), one kept is re-anchored
-- (clock_repair_ready: a PAUSED row's wait stays its own); a release (to PENDING) hands
-- its attempt back; only RUNNING keeps the lease; a new error replaces the traceback too
-- (NULL when it has none); flow_wait is the row's ('rate': a downstream's rate limit
-- handed the attempt back; else NULL). One primary-key probe per row: the "id = ANY(ids of the rows)"
-- gives the
-- planner an index condition on tasks_pkey; without it, on a table without statistics, it
-- hash-joined the rows against a sequential scan of every task (3.6 ms at 20,000 tasks;
-- tests/test_ledger_plans.py).
UPDATE tasks t SET state = u.state,
    run_at = CASE WHEN u.run_at IS NULL
                  THEN LEAST(t.run_at, %(now)s::float8 + GREATEST(t.run_at - t.updated_at, 0))
                  WHEN u.run_at <= %(now)s::float8 THEN LEAST(t.run_at, u.run_at)
                  ELSE u.run_at END,
    attempt = CASE WHEN u.release THEN t.attempt - 1 ELSE t.attempt END,
    holder = CASE WHEN u.keep THEN t.holder ELSE NULL END,
    lease_until = CASE WHEN u.keep THEN t.lease_until ELSE NULL END,
    result = COALESCE(u.result, t.result), last_error = COALESCE(u.error, t.last_error),
    last_traceback = CASE WHEN u.error IS NULL THEN t.last_traceback ELSE u.traceback END,
    error_class = COALESCE(u.error_class, t.error_class), updated_at = %(now)s,
    control_request = CASE WHEN u.keep THEN t.control_request ELSE u.request END,
    flow_wait = u.flow_wait
FROM json_to_recordset(%(rows)s::json)
     AS u(id text, generation bigint, state text, run_at float8, release bool, keep bool,
          result text, error text, error_class text, request text, traceback text,
          flow_wait text)
WHERE t.id = u.id AND t.generation = u.generation AND t.state = 'RUNNING'
  AND t.id = ANY(ARRAY(SELECT j ->> 'id' FROM json_array_elements(%(rows)s::json) AS j));

-- name: resolve_lock
SELECT state, generation, name, control_request FROM tasks WHERE id = %(id)s FOR UPDATE;

-- name: resolve_open_effects
SELECT name, key FROM effects WHERE task_id = %(id)s AND state = 'intent' ORDER BY name;

-- name: resolve_effects
UPDATE effects SET state = %(state)s, result = %(result)s, updated_at = %(now)s
WHERE task_id = %(id)s AND state = 'intent';

-- name: resolve_task
UPDATE tasks SET state = 'PENDING', run_at = LEAST(run_at, %(now)s::float8), updated_at = %(now)s
WHERE id = %(id)s AND state = 'UNKNOWN' AND generation = %(generation)s;

-- name: holder_running
SELECT id, holder, generation, attempt, max_attempts, name, control_request, crash_count,
       quarantine_after
FROM tasks WHERE holder = %(holder)s AND state = 'RUNNING' ORDER BY id FOR UPDATE;

-- name: revoke_retry
UPDATE tasks SET state = 'RETRY_WAIT', holder = NULL, lease_until = NULL,
    generation = generation + 1, run_at = LEAST(run_at, %(now)s), updated_at = %(now)s,
    last_error = %(error)s, last_traceback = NULL, error_class = 'holder_gone'
WHERE id = ANY(%(ids)s::text[]) AND state = 'RUNNING' AND holder = %(holder)s;

-- name: worker_dead
UPDATE workers SET state = 'dead' WHERE holder = %(holder)s;

-- name: worker_register
INSERT INTO workers (holder, host_id, hostname, pid, pid_start, started_at, last_seen, state)
VALUES (%(holder)s, %(host_id)s, %(hostname)s, %(pid)s, %(pid_start)s, %(now)s, %(now)s,
        'alive')
ON CONFLICT (holder) DO UPDATE SET host_id = excluded.host_id,
    hostname = excluded.hostname, pid = excluded.pid, pid_start = excluded.pid_start,
    started_at = excluded.started_at, last_seen = excluded.last_seen, state = 'alive';

-- name: worker_touch
UPDATE workers SET last_seen = %(now)s, state = %(state)s
WHERE holder = %(holder)s AND state <> 'dead';

-- name: workers_all
SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state
FROM workers ORDER BY started_at;

-- name: workers_prune
-- Registry retention: rows of workers stopped or dead (never alive ones) last seen before
-- the cutoff (a few rows: the registry is small).
DELETE FROM workers WHERE state IN ('stopped', 'dead') AND last_seen < %(cutoff)s::float8
RETURNING holder;

-- name: worker_definitions_prune
-- Their (name, version) rows, deleted first in the same transaction.
DELETE FROM worker_definitions WHERE holder IN (
    SELECT holder FROM workers WHERE state IN ('stopped', 'dead') AND last_seen < %(cutoff)s::float8);

-- name: workers_on_host
SELECT holder, host_id, hostname, pid, pid_start, started_at, last_seen, state
FROM workers WHERE host_id = %(host_id)s AND state = 'alive' ORDER BY started_at;

-- name: task_get
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE id = %(id)s;

-- name: task_get_many
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: timeline_audit
SELECT seq, task_id, at, kind, from_state, to_state, generation, holder, detail
FROM audit WHERE task_id = %(id)s ORDER BY seq;

-- name: timeline_steps
SELECT name, result, generation, committed_at, seq FROM steps
WHERE task_id = %(id)s ORDER BY seq NULLS FIRST, committed_at;

-- name: timeline_effects
SELECT name, key, params_digest, state, result, generation, attempt, calls, via_lookup,
       updated_at, seq
FROM effects WHERE task_id = %(id)s ORDER BY seq NULLS FIRST, updated_at;

-- name: stats_counts
-- Counts per (name, state) without reading the history (DESIGN §9): the non-terminal tasks
-- exactly (ready: tasks_ready; running: tasks_leased; the others: tasks_parked), plus the
-- finished ones: the rollup (finished before the counts mark) and what finished since
-- (tasks_finished from the mark on). %(upto)s is the mark, read first by counts_read_mark
-- and bound as a constant, so the planner sees how recent it is (a parameter of an
-- InitPlan would be estimated as a third of the table). The running tasks are a range of
-- tasks_leased with both bounds written (every lease lies between them): a planner without
-- statistics (a table drained before autovacuum's first ANALYZE) estimates "lease_until IS
-- NOT NULL" as nearly every row and scanned the whole table, dead rows of the drain
-- included (bench/pg_status_after_drain.py).
SELECT name, state, sum(n)::bigint FROM (
    SELECT name, state, count(*) AS n FROM tasks
    WHERE state IN ('PENDING', 'RETRY_WAIT') GROUP BY name, state
    UNION ALL
    SELECT name, 'RUNNING', count(*) FROM tasks
    WHERE lease_until > '-Infinity'::float8 AND lease_until < 'Infinity'::float8
      AND state = 'RUNNING' GROUP BY name
    UNION ALL
    SELECT name, state, count(*) FROM tasks
    WHERE state NOT IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED',
                        'CANCELLED')
    GROUP BY name, state
    UNION ALL
    SELECT name, state, count(*) FROM tasks
    WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= %(upto)s::float8
    GROUP BY name, state
    UNION ALL
    SELECT name, state, n FROM finished_counts) AS c
GROUP BY name, state HAVING sum(n) > 0;

-- name: stats_oldest
SELECT min(run_at) FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s;

-- name: stats_kinds
-- Audit rows ever written, per kind: the rollup (before the counts mark, kept when prune
-- deletes the rows) plus the rows since the mark (audit_at). Every kind (a few dozen rows;
-- the engine picks the ones it reports): a kind filter here would be pushed into the
-- window and let the planner walk an index of kinds, i.e. every claim ever audited. The
-- range has both bounds written so that a planner without statistics takes audit_at
-- (one bound is estimated as a third of the table: a scan of every audit row).
SELECT kind, sum(n)::bigint FROM (
    SELECT kind, n FROM audit_counts
    UNION ALL
    SELECT kind, count(*) FROM audit WHERE at >= %(upto)s::float8 AND at < 'Infinity'::float8
    GROUP BY kind) AS k
GROUP BY kind;

-- name: stats_unknown
-- Written with tasks_parked's predicate, so the partial index serves it.
SELECT count(*) FROM tasks
WHERE state NOT IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED', 'CANCELLED')
  AND state = 'UNKNOWN';

-- name: status_ready
-- ratchet status, per type (DESIGN §9): the PENDING / RETRY_WAIT tasks scheduled after the
-- ledger clock and the oldest run_at of those ready now; one pass over tasks_ready (the
-- backlog, never the history).
SELECT name, count(*) FILTER (WHERE run_at > %(now)s::float8),
       min(run_at) FILTER (WHERE run_at <= %(now)s::float8)
FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') GROUP BY name;

-- name: status_unknown
-- UNKNOWN tasks of the given types (%(names)s: those the counts show with UNKNOWN tasks)
-- and the earliest updated_at (when each entered UNKNOWN), and how many entered it since
-- %(from_at)s and since %(recent_at)s (they left the work a worker can do: the drain rate
-- counts them), from
-- tasks_parked (its predicate written out).
SELECT name, count(*), min(updated_at),
       count(*) FILTER (WHERE updated_at >= %(from_at)s),
       count(*) FILTER (WHERE updated_at >= %(recent_at)s) FROM tasks
WHERE name = ANY(%(names)s::text[])
  AND state NOT IN ('PENDING', 'RUNNING', 'RETRY_WAIT', 'SUCCEEDED', 'FAILED', 'CANCELLED')
  AND state = 'UNKNOWN'
GROUP BY name;

-- name: status_quarantined
-- Quarantined FAILED tasks per type (tasks_quarantine: only quarantined rows).
SELECT name, count(*) FROM tasks WHERE quarantined AND state = 'FAILED' GROUP BY name;

-- name: status_arrivals
-- Tasks created in the window (from_at, up to the read's clock) per type, those since
-- recent_at (the window's recent part) and the newest created_at: a range of
-- tasks_created (two bounds: a planner without statistics still takes the index).
SELECT name, count(*), count(*) FILTER (WHERE created_at >= %(recent_at)s::float8),
       max(created_at) FROM tasks
WHERE created_at >= %(from_at)s::float8 AND created_at <= %(now)s::float8
GROUP BY name;

-- name: status_completions
-- Tasks finished in the window per type, and since recent_at: a range of tasks_finished.
SELECT name, count(*), count(*) FILTER (WHERE updated_at >= %(recent_at)s::float8)
FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= %(from_at)s::float8
  AND updated_at <= %(now)s::float8
GROUP BY name;

-- name: status_attempts
-- Attempts that ended in the window per type, and their summed duration (ratchet status:
-- the mean attempt duration, DESIGN §9). An attempt is a claim (or takeover) and its
-- holder's own end of it, the fenced RUNNING -> X transition of the same generation, any
-- outcome but a release (RUNNING -> PENDING: handed back at a shutdown, mostly a
-- prefetched task that never ran); a retire of a holder gone has no holder and is not
-- one, and a park's wait is not in one (its wake is a new claim). The newest %(limit)s ends only: a backward walk of
-- audit_at (both bounds written) stopped at the limit, then per end a seek of audit_task
-- for its claim and a primary-key probe of tasks for its type.
SELECT t.name, count(*), sum(e.at - e.claimed_at) FROM (
    SELECT e.task_id, e.at,
           (SELECT c.at FROM audit AS c
            WHERE c.task_id = e.task_id AND c.seq < e.seq AND c.generation = e.generation
              AND c.kind IN ('claim', 'takeover')
            ORDER BY c.seq DESC LIMIT 1) AS claimed_at
    FROM audit AS e
    WHERE e.at >= %(from_at)s::float8 AND e.at <= %(now)s::float8
      AND e.kind = 'transition' AND e.from_state = 'RUNNING' AND e.to_state <> 'PENDING'
      AND e.holder IS NOT NULL
    ORDER BY e.at DESC LIMIT %(limit)s) AS e
JOIN tasks AS t ON t.id = e.task_id
WHERE e.claimed_at IS NOT NULL
GROUP BY t.name;

-- name: throughput_arrivals
-- Tasks created per bucket of %(bucket_s)s seconds in [from_at, to_at), of one type
-- (%(name)s) or all (NULL): a range of tasks_created.
SELECT floor((created_at - %(from_at)s::float8) / %(bucket_s)s::float8)::bigint, count(*)
FROM tasks
WHERE created_at >= %(from_at)s::float8 AND created_at < %(to_at)s::float8
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
GROUP BY 1;

-- name: throughput_completions
-- Tasks finished per bucket, as throughput_arrivals: a range of tasks_finished.
SELECT floor((updated_at - %(from_at)s::float8) / %(bucket_s)s::float8)::bigint, count(*)
FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= %(from_at)s::float8
  AND updated_at < %(to_at)s::float8 AND (%(name)s::text IS NULL OR name = %(name)s::text)
GROUP BY 1;

-- name: late_effect_insert
-- Append-only, unfenced: a call sent by a holder whose claim had been taken over.
INSERT INTO late_effects (task_id, effect, key, generation, holder, at, outcome, detail)
VALUES (%(task_id)s, %(effect)s, %(key)s, %(generation)s, %(holder)s, %(now)s, %(outcome)s,
        %(detail)s);

-- name: late_effects_all
-- A late effect's kind is read with it, from its effect's record as it is now (the new
-- holder may settle the record after the late effect was recorded): 'accounted_for' when a
-- lookup hit settled the record and only one intent was ever recorded (calls = 1: one
-- request was sent, the late one, and the hit found it), else 'possible_duplicate'.
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
ORDER BY l.seq DESC LIMIT %(limit)s;

-- name: late_effects_task
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
WHERE l.task_id = %(id)s ORDER BY l.seq DESC LIMIT %(limit)s;

-- name: effects_of_type
-- ratchet reconcile / Control.effects: the effect records of one task type's tasks, newest
-- task first (tasks_created, from %(created_from)s on), by effect name within a task;
-- keyset pagination on (created_at, id, effect name). Effects are read by their primary
-- key (task_id, name) and deleted with their task (prune): no index of their own.
SELECT t.id, t.state, t.generation, t.created_at,
       e.name, e.key, e.params_digest, e.state, e.result, e.generation, e.attempt, e.calls,
       e.via_lookup, e.updated_at, e.seq
FROM tasks AS t JOIN effects AS e ON e.task_id = t.id
WHERE t.name = %(name)s
  AND (%(created_from)s::float8 IS NULL OR t.created_at >= %(created_from)s::float8)
  AND (%(cursor_at)s::float8 IS NULL OR t.created_at < %(cursor_at)s::float8
       OR (t.created_at = %(cursor_at)s::float8 AND (t.id < %(cursor_id)s::text
           OR (t.id = %(cursor_id)s::text AND e.name > %(cursor_name)s::text))))
ORDER BY t.created_at DESC, t.id DESC, e.name
LIMIT %(limit)s;

-- name: late_effects_of_type
-- ratchet reconcile: late effects of one task type's tasks (the table holds the rare calls
-- of stale holders: a scan of it, each row's task by primary key).
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail,
       CASE WHEN e.state = 'done' AND e.via_lookup AND e.calls = 1 AND e.key = l.key
            THEN 'accounted_for' ELSE 'possible_duplicate' END
FROM late_effects AS l JOIN tasks AS t ON t.id = l.task_id
LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect
WHERE t.name = %(name)s AND (%(since)s::float8 IS NULL OR l.at >= %(since)s::float8)
ORDER BY l.seq DESC LIMIT %(limit)s;

-- name: stats_late
-- Every late effect, and those accounted for (the kind of late_effects_all).
SELECT count(*), count(*) FILTER (WHERE e.state = 'done' AND e.via_lookup AND e.calls = 1
                                  AND e.key = l.key)
FROM late_effects AS l LEFT JOIN effects AS e ON e.task_id = l.task_id AND e.name = l.effect;

-- name: transaction_step_read
-- A transaction step's checkpoint (ctx.transaction), read after a lost COMMIT reply: it
-- commits atomically with the user's writes.
SELECT generation FROM steps WHERE task_id = %(task_id)s AND name = %(name)s;

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
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
  AND (%(key)s::text IS NULL OR idempotency_key = %(key)s::text)
  AND (%(created_from)s::float8 IS NULL OR created_at >= %(created_from)s::float8)
  AND (%(created_to)s::float8 IS NULL OR created_at < %(created_to)s::float8)
  AND (%(cursor_at)s::float8 IS NULL OR created_at < %(cursor_at)s::float8
       OR (created_at = %(cursor_at)s::float8 AND id < %(cursor_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: limits_all
-- Bulkheads (DESIGN §8): every concurrency limit. Read by every claim (with the
-- expired-lease scan, one round trip); an empty table keeps the unlimited claim.
SELECT scope, name, reserved, maximum, version, updated_at, updated_by, reason
FROM limits ORDER BY scope, name;

-- name: limits_lock
-- Serialises the claims a limit applies to, before they count: one transaction-level
-- advisory lock per scope ("*" with a total; else "type:NAME" / "tenant:NAME"), taken in
-- the order given (sorted by the engine), released at COMMIT. Keys: the two-int form (its
-- own key space), 0x52544c4d and a hash of schema + scope; a collision only serialises
-- more. Each statement of READ COMMITTED takes its snapshot when it starts, so the count
-- that follows sees every claim committed by the previous holder of the lock.
SELECT count(pg_advisory_xact_lock(1381256269, hashtext(current_schema() || ':' || s)))
FROM unnest(%(scopes)s::text[]) AS s;

-- name: limits_running
-- Slots in use: RUNNING rows (a non-NULL lease_until holds exactly them: tasks_leased)
-- per (name, tenant), expired leases included (a slot is held until a fenced write, a
-- takeover, a retirement or a revocation ends it). Written as a range on lease_until:
-- "IS NOT NULL" made the planner scan the table when it had no statistics
-- (tests/test_ledger_plans.py).
SELECT name, tenant, count(*) FROM tasks
WHERE lease_until >= '-Infinity'::float8 AND state = 'RUNNING'
GROUP BY name, tenant;

-- name: limits_ready
-- Which reserved scopes have ready work (their idle reservation is lent out otherwise).
-- Tasks of a paused type are not ready work (paused; the engine leaves paused types out
-- of the type list): a paused type's reservation is lent out like an idle one.
SELECT 'type', n FROM unnest(%(names)s::text[]) AS n
WHERE EXISTS (SELECT 1 FROM tasks WHERE tasks.name = n
              AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s)
UNION ALL
SELECT 'tenant', t FROM unnest(%(tenants)s::text[]) AS t
WHERE EXISTS (SELECT 1 FROM tasks WHERE tasks.tenant = t
              AND state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s
              AND tasks.name <> ALL(%(paused)s::text[]));

-- name: claim_limited
-- claim_ready under bulkheads (only when a limit applies; the engine holds limits_lock
-- and computed the numbers, ledger/bulkheads.py): by priority, then oldest first, at
-- most name_limits[i] tasks of names[i] (its cap), of which the first name_reserved[i] come out of the slots
-- owed to it and the rest out of a pool shared by every name, at most pool tasks in all;
-- the same per tenant (tenants[j], tenant_limits[j], tenant_reserved[j], tenant_pool; a
-- tenant without a limit row, or a task without a tenant, takes only from tenant_pool);
-- at most limit in all. Versions as in claim_ready: entry i claims versions lo[i] ..
-- hi[i] of names[i], and a name may have several entries (one per version a worker runs;
-- the engine sends no two overlapping entries); its numbers are the name's, repeated per
-- entry, and rn_name ranks the name's tasks across all its entries, so a cap holds across
-- versions. Each entry (a (name, queue) pair) is walked as in claim_ready (both walks;
-- the version checked on the index entry), stopped at what its name may take and
-- skipping the tenants that may take nothing (a capped tenant's backlog never hides the
-- others'). The caps filter in turn (name, then tenant, then the two pools); a row one
-- filter drops may still have used a rank of an earlier one: the claim may take fewer,
-- never more.
WITH tl AS (
    SELECT * FROM unnest(%(tenants)s::text[], %(tenant_limits)s::int[],
                         %(tenant_reserved)s::int[]) AS x(tenant, n, own)),
l AS (
    SELECT * FROM unnest(%(enames)s::text[], %(equeues)s::text[], %(elo)s::int[], %(ehi)s::int[],
                         %(ename_limits)s::int[], %(ename_reserved)s::int[])
                  AS l(name, queue, lo, hi, n, own)
    WHERE LEAST(l.n, l.own + %(pool)s) > 0),
ranked AS (
    SELECT p.*, l.name AS lname, l.n AS name_limit, l.own AS name_own FROM l
    CROSS JOIN LATERAL (
        SELECT id, state, priority, run_at, tenant FROM tasks
        WHERE tasks.name = l.name AND tasks.queue = l.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0
          AND run_at <= %(now)s AND tasks.version BETWEEN l.lo AND l.hi
          AND COALESCE((SELECT LEAST(y.n, y.own + %(tenant_pool)s) FROM tl y
                        WHERE y.tenant = tasks.tenant), %(tenant_pool)s) > 0
        ORDER BY priority DESC, run_at LIMIT LEAST(l.n, l.own + %(pool)s, %(limit)s)
        FOR UPDATE SKIP LOCKED) AS p),
plain AS (
    SELECT p.*, l.name AS lname, l.n AS name_limit, l.own AS name_own FROM l
    CROSS JOIN LATERAL (
        SELECT id, state, priority, run_at, tenant FROM tasks
        WHERE tasks.name = l.name AND tasks.queue = l.queue
          AND state IN ('PENDING', 'RETRY_WAIT') AND priority = 0
          AND run_at <= %(now)s AND tasks.version BETWEEN l.lo AND l.hi
          AND COALESCE((SELECT LEAST(y.n, y.own + %(tenant_pool)s) FROM tl y
                        WHERE y.tenant = tasks.tenant), %(tenant_pool)s) > 0
        ORDER BY run_at LIMIT LEAST(l.n, l.own + %(pool)s, %(limit)s)
        FOR UPDATE SKIP LOCKED) AS p),
by_name AS (
    SELECT id, state, priority, run_at, tenant, name_limit, name_own,
           row_number() OVER (PARTITION BY lname ORDER BY priority DESC, run_at, id) AS rn_name
    FROM (SELECT * FROM ranked UNION ALL SELECT * FROM plain) AS w),
by_tenant AS (
    SELECT c.id, c.state, c.priority, c.run_at, c.rn_name, c.name_own,
           COALESCE(x.n, 1073741824) AS tenant_limit, COALESCE(x.own, 0) AS tenant_own,
           row_number() OVER (PARTITION BY x.tenant
                              ORDER BY c.priority DESC, c.run_at, c.id) AS rn_tenant
    FROM by_name c LEFT JOIN tl x ON x.tenant = c.tenant
    WHERE c.rn_name <= c.name_limit),
pooled AS (
    SELECT id, state, priority, run_at, rn_name, name_own, rn_tenant, tenant_own,
           sum(CASE WHEN rn_name > name_own THEN 1 ELSE 0 END)
               OVER (ORDER BY priority DESC, run_at, id ROWS UNBOUNDED PRECEDING) AS pool_rank,
           sum(CASE WHEN rn_tenant > tenant_own THEN 1 ELSE 0 END)
               OVER (ORDER BY priority DESC, run_at, id ROWS UNBOUNDED PRECEDING) AS tenant_pool_rank
    FROM by_tenant WHERE rn_tenant <= tenant_limit),
picked AS (
    SELECT id, state FROM pooled
    WHERE (rn_name <= name_own OR pool_rank <= %(pool)s)
      AND (rn_tenant <= tenant_own OR tenant_pool_rank <= %(tenant_pool)s)
    ORDER BY priority DESC, run_at, id LIMIT %(limit)s)
UPDATE tasks t SET state = 'RUNNING', holder = %(holder)s, generation = t.generation + 1,
                   attempt = t.attempt + 1, lease_until = %(now)s + t.lease_s,
                   updated_at = %(now)s, flow_wait = NULL
FROM picked WHERE t.id = picked.id
RETURNING t.id, t.name, t.version, t.params, t.generation, t.attempt, t.max_attempts,
          t.lease_s, t.lease_until, picked.state, t.control_request, t.trace_context;

-- name: limit_upsert
INSERT INTO limits (scope, name, reserved, maximum, version, updated_at, updated_by, reason)
VALUES (%(scope)s, %(name)s, %(reserved)s, %(maximum)s, 1, %(now)s, %(operator)s,
        %(reason)s)
ON CONFLICT (scope, name) DO UPDATE SET reserved = excluded.reserved,
    maximum = excluded.maximum, version = limits.version + 1,
    updated_at = excluded.updated_at, updated_by = excluded.updated_by,
    reason = excluded.reason
RETURNING scope, name, reserved, maximum, version, updated_at, updated_by, reason;

-- name: limit_delete
DELETE FROM limits WHERE scope = %(scope)s AND name = %(name)s
RETURNING scope, name, reserved, maximum, version, updated_at, updated_by, reason;

-- name: slot_ready
-- ratchet limits: ready tasks per (name, tenant) and the oldest one's run_at.
SELECT name, tenant, count(*), min(run_at) FROM tasks
WHERE state IN ('PENDING', 'RETRY_WAIT') AND run_at <= %(now)s
GROUP BY name, tenant;

-- name: limits_audit
-- The latest limit changes (limit_set / limit_cleared audit rows), newest first. Their
-- task ids are "limit:SCOPE[:NAME]": a range of audit_task (task_id, seq), the few rows of
-- the limits' history (audit_kind is gone since the retention migration; a walk of every
-- audit row for them was the plan: tests/test_ledger_plans.py).
SELECT seq, task_id, at, kind, from_state, to_state, generation, holder, detail
FROM audit WHERE task_id >= 'limit:' AND task_id < 'limit;'
  AND kind IN ('limit_set', 'limit_cleared', 'rate_limit_set', 'rate_limit_cleared')
ORDER BY seq DESC LIMIT %(limit)s;

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
VALUES ('type', %(name)s, %(per_s)s, %(burst)s, %(key_param)s, 'operator', 1, %(now)s,
        %(operator)s, %(reason)s)
ON CONFLICT (scope, name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    burst = excluded.burst, key_param = excluded.key_param, source = 'operator',
    version = rate_limits.version + 1, updated_at = excluded.updated_at,
    updated_by = excluded.updated_by, reason = excluded.reason
RETURNING scope, name, rate_per_s, burst, key_param, source, version, updated_at,
          updated_by, reason;

-- name: rate_limit_clear
-- An operator's rate limit of a task type, removed (a code row is not an operator's).
DELETE FROM rate_limits WHERE scope = 'type' AND name = %(name)s AND source = 'operator'
RETURNING scope, name, rate_per_s, burst, key_param, source, version, updated_at,
          updated_by, reason;

-- name: rate_limit_code
-- A worker's registration: the rate limit its code declares for a task type, unless an
-- operator's row stands (it wins until cleared). An unchanged row is not written.
INSERT INTO rate_limits AS r (scope, name, rate_per_s, burst, key_param, source, version,
                              updated_at, updated_by, reason)
VALUES ('type', %(name)s, %(per_s)s, %(burst)s, %(key_param)s, 'code', 1, %(now)s,
        %(holder)s, 'declared in code')
ON CONFLICT (scope, name) DO UPDATE SET rate_per_s = excluded.rate_per_s,
    burst = excluded.burst, key_param = excluded.key_param, version = r.version + 1,
    updated_at = excluded.updated_at, updated_by = excluded.updated_by,
    reason = excluded.reason
WHERE r.source = 'code' AND (r.rate_per_s, r.burst, r.key_param)
      IS DISTINCT FROM (excluded.rate_per_s, excluded.burst, excluded.key_param);

-- name: rate_limit_code_drop
-- A worker's registration of a task type whose code declares no rate limit: the code's
-- row goes (an operator's stays).
DELETE FROM rate_limits WHERE scope = 'type' AND name = %(name)s AND source = 'code';

-- name: rate_held
-- Tasks a rate limit holds back now, per type: PENDING / RETRY_WAIT with flow_wait 'rate'
-- and a run_at still to come (tasks_flow_wait: only rows flow control holds).
SELECT name, count(*) FROM tasks
WHERE flow_wait = 'rate' AND state IN ('PENDING', 'RETRY_WAIT') AND run_at > %(now)s::float8
GROUP BY name;

-- name: rate_take
-- A downstream's token for one effect call (DESIGN §8, flow control), fenced: taken only
-- while the task is RUNNING under the caller's generation. The bucket is refilled at
-- per_s since its last write (a clock stepped back adds nothing), at most burst; a row
-- comes back only when a token was taken (a new bucket starts full).
INSERT INTO rate_buckets AS b (scope, name, key, tokens, updated_at)
SELECT 'downstream', %(name)s, %(key)s, %(burst)s::float8 - 1.0, %(now)s::float8
WHERE EXISTS (SELECT 1 FROM tasks WHERE id = %(id)s AND generation = %(generation)s
              AND state = 'RUNNING')
ON CONFLICT (scope, name, key) DO UPDATE SET
    tokens = LEAST(%(burst)s::float8, b.tokens + GREATEST(0.0, %(now)s::float8 - b.updated_at)
                   * %(per_s)s::float8) - 1.0,
    updated_at = GREATEST(b.updated_at, %(now)s::float8)
WHERE LEAST(%(burst)s::float8, b.tokens + GREATEST(0.0, %(now)s::float8 - b.updated_at)
            * %(per_s)s::float8) >= 1.0
RETURNING tokens;

-- name: rate_take_wait
-- After rate_take took nothing: the task's generation and state (fenced out?) and the
-- bucket (when will it hold a token?).
SELECT t.generation, t.state, b.tokens, b.updated_at
FROM tasks t LEFT JOIN rate_buckets b
  ON b.scope = 'downstream' AND b.name = %(name)s AND b.key = %(key)s
WHERE t.id = %(id)s;

-- name: flow_counts
-- ratchet status by queue, and the flow gauges (DESIGN §8, §9): live tasks per (name,
-- queue, state, flow_wait), with those of them due now. The backlog from tasks_ready, the
-- RUNNING rows a range of tasks_leased (as stats_counts), the parked WAITING /
-- COMPENSATING rows a range of tasks_waiting: never the history.
SELECT name, queue, state, flow_wait, count(*),
       count(*) FILTER (WHERE run_at <= %(now)s::float8)
FROM tasks WHERE state IN ('PENDING', 'RETRY_WAIT') GROUP BY name, queue, state, flow_wait
UNION ALL
SELECT name, queue, 'RUNNING', NULL, count(*), count(*) FROM tasks
WHERE lease_until > '-Infinity'::float8 AND lease_until < 'Infinity'::float8
  AND state = 'RUNNING' GROUP BY name, queue
UNION ALL
SELECT name, queue, state, flow_wait, count(*), 0 FROM tasks
WHERE state IN ('WAITING', 'COMPENSATING') AND run_at > '-Infinity'::float8
GROUP BY name, queue, state, flow_wait;

-- name: definitions_of
-- The stored definitions of the given names (a worker's registration compares specs).
SELECT name, version, spec FROM definitions WHERE name = ANY(%(names)s::text[]);

-- name: definition_upsert
INSERT INTO definitions (name, version, spec, first_registered_at, last_registered_at)
VALUES (%(name)s, %(version)s, %(spec)s, %(now)s, %(now)s)
ON CONFLICT (name, version) DO UPDATE SET spec = excluded.spec,
    last_registered_at = excluded.last_registered_at;

-- name: worker_definitions_clear
DELETE FROM worker_definitions WHERE holder = %(holder)s;

-- name: worker_definition_insert
INSERT INTO worker_definitions (holder, name, version)
VALUES (%(holder)s, %(name)s, %(version)s)
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
SELECT name, version, count(*), min(run_at) FROM tasks
WHERE state IN ('PENDING', 'RETRY_WAIT')
GROUP BY name, version;

-- name: live_definitions
-- (name, version) pairs of workers alive in the registry and seen since %(since)s.
SELECT d.name, d.version, count(*) FROM worker_definitions AS d
JOIN workers AS w ON w.holder = d.holder
WHERE w.state = 'alive' AND w.last_seen >= %(since)s
GROUP BY d.name, d.version;

-- name: live_worker_slots
-- Live workers (alive in the registry and seen since %(since)s), one row per task type
-- each registered, with its slots and queues (NULL for a worker that recorded none; queues
-- NULL: every queue).
-- The registry is small.
SELECT DISTINCT w.holder, d.name, w.slots, w.queues
FROM workers AS w JOIN worker_definitions AS d ON d.holder = w.holder
WHERE w.state = 'alive' AND w.last_seen >= %(since)s::float8;

-- name: worker_slots_set
UPDATE workers SET slots = %(slots)s, queues = %(queues)s WHERE holder = %(holder)s;

-- name: counts_read_mark
-- The counts mark (see stats_counts, migration 0004).
SELECT upto FROM counts_mark;

-- name: counts_lock
-- Advancing the counts: the mark, locked (one advance at a time; prune batches hold it
-- FOR SHARE), and the horizon up to which every finished task and audit row is committed.
-- A row's time is its transaction's now(), i.e. the transaction's start, so a transaction
-- still running may yet commit rows stamped with its start: the horizon is the earliest
-- start of the transactions running in this database (pg_stat_activity.xact_start, read
-- before the window is counted), and at most now - 1 s.
SELECT upto, LEAST(%(now)s::float8 - 1.0, COALESCE(
    (SELECT extract(epoch FROM min(xact_start))::float8 FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid()
       AND xact_start IS NOT NULL),
    %(now)s::float8))
FROM counts_mark FOR UPDATE;

-- name: counts_window_tasks
SELECT name, state, count(*) FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at >= %(from_at)s::float8
  AND updated_at < %(to_at)s::float8
GROUP BY name, state;

-- name: counts_window_audit
SELECT kind, count(*) FROM audit
WHERE at >= %(from_at)s::float8 AND at < %(to_at)s::float8 GROUP BY kind;

-- name: counts_add_tasks
INSERT INTO finished_counts (name, state, n)
SELECT u.name, u.state, u.n FROM json_to_recordset(%(rows)s::json)
     AS u(name text, state text, n bigint)
ORDER BY u.name, u.state
ON CONFLICT (name, state) DO UPDATE SET n = finished_counts.n + excluded.n;

-- name: counts_add_audit
INSERT INTO audit_counts (kind, n)
SELECT u.kind, u.n FROM json_to_recordset(%(rows)s::json) AS u(kind text, n bigint)
ORDER BY u.kind
ON CONFLICT (kind) DO UPDATE SET n = audit_counts.n + excluded.n;

-- name: counts_set_mark
UPDATE counts_mark SET upto = %(upto)s::float8;

-- name: counts_mark_share
-- The mark, read by a prune batch: FOR SHARE, so an advance of the counts (FOR UPDATE)
-- never runs between the batch's reads and its commit; prune batches share it.
SELECT upto FROM counts_mark FOR SHARE;

-- name: prune_count
-- Dry run: what a prune at %(cutoff)s would delete (finished tasks, their rows, and audit
-- rows older than the cutoff whose task is gone).
WITH old AS (SELECT id FROM tasks
             WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
               AND updated_at < %(cutoff)s::float8)
SELECT (SELECT count(*) FROM old),
       (SELECT count(*) FROM steps WHERE task_id IN (SELECT id FROM old)),
       (SELECT count(*) FROM effects WHERE task_id IN (SELECT id FROM old)),
       (SELECT count(*) FROM late_effects WHERE task_id IN (SELECT id FROM old)),
       (SELECT count(*) FROM audit WHERE task_id IN (SELECT id FROM old))
       + (SELECT count(*) FROM audit AS a WHERE a.at < %(cutoff)s::float8
          AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = a.task_id));

-- name: prune_pick
-- One batch: the oldest finished tasks, an ordered walk of tasks_finished stopped at the
-- batch size. SKIP LOCKED: a row another transaction holds (a stale holder's fenced write,
-- another prune) is left for later, so neither waits for the other.
SELECT id FROM tasks
WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED') AND updated_at < %(cutoff)s::float8
ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: prune_tasks
-- Finished only, whatever was picked: a non-terminal task is never pruned. Driven by the
-- ids (a primary-key probe each).
DELETE FROM tasks AS t USING unnest(%(ids)s::text[]) AS u(id)
WHERE t.id = u.id AND t.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
RETURNING t.id, t.name, t.state, t.updated_at;

-- name: prune_steps
-- Driven by the ids (a nested loop of index probes per task); written as
-- "task_id = ANY(ids)" the planner estimated a share of the table per id and scanned it
-- (tests/test_ledger_plans.py).
DELETE FROM steps AS s USING unnest(%(ids)s::text[]) AS u(id) WHERE s.task_id = u.id;

-- name: prune_effects
DELETE FROM effects AS e USING unnest(%(ids)s::text[]) AS u(id) WHERE e.task_id = u.id;

-- name: prune_forks
-- A pruned fork's link goes with it (the original's link rows stay with their forks).
DELETE FROM forks AS f USING unnest(%(ids)s::text[]) AS u(id) WHERE f.task_id = u.id;

-- name: prune_batch_runs
DELETE FROM batch_runs AS b USING unnest(%(ids)s::text[]) AS u(id) WHERE b.task_id = u.id;

-- name: prune_late_effects
DELETE FROM late_effects AS l USING unnest(%(ids)s::text[]) AS u(id)
WHERE l.task_id = u.id;

-- name: prune_audit
DELETE FROM audit AS a USING unnest(%(ids)s::text[]) AS u(id) WHERE a.task_id = u.id
RETURNING a.kind, a.at;

-- name: prune_audit_walk
-- Audit rows older than the cutoff, oldest first after (from_at, from_seq): one bounded
-- step of an ordered walk of audit_at (the rows of tasks still in the ledger are left).
SELECT seq, task_id, at FROM audit
WHERE at >= %(from_at)s::float8 AND (at > %(from_at)s::float8 OR seq > %(from_seq)s)
  AND at < %(cutoff)s::float8
ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: prune_audit_gone
-- Of the walked rows, those whose task is gone (ledger-wide records such as prune's own,
-- rows of tasks deleted before): a primary-key probe per row and per task.
DELETE FROM audit AS a WHERE a.seq = ANY(%(seqs)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM tasks AS t WHERE t.id = a.task_id)
RETURNING a.kind, a.at;

-- name: prune_export_audit
SELECT a.seq, a.task_id, a.at, a.kind, a.from_state, a.to_state, a.generation, a.holder,
       a.detail
FROM unnest(%(ids)s::text[]) AS u(id) JOIN audit AS a ON a.task_id = u.id
ORDER BY a.task_id, a.seq;

-- name: prune_export_late
SELECT l.seq, l.task_id, l.effect, l.key, l.generation, l.holder, l.at, l.outcome, l.detail
FROM unnest(%(ids)s::text[]) AS u(id) JOIN late_effects AS l ON l.task_id = u.id
ORDER BY l.task_id, l.seq;

-- name: control_lock
-- An operator command's read of its task, under the row lock (a holder's commit waits).
SELECT state, generation, name, control_request, holder, lease_until, attempt, max_attempts,
       updated_at
FROM tasks WHERE id = %(id)s FOR UPDATE;

-- name: control_move
-- An operator's move of a task that is not running (cancel, resume, retry, give-up; checked
-- against OPERATOR_MOVES by the engine), conditional on the state and generation read.
-- bump: added to the generation (1: whatever an older holder still writes is fenced out);
-- reset: a fresh set of attempts and quarantine counters (retry); run_at: when it is ready
-- (NULL: kept, re-anchored as in clock_repair_ready; ready now: never later than it was,
-- ledger/clock.py).
UPDATE tasks SET state = %(state)s, generation = generation + %(bump)s, holder = NULL,
    lease_until = NULL, control_request = %(request)s::text,
    run_at = CASE WHEN %(run_at)s::float8 IS NULL
                  THEN LEAST(run_at, %(now)s::float8 + GREATEST(run_at - updated_at, 0))
                  WHEN %(run_at)s::float8 <= %(now)s::float8 THEN LEAST(run_at, %(run_at)s::float8)
                  ELSE %(run_at)s::float8 END,
    attempt = CASE WHEN %(reset)s::bool THEN 0 ELSE attempt END,
    quarantined = CASE WHEN %(reset)s::bool THEN false ELSE quarantined END,
    fingerprint_count = CASE WHEN %(reset)s::bool THEN 0 ELSE fingerprint_count END,
    crash_count = CASE WHEN %(reset)s::bool THEN 0 ELSE crash_count END,
    last_error = COALESCE(%(error)s::text, last_error),
    last_traceback = CASE WHEN %(error)s::text IS NULL THEN last_traceback ELSE NULL END,
    error_class = COALESCE(%(error_class)s::text, error_class), updated_at = %(now)s
WHERE id = %(id)s AND state = %(from_state)s AND generation = %(generation)s;

-- name: control_request_set
-- Record (or replace) an operator's request on a task, for its holder or its next one.
UPDATE tasks SET control_request = %(request)s::text
WHERE id = %(id)s AND state = %(from_state)s AND generation = %(generation)s;

-- name: control_requests
-- The requests on the leases a worker holds (its heartbeat polls this): a request on the
-- row (cancel, or the pause of that one task), or an active pause of its type or of
-- everything. Walks the worker's own RUNNING rows (tasks_holder).
SELECT t.id, t.generation, COALESCE(t.control_request, 'pause') FROM tasks AS t
WHERE t.holder = %(holder)s AND t.state = 'RUNNING'
  AND (t.control_request IS NOT NULL OR EXISTS (
      SELECT 1 FROM pauses AS p WHERE p.resumed_at IS NULL
        AND (p.scope = 'all' OR (p.scope = 'type' AND p.target = t.name))));

-- name: claim_gate
-- Taken by every claim before it reads the active pauses: a shared advisory lock (per
-- ledger schema) that pause_gate takes exclusively, so a claim in flight when a pause
-- starts finishes first and every later claim sees the pause. Claims never wait on each
-- other for it.
SELECT 1 FROM pg_advisory_xact_lock_shared(hashtext(current_schema() || '.ratchet_pause'));

-- name: pause_gate
-- Taken by a pause of a type or of everything before it records the pause (see
-- claim_gate). It locks no task row, so it cannot deadlock with a commit.
SELECT 1 FROM pg_advisory_xact_lock(hashtext(current_schema() || '.ratchet_pause'));

-- name: pauses_active
SELECT id, scope, target, version, paused_by, reason, created_at FROM pauses
WHERE resumed_at IS NULL ORDER BY id;

-- name: pause_version
-- The ledger's control version: the highest version a pause or resume has taken.
SELECT GREATEST(COALESCE(max(version), 0), COALESCE(max(resumed_version), 0)) FROM pauses;

-- name: pause_insert
INSERT INTO pauses (scope, target, version, paused_by, reason, created_at)
VALUES (%(scope)s, %(target)s, %(version)s, %(by)s, %(reason)s, %(now)s)
RETURNING id;

-- name: pause_resume
UPDATE pauses SET resumed_at = %(now)s, resumed_by = %(by)s, resume_reason = %(reason)s,
                  resumed_version = %(version)s
WHERE resumed_at IS NULL AND scope = %(scope)s AND target = %(target)s
RETURNING id, version;

-- name: paused_tasks
-- PAUSED tasks of a type (NULL: of every type), oldest pause first (tasks_paused).
SELECT id, name, generation, control_request FROM tasks
WHERE state = 'PAUSED' AND (%(name)s::text IS NULL OR name = %(name)s::text)
ORDER BY updated_at, id FOR UPDATE;

-- name: resume_tasks
-- Re-admit PAUSED tasks, each at its own run_at (a resume's rate staggers them), never
-- before the run_at it had (a delayed task keeps its schedule through a pause), that one
-- capped at its wait when paused (run_at - updated_at) from now: a pause written ahead of
-- a clock stepped back since does not stretch it (ledger/clock.py).
UPDATE tasks t SET state = 'PENDING',
                   run_at = GREATEST(LEAST(t.run_at, %(now)s::float8
                                           + GREATEST(t.run_at - t.updated_at, 0)), u.run_at),
                   updated_at = %(now)s,
                   control_request = NULLIF(t.control_request, 'pause')
FROM json_to_recordset(%(rows)s::json) AS u(id text, generation bigint, run_at float8)
WHERE t.id = u.id AND t.state = 'PAUSED' AND t.generation = u.generation
  AND t.id = ANY(ARRAY(SELECT j ->> 'id' FROM json_array_elements(%(rows)s::json) AS j));

-- name: running_by_type
-- RUNNING tasks per type (tasks_holder): those in a paused scope are short of a boundary.
SELECT name, count(*) FROM tasks WHERE holder IS NOT NULL AND state = 'RUNNING'
GROUP BY name;

-- name: quarantine_read
-- Retry governance (DESIGN §7): the failure streak of tasks whose failure write carries an
-- error fingerprint (read with the commit's fence, after fence_read locked the rows).
SELECT id, fingerprint, fingerprint_count, quarantine_after FROM tasks
WHERE id = ANY(%(ids)s::text[]);

-- name: quarantine_mark
-- The engine's verdict on a failure or a dead holder's delivery: the streak, the crash
-- count and the quarantine flag (NULL: unchanged). Rows already locked by the caller.
UPDATE tasks t SET fingerprint = COALESCE(u.fingerprint, t.fingerprint),
    fingerprint_count = COALESCE(u.count, t.fingerprint_count),
    crash_count = COALESCE(u.crashes, t.crash_count), quarantined = u.quarantined,
    quarantined_at = CASE WHEN u.quarantined THEN %(now)s ELSE t.quarantined_at END
FROM json_to_recordset(%(rows)s::json)
     AS u(id text, fingerprint text, count int, crashes int, quarantined bool)
WHERE t.id = u.id
  AND t.id = ANY(ARRAY(SELECT j ->> 'id' FROM json_array_elements(%(rows)s::json) AS j));

-- name: quarantine_groups
-- ratchet quarantine list: quarantined FAILED tasks per fingerprint (tasks_quarantine).
SELECT fingerprint, name, count(*), min(quarantined_at), max(quarantined_at) FROM tasks
WHERE quarantined AND state = 'FAILED'
GROUP BY fingerprint, name ORDER BY max(quarantined_at) DESC, fingerprint
LIMIT %(limit)s;

-- name: quarantine_samples
-- The newest %(per_group)s tasks of each listed fingerprint, with their last error.
SELECT fingerprint, id, last_error, error_class FROM (
    SELECT fingerprint, id, last_error, error_class, quarantined_at,
           row_number() OVER (PARTITION BY fingerprint
                              ORDER BY quarantined_at DESC, id DESC) AS n
    FROM tasks
    WHERE quarantined AND state = 'FAILED' AND fingerprint = ANY(%(fingerprints)s::text[])
) AS q
WHERE n <= %(per_group)s ORDER BY fingerprint, quarantined_at DESC, id DESC;

-- name: quarantine_pick
-- The quarantined FAILED tasks of one fingerprint, oldest quarantine first (a replay),
-- locked in id order for the replay's writes.
SELECT id, name, generation, fingerprint_count, crash_count, updated_at FROM (
    SELECT id, name, generation, fingerprint_count, crash_count, quarantined_at, updated_at
    FROM tasks
    WHERE quarantined AND state = 'FAILED' AND fingerprint = %(fingerprint)s
    ORDER BY quarantined_at, id LIMIT %(limit)s) AS q
ORDER BY quarantined_at, id;

-- name: quarantine_lock
-- Lock the tasks a replay writes, in id order (like every fenced write).
SELECT id FROM tasks WHERE id = ANY(%(ids)s::text[]) AND state = 'FAILED' AND quarantined
ORDER BY id FOR UPDATE;

-- name: quarantine_replay_task
-- An operator's replay: back to PENDING with fresh attempt counters at a staggered run_at.
UPDATE tasks t SET state = 'PENDING', attempt = 0,
    run_at = CASE WHEN u.run_at <= %(now)s::float8 THEN LEAST(t.run_at, u.run_at)
                  ELSE u.run_at END, quarantined = false,
    fingerprint_count = 0, crash_count = 0, updated_at = %(now)s
FROM json_to_recordset(%(rows)s::json) AS u(id text, run_at float8)
WHERE t.id = u.id AND t.state = 'FAILED' AND t.quarantined
  AND t.id = ANY(ARRAY(SELECT j ->> 'id' FROM json_array_elements(%(rows)s::json) AS j));

-- name: budget_lock
-- Retry budgets (DESIGN §7): one transaction-scoped advisory lock per budget that must
-- admit a retry, in key order (after the fence's row locks), so two commits never grant the
-- same room. Commits that only count calls take no lock.
SELECT k, pg_advisory_xact_lock(7441, hashtext(k))::text
FROM unnest(%(keys)s::text[]) AS k ORDER BY k;

-- name: budget_window
-- The counts of the given budgets from the last 301 s on (future buckets hold reserved
-- retries), summed over workers.
SELECT budget, bucket, sum(calls), sum(retries) FROM budget_counts
WHERE budget = ANY(%(keys)s::text[]) AND bucket >= %(now)s - 301
GROUP BY budget, bucket;

-- name: budget_bump
-- Calls counted and retries reserved by one commit, in the rows of its own worker (rows
-- arrive sorted by budget, bucket, holder).
INSERT INTO budget_counts (budget, bucket, holder, calls, retries)
SELECT u.budget, u.bucket, u.holder, u.calls, u.retries
FROM json_to_recordset(%(rows)s::json)
     AS u(budget text, bucket bigint, holder text, calls int, retries int)
ON CONFLICT (budget, bucket, holder) DO UPDATE SET
    calls = budget_counts.calls + excluded.calls,
    retries = budget_counts.retries + excluded.retries;

-- name: budget_prune
-- Buckets no window can reach any more.
DELETE FROM budget_counts WHERE budget = ANY(%(keys)s::text[]) AND bucket < %(before)s;

-- ---------------------------------------------------------------- workflows (waits, events,
-- children, compensation: DESIGN §3 waits, §5 compensation)

-- name: wake_due
-- The claim's wake-up: parked rows (WAITING, COMPENSATING) whose run_at has passed become
-- PENDING, so the claim that follows can take them (tasks_waiting; a bounded batch, oldest
-- first; rows another claim is waking are skipped, not waited for). wait_kind stays until
-- the next wait ('compensate' tells the audit where it came from).
UPDATE tasks t SET state = 'PENDING', updated_at = %(now)s
FROM (SELECT id FROM tasks WHERE state IN ('WAITING', 'COMPENSATING')
        AND run_at <= %(now)s::float8 ORDER BY run_at LIMIT %(wake_limit)s
        FOR UPDATE SKIP LOCKED) AS s
WHERE t.id = s.id
RETURNING t.id, t.generation, t.wait_kind;

-- name: wait_set
-- What a task that just parked itself (RUNNING -> WAITING, in the same transaction) waits
-- for; a wait on children counts them with wait_children.
UPDATE tasks SET wait_kind = %(kind)s, wait_name = %(name)s, wait_key = %(key)s,
    wait_step = %(step)s, wait_seq = %(seq)s, wait_after = %(after)s, wait_count = NULL
WHERE id = %(id)s AND generation = %(generation)s AND state = 'WAITING';

-- name: wait_event_check
-- The mailbox, read by the wait itself: the first event of its (name, key) sent since the
-- task was submitted that it has not received yet is delivered at once (written as the
-- wait's checkpoint, the task made PENDING). The advisory lock of the (name, key), which
-- event_deliver takes too, orders the two: a send either committed before this read (and
-- is seen by it) or reads the task WAITING after this transaction committed.
SELECT pg_advisory_xact_lock(1381256270,
                             hashtext(current_schema() || ':' || %(name)s || ':' || %(key)s));
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT t.id, t.wait_step,
       json_build_object('seq', e.seq, 'payload', e.payload::json)::text,
       t.generation, %(now)s, t.wait_seq
FROM tasks AS t JOIN events AS e ON e.name = t.wait_name AND e.key = t.wait_key
WHERE t.id = %(id)s AND t.generation = %(generation)s AND t.state = 'WAITING'
  AND e.seq > COALESCE(t.wait_after, 0) AND e.sent_at >= t.created_at
ORDER BY e.seq LIMIT 1
ON CONFLICT (task_id, name) DO NOTHING;
UPDATE tasks SET state = 'PENDING', run_at = LEAST(run_at, %(now)s::float8),
    updated_at = %(now)s
WHERE id = %(id)s AND generation = %(generation)s AND state = 'WAITING'
  AND EXISTS (SELECT 1 FROM steps AS s WHERE s.task_id = tasks.id AND s.name = tasks.wait_step)
RETURNING id;

-- name: wait_children
-- A parent parks on its children: those not ended yet are marked awaited, under their row
-- locks taken in id order (a child's end is then counted by the tasks_fan_in trigger, or,
-- ended first, not marked), the parent waits for that many, and is PENDING at once when
-- none is left. Its other children are unmarked first: a wait it left without their end
-- (a pause, then a resume) must not count them against this one.
WITH unmarked AS (
    UPDATE tasks SET awaited = false
    WHERE parent_id = %(id)s AND awaited AND NOT (id = ANY(%(children)s::text[]))),
locked AS (
    SELECT id FROM tasks
    WHERE id = ANY(%(children)s::text[]) AND parent_id = %(id)s
      AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
    ORDER BY id FOR UPDATE),
marked AS (
    UPDATE tasks c SET awaited = true FROM locked WHERE c.id = locked.id
      AND c.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
    RETURNING c.id)
UPDATE tasks SET wait_count = (SELECT count(*) FROM marked),
    state = CASE WHEN (SELECT count(*) FROM marked) = 0 THEN 'PENDING' ELSE state END,
    run_at = CASE WHEN (SELECT count(*) FROM marked) = 0
                  THEN LEAST(run_at, %(now)s::float8) ELSE run_at END
WHERE id = %(id)s AND generation = %(generation)s AND state = 'WAITING'
RETURNING id, state;

-- name: event_insert
-- The mailbox: an event id sent again is the same event (nothing written). The advisory
-- lock of the (name, key) orders the send against a wait's own mailbox read
-- (wait_event_check).
SELECT pg_advisory_xact_lock(1381256270,
                             hashtext(current_schema() || ':' || %(name)s || ':' || %(key)s));
INSERT INTO events (event_id, name, key, payload, sent_at, sent_by)
VALUES (%(event_id)s, %(name)s, %(key)s, %(payload)s, %(now)s, %(by)s)
ON CONFLICT (event_id) DO NOTHING
RETURNING seq;

-- name: event_get
SELECT seq, event_id, name, key, payload, sent_at FROM events WHERE event_id = %(event_id)s;

-- name: event_deliver
-- A new event reaches every task WAITING on its (name, key) that has not received it:
-- written as each wait's checkpoint (a replay sees the same payload), and the tasks made
-- PENDING (tasks_wait_event; rows in id order).
INSERT INTO steps (task_id, name, result, generation, committed_at, seq)
SELECT id, wait_step,
       json_build_object('seq', %(seq)s::bigint, 'payload', %(payload)s::json)::text,
       generation, %(now)s, wait_seq
FROM tasks
WHERE state = 'WAITING' AND wait_name = %(name)s AND wait_key = %(key)s
  AND wait_kind = 'event' AND COALESCE(wait_after, 0) < %(seq)s
ON CONFLICT (task_id, name) DO NOTHING;
UPDATE tasks t SET state = 'PENDING', run_at = LEAST(t.run_at, %(now)s::float8),
    updated_at = %(now)s
FROM (SELECT id FROM tasks
      WHERE state = 'WAITING' AND wait_name = %(name)s AND wait_key = %(key)s
        AND wait_kind = 'event' AND COALESCE(wait_after, 0) < %(seq)s
      ORDER BY id FOR UPDATE) AS s
WHERE t.id = s.id AND t.state = 'WAITING'
RETURNING t.id, t.generation;

-- name: events_prune
-- Retention: events sent before the cutoff (events_sent_at).
DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE sent_at < %(cutoff)s::float8
                                 ORDER BY sent_at LIMIT %(limit)s);

-- name: task_children
-- The tasks a parent submitted with ctx.submit, oldest first (tasks_parent).
SELECT id, name, version, state, generation, attempt, max_attempts, holder, lease_until,
       run_at, created_at, updated_at, idempotency_key, params, params_digest, result,
       last_error, error_class, tenant, quarantined, last_traceback, parent_id, queue,
       priority, ckey, key_slot, rate_key, flow_wait
FROM tasks WHERE parent_id = %(id)s ORDER BY created_at, id;

-- name: task_wait
-- What a task waits for, and its parent (inspect, status).
SELECT id, parent_id, state, wait_kind, wait_name, wait_key, wait_count, run_at
FROM tasks WHERE id = ANY(%(ids)s::text[]);

-- name: compensating_mark
-- A task entering COMPENSATING: a fresh set of attempts for its compensations, and
-- wait_kind 'compensate' (the wake-up's audit names where it came from).
UPDATE tasks SET attempt = 0, wait_kind = 'compensate'
WHERE id = ANY(%(ids)s::text[]) AND state = 'COMPENSATING';

-- name: compensable_read
-- Whether a task recorded an effect with a compensation (its marker step).
SELECT task_id FROM steps WHERE task_id = ANY(%(ids)s::text[]) AND name = 'ratchet:compensable';

-- batches: long work with a contiguous watermark (DESIGN §6 row 9) -----------------------

-- name: batch_runs_read
-- The batch runs of the given tasks: a commit carrying batch marks reads them after its
-- fence read (which locks the task rows: one writer per task at a time); inspect and the
-- conservation check read them too.
SELECT task_id, run, watermark, above, succeeded, failed, skipped, batches, total, done,
       started_at, updated_at, generation
FROM batch_runs WHERE task_id = ANY(%(ids)s::text[])
ORDER BY task_id, run;

-- name: batch_runs_upsert
-- A run's new state, computed by the commit from the marks and the row it read.
INSERT INTO batch_runs (task_id, run, watermark, above, succeeded, failed, skipped, batches,
                        total, done, started_at, updated_at, generation)
SELECT u.task_id, u.run, u.watermark, u.above, u.succeeded, u.failed, u.skipped, u.batches,
       u.total, u.done, u.started_at, %(now)s, u.generation
FROM json_to_recordset(%(rows)s::json)
     AS u(task_id text, run text, watermark bigint, above text, succeeded bigint,
          failed bigint, skipped bigint, batches bigint, total bigint, done boolean,
          started_at double precision, generation bigint)
ON CONFLICT (task_id, run) DO UPDATE SET watermark = excluded.watermark,
    above = excluded.above, succeeded = excluded.succeeded, failed = excluded.failed,
    skipped = excluded.skipped, batches = excluded.batches, total = excluded.total,
    done = excluded.done, updated_at = excluded.updated_at,
    generation = excluded.generation;

-- name: batch_effects
-- The effects of one run's batches at or past its watermark (names sort by the
-- zero-padded position; compared bytewise, COLLATE "C", whatever the database's
-- collation: one range of effects_name_bytes, migration 0013).
SELECT task_id, name, key, params_digest, state, result, generation, attempt, calls,
       via_lookup, updated_at, seq
FROM effects WHERE task_id = %(id)s
  AND name COLLATE "C" >= %(lo)s AND name COLLATE "C" < %(hi)s;

-- name: batch_runs_active
-- Watermarks of the unfinished runs of tasks not yet ended, per task type (metrics).
SELECT t.name, count(*), sum(b.watermark), sum(b.succeeded + b.failed + b.skipped)
FROM batch_runs AS b JOIN tasks AS t ON t.id = b.task_id
WHERE NOT b.done AND t.state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
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
-- A scheduler's registration: a new schedule's cursor starts at cursor (the registration
-- instant: no tick before it fires); a known one keeps its cursor and counts. Rows in name
-- order (the engine sorts them), so two registrations lock them in the same order.
INSERT INTO schedules (name, task, spec, tz, misfire_grace_s, cursor_at,
                       first_registered_at, registered_at, registered_by, seen_at, seen_by)
SELECT u.name, u.task, u.spec, u.tz, u.grace, u.cursor, %(now)s, %(now)s, %(holder)s,
       %(now)s, %(holder)s
FROM json_to_recordset(%(rows)s::json)
     AS u(name text, task text, spec text, tz text, grace float8, cursor bigint)
ORDER BY u.name
ON CONFLICT (name) DO UPDATE SET task = excluded.task, spec = excluded.spec,
    tz = excluded.tz, misfire_grace_s = excluded.misfire_grace_s,
    registered_at = excluded.registered_at, registered_by = excluded.registered_by,
    seen_at = excluded.seen_at, seen_by = excluded.seen_by;

-- name: schedule_cursors
-- The rows of the given schedules a pass decides from, locked; rows another pass holds
-- are skipped (that pass decides them), so passes never wait on each other.
SELECT name, task, spec, tz, misfire_grace_s, cursor_at, last_fired_at, fired, missed,
       last_missed_at, last_missed_reason, first_registered_at, registered_at, registered_by,
       seen_at, seen_by
FROM schedules WHERE name = ANY(%(names)s::text[]) ORDER BY name
FOR UPDATE SKIP LOCKED;

-- name: schedule_advance
-- The compare-and-set of the cursors: a row moves only from the cursor its pass read
-- (u.from_s); the rows that moved come back (RETURNING), the others were moved by another
-- scheduler.
UPDATE schedules AS s SET cursor_at = u.to_s,
    last_fired_at = COALESCE(u.fired_s, s.last_fired_at),
    fired = s.fired + u.nfired, missed = s.missed + u.nmissed,
    last_missed_at = COALESCE(u.missed_s, s.last_missed_at),
    last_missed_reason = COALESCE(u.reason, s.last_missed_reason),
    seen_at = %(now)s, seen_by = %(holder)s
FROM json_to_recordset(%(rows)s::json)
     AS u(name text, from_s bigint, to_s bigint, fired_s bigint, nfired bigint,
          nmissed bigint, missed_s bigint, reason text)
WHERE s.name = u.name AND s.cursor_at = u.from_s
RETURNING s.name, s.task, s.spec, s.tz, s.misfire_grace_s, s.cursor_at, s.last_fired_at,
          s.fired, s.missed, s.last_missed_at, s.last_missed_reason, s.first_registered_at,
          s.registered_at, s.registered_by, s.seen_at, s.seen_by;

-- name: schedule_seen
-- Running schedulers say which schedules their code still has.
UPDATE schedules SET seen_at = %(now)s, seen_by = %(holder)s
WHERE name = ANY(%(names)s::text[]);
