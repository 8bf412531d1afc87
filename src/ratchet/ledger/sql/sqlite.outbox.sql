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
