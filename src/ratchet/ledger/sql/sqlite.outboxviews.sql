-- Ratchet ledger (SQLite): the outbox as operators see it and its retention (schema 16,
-- DESIGN §6 row 10, §9, §10.2). The same statements as on PostgreSQL (see its
-- postgresql.outboxviews.sql).

-- name: outbox_count_unsent
SELECT COUNT(*) FROM (SELECT 1 FROM outbox WHERE sent_at IS NULL LIMIT :cap);

-- name: outbox_count_sent
SELECT COUNT(*) FROM (SELECT 1 FROM outbox INDEXED BY outbox_sent
                      WHERE sent_at IS NOT NULL LIMIT :cap);

-- name: outbox_sent_estimate
-- No planner statistics to read: past the cap the count is the cap.
SELECT -1;

-- name: outbox_oldest_unsent
-- The head of each partition (outbox_unsent per part), and the oldest of them.
SELECT MIN((SELECT o.created_at FROM outbox AS o
            WHERE o.part = l.part AND o.sent_at IS NULL ORDER BY o.id LIMIT 1))
FROM outbox_leases AS l;

-- name: outbox_unsent_topics
SELECT topic, COUNT(*), SUM(CASE WHEN attempts > 0 THEN 1 ELSE 0 END)
FROM (SELECT topic, attempts FROM outbox WHERE sent_at IS NULL LIMIT :scan)
GROUP BY topic;

-- name: outbox_failures
SELECT id, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
       last_error
FROM (SELECT * FROM outbox WHERE sent_at IS NULL LIMIT :scan)
WHERE attempts > 0 ORDER BY id LIMIT :limit;

-- name: outbox_relay_leases
SELECT holder, part, lease_until FROM outbox_leases
WHERE holder IS NOT NULL AND lease_until > :now ORDER BY holder, part;

-- name: outbox_list
SELECT id, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
       last_error
FROM outbox
WHERE (:topic IS NULL OR topic = :topic) AND (:key IS NULL OR key = :key)
ORDER BY id DESC LIMIT :limit;

-- name: outbox_list_unsent
-- The unsent messages the relays publish next, in outbox order.
SELECT id, message_id, topic, key, part, task_id, created_at, sent_at, sent_by, attempts,
       last_error
FROM outbox INDEXED BY outbox_unsent
WHERE sent_at IS NULL AND (:topic IS NULL OR topic = :topic) AND (:key IS NULL OR key = :key)
ORDER BY id LIMIT :limit;

-- name: outbox_prune_count
SELECT COUNT(*) FROM outbox WHERE sent_at IS NOT NULL AND sent_at < :cutoff;

-- name: outbox_prune_pick
-- Inside BEGIN IMMEDIATE: nothing else writes meanwhile.
SELECT id, key FROM outbox
WHERE sent_at IS NOT NULL AND sent_at < :cutoff ORDER BY sent_at LIMIT :limit;

-- name: outbox_prune_rows
DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(:ids)) AND sent_at IS NOT NULL;

-- name: outbox_prune_keys
DELETE FROM outbox_keys WHERE key IN (SELECT value FROM json_each(:keys));
