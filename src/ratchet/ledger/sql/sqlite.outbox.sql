-- Ratchet ledger (SQLite): the outbox's statements (schema 16, DESIGN §6 row 10).

-- name: outbox_key_lock
-- PostgreSQL takes the key's row lock here; SQLite has one writer, so the id order is the
-- commit order already. The row is kept for the same schema on both.
INSERT INTO outbox_keys (key) VALUES (:key) ON CONFLICT (key) DO NOTHING;

-- name: outbox_insert
-- A message already written (a re-send, a caller's retry with the same id) is kept.
INSERT INTO outbox (message_id, topic, key, part, payload, task_id, created_at)
VALUES (:message_id, :topic, :key, :part, :payload, :task_id, :now)
ON CONFLICT (message_id) DO NOTHING;

-- name: ledger_identity
-- The ledger's random id (schema 16): a joined connection must read the same.
SELECT id FROM ledger_identity;

-- name: outbox_same
-- The rows of chosen message ids after their insert: each must be the message written.
SELECT message_id, task_id, topic, key, payload FROM outbox WHERE message_id IN (SELECT value FROM json_each(:ids));
