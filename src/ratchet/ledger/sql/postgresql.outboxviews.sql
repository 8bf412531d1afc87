-- Ratchet ledger (PostgreSQL): the outbox as operators see it and its retention (schema 16,
-- DESIGN §6 row 10, §9, §10.2). Reads only the partial indexes and the 32 lease rows: never
-- a scan of the sent history.

-- name: outbox_count_unsent
-- The backlog, counted over the partial index outbox_unsent, up to a cap.
SELECT count(*) FROM (SELECT 1 FROM outbox WHERE sent_at IS NULL LIMIT %(cap)s) AS u;

-- name: outbox_count_sent
-- Sent rows kept, counted over the partial index outbox_sent, up to a cap.
SELECT count(*) FROM (SELECT 1 FROM outbox WHERE sent_at IS NOT NULL LIMIT %(cap)s) AS s;

-- name: outbox_sent_estimate
-- Past the cap: the planner's row count of the outbox_sent index (its last ANALYZE or
-- VACUUM; -1 before the first).
SELECT coalesce((SELECT reltuples::bigint FROM pg_class
                 WHERE oid = to_regclass('outbox_sent')), -1);

-- name: outbox_oldest_unsent
-- The head of each partition (the first entry of outbox_unsent per part: 32 index probes),
-- and the oldest of them.
SELECT min(h.created_at) FROM outbox_leases AS l
CROSS JOIN LATERAL (SELECT o.created_at FROM outbox AS o
                    WHERE o.part = l.part AND o.sent_at IS NULL
                    ORDER BY o.id LIMIT 1) AS h;

-- name: outbox_unsent_topics
-- Unsent rows per topic, and those a relay failed to publish, over at most :scan of them.
SELECT topic, count(*), count(*) FILTER (WHERE attempts > 0)
FROM (SELECT topic, attempts FROM outbox WHERE sent_at IS NULL LIMIT %(scan)s) AS u
GROUP BY topic;

-- name: outbox_failures
-- Unsent rows a relay failed to publish (among at most :scan unsent rows), oldest first.
SELECT id, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
       last_error
FROM (SELECT * FROM outbox WHERE sent_at IS NULL LIMIT %(scan)s) AS u
WHERE attempts > 0 ORDER BY id LIMIT %(limit)s;

-- name: outbox_relay_leases
-- The partitions held now (an unexpired lease), by holder.
SELECT holder, part, lease_until FROM outbox_leases
WHERE holder IS NOT NULL AND lease_until > %(now)s::float8 ORDER BY holder, part;

-- name: outbox_list
-- The newest messages first (the primary key walked backwards), optionally of one topic
-- and / or key.
SELECT id, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
       last_error
FROM outbox
WHERE (%(topic)s::text IS NULL OR topic = %(topic)s::text)
  AND (%(key)s::text IS NULL OR key = %(key)s::text)
ORDER BY id DESC LIMIT %(limit)s;

-- name: outbox_list_unsent
-- The unsent messages the relays publish next: the first :limit of every partition (32
-- probes of outbox_unsent), merged in outbox order.
SELECT h.id, h.message_id, h.topic, h.key, h.part, h.task_id, h.created_at, h.sent_at,
       h.sent_by, h.attempts, h.last_error
FROM outbox_leases AS l
CROSS JOIN LATERAL (SELECT * FROM outbox AS o
                    WHERE o.part = l.part AND o.sent_at IS NULL
                      AND (%(topic)s::text IS NULL OR o.topic = %(topic)s::text)
                      AND (%(key)s::text IS NULL OR o.key = %(key)s::text)
                    ORDER BY o.id LIMIT %(limit)s) AS h
ORDER BY h.id LIMIT %(limit)s;

-- name: outbox_prune_count
-- Dry run: sent rows a prune at :cutoff would delete (a range of outbox_sent).
SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL AND sent_at < %(cutoff)s::float8;

-- name: outbox_prune_pick
-- One batch of sent rows older than the cutoff, the oldest sent first (outbox_sent). Never
-- an unsent row, whatever its age. SKIP LOCKED: a row a relay is marking is left for later.
SELECT id, key FROM outbox
WHERE sent_at IS NOT NULL AND sent_at < %(cutoff)s::float8
ORDER BY sent_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED;

-- name: outbox_prune_rows
DELETE FROM outbox AS o USING unnest(%(ids)s::bigint[]) AS u(id)
WHERE o.id = u.id AND o.sent_at IS NOT NULL;

-- name: outbox_prune_keys
-- The lock rows of the pruned rows' keys (they serve only as per-key locks while an emit
-- commits; the next emit to a key upserts its row again). A row an emit holds now is
-- skipped, so the prune never waits for one.
DELETE FROM outbox_keys WHERE key IN (
    SELECT k.key FROM outbox_keys AS k WHERE k.key = ANY(%(keys)s::text[])
    FOR UPDATE SKIP LOCKED);
