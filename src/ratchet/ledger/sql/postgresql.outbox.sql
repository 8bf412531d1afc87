-- Ratchet ledger (PostgreSQL): the outbox's statements (schema 16, DESIGN §6 row 10).

-- name: outbox_key_lock
-- The row lock of each key a batch emits to, taken before the insert takes ids, in key
-- order (two batches sharing keys lock them in the same order): per key, id order is
-- commit order. The no-op update is what locks an existing row.
INSERT INTO outbox_keys (key)
SELECT u.key FROM json_to_recordset(%(rows)s::json) AS u(key text) ORDER BY u.key
ON CONFLICT (key) DO UPDATE SET key = excluded.key;

-- name: outbox_insert
-- A message already written (a re-send after a lost COMMIT reply, or a caller's retry
-- with the same message id) is not written twice.
INSERT INTO outbox (message_id, topic, key, part, payload, task_id, created_at)
SELECT u.message_id, u.topic, u.key, u.part, u.payload, u.task_id, %(now)s
FROM json_to_recordset(%(rows)s::json)
     AS u(message_id text, topic text, key text, part int, payload text, task_id text)
ON CONFLICT (message_id) DO NOTHING;
