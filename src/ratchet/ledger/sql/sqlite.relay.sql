-- Ratchet ledger (SQLite): the relay's statements over the outbox (DESIGN §6.2). One
-- writer at a time: the lease call's write lock serialises every relay's.

-- name: outbox_lease_rows
SELECT part, holder, generation, lease_until FROM outbox_leases
WHERE part >= 0 ORDER BY part;

-- name: outbox_lease_mine
SELECT part, generation, lease_until FROM outbox_leases
WHERE part >= 0 AND holder = :holder AND lease_until > :now ORDER BY part;

-- name: outbox_lease_live
SELECT count(DISTINCT holder) FROM outbox_leases
WHERE holder IS NOT NULL AND holder <> :holder AND lease_until > :now;

-- name: outbox_lease_write
UPDATE outbox_leases SET holder = :holder, generation = :generation,
                         lease_until = :lease_until
WHERE part = :part;

-- name: outbox_presence
INSERT INTO outbox_leases (part, holder, generation, lease_until)
VALUES (:part, :holder, 0, :now + :lease_s)
ON CONFLICT (part) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
WHERE outbox_leases.holder = excluded.holder OR outbox_leases.lease_until IS NULL
   OR outbox_leases.lease_until <= :now;

-- name: outbox_presence_prune
DELETE FROM outbox_leases WHERE part < 0 AND (lease_until IS NULL OR lease_until <= :now);

-- name: outbox_release
UPDATE outbox_leases SET holder = NULL, lease_until = NULL
WHERE part >= 0 AND holder = :holder;
DELETE FROM outbox_leases WHERE part < 0 AND holder = :holder;

-- name: outbox_fetch
SELECT id, message_id, topic, key, part, payload, headers, task_id, created_at, attempts
FROM outbox WHERE part IN (SELECT value FROM json_each(:parts)) AND sent_at IS NULL
ORDER BY id LIMIT :limit;

-- name: outbox_mark_sent
UPDATE outbox SET sent_at = :now, sent_by = :holder
WHERE id IN (SELECT value FROM json_each(:ids)) AND sent_at IS NULL
  AND part IN (
    SELECT l.part FROM outbox_leases l
    JOIN json_each(:parts) AS p JOIN json_each(:generations) AS g ON g.key = p.key
    WHERE l.part = p.value AND l.generation = g.value
      AND l.holder = :holder AND l.lease_until > :now);

-- name: outbox_failed
UPDATE outbox SET attempts = attempts + 1, last_error = :error
WHERE id IN (SELECT value FROM json_each(:ids)) AND sent_at IS NULL;
