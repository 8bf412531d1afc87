-- Ratchet ledger, schema version 3 (PostgreSQL): fewer index entries per row version.
--
-- A task row is written three times (submit, claim, completion) and none of those updates
-- is HOT (each changes an indexed column or a partial index's predicate), so every row
-- version adds an entry to every index whose predicate it meets (bench/README.md, issue 8).
-- * The idempotency key's unique index holds only rows that have a key: a task submitted
--   without one adds no entry (a NULL is indexed by a plain UNIQUE constraint). Submits
--   name the predicate in ON CONFLICT.
-- (tasks_holder stays: without it, revocation's lookup of one holder's RUNNING rows is a
-- sequential scan of every task when the table has no statistics.)
ALTER TABLE tasks DROP CONSTRAINT tasks_idempotency_key_key;
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
