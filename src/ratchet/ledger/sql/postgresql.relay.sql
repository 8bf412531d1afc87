-- Ratchet ledger (PostgreSQL): the relay's statements over the outbox (DESIGN §6.2).
-- outbox_leases rows 0..31 are the partitions; a row with a negative part is a relay's
-- presence (so a relay that holds no partition yet counts in the fair share).

-- name: outbox_lease_rows
-- The partitions, locked in part order; a row another relay's lease call (or a mark) holds
-- locked is skipped, not waited for.
SELECT part, holder, generation, lease_until FROM outbox_leases
WHERE part >= 0 ORDER BY part FOR UPDATE SKIP LOCKED;

-- name: outbox_lease_mine
-- This holder's unexpired partitions, locked or not (one skipped above is still ours).
SELECT part, generation, lease_until FROM outbox_leases
WHERE part >= 0 AND holder = %(holder)s AND lease_until > %(now)s ORDER BY part;

-- name: outbox_lease_live
-- Other relays alive: holders of an unexpired partition or presence row.
SELECT count(DISTINCT holder) FROM outbox_leases
WHERE holder IS NOT NULL AND holder <> %(holder)s AND lease_until > %(now)s;

-- name: outbox_lease_write
-- Renewals, takes (generation + 1 from the caller) and releases (holder NULL).
UPDATE outbox_leases l
SET holder = u.holder, generation = u.generation, lease_until = u.lease_until
FROM json_to_recordset(%(rows)s::json)
     AS u(part int, holder text, generation bigint, lease_until double precision)
WHERE l.part = u.part;

-- name: outbox_presence
-- This relay's presence row (its own negative part), renewed; a row of a relay that is
-- gone (expired) is taken over.
INSERT INTO outbox_leases AS l (part, holder, generation, lease_until)
VALUES (%(part)s, %(holder)s, 0, %(now)s + %(lease_s)s)
ON CONFLICT (part) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
WHERE l.holder = excluded.holder OR l.lease_until IS NULL OR l.lease_until <= %(now)s;

-- name: outbox_presence_prune
DELETE FROM outbox_leases WHERE part < 0 AND (lease_until IS NULL OR lease_until <= %(now)s);

-- name: outbox_release
-- A clean stop: every partition back, the presence row gone.
WITH freed AS (
    UPDATE outbox_leases SET holder = NULL, lease_until = NULL
    WHERE part >= 0 AND holder = %(holder)s RETURNING part)
DELETE FROM outbox_leases WHERE part < 0 AND holder = %(holder)s;

-- name: outbox_fetch
SELECT id, message_id, topic, key, part, payload, headers, task_id, created_at, attempts
FROM outbox WHERE part = ANY(%(parts)s::int[]) AND sent_at IS NULL
ORDER BY id LIMIT %(limit)s;

-- name: outbox_mark_sent
-- Fenced: only rows of partitions this holder still holds at the generation it names, with
-- an unexpired lease. The lease rows are share-locked, so a take waits for the mark (and a
-- take committed first fails the check).
WITH held AS (
    SELECT l.part FROM outbox_leases l
    JOIN unnest(%(parts)s::int[], %(generations)s::bigint[]) AS w(part, gen)
      ON l.part = w.part AND l.generation = w.gen
    WHERE l.holder = %(holder)s AND l.lease_until > %(now)s
    ORDER BY l.part
    FOR SHARE OF l)
UPDATE outbox o SET sent_at = %(now)s, sent_by = %(holder)s
FROM held
WHERE o.part = held.part AND o.id = ANY(%(ids)s::bigint[]) AND o.sent_at IS NULL;

-- name: outbox_failed
UPDATE outbox SET attempts = attempts + 1, last_error = %(error)s
WHERE id = ANY(%(ids)s::bigint[]) AND sent_at IS NULL;
